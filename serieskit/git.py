"""Small wrappers around git, with the settings that make its output stable."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from serieskit import killpoint
from serieskit.errors import ToolkitError, failed, last_line

# The fixed identity of every commit the toolkit makes: the same series gives
# the same commit ids on every machine, whatever the user's git identity.
COMMITTER = ("vLLM series", "series@vllm-series.invalid")

# Settings that change what git writes; pinned so that user or system config
# cannot change a byte of the exported patches or a commit id.
STABLE_CONFIG = {
    "core.autocrlf": "false",
    "core.safecrlf": "false",
    "core.quotePath": "true",
    "core.abbrev": "12",
    "core.hooksPath": os.devnull,
    "commit.gpgSign": "false",
    "diff.algorithm": "myers",
    "diff.context": "3",
    "diff.interHunkContext": "0",
    "diff.noprefix": "false",
    "diff.mnemonicPrefix": "false",
    "diff.relative": "false",
    "diff.renames": "true",
    "diff.renameLimit": "0",
    "diff.suppressBlankEmpty": "false",
    "diff.indentHeuristic": "true",
    "diff.orderFile": os.devnull,
    "format.signature": "",
    "format.headers": "",
    "format.coverLetter": "false",
    "format.numbered": "false",
    "format.signOff": "false",
    "format.thread": "false",
    "am.keepcr": "false",
    "am.threeWay": "true",
    "apply.whitespace": "nowarn",
    "i18n.commitEncoding": "UTF-8",
    "i18n.logOutputEncoding": "UTF-8",
    "log.showSignature": "false",
    "color.ui": "false",
    "advice.detachedHead": "false",
    "rerere.enabled": "false",
    "merge.conflictStyle": "merge",
    "rebase.autoSquash": "false",
    "rebase.autoStash": "false",
    "rebase.updateRefs": "false",
    "init.defaultBranch": "main",
    "gc.auto": "0",
}

MIN_VERSION = (2, 20)  # range-diff and --committer-date-is-author-date for rebase


def git_env(extra: dict[str, str] | None = None, isolated: bool = True) -> dict[str, str]:
    """The environment of every git call: no user or system config (fetches
    excepted, which may need the user's credentials), a fixed committer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    if isolated:
        env["GIT_CONFIG_GLOBAL"] = os.devnull
    env.update(
        GIT_COMMITTER_NAME=COMMITTER[0],
        GIT_COMMITTER_EMAIL=COMMITTER[1],
        GIT_CONFIG_NOSYSTEM="1",
        GIT_TERMINAL_PROMPT="0",
        GIT_EDITOR="true",
        GIT_SEQUENCE_EDITOR="true",
        LC_ALL="C",
        LANG="C",
        TZ="UTC",
    )
    if extra:
        env.update(extra)
    return env


def _config_args() -> list[str]:
    args: list[str] = []
    for key, value in STABLE_CONFIG.items():
        args += ["-c", f"{key}={value}"]
    return args


def git(
    repo: Path | None,
    *args: str,
    check: bool = True,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    capture: bool = True,
) -> str:
    """Run git in ``repo`` with stable settings; return its stdout as text."""
    proc = run(repo, *args, input=input, env=env, capture=capture)
    if check and proc.returncode != 0:
        raise git_failed(repo, args, proc)
    return (proc.stdout or b"").decode(errors="replace")


def git_failed(repo: Path | None, args: tuple[str, ...], proc) -> ToolkitError:
    """Which git command failed, in which repository, git's own reason (where
    it gave none, what is found: a git folder that cannot be written), and
    the way on."""
    cmd = subcommand(args)
    start = args.index(cmd) if cmd in args else 0
    words = " ".join(a for a in args[start : start + 2] if not a.startswith("-"))
    what = f"git {words}" + (f" in {repo}" if repo is not None else "")
    err = str(failed(what, proc))
    if last_line(proc.stderr, "") or last_line(proc.stdout, ""):
        return ToolkitError(
            err if "run this again" in err else f"{err}; fix that, then run this again"
        )
    folder = gitdir(repo) if repo is not None and is_repo(repo) else repo
    if folder is not None and folder.exists() and not os.access(folder, os.W_OK):
        return ToolkitError(
            f"{what} failed: {folder} cannot be written (a read-only folder, or its "
            "permissions): make it writable, then run this again"
        )
    return ToolkitError(
        f"{what} failed with exit status {proc.returncode} and no reason from git: run it by "
        f"hand to see more (`git -C {repo} {words}`), fix that, then run this again"
    )


def _command(repo: Path | None, args: tuple[str, ...]) -> list[str]:
    cmd = ["git", *_config_args()]
    if repo is not None:
        cmd += ["-C", str(repo)]
    return cmd + list(args)


def run(
    repo: Path | None,
    *args: str,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
    capture: bool = True,
    isolated: bool = True,
) -> subprocess.CompletedProcess:
    """Run git; the caller reads the return code (see :func:`git`)."""
    command = subcommand(args)
    killpoint.reach(f"git-{command}")
    dies = killpoint.in_git(command)
    proc = subprocess.run(
        _command(repo, args),
        input=input,
        env=git_env(env, isolated),
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        preexec_fn=dies,
    )
    if dies:
        killpoint.fire()
    return proc


def subcommand(args: tuple[str, ...] | list[str]) -> str:
    """The git command of ``args`` (after any ``-c key=value``)."""
    i = 0
    while i < len(args) and args[i] == "-c":
        i += 2
    return args[i] if i < len(args) else ""


def popen(repo: Path | None, *args: str) -> subprocess.Popen:
    """git with a pipe to its stdin (fast-import), stable settings as above."""
    killpoint.reach(f"git-{subcommand(args)}")
    return subprocess.Popen(
        _command(repo, args), stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=git_env()
    )


def version() -> tuple[int, int]:
    if shutil.which("git") is None:
        raise ToolkitError("git is not installed (need git >= 2.20)")
    out = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+)\.(\d+)", out)
    if not m:
        raise ToolkitError(f"cannot read the git version from {out.strip()!r}")
    return int(m.group(1)), int(m.group(2))


