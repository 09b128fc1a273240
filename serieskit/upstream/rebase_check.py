"""``nox -s rebase -- --check TARGET...``: would the series apply there?

A dry run that changes nothing of the user's: the patch files are applied
in order in a throwaway worktree (``.work/check-*``, removed afterwards, or
by the next check where a killed one left it) on
each target release, and each is reported as it went:

- ``clean``: its context matches exactly (``git apply --check``);
- ``3-way``: ``git am --3way`` merges it without a conflict;
- ``conflict``: the files, each with the conflict hunks in it or what the
  two sides did to it (deleted upstream, renamed upstream to Y, ...), or the
  files ``git am`` could not patch at all.

``git am --3way`` merges from the blobs a patch's ``index`` lines name; the
check writes them itself (:func:`preimages`), so a fresh clone, with no
series applied yet, gets the verdicts of a work tree after ``apply``.
After a conflict the patch is taken as it was written (its side of every
conflict), so the patches after it are tried on what a resolution that
keeps the series' intent would give. Given several releases or a range
(``vllm>=0.27,<=0.33``), every one is tried and the newest that takes the
series without a conflict is named.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from serieskit import git
from serieskit.errors import ToolkitError, failed
from serieskit.series import base, safety, series
from serieskit.state import WORK


@dataclass
class PatchResult:
    name: str
    how: str  # "clean", "3-way" or "conflict"
    files: dict[str, str] = field(default_factory=dict)  # conflicted file -> what happened


@dataclass
class TargetResult:
    version: str
    patches: list[PatchResult]

    @property
    def conflicts(self) -> list[PatchResult]:
        return [p for p in self.patches if p.how == "conflict"]


# One PEP 440 clause: an operator, then a version (wildcards for == and !=).
CLAUSE = re.compile(r"\s*(~=|===|==|!=|<=|>=|<|>)\s*[0-9][\w.*+!-]*\s*")
FORMS = "vllm==VERSION or a range such as 'vllm>=0.27,<=0.33'"


def targets(specs: list[str], pin: str | None = None) -> list[str]:
    """Release versions from ``vllm==X`` and ``vllm<spec>`` arguments, oldest
    first. ``pin``, the series' release, is named when nothing matches."""
    versions: list[str] = []
    for spec in specs:
        if m := re.fullmatch(r"vllm==(\S+)", spec):
            base.check_version(m.group(1))
            versions.append(m.group(1))
        elif m := re.fullmatch(r"vllm([<>=!~][^@\s]*)", spec):
            versions += releases(_specifier(spec, m.group(1)))
        else:
            raise ToolkitError(f"--check takes {FORMS}, not {spec!r}")
    if not versions:
        raise ToolkitError(_nothing_matches(specs, pin))
    return sorted(set(versions), key=_version_key)


def _specifier(spec: str, specifier: str) -> str:
    """``specifier`` checked here, so that a typo is one line that shows the
    form rather than pip's traceback."""
    if all(CLAUSE.fullmatch(c) for c in specifier.split(",")):
        return specifier
    fix = (
        f" (one release: 'vllm=={specifier[1:]}')" if re.fullmatch(r"=[^=<>!~]+", specifier) else ""
    )
    raise ToolkitError(f"--check: {spec!r} is not a version specifier{fix}; it takes {FORMS}")


def _nothing_matches(specs: list[str], pin: str | None) -> str:
    """No release matches: say which is the newest and where the series is, and so
    whether there is anything to move to yet."""
    wanted = " ".join(repr(s) for s in specs)
    found = releases(">=0")
    newest = max(found, key=_version_key) if found else None
    if newest is None:
        return f"no vLLM release with a source distribution matches {wanted} (none on the index)"
    if pin and _version_key(newest) <= _version_key(pin):
        return (
            f"no vLLM release with a source distribution matches {wanted}: the newest on "
            f"the index is {newest}, the series' pin already (pin.toml); nothing to rebase "
            "onto until a newer release is out (this check finds it then)"
        )
    on = f" and the series is on {pin} (pin.toml)" if pin else ""
    return (
        f"no vLLM release with a source distribution matches {wanted}: the newest on the "
        f"index is {newest}{on}; try `nox -s rebase -- --check vllm=={newest}`"
    )


def releases(specifier: str) -> list[str]:
    """The releases on pip's index that match ``specifier`` and have an sdist."""
    pkg_root = str(Path(__file__).resolve().parents[2])
    proc = subprocess.run(
        [sys.executable, "-m", "serieskit.series._pipfetch", "--list", base.PACKAGE, specifier],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=pkg_root),
    )
    if proc.returncode != 0:
        raise failed(f"listing vLLM releases matching {specifier!r}", proc)
    return json.loads(proc.stdout)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version))


