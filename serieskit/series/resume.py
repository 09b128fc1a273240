"""``apply --continue``: the rest of the series after a patch finished by hand.

An apply stopped at patch i; the user made that patch one commit in the
work tree. This takes that commit as patch i and applies i+1..n as apply
does, refusing (and changing nothing) over anything else it finds there.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from serieskit import git
from serieskit.errors import ToolkitError
from serieskit.series import safety, target
from serieskit.series.apply import (
    am_by_hand,
    apply_each,
    conflicted,
    made_since,
    patch_sha256,
    undo_interrupted,
)
from serieskit.series.series import (
    BRANCH,
    NAME_TRAILER,
    SERIES,
    PatchFile,
    Where,
    check_patches,
    fingerprint,
    read_series,
    stopped_message,
)
from serieskit.series.target import Target
from serieskit.state import State


def cont(where: Where, log=print) -> State:
    """``apply --continue``: after an apply stopped at patch i, and the user
    finished that patch by hand in the work tree (one commit on the branch, on
    top of patches 1..i-1 as apply left them), apply patches i+1..n the way
    apply does (stopping again the same way), so that export writes patch i
    as the user made it. Refuses, changing nothing, over anything else."""
    git.require_version()
    start = time.monotonic()
    t = target.of(where)
    repo = t.work
    state = State.load(t)
    if state.rebase_stopped:
        raise ToolkitError(stopped_message(t, state))
    resumed = state.in_progress == "continue"  # an earlier --continue, killed
    if not (state.failed or resumed) or not git.is_repo(repo) or not state.base or not state.head:
        raise ToolkitError(_nothing_to_continue(t, state))
    names = read_series(t)
    patches = check_patches(t, names)
    safety.clear_stale_locks(repo, "apply --continue", log)
    undo_interrupted(
        t, state, names, "apply --continue", busy=lambda op: _operation_message(t, op), log=log
    )
    if resumed:
        log("apply --continue: the earlier one was interrupted; going on")
    if t.commit is not None and state.base != t.commit:
        raise ToolkitError(
            f"the work tree is on {state.base_label} ({state.base[:12]}), not on "
            f"{'the port' if t.port else 'the pin'}'s base on {t.version}: "
            f"`{t.cmd('apply', '--force')}` applies the series there, keeping your commits "
            f"under {safety.BACKUP_REF}/"
        )
    since = state.continued_head or state.head
    _check_branch(t, since)
    _check_clean(t, state, since)
    _check_sources(t, state, names)
    if resumed:
        # A commit of the next patch, made before the kill let the state say so:
        # ours, from the patch file; made again below.
        if (head := git.rev(repo, "HEAD")) != since:
            if head != made_since(repo, since, state.applied, names, patches):
                raise ToolkitError(_unexpected_message(t, state, names, since))
            git.git(repo, "reset", "-q", "--hard", since)
    else:
        state.continued_head = _take_by_hand(t, state, names, patches, since, log)
        state.sources.append([names[state.applied], ""])
        state.applied += 1
        state.failed = None
        state.in_progress = "continue"
        state.save(t)
    apply_each(t, state, names, patches, log)
    state.in_progress = None
    state.total = len(names)
    # Every patch applied from its file is unchanged (checked above); the ones
    # finished by hand differ from theirs, which export overwrites (keeping them).
    state.fingerprint = fingerprint(t, state.base)
    state.save(t)
    by_hand = [f"{t.patches_label}/{name}" for name, sha in state.sources if not sha]
    log(
        f"apply --continue: {len(names)} patch(es) on vLLM {t.version}, HEAD "
        f"{(state.continued_head or '')[:12]} ({time.monotonic() - start:.1f} s); "
        f"finished by hand: {', '.join(by_hand)}"
    )
    log(
        f"apply --continue: `{t.cmd('export')}` writes the patch(es) as you made them; "
        "until then `apply` refuses over them"
    )
    return state


def _nothing_to_continue(t: Target, state: State) -> str:
    if state.in_progress == "apply":
        return (
            f"no apply is stopped at a patch: one was interrupted at "
            f"{state.applied}/{state.total} (killed); `{t.cmd('apply')}` redoes it"
        )
    if not state.base or not git.is_repo(t.work):
        return (
            "no apply is stopped at a patch: nothing to continue "
            f"(`{t.cmd('apply')}` makes the work tree)"
        )
    return (
        f"no apply is stopped at a patch: nothing to continue (the last apply finished; "
        f"`{t.cmd('status')}` shows the work tree)"
    )


def _operation_message(t: Target, op: str) -> str:
    """A git operation of the user's in the work tree stops --continue."""
    repo = t.work
    if op != "am":
        return (
            f"a git {op} is in progress in {repo}: finish it, or "
            f"`git -C {repo} {op} --abort`, then run this again"
        )
    conflicts = conflicted(repo)
    files = (
        f"conflicts in {', '.join(conflicts)}: resolve them"
        if conflicts
        else "the patch did not apply: edit the files as it should leave them"
    )
    return (
        f"a git am is in progress in {repo}: finish it first, then run "
        f"`{t.cmd('apply', '--continue')}` again\n"
        f"  {files} and `git -C {repo} add` them\n"
        f"  `git -C {repo} am --continue` commits the patch "
        f"(`git -C {repo} am --abort` gives up on the am)"
    )


