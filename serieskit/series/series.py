"""The series' files: patches/ (the source of truth), its order and its manifest.

Everything that reads the patch folder, or writes it as ``git format-patch``
files, lives here; making the work tree from it is :mod:`.apply` (and
:mod:`.resume` after a patch finished by hand), writing it back
:mod:`.export`. Both go through :mod:`.safety`: the user's work in the work
tree is never discarded without ``--force``, and then it is kept first.
"""

from __future__ import annotations

import email
import email.header
import email.policy
import hashlib
import io
import re
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from serieskit import git, results
from serieskit.errors import ToolkitError, failed
from serieskit.series import base, safety, target
from serieskit.series.target import Target
from serieskit.state import State

# Every function that takes ``where`` acts on that target (the pin's series or
# a port, see serieskit.series.target); a toolkit root means the pin's.
Where = Path | Target

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
    "--no-cover-letter",
    "--no-thread",
    "--no-attach",
    "--no-color",
    "--stat=80",
    "--stat-graph-width=20",  # the stat does not follow the terminal's width
)


def work_repo(where: Where) -> Path:
    return target.of(where).work


def applied_tree(where: Where) -> Path:
    """The work tree, for a session that reads it: refused unless it holds
    the whole series (no apply stopped or interrupted, no rebase or carry
    stopped in it), with the command that goes on."""
    t = target.of(where)
    state = State.load(t)
    if not git.is_repo(t.work) or not state.base:
        raise ToolkitError(f"no work tree: run `{t.cmd('apply')}` first")
    if reason := unfinished(t, state):
        raise ToolkitError(f"{t.work} does not hold the whole series: {reason}")
    return t.work


def stopped_message(t: Target, state: State) -> str:
    """Why a session refuses while a rebase or a carry is stopped (at a
    conflict, or interrupted inside a step), and the commands that go on."""
    rb = state.rebase
    carry = rb is not None and rb.kind == "carry"
    what = "a carry to the port" if carry else "a rebase"
    session = f"nox -s carry -- {t.version}" if carry else "nox -s rebase --"
    if state.rebase_interrupted:
        return (
            f"{what} was interrupted (killed) inside a step: `{session} --abort` goes back to "
            "where it started, keeping what the work tree holds in a stash; then start it again"
        )
    return (
        f"{what} is stopped at a conflict: finish it with `{session} --continue` "
        f"or give up with `{session} --abort`"
    )


def unfinished(t: Target, state: State) -> str | None:
    """Why the work tree does not hold the whole series, with the way on."""
    if state.rebase_stopped:
        return stopped_message(t, state)
    if state.in_progress == "continue":
        return (
            f"an apply --continue did not finish ({state.applied} of {state.total} patches "
            f"applied): `{t.cmd('apply', '--continue')}` goes on"
        )
    if state.in_progress:
        return (
            f"an apply did not finish ({state.applied} of {state.total} patches applied): "
            f"`{t.cmd('apply')}` redoes it"
        )
    if state.failed:
        return (
            f"an apply stopped at {state.failed} ({state.applied} of {state.total} patches "
            f"applied): finish that patch by hand and `{t.cmd('apply', '--continue')}`, or fix "
            f"the patch file and `{t.cmd('apply')}`"
        )
    return None


# --- patches/ --------------------------------------------------------------


def read_series(where: Where) -> list[str]:
    """Patch file names in order, from the target's series file (checked: no
    duplicates, every file present)."""
    t = target.of(where)
    path, label = t.patches / SERIES, f"{t.patches_label}/{SERIES}"
    if not path.exists():
        raise ToolkitError(
            f"{path} is missing: it lists the patches in order (an empty file for an empty series)"
        )
    seen: dict[str, int] = {}  # name -> its line
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if line in seen:
            raise ToolkitError(
                f"{label} names {line} twice (lines {seen[line]} and {n}): remove one"
            )
        if not (t.patches / line).is_file():
            raise ToolkitError(f"{label} names {line}, which does not exist")
        seen[line] = n
    return list(seen)


