"""The series: patches/ as the source of truth, a work tree made from it.

``apply`` builds ``.work/vllm`` as the pinned base plus one commit per patch
(``git am --3way``, author and dates from the patch, a fixed committer, so the
same series gives the same commit ids everywhere), and checks that each commit
touches exactly the files its patch lists. ``export`` writes the work tree's
commits back as ``git format-patch`` files with every drifting detail (commit
ids, git version, numbering) held fixed, so apply + export changes no byte.

Both go through :mod:`serieskit.safety`: the user's work in the work tree is
never discarded without ``--force``, and then it is kept first; export writes
patches/ only from a complete series at the branch head, and keeps the
previous version of every patch file it rewrites or removes.
"""

from __future__ import annotations

import email
import email.header
import email.policy
import hashlib
import io
import re
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from serieskit import base, git, safety
from serieskit.errors import ToolkitError, failed
from serieskit.state import WORK, State

PATCHES = "patches"
SERIES = "series"
MANIFEST = "manifest.toml"
BRANCH = safety.BRANCH
# The trailer that ties a commit to its manifest entry, whatever its subject.
NAME_TRAILER = "Patch-Name"

# Every flag that changes what format-patch writes, pinned (git's config is
# isolated as well, see git.STABLE_CONFIG), so that apply + export is byte-stable.
FORMAT_PATCH_ARGS = (
    "format-patch",
    "--zero-commit",  # "From 000..." instead of the commit id, which differs per committer
    "--no-signature",  # no "-- \n2.39.5": the git version would drift
    "--full-index",  # full blob ids: `am --3way` finds the preimage on any base
    "--no-numbered",  # "[PATCH]", not "[PATCH 3/6]": inserting a patch renames no other
    "--no-cover-letter", "--no-thread", "--no-attach", "--no-color",
    "--stat=80", "--stat-graph-width=20",  # the stat does not follow the terminal's width
)


def work_repo(root: Path) -> Path:
    return root / WORK / "vllm"


def applied_tree(root: Path) -> Path:
    tree = work_repo(root)
    if not git.is_repo(tree) or not State.load(root).base:
        raise ToolkitError("no work tree: run `nox -s apply` first")
    return tree


# --- patches/ --------------------------------------------------------------


def read_series(root: Path) -> list[str]:
    """Patch file names in order, from patches/series (checked: no duplicates,
    every file present)."""
    path = root / PATCHES / SERIES
    if not path.exists():
        raise ToolkitError(f"{path} is missing: it lists the patches in order "
                           "(an empty file for an empty series)")
    seen: dict[str, int] = {}  # name -> its line
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line in seen:
            raise ToolkitError(f"patches/series names {line} twice (lines {seen[line]} "
                               f"and {n}): remove one")
        if not (root / PATCHES / line).is_file():
            raise ToolkitError(f"patches/series names {line}, which does not exist")
        seen[line] = n
    return list(seen)


def read_manifest(root: Path) -> list[dict]:
    path = root / PATCHES / MANIFEST
    if not path.exists():
        return []
    try:
        return tomllib.loads(path.read_text()).get("patch", [])
    except tomllib.TOMLDecodeError as e:
        raise ToolkitError(f"patches/{MANIFEST} is malformed: {e}") from None


@dataclass(frozen=True)
class PatchFile:
    """What a format-patch file says about itself."""

    subject: str
    name: str | None  # its Patch-Name trailer
    files: frozenset[str]  # every path its diffs touch
    diffs: int  # `diff --git` sections
    inserted: int
    deleted: int
    stat: tuple[int, int, int] | None  # files, insertions, deletions of its summary line


_STAT = re.compile(r"^ (\d+) files? changed(?:, (\d+) insertions?\(\+\))?"
                   r"(?:, (\d+) deletions?\(-\))?$", re.M)


