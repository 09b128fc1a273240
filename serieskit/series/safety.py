"""Nothing is lost: the one rule of every session, enforced here.

No session deletes or rewrites a patch file, a commit or an uncommitted
change unless it is also somewhere the user can find it: the work tree, a
branch, a uniquely named ref under ``refs/series/backup/``, a stash, or a
folder under ``.work/backup/``; and the session says where. Work the toolkit
did not make (uncommitted changes, commits beyond what it last wrote) stops a
session that would move it, unless ``--force`` asks to save it first.

One session at a time holds ``.work/lock`` (``filelock``); a second refuses.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from serieskit import git
from serieskit.errors import ToolkitError, stale_lock
from serieskit.state import WORK, State

BACKUP_REF = "refs/series/backup"
BACKUP_DIR = f"{WORK}/backup"
BRANCH = "series"
TIPS = ("HEAD", f"refs/heads/{BRANCH}")  # where the user's commits can be


@contextmanager
def session_lock(root: Path) -> Iterator[None]:
    """Hold ``.work/lock`` for one session; refuse at once when another holds it."""
    work = root / WORK
    work.mkdir(parents=True, exist_ok=True)
    path = work / "lock"
    owner = work / "lock.owner"
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        who = owner.read_text().strip() if owner.exists() else "another process"
        raise ToolkitError(
            f"another serieskit session ({who}) holds {path}: "
            "wait for it to finish, then run this again"
        ) from None
    try:
        owner.write_text(f"pid {os.getpid()}\n")
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()


def stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def backup_ref(repo: Path, commit: str, why: str) -> str:
    """Point a new, unique ref under refs/series/backup/ at ``commit``."""
    base = f"{BACKUP_REF}/{stamp()}-{why}"
    for n in range(1, 1000):
        name = base if n == 1 else f"{base}-{n}"
        # The empty old value makes git create the ref only if it does not exist.
        if git.run(repo, "update-ref", name, commit, "").returncode == 0:
            return name
    raise ToolkitError(f"cannot make a backup ref under {BACKUP_REF}/ in {repo}")


def stash(repo: Path, why: str) -> str:
    """Stash every uncommitted change, untracked files included, and say
    which stash holds them. Paths a stopped merge left unmerged are staged
    first as the work tree has them (git stash refuses an unmerged index):
    a resolution half-made in a conflicted file is kept as it is."""
    unmerged = git.git(repo, "diff", "--name-only", "-z", "--diff-filter=U").split("\0")
    if unmerged := [p for p in unmerged if p]:
        git.git(repo, "add", "-A", "--", *unmerged)
    git.git(
        repo,
        "stash",
        "push",
        "--include-untracked",
        "-m",
        f"serieskit {stamp()}: {why}",
        env={"GIT_AUTHOR_NAME": git.COMMITTER[0], "GIT_AUTHOR_EMAIL": git.COMMITTER[1]},
    )
    commit = git.rev(repo, "refs/stash") or "?"
    return f"stash@{{0}} ({commit[:12]})"


def backup_dir(root: Path, why: str) -> Path:
    """A new folder under .work/backup/ for files moved or copied aside."""
    base = root / BACKUP_DIR / f"{stamp()}-{why}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    path.mkdir(parents=True)
    return path


def keep_files(root: Path, files: list[Path], why: str) -> Path | None:
    """Copy ``files`` (that a session is about to rewrite or remove) aside."""
    files = [f for f in files if f.exists()]
    if not files:
        return None
    dest = backup_dir(root, why)
    for f in files:
        shutil.copy2(f, dest / f.name)
    return dest


@dataclass
class Unsaved:
    """The user's work in the work tree: what the toolkit did not write."""

    dirty: list[str]  # `git status --short` lines
    commits: list[tuple[str, str]]  # (id, subject), oldest first
    tips: list[str]  # HEAD and/or the series branch, where those commits are

    def __bool__(self) -> bool:
        return bool(self.dirty or self.commits)

    def describe(self, repo: Path) -> list[str]:
        lines = [f"  uncommitted: {line[3:]}" for line in self.dirty[:10]]
        if len(self.dirty) > 10:
            lines.append(f"  ... and {len(self.dirty) - 10} more uncommitted files")
        lines += [f"  commit {cid[:12]} {subject}" for cid, subject in self.commits[:10]]
        if len(self.commits) > 10:
            lines.append(f"  ... and {len(self.commits) - 10} more commits")
        return lines


