"""``apply``: the work tree as the target's base plus one commit per patch.

Each patch is committed with ``git am --3way`` (author and dates from the
patch, a fixed committer, so the same series gives the same commit ids
everywhere), and each commit must touch exactly the files its patch lists.
A patch that does not apply stops the series there, saying both ways on:
fix the patch file, or finish it by hand and ``apply --continue``
(:mod:`.resume`).
"""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path

from serieskit import git, killpoint
from serieskit.errors import ToolkitError
from serieskit.series import base, safety, target
from serieskit.series.series import (
    BRANCH,
    PatchFile,
    Where,
    check_patches,
    fingerprint,
    finish_interrupted_export,
    read_patch,
    read_series,
    stopped_message,
)
from serieskit.series.target import Target
from serieskit.state import State


def apply(where: Where, force: bool = False, log=print) -> State:
    """Make the work tree the target's base plus its series; a no-op when current."""
    git.require_version()
    start = time.monotonic()
    t = target.of(where)
    root, repo = t.root, t.work
    names = read_series(t)
    patches = check_patches(t, names)
    state = State.load(t)
    safety.guard_folder(root, repo, force, log)
    base.ensure_repo(repo)

    if state.rebase_stopped:
        raise ToolkitError(stopped_message(t, state))
    # The pin is checked (and its base made) before anything is moved aside.
    base_commit, _ = base.ensure_base(repo, t.version, t.sha256, t.commit, log=log)
    safety.clear_stale_locks(repo, "apply", log)
    if finish_interrupted_export(t, state, log) is False and not force:
        raise ToolkitError(
            f"an export was interrupted as it wrote {t.patches_label}/ (some files new, some "
            f"old): `{t.cmd('export')}` writes it again (it keeps what it replaces under "
            f"{safety.BACKUP_DIR}/); `{t.cmd('apply', '--force')}` applies the files as they are"
        )
    undo_interrupted(t, state, names, "apply", log=log)
    if state.in_progress:
        what = "apply --continue" if state.in_progress == "continue" else "apply"
        log(
            f"apply: an earlier {what} was interrupted at {state.applied}/{state.total}; "
            "applying again"
        )

    moved = state.base is not None and t.commit is not None and state.base != t.commit
    if moved and not force:
        raise ToolkitError(
            f"the work tree holds the series rebased onto {state.base_label} (nox -s rebase), "
            "not the pin's base: `nox -s rebase -- --update-pin` moves the pin there, "
            "`nox -s apply -- --force` goes back to the pin and keeps the rebased commits "
            f"under {safety.BACKUP_REF}/"
        )
    safety.guard(
        root,
        repo,
        state,
        "apply",
        force,
        log,
        export_cmd=t.cmd("export"),
        extra_known=_left_by_interrupted_apply(repo, state, names, patches),
        keep=_keep_by_hand(t, state),
        checkout_of=_checkout_cut_short(repo, state),
    )
    if moved and (head := git.rev(repo, "HEAD")):
        log(
            f"apply: kept the series rebased onto {state.base_label} as "
            f"{safety.backup_ref(repo, head, 'rebased')}"
        )

    fp = fingerprint(t, base_commit)
    head = git.rev(repo, "HEAD")
    if (
        fp == state.fingerprint
        and head == state.head
        and head is not None
        and state.complete
        and git.branch(repo) == BRANCH
        and not git.dirty_files(repo)
    ):
        base.mark_current(repo, base_commit)  # a tree made before the ref existed
        log(
            f"apply: up to date, {len(names)} patch(es) on vLLM {t.version} "
            f"(HEAD {head[:12]}, {time.monotonic() - start:.1f} s)"
        )
        return state
    if not names:
        log(
            f"apply: {t.patches_label}/series lists no patch: the work tree is "
            f"vLLM {t.version} alone"
        )

    state = State(
        base=base_commit,
        base_label=t.version,
        total=len(names),
        in_progress="apply",
        head=base_commit,
        started_from=safety.tips(repo),
    )
    state.save(t)
    killpoint.reach("apply.started")
    git.git(repo, "checkout", "-q", "-f", "-B", BRANCH, base_commit)
    base.mark_current(repo, base_commit)
    apply_each(t, state, names, patches, log)
    state.in_progress = None
    state.fingerprint = fp
    state.save(t)
    log(
        f"apply: {len(names)} patch(es) on vLLM {t.version} ({t.patches_label}), HEAD "
        f"{(state.head or '')[:12]} ({time.monotonic() - start:.1f} s)"
    )
    return state


