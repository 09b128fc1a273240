"""Whether each pull request applies on upstream ``main``, not only on its release.

The pull requests target the pinned release; their bodies also say whether
the branch applies on a snapshot of upstream ``main``. ``--upstream SRC``
names that snapshot: a local clone or mirror of vllm-project/vllm (or any
git URL git can fetch), ``--upstream-ref`` its ref (default ``HEAD``). Its
commit is fetched into the work tree as ``refs/series/upstream/main`` and
each branch's commits from the base (a stacked branch's lower commits
included) are replayed there with ``git am -3`` in a scratch worktree:
applies cleanly, applies through a three-way merge, or conflicts (the
files). The blobs of the release's files are in upstream's history, so the
three-way merge finds its base there. Nothing is committed anywhere.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from serieskit import git
from serieskit.errors import ToolkitError

REF = "refs/series/upstream/main"


@dataclass
class OnMain:
    commit: str
    date: str  # committer date of the snapshot, YYYY-MM-DD
    applies: bool
    three_way: bool = False
    conflicts: list[str] = field(default_factory=list)
    source: str = ""

    def words(self) -> str:
        where = f"upstream `main` at `{self.commit[:12]}` (committed {self.date})"
        if self.applies and not self.three_way:
            return f"It applies cleanly on {where}."
        if self.applies:
            return f"It applies on {where} through a three-way merge, without conflicts."
        files = ", ".join(f"`{f}`" for f in self.conflicts) or "files git did not name"
        return f"It does not apply on {where}: conflicts in {files}; it will be rebased."


def fetch(tree: Path, source: str, ref: str = "HEAD") -> tuple[str, str]:
    """(commit, its committer date) of ``ref`` in ``source``, fetched into the work tree."""
    proc = git.run(tree, "fetch", "--no-tags", "--quiet", source, f"+{ref}:{REF}", isolated=False)
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise ToolkitError(f"--upstream {source}: git fetch failed: {' '.join(tail)}")
    commit = git.git(tree, "rev-parse", f"{REF}^{{commit}}").strip()
    date = git.git(tree, "log", "-1", "--format=%cs", commit).strip()
    return commit, date


def check(tree: Path, scratch: Path, commit: str, date: str, base: str, head: str) -> OnMain:
    """Replay ``base..head`` on ``commit`` with ``git am -3`` in ``scratch``."""
    git.run(tree, "worktree", "remove", "--force", str(scratch))
    shutil.rmtree(scratch, ignore_errors=True)
    git.git(tree, "worktree", "add", "--detach", str(scratch), commit)
    try:
        mbox = git.git(tree, "format-patch", "--stdout", "--no-signature", f"{base}..{head}")
        proc = git.run(scratch, "am", "-3", "--no-gpg-sign", input=mbox.encode())
        said = (proc.stdout + proc.stderr).decode(errors="replace")
        if proc.returncode == 0:
            return OnMain(commit, date, True, "3-way merge" in said)
        unmerged = git.git(scratch, "diff", "--name-only", "--diff-filter=U").split()
        failed = [
            line.split("patch failed: ", 1)[1].rsplit(":", 1)[0]
            for line in said.splitlines()
            if "patch failed: " in line
        ]
        git.run(scratch, "am", "--abort")
        return OnMain(commit, date, False, True, sorted(set(unmerged or failed)))
    finally:
        git.run(tree, "worktree", "remove", "--force", str(scratch))
        git.run(tree, "worktree", "prune")