def unsaved_work(
    repo: Path,
    state: State,
    extra_known: tuple[str, ...] = (),
    checkout_of: str | None = None,
    log=print,
) -> Unsaved:
    """Uncommitted changes, and commits on HEAD or the series branch that are
    neither what the toolkit last wrote nor already in a backup ref. With
    ``checkout_of``, a checkout of that commit was killed half-way: the
    files that are as in it are what it wrote, not changes of the user's."""
    if not git.is_repo(repo):
        return Unsaved([], [], [])
    dirty = git.dirty_files(repo)
    unborn = git.rev(repo, "HEAD") is None
    if checkout_of and dirty:
        written = git.paths_as_in(repo, checkout_of, git.changed_paths(repo), every=unborn)
        if written:
            first = "the first checkout" if unborn else "a checkout"
            log(
                f"  {first} of {checkout_of[:12]} in {repo} was cut short (killed, or the disk "
                f"full): its {len(written)} file(s) there, whole or cut short, are checked "
                "out again"
            )
            dirty = [line for line in dirty if _path_of(line) not in written]
    if unborn:  # a fresh repository: no commit can be the user's
        return Unsaved(dirty, [], [])
    tips = [t for t in TIPS if git.rev(repo, t)]
    known = [k for k in (state.head, state.base, *extra_known) if k and git.rev(repo, k)]
    # Commits under a backup ref are saved, base commits are the toolkit's own.
    saved = git.git(
        repo, "for-each-ref", "--format=%(objectname)", BACKUP_REF, "refs/series/base"
    ).split()
    exclude = [f"^{k}" for k in (*known, *saved)]
    out = git.git(repo, "log", "--reverse", "--format=%H %s", *tips, *exclude)
    commits = [tuple(line.split(" ", 1)) for line in out.splitlines() if line]
    with_tip = [t for t in tips if git.git(repo, "rev-list", "--count", t, *exclude).strip() != "0"]
    return Unsaved(dirty, commits, with_tip)  # type: ignore[arg-type]


def _path_of(status_line: str) -> str:
    """The path of a ``git status --porcelain`` line (a rename's new one)."""
    path = status_line[3:].split(" -> ")[-1]
    return path[1:-1] if path.startswith('"') else path


def tips(repo: Path) -> list[str]:
    """The commits HEAD and the series branch point at."""
    return [c for c in dict.fromkeys(git.rev(repo, t) for t in TIPS) if c]


def guard(
    root: Path,
    repo: Path,
    state: State,
    action: str,
    force: bool,
    log=print,
    extra_known: tuple[str, ...] = (),
    export_cmd: str = "nox -s export",
    keep: str | None = None,
    checkout_of: str | None = None,
) -> None:
    """Refuse ``action`` over the user's work; with ``force``, save it first.
    ``keep`` says how the user keeps it (default: commit and export)."""
    clear_stale_locks(repo, action, log)
    work = unsaved_work(repo, state, extra_known, checkout_of, log)
    if not work:
        return
    if not force:
        keep = keep or f"commit your changes and run `{export_cmd}` (writes them out)"
        raise ToolkitError(
            "\n".join(
                [
                    f"{action}: the work tree {repo} holds work that is not in its patch files:",
                    *work.describe(repo),
                    f"  keep it: {keep}, or rerun with --force, which stashes changes and keeps "
                    f"commits under {BACKUP_REF}/",
                ]
            )
        )
    save(repo, work, action, log)


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # what an unborn HEAD holds


