"""Drive the patched tree's layering check (``nox -s lint``).

The counting lives in the series, in ``tools/pre_commit/check_layering.py``
(the tree's ``check-layering`` pre-commit hook; its docstring defines model
coupling and platform coupling). This module runs that script with ``--json``
on two trees and compares the counts, per file:
``path (model coupling 142 -> 144)``.

The rule: the lint fails only where the series raises a count, i.e. where the
series head counts more than the base tree the series is applied on.

"base reports the same": the tree's hook compares a work tree with a git ref
(``origin/main`` of a fork, or pre-commit's ``--from-ref``), which need not be
the series' base. When such a reference tree is given (``ref_root``), the
toolkit reports what the hook would report on the series head (increases of
head over ref) and runs the same comparison for the base (base over ref). An
increase of the head that the base shows as well, up to the same count
(``base count >= head count``), exists without the series: it is reported with
``; base reports the same`` and does not fail. An increase beyond the base's
count fails and shows the base's figure. Whether or not a reference tree is
given, what fails is the same: every count the head raises over the base
(returned as base -> head changes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from serieskit.errors import ToolkitError, failed
from serieskit.series.series import materialize

SCRIPT = "tools/pre_commit/check_layering.py"
KINDS = ("model", "platform")

Counts = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # "model" or "platform"
    before: int
    after: int

    @property
    def increase(self) -> bool:
        return self.after > self.before


def format(change: Change) -> str:  # noqa: A001 - the name the sessions use
    """``path (model coupling 142 -> 144)``."""
    return f"{change.path} ({change.kind} coupling {change.before} -> {change.after})"


def counts(root: Path, script: Path) -> Counts:
    """{path: {"model": n, "platform": n}} of the tree at ``root``, from
    ``script --json`` (files whose counts are both zero are absent)."""
    if not script.is_file():
        raise ToolkitError(
            f"no layering check at {script}: apply the series first (it carries {SCRIPT})"
        )
    proc = subprocess.run(
        [sys.executable, str(script), "--json", "--root", str(root)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise failed(f"{script.name} on {root}", proc)
    try:
        data = json.loads(proc.stdout)
    except ValueError as e:
        raise ToolkitError(f"{script.name} printed no JSON for {root}") from e
    return data


def _get(table: Counts, path: str, kind: str) -> int:
    return int(table.get(path, {}).get(kind, 0))


def compare(base: Counts, head: Counts) -> list[Change]:
    """Every count that differs, by path then kind (increases and decreases)."""
    changes = []
    for path in sorted(set(base) | set(head)):
        for kind in KINDS:
            before, after = _get(base, path, kind), _get(head, path, kind)
            if before != after:
                changes.append(Change(path, kind, before, after))
    return changes


def check(
    base_root: Path,
    head_root: Path,
    script: Path,
    ref_root: Path | None = None,
) -> tuple[list[Change], list[str]]:
    """(the increases that fail, the report lines). See the module docstring
    for the rule; ``script`` is the head tree's check_layering.py."""
    base = counts(base_root, script)
    head = counts(head_root, script)
    failing = [c for c in compare(base, head) if c.increase]
    if ref_root is None:
        return failing, [format(c) for c in failing]

    raised = {(c.path, c.kind): c for c in failing}
    lines = []
    for change in compare(counts(ref_root, script), head):
        if not change.increase:
            continue
        own = raised.pop((change.path, change.kind), None)
        if own is None:
            lines.append(f"{format(change)}; base reports the same")
        elif own.before != change.before:
            lines.append(f"{format(change)}; base reports {change.before} -> {own.before}")
        else:
            lines.append(format(change))
    # Raised over the base but not over the reference: still the series' own.
    lines += [format(c) for c in raised.values()]
    return failing, lines


def check_series(
    tree: Path, base: str, script: Path, declared: dict[str, str], ref: str | None = None, log=print
) -> bool:
    """check-layering of the work tree against its base commit (and ``ref``,
    see :func:`check`); an increase passes when a patch declares it
    (``declared``: path -> reason). Returns whether the check passed."""
    with tempfile.TemporaryDirectory() as tmp:
        base_root, ref_root = Path(tmp) / "base", Path(tmp) / "ref"
        materialize(tree, base, base_root, "vllm")
        if ref:
            materialize(tree, ref, ref_root, "vllm")
        increases, lines = check(base_root, tree, script, ref_root if ref else None)
    raised = {c.path for c in increases}
    for line in lines:
        path = line.split(" (", 1)[0]
        why = declared.get(path) if path in raised else None
        log(f"  {line}" + (f": declared, {why}" if why else ""))
    unexplained = [c for c in increases if c.path not in declared]
    log(f"  check-layering: {'FAILED' if unexplained else 'passed'}")
    return not unexplained
