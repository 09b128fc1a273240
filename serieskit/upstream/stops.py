"""A rebase or a carry at its stops: to the end or a conflict, --continue, --abort.

git is driven until it finishes or stops at a conflict (with the help at
that stop). The toolkit's rebase (:mod:`.rebase`) and a carry (:mod:`.carry`) are both a
``git rebase`` in the work tree with git rerere on; the state records it
(:class:`~serieskit.state.RebaseState`), marked as running while git runs,
so that one killed inside a step is told from one stopped at a conflict.
``--abort`` drops nothing: what the work tree holds is stashed, the commits
already moved are kept under a backup ref.

A resolution is made once: rerere records the text hunks, and
``--continue`` the whole stop; the same stop replays them
(:mod:`.resolutions`).
"""

from __future__ import annotations

from pathlib import Path

from serieskit import git
from serieskit.errors import ToolkitError
from serieskit.series import base, safety, series, target
from serieskit.series.target import Target
from serieskit.state import RebaseState, State
from serieskit.upstream import rebase_check
from serieskit.upstream.resolutions import (
    RESOLUTIONS,
    load_resolutions,
    record_stop,
    replay_stop,
    save_resolutions,
    snapshot,
)

__all__ = ["RESOLUTIONS", "load_resolutions", "save_resolutions"]  # for rebase and carry

# rerere on for the rebase's own git calls only (git.STABLE_CONFIG turns it off);
# autoUpdate stages what a recorded resolution resolved.
RERERE = ("-c", "rerere.enabled=true", "-c", "rerere.autoUpdate=true")


def run_git(at: Path | Target, *args: str, env: dict[str, str] | None = None):
    """``git rebase ARGS`` (with rerere) in the work tree, the state marked
    as running while it runs: a rebase found stopped with the mark set was
    killed inside a step, not stopped at a conflict."""
    t = target.of(at)
    _mark_running(t, True)
    proc = git.run(t.work, *RERERE, "rebase", *args, env=env)
    _mark_running(t, False)
    return proc


def _mark_running(t: Target, running: bool) -> None:
    state = State.load(t)
    if state.rebase and state.rebase.running != running:
        state.rebase.running = running
        state.save(t)


def cont(where: Path | Target, finish, log=print):
    """Go on after a conflict was resolved; ``finish()`` ends the rebase (its
    report) or the carry (the port's export)."""
    t = target.of(where)
    repo = t.work
    state = State.load(t)
    if not state.rebase_stopped or state.rebase is None:
        raise ToolkitError(
            f"no {_kind(state) if state.rebase else 'rebase'} is stopped: nothing to continue"
        )
    rb, kind = state.rebase, state.rebase.kind
    session = _session(t, rb)
    op = git.operation_in_progress(repo)
    if op is None and _finished(repo, rb):
        return finish()  # git's rebase ended (the toolkit was stopped before it noted so)
    if rb.running:
        raise ToolkitError(
            f"the {kind} was interrupted (killed) inside a step; no conflict waits for you: "
            f"`{session} --abort` goes back to where it started (what the work tree holds is "
            f"stashed, the patches already moved kept under {safety.BACKUP_REF}/); then start "
            "it again"
        )
    if op != "rebase":
        raise ToolkitError(
            f"the git rebase of this {kind} is no longer in progress in {repo}, and HEAD is not "
            f"the series moved onto {rb.target}: `{session} --abort` goes back to where it "
            "started"
        )
    safety.check_left_by(
        repo,
        f"{kind} --continue",
        made=None,  # the resolution staged at the stop is what --continue commits
        op="rebase",
        ours=_ours(repo, rb),
        busy=lambda op: (
            f"the git {op} in progress in {repo} is not the {kind} that stopped there (that "
            f"one moves {rb.old_head[:12]} onto {rb.onto[:12]}): finish it, or "
            f"`git -C {repo} {op} --abort`; then `{session} --abort` goes back to where the "
            f"{kind} started"
        ),
    )
    safety.clear_stale_locks(repo, f"{kind} --continue", log)  # else git's failure reads as a stop
    unresolved = git.git(repo, "diff", "--name-only", "--diff-filter=U").split()
    if unresolved:
        raise ToolkitError(
            f"unresolved conflicts remain in {', '.join(unresolved)}: "
            f"edit them, `git -C {repo} add` them, then continue"
        )
    unstaged = git.git(repo, "diff", "--name-only").split()
    if unstaged:
        raise ToolkitError(
            f"{kind} --continue: {', '.join(unstaged[:5])}{', ...' if len(unstaged) > 5 else ''} "
            f"changed in the work tree and not added: `git -C {repo} add` what belongs to the "
            f"resolution; stash the rest (`git -C {repo} stash push --keep-index`), then "
            f"`{session} --continue`"
        )
    stopped = progress(repo)
    record_stop(t, repo)
    proc = run_git(t, "--continue")
    return run_to_stop(t, proc, finish, log, resolving=stopped)


