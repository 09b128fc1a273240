"""Every figure a text states beside a results file it cites is in that file.

A claim (a paragraph, list item or table row, outside the figures blocks and
fenced code) that cites ``results/NAME.json`` speaks for that file: each
number it gives with a unit (``0.667 ms``, ``55.9 %``, ``2.08 GB/s``,
``462.8 TFLOP/s``, ``512 tokens``, ``254 registers``, ``4.79x``) must be one
of the file's numbers at the precision written (a fraction may be written as a
percentage, seconds as ms or us). A ratio (``x``) may also be two numbers
of the claim divided, or two of the file's figures. So a text cannot keep a
figure its file has stopped holding, or state one it never held.
Numbers the claim gives without a unit (counts, dates, sizes of inputs) are
not read. In the pull requests' texts (overviews, RFC drafts) a claim that
states a measured figure (a time, a percentage, a bandwidth, a rate, a
ratio) must cite the results file it is from; ``pr --check`` and
``figures --check`` run this check. A PR text cites its files in an HTML
comment (``<!-- evidence: results/NAME.json -->``): the body sent upstream
leaves comments out (serieskit/pr/prbody.py), as the files are the series'
evidence, not the tree's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from serieskit.checks.figures import CITED, claims, documents
from serieskit.errors import ToolkitError

# A number, then a unit; thousands separated by commas.
STATED = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?\s?"
    r"(ms|us|µs|%|GB/s|TFLOP/s|tokens\b|registers\b|x\b)"
)
# How a file may hold a number written in a unit: the factors to try.
SCALES = {
    "ms": (1.0, 1e3, 1e-3),
    "us": (1.0, 1e6, 1e3),
    "µs": (1.0, 1e6, 1e3),
    "%": (1.0, 100.0),
    "GB/s": (1.0, 1e-9),
    "TFLOP/s": (1.0, 1e-12),
    "tokens": (1.0,),
    "registers": (1.0,),
    "x": (1.0,),
}


def numbers(doc: object) -> list[float]:
    """Every number in a results file (bools left out)."""
    out: list[float] = []

    def walk(v: object) -> None:
        if isinstance(v, bool):
            return
        if isinstance(v, int | float):
            out.append(float(v))
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(doc)
    return out


def figure_values(doc: dict) -> list[float]:
    """The values of a results file's ``figures``."""
    figs = doc.get("figures") or {}
    return [
        float(f["value"])
        for f in figs.values()
        if isinstance(f, dict) and isinstance(f.get("value"), int | float)
    ]


def _matches(value: float, digits: int, held: Iterable[float], scales: Iterable[float]) -> bool:
    # A change is written by its size ("41.9 % shorter" for -41.9).
    half = 0.5 * 10**-digits + 1e-9
    return any(abs(abs(v * s) - value) <= half for v in held for s in scales)


def _ratios(values: list[float]) -> list[float]:
    nonzero = [v for v in values if v]
    return [a / b for a in nonzero for b in nonzero if a is not b]


def unheld(claim: str, docs: list[dict]) -> list[str]:
    """The figures of ``claim`` that none of ``docs`` holds."""
    held = [n for d in docs for n in numbers(d)]
    stated = [
        (
            m.group(0),
            float(m.group(1).replace(",", "") + "." + (m.group(2) or "0")),
            len(m.group(2) or ""),
            m.group(3),
        )
        for m in STATED.finditer(claim)
    ]
    plain = [v for _, v, _, unit in stated if unit != "x"]
    figs = [v for d in docs for v in figure_values(d)]
    bad = []
    for text, value, digits, unit in stated:
        if _matches(value, digits, held, SCALES[unit]):
            continue
        if unit == "x" and _matches(value, digits, _ratios(plain) + _ratios(figs), (1.0,)):
            continue
        bad.append(text)
    return bad


# Units of what was measured (not of the inputs, such as tokens), the
# registers a compile gave included: in a pull request's text, a claim that
# states one cites the results file it is from.
MEASURED = ("ms", "us", "µs", "%", "GB/s", "TFLOP/s", "registers", "x")


def check_text(root: Path, path: Path, cite: bool = False) -> list[str]:
    """``path:line: ...`` for each claim of ``path`` that states a figure its
    cited results files do not hold; with ``cite``, also each claim that
    states a measured figure and cites no results file."""
    out = []
    rel = path.relative_to(root) if path.is_relative_to(root) else path
    for line, claim in claims(path.read_text()):
        names = [n for n in dict.fromkeys(CITED.findall(claim)) if (root / "results" / n).is_file()]
        if not names:
            measured = [m.group(0) for m in STATED.finditer(claim) if m.group(3) in MEASURED]
            if cite and measured:
                out.append(
                    f"{rel}:{line}: states {', '.join(f'`{x}`' for x in measured)} "
                    "without citing the results file it is from "
                    "(<!-- evidence: results/NAME.json -->)"
                )
            continue
        docs = [json.loads((root / "results" / n).read_text()) for n in names]
        for figure in unheld(claim, docs):
            out.append(f"{rel}:{line}: `{figure}` is in none of {', '.join(names)}")
    return out


def contract(root: Path, text: str, cited: Iterable[str]) -> list[str]:
    """The problems of a text that names its results files apart from it (a
    manifest's path contract: the body it goes into may not name them): a
    measured figure needs a named file, and every measured figure must be in
    one."""
    names = [n.removeprefix("results/") for n in ([cited] if isinstance(cited, str) else cited)]
    if gone := [n for n in names if not (root / "results" / n).is_file()]:
        return [f"names {', '.join(gone)}, which results/ does not hold"]
    if not names:
        measured = [m.group(0) for m in STATED.finditer(text) if m.group(3) in MEASURED]
        return (
            [
                f"states {', '.join(f'`{x}`' for x in measured)} without naming the results "
                "file it is from (evidence = [...])"
            ]
            if measured
            else []
        )
    docs = [json.loads((root / "results" / n).read_text()) for n in names]
    # The measured figures only: a contract's conditions give inputs (tokens).
    bad = [f for f in unheld(text, docs) if STATED.match(f).group(3) in MEASURED]  # type: ignore[union-attr]
    return [f"`{f}` is in none of {', '.join(names)}" for f in bad]


def check(root: Path, paths: Iterable[Path], cite: bool = False) -> list[str]:
    return [p for path in paths if path.is_file() for p in check_text(root, path, cite)]


def pr_texts(root: Path) -> list[Path]:
    """The texts the pull requests are made of: overviews and RFC drafts."""
    pr = root / "reports" / "pr"
    return [*sorted(pr.glob("*/overview.md")), *sorted(pr.glob("rfc-*.md"))]


def session(root: Path, log=print) -> None:
    """``figures --check``'s last step: README.md, docs/ and the pull
    requests' texts state only figures their cited files hold, and the pull
    requests' texts cite a file for each measured figure."""
    found = check(root, documents(root)) + check(root, pr_texts(root), cite=True)
    if found:
        raise ToolkitError(
            "figures: text states figures that no results file it cites holds:\n"
            + "\n".join(f"  {f}" for f in found)
        )
    log("figures: every figure stated beside a results file is in that file")
