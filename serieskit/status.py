"""``nox -s status``: how the work tree relates to the pin and patches/.

It also names the commands that are valid from here (never one that would
refuse).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from serieskit import git
from serieskit.checks import docs, upstream_tests
from serieskit.errors import ToolkitError
from serieskit.series import apply, base, safety, series, target
from serieskit.series.target import Target
from serieskit.state import State
from serieskit.upstream import carry_record, rebase, stops


def status(where: Path | Target, log=print) -> dict:
    """Print and return how the work tree relates to its base and patch folder,
    and what of the patch folder this repository has not committed."""
    t = target.of(where)
    info = _status(t, log)
    _unpublished(t, info, log)
    return info


def _status(t: Target, log) -> dict:
    pin = base.Pin(t.version, t.sha256, t.commit)
    repo = t.work
    names = series.read_series(t)
    info: dict = {"pin": pin.version, "patches": names, "work_tree": str(repo)}
    owner = (
        f"port:      vLLM {pin.version} ({t.patches_label})"
        if t.port
        else f"pin:       vLLM {pin.version}"
    )
    log(f"{owner} (sdist sha256 {pin.sha256[:16]}..., base commit {(pin.commit or '?')[:12]})")
    if not t.port:
        _port_lines(t, info, log)
    if not repo.exists():
        log(f"work tree: none ({repo} not made yet: `{t.cmd('apply')}`)")
        info["work_tree"] = None
        return info
    if not git.is_repo(repo):
        log(
            f"work tree: {repo} is not a git repository (no .git): `{t.cmd('apply')}` refuses "
            f"until it is moved aside; `{t.cmd('apply', '--force')}` moves it under "
            f"{safety.BACKUP_DIR}/"
        )
        return info
    if not State.exists(t):
        log(
            f"work tree: {repo}, with no record of what the toolkit wrote there "
            f"({State.path(t).relative_to(t.root)} is missing): `{t.cmd('apply')}` treats "
            "every commit beyond the base as yours and refuses (or keeps them, with --force)"
        )
        _uncommitted(repo, info, log)
        return info
    state = State.load(t)
    head = git.rev(repo, "HEAD")
    info.update(base=state.base, head=head)
    on_pin = state.base == pin.commit
    branch = git.branch(repo)
    if state.rebase_stopped and state.rebase:
        what = (
            "a carry of the pin's changes"
            if state.rebase.kind == "carry"
            else f"a rebase from vLLM {state.rebase.old_label} onto {state.rebase.target}"
        )
        log(f"work tree: {repo}, in {what} ({state.rebase.onto[:12]}), HEAD {(head or '?')[:12]}")
        if state.rebase_interrupted:
            log(f"  {series.stopped_message(t, state)}")
        else:
            for line in stops.conflict_lines(t):
                log(line)
        _uncommitted(repo, info, log)
        return info
    on = (
        ("the port's base" if t.port else "the pin's base")
        if on_pin
        else f"vLLM {state.base_label}"
    )
    log(
        f"work tree: {repo} on {on} ({(state.base or '?')[:12]}), HEAD {(head or '?')[:12]}"
        + (
            ""
            if branch == series.BRANCH
            else " (detached)"
            if branch is None
            else f" (branch {branch})"
        )
    )
    by_hand = [f"{t.patches_label}/{name}" for name, sha in state.sources if not sha]
    if state.in_progress == "continue":
        log(
            f"  an apply --continue was interrupted at {state.applied}/{state.total}: "
            f"`{t.cmd('apply', '--continue')}` goes on"
        )
    elif state.in_progress:
        log(
            f"  an apply was interrupted at {state.applied}/{state.total}: `{t.cmd('apply')}` "
            "redoes it (any work of yours stops it first)"
        )
    elif state.failed:
        ways = (
            f"a git am is in progress there: resolve, `git add`, `git -C {repo} am --continue`, "
            f"then `{t.cmd('apply', '--continue')}`"
            if git.operation_in_progress(repo) == "am"
            else apply.stopped_ways(t, state)
        )
        log(
            f"  the last apply stopped at {t.patches_label}/{state.failed}: the work tree holds "
            f"{state.applied}/{state.total} patches; {ways}"
        )
    elif state.rebase and not on_pin:
        _rebased_lines(state, pin, log)
    if state.exporting:
        log(
            f"  an export was interrupted as it wrote {t.patches_label}/: `{t.cmd('export')}` "
            "writes it again"
        )
    if by_hand and state.complete:
        log(
            f"  finished by hand after a stopped apply: {', '.join(by_hand)}; "
            f"`{t.cmd('export')}` writes them to {t.patches_label}/ (`{t.cmd('apply')}` "
            "refuses over them until then)"
        )
    _commits(
        t,
        state,
        names,
        info,
        log,
        advise=state.complete and on_pin and branch == series.BRANCH and not by_hand,
    )
    _uncommitted(repo, info, log)
    if state.moved and state.base == state.moved.get("onto"):
        chores(t, log=log)
    return info


def chores(where: Path | Target, log=print) -> int:
    """After a finished rebase (and --update-pin): what the move still asks,
    each chore with its one command, checked where that is cheap; the last
    line says whether the move is complete. Returns the chores left."""
    t = target.of(where)
    repo, state = t.work, State.load(t)
    moved = state.moved
    if not moved or not state.base:
        return 0
    rb, left = state.rebase, 0
    log(f"rebase: the move from vLLM {moved['label']} to {state.base_label}, its chores:")

    def chore(done: bool, what: str, how: str = "") -> None:
        nonlocal left
        left += not done
        log(f"  [{'x' if done else ' '}] {what}" + (f": `{how}`" if how and not done else ""))

    if rb is not None and rb.is_release:  # rebased, not yet pinned
        chore(
            False,
            f"the pin (pin.toml, patches/ still on vLLM {t.version})",
            t.cmd("rebase", "--update-pin"),
        )
    elif rb is None:
        chore(state.base == t.commit, f"the pin: vLLM {t.version}")
    head = git.rev(repo, "HEAD")
    chore(
        state.passed_at("test", head),
        "the series' tests" + _pass(state, "test", head),
        t.cmd("test"),
    )
    try:
        stale = docs.check(repo) is not None
        chore(
            not stale, f"the runtime reference ({'stale' if stale else 'current'})", t.cmd("docs")
        )
    except ToolkitError as e:
        chore(False, f"the runtime reference (not checked: {e})", t.cmd("docs"))
    path = t.patches / upstream_tests.BASELINE
    try:
        on = upstream_tests.Baseline.read(path, str(path)).commit if path.exists() else None
    except ToolkitError:
        on = None
    chore(
        on == state.base,
        "the upstream-test baseline ("
        + (
            "recorded on this base"
            if on == state.base
            else "missing"
            if on is None
            else f"recorded on {on[:12]}, not this base"
        )
        + ")",
        t.cmd("test", "--record-upstream-baseline"),
    )
    chore(state.passed_at("lint", head), "lint" + _pass(state, "lint", head), t.cmd("lint"))
    found = rebase.stale_mentions(t.root, repo, moved["label"], moved["base"], state.base)
    chore(
        not found,
        f"text naming vLLM {moved['label']} or a file {state.base_label} removed: "
        + (f"{len(found)} line(s) to review (history among them)" if found else "none"),
    )
    for line in found[: rebase.MENTIONS_MAX]:
        log(f"      {line}")
    if len(found) > rebase.MENTIONS_MAX:
        log(f"      ... and {len(found) - rebase.MENTIONS_MAX} more")
    log(
        "rebase: the move is complete"
        if not left
        else f"rebase: the move is not complete: {left} chore(s) above"
    )
    return left


def _pass(state: State, what: str, head: str | None) -> str:
    """What the work tree's state records of a whole passing ``what`` run."""
    if state.passed_at(what, head):
        return " (passed at HEAD)"
    at = state.passed.get(what, {}).get("head")
    return f" (passed at {at[:12]}, not HEAD)" if at else " (no pass recorded at HEAD)"


