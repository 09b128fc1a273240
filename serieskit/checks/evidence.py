"""The evidence the docs quote: results/*.json read once, with the pin and the series' patches.

Each results file (results/README.md) is a :class:`Run`; :class:`Evidence`
finds the newest run that holds a figure or a test file, preferring runs on
the pin's base, so a new results file replaces an older one in the docs
without an edit. :func:`fmt` writes a value in its unit the same way
everywhere, and :meth:`Run.caption` names the file and the machine's own
label, so that no figure is quoted without the machine it ran on.

A run records the blob of every file the series changed as it ran
(``series.files``); :meth:`Evidence.predates` says in words which files of
the patches a figure covers have changed since, against the blobs at the
series head read from the patch files' ``index`` lines (no applied tree
needed), by the rule the pull requests' claims follow
(:func:`serieskit.results.changed_since`).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from serieskit import results
from serieskit.errors import ToolkitError
from serieskit.series import series

RESULTS = "results"
CI_TIMINGS = "ci_timings.json"  # under results/: a copy of a real CI run's timings
COUNTS = ("passed", "failed", "skipped", "errors")


@dataclass(frozen=True)
class Run:
    """One results file."""

    path: str  # relative to the repository, e.g. "results/x.json"
    doc: dict
    pin: str | None = None  # the base the docs are on (pin.toml), read with it

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def date(self) -> str:
        return str(self.doc.get("date") or "")

    @property
    def day(self) -> str:
        return self.date[:10]

    @property
    def base(self) -> str | None:
        series = self.doc.get("series")
        return series.get("base") if isinstance(series, dict) else None

    @property
    def machine(self) -> dict:
        m = self.doc.get("machine")
        return m if isinstance(m, dict) else {}

    @property
    def gpus(self) -> int:
        return int(self.machine.get("gpus") or 0) if self.machine.get("gpu") else 0

    @property
    def figures(self) -> dict:
        f = self.doc.get("figures")
        return f if isinstance(f, dict) else {}

    def figure(self, key: str) -> dict | None:
        f = self.figures.get(key)
        return f if isinstance(f, dict) else None

    def value(self, key: str) -> object:
        f = self.figure(key)
        if f is None:
            raise ToolkitError(f"figures: {self.path} has no figure {key!r}")
        return f.get("value")

    @property
    def files(self) -> dict[str, str] | None:
        """The blob of every file the series changed as it ran (``series.files``),
        or None where the run recorded none (the seed's, or an unstamped run)."""
        series = self.doc.get("series")
        files = series.get("files") if isinstance(series, dict) else None
        return files if isinstance(files, dict) and files else None

    def tests(self, test_file: str) -> dict | None:
        files = self.doc.get("test_files")
        counts = files.get(test_file) if isinstance(files, dict) else None
        return counts if isinstance(counts, dict) else None

    def caption(self) -> str:
        """Where a figure comes from: the file, the machine's label, the
        base, torch and the day it ran."""
        m = self.machine
        parts = [
            m.get("label") or m.get("name") or "machine not recorded",
            version(self.base, self.pin),
            f"torch {m['torch']}" if m.get("torch") else None,
            self.day or None,
        ]
        return f"`{self.path}`: " + ", ".join(p for p in parts if p)


@dataclass(frozen=True)
class Patch:
    """One patch of the series: its number, Patch-Name, subject, test files and
    the files it changes."""

    number: str
    name: str
    subject: str
    tests: tuple[str, ...]
    files: frozenset[str] = frozenset()
    lines: tuple[tuple[str, int], ...] = ()  # (file, lines the patch changes in it)


def version(base: str | None, pin: str | None = None) -> str | None:
    """``vllm==0.33.0`` -> ``vLLM 0.33.0``; other bases as written. Given the
    pin, a release other than it is said to be an earlier base (history), so
    that no text made from results names another release as the present."""
    if not base:
        return None
    name = "vLLM " + base.removeprefix("vllm==") if base.startswith("vllm==") else base
    if pin and base != pin and base.startswith("vllm=="):
        return f"{name} (an earlier base)"
    return name


def _load(path: Path, root: Path, pin: str | None = None) -> Run:
    rel = str(path.relative_to(root))
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ToolkitError(f"figures: {rel} is not readable JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ToolkitError(f"figures: {rel} is not a JSON object")
    return Run(rel, doc, pin)


class Evidence:
    """The results files, the pin and the series of a repository."""

    def __init__(self, root: Path) -> None:
        self.root = root
        folder = root / RESULTS
        # Top level only: results/raw/ holds logs and per-call files behind them.
        self.pin = _pin(root)
        self.runs = [_load(p, root, self.pin) for p in sorted(folder.glob("*.json"))]
        self.patches, self.head = _patches(root)

    def named(self, name: str) -> Run:
        for run in self.runs:
            if run.name == name:
                return run
        raise ToolkitError(f"figures: {RESULTS}/{name} is missing")

    def find(self, pattern: str) -> list[Run]:
        """Runs anywhere under results/ whose path matches the glob ``pattern``."""
        return [_load(p, self.root, self.pin) for p in sorted((self.root / RESULTS).glob(pattern))]

    def gpu_runs(self) -> list[Run]:
        return [r for r in self.runs if r.gpus and r.doc.get("kind") != "external"]

    def newest(self, runs: Iterable[Run], size: Callable[[Run], int] = lambda r: 0) -> Run | None:
        """The run on the pin's base if there is one, else on any; then the
        newest; on the same date (some files record only the day) the one
        with the larger ``size`` (e.g. more tests), then by file name."""
        ordered = sorted(runs, key=lambda r: (r.base == self.pin, r.date, size(r), r.name))
        return ordered[-1] if ordered else None

    def with_figure(self, key: str, gpus: int | None = None, pin_only: bool = False) -> Run | None:
        """The newest run holding figure ``key`` (on ``gpus`` GPUs: 2 means two or more)."""
        return self.newest(
            r
            for r in self.gpu_runs()
            if r.figure(key) is not None
            and _gpus_match(r, gpus)
            and (r.base == self.pin or not pin_only)
        )

    def covering(self, test_file: str) -> list[str]:
        """The Patch-Names whose manifest entry lists ``test_file``."""
        return [p.name for p in self.patches if test_file in p.tests]

    def outdated(self, run: Run, names: Iterable[str]) -> list[results.Change] | None:
        """The files of the patches ``names`` (Patch-Names) whose blob at the
        series head is not the one ``run`` recorded; None where the run
        recorded no files (and those patches change some)."""
        wanted = set(names)
        files = {f for p in self.patches if p.name in wanted for f in p.files}
        now = {f: {self.head[f]} for f in files if f in self.head}
        if not now:
            return []
        if run.files is None:
            return None
        return results.changed_since(run.files, now)

    def predates(self, run: Run, names: Iterable[str], shown: int = 3) -> str:
        """Words for a run on an earlier version of the files of the patches
        ``names``: "" where it ran on the current version of every one,
        else "ran before the current version of `a.py`, `b.cu` and 4 other
        files" (the code first, the files the patches change most first), or
        that the files it ran on are not recorded."""
        names = list(names)
        changes = self.outdated(run, names)
        if changes is None:
            return "the files it ran on are not recorded"
        if not changes:
            return ""
        weight = self._weights(names)
        paths = sorted((c.path for c in changes), key=lambda p: weight(p))
        base = [Path(p).name for p in paths]
        named = [f"`{b if base.count(b) == 1 else p}`" for p, b in zip(paths, base, strict=True)]
        rest = len(named) - shown
        if rest <= 0:
            listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
        else:
            listed = ", ".join(named[:shown]) + f" and {rest} other file" + "s" * (rest > 1)
        return f"ran before the current version of {listed}"

    def _weights(self, names: list[str]) -> Callable[[str], tuple[int, int, str]]:
        """The order files are named in: the code first, then tests, then
        the rest (docs, build); in each, the most lines the patches change."""
        changed: dict[str, int] = {}
        for p in self.patches:
            if p.name in names:
                for path, n in p.lines:
                    changed[path] = changed.get(path, 0) + n

        def weight(path: str) -> tuple[int, int, str]:
            code = path.startswith(("vllm/", "csrc/")) and not path.endswith(".md")
            kind = 0 if code else 1 if path.startswith("tests/") else 2
            return (kind, -changed.get(path, 0), path)

        return weight

    def predates_note(self, run: Run, names: Iterable[str]) -> str:
        """:meth:`predates` as a sentence after a caption, naming the patches
        ("" where the run is current)."""
        names = list(names)
        words = self.predates(run, names)
        if not words:
            return ""
        whose = self.whose(names)
        if words.startswith("ran"):
            return f" It {words} of {whose}."
        return f" Which version of the files of {whose} it ran on is not recorded."

    def whose(self, names: Iterable[str]) -> str:
        """ "the series", "patch 0003" or "patches 0003, 0007 and 0009"."""
        names = list(names)
        if {p.name for p in self.patches} <= set(names):
            return "the series"
        which = self.numbers(names)
        return ("patch " if len(which.split()) == 1 else "patches ") + which

    def numbers(self, names: Iterable[str]) -> str:
        """Patch numbers in series order: "0003, 0007 and 0009"."""
        wanted = set(names)
        found = [p.number for p in self.patches if p.name in wanted]
        return found[0] if len(found) == 1 else ", ".join(found[:-1]) + " and " + found[-1]

    def with_tests(
        self, test_file: str, gpus: int | None = None, pin_only: bool = False
    ) -> Run | None:
        """The newest GPU run of ``test_file``; of runs on one day, the one that ran most tests."""

        def total(r: Run) -> int:
            counts = r.tests(test_file) or {}
            return sum(int(counts.get(k) or 0) for k in COUNTS)

        return self.newest(
            (
                r
                for r in self.gpu_runs()
                if r.tests(test_file) is not None
                and _gpus_match(r, gpus)
                and (r.base == self.pin or not pin_only)
            ),
            size=total,
        )


def _gpus_match(run: Run, gpus: int | None) -> bool:
    return gpus is None or (run.gpus == 1 if gpus == 1 else run.gpus >= gpus)


def _pin(root: Path) -> str:
    try:
        return "vllm==" + tomllib.loads((root / "pin.toml").read_text())["base"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise ToolkitError(f"figures: pin.toml names no [base] version ({e})") from None


def _patches(root: Path) -> tuple[list[Patch], dict[str, str | None]]:
    """patches/series in order, each with its subject (tags and all), its
    Patch-Name trailer (the file name where it has none), its manifest
    entry's test files and the files it changes; and the blob of every file
    at the series head."""
    folder = root / "patches"
    try:
        names = [n.split("#", 1)[0].strip() for n in (folder / "series").read_text().splitlines()]
        manifest = tomllib.loads((folder / "manifest.toml").read_text())
        files = [series.read_patch(folder / n) for n in names if n]
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ToolkitError(f"figures: patches/series or patches/manifest.toml: {e}") from None
    tests = {p.get("name"): tuple(p.get("tests", [])) for p in manifest.get("patch", [])}
    out = []
    for file, patch in zip((n for n in names if n), files, strict=True):
        name = patch.name or file
        out.append(
            Patch(file[:4], name, patch.subject, tests.get(name, ()), patch.files, patch.lines)
        )
    return out, series.head_blobs(files)


# --- writing values ----------------------------------------------------------------


def fmt(value: object, unit: str, signed: bool = False) -> str:
    """A value in its unit, written the same way in every block."""
    if value is None:
        return "(not recorded)"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value} {unit}".strip()
    v = float(value)
    if unit == "fraction":
        return f"{v * 100:.1f} %"
    if unit == "%":
        return f"{v:+.1f} %" if signed else f"{v:.1f} %"
    if unit in ("ms", "s"):
        return f"{_digits(v)} {unit}"
    if unit in ("ratio", "x"):
        return f"{v:.2f}" + ("x" if unit == "x" else "")
    if v.is_integer():
        return f"{int(v):,} {unit}".strip()
    return f"{v:,.1f} {unit}".strip()


def _digits(v: float) -> str:
    """Four significant digits, at most three decimals, no trailing zeros:
    0.039, 19.11, 65.66, 165.8, 1,286."""
    decimals = max(0, min(3, 3 - math.floor(math.log10(abs(v))))) if v else 0
    text = f"{v:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def duration(seconds: float) -> str:
    """``41 s``, ``2 min 23 s`` (as CI prints its stages)."""
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s"


def counts(c: dict) -> str:
    """``18 passed``, ``13 passed, 1 skipped``: the outcomes that happened."""
    words = [f"{int(c.get(k) or 0)} {k}" for k in COUNTS if c.get(k)]
    return ", ".join(words) or "none ran"


def table(head: list[str], rows: Iterable[list[str]]) -> list[str]:
    """A markdown table (a cell's ``|`` escaped)."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return out