def undo_interrupted(
    t: Target, state: State, names: list[str], action: str, busy=None, log=print
) -> None:
    """Before an interrupted apply (or apply --continue) is redone or goes on,
    what the work tree holds beyond commits must be what it left
    (:func:`safety.check_left_by`): a git am only its own, of the patch it was
    applying on the commit it had reached, the index only that patch's or,
    where its checkout of the base was cut short, the base's. Its own am is
    then aborted (which drops nothing else); the guard sees the rest."""
    repo = t.work
    op = git.operation_in_progress(repo)
    checkout = _checkout_cut_short(repo, state)
    if op is None and checkout is None:
        return
    made, ours, post = [checkout] if checkout else [], False, None
    since = state.continued_head or state.head
    patch = None
    if op == "am" and state.in_progress and since and state.applied < len(names):
        patch = t.patches / names[state.applied]
        if ours := _am_of(repo, patch):
            post = git.applied_tree(repo, since, patch)
            made += [since, *filter(None, [post])]
    safety.check_left_by(repo, action, tuple(made), op="am", ours=ours, busy=busy)
    if op == "am":
        git.git(repo, "am", "--abort")
    if ours and patch and since:
        _redo_half_written(t, patch, since, post, action, log)


def _redo_half_written(
    t: Target, patch: Path, since: str, post: str | None, action: str, log
) -> None:
    """The files of ``patch`` that its git am, killed before it wrote the
    index, left in the work tree: as in the base it applied on (``since``),
    as the patch makes them (``post``), or cut short of either, they are the
    apply's own and are checked out again; one that is neither (an edit
    since?) is copied under .work/backup/ first, and the line says where."""
    repo = t.work
    paths = sorted(set(git.changed_paths(repo)) & read_patch(patch).files)
    if not paths:
        return
    own = git.paths_as_in(repo, since, paths)
    if post:
        own |= git.paths_as_in(repo, post, paths)
    if doubt := [p for p in paths if p not in own and (repo / p).is_file()]:
        dest = safety.backup_dir(t.root, "half-written")
        for p in doubt:
            (dest / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / p, dest / p)
        log(
            f"{action}: {', '.join(doubt)} (neither as in the base nor as {patch.name} "
            f"makes them) kept in {dest}"
        )
    tracked = set(
        git.git(repo, "ls-tree", "-r", "--name-only", "-z", since, "--", *paths).split("\0")
    )
    if back := [p for p in paths if p in tracked]:
        git.git(repo, "checkout", "-q", since, "--", *back)
    for p in paths:
        if p not in tracked:
            (repo / p).unlink(missing_ok=True)
    log(
        f"{action}: the interrupted apply's git am of {patch.name} had written "
        f"{', '.join(paths)} (whole or cut short) and no commit: undone, and applied again"
    )


def _am_of(repo: Path, patch: Path) -> bool:
    """The git am in progress is one of ``patch`` alone (its one mail has the
    patch's patch id), or one killed as it set up, before it noted how many
    mails it has (it applied nothing)."""
    folder = git.gitdir(repo) / "rebase-apply"
    if not (folder / "last").is_file():
        return True
    mail = folder / "0001"
    if (folder / "last").read_text().strip() != "1" or not mail.is_file():
        return False
    mine = git.patch_id(repo, mail.read_bytes())
    return bool(mine) and mine == git.patch_id(repo, patch.read_bytes())