def _check_branch(t: Target, since: str) -> None:
    """HEAD on the series branch, on top of what the toolkit left there."""
    repo = t.work
    head = git.rev(repo, "HEAD")
    if (on := git.branch(repo)) != BRANCH:
        where_ = "detached" if on is None else f"on branch {on}"
        tip = git.rev(repo, BRANCH)
        if head and tip and _contains(repo, head, tip):
            how = f"`git -C {repo} checkout -B {BRANCH}` moves the branch to HEAD"
        else:
            how = f"`git -C {repo} checkout {BRANCH}` first (`git cherry-pick` your commit there)"
        raise ToolkitError(
            f"HEAD is {where_} in {repo}: apply --continue goes on on the branch "
            f"`{BRANCH}`, where apply stopped; {how}, then run this again"
        )
    if not head or git.rev(repo, since) is None or not _contains(repo, head, since):
        raise ToolkitError(
            f"the branch `{BRANCH}` in {repo} no longer holds the patches as apply left them "
            f"(HEAD {(head or '?')[:12]} does not contain {since[:12]}): "
            f"`{t.cmd('apply', '--force')}` applies the series again from "
            f"{t.patches_label}/, keeping your commits under {safety.BACKUP_REF}/"
        )
    merges = git.git(repo, "rev-list", "--merges", f"{since}..HEAD").split()
    if merges:
        raise ToolkitError(
            f"the branch `{BRANCH}` in {repo} has a merge commit ({merges[0][:12]}) on top of "
            f"the patches apply left: a series is linear; make the patch one plain commit "
            f"on {since[:12]}, then run this again"
        )


def _contains(repo: Path, commit: str, ancestor: str) -> bool:
    return git.run(repo, "merge-base", "--is-ancestor", ancestor, commit).returncode == 0


def _check_clean(t: Target, state: State, since: str) -> None:
    """No uncommitted change, untracked files included: the next patches are
    applied over a clean tree, and nothing of the user's is left half in."""
    repo = t.work
    dirty = git.dirty_files(repo)
    if not dirty:
        return
    lines = [f"  uncommitted: {line[3:]}" for line in dirty[:10]]
    if len(dirty) > 10:
        lines.append(f"  ... and {len(dirty) - 10} more uncommitted files")
    if not state.failed:
        commit = f"commit them (`git -C {repo} commit`)"
    elif git.rev(repo, "HEAD") == since:  # the stopped patch is not committed yet
        commit = f"commit them as {state.failed} (`git -C {repo} commit`)"
    else:
        commit = f"add them to your commit for {state.failed} (`git -C {repo} commit --amend`)"
    raise ToolkitError(
        "\n".join(
            [
                f"apply --continue: the work tree {repo} has uncommitted changes:",
                *lines,
                f"  {commit} or stash them (`git -C {repo} stash -u`), then run this again",
            ]
        )
    )


def _check_sources(t: Target, state: State, names: list[str]) -> None:
    """The patches in the work tree are still the series' first ones, and
    those applied from their files are unchanged (else export would overwrite
    the changes): the rest of the series goes on top of them."""
    label = t.patches_label
    if len(state.sources) != state.applied:
        raise ToolkitError(
            f"the stop at {label}/{state.failed} was recorded without the patch files it "
            f"applied (by an older toolkit): `{t.cmd('apply', '--force')}` applies the series "
            f"again and keeps your commits under {safety.BACKUP_REF}/"
        )
    taken = [name for name, _ in state.sources]
    # After a stop, the stopped patch comes next; after a kill, whatever does.
    expected = taken + ([state.failed] if state.failed else [])
    if names[: len(expected)] != expected:
        raise ToolkitError(
            f"{label}/{SERIES} changed since apply stopped: the work tree holds "
            f"{', '.join(taken) or 'no patch'}"
            + (f" and stopped at {state.failed}" if state.failed else "")
            + f", the series now begins {', '.join(names[: len(expected)]) or 'with none'}; "
            "restore it, or "
            f"`{t.cmd('apply', '--force')}` applies the series as it is now, keeping your "
            f"commits under {safety.BACKUP_REF}/"
        )
    changed = [
        f"{label}/{name}"
        for name, sha in state.sources
        if sha and patch_sha256(t.patches / name) != sha
    ]
    if changed:
        raise ToolkitError(
            f"{', '.join(changed)} changed since apply applied it: the work tree holds the "
            f"version it applied, and export would overwrite yours; restore it, or "
            f"`{t.cmd('apply', '--force')}` applies the series as it is now, keeping your "
            f"commits under {safety.BACKUP_REF}/"
        )


