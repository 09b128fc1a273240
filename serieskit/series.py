"""The series: patches/ as the source of truth, a work tree made from it.

``apply`` builds ``.work/vllm`` as the pinned base plus one commit per patch
(``git am --3way``, author and dates from the patch, a fixed committer, so the
same series gives the same commit ids everywhere). ``export`` writes the work
tree's commits back as ``git format-patch`` files with every drifting detail
(commit ids, git version, numbering) held fixed, so apply + export changes no
byte. ``status`` says how the two relate.

What the toolkit last wrote is recorded in ``.work/state.json``; anything in
the work tree beyond that (uncommitted changes, new commits) is the user's and
is never discarded without ``--force``, and even then it is kept in a stash or
a backup ref first.
"""

from __future__ import annotations

import email
import email.header
import email.policy
import hashlib
import io
import json
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from serieskit import base as b
from serieskit import git as g
from serieskit.errors import ToolkitError

PATCHES = "patches"
SERIES = "series"
MANIFEST = "manifest.toml"
WORK = ".work"
BRANCH = "series"
BACKUP = "refs/series/backup"

FORMAT_PATCH_ARGS = (
    "format-patch", "--zero-commit", "--no-signature", "--full-index",
    "--no-numbered", "--no-cover-letter", "--no-thread", "--no-attach",
    "--no-color", "--stat=80", "--stat-graph-width=20",
)


def work_repo(root: Path) -> Path:
    return root / WORK / "vllm"


# --- state -----------------------------------------------------------------


