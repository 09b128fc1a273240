"""The series: patches/ as the source of truth, a work tree made from it.

``apply`` builds ``.work/vllm`` as the pinned base plus one commit per patch
(``git am --3way``, author and dates from the patch, a fixed committer, so the
same series gives the same commit ids everywhere), and checks that each commit
touches exactly the files its patch lists. ``export`` writes the work tree's
commits back as ``git format-patch`` files with every drifting detail (commit
ids, git version, numbering) held fixed, so apply + export changes no byte.

Both go through :mod:`serieskit.series.safety`: the user's work in the work tree is
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

from serieskit import git
from serieskit.errors import ToolkitError, failed
from serieskit.series import base, safety, target
from serieskit.series.target import Target
from serieskit.state import WORK, State  # noqa: F401 (WORK: callers read it here)

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
    t = target.of(where)
    if not git.is_repo(t.work) or not State.load(t).base:
        raise ToolkitError(f"no work tree: run `{t.cmd('apply')}` first")
    return t.work


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
        subject,
        trailer.group(1) if trailer else None,
        frozenset(files),
        diffs,
        inserted,
        deleted,
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
    h = hashlib.sha256(base_commit.encode())
    if not (t.patches / SERIES).exists():
        return h.hexdigest() + "-no-series"
    for name in read_series(t):
        h.update(b"\0" + name.encode() + b"\0")
        h.update((t.patches / name).read_bytes())
    return h.hexdigest()


# --- apply -----------------------------------------------------------------


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
    op = git.operation_in_progress(repo)
    if op == "am" and state.in_progress in ("apply", "continue"):
        # Our own am, killed midway: git's abort restores HEAD and keeps
        # changes to files the patch does not touch; the guard sees the rest.
        git.git(repo, "am", "--abort")
    elif op is not None:
        raise ToolkitError(
            f"a git {op} is in progress in {repo}: finish it, or "
            f"`git -C {repo} {op} --abort`, then run this again"
        )
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
    )
    if moved and (head := git.rev(repo, "HEAD")):
        log(
            f"apply: kept the series rebased onto {state.base_label} as "
            f"{safety.backup_ref(repo, head, 'rebased')}"
        )

    base_commit, _ = base.ensure_base(repo, t.version, t.sha256, t.commit, log=log)
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
    git.git(repo, "checkout", "-q", "-f", "-B", BRANCH, base_commit)
    _apply_each(t, state, names, patches, log)
    state.in_progress = None
    state.fingerprint = fp
    state.save(t)
    log(
        f"apply: {len(names)} patch(es) on vLLM {t.version} ({t.patches_label}), HEAD "
        f"{(state.head or '')[:12]} ({time.monotonic() - start:.1f} s)"
    )
    return state


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
    safety.check_index_lock(repo, "apply --continue")
    op = git.operation_in_progress(repo)
    if op == "am" and resumed:
        git.git(repo, "am", "--abort")  # our own, killed midway (as apply repairs it)
        log("apply --continue: the earlier one was interrupted; going on")
    elif op is not None:
        raise ToolkitError(_operation_message(t, op))
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
            if head != _made_since(repo, since, state.applied, names, patches):
                raise ToolkitError(_unexpected_message(t, state, names, since))
            git.git(repo, "reset", "-q", "--hard", since)
    else:
        state.continued_head = _take_by_hand(t, state, names, patches, since, log)
        state.sources.append([names[state.applied], ""])
        state.applied += 1
        state.failed = None
        state.in_progress = "continue"
        state.save(t)
    _apply_each(t, state, names, patches, log)
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
    conflicts = _conflicted(repo)
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
        f"{label}/{name}" for name, sha in state.sources if sha and _sha256(t.patches / name) != sha
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


def stopped_message(t: Target, state: State) -> str:
    """Why a session refuses while a rebase or a carry is stopped at a conflict."""
    if state.rebase and state.rebase.kind == "carry":
        return (
            f"a carry to the port is stopped at a conflict: finish it with "
            f"`nox -s carry -- {t.version} --continue` or give up with `--abort`"
        )
    return (
        "a rebase is stopped at a conflict: finish it with "
        "`nox -s rebase -- --continue` or give up with `--abort`"
    )


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
    ours = _made_since(repo, state.head, state.applied, names, patches)
    return (ours,) if ours else ()


def _made_since(
    repo: Path, since: str, applied: int, names: list[str], patches: dict[str, PatchFile]
) -> str | None:
    """The last of the commits on top of ``since`` that are the toolkit's, one
    per next patch of the series (after ``applied``), in order: its committer,
    the patch's subject. None when the first one is not."""
    if git.rev(repo, since) is None:
        return None
    out = git.git(repo, "log", "--reverse", "--format=%H%x00%cn%x00%s", f"{since}..HEAD")
    ours = None
    for i, line in enumerate(out.splitlines()):
        cid, committer, subject = line.split("\0")
        k = applied + i
        if k >= len(names) or committer != git.COMMITTER[0] or subject != patches[names[k]].subject:
            break
        ours = cid
    return ours