def _session(t: Target, rb: RebaseState) -> str:
    return f"nox -s carry -- {t.version}" if rb.kind == "carry" else "nox -s rebase --"


def _ours(repo: Path, rb: RebaseState) -> bool:
    """The git rebase in progress is the one the toolkit started: from the
    commit it recorded, onto the one it recorded."""
    merge = git.gitdir(repo) / "rebase-merge"
    return all(
        (merge / name).is_file() and (merge / name).read_text().strip() == want
        for name, want in (("orig-head", rb.old_head), ("onto", rb.onto))
    )


def _finished(repo: Path, rb: RebaseState) -> bool:
    """The work tree's branch holds the series moved onto ``rb.onto``: git's
    rebase has ended."""
    head = git.rev(repo, "HEAD")
    return (
        head is not None
        and git.branch(repo) == series.BRANCH
        and head != rb.old_head
        and git.run(repo, "merge-base", "--is-ancestor", rb.onto, head).returncode == 0
    )


def abort(where: Path | Target, log=print) -> None:
    """Back to where the rebase (or carry) started, the patch folder as it was
    (its resolutions/ included). Nothing is dropped: what the work tree holds
    (a resolution staged or half made, any other change, what a killed step
    left) is stashed, the commits already moved are kept under a backup ref,
    and the conflicts resolved so far stay in the work tree's rerere cache,
    where the next rebase or carry finds them."""
    t = target.of(where)
    repo = t.work
    state = State.load(t)
    if not state.rebase_stopped or state.rebase is None:
        raise ToolkitError(_nothing_to_abort(t, state))
    rb = state.rebase
    kind = rb.kind
    safety.clear_stale_locks(repo, f"{kind} --abort", log)
    head = git.rev(repo, "HEAD")
    if (
        head
        and head != rb.onto
        and head != rb.old_head
        and git.git(repo, "rev-list", "--count", f"{rb.onto}..{head}").strip() != "0"
    ):
        ref = safety.backup_ref(repo, head, f"{kind}-progress")
        log(f"{kind}: the patches already moved onto {rb.target} are kept as {ref}")
    if dirty := git.dirty_files(repo):
        stash = safety.stash(repo, f"{kind} --abort: the work tree at the stop")
        log(
            f"{kind}: stashed {len(dirty)} uncommitted file(s) (a resolution staged or made at "
            f"the stop, and any other change) as {stash}: `git -C {repo} stash show -p "
            "--include-untracked` shows them"
        )
    if git.operation_in_progress(repo) == "rebase":
        proc = git.run(repo, "rebase", "--abort")
        if proc.returncode != 0:  # a rebase killed as it set up: its state is not whole
            log(f"{kind}: git rebase --abort failed ({git.reason(proc)}); leaving it with --quit")
            _git(repo, f"{kind} --abort", "rebase", "--quit")
    if resolved := len(rb.resolved):
        log(
            f"{kind}: the {resolved} conflict step(s) resolved so far stay in "
            f"{git.gitdir(repo) / 'rr-cache'}: the next {kind} in this work tree reuses them "
            f"({t.patches_label}/{RESOLUTIONS}/ gets them when one finishes)"
        )
    if git.rev(repo, "HEAD") != rb.old_head or git.branch(repo) != series.BRANCH:
        _git(repo, f"{kind} --abort", "checkout", "-q", "-B", series.BRANCH, rb.old_head)
    state.rebase = None
    state.save(t)
    base.mark_current(repo, rb.old_base)
    log(f"{kind}: aborted; the work tree is back at {rb.old_head[:12]} on vLLM {state.base_label}")