def read_patch(path: Path) -> PatchFile:
    raw = path.read_bytes()
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    subject = " ".join(str(email.header.make_header(
        email.header.decode_header(msg.get("Subject", "")))).split())
    subject = subject.removeprefix("[PATCH] ")
    text = raw.decode(errors="replace")
    head, _, body = text.partition("\ndiff --git ")
    body = "diff --git " + body if body else ""
    trailer = re.search(rf"^{NAME_TRAILER}: *(\S+) *$", head, re.M)
    stat = _STAT.search(head)
    files: set[str] = set()
    diffs = inserted = deleted = 0
    in_hunk = False
    for line in body.splitlines():
        if line.startswith("diff --git "):
            diffs += 1
            in_hunk = False
            m = re.match(r"diff --git a/(\S+) b/(\S+)$", line)
            if m:
                files.update(m.groups())
        elif line.startswith("@@"):
            in_hunk = True
        elif in_hunk and line.startswith("+"):
            inserted += 1
        elif in_hunk and line.startswith("-"):
            deleted += 1
    return PatchFile(
        subject, trailer.group(1) if trailer else None, frozenset(files), diffs,
        inserted, deleted,
        tuple(int(g or 0) for g in stat.groups()) if stat else None,  # type: ignore[arg-type]
    )


def patch_problem(patch: PatchFile) -> str | None:
    """Why a patch file is truncated or malformed, by its own summary line."""
    if patch.diffs == 0:
        return "it holds no diff"
    if patch.stat is None:
        return None  # written by hand, without a stat: git am is the judge
    files, ins, dels = patch.stat
    if patch.diffs != files:
        return (f"its summary says {files} file(s) changed but it holds {patch.diffs} "
                "diff(s): the file is truncated")
    if (patch.inserted, patch.deleted) != (ins, dels):
        return (f"its summary says +{ins} -{dels} lines but its hunks hold "
                f"+{patch.inserted} -{patch.deleted}: the file is truncated or edited")
    return None


def check_patches(root: Path, names: list[str]) -> dict[str, PatchFile]:
    """Read every patch file of the series; the first bad one is an error."""
    patches = {}
    for i, name in enumerate(names, 1):
        patch = read_patch(root / PATCHES / name)
        if problem := patch_problem(patch):
            raise ToolkitError(f"patches/{name} ({i}/{len(names)}) is malformed: {problem}")
        patches[name] = patch
    return patches


def fingerprint(root: Path, base_commit: str) -> str:
    """Of the base and patches/ as they are; a missing series file counts as
    a change, never as an error (export may write it)."""
    h = hashlib.sha256(base_commit.encode())
    if not (root / PATCHES / SERIES).exists():
        return h.hexdigest() + "-no-series"
    for name in read_series(root):
        h.update(b"\0" + name.encode() + b"\0")
        h.update((root / PATCHES / name).read_bytes())
    return h.hexdigest()


# --- apply -----------------------------------------------------------------