def require_version() -> None:
    have = version()
    if have < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        raise ToolkitError(
            f"git {have[0]}.{have[1]} is too old: range-diff and reproducible "
            f"rebases need git >= {need}"
        )


def rev(repo: Path, ref: str) -> str | None:
    proc = run(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    return proc.stdout.decode().strip() or None if proc.returncode == 0 else None


def is_repo(path: Path) -> bool:
    return (path / ".git").exists()


def dirty_files(repo: Path) -> list[str]:
    """Uncommitted changes and untracked files, as `git status --short` lines."""
    out = git(repo, "status", "--porcelain=v1", "--untracked-files=all")
    return [line for line in out.splitlines() if line.strip()]


def commits(repo: Path, rng: str) -> list[tuple[str, str]]:
    """(id, subject) of the commits in ``rng``, oldest first."""
    out = git(repo, "log", "--reverse", "--format=%H %s", rng)
    return [tuple(line.split(" ", 1)) for line in out.splitlines() if line]  # type: ignore[misc]


def gitdir(repo: Path) -> Path:
    return Path(git(repo, "rev-parse", "--absolute-git-dir").strip())


def operation_in_progress(repo: Path) -> str | None:
    """Which of am / rebase / merge / cherry-pick is stopped in ``repo``."""
    path = gitdir(repo)
    if (path / "rebase-apply").exists():
        # Marked "rebasing" by a rebase, "applying" by an am, each only once
        # set up: an unmarked folder is one killed in its setup (nothing
        # applied yet), which `git am --abort` removes.
        return "rebase" if (path / "rebase-apply" / "rebasing").exists() else "am"
    if (path / "rebase-merge").exists():
        return "rebase"
    for name, op in (
        ("MERGE_HEAD", "merge"),
        ("CHERRY_PICK_HEAD", "cherry-pick"),
        ("REVERT_HEAD", "revert"),
    ):
        if (path / name).exists():
            return op
    return None


def branch(repo: Path) -> str | None:
    """The branch HEAD is on, or None when it is detached."""
    proc = run(repo, "symbolic-ref", "--quiet", "--short", "HEAD")
    return proc.stdout.decode().strip() or None if proc.returncode == 0 else None


def commit_subject(repo: Path, commit: str) -> str:
    return git(repo, "log", "-1", "--format=%s", commit).strip()


def changed_files(repo: Path, commit: str) -> list[str]:
    """The paths ``commit`` touches against its parent (renames as both)."""
    out = git(repo, "diff-tree", "--no-commit-id", "--name-status", "-r", "-M", commit)
    return sorted({p for line in out.splitlines() for p in line.split("\t")[1:]})


# --- what a killed git leaves ----------------------------------------------------

# Lock files git takes in a repository (a killed git leaves them behind).
_LOCKS = ("index.lock", "HEAD.lock", "ORIG_HEAD.lock", "packed-refs.lock", "config.lock")


def lock_files(repo: Path) -> list[Path]:
    """The lock files in ``repo``'s git folder and those of its worktrees."""
    root = gitdir(repo)
    found = [root / name for name in _LOCKS if (root / name).exists()]
    found += sorted((root / "refs").rglob("*.lock"))
    for wt in sorted((root / "worktrees").glob("*")) if (root / "worktrees").is_dir() else []:
        found += [wt / name for name in _LOCKS if (wt / name).exists()]
    return found


def processes_in(repo: Path) -> list[int] | None:
    """The git processes running in ``repo`` (their working folder in it or in
    one of its worktrees, or the repository on their command line); None
    where the system does not tell (no /proc)."""
    proc = Path("/proc")
    if not (proc / "self" / "cwd").exists():
        return None
    places = [repo.resolve(), *_worktree_paths(repo)]
    named = [str(p).encode() for p in places]
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if not (entry / "comm").read_text().startswith("git"):
                continue
            cwd = Path(os.readlink(entry / "cwd"))
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        if any(cwd == p or p in cwd.parents for p in places) or any(n in cmdline for n in named):
            found.append(int(entry.name))
    return sorted(found)


def _worktree_paths(repo: Path) -> list[Path]:
    folder = gitdir(repo) / "worktrees"
    paths = []
    for link in folder.glob("*/gitdir") if folder.is_dir() else []:
        with contextlib.suppress(OSError):
            paths.append(Path(link.read_text().strip()).parent.resolve())
    return paths


def drop_worktree(repo: Path, path: Path) -> bool:
    """Remove the worktree ``path`` of ``repo`` and its registration, even one
    a killed ``git worktree add`` left locked; True when there was one."""
    listed = set(git(repo, "worktree", "list", "--porcelain", check=False).splitlines())
    known = any(f"worktree {p}" in listed for p in {str(path), str(path.resolve())})
    run(repo, "worktree", "unlock", str(path))
    run(repo, "worktree", "remove", "--force", "--force", str(path))
    run(repo, "worktree", "prune")
    shutil.rmtree(path, ignore_errors=True)
    return known


def detached_worktree(repo: Path, dest: Path, commit: str) -> Path:
    """A detached worktree of ``repo`` at ``commit``, made or moved there."""
    if not (dest / ".git").exists():
        drop_worktree(repo, dest)  # one a killed session left, locked or not
        dest.parent.mkdir(parents=True, exist_ok=True)
        git(repo, "worktree", "add", "--force", "--detach", str(dest), commit)
    else:
        git(dest, "checkout", "--quiet", "--force", "--detach", commit)
        git(dest, "clean", "-fdq")
    return dest


def reason(proc: subprocess.CompletedProcess) -> str:
    """Every ``error:`` / ``fatal:`` line git printed, else its last line: the
    whole of its reason (its last line alone often hides it)."""
    text = "\n".join((out or b"").decode(errors="replace") for out in (proc.stderr, proc.stdout))
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip().lower().startswith(("error:", "fatal:"))
    ]
    lines = [line.split(":", 1)[1].strip() for line in dict.fromkeys(lines)]
    if lines:
        return "; ".join(lines)
    return last_line(proc.stderr) if proc.stderr else last_line(proc.stdout, "no output")