def _apply_each(
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
        state.sources.append([name, _sha256(t.patches / name)])
        if state.in_progress == "continue":
            state.continued_head = git.rev(repo, "HEAD")  # on a patch finished by hand
        else:
            state.head = git.rev(repo, "HEAD")
        state.save(t)


def _sha256(path: Path) -> str:
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
        files = _conflicted(repo) or _am_failed_files(proc.stdout + proc.stderr)
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
        raise ToolkitError(
            f"the work tree has merge commits ({merges[0][:12]}): a series must be linear"
        )
    out.mkdir(parents=True, exist_ok=True)
    listed = git.git(repo, *FORMAT_PATCH_ARGS, "-o", str(out), f"{base_commit}..HEAD")
    return [Path(p).name for p in listed.split()]


def require_exportable(where: Where, state: State, force: bool = False) -> Path:
    """Refuse to write the patch folder unless the work tree holds a complete,
    applied series at the head of its branch, on the target's base, made from
    the patch files that are there now."""
    t = target.of(where)
    repo, label = t.work, t.patches_label
    if not git.is_repo(repo) or not state.base:
        raise ToolkitError(f"no work tree: run `{t.cmd('apply')}` first")
    if state.rebase_stopped:
        raise ToolkitError(stopped_message(t, state))
    if op := git.operation_in_progress(repo):
        raise ToolkitError(f"a git {op} is in progress in {repo}: finish it first")
    if state.in_progress == "continue":
        raise ToolkitError(
            f"an apply --continue was interrupted at {state.applied}/{state.total}: "
            f"the work tree is not the whole series; `{t.cmd('apply', '--continue')}` goes on"
        )
    if state.in_progress:
        raise ToolkitError(
            f"an apply was interrupted at {state.applied}/{state.total}: "
            f"the work tree is not the whole series; `{t.cmd('apply')}` redoes it"
        )
    if state.failed:
        raise ToolkitError(
            f"the last apply stopped at {label}/{state.failed}: the work tree "
            f"holds {state.applied}/{state.total} patches, and export would "
            f"drop the rest; {stopped_ways(t, state)}"
        )
    if state.base != t.commit:
        owner = f"the port's ({label})" if t.port else "the pin's"
        raise ToolkitError(
            f"the work tree is on {state.base_label} ({state.base[:12]}), {owner} base on "
            f"{t.version}: export writes patches for {owner} base"
            + (
                " (`nox -s rebase -- --update-pin` moves the pin)"
                if state.rebase and state.rebase.is_release
                else ""
            )
        )
    if (on := git.branch(repo)) != BRANCH:
        where_ = "detached" if on is None else f"on branch {on}"
        raise ToolkitError(
            f"HEAD is {where_} in {repo}: export writes the branch "
            f"`{BRANCH}`; `git -C {repo} checkout {BRANCH}` first"
        )
    if not force and state.fingerprint != fingerprint(t, state.base):
        raise ToolkitError(
            f"{label}/ changed since the work tree was made from it: `{t.cmd('apply')}` takes "
            f"those changes (it keeps your work first), or `{t.cmd('export', '--force')}` "
            f"overwrites them (keeping the current files under {safety.BACKUP_DIR}/)"
        )
    return repo


def export(where: Where, check: bool = False, force: bool = False, log=print) -> list[str]:
    """Regenerate the patch folder from the work tree's commits; return changed names.

    With ``check`` nothing is written: the names that would change are returned.
    """
    t = target.of(where)
    state = State.load(t)
    repo = require_exportable(t, state, force=force or check)
    assert state.base
    dirty = git.dirty_files(repo)
    if dirty:
        log(f"export: {len(dirty)} uncommitted file(s) in the work tree are not exported")
    pdir, label = t.patches, t.patches_label
    old = read_series(t) if (pdir / SERIES).exists() else []
    with tempfile.TemporaryDirectory() as tmp:
        names = format_patches(repo, state.base, Path(tmp))
        new = {name: (Path(tmp) / name).read_bytes() for name in names}
    check_manifest(t, repo, state.base, names)
    changed = [n for n in names if not (pdir / n).exists() or (pdir / n).read_bytes() != new[n]]
    removed = [n for n in old if n not in names]
    series_text = "".join(n + "\n" for n in names)
    series_path = pdir / SERIES
    series_changed = not series_path.exists() or series_path.read_text() != series_text
    if check:
        drift = changed + removed + (["series"] if series_changed else [])
        log(
            "export --check: "
            + (
                f"{label}/ matches the work tree"
                if not drift
                else f"{label}/ differs: " + ", ".join(drift)
            )
        )
        return drift
    kept = safety.keep_files(
        t.root,
        [pdir / n for n in changed + removed] + ([series_path] if series_changed else []),
        "export",
    )
    for name in changed:
        (pdir / name).write_bytes(new[name])
    for name in removed:
        (pdir / name).unlink()
    if series_changed:
        series_path.write_text(series_text)
    state.head = git.rev(repo, "HEAD")
    state.fingerprint = fingerprint(t, state.base)
    state.total = state.applied = len(names)
    state.continued_head, state.sources = None, []  # patches finished by hand now written
    state.save(t)
    log(f"export: {len(names)} patch(es); {len(changed)} written, {len(removed)} removed")
    for name in changed:
        log(f"  wrote {label}/{name}")
    for name in removed:
        log(f"  removed {label}/{name}")
    if kept:
        log(f"export: the previous versions are kept in {kept}")
    return changed


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


def layering_acknowledged(where: Where) -> dict[str, str]:
    """Files whose coupling count a patch raises on purpose, with the reason
    (the manifest's ``layering`` tables)."""
    declared: dict[str, str] = {}
    for entry in read_manifest(where):
        for path, why in entry.get("layering", {}).items():
            declared[path] = f"{entry.get('name')}: {why}"
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