def apply(root: Path, force: bool = False, log=print) -> State:
    """Make the work tree the pinned base plus the series; a no-op when current."""
    git.require_version()
    start = time.monotonic()
    repo = work_repo(root)
    pin = base.read_pin(root)
    names = read_series(root)
    patches = check_patches(root, names)
    state = State.load(root)
    safety.guard_folder(root, repo, force, log)
    base.ensure_repo(repo)

    if state.rebase_stopped:
        raise ToolkitError("a rebase is stopped at a conflict: finish it with "
                           "`nox -s rebase -- --continue` or give up with `--abort`")
    op = git.operation_in_progress(repo)
    if op == "am" and state.in_progress == "apply":
        # Our own am, killed midway: git's abort restores HEAD and keeps
        # changes to files the patch does not touch; the guard sees the rest.
        git.git(repo, "am", "--abort")
    elif op is not None:
        raise ToolkitError(f"a git {op} is in progress in {repo}: finish it, or "
                           f"`git -C {repo} {op} --abort`, then run this again")
    if state.in_progress:
        log(f"apply: an earlier apply was interrupted at {state.applied}/{state.total}; "
            "applying again")

    moved = state.base is not None and pin.commit is not None and state.base != pin.commit
    if moved and not force:
        raise ToolkitError(
            f"the work tree holds the series rebased onto {state.base_label} (nox -s rebase), "
            "not the pin's base: `nox -s rebase -- --update-pin` moves the pin there, "
            "`nox -s apply -- --force` goes back to the pin and keeps the rebased commits "
            f"under {safety.BACKUP_REF}/")
    safety.guard(root, repo, state, "apply", force, log,
                 extra_known=_left_by_interrupted_apply(repo, state, names, patches))
    if moved and (head := git.rev(repo, "HEAD")):
        log(f"apply: kept the series rebased onto {state.base_label} as "
            f"{safety.backup_ref(repo, head, 'rebased')}")

    base_commit, _ = base.ensure_base(repo, pin.version, pin.sha256, pin.commit, log=log)
    fp = fingerprint(root, base_commit)
    head = git.rev(repo, "HEAD")
    if (fp == state.fingerprint and head == state.head and head is not None
            and state.complete and git.branch(repo) == BRANCH and not git.dirty_files(repo)):
        log(f"apply: up to date, {len(names)} patch(es) on vLLM {pin.version} "
            f"(HEAD {head[:12]}, {time.monotonic() - start:.1f} s)")
        return state
    if not names:
        log(f"apply: patches/series lists no patch: the work tree is vLLM {pin.version} alone")

    state = State(base=base_commit, base_label=pin.version, total=len(names),
                  in_progress="apply", head=base_commit, started_from=safety.tips(repo))
    state.save(root)
    git.git(repo, "checkout", "-q", "-f", "-B", BRANCH, base_commit)
    for i, name in enumerate(names, 1):
        log(f"apply {i}/{len(names)}: {patches[name].subject}")
        _am(root, repo, state, name, i, len(names), patches[name])
        state.applied = i
        state.head = git.rev(repo, "HEAD")
        state.save(root)
    state.in_progress = None
    state.fingerprint = fp
    state.save(root)
    log(f"apply: {len(names)} patch(es) on vLLM {pin.version}, HEAD "
        f"{(state.head or '')[:12]} ({time.monotonic() - start:.1f} s)")
    return state


def _left_by_interrupted_apply(repo: Path, state: State, names: list[str],
                               patches: dict[str, PatchFile]) -> tuple[str, ...]:
    """What an interrupted apply left in the work tree that is not the user's:
    the commits it started from (its guard had passed them) and those it made."""
    if not state.in_progress:
        return ()
    return (*state.started_from, *_made_by_interrupted_apply(repo, state, names, patches))


def _made_by_interrupted_apply(repo: Path, state: State, names: list[str],
                               patches: dict[str, PatchFile]) -> tuple[str, ...]:
    """The commits an apply killed between `git am` and its state save made:
    on top of the last recorded one, by the toolkit's committer, one per next
    patch of the series, in order. Anything else is the user's."""
    if not state.in_progress or not state.head or git.rev(repo, state.head) is None:
        return ()
    out = git.git(repo, "log", "--reverse", "--format=%H%x00%cn%x00%s", f"{state.head}..HEAD")
    ours = None
    for i, line in enumerate(out.splitlines()):
        cid, committer, subject = line.split("\0")
        k = state.applied + i
        if (k >= len(names) or committer != git.COMMITTER[0]
                or subject != patches[names[k]].subject):
            break
        ours = cid
    return (ours,) if ours else ()


def _am(root: Path, repo: Path, state: State, name: str, i: int, n: int,
        patch: PatchFile) -> None:
    """Commit one patch; check the commit touches exactly the patch's files."""
    proc = git.run(repo, "am", "--3way", "--keep-non-patch", "--committer-date-is-author-date",
                   "--no-gpg-sign", str(root / PATCHES / name))
    problem = None
    if proc.returncode != 0:
        files = _conflicted(repo) or _am_failed_files(proc.stdout + proc.stderr)
        problem = "does not apply" + (f" (conflict in {', '.join(files)})" if files else "")
        git.run(repo, "am", "--abort")
    else:
        touched = set(git.changed_files(repo, "HEAD"))
        if touched != patch.files:
            problem = ("applied, but its commit touches "
                       f"{', '.join(sorted(touched ^ patch.files))} against what it lists")
            git.git(repo, "reset", "-q", "--hard", "HEAD~1")  # our own commit, from the patch
    if problem:
        state.in_progress = None
        state.failed = name
        state.head = git.rev(repo, "HEAD")
        state.save(root)
        raise ToolkitError(f"patch {name} ({i}/{n}) {problem}; the work tree holds "
                           f"patches 1-{i - 1} only")