def _nothing_to_abort(t: Target, state: State) -> str:
    """--abort with no stopped rebase: the way back from where the tree is."""
    repo, kind = t.work, _kind(state)
    kept = ""
    if git.is_repo(repo) and git.git(repo, "for-each-ref", "--count=1", safety.BACKUP_REF):
        kept = (
            f"; earlier work the toolkit kept is under {safety.BACKUP_REF}/ "
            f"(`git -C {repo} for-each-ref {safety.BACKUP_REF}/`)"
        )
    rb = state.rebase
    if rb is not None and rb.done:
        return (
            f"no {kind} is stopped: nothing to abort (the {kind} onto {rb.target} finished); "
            f"`{t.cmd('apply', '--force')}` goes back to the series of {t.patches_label}/ on "
            f"vLLM {t.version}, keeping the rebased commits under {safety.BACKUP_REF}/" + kept
        )
    return (
        f"no {kind} is stopped: nothing to abort (`{t.cmd('status')}` shows the work tree)" + kept
    )


def _git(repo: Path, what: str, *args: str) -> None:
    """git ``args``; its failure with all of git's reason (not its last line)."""
    proc = git.run(repo, *args)
    if proc.returncode != 0:
        raise ToolkitError(
            f"{what}: git {' '.join(args[:2])} failed: {git.reason(proc)}; nothing was "
            f"dropped: fix that, then run this again"
        )


def run_to_stop(at: Path | Target, proc, finish, log, resolving=None):
    """Drive a ``git rebase`` (the toolkit's rebase, or a carry) until it
    finishes (then ``finish()``) or stops at a conflict that no recorded
    resolution resolves (then the help and an error). ``resolving``: where
    it was stopped when the user resolved and continued; noted as resolved
    by hand once git has gone past it."""
    t = target.of(at)
    repo = t.work
    last = None
    while True:
        if proc.returncode == 0 and git.operation_in_progress(repo) is None:
            _note_resolved(t, resolving)
            return finish()
        if git.operation_in_progress(repo) != "rebase":
            raise ToolkitError(f"git rebase failed: {git.reason(proc)}")
        where = progress(repo)
        if where != resolving:
            _note_resolved(t, resolving)
            resolving = None
        unresolved = git.git(repo, "diff", "--name-only", "--diff-filter=U").split()
        output = (proc.stdout or b"") + (proc.stderr or b"")
        if not unresolved and b"using previous resolution" not in output:
            raise ToolkitError(_refused(t, where, proc))
        if where == last:
            break
        record = replay_stop(t, repo)
        if unresolved and record is None:
            break
        last = where
        state = State.load(t)
        if where and state.rebase:
            state.rebase.resolved.append(f"{where[2]} (recorded resolution)")
            state.save(t)
        log(
            f"{_kind(state)}: step {where[0] if where else '?'} resolved by a recorded "
            f"resolution ({t.patches_label}/{RESOLUTIONS}/{record or ''}); going on"
        )
        proc = run_git(t, "--continue")
    snapshot(repo, output)
    for line in conflict_lines(t):
        log(line)
    raise ToolkitError(f"{_kind(State.load(t))} stopped at a conflict; nothing is lost (see above)")