def read_manifest(where: Where) -> list[dict]:
    t = target.of(where)
    path = t.patches / MANIFEST
    if not path.exists():
        return []
    try:
        return tomllib.loads(path.read_text()).get("patch", [])
    except tomllib.TOMLDecodeError as e:
        raise ToolkitError(f"{t.patches_label}/{MANIFEST} is malformed: {e}") from None


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
    # (path, its blob after the patch; None where the patch deletes it), from
    # the diffs' `index` lines (written with --full-index)
    blobs: tuple[tuple[str, str | None], ...] = ()
    lines: tuple[tuple[str, int], ...] = ()  # (path, lines its hunks insert or delete)


_INDEX = re.compile(r"^index [0-9a-f]+\.\.([0-9a-f]+)(?: \d+)?$")
_NO_BLOB = re.compile(r"^0+$")
_STAT = re.compile(
    r"^ (\d+) files? changed(?:, (\d+) insertions?\(\+\))?"
    r"(?:, (\d+) deletions?\(-\))?$",
    re.M,
)


def read_patch(path: Path) -> PatchFile:
    raw = path.read_bytes()
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    subject = " ".join(
        str(email.header.make_header(email.header.decode_header(msg.get("Subject", "")))).split()
    )
    subject = subject.removeprefix("[PATCH] ")
    text = raw.decode(errors="replace")
    head, _, body = text.partition("\ndiff --git ")
    body = "diff --git " + body if body else ""
    trailer = re.search(rf"^{NAME_TRAILER}: *(\S+) *$", head, re.M)
    stat = _STAT.search(head)
    files: set[str] = set()
    blobs: dict[str, str | None] = {}
    lines: dict[str, int] = {}
    diffs = inserted = deleted = 0
    in_hunk = False
    current = None  # the path of the diff being read
    for line in body.splitlines():
        if line.startswith("diff --git "):
            diffs += 1
            in_hunk = False
            m = re.match(r"diff --git a/(\S+) b/(\S+)$", line)
            current = m.group(2) if m else None
            if m:
                files.update(m.groups())
        elif line.startswith("@@"):
            in_hunk = True
        elif not in_hunk and current and (index := _INDEX.match(line)):
            blob = index.group(1)
            blobs[current] = None if _NO_BLOB.match(blob) else blob
        elif not in_hunk and line.startswith("rename from "):
            blobs[line.removeprefix("rename from ")] = None
        elif in_hunk and line.startswith("+"):
            inserted += 1
            if current:
                lines[current] = lines.get(current, 0) + 1
        elif in_hunk and line.startswith("-"):
            deleted += 1
            if current:
                lines[current] = lines.get(current, 0) + 1
    return PatchFile(
        subject,
        trailer.group(1) if trailer else None,
        frozenset(files),
        diffs,
        inserted,
        deleted,
        tuple(int(g or 0) for g in stat.groups()) if stat else None,  # type: ignore[arg-type]
        tuple(sorted(blobs.items())),
        tuple(sorted(lines.items())),
    )


def head_blobs(patches: list[PatchFile]) -> dict[str, str | None]:
    """The blob of every file the series changes at the series head, from
    its patch files in order (the last patch that touches a file has the
    last word; None: deleted), without applying them. A file renamed
    without a change has no `index` line, and so no blob here."""
    out: dict[str, str | None] = {}
    for patch in patches:
        out.update(patch.blobs)
    return out


def patch_problem(patch: PatchFile) -> str | None:
    """Why a patch file is truncated or malformed, by its own summary line."""
    if patch.diffs == 0:
        return "it holds no diff"
    if patch.stat is None:
        return None  # written by hand, without a stat: git am is the judge
    files, ins, dels = patch.stat
    if patch.diffs != files:
        return (
            f"its summary says {files} file(s) changed but it holds {patch.diffs} "
            "diff(s): the file is truncated"
        )
    if (patch.inserted, patch.deleted) != (ins, dels):
        return (
            f"its summary says +{ins} -{dels} lines but its hunks hold "
            f"+{patch.inserted} -{patch.deleted}: the file is truncated or edited"
        )
    return None