def _conflicted(repo: Path) -> list[str]:
    out = git.git(repo, "diff", "--name-only", "--diff-filter=U", check=False)
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
    merges = git.git(repo, "rev-list", "--merges", f"{base_commit}..HEAD").split()
    if merges:
        raise ToolkitError(f"the work tree has merge commits ({merges[0][:12]}): "
                           "a series must be linear")
    out.mkdir(parents=True, exist_ok=True)
    listed = git.git(repo, *FORMAT_PATCH_ARGS, "-o", str(out), f"{base_commit}..HEAD")
    return [Path(p).name for p in listed.split()]


def require_exportable(root: Path, state: State, force: bool = False) -> Path:
    """Refuse to write patches/ unless the work tree holds a complete, applied
    series at the head of its branch, on the pin's base, made from the
    patches/ that are there now."""
    repo = work_repo(root)
    if not git.is_repo(repo) or not state.base:
        raise ToolkitError("no work tree: run `nox -s apply` first")
    if state.rebase_stopped:
        raise ToolkitError("a rebase is stopped at a conflict: finish it "
                           "(`nox -s rebase -- --continue`) or `--abort` it first")
    if op := git.operation_in_progress(repo):
        raise ToolkitError(f"a git {op} is in progress in {repo}: finish it first")
    if state.in_progress:
        raise ToolkitError(f"an apply was interrupted at {state.applied}/{state.total}: "
                           "the work tree is not the whole series; `nox -s apply` redoes it")
    if state.failed:
        raise ToolkitError(f"the last apply stopped at patches/{state.failed}: the work tree "
                           f"holds {state.applied}/{state.total} patches, and export would "
                           "drop the rest; fix the patch and `nox -s apply`")
    pin = base.read_pin(root)
    if state.base != pin.commit:
        raise ToolkitError(
            f"the work tree is on {state.base_label} ({state.base[:12]}), the pin on "
            f"{pin.version}: export writes patches for the pin's base"
            + (" (`nox -s rebase -- --update-pin` moves the pin)"
               if state.rebase and state.rebase.is_release else ""))
    if (on := git.branch(repo)) != BRANCH:
        where = "detached" if on is None else f"on branch {on}"
        raise ToolkitError(f"HEAD is {where} in {repo}: export writes the branch "
                           f"`{BRANCH}`; `git -C {repo} checkout {BRANCH}` first")
    if not force and state.fingerprint != fingerprint(root, state.base):
        raise ToolkitError(
            "patches/ changed since the work tree was made from it: `nox -s apply` takes "
            "those changes (it keeps your work first), or `nox -s export -- --force` "
            f"overwrites them (keeping the current files under {safety.BACKUP_DIR}/)")
    return repo


def export(root: Path, check: bool = False, force: bool = False, log=print) -> list[str]:
    """Regenerate patches/ from the work tree's commits; return changed names.

    With ``check`` nothing is written: the names that would change are returned.
    """
    state = State.load(root)
    repo = require_exportable(root, state, force=force or check)
    assert state.base
    dirty = git.dirty_files(repo)
    if dirty:
        log(f"export: {len(dirty)} uncommitted file(s) in the work tree are not exported")
    old = read_series(root) if (root / PATCHES / SERIES).exists() else []
    pdir = root / PATCHES
    with tempfile.TemporaryDirectory() as tmp:
        names = format_patches(repo, state.base, Path(tmp))
        new = {name: (Path(tmp) / name).read_bytes() for name in names}
    check_manifest(root, repo, state.base, names)
    changed = [n for n in names if not (pdir / n).exists() or (pdir / n).read_bytes() != new[n]]
    removed = [n for n in old if n not in names]
    series_text = "".join(n + "\n" for n in names)
    series_path = pdir / SERIES
    series_changed = not series_path.exists() or series_path.read_text() != series_text
    if check:
        drift = changed + removed + (["series"] if series_changed else [])
        log("export --check: " + ("patches/ matches the work tree" if not drift
                                  else "differs: " + ", ".join(drift)))
        return drift
    kept = safety.keep_files(root, [pdir / n for n in changed + removed]
                             + ([series_path] if series_changed else []), "export")
    for name in changed:
        (pdir / name).write_bytes(new[name])
    for name in removed:
        (pdir / name).unlink()
    if series_changed:
        series_path.write_text(series_text)
    state.head = git.rev(repo, "HEAD")
    state.fingerprint = fingerprint(root, state.base)
    state.total = state.applied = len(names)
    state.save(root)
    log(f"export: {len(names)} patch(es); {len(changed)} written, {len(removed)} removed")
    for name in changed:
        log(f"  wrote patches/{name}")
    for name in removed:
        log(f"  removed patches/{name}")
    if kept:
        log(f"export: the previous versions are kept in {kept}")
    return changed


