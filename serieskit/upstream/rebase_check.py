"""``nox -s rebase -- --check TARGET...``: would the series apply there?

A dry run that changes nothing of the user's: the patch files are applied
in order in a throwaway worktree (``.work/check-*``, removed afterwards, or
by the next check where a killed one left it) on
each target release, and each is reported as it went:

- ``clean``: its context matches exactly (``git apply --check``);
- ``3-way``: ``git am --3way`` merges it without a conflict;
- ``conflict``: the files and the conflict hunks in each.

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
    files: dict[str, int] = field(default_factory=dict)  # conflicted file -> conflict hunks


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
    results = []
    for version in targets(specs, base.read_pin(root).version):
        onto, _ = base.ensure_base(repo, version, None, log=log)
        results.append(TargetResult(version, try_series(root, repo, onto, names)))
        report(results[-1], log)
    clean = [r.version for r in results if not r.conflicts]
    if len(results) > 1:
        log(
            "rebase --check: newest release the series takes without a conflict: "
            + (clean[-1] if clean else "none of those tried")
        )
    return results


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


def try_series(root: Path, repo: Path, onto: str, names: list[str]) -> list[PatchResult]:
    """Apply the patch files in a throwaway worktree at ``onto``."""
    tmp = root / WORK / f"check-{safety.stamp()}-{os.getpid()}"
    git.git(repo, "worktree", "add", "-q", "--detach", str(tmp), onto)
    try:
        return [_try_patch(tmp, root / series.PATCHES / name) for name in names]
    finally:
        git.run(repo, "worktree", "remove", "--force", str(tmp))
        shutil.rmtree(tmp, ignore_errors=True)
        git.run(repo, "worktree", "prune")


def _try_patch(tree: Path, patch: Path) -> PatchResult:
    am = ("am", "--keep-non-patch", "--no-gpg-sign")
    if git.run(tree, "apply", "--check", str(patch)).returncode == 0:
        git.git(tree, *am, str(patch))
        return PatchResult(patch.name, "clean")
    if git.run(tree, *am, "--3way", str(patch)).returncode == 0:
        return PatchResult(patch.name, "3-way")
    files = git.git(tree, "diff", "--name-only", "--diff-filter=U").split()
    hunks = {f: conflict_hunks(tree / f) for f in files}
    if not files:  # not even a 3-way merge could start (a file it changes is gone)
        git.run(tree, "am", "--abort")
        return PatchResult(patch.name, "conflict", {"(patch does not apply)": 1})
    for f in files:  # the patch's own side, so the next patches see its intent
        git.run(tree, "checkout", "--theirs", "--", f)
        git.git(tree, "add", "--", f)
    if git.run(tree, "am", "--continue").returncode != 0:
        git.run(tree, "am", "--abort")
    return PatchResult(patch.name, "conflict", hunks)


def conflict_hunks(path: Path) -> int:
    if not path.is_file():
        return 1  # deleted on one side, changed on the other
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
        for f, hunks in p.files.items():
            log(f"      {f}: {hunks} conflict hunk(s)")


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