def check(root: Path, specs: list[str], log=print) -> list[TargetResult]:
    repo = series.work_repo(root)
    names = series.read_series(root)
    series.check_patches(root, names)
    base.ensure_repo(repo)
    clear_left_checks(root, repo, log)
    pin = base.read_pin(root)
    versions = targets(specs, pin.version)
    old = preimages(root, repo, pin, names, log)
    results = []
    for version in versions:
        onto, _ = base.ensure_base(repo, version, None, log=log)
        results.append(TargetResult(version, try_series(root, repo, onto, names, old)))
        report(results[-1], log)
    clean = [r.version for r in results if not r.conflicts]
    # One release named by itself is its own answer; a range or a list asked
    # which release to move to, even where only one matched.
    if len(specs) > 1 or not re.fullmatch(r"vllm==\S+", specs[0]):
        log(
            "rebase --check: newest release the series takes without a conflict: "
            + (clean[-1] if clean else "none of those tried")
        )
    return results


def preimages(root: Path, repo: Path, pin: base.Pin, names: list[str], log=print) -> str:
    """Import the pin's base and write every blob the patch files were made
    from (their ``index`` lines) into ``repo``: ``git am --3way`` merges
    only from those, and a fresh clone, with no series applied yet, has
    none. The series goes into a throwaway index, so nothing of the user's
    (no ref, no work tree) moves. Returns the pin's base commit."""
    old, _ = base.ensure_base(repo, pin.version, pin.sha256, pin.commit, log=log)
    with tempfile.TemporaryDirectory(prefix="check-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git.git(repo, "read-tree", old, env=env)
        for name in names:
            proc = git.run(repo, "apply", "--cached", str(root / series.PATCHES / name), env=env)
            if proc.returncode != 0:  # the patches after it are tried without their blobs
                log(
                    f"rebase --check: {name} does not apply on the pin ({pin.version}): "
                    f"{git.reason(proc)}; `nox -s apply` says more"
                )
                break
    return old


def clear_left_checks(root: Path, repo: Path, log=print) -> None:
    """Remove the throwaway worktrees of a check that was killed before it
    removed its own (``.work/check-STAMP-PID``, that PID gone): they hold
    only patch files applied by the toolkit, nothing of the user's. This
    session holds .work/lock, so no other check is running."""
    for tmp in sorted((root / WORK).glob("check-*-*")):
        pid = tmp.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        git.run(repo, "worktree", "remove", "--force", str(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"rebase --check: removed {tmp}, left by a check that was killed (pid {pid})")
    git.run(repo, "worktree", "prune")


def try_series(
    root: Path, repo: Path, onto: str, names: list[str], old_base: str
) -> list[PatchResult]:
    """Apply the patch files in a throwaway worktree at ``onto`` (``old_base``:
    the pin's base, for upstream's renames)."""
    tmp = root / WORK / f"check-{safety.stamp()}-{os.getpid()}"
    git.git(repo, "worktree", "add", "-q", "--detach", str(tmp), onto)
    try:
        return [_try_patch(tmp, root / series.PATCHES / name, old_base, onto) for name in names]
    finally:
        git.run(repo, "worktree", "remove", "--force", str(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        git.run(repo, "worktree", "prune")


def _try_patch(tree: Path, patch: Path, old_base: str, onto: str) -> PatchResult:
    am = ("am", "--keep-non-patch", "--no-gpg-sign")
    if git.run(tree, "apply", "--check", str(patch)).returncode == 0:
        git.git(tree, *am, str(patch))
        return PatchResult(patch.name, "clean")
    proc = git.run(tree, *am, "--3way", str(patch))
    if proc.returncode == 0:
        return PatchResult(patch.name, "3-way")
    stages = unmerged(tree)
    if not stages:  # not even a 3-way merge could start
        git.run(tree, "am", "--abort")
        named = not_applied(proc)
        return PatchResult(
            patch.name,
            "conflict",
            {f: "could not be merged (patch does not apply)" for f in named}
            or {"(patch does not apply)": git.reason(proc)},
        )
    files = describe_unmerged(tree, stages, old_base, onto)
    for f, has in stages.items():  # the patch's own side, so the next patches see its intent
        if 3 in has:
            git.run(tree, "checkout", "--theirs", "--", f)
            git.git(tree, "add", "--", f)
        else:
            git.git(tree, "rm", "-q", "--", f)
    if git.run(tree, "am", "--continue").returncode != 0:
        git.run(tree, "am", "--abort")
    return PatchResult(patch.name, "conflict", files)


# What ``git apply`` (and ``git am``) say about a file they could not patch.
_NOT_APPLIED = (
    re.compile(r"^error: patch failed: (.+):\d+$"),
    re.compile(r"^error: (.+): (?:does not exist in index|does not match index)$"),
    re.compile(r"^error: invalid object \d+ [0-9a-f]+ for '(.+)'$"),
    re.compile(r"^error: sha1 information is lacking or useless \((.+)\)\.$"),
)


def not_applied(proc) -> list[str]:
    """The files a failed ``git am --3way`` names, in its order."""
    named: list[str] = []
    for line in (proc.stderr or b"").decode(errors="replace").splitlines():
        for pattern in _NOT_APPLIED:
            if (m := pattern.match(line.strip())) and m.group(1) not in named:
                named.append(m.group(1))
    return named


def unmerged(tree: Path) -> dict[str, set[int]]:
    """Each unmerged path of the index and its stages: 1 the common base,
    2 "ours", 3 "theirs". In a rebase and in ``git am`` ours is the new base
    (upstream's side) and theirs the patch."""
    stages: dict[str, set[int]] = {}
    for entry in filter(None, git.git(tree, "ls-files", "-u", "-z").split("\0")):
        info, path = entry.split("\t", 1)
        stages.setdefault(path, set()).add(int(info.split()[2]))
    return stages


def renamed_upstream(repo: Path, old_base: str, onto: str, paths: list[str]) -> dict[str, str]:
    """Where upstream moved ``paths`` between the two bases (git's rename detection)."""
    if not paths:
        return {}
    out = git.git(repo, "diff", "-M", "--name-status", "--diff-filter=R", "-z", old_base, onto)
    fields = out.split("\0")
    moved = {fields[i + 1]: fields[i + 2] for i in range(0, len(fields) - 2, 3)}
    return {p: moved[p] for p in paths if p in moved}


def describe_unmerged(
    tree: Path, stages: dict[str, set[int]], old_base: str, onto: str
) -> dict[str, str]:
    """Each unmerged file in words: what each side did to it."""
    gone = [f for f, has in stages.items() if has == {1, 3}]
    renamed = renamed_upstream(tree, old_base, onto, gone)
    return {f: describe(has, conflict_hunks(tree / f), renamed.get(f)) for f, has in stages.items()}


def describe(stages: set[int], hunks: int, renamed: str | None = None) -> str:
    if stages == {1, 2, 3}:
        return f"{hunks} conflict hunk(s)"
    if stages == {1, 3}:
        upstream = f"renamed upstream to {renamed}" if renamed else "deleted upstream"
        return f"{upstream}, the patch changes it"
    if stages == {1, 2}:
        return "the patch deletes it, upstream changed it"
    if stages == {2, 3}:
        return f"added on both sides, {hunks} conflict hunk(s)"
    if stages == {3}:
        return "only the patch's side has it (upstream moved or deleted it)"
    return "only upstream's side has it (the patch moved or deleted it)"


def conflict_hunks(path: Path) -> int:
    if not path.is_file():
        return 0
    return sum(
        1 for line in path.read_text(errors="replace").splitlines() if line.startswith("<<<<<<< ")
    )


def report(result: TargetResult, log=print) -> None:
    n = len(result.patches)
    verdict = (
        f"{len(result.conflicts)} of {n} patch(es) conflict"
        if result.conflicts
        else f"all {n} patch(es) apply"
    )
    log(f"rebase --check vllm=={result.version}: {verdict}")
    for i, p in enumerate(result.patches, 1):
        log(f"  {i}/{n} {p.how:8} {p.name}")
        for f, what in p.files.items():
            log(f"      {f}: {what}")


def no_sdist(e: base.NoSdist, check: bool) -> ToolkitError:
    """No sdist of the release asked for: the releases the index has (those a
    short version such as 0.34 stands for first) and the command with one."""
    try:
        found = sorted(releases(">=0"), key=_version_key)
    except ToolkitError:
        return e
    close = [v for v in found if v.startswith(f"{e.version}.")]
    pick = close[-1] if close else found[-1] if found else None
    if pick is None:
        return e
    how = f"nox -s rebase -- {'--check ' if check else ''}vllm=={pick}"
    if close:
        return ToolkitError(f"{e}: a release is named in full ({', '.join(close)}): `{how}`")
    newest = ", ".join(reversed(found[-3:]))
    return ToolkitError(f"{e}; the newest there: {newest}: `{how}`")


def next_step(results: list[TargetResult], log=print) -> None:
    """The closing line of a check: the rebase that acts on what it found
    (the newest release tried, or the newest without a conflict beside it)."""
    if not results:
        return
    newest = results[-1]
    clean = [r.version for r in results if not r.conflicts]
    how = f"`nox -s rebase -- vllm=={newest.version}`"
    if not newest.conflicts:
        log(f"next: {how} (every patch applies: it will not stop)")
        return
    stops = [p.name for p in newest.conflicts]
    shown = ", ".join(stops[:5]) + (f" and {len(stops) - 5} more" if len(stops) > 5 else "")
    also = f"; or `nox -s rebase -- vllm=={clean[-1]}`, which will not stop" if clean else ""
    log(f"next: {how} (stops at {len(stops)} patch(es): {shown}){also}")