def record_pass(where: Path | Target, what: str, head: str, clean: bool = True, log=print) -> None:
    """A whole ``what`` run (``test``: every series test file; ``lint``)
    passed on the work tree's ``head``: recorded in its state with the base,
    for the move's chores (done while HEAD is that commit). Not when it ran
    over uncommitted changes, which are not ``head``'s."""
    t = target.of(where)
    state = State.load(t)
    if not clean:
        if state.moved:
            log(
                f"{what}: passed over uncommitted changes in {t.work}: not recorded for the "
                f"move's chores (commit them, then `{t.cmd(what)}` again)"
            )
        return
    state.passed[what] = {"head": head, "base": state.base or ""}
    state.save(t)


def _port_lines(pin: Target, info: dict, log) -> None:
    """One line per port: whether it has every change of the pin's patches."""
    info["ports"] = {}
    for port in base.read_ports(pin.root):
        try:
            t = target.port(pin.root, port.version)
            p = carry_record.plan(
                carry_record.pin_patches(pin),
                carry_record.read_carried(t),
                carry_record.port_names(t),
            )
            lags = [x.name for x in p.changed + p.new] + p.dropped + p.unrecorded
        except ToolkitError as e:
            lags = [f"({e})"]
        info["ports"][port.version] = lags
        log(
            f"port:      vLLM {port.version} ({port.patches}): "
            + (
                f"lacks the pin's changes to {', '.join(lags)}: `nox -s carry -- {port.version}`"
                if lags
                else "has every change of the pin's patches"
            )
        )