@dataclass
class State:
    base: str | None = None
    base_label: str | None = None
    head: str | None = None
    fingerprint: str | None = None
    total: int = 0
    applied: int = 0
    in_progress: str | None = None  # "apply" while an apply runs
    failed: str | None = None  # the patch a failed apply stopped at
    rebase: dict = field(default_factory=dict)

    @classmethod
    def load(cls, root: Path) -> State:
        path = root / WORK / "state.json"
        if not path.exists():
            return cls()
        try:
            return cls(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            raise ToolkitError(f"{path} is corrupt: remove it and run `nox -s apply -- --force`") from None

    def save(self, root: Path) -> None:
        path = root / WORK / "state.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)  # atomic: a kill never leaves half a state file


# --- patches/ --------------------------------------------------------------


def read_series(root: Path) -> list[str]:
    """Patch file names in order, from patches/series."""
    path = root / PATCHES / SERIES
    if not path.exists():
        return []
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            if not (root / PATCHES / line).is_file():
                raise ToolkitError(f"patches/series names {line}, which does not exist")
            names.append(line)
    return names


def read_manifest(root: Path) -> list[dict]:
    path = root / PATCHES / MANIFEST
    if not path.exists():
        return []
    try:
        return tomllib.loads(path.read_text()).get("patch", [])
    except tomllib.TOMLDecodeError as e:
        raise ToolkitError(f"patches/{MANIFEST} is malformed: {e}") from None


def manifest_problems(root: Path) -> list[str]:
    """Disagreements between the series and its manifest."""
    names = read_series(root)
    entries = read_manifest(root)
    listed = [e.get("file") for e in entries]
    problems = [f"{n} has no entry in patches/{MANIFEST}" for n in names if n not in listed]
    problems += [f"patches/{MANIFEST} lists {f}, which is not in the series"
                 for f in listed if f not in names]
    required = ("file", "seed", "summary", "config", "tests")
    for e in entries:
        missing = [k for k in required if k not in e]
        if missing:
            problems.append(f"patches/{MANIFEST} entry {e.get('file')} lacks {', '.join(missing)}")
    return problems


def subject_of(patch: Path) -> str:
    msg = email.message_from_bytes(patch.read_bytes(), policy=email.policy.compat32)
    raw = msg.get("Subject", "")
    text = str(email.header.make_header(email.header.decode_header(raw)))
    text = " ".join(text.split())
    return text[len("[PATCH] "):] if text.startswith("[PATCH] ") else text


def fingerprint(root: Path, base_commit: str) -> str:
    h = hashlib.sha256(base_commit.encode())
    for name in read_series(root):
        h.update(b"\0" + name.encode() + b"\0")
        h.update((root / PATCHES / name).read_bytes())
    return h.hexdigest()


# --- safety ----------------------------------------------------------------


def unsaved_work(repo: Path, state: State) -> tuple[list[str], list[tuple[str, str]]]:
    """(uncommitted files, commits not written by the toolkit) in the work tree."""
    if not g.is_repo(repo) or g.rev(repo, "HEAD") is None:
        return [], []
    dirty = g.dirty_files(repo)
    known = state.head or state.base
    if known and g.rev(repo, known):
        extra = g.commits(repo, f"{known}..HEAD")
    else:
        extra = g.commits(repo, "HEAD") if not state.base else []
    return dirty, extra


def refuse_if_unsaved(repo: Path, state: State, action: str) -> None:
    dirty, extra = unsaved_work(repo, state)
    if not dirty and not extra:
        return
    lines = [f"{action}: the work tree {repo} holds work that is not in patches/:"]
    for line in dirty[:10]:
        lines.append(f"  uncommitted: {line[3:]}")
    if len(dirty) > 10:
        lines.append(f"  ... and {len(dirty) - 10} more uncommitted files")
    for cid, subject in extra[:10]:
        lines.append(f"  commit {cid[:12]} {subject}")
    lines.append("Keep it: commit your changes and run `nox -s export` (writes them to "
                 f"patches/), or `git -C {repo} stash -u`; or rerun with --force, "
                 "which stashes changes and saves commits under "
                 f"{BACKUP}/ before going on.")
    raise ToolkitError("\n".join(lines))


def save_unsaved(repo: Path, state: State, log=print, keep_head: bool = False) -> None:
    """Under --force: stash changes and keep unexported commits under a ref."""
    dirty, extra = unsaved_work(repo, state)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    if keep_head and not extra and g.rev(repo, "HEAD"):
        extra = g.commits(repo, f"{state.base}..HEAD")
    if extra:
        ref = f"{BACKUP}/{stamp}"
        g.git(repo, "update-ref", ref, "HEAD")
        log(f"saved {len(extra)} unexported commit(s) as {ref}")
    if dirty:
        g.git(repo, "stash", "push", "--include-untracked", "-m",
              f"vllm-series {stamp}: saved by --force",
              env={"GIT_AUTHOR_NAME": g.COMMITTER[0], "GIT_AUTHOR_EMAIL": g.COMMITTER[1]})
        log(f"stashed {len(dirty)} uncommitted file(s): `git -C {repo} stash list`")


# --- apply -----------------------------------------------------------------


def apply(root: Path, force: bool = False, log=print) -> State:
    """Make the work tree the pinned base plus the series; a no-op when current."""
    g.require_version()
    start = time.monotonic()
    repo = work_repo(root)
    pin = b.read_pin(root)
    names = read_series(root)
    state = State.load(root)
    b.ensure_repo(repo)

    op = g.operation_in_progress(repo)
    if op == "rebase" and state.rebase:
        raise ToolkitError("a rebase is stopped at a conflict: finish it with "
                           "`nox -s rebase -- --continue` or `--abort`")
    if state.in_progress or op == "am":
        log(f"apply: an earlier apply was interrupted at {state.applied}/{state.total}; "
            "repairing")
        if op == "am":
            g.git(repo, "am", "--abort")
        g.git(repo, "reset", "-q", "--hard")
        state.in_progress = None
        state.fingerprint = None  # whatever HEAD is now, it is not the series
        # The commits an interrupted apply made are reproducible from patches/.
        state.head = g.rev(repo, "HEAD")
        state.save(root)
    elif op is not None:
        raise ToolkitError(f"a git {op} is in progress in {repo}: finish or abort it first")

    moved = state.base is not None and pin.commit is not None and state.base != pin.commit
    if moved and not force:
        raise ToolkitError(
            f"the work tree holds the series rebased onto {state.base_label} (nox -s rebase), "
            "not the pin's base: `nox -s rebase -- vllm==VERSION --update-pin` keeps it, "
            "`nox -s apply -- --force` goes back to the pin and keeps the rebased commits "
            f"under {BACKUP}/")
    if force:
        save_unsaved(repo, state, log, keep_head=moved)
    else:
        refuse_if_unsaved(repo, state, "apply")

    base_commit, _ = b.ensure_base(repo, pin.version, pin.sha256, pin.commit, log=log)
    fp = fingerprint(root, base_commit)
    head = g.rev(repo, "HEAD")
    if (fp == state.fingerprint and head == state.head and head is not None
            and state.failed is None and not g.dirty_files(repo)):
        log(f"apply: up to date, {len(names)} patch(es) on vLLM {pin.version} "
            f"(HEAD {head[:12]}, {time.monotonic() - start:.1f} s)")
        return state

    state = State(base=base_commit, base_label=pin.version, total=len(names),
                  in_progress="apply", head=base_commit)
    state.save(root)
    g.git(repo, "checkout", "-q", "-f", "-B", BRANCH, base_commit)
    for i, name in enumerate(names, 1):
        patch = root / PATCHES / name
        log(f"apply {i}/{len(names)}: {subject_of(patch)}")
        proc = g.run(repo, "am", "--3way", "--keep-non-patch",
                     "--committer-date-is-author-date", "--no-gpg-sign", str(patch))
        if proc.returncode != 0:
            files = _conflicted(repo) or _am_failed_files(proc.stdout + proc.stderr)
            g.run(repo, "am", "--abort")
            state.in_progress = None
            state.failed = name
            state.head = g.rev(repo, "HEAD")
            state.save(root)
            where = f" (conflict in {', '.join(files)})" if files else ""
            raise ToolkitError(
                f"patch {name} ({i}/{len(names)}) does not apply{where}; the work tree "
                f"holds patches 1-{i - 1} only"
            )
        state.applied = i
        state.head = g.rev(repo, "HEAD")
        state.save(root)
    state.in_progress = None
    state.fingerprint = fp
    state.save(root)
    log(f"apply: {len(names)} patch(es) on vLLM {pin.version}, HEAD "
        f"{(state.head or '')[:12]} ({time.monotonic() - start:.1f} s)")
    return state


def _conflicted(repo: Path) -> list[str]:
    out = g.git(repo, "diff", "--name-only", "--diff-filter=U", check=False)
    return out.split()


def _am_failed_files(output: bytes) -> list[str]:
    files = []
    for line in output.decode(errors="replace").splitlines():
        for marker in ("patch failed: ", "CONFLICT (content): Merge conflict in "):
            if marker in line:
                files.append(line.split(marker, 1)[1].rsplit(":", 1)[0].strip())
    return sorted(set(files))


# --- export ----------------------------------------------------------------


def format_patches(repo: Path, base_commit: str, out: Path) -> list[str]:
    """Write base..HEAD as byte-stable format-patch files; return their names."""
    merges = g.git(repo, "rev-list", "--merges", f"{base_commit}..HEAD").split()
    if merges:
        raise ToolkitError(f"the work tree has merge commits ({merges[0][:12]}): "
                           "a series must be linear")
    out.mkdir(parents=True, exist_ok=True)
    listed = g.git(repo, *FORMAT_PATCH_ARGS, "-o", str(out), f"{base_commit}..HEAD")
    return [Path(p).name for p in listed.split()]


def export(root: Path, check: bool = False, log=print) -> list[str]:
    """Regenerate patches/ from the work tree's commits; return changed names.

    With ``check`` nothing is written: the names that would change are returned.
    """
    repo = work_repo(root)
    state = State.load(root)
    if not g.is_repo(repo) or not state.base:
        raise ToolkitError("no work tree: run `nox -s apply` first")
    if state.rebase:
        raise ToolkitError("a rebase is stopped at a conflict: finish it first")
    op = g.operation_in_progress(repo)
    if op:
        raise ToolkitError(f"a git {op} is in progress in {repo}: finish it first")
    pin = b.read_pin(root)
    if state.base != pin.commit:
        raise ToolkitError(
            f"the work tree is on base {state.base_label} ({state.base[:12]}), "
            f"the pin on {pin.version}: export would write patches for another base "
            "(`nox -s rebase -- --update-pin` moves the pin)")
    dirty = g.dirty_files(repo)
    if dirty:
        log(f"export: {len(dirty)} uncommitted file(s) in the work tree are not exported")
    old = read_series(root)
    with tempfile.TemporaryDirectory() as tmp:
        names = format_patches(repo, state.base, Path(tmp))
        changed = []
        pdir = root / PATCHES
        pdir.mkdir(exist_ok=True)
        for name in names:
            new = (Path(tmp) / name).read_bytes()
            dest = pdir / name
            if not dest.exists() or dest.read_bytes() != new:
                if not check:
                    dest.write_bytes(new)
                changed.append(name)
    removed = [n for n in old if n not in names]
    if check:
        drift = changed + removed + ([] if old == names else ["series"])
        log(f"export --check: {'patches/ matches the work tree' if not drift else 'differs: ' + ', '.join(drift)}")
        return drift
    for name in removed:
        (root / PATCHES / name).unlink()
    series_text = "".join(n + "\n" for n in names)
    series_path = root / PATCHES / SERIES
    if not series_path.exists() or series_path.read_text() != series_text:
        series_path.write_text(series_text)
    state.head = g.rev(repo, "HEAD")
    state.fingerprint = fingerprint(root, state.base)
    state.total = state.applied = len(names)
    state.failed = None
    state.save(root)
    log(f"export: {len(names)} patch(es); {len(changed)} written, {len(removed)} removed")
    for name in changed:
        log(f"  wrote patches/{name}")
    for name in removed:
        log(f"  removed patches/{name}")
    for problem in manifest_problems(root):
        log(f"  note: {problem}")
    return changed


# --- status ----------------------------------------------------------------


def status(root: Path, log=print) -> dict:
    """Print and return how the work tree relates to the pin and patches/."""
    pin = b.read_pin(root)
    repo = work_repo(root)
    state = State.load(root)
    names = read_series(root)
    info: dict = {"pin": pin.version, "patches": names}
    log(f"pin:       vLLM {pin.version} (sdist sha256 {pin.sha256[:16]}..., "
        f"base commit {(pin.commit or '?')[:12]})")
    if not g.is_repo(repo) or not state.base:
        log(f"work tree: none ({repo} not made yet: `nox -s apply`)")
        info["work_tree"] = None
        return info
    head = g.rev(repo, "HEAD")
    info.update(base=state.base, head=head)
    on = "the pin's base" if state.base == pin.commit else f"vLLM {state.base_label}"
    log(f"work tree: {repo} on {on} ({state.base[:12]}), HEAD {(head or '?')[:12]}")
    if state.in_progress:
        log(f"  an apply was interrupted at {state.applied}/{state.total}: "
            "run `nox -s apply` to repair")
    if state.failed:
        log(f"  the last apply stopped at {state.failed}: the work tree holds "
            f"{state.applied}/{state.total} patches")
    if state.rebase:
        log(f"  a rebase onto {state.rebase.get('target')} is stopped at a conflict: "
            "`nox -s rebase -- --continue` or `--abort`")
    commits = g.commits(repo, f"{state.base}..HEAD") if head else []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            exported = format_patches(repo, state.base, Path(tmp)) if commits else []
        except ToolkitError:
            exported = []
        log(f"applied:   {len(commits)} commit(s)")
        differ = []
        for i, (cid, subject) in enumerate(commits):
            name = exported[i] if i < len(exported) else None
            mine = (Path(tmp) / name).read_bytes() if name else None
            if name in names and mine == (root / PATCHES / name).read_bytes():
                mark = "="
            else:
                mark = "M" if name in names else "+"
                differ.append(name or cid)
            log(f"  {mark} {cid[:12]} {subject}")
        missing = [n for n in names if n not in exported]
        for n in missing:
            log(f"  - patches/{n} is not in the work tree")
    info["differ"] = differ + missing
    if differ or missing:
        log("patches:   differ from the work tree (= same, M changed, + not in "
            "patches/, - not applied): `nox -s export` writes the work tree, "
            "`nox -s apply` the patches")
    else:
        log("patches:   the work tree matches patches/")
    dirty = g.dirty_files(repo)
    info["uncommitted"] = dirty
    if dirty:
        log(f"uncommitted: {len(dirty)} file(s)")
        for line in dirty[:20]:
            log(f"  {line}")
    else:
        log("uncommitted: none")
    return info


def test_files(root: Path) -> list[str]:
    """The series' test files, in series order, from the manifest."""
    files: list[str] = []
    for entry in read_manifest(root):
        files += [t for t in entry.get("tests", []) if t not in files]
    return files


def layering_acknowledged(root: Path) -> dict[str, str]:
    """Files whose coupling count a patch raises on purpose, with the reason
    (the manifest's ``layering`` tables)."""
    declared: dict[str, str] = {}
    for entry in read_manifest(root):
        for path, why in entry.get("layering", {}).items():
            declared[path] = f"{entry['file']}: {why}"
    return declared


def test_requirements(root: Path) -> list[str]:
    """What the series' CPU tests need installed: torch (CPU) and vLLM's
    Python requirements; nothing while the series has no test files."""
    if not test_files(root):
        return []
    return ["torch==2.13.0", "-r", str(work_repo(root) / "requirements" / "common.txt")]


def materialize(repo: Path, commit: str, dest: Path, *paths: str) -> None:
    """Write ``paths`` of ``commit`` into ``dest`` without touching the work tree."""
    archive = g.run(repo, "archive", "--format=tar", commit, *paths)
    if archive.returncode != 0:
        raise ToolkitError(f"git archive of {commit[:12]} failed")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