def _checkout_cut_short(repo: Path, state: State) -> str | None:
    """The base, when an apply was stopped inside its checkout of it (killed,
    or the disk full): HEAD has not moved yet, still where the apply started,
    or unborn in a repository that was empty when the apply started (its
    record: it started from no commit), and the tree may hold files that
    checkout wrote."""
    if state.in_progress != "apply" or not state.base:
        return None
    head = git.rev(repo, "HEAD")
    if head is None:
        return None if state.started_from else state.base
    return state.base if head in state.started_from else None


def _keep_by_hand(t: Target, state: State) -> str | None:
    """How to keep work over a stopped apply, where export refuses: a patch
    finished by hand goes on with --continue (None: the guard's usual way)."""
    if state.in_progress == "continue":
        return (
            f"`{t.cmd('apply', '--continue')}` goes on with the patch(es) you finished by "
            f"hand, then `{t.cmd('export')}` writes them out"
        )
    if state.failed and not state.in_progress:
        return (
            f"`{t.cmd('apply', '--continue')}` takes one commit of yours as the stopped patch "
            f"{state.failed} and applies the rest, then `{t.cmd('export')}` writes it out"
        )
    return None


def _left_by_interrupted_apply(
    repo: Path, state: State, names: list[str], patches: dict[str, PatchFile]
) -> tuple[str, ...]:
    """What an interrupted apply left in the work tree that is not the user's:
    the commits it started from (its guard had passed them) and those it made.
    An interrupted `apply --continue` left none: below its commits is a patch
    finished by hand, which only export puts in the patch folder."""
    if state.in_progress != "apply":
        return ()
    return (*state.started_from, *_made_by_interrupted_apply(repo, state, names, patches))


def _made_by_interrupted_apply(
    repo: Path, state: State, names: list[str], patches: dict[str, PatchFile]
) -> tuple[str, ...]:
    """The commits an apply killed between `git am` and its state save made:
    on top of the last recorded one, by the toolkit's committer, one per next
    patch of the series, in order. Anything else is the user's."""
    if state.in_progress != "apply" or not state.head:
        return ()
    ours = made_since(repo, state.head, state.applied, names, patches)
    return (ours,) if ours else ()


def made_since(
    repo: Path, since: str, applied: int, names: list[str], patches: dict[str, PatchFile]
) -> str | None:
    """The last of the commits on top of ``since`` that are the toolkit's, one
    per next patch of the series (after ``applied``), in order: its committer,
    the patch's subject. None when the first one is not."""
    if git.rev(repo, since) is None or git.rev(repo, "HEAD") is None:
        return None  # HEAD unborn: a first checkout killed; no commit was made
    out = git.git(repo, "log", "--reverse", "--format=%H%x00%cn%x00%s", f"{since}..HEAD")
    ours = None
    for i, line in enumerate(out.splitlines()):
        cid, committer, subject = line.split("\0")
        k = applied + i
        if k >= len(names) or committer != git.COMMITTER[0] or subject != patches[names[k]].subject:
            break
        ours = cid
    return ours


def apply_each(
    t: Target, state: State, names: list[str], patches: dict[str, PatchFile], log=print
) -> None:
    """Commit each patch after the first ``state.applied`` on HEAD, saving the
    state after each; one that does not apply stops here (:func:`_stop`)."""
    repo, n = t.work, len(names)
    for i, name in enumerate(names[state.applied :], state.applied + 1):
        log(f"apply {i}/{n}: {patches[name].subject}")
        if problem := _am(t, name, patches[name]):
            _stop(t, state, name, i, n, problem)
        state.applied = i
        state.sources.append([name, patch_sha256(t.patches / name)])
        if state.in_progress == "continue":
            state.continued_head = git.rev(repo, "HEAD")  # on a patch finished by hand
        else:
            state.head = git.rev(repo, "HEAD")
        state.save(t)