# --- manifest --------------------------------------------------------------

REQUIRED = ("name", "seed", "summary", "config", "tests")


def check_manifest(root: Path, repo: Path, base_commit: str, names: list[str]) -> None:
    """Each commit names its manifest entry with a Patch-Name trailer; a
    commit without one, an entry without a commit, or an entry lacking a
    key fails (nothing is written). No manifest, no check."""
    entries = read_manifest(root)
    if not entries and not (root / PATCHES / MANIFEST).exists():
        return
    problems = [f"patches/{MANIFEST} entry {e.get('name', e.get('file'))} lacks "
                f"{', '.join(k for k in REQUIRED if k not in e)}"
                for e in entries if any(k not in e for k in REQUIRED)]
    listed = [e.get("name") for e in entries]
    trailers = commit_names(repo, base_commit)
    for cid, subject, name in trailers:
        if name is None:
            problems.append(f"commit {cid[:12]} \"{subject}\" has no {NAME_TRAILER}: trailer "
                            f"(`git commit --amend --trailer '{NAME_TRAILER}: NAME'`, and a "
                            f"[[patch]] entry with name = \"NAME\" in patches/{MANIFEST})")
        elif name not in listed:
            problems.append(f"commit {cid[:12]} \"{subject}\" is {NAME_TRAILER}: {name}, "
                            f"which patches/{MANIFEST} has no entry for")
    have = {name for _, _, name in trailers}
    problems += [f"patches/{MANIFEST} has an entry {n} that no commit names: remove it, or "
                 f"restore the commit's {NAME_TRAILER}: trailer"
                 for n in listed if n not in have]
    if problems:
        raise ToolkitError("the manifest does not match the series (nothing written):\n"
                           + "\n".join(f"  {p}" for p in problems))


def commit_names(repo: Path, base_commit: str) -> list[tuple[str, str, str | None]]:
    """(id, subject, Patch-Name trailer) of each commit of the series."""
    fmt = f"%H%x00%s%x00%(trailers:key={NAME_TRAILER},valueonly,separator=%x01)%x00"
    out = git.git(repo, "log", "--reverse", f"--format={fmt}", f"{base_commit}..HEAD")
    rows = []
    fields = out.split("\0")
    for i in range(0, len(fields) - 3, 3):
        cid, subject, name = (f.strip() for f in fields[i:i + 3])
        rows.append((cid, subject, name.split("\x01")[0].strip() or None))
    return rows


def manifest_entry(root: Path, name: str) -> dict | None:
    return next((e for e in read_manifest(root) if e.get("name") == name), None)


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
            declared[path] = f"{entry.get('name')}: {why}"
    return declared


def test_requirements(root: Path) -> list[str]:
    """What the series' CPU tests need installed: torch (CPU), vLLM's Python
    requirements and the Triton of the GPU stack (3.6.0, torch 2.11's), which
    compiles the series' Triton kernels for sm_75 / sm_70 without a GPU
    (unpinned, vLLM's requirements bring whatever is newest); nothing while the
    series has no test files."""
    if not test_files(root):
        return []
    return [
        "torch==2.13.0",
        "triton==3.6.0",
        "-r",
        str(work_repo(root) / "requirements" / "common.txt"),
    ]


def materialize(repo: Path, commit: str, dest: Path, *paths: str) -> None:
    """Write ``paths`` of ``commit`` into ``dest`` without touching the work tree."""
    archive = git.run(repo, "archive", "--format=tar", commit, *paths)
    if archive.returncode != 0:
        raise failed(f"git archive of {commit[:12]}", archive)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