def check_patches(where: Where, names: list[str]) -> dict[str, PatchFile]:
    """Read every patch file of the series; the first bad one is an error."""
    t = target.of(where)
    patches = {}
    for i, name in enumerate(names, 1):
        patch = read_patch(t.patches / name)
        if problem := patch_problem(patch):
            raise ToolkitError(
                f"{t.patches_label}/{name} ({i}/{len(names)}) is malformed: {problem}"
            )
        patches[name] = patch
    return patches


def fingerprint(where: Where, base_commit: str) -> str:
    """Of the base and the patch folder as they are; a missing series file
    counts as a change, never as an error (export may write it)."""
    t = target.of(where)
    if not (t.patches / SERIES).exists():
        return hashlib.sha256(base_commit.encode()).hexdigest() + "-no-series"
    return fingerprint_of(
        base_commit, [(name, (t.patches / name).read_bytes()) for name in read_series(t)]
    )


def fingerprint_of(base_commit: str, patches: list[tuple[str, bytes]]) -> str:
    """The fingerprint of a patch folder that holds ``patches`` (name, bytes), in order."""
    h = hashlib.sha256(base_commit.encode())
    for name, data in patches:
        h.update(b"\0" + name.encode() + b"\0")
        h.update(data)
    return h.hexdigest()


# --- an export's record --------------------------------------------------------


def record_export(where: Where, state: State, head: str | None, fp: str, count: int) -> None:
    """Note that the patch folder now holds the work tree's series at ``head``."""
    state.head, state.fingerprint = head, fp
    state.total = state.applied = count
    state.continued_head, state.sources = None, []  # patches finished by hand now written
    state.exporting = state.export_fingerprint = None
    state.save(target.of(where))


def finish_interrupted_export(where: Where, state: State, log=print) -> bool | None:
    """After an export killed as it wrote the patch folder: if it had written
    every file, note so (as it would have) and return True; False when it
    had not (``export`` writes them again); None when no export was cut short."""
    t = target.of(where)
    if not state.exporting or not state.base:
        return None
    if fingerprint(t, state.base) != state.export_fingerprint:
        return False
    record_export(t, state, state.exporting, state.export_fingerprint or "", len(read_series(t)))
    log(
        f"export: an earlier export had written {t.patches_label}/ whole when it was "
        "interrupted; noted as done"
    )
    return True


# --- format-patch ----------------------------------------------------------


def format_patches(repo: Path, base_commit: str, out: Path) -> list[str]:
    """Write base..HEAD as byte-stable format-patch files; return their names."""
    merges = git.git(repo, "rev-list", "--merges", f"{base_commit}..HEAD").split()
    if merges:
        raise ToolkitError(
            f"the work tree has merge commits ({merges[0][:12]}): a series must be linear"
        )
    out.mkdir(parents=True, exist_ok=True)
    listed = git.git(repo, *FORMAT_PATCH_ARGS, "-o", str(out), f"{base_commit}..HEAD")
    return [Path(p).name for p in listed.split()]


# --- manifest --------------------------------------------------------------

REQUIRED = ("name", "seed", "summary", "config", "tests")


def check_manifest(where: Where, repo: Path, base_commit: str, names: list[str]) -> None:
    """Each commit names its manifest entry with a Patch-Name trailer; a
    commit without one, an entry without a commit, or an entry lacking a
    key fails (nothing is written). No manifest, no check."""
    t = target.of(where)
    manifest = f"{t.patches_label}/{MANIFEST}"
    entries = read_manifest(t)
    if not entries and not (t.patches / MANIFEST).exists():
        return
    problems = [
        f"{manifest} entry {e.get('name', e.get('file'))} lacks "
        f"{', '.join(k for k in REQUIRED if k not in e)}"
        for e in entries
        if any(k not in e for k in REQUIRED)
    ]
    listed = [e.get("name") for e in entries]
    trailers = commit_names(repo, base_commit)
    for cid, subject, name in trailers:
        if name is None:
            problems.append(
                f'commit {cid[:12]} "{subject}" has no {NAME_TRAILER}: trailer '
                f"(`git commit --amend --trailer '{NAME_TRAILER}: NAME'`, and a "
                f'[[patch]] entry with name = "NAME" in {manifest})'
            )
        elif name not in listed:
            problems.append(
                f'commit {cid[:12]} "{subject}" is {NAME_TRAILER}: {name}, '
                f"which {manifest} has no entry for"
            )
    have = {name for _, _, name in trailers}
    problems += [
        f"{manifest} has an entry {n} that no commit names: remove it, or "
        f"restore the commit's {NAME_TRAILER}: trailer"
        for n in listed
        if n not in have
    ]
    if problems:
        raise ToolkitError(
            "the manifest does not match the series (nothing written):\n"
            + "\n".join(f"  {p}" for p in problems)
        )


