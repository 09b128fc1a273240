"""Drive the patched tree's runtime reference generator (``nox -s docs``).

The generator, ``tools/pre_commit/generate_runtime_reference.py``, is part of
the series (it is also the tree's ``check-architecture-reference`` pre-commit
hook); this module only runs it with the toolkit's interpreter and finds the
commit that the regenerated ``docs/design/architecture/runtime_reference.md``
belongs in. The generator reads the source with ``ast``, so no vLLM install
is needed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from serieskit import git
from serieskit.errors import ToolkitError

GENERATOR = "tools/pre_commit/generate_runtime_reference.py"
OUTPUT = "docs/design/architecture/runtime_reference.md"


def _generator(tree: Path) -> Path:
    script = tree / GENERATOR
    if not script.is_file():
        raise ToolkitError(
            f"{tree} has no {GENERATOR}: apply the series first "
            "(the reference generator comes with its first patch)"
        )
    return script


def _run(tree: Path, *args: str) -> subprocess.CompletedProcess:
    script = _generator(tree)
    return subprocess.run(
        [sys.executable, str(script), "--root", str(tree), *args],
        capture_output=True,
        text=True,
    )


def _failure(proc: subprocess.CompletedProcess) -> ToolkitError:
    err = (proc.stderr or proc.stdout or "").strip().splitlines()
    last = err[-1] if err else f"exit {proc.returncode}"
    return ToolkitError(f"{GENERATOR} failed: {last}")


def check(tree: Path) -> str | None:
    """The unified diff that would bring the reference up to date, or None
    when it is current. A missing reference is stale."""
    proc = _run(tree, "--check")
    if proc.returncode == 0:
        return None
    if proc.returncode == 1 and proc.stdout.startswith("---"):
        return proc.stdout
    raise _failure(proc)


def regenerate(tree: Path) -> bool:
    """Write the reference; return whether its content changed."""
    output = tree / OUTPUT
    before = output.read_bytes() if output.is_file() else None
    proc = _run(tree)
    if proc.returncode != 0:
        raise _failure(proc)
    return output.read_bytes() != before


def sources(tree: Path) -> list[str]:
    """The files the reference is generated from (the generator's
    ``SOURCES``, read with ast), then the generator and the reference."""
    script = _generator(tree)
    module = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    for node in module.body:
        targets = (
            node.targets if isinstance(node, ast.Assign)
            else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "SOURCES" for t in targets):
            try:
                entries = ast.literal_eval(node.value)  # type: ignore[arg-type]
            except ValueError as e:
                raise ToolkitError(f"{GENERATOR}: SOURCES is not a literal list") from e
            paths = [str(e).partition(":")[0] for e in entries]
            return list(dict.fromkeys(paths + [GENERATOR, OUTPUT]))
    raise ToolkitError(f"{GENERATOR} defines no SOURCES")


def owning_commit(tree: Path, base: str, head: str = "HEAD") -> str:
    """The last commit in ``base..head`` that touched the reference's sources
    (config files, generator or the reference itself): the commit to amend
    the regenerated reference into."""
    paths = sources(tree)
    out = git.git(tree, "log", "-1", "--format=%H", f"{base}..{head}", "--", *paths)
    commit = out.strip()
    if not commit:
        raise ToolkitError(
            f"no commit in {base}..{head} touches {', '.join(paths)}: "
            "nothing to amend the reference into"
        )
    return commit


def amend(tree: Path, base: str, log=print) -> str | None:
    """Regenerate the reference and fold it into the commit that owns it.

    Returns the commit it was folded into, or None when it was current. The
    history from that commit on is rewritten with ``rebase --autosquash``
    under the toolkit's fixed committer, as ``apply`` would make it.
    """
    if git.dirty_files(tree):
        raise ToolkitError(f"docs: {tree} has uncommitted changes: commit or stash them first")
    if not regenerate(tree):
        log(f"docs: {OUTPUT} is up to date")
        return None
    owner = owning_commit(tree, base)
    subject = git.git(tree, "log", "-1", "--format=%s", owner).strip()
    git.git(tree, "add", OUTPUT)
    git.git(tree, "commit", "-q", f"--fixup={owner}", env=_AUTHOR)
    git.git(tree, "rebase", "-q", "--autosquash", "--interactive",
            "--committer-date-is-author-date", f"{owner}~1")
    log(f"docs: regenerated {OUTPUT} and amended it into \"{subject}\"")
    return owner


_AUTHOR = {"GIT_AUTHOR_NAME": git.COMMITTER[0], "GIT_AUTHOR_EMAIL": git.COMMITTER[1]}