def _refused(t: Target, where: tuple[int, int, str] | None, proc) -> str:
    """git stopped the rebase, but not at a conflict (it refused: files in
    the way, ...): its own reason, and the ways on."""
    state = State.load(t)
    step = f" at step {where[0]}/{where[1]} ({where[2]})" if where else ""
    if state.rebase is None:
        return f"git rebase stopped{step}: {git.reason(proc)}"
    session = _session(t, state.rebase)
    return (
        f"{state.rebase.kind}: git rebase stopped{step}, not at a conflict: {git.reason(proc)}\n"
        f"  fix that, then `{session} --continue`; or `{session} --abort` (back to where it "
        "started)"
    )


def _note_resolved(t: Target, stop: tuple[int, int, str] | None) -> None:
    """The stop ``stop`` went through with the user's resolution: for the report."""
    state = State.load(t)
    if stop and state.rebase:
        state.rebase.resolved.append(stop[2])
        state.save(t)


def _kind(state: State) -> str:
    return state.rebase.kind if state.rebase else "rebase"


def progress(repo: Path) -> tuple[int, int, str] | None:
    """(patch number, of how many, its subject) where a rebase is stopped."""
    merge = git.gitdir(repo) / "rebase-merge"
    if not merge.exists():
        return None
    stopped_file = merge / "stopped-sha"
    stopped = stopped_file.read_text().strip() if stopped_file.exists() else None
    done = _count_lines(merge / "done")
    total = done + _count_lines(merge / "git-rebase-todo")
    subject = git.commit_subject(repo, stopped) if stopped else "?"
    return done, total, subject


def conflict_lines(at: Path | Target) -> list[str]:
    """Where a stopped rebase (or carry) is, what upstream changed there, and
    the commands that go on from there."""
    t = target.of(at)
    repo = t.work
    state = State.load(t)
    rb = state.rebase
    assert rb
    carry = rb.kind == "carry"
    session = f"carry -- {t.version}" if carry else "rebase --"
    where = progress(repo)
    done, total, subject = where or (0, 0, "?")
    patch = _patch_file(t, subject)
    stages = rebase_check.unmerged(repo)
    files = sorted(stages)
    what = rebase_check.describe_unmerged(repo, stages, rb.old_base, rb.onto)
    listed = [f"{f} ({what[f]})" for f in files] or ["(none unresolved; see git status)"]
    lines = [
        (
            f"carry: the pin's changes onto the port to {t.version}, "
            f"stopped at step {done}/{total}:"
            if carry
            else f"rebase: onto {rb.target}, stopped at patch {done}/{total}:"
        ),
        f"  patch:  {subject}" + (f" ({t.patches_label}/{patch})" if patch else ""),
        "  files:  " + listed[0],
        *(f"          {f}" for f in listed[1:]),
    ]
    # Text conflicts have all three stages; only those can be checked out again
    # with other markers.
    text = [f for f in files if stages[f] == {1, 2, 3}]
    if files:
        stat = git.git(repo, "diff", "--stat=100", rb.old_base, rb.onto, "--", *files)
        lines.append(f"  upstream changed them from {rb.old_label} to {rb.target}:")
        lines += [f"    {line.strip()}" for line in stat.splitlines()]
        lines.append(
            f"    whole diff: `git -C {repo} diff {rb.old_base[:12]} {rb.onto[:12]} "
            f"-- {' '.join(files)}`"
        )
        lines += added_beside(repo, rb.old_base, rb.onto, files + patch_added_files(repo))
    if text:
        lines.append(
            f"  three-way markers (base in the middle): `git -C {repo} checkout "
            f"--conflict=zdiff3 -- {' '.join(text)}`"
        )
    for f in files:
        if f not in text:
            lines += _ways(repo, f, stages[f], what[f])
    if carry:
        lines.append(
            f"  the pin's change being carried: `git -C {repo} show "
            "REBASE_HEAD` (its interdiff since it was last carried)"
        )
    edit = (
        f"edit {', '.join(text)}, `git -C {repo} add -- {' '.join(text)}`"
        if text
        else "one of the ways above for each file"
    )
    lines += [
        f"  to resolve: {edit}, then `nox -s {session} --continue` (the whole resolution, "
        "other files you change included, is recorded for next time)",
        f"  to give up: `nox -s {session} --abort` (back to "
        f"{rb.old_head[:12]}; patches already moved are kept under a backup ref)",
    ]
    return lines