def _take_by_hand(
    t: Target,
    state: State,
    names: list[str],
    patches: dict[str, PatchFile],
    since: str,
    log,
) -> str:
    """The one commit the user made for the stopped patch, on ``since``."""
    repo, label = t.work, t.patches_label
    name = names[state.applied]
    i, n = state.applied + 1, len(names)
    found = git.commits(repo, f"{since}..HEAD")
    if not found:
        raise ToolkitError(
            f"the branch `{BRANCH}` in {repo} holds no commit for {label}/{name} ({i}/{n}) "
            f"on top of patches 1-{i - 1} (HEAD {since[:12]} is where apply stopped): finish "
            f"the patch first (`{am_by_hand(t, name)}`, resolve, `git add`, "
            "`git am --continue`; or edit and `git commit`), then run this again"
        )
    if len(found) > 1:
        raise ToolkitError(
            "\n".join(
                [
                    f"found {len(found)} commits on top of patches 1-{i - 1} in {repo}, where "
                    f"{label}/{name} ({i}/{n}) is one:",
                    *(f"  commit {cid[:12]} {subject}" for cid, subject in found[:10]),
                    *([f"  ... and {len(found) - 10} more"] if len(found) > 10 else []),
                    f"  a patch is one commit: squash them (`git -C {repo} rebase -i "
                    f"{since[:12]}`, `fixup` the later ones), then run this again; a patch of "
                    f"its own goes in once the series is whole (`git rebase -i`, then "
                    f"`{t.cmd('export')}`)",
                ]
            )
        )
    cid, subject = found[0]
    patch = patches[name]
    untagged = re.sub(r"^(\s*\[[^\]]*\])+\s*", "", patch.subject)
    if subject != patch.subject and subject == untagged:
        raise ToolkitError(
            f'commit {cid[:12]} "{subject}" is to be {label}/{name}, whose subject is '
            f'"{patch.subject}": `git am` drops a subject\'s [tags] unless given '
            f"--keep-non-patch; put it back (`git -C {repo} commit --amend`), then run this again"
        )
    if patch.name is not None:
        trailer = git.git(
            repo, "log", "-1", f"--format=%(trailers:key={NAME_TRAILER},valueonly)", cid
        ).split()
        if patch.name not in trailer:
            raise ToolkitError(
                f'commit {cid[:12]} "{subject}" is to be {label}/{name}, whose '
                f"{NAME_TRAILER}: trailer is {patch.name} (its manifest entry); the commit "
                f"has {'none' if not trailer else ', '.join(trailer)}: "
                f"`git -C {repo} commit --amend --trailer '{NAME_TRAILER}: {patch.name}'`, "
                "then run this again"
            )
    touched = set(git.changed_files(repo, cid))
    if not touched:
        raise ToolkitError(
            f'commit {cid[:12]} "{subject}" changes no file, and a patch file is a change: '
            f"amend it with the change {label}/{name} should make (`git -C {repo} commit "
            f"--amend`), then run this again; a patch left out goes from {label}/{SERIES} "
            f"(`{t.cmd('apply', '--force')}` then keeps your commit under {safety.BACKUP_REF}/)"
        )
    log(f"apply --continue {i}/{n}: {subject} ({cid[:12]}, finished by hand)")
    if touched != patch.files:
        log(
            f"  it touches {', '.join(sorted(touched ^ patch.files))} against what "
            f"{label}/{name} lists; export writes it as committed"
        )
    return cid


def _unexpected_message(t: Target, state: State, names: list[str], since: str) -> str:
    repo = t.work
    found = git.commits(repo, f"{since}..HEAD")
    return "\n".join(
        [
            f"an apply --continue was interrupted at {state.applied}/{len(names)}, and the "
            f"branch `{BRANCH}` in {repo} now has commits it did not make on top of it:",
            *(f"  commit {cid[:12]} {subject}" for cid, subject in found[:10]),
            f"  move them aside (`git -C {repo} branch mine && git -C {repo} reset --keep "
            f"{since[:12]}`), run this again, then put them back (`git cherry-pick`)",
        ]
    )