# How many differing files are read to see whether a killed write cut them,
# where the tree may also hold the user's edits (HEAD born).
_CUT_MAX = 64


def paths_as_in(repo: Path, commit: str, paths: list[str], every: bool = False) -> set[str]:
    """Those of ``paths`` whose file in the work tree is as in ``commit``
    (absent where the commit has none), or the start of it (a file a kill or
    a full disk cut as it was written): what a checkout of ``commit`` that
    was cut short wrote, not anyone's edit. A kill cuts one file, a full disk
    every one after it: ``every`` reads each differing file, not the first
    64 (where no edit of the user's can be among them)."""
    if not paths:
        return set()
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", commit, env=env)
        run(repo, "update-index", "-q", "--refresh", env=env)
        differ = set(git(repo, "diff-files", "--name-only", "-z", env=env).split("\0"))
        others = git(repo, "ls-files", "-o", "--exclude-standard", "-z", env=env).split("\0")
    same = set(paths) - differ - set(others)
    rest = [p for p in paths if p not in same and p in differ][: None if every else _CUT_MAX]
    blobs = _blobs(repo, commit, rest)
    return same | {p for p in rest if _cut_from(repo / p, blobs.get(p))}


def _blobs(repo: Path, commit: str, paths: list[str]) -> dict[str, bytes]:
    """The content of each of ``paths`` in ``commit`` (one git for all of them)."""
    if not paths:
        return {}
    out = run(repo, "cat-file", "--batch", input="".join(f"{commit}:{p}\n" for p in paths).encode())
    data, found, at = out.stdout, {}, 0
    for path in paths:
        end = data.index(b"\n", at)
        header = data[at:end].split()
        at = end + 1
        if len(header) == 3 and header[1] == b"blob":
            size = int(header[2])
            found[path] = data[at : at + size]
            at += size + 1
        elif len(header) == 3:  # a tree or a link target's object: not a file
            at += int(header[2]) + 1
    return found