def patch_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stop(t: Target, state: State, name: str, i: int, n: int, problem: str) -> None:
    """Record where the apply stopped and say both ways on: fix the patch file
    and apply, or finish the patch by hand and `apply --continue`."""
    repo = t.work
    by_hand = state.in_progress == "continue" or state.continued_head is not None
    state.in_progress = None
    state.failed = name
    if by_hand:  # `head` stays below the patches finished by hand
        state.continued_head = git.rev(repo, "HEAD")
    else:
        state.head = git.rev(repo, "HEAD")
    state.save(t)
    shown = f"{t.patches_label}/{name}" if t.port else name
    rest = f", then applies patches {i + 1}-{n}" if i < n else ""
    first = (
        "finish this patch by hand in the work tree too (the ones you finished stay as you "
        f"made them; `{t.cmd('apply', '--force')}` would start over from the patch files, "
        f"keeping your commits under {safety.BACKUP_REF}/):"
        if by_hand
        else f"fix the patch file, then `{t.cmd('apply')}`; or finish the patch by hand "
        "in the work tree:"
    )
    raise ToolkitError(
        f"patch {shown} ({i}/{n}) {problem}; the work tree holds patches 1-{i - 1} only\n"
        f"  {first}\n"
        f"    {am_by_hand(t, name)}\n"
        "    (resolve the files, `git add` them, `git am --continue`; or edit and `git commit`)\n"
        f"    {t.cmd('apply', '--continue')}\n"
        f"    (takes your one commit as this patch{rest}; `{t.cmd('export')}` then writes "
        "it as you made it)"
    )


def _am(t: Target, name: str, patch: PatchFile) -> str | None:
    """Commit one patch; check the commit touches exactly the patch's files.
    What went wrong, with HEAD back where it was, or None."""
    repo = t.work
    proc = git.run(
        repo,
        "am",
        "--3way",
        "--keep-non-patch",
        "--committer-date-is-author-date",
        "--no-gpg-sign",
        str(t.patches / name),
    )
    problem = None
    if proc.returncode != 0:
        files = conflicted(repo) or _am_failed_files(proc.stdout + proc.stderr)
        problem = "does not apply" + (f" (conflict in {', '.join(files)})" if files else "")
        git.run(repo, "am", "--abort")
    else:
        touched = set(git.changed_files(repo, "HEAD"))
        if touched != patch.files:
            problem = (
                "applied, but its commit touches "
                f"{', '.join(sorted(touched ^ patch.files))} against what it lists"
            )
            git.git(repo, "reset", "-q", "--hard", "HEAD~1")  # our own commit, from the patch
    return problem


def conflicted(repo: Path) -> list[str]:
    out = git.git(repo, "diff", "--name-only", "--diff-filter=U", check=False)
    return out.split()


def _am_failed_files(output: bytes) -> list[str]:
    files = []
    for line in output.decode(errors="replace").splitlines():
        for marker in ("patch failed: ", "CONFLICT (content): Merge conflict in "):
            if marker in line:
                files.append(line.split(marker, 1)[1].rsplit(":", 1)[0].strip())
    return sorted(set(files))


def am_by_hand(t: Target, name: str) -> str:
    """The command that applies a stopped patch in the work tree for the user
    to finish: a 3-way merge leaves conflict markers; --keep-non-patch keeps a
    subject's [Tag] (git am drops it otherwise), as apply does."""
    return f"git -C {t.work} am -3 --keep-non-patch {t.patches / name}"


def stopped_ways(t: Target, state: State) -> str:
    """The ways on from an apply stopped at a patch (for export and status)."""
    assert state.failed
    by_hand = (
        f"finish it by hand in the work tree (`{am_by_hand(t, state.failed)}`, resolve, "
        f"`git am --continue`), then `{t.cmd('apply', '--continue')}`"
    )
    if state.continued_head:  # a plain apply would refuse over the earlier hand work
        return by_hand
    return f"fix the patch and `{t.cmd('apply')}`, or {by_hand}"
