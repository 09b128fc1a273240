"""The figures of README.md and docs/: marked blocks rewritten from results/, checked in CI.

A block is the text between ``<!-- figures:NAME -->`` and
``<!-- /figures:NAME -->`` on lines of their own; NAME is one of
:data:`serieskit.checks.blocks.BLOCKS`. ``python -m serieskit figures``
rewrites every block of README.md and docs/**/*.md from the results files;
``--check`` writes nothing and fails with a unified diff where a block is
stale, so no figure in the docs can drift from its file; it also fails where
text outside the blocks (README.md, docs/, the pull requests' bodies) cites a
one-GPU results file that ran before the current version of the files it
covers without saying so (:func:`stale_citations`). ``--record-ci``
copies a complete CI run's stage durations (``.work/ci/timings.json``,
written by ``nox -s ci``) to ``results/ci_timings.json`` with the results
header, for the timing blocks. ``--record-timing DIR`` does the same for a
README command timed by ``ci/time-command.sh`` on a machine shared with
other work (its load sampled through the run), and its disk use.
"""

from __future__ import annotations

import difflib
import json
import os
import platform
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

from serieskit import results
from serieskit.checks import benchmarks, pipeline
from serieskit.checks.blocks import BLOCKS
from serieskit.checks.evidence import CI_TIMINGS, RESULTS, Evidence, Run, duration
from serieskit.errors import ToolkitError
from serieskit.state import WORK

OPEN = re.compile(r"^<!-- figures:([\w-]+) -->$")
CLOSE = "<!-- /figures:{} -->"
ANY_MARK = re.compile(r"^<!-- /?figures:([\w-]*)")


def documents(root: Path) -> list[Path]:
    """README.md and every page under docs/."""
    docs = sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else []
    return [p for p in [root / "README.md", *docs] if p.is_file()]


def blocks_in(text: str, where: str) -> list[tuple[str, int, int]]:
    """Each block as (NAME, line of its opening mark, line of its closing
    mark), 0-based; a mark without its pair or an unknown NAME is an error."""
    lines = text.split("\n")
    found, i = [], 0
    while i < len(lines):
        line = lines[i].strip()
        m = OPEN.match(line)
        if not m:
            if ANY_MARK.match(line):
                raise ToolkitError(f"figures: {where}:{i + 1}: {line!r} closes no open block")
            i += 1
            continue
        name = m.group(1)
        if name not in BLOCKS:
            known = ", ".join(sorted(BLOCKS))
            raise ToolkitError(
                f"figures: {where}:{i + 1}: no block is named {name!r} (known: {known})"
            )
        end = next((j for j in range(i + 1, len(lines)) if ANY_MARK.match(lines[j].strip())), None)
        if end is None or lines[end].strip() != CLOSE.format(name):
            raise ToolkitError(
                f"figures: {where}:{i + 1}: block {name!r} is not closed by {CLOSE.format(name)!r} "
                "before the next mark"
            )
        found.append((name, i, end))
        i = end + 1
    return found


def rewrite(text: str, where: str, render: Callable[[str], str]) -> str:
    """``text`` with every block's body replaced by ``render(NAME)``, set off
    by blank lines so that markdown sees a table as a table."""
    lines = text.split("\n")
    out, last = [], 0
    for name, start, end in blocks_in(text, where):
        out += lines[last : start + 1] + ["", render(name).strip("\n"), ""] + [lines[end]]
        last = end + 1
    return "\n".join(out + lines[last:])


def generate(root: Path) -> dict[Path, tuple[str, str]]:
    """Per document: (its text now, its text with fresh blocks). Each block
    is made once, however many pages show it."""
    evidence: list[Evidence] = []
    made: dict[str, str] = {}

    def render(name: str) -> str:
        if name not in made:
            if not evidence:
                evidence.append(Evidence(root))
            made[name] = BLOCKS[name](evidence[0])
        return made[name]

    out = {}
    for path in documents(root):
        old = path.read_text()
        out[path] = (old, rewrite(old, str(path.relative_to(root)), render))
    return out


def check(root: Path) -> str | None:
    """The unified diff of every stale block, or None when all are current."""
    diff: list[str] = []
    for path, (old, new) in generate(root).items():
        rel = str(path.relative_to(root))
        diff += difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
        )
    return "".join(diff) or None