def commit_names(repo: Path, base_commit: str) -> list[tuple[str, str, str | None]]:
    """(id, subject, Patch-Name trailer) of each commit of the series."""
    fmt = f"%H%x00%s%x00%(trailers:key={NAME_TRAILER},valueonly,separator=%x01)%x00"
    out = git.git(repo, "log", "--reverse", f"--format={fmt}", f"{base_commit}..HEAD")
    rows = []
    fields = out.split("\0")
    for i in range(0, len(fields) - 3, 3):
        cid, subject, name = (f.strip() for f in fields[i : i + 3])
        rows.append((cid, subject, name.split("\x01")[0].strip() or None))
    return rows


def manifest_entry(where: Where, name: str) -> dict | None:
    return next((e for e in read_manifest(where) if e.get("name") == name), None)


def test_files(where: Where) -> list[str]:
    """The series' test files, in series order, from the manifest."""
    files: list[str] = []
    for entry in read_manifest(where):
        files += [t for t in entry.get("tests", []) if t not in files]
    return files


def gpu_test_files(where: Where) -> list[str]:
    """The series' test files that run whole on the GPU machine: those that
    are not also an upstream test file a patch extends (whose other cases
    may need what that machine lacks, a model from the hub)."""
    upstream = {t for entry in read_manifest(where) for t in entry.get("upstream_tests", [])}
    return [t for t in test_files(where) if t not in upstream]


def gpu_test_cases(where: Where) -> dict[str, str]:
    """The patches' own GPU tests inside upstream test files (``gpu_cases``:
    pytest's -k expression per file), which the GPU sitting runs alone of
    their files; a file named by two patches takes either expression."""
    cases: dict[str, str] = {}
    for entry in read_manifest(where):
        for path, expr in entry.get("gpu_cases", {}).items():
            cases[path] = f"{cases[path]} or ({expr})" if path in cases else f"({expr})"
    return cases


def layering_acknowledged(where: Where) -> dict[str, str]:
    """Files whose coupling count a patch raises on purpose, with the reason
    (the manifest's ``layering`` tables)."""
    declared: dict[str, str] = {}
    for entry in read_manifest(where):
        for path, why in entry.get("layering", {}).items():
            declared[path] = f"{entry.get('name', 'an unnamed patch')}: {why}"
    return declared


def test_requirements(where: Where) -> list[str]:
    """What the series' CPU tests need installed: the target's torch (with the
    Triton it pins, which compiles the series' Triton kernels for sm_75 / sm_70
    without a GPU) and its tree's Python requirements; nothing while the series
    has no test files."""
    t = target.of(where)
    if not test_files(t):
        return []
    return [f"torch=={t.torch}", "-r", str(t.work / "requirements" / "common.txt")]


def materialize(repo: Path, commit: str, dest: Path, *paths: str) -> None:
    """Write ``paths`` of ``commit`` into ``dest`` without touching the work tree."""
    archive = git.run(repo, "archive", "--format=tar", commit, *paths)
    if archive.returncode != 0:
        raise failed(f"git archive of {commit[:12]}", archive)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")


def results_header(root: Path, tree: Path) -> dict:
    """The ``series`` block of a results file for ``tree`` at its HEAD on the
    pin's base (bench scripts that read a tree given on their command line),
    with a note when the tree has uncommitted changes."""
    pin = base.read_pin(root)
    head = git.git(tree, "rev-parse", "HEAD").strip()
    block = results.series_block(tree, pin.commit or "", head, pin.version)
    dirty = git.git(tree, "status", "--porcelain", "--untracked-files=no").strip()
    if dirty:
        block["note"] = "the work tree had uncommitted changes: " + " ".join(dirty.split())
    return block