def check_left_by(
    repo: Path,
    action: str,
    made: tuple[str, ...] | None = (),
    op: str | None = None,
    ours: bool = False,
    busy: Callable[[str], str] | None = None,
    own: tuple[str, ...] = (),
) -> None:
    """Before ``action`` resumes its own interrupted work in ``repo`` (aborts
    or continues a git operation, resets, checks out): stop, with one line
    naming what it found, unless that is what the interrupted one left.

    A git operation in progress is allowed only if it is ``op`` and ``ours``
    (the caller's proof that the interrupted command ran it); ``busy(found)``
    words the refusal. Every staged change (the index against HEAD) must be a
    file as HEAD or one of ``made`` has it (the trees the interrupted git step
    was writing: git writes the index whole), with nothing unstaged over it
    and no unmerged path: what a reset or an abort then drops is the
    toolkit's own. ``own``: paths the step writes whatever they held (a
    generated file). ``made=None``: the index is not dropped (a continue
    commits it), and not checked."""
    found = git.operation_in_progress(repo)
    if found is not None and (found != op or not ours):
        raise ToolkitError(
            busy(found)
            if busy
            else f"a git {found} is in progress in {repo}: finish it, or "
            f"`git -C {repo} {found} --abort`, then run this again"
        )
    if made is None:
        return
    stash = f"keep them (`git -C {repo} stash`), then run this again"
    if unmerged := git.git(repo, "diff", "--name-only", "-z", "--diff-filter=U").split("\0")[:-1]:
        raise ToolkitError(
            f"{action}: {repo} has unmerged paths that the interrupted {action} cannot be "
            f"shown to have left: {_listed(unmerged)}; resolve them, `git -C {repo} add` and "
            f"{stash}" + (f"; or drop them (`git -C {repo} {found} --abort`)" if found else "")
        )
    staged = git.staged_against(repo, git.rev(repo, "HEAD") or EMPTY_TREE) - set(own)
    theirs = set(staged)
    for tree in made:
        theirs &= git.staged_against(repo, tree)
    if theirs:
        raise ToolkitError(
            f"{action}: {repo} has staged changes that the interrupted {action} did not make: "
            f"{_listed(sorted(theirs))}; {stash}"
        )
    over = staged & set(git.git(repo, "diff", "--name-only", "-z").split("\0"))
    if over:
        raise ToolkitError(
            f"{action}: {repo} has changes over what the interrupted {action} staged: "
            f"{_listed(sorted(over))}; {stash}"
        )


def _listed(paths: list[str], most: int = 5) -> str:
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def clear_stale_locks(repo: Path, action: str, log=print) -> None:
    """Lock files in the work tree's git folder (index.lock, HEAD.lock, a
    branch's .lock, ...): held by a git that runs there, they stop ``action``
    before it moves anything, --force or not; left by one that was killed
    (no git runs there, and this session holds .work/lock), they are stale,
    and removed with a line saying so. Where the system cannot tell (no
    /proc), the user has to."""
    if not git.is_repo(repo) or not (locks := git.lock_files(repo)):
        return
    holders = git.processes_in(repo)
    if holders is None:
        raise ToolkitError(f"{action}: {stale_lock(str(locks[0]))}")
    if holders:
        raise ToolkitError(
            f"{action}: {locks[0]} is held by a git running in {repo} (pid "
            f"{', '.join(map(str, holders))}): wait for it to end, then run this again"
        )
    for lock in locks:
        lock.unlink(missing_ok=True)
        log(f"{action}: removed {lock}: a stale lock (no git runs in {repo}; one was killed there)")


def save(repo: Path, work: Unsaved, why: str, log=print) -> None:
    """Put ``work`` where the user can find it, and say where."""
    seen: set[str] = set()
    for tip in work.tips:
        commit = git.rev(repo, tip)
        if commit and commit not in seen:
            seen.add(commit)
            ref = backup_ref(repo, commit, why)
            log(f"{why}: kept {len(work.commits)} unexported commit(s) of {tip} as {ref}")
    if work.dirty:
        if git.rev(repo, "HEAD") is None:
            raise ToolkitError(
                f"{why}: {repo} has no commit yet, so its files cannot be stashed: "
                f"move them aside ({_listed([_path_of(line) for line in work.dirty])}), "
                "then run this again"
            )
        where = stash(repo, f"saved by {why} --force")
        log(
            f"{why}: stashed {len(work.dirty)} uncommitted file(s) as {where} "
            f"(`git -C {repo} stash list`)"
        )


def guard_folder(root: Path, repo: Path, force: bool, log=print) -> None:
    """A work-tree folder that is not a git repository (its .git gone) holds
    files the toolkit cannot account for: refuse, or move it aside."""
    if git.is_repo(repo) or not repo.exists() or not any(repo.iterdir()):
        return
    if not force:
        raise ToolkitError(
            f"{repo} exists but is not a git repository (no .git): "
            "move it aside, or rerun with --force, which moves it under "
            f"{BACKUP_DIR}/"
        )
    dest = backup_dir(root, "work-tree") / repo.name
    shutil.move(str(repo), dest)
    log(f"apply: moved {repo} (not a git repository) to {dest}")