def update(root: Path, log: Callable[[str], object] = print) -> list[Path]:
    """Rewrite the documents whose blocks are stale; the ones changed."""
    changed = []
    for path, (old, new) in generate(root).items():
        if new != old:
            path.write_text(new)
            changed.append(path)
            log(f"figures: rewrote {path.relative_to(root)}")
    if not changed:
        log("figures: every block is current")
    return changed


# --- text that cites a results file -------------------------------------------------

CITED = re.compile(r"(?<![\w.-])([\w.-]+\.json)\b")
# Words that say a cited run is earlier evidence: the figures generator's
# own ("It ran before the current version of ..."), or a label put there.
EARLIER = re.compile(
    r"ran before the current version|earlier (?:evidence|version|revision|run)|"
    r"before the current (?:version|code)|predates",
    re.IGNORECASE,
)
# A results file's patches by its name, where its kind does not say (benchmarks).
COVERED_BY_NAME = {
    "bench_prefill_": benchmarks.TURING,
    "paged_prefill_": benchmarks.TURING,
    "sm75_static_": benchmarks.TURING,
    "nvfp4_": benchmarks.NVFP4,
    "sm7x_static_nvfp4": benchmarks.NVFP4,
    "bench_host_reduce": benchmarks.HOST_REDUCE,
    "host_reduce": benchmarks.HOST_REDUCE,
}


def covered(ev: Evidence, run: Run) -> list[str]:
    """The patches (Patch-Names) a results file speaks for: those listing its
    test files; a benchmark's by its name; the whole series for the rest (the
    smoke and serve runs, and any file this cannot place)."""
    every = [p.name for p in ev.patches]
    tests = [t for t in run.doc.get("test_files") or {} if t.startswith("tests/")]
    if tests and len(tests) == len(run.doc.get("test_files") or {}):
        listing = {n for t in tests for n in ev.covering(t)}
        return [n for n in every if n in listing] or every
    for prefix, names in COVERED_BY_NAME.items():
        if run.name.startswith(prefix) and run.doc.get("kind") != "tests":
            return names
    return every