def _rebased_lines(state: State, pin: base.Pin, log) -> None:
    rb = state.rebase
    assert rb
    if rb.is_release:
        log(
            f"  the series is rebased onto vLLM {rb.target}; the pin and patches/ are still "
            f"on {pin.version}: `nox -s rebase -- --update-pin` moves them there, "
            "`nox -s apply -- --force` goes back to the pin (keeping these commits under "
            f"{safety.BACKUP_REF}/)"
        )
    else:
        log(
            f"  the series is rebased onto {rb.target}, a fork's ref; the pin stays on "
            f"{pin.version}: build, lint and test work here; `nox -s apply -- --force` goes "
            f"back to the pin (keeping these commits under {safety.BACKUP_REF}/)"
        )


def _commits(t: Target, state: State, names: list[str], info: dict, log, advise: bool) -> None:
    repo, label = t.work, t.patches_label
    head = git.rev(repo, "HEAD")
    commits = git.commits(repo, f"{state.base}..HEAD") if head and state.base else []
    differ: list[str] = []
    moved: list[str] = []
    changed = added = 0
    with tempfile.TemporaryDirectory() as tmp:
        try:
            exported = (
                series.format_patches(repo, state.base, Path(tmp)) if commits and state.base else []
            )
        except ToolkitError:
            exported = []
        log(f"applied:   {len(commits)} commit(s)")
        for i, (cid, subject) in enumerate(commits):
            name = exported[i] if i < len(exported) else None
            mine = (Path(tmp) / name).read_bytes() if name else None
            theirs = (t.patches / name).read_bytes() if name in names else None
            if theirs is not None and mine == theirs:
                mark = "="
            else:
                differ.append(name or cid)
                if theirs is not None and mine and _same_change(repo, mine, theirs):
                    # After a rebase: only line numbers and index lines moved
                    # (what the rebase report counts as unchanged).
                    mark = "~"
                    moved.append(name or cid)
                elif theirs is not None:
                    mark, changed = "M", changed + 1
                else:
                    mark, added = "+", added + 1
            log(f"  {mark} {cid[:12]} {subject}")
    missing = [n for n in names if n not in exported]
    for n in missing:
        log(f"  - {label}/{n} is not in the work tree")
    info["differ"] = differ + missing
    info["moved"] = moved
    if not (differ or missing):
        log(f"patches:   the work tree matches {label}/")
        return
    same = len(commits) - changed - added
    counts = f"{same} unchanged" + (
        f" ({len(moved)} of them moved: the same change at new line numbers)" if moved else ""
    )
    counts += "".join(
        f", {n} {what}"
        for n, what in (
            (changed, "changed"),
            (added, f"not in {label}/"),
            (len(missing), "not applied"),
        )
        if n
    )
    legend = f"= same, ~ moved, M changed, + not in {label}/, - not applied"
    ways = (
        f": `{t.cmd('export')}` writes the work tree, `{t.cmd('apply')}` the patches"
        if advise
        else ""
    )
    log(f"patches:   {counts} ({legend}){ways}")


def _same_change(repo: Path, a: bytes, b: bytes) -> bool:
    """The two patches make the same change (``git patch-id --stable``: line
    numbers, index lines and whitespace aside), whatever their message."""
    return git.patch_id(repo, a) == git.patch_id(repo, b) != ""


def _uncommitted(repo: Path, info: dict, log) -> None:
    dirty = git.dirty_files(repo)
    info["uncommitted"] = dirty
    if dirty:
        log(f"uncommitted: {len(dirty)} file(s) in the work tree")
        for line in dirty[:20]:
            log(f"  {line}")
    else:
        log("uncommitted: none in the work tree")


# The toolkit's own files that an export, a rebase --update-pin or a carry
# write: others apply what this repository has committed of them.
PUBLISHED = ("pin.toml",)
SHOWN = 10


def _unpublished(t: Target, info: dict, log) -> None:
    """The patch folder's and pin.toml's changes not committed in this
    repository (not the work tree), with the command that commits them."""
    paths = [t.patches_label, *PUBLISHED]
    proc = git.run(t.root, "status", "--porcelain=v1", "--untracked-files=all", "--", *paths)
    if proc.returncode != 0:  # not a git checkout (a copy, an unpacked archive): nothing to commit
        return
    lines = [line for line in proc.stdout.decode(errors="replace").splitlines() if line.strip()]
    info["unpublished"] = lines
    if not lines:
        return
    changed = [line[3:].split(" -> ")[-1] for line in lines]
    add = [p for p in (f"{t.patches_label}/", *PUBLISHED) if any(c.startswith(p) for c in changed)]
    log(
        f"to commit: {len(lines)} change(s) to {' and '.join(add)} not committed in this "
        f"repository ({t.root}): others apply what it has committed; "
        f"`git add {' '.join(add)} && git commit`"
    )
    for line in lines[:SHOWN]:
        log(f"  {line}")
    if len(lines) > SHOWN:
        log(f"  ... and {len(lines) - SHOWN} more (`git status -- {' '.join(paths)}`)")
