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
from serieskit.errors import ToolkitError, failed
from serieskit.series import export, safety, series, target
from serieskit.series.target import Target
from serieskit.state import State

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
    return failed(GENERATOR, proc)


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
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "SOURCES" for t in targets):
            try:
                entries = ast.literal_eval(value)
            except ValueError as e:
                raise ToolkitError(f"{GENERATOR}: SOURCES is not a literal list") from e
            paths = [str(e).partition(":")[0] for e in entries]
            return list(dict.fromkeys(paths + [GENERATOR, OUTPUT]))
    raise ToolkitError(f"{GENERATOR} defines no SOURCES")


def stale_commits(tree: Path, base: str, head: str = "HEAD") -> list[str]:
    """The commits of ``base..head`` that touch the reference's sources: each
    must carry the reference of its own config state."""
    out = git.git(tree, "log", "--reverse", "--format=%H", f"{base}..{head}", "--", *sources(tree))
    return out.split()


def amend(tree: Path, base: str, log=print) -> list[str]:
    """Regenerate the reference at every commit that touches its sources and
    amend it there, so each patch carries the reference of its own fields.

    Returns the subjects of the commits that changed. The history from the
    first such commit on is replayed with ``rebase --exec``; only the
    reference changes, so a conflict can only be in it, and the regeneration
    that follows resolves it.
    """
    if git.dirty_files(tree):
        raise ToolkitError(f"docs: {tree} has uncommitted changes: commit or stash them first")
    commits = stale_commits(tree, base)
    if not commits:
        log("docs: no patch touches the reference's sources")
        return []

    def subject(c: str) -> str:
        return git.git(tree, "log", "-1", "--format=%s", c).strip()

    def tree_of(c: str) -> str:
        return git.git(tree, "rev-parse", f"{c}^{{tree}}").strip()

    # By subject: a commit that did not touch the reference may come to (its
    # regenerated reference differs from its parent's), so the lists differ.
    before = {subject(c): tree_of(c) for c in commits}
    script = (
        f"{sys.executable} {GENERATOR} --root . && git add {OUTPUT} && "
        "(git diff --cached --quiet || git commit -q --amend --no-edit --no-verify)"
    )
    proc = git.run(
        tree,
        "rebase",
        "-q",
        "--committer-date-is-author-date",
        "-X",
        "theirs",
        "--exec",
        script,
        f"{commits[0]}~1",
    )
    if proc.returncode != 0:
        git.run(tree, "rebase", "--abort")
        raise failed("docs: regenerating along the series", proc)
    after = stale_commits(tree, base)
    changed = [subject(c) for c in after if before.get(subject(c)) != tree_of(c)]
    for name in changed:
        log(f'docs: regenerated {OUTPUT} in "{name}"')
    if not changed:
        log(f"docs: {OUTPUT} is current at every patch")
    return changed


def session(where: Path | Target, check_only: bool = False, log=print) -> None:
    """``nox -s docs``: check the reference, or regenerate it into its patches
    and export them. Writing the patch folder needs what export needs (a
    complete series on the target's base): refused before any commit is rewritten."""
    t = target.of(where)
    tree = series.applied_tree(t)
    if check_only:
        diff = check(tree)
        if diff:
            log(diff)
            raise ToolkitError(f"{OUTPUT} is stale: run `{t.cmd('docs')}`")
        log(f"docs: {OUTPUT} is up to date")
        return
    safety.clear_stale_locks(tree, "docs", log)
    _undo_interrupted(tree, log)
    state = State.load(t)
    export.require_exportable(t, state)
    assert state.base
    # Where the series was before docs rewrote it (this run's, or that of one
    # interrupted after its rewrite): named while docs runs, so that a rerun
    # finishes what a killed one began.
    start = git.rev(tree, DOCS_FROM) or git.rev(tree, "HEAD")
    assert start
    git.git(tree, "update-ref", DOCS_FROM, start)
    try:
        amend(tree, state.base, log=log)
    except ToolkitError:
        if git.rev(tree, "HEAD") == start:  # refused, or undone: nothing to finish
            git.git(tree, "update-ref", "-d", DOCS_FROM)
        raise
    if git.rev(tree, "HEAD") != start:
        log(
            f"docs: the series before regeneration is kept as "
            f"{safety.backup_ref(tree, start, 'docs')}"
        )
        export.export(t, log=log)
    git.git(tree, "update-ref", "-d", DOCS_FROM)


# Set while docs rewrites the series: the commit it started from.
DOCS_FROM = "refs/series/docs-from"


def _undo_interrupted(tree: Path, log) -> None:
    """A docs killed inside its rebase left that rebase in the work tree: undo
    it (what a killed step left in the tree goes to a stash), so that this
    run does the rewrite again. A rebase that docs did not start, or staged
    changes its step did not make, are the user's: they stop it."""
    start = git.rev(tree, DOCS_FROM)
    if not start or git.operation_in_progress(tree) is None:
        return
    merge = git.gitdir(tree) / "rebase-merge"
    orig = merge / "orig-head"
    ours = orig.is_file() and orig.read_text().strip() == start
    # A step of it stages the commit it replays, and the reference it regenerates.
    done = (merge / "done").read_text().splitlines() if (merge / "done").is_file() else []
    picks = [line.split()[1] for line in done if line.startswith("pick ")]
    picked = git.rev(tree, picks[-1]) if picks else None
    made = (picked,) if picked else ()
    safety.check_left_by(tree, "docs", made, op="rebase", ours=ours, own=(OUTPUT,))
    if git.dirty_files(tree):
        kept = safety.stash(tree, "docs: what an interrupted docs left")
        log(f"docs: stashed what the interrupted docs left in {tree} as {kept}")
    if git.run(tree, "rebase", "--abort").returncode != 0:
        git.git(tree, "rebase", "--quit")
    git.git(tree, "checkout", "-q", "-B", series.BRANCH, start)
    log(f"docs: an earlier docs was interrupted as it rewrote the series; back at {start[:12]}")