def _cut_from(file: Path, blob: bytes | None) -> bool:
    """``file`` is a strict prefix of ``blob`` (an empty file included): a
    write of it that a kill or a full disk stopped."""
    if blob is None or file.is_symlink() or not file.is_file():
        return False
    have = file.read_bytes()
    return len(have) < len(blob) and blob.startswith(have)


def applied_tree(repo: Path, commit: str, patch: Path) -> str | None:
    """The tree of ``commit`` with ``patch`` applied, as ``git am`` stages it
    (without its three-way fallback); None where it does not apply so."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", commit, env=env)
        if run(repo, "apply", "--cached", str(patch), env=env).returncode != 0:
            return None
        return git(repo, "write-tree", env=env).strip()


def patch_id(repo: Path, mail: bytes) -> str:
    """``git patch-id --stable`` of a patch or a mail ("" for none): the same
    for the same change, whatever its message."""
    out = git(repo, "patch-id", "--stable", input=mail).split()
    return out[0] if out else ""


def staged_against(repo: Path, tree: str) -> set[str]:
    """The paths whose entry in the index differs from ``tree``'s."""
    out = git(repo, "diff-index", "--cached", "--name-only", "-z", tree)
    return {p for p in out.split("\0") if p}


def changed_paths(repo: Path) -> list[str]:
    """Every path that differs from HEAD in the index or the work tree, and
    every untracked file (renames as both paths)."""
    out = git(repo, "status", "--porcelain=v1", "-z", "--no-renames", "--untracked-files=all")
    return [entry[3:] for entry in out.split("\0") if len(entry) > 3]


def sent_bytes(root: Path) -> int:
    """What a device call sends of the repository at ``root`` besides its
    carried paths: the tracked files and the untracked ones git does not
    ignore."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paths = (root / p for p in listed.split("\0") if p)
    return sum(p.lstat().st_size for p in paths if p.is_file() or p.is_symlink())