def _ways(repo: Path, f: str, stages: set[int], what: str) -> list[str]:
    """The commands that resolve a file without a text conflict (deleted or
    added on one side). In a rebase ``--ours`` is the new base (upstream's
    side) and ``--theirs`` the patch."""
    g = f"git -C {repo}"
    keep_patch = f"`{g} add -- {f}`"
    drop = f"`{g} rm -q -- {f}`"
    if stages == {1, 3}:
        port = " (where upstream moved it)" if what.startswith("renamed") else ""
        return [
            f"  {f}: {what}:",
            f"    what the patch did there: `{g} show REBASE_HEAD -- {f}`: port it to where "
            f"the code went{port}",
            f"    drop the patch's change: {drop}; keep the file as the patch has it: {keep_patch}",
        ]
    if stages == {1, 2}:
        return [
            f"  {f}: {what}:",
            f"    keep the deletion: {drop}; keep upstream's version: `{g} checkout --ours "
            f"-- {f}` (in a rebase, ours is upstream's side), then `{g} add -- {f}`",
            f"    what the patch did there: `{g} show REBASE_HEAD -- {f}`",
        ]
    if stages == {2, 3}:
        return [
            f"  {f}: {what}:",
            f"    edit the markers, or take upstream's `{g} checkout --ours -- {f}` or the "
            f"patch's `{g} checkout --theirs -- {f}`; then `{g} add -- {f}`",
        ]
    return [f"  {f}: {what}: keep it: `{g} add -- {f}`; drop it: {drop}"]


# How many of upstream's new files beside the conflicted ones a stop names.
ADDED_BESIDE_MAX = 12


def patch_added_files(repo: Path) -> list[str]:
    """Files that the patch a rebase is stopped at adds (new in its commit)."""
    stopped_file = git.gitdir(repo) / "rebase-merge" / "stopped-sha"
    if not stopped_file.exists():
        return []
    sha = stopped_file.read_text().strip()
    out = git.git(
        repo, "diff-tree", "--no-commit-id", "--name-only", "-r", "--diff-filter=A", "--root", sha
    )
    return out.split()


def added_beside(repo: Path, old_base: str, onto: str, paths: list[str]) -> list[str]:
    """Files upstream added between the two bases in the folders of ``paths``
    (the conflicted files and the files the stopped patch adds), direct
    children only: a new module beside the conflict is often upstream's own
    version of what the patch does, a semantic conflict without a marker."""
    folders = sorted({str(Path(p).parent) for p in paths})
    if not folders:
        return []
    out = git.git(repo, "diff", "--name-only", "--diff-filter=A", old_base, onto, "--", *folders)
    added = [f for f in out.split() if str(Path(f).parent) in folders and f not in paths]
    if not added:
        return []
    lines = [
        "  upstream added beside them (the same folders; check that the patch "
        "does not duplicate one):"
    ]
    lines += [f"    {f}" for f in added[:ADDED_BESIDE_MAX]]
    if len(added) > ADDED_BESIDE_MAX:
        lines.append(
            f"    ... and {len(added) - ADDED_BESIDE_MAX} more: `git -C {repo} "
            f"diff --name-only --diff-filter=A {old_base[:12]} {onto[:12]} -- "
            f"{' '.join(folders)}`"
        )
    return lines


def _patch_file(t: Target, subject: str) -> str | None:
    for name in series.read_series(t):
        if series.read_patch(t.patches / name).subject == subject:
            return name
    return None


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(
        1 for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    )
