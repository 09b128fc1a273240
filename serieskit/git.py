"""Small wrappers around git, with the settings that make its output stable."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from serieskit import killpoint
from serieskit.errors import ToolkitError, failed

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
        raise failed(f"git {args[0]}", proc)
    return (proc.stdout or b"").decode(errors="replace")


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