def claims(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each claim outside the figures blocks and the
    fenced code (commands name the files they write): a paragraph, a list
    item or a table row."""
    skip = {i for _, a, b in blocks_in(text, "") for i in range(a, b + 1)}
    out: list[tuple[int, list[str]]] = []
    new, fenced = True, False
    for i, line in enumerate(text.split("\n")):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        if i in skip or fenced or not stripped or stripped.startswith("```"):
            new = True
            continue
        if new or re.match(r"^(\||[-*+] |\d+\. )", stripped):
            out.append((i + 1, []))
        out[-1][1].append(line)
        new = False
    return [(n, "\n".join(lines)) for n, lines in out]


def stale_citations(root: Path, ev: Evidence | None = None) -> list[str]:
    """Each claim of README.md, docs/ and reports/pr/*/body.md that cites a
    one-GPU results file which ran before the current version of files it
    covers (a pull request's body: its own patches), unless the claim says
    it is earlier evidence."""
    ev = ev or Evidence(root)
    one_gpu = {r.name: r for r in ev.gpu_runs() if r.gpus == 1}
    groups = _pr_groups(root)
    found = []
    bodies = sorted((root / "reports" / "pr").glob("*/body.md"))
    for path in [*documents(root), *bodies]:
        rel = str(path.relative_to(root))
        names = groups.get(path.parent.name) if path.name == "body.md" else None
        for line, claim in claims(path.read_text()):
            cited = [n for n in dict.fromkeys(CITED.findall(claim)) if n in one_gpu]
            if not cited or EARLIER.search(claim):
                continue
            for name in cited:
                run = one_gpu[name]
                words = ev.predates(run, names or covered(ev, run))
                if words:
                    found.append(
                        f"{rel}:{line}: cites `{name}`, which {words}: say it is earlier "
                        'evidence (e.g. "It ran before the current version of ..."), or '
                        "cite a run of the current version (nox -s evidence)"
                    )
    return found


def _pr_groups(root: Path) -> dict[str, list[str]]:
    """Each pull request's Patch-Names (patches/manifest.toml ``[[pr]]``)."""
    try:
        manifest = tomllib.loads((root / "patches" / "manifest.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    return {g["name"]: list(g.get("patches", [])) for g in manifest.get("pr", []) if "name" in g}


# --- CI's own timing ----------------------------------------------------------------


def record_ci(root: Path, log: Callable[[str], object] = print) -> Path:
    """results/ci_timings.json from the last complete ``nox -s ci`` here."""
    source = root / WORK / pipeline.TIMINGS
    try:
        timings = json.loads(source.read_text())
    except FileNotFoundError:
        raise ToolkitError(
            f"figures: no {WORK}/{pipeline.TIMINGS}: run `nox -s ci` first (on a clean clone)"
        ) from None
    except json.JSONDecodeError as e:
        raise ToolkitError(f"figures: {WORK}/{pipeline.TIMINGS} is not JSON: {e}") from None
    if not timings.get("complete"):
        failed = [s.get("name") for s in timings.get("stages", []) if not s.get("ok")]
        why = f"stage {failed[0]!r} failed" if failed else "not every stage ran"
        raise ToolkitError(
            f"figures: the last CI run did not complete ({why}): the timing of part of a run "
            "would understate it; run `nox -s ci` to the end first"
        )
    cores = os.cpu_count() or 0
    machine = results.machine_block([], None, None, None)
    machine |= {"name": f"CPU ({cores} cores)", "label": f"CPU run (no GPU, {cores} cores)"}
    figures = {
        "total_s": results.figure(timings["total_s"], "s", "nox -s ci, every stage", "total_s")
    }
    for i, s in enumerate(timings["stages"]):
        figures[f"stage.{s['name']}"] = results.figure(
            s["seconds"],
            "s",
            f"CI stage {s['name']} ({duration(s['seconds'])})",
            f"stages[{i}].seconds",
        )
    body = {
        **timings,
        "source": f"{WORK}/{pipeline.TIMINGS}, written by nox -s ci",
        "host": {"python": platform.python_version(), "platform": platform.platform()},
    }
    doc = results.document(
        "ci", body, machine=machine, series=results.current_series(root), figures=figures
    )
    dest = root / RESULTS / CI_TIMINGS
    results.write(dest, doc)
    log(f"figures: {dest.relative_to(root)} written from {source.relative_to(root)}")
    return dest


# --- a command timed on a loaded machine (ci/time-command.sh) ---------------------

TIMING_FILES = ("command", "note", "commit", "started", "wall_s", "rc", "load.txt", "du.txt")


def _loads(text: str) -> list[list]:
    """``[time, 1-minute load]`` per line of load.txt (``TIME L1 L5 L15``)."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out.append([parts[0], float(parts[1])])
    return out


def _place(path: str) -> str:
    """A place as the record names it: a cache under a home folder from
    ``~`` (the same on every machine), anything else as written."""
    home, _, rest = path.strip().partition("/.cache/")
    return f"~/.cache/{rest}" if rest and home else path.strip()


def _sizes(text: str) -> dict[str, int]:
    """``du -sb`` lines (``BYTES<TAB>PLACE``): place -> bytes."""
    out = {}
    for line in text.splitlines():
        size, _, path = line.partition("\t")
        if size.strip().isdigit():
            out[_place(path)] = int(size)
    return out


def _disk_samples(text: str) -> list[tuple[str, dict[str, int]]]:
    """disk.txt: per line the time, then ``BYTES PLACE`` per place
    (tab-separated); a field without a place is skipped."""
    out = []
    for line in text.splitlines():
        time_, *fields = line.split("\t")
        sizes = {}
        for field in fields:
            size, _, path = field.partition(" ")
            if size.isdigit() and path.strip():
                sizes[_place(path)] = int(size)
        if sizes:
            out.append((time_.strip(), sizes))
    return out


def _peak(folder: Path) -> dict | None:
    """The largest total of the disk samples (``ci/time-command.sh``'s
    disk.txt, a sample every 10 s), with each place's bytes then; None for a
    run timed without them."""
    path = folder / "disk.txt"
    samples = _disk_samples(path.read_text()) if path.is_file() else []
    if not samples:
        return None
    at, places = max(samples, key=lambda s: sum(s[1].values()))
    return {
        "total": sum(places.values()),
        "at": at,
        "places": places,
        "every_s": 10,
        "samples": [[t, sum(p.values())] for t, p in samples],
    }


def _dest(root: Path, slug: str, started: str) -> Path:
    """results/timing_<command>_<date>.json; a second run of one day gets
    ``_2`` (and so on): a file of another run is never written over, the
    same run's is (recorded again)."""
    n, dest = 1, root / RESULTS / f"timing_{slug}_{started[:10]}.json"
    while dest.is_file() and json.loads(dest.read_text()).get("started") != started:
        n += 1
        dest = root / RESULTS / f"timing_{slug}_{started[:10]}_{n}.json"
    return dest


def _only_slow(folder: Path) -> bool:
    """Whether a ``nox -s ci`` run that exited non-zero ran and passed every
    stage (its timings.json complete): then only the time limit failed it."""
    try:
        timings = json.loads((folder / "timings.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return bool(timings.get("complete"))


def record_timing(root: Path, folder: Path, log: Callable[[str], object] = print) -> Path:
    """results/timing_<command>_<date>.json from ``ci/time-command.sh``'s folder."""
    missing = [f for f in TIMING_FILES if not (folder / f).is_file()]
    if missing:
        raise ToolkitError(
            f"figures: {folder} lacks {', '.join(missing)}: make it with "
            "`ci/time-command.sh DIR COMMAND...` in the checkout measured"
        )
    read = {f: (folder / f).read_text().strip() for f in TIMING_FILES}
    outcome = "passed"
    if read["rc"] != "0":
        if not _only_slow(folder):
            raise ToolkitError(
                f"figures: the timed command failed (exit {read['rc']}, {folder}/output.log): "
                "a failed run's time would understate a real one"
            )
        # Every stage ran and passed; CI fails a stage over fail_factor times its
        # budget, which on a loaded machine is the figure itself, not a fault.
        outcome = "every stage passed; CI failed the run only for a stage over its time limit"
    loads = _loads(read["load.txt"])
    if not loads:
        raise ToolkitError(f"figures: {folder}/load.txt holds no load sample")
    total = round(float(read["wall_s"]), 1)
    levels = [x[1] for x in loads]
    cores = os.cpu_count() or 0
    machine = results.machine_block([], None, None, None)
    machine |= {
        "name": f"CPU ({cores} cores)",
        "label": f"CPU run (no GPU, {cores} cores shared with other work)",
    }
    sizes = _sizes(read["du.txt"])
    peak = _peak(folder)
    figures = {
        "total_s": results.figure(total, "s", read["command"], "total_s"),
        "load.min": results.figure(min(levels), "", "1-minute load average, lowest", "load.min"),
        "load.max": results.figure(max(levels), "", "1-minute load average, highest", "load.max"),
    }
    for name, size in sizes.items():
        key = re.sub(r"[^\w-]+", "_", name).strip("_")
        figures[f"disk.{key}"] = results.figure(size, "B", f"{name} afterwards", f"disk['{name}']")
    if peak:
        figures["disk.peak"] = results.figure(
            peak["total"], "B", "every place at once, the largest sample", "disk_peak.total"
        )
    body = {
        "command": read["command"],
        "from": read["note"],
        "commit": read["commit"],
        "started": read["started"],
        "outcome": outcome,
        "cores": cores,
        "total_s": total,
        "load": {"min": min(levels), "max": max(levels), "every_s": 5, "samples": loads},
        "disk": sizes,
        **({"disk_peak": peak} if peak else {}),
        "source": "ci/time-command.sh's files, recorded by figures --record-timing",
        "host": {"python": platform.python_version(), "platform": platform.platform()},
    }
    doc = results.document(
        "timing",
        body,
        machine=machine,
        series=results.current_series(root),
        figures=figures,
        date=read["started"],
    )
    slug = re.sub(r"[^a-z0-9]+", "_", read["command"].split(" -s ", 1)[-1].lower()).strip("_")
    dest = _dest(root, slug, read["started"])
    results.write(dest, doc)
    log(f"figures: {dest.relative_to(root)} written from {folder}")
    return dest


def session(
    root: Path, check_only: bool = False, record: bool = False, timing: Path | None = None
) -> None:
    """``figures`` [--check] [--record-ci] [--record-timing DIR]."""
    if record:
        record_ci(root)
    if timing is not None:
        record_timing(root, timing)
    if check_only:
        diff = check(root)
        if diff:
            raise ToolkitError(
                "figures: blocks in the docs differ from results/: "
                "run `nox -s figures` and commit\n" + diff
            )
        stale = stale_citations(root)
        if stale:
            raise ToolkitError(
                "figures: text cites one-GPU runs of files changed since, as if current:\n"
                + "\n".join(stale)
            )
        print("figures: every block is current; no text cites an earlier run as current")
        return
    update(root)
