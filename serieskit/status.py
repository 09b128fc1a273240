"""``nox -s status``: how the work tree relates to the pin and patches/, and
the commands that are valid from here (never one that would refuse)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from serieskit import base, git, rebase, safety, series
from serieskit.errors import ToolkitError
from serieskit.state import State


def status(root: Path, log=print) -> dict:
    """Print and return how the work tree relates to the pin and patches/."""
    pin = base.read_pin(root)
    repo = series.work_repo(root)
    names = series.read_series(root)
    info: dict = {"pin": pin.version, "patches": names, "work_tree": str(repo)}
    log(f"pin:       vLLM {pin.version} (sdist sha256 {pin.sha256[:16]}..., "
        f"base commit {(pin.commit or '?')[:12]})")
    if not repo.exists():
        log(f"work tree: none ({repo} not made yet: `nox -s apply`)")
        info["work_tree"] = None
        return info
    if not git.is_repo(repo):
        log(f"work tree: {repo} is not a git repository (no .git): `nox -s apply` refuses "
            f"until it is moved aside; `nox -s apply -- --force` moves it under "
            f"{safety.BACKUP_DIR}/")
        return info
    if not State.exists(root):
        log(f"work tree: {repo}, with no record of what the toolkit wrote there "
            "(.work/state.json is missing): `nox -s apply` treats every commit beyond "
            "the base as yours and refuses (or keeps them, with --force)")
        _uncommitted(repo, info, log)
        return info
    state = State.load(root)
    head = git.rev(repo, "HEAD")
    info.update(base=state.base, head=head)
    on_pin = state.base == pin.commit
    branch = git.branch(repo)
    if state.rebase_stopped and state.rebase:
        log(f"work tree: {repo}, in a rebase from vLLM {state.rebase.old_label} onto "
            f"{state.rebase.target} ({state.rebase.onto[:12]}), HEAD {(head or '?')[:12]}")
        for line in rebase.conflict_lines(root):
            log(line)
        _uncommitted(repo, info, log)
        return info
    on = "the pin's base" if on_pin else f"vLLM {state.base_label}"
    log(f"work tree: {repo} on {on} ({(state.base or '?')[:12]}), HEAD {(head or '?')[:12]}"
        + ("" if branch == series.BRANCH else
           " (detached)" if branch is None else f" (branch {branch})"))
    if state.in_progress:
        log(f"  an apply was interrupted at {state.applied}/{state.total}: `nox -s apply` "
            "redoes it (any work of yours stops it first)")
    elif state.failed:
        log(f"  the last apply stopped at patches/{state.failed}: the work tree holds "
            f"{state.applied}/{state.total} patches; fix that patch, then `nox -s apply`")
    elif state.rebase and not on_pin:
        _rebased_lines(state, pin, log)
    _commits(root, repo, state, names, info, log,
             advise=state.complete and on_pin and branch == series.BRANCH)
    _uncommitted(repo, info, log)
    return info


def _rebased_lines(state: State, pin: base.Pin, log) -> None:
    rb = state.rebase
    assert rb
    if rb.is_release:
        log(f"  the series is rebased onto vLLM {rb.target}; the pin and patches/ are still "
            f"on {pin.version}: `nox -s rebase -- --update-pin` moves them there, "
            "`nox -s apply -- --force` goes back to the pin (keeping these commits under "
            f"{safety.BACKUP_REF}/)")
    else:
        log(f"  the series is rebased onto {rb.target}, a fork's ref; the pin stays on "
            f"{pin.version}: build, lint and test work here; `nox -s apply -- --force` goes "
            f"back to the pin (keeping these commits under {safety.BACKUP_REF}/)")


def _commits(root: Path, repo: Path, state: State, names: list[str], info: dict, log,
             advise: bool) -> None:
    head = git.rev(repo, "HEAD")
    commits = git.commits(repo, f"{state.base}..HEAD") if head and state.base else []
    differ: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            exported = (series.format_patches(repo, state.base, Path(tmp))
                        if commits and state.base else [])
        except ToolkitError:
            exported = []
        log(f"applied:   {len(commits)} commit(s)")
        for i, (cid, subject) in enumerate(commits):
            name = exported[i] if i < len(exported) else None
            mine = (Path(tmp) / name).read_bytes() if name else None
            if name in names and mine == (root / series.PATCHES / name).read_bytes():
                mark = "="
            else:
                mark = "M" if name in names else "+"
                differ.append(name or cid)
            log(f"  {mark} {cid[:12]} {subject}")
    missing = [n for n in names if n not in exported]
    for n in missing:
        log(f"  - patches/{n} is not in the work tree")
    info["differ"] = differ + missing
    if not (differ or missing):
        log("patches:   the work tree matches patches/")
    elif advise:
        log("patches:   differ from the work tree (= same, M changed, + not in patches/, "
            "- not applied): `nox -s export` writes the work tree, `nox -s apply` the patches")
    else:
        log("patches:   differ from the work tree (= same, M changed, + not in patches/, "
            "- not applied)")


def _uncommitted(repo: Path, info: dict, log) -> None:
    dirty = git.dirty_files(repo)
    info["uncommitted"] = dirty
    if dirty:
        log(f"uncommitted: {len(dirty)} file(s)")
        for line in dirty[:20]:
            log(f"  {line}")
    else:
        log("uncommitted: none")
