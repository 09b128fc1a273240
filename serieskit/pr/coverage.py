"""Line coverage of a pull request's changed lines, from coverage.py JSON reports.

One report per machine (``.work/pr/coverage/<machine>.json``: ``nox -s test
-- --coverage`` on the CPU, gpu/run_tests.py with COVERAGE=1 on the GPU
machine); a report measured at another commit speaks for a file only where
that file's lines map onto it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from serieskit import git
from serieskit.pr import duplicates
from serieskit.pr.groups import head_blobs
from serieskit.pr.markdown import table
from serieskit.state import WORK


def _ranges(lines: list[int]) -> str:
    out: list[str] = []
    for n in sorted(lines):
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = out[-1].split("-")[0] + f"-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def _diff(tree: Path, lower: str, head: str) -> dict:
    return duplicates.parse_diff(git.git(tree, "diff", "-U0", "--no-color", lower, head))


def changed_lines(tree: Path, lower: str, head: str) -> dict[str, set[int]]:
    """Lines the PR's own commits add, per Python file outside tests/."""
    return {
        p: {n for lo, hi in fd.new for n in range(lo, hi + 1)}
        for p, fd in _diff(tree, lower, head).items()
        if p.endswith(".py") and not p.startswith("tests/")
    }


def not_python(tree: Path, lower: str, head: str) -> list[str]:
    """Changed code files coverage.py cannot see (kernels, bindings, build)."""
    return sorted(
        p
        for p in _diff(tree, lower, head)
        if not p.endswith((".py", ".md")) and not p.startswith(("tests/", "docs/"))
    )


def _by_path(report: dict, tree: Path) -> dict[str, dict]:
    """The report's files by path in the tree (absolute or relative names)."""
    out = {}
    for name, data in report.get("files", {}).items():
        full = Path(name).resolve()
        inside = Path(name).is_absolute() and full.is_relative_to(tree.resolve())
        out[str(full.relative_to(tree.resolve())) if inside else name] = data
    return out


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def line_map(tree: Path, head: str, ran: str, path: str) -> dict[int, int | None]:
    """``path``'s lines at ``head`` -> its line at ``ran`` (the commit a
    coverage run measured; None: a line that ``head..ran`` changes), for
    the lines up to the end of the file at ``head``."""
    diff = git.git(tree, "diff", "-U0", "--no-color", head, ran, "--", path)
    found = [m.groups() for m in map(_HUNK.match, diff.splitlines()) if m]
    hunks = [(int(o), int(oc or 1), int(nc or 1)) for o, oc, _, nc in found]
    size = len(git.git(tree, "show", f"{head}:{path}").splitlines())
    out: dict[int, int | None] = {}
    for x in range(1, size + 1):
        delta: int | None = 0
        for o, oc, nc in hunks:
            if oc and o <= x < o + oc:
                delta = None  # changed after head
                break
            if x < (o + oc if oc else o + 1):
                break
            delta = (delta or 0) + nc - oc
        out[x] = None if delta is None else x + delta
    return out


def _measured_at(
    tree: Path, report: dict, path: str, head: str, blob: str | None
) -> tuple[dict[int, int | None] | None, str | None]:
    """(head line -> the report's line, None when identical; why the report
    cannot speak for the file's lines at ``head``, or None)."""
    series = report.get("series")
    if not isinstance(series, dict):
        return None, "the report names no series"
    ran_blob = (series.get("files") or {}).get(path)
    commit = series.get("commit")
    if ran_blob is None or ran_blob == blob:
        return None, None
    if (
        commit
        and git.run(tree, "cat-file", "-e", f"{commit}:{path}").returncode == 0
        and git.git(tree, "rev-parse", f"{commit}:{path}").strip() == ran_blob
    ):
        return line_map(tree, head, commit, path), None
    return None, f"measured before the last change of this file (at {str(commit)[:12]})"


def _coverage_row(
    path: str,
    machine: str,
    data: dict | None,
    lines: set[int],
    stale: str | None,
    mapping: dict[int, int | None] | None,
) -> list[str]:
    if data is None:
        return [
            f"`{path}`",
            machine,
            "",
            "not imported by any test" + (f" ({stale})" if stale else ""),
            "",
        ]
    later = {n for n in lines if mapping and mapping.get(n) is None}
    at = {n: (mapping.get(n) if mapping else n) for n in lines - later}
    ran = set(data.get("executed_lines", []))
    missed = set(data.get("missing_lines", []))
    executable = {n for n, m in at.items() if m in ran or m in missed}
    missing = sorted(n for n in executable if at[n] in missed)
    tests = sorted(
        {
            c
            for n in executable - set(missing)
            for c in data.get("contexts", {}).get(str(at[n]), [])
            if c
        }
    )
    notes = [
        x
        for x in (
            stale,
            f"{len(later)} changed again by a later PR, not measured" if later else None,
        )
        if x
    ]
    none = "none" if executable else "none (no executable line changed)"
    return [
        f"`{path}`",
        machine,
        f"{len(executable) - len(missing)} / {len(executable)}",
        (_ranges(missing) or none) + (f" ({'; '.join(notes)})" if notes else ""),
        ", ".join(tests[:3]) + (f" and {len(tests) - 3} more" if len(tests) > 3 else ""),
    ]


def line_coverage(root: Path, tree: Path, lower: str, head: str) -> str:
    """Changed lines against coverage.py JSON reports (``coverage json
    --show-contexts``), one per machine, in .work/pr/coverage/<machine>.json
    (``nox -s test -- --coverage``; the GPU machine's gpu/run_tests.py with
    COVERAGE=1)."""

    folder = root / WORK / "pr" / "coverage"
    reports = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not reports:
        return ""  # nothing measured: the body claims no line as executed
    changed = changed_lines(tree, lower, head)
    blobs = head_blobs(tree, [head], sorted(changed))
    rows = []
    for report in reports:
        data = json.loads(report.read_text())
        by_path = _by_path(data, tree)
        for path, lines in sorted(changed.items()):
            mapping, stale = _measured_at(tree, data, path, head, next(iter(blobs[path])))
            rows.append(_coverage_row(path, report.stem, by_path.get(path), lines, stale, mapping))
    notes = []
    if all(r.stem.startswith("cpu") for r in reports):
        notes.append(
            "No coverage data from a GPU machine: lines that only the GPU tests "
            "reach are listed as not executed above."
        )
    if other := not_python(tree, lower, head):
        notes.append(
            "Not measured (coverage.py sees Python only): "
            + ", ".join(f"`{p}`" for p in other)
            + "."
        )
    return (
        "Line coverage of the changed Python lines (coverage.py with test contexts, per "
        "machine; a line counts as executed when a test of that machine ran it):\n\n"
        + table(
            [
                "file",
                "machine",
                "changed lines executed",
                "changed lines no test executed",
                "tests (contexts)",
            ],
            rows,
        )
        + "".join(f"\n\n{n}" for n in notes)
    )
