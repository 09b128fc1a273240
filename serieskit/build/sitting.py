"""One sitting of the GPU machine: the plan of its device calls, results/ from their files.

The calls carry the loads that ``nox -s overlay -- --gpu`` packed
(serieskit.build.overlay) and run gpu/evidence.sh's steps; ``plan`` and
``collect`` are ``nox -s evidence``'s (docs/gpu-evidence.md, docs/gpu-machine.md).
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from serieskit import results
from serieskit.build.recipe import CALL_BYTES, MARGIN
from serieskit.errors import ToolkitError
from serieskit.git import sent_bytes
from serieskit.state import State

WARM_S = 30  # the machine is kept this long after a call
SITTING_S = 15 * 60  # the GPU time a sitting may take from a cold machine, staging included
# Before a sitting has been measured (results/sitting_*.json), each step's
# seconds as the earlier one-H200 runs had them (bench: assembling, the build
# beside the NVFP4 benchmark, the attention benchmark and crossover and
# test_triton_turing_attn.py alone; tests: test_host_reduce.py, the longest
# file, beside the others; engine: the time to first token through vLLM,
# both backends, as its H200 run took; a machine's start "a minute or more").
EXPECTED_S = {"start": 90, "stage": 20, "bench": 380, "tests": 330, "engine": 260}
# What gpu/evidence.sh writes on the machine -> the stem of its results file.
RETURNED = {
    "series_gpu_tests.json": "series_gpu_tests",
    "series_gpu_tests_alone.json": "series_gpu_tests_alone",
    "series_gpu_tests_cases.json": "series_gpu_tests_cases",
    "series_gpu_smoke.json": "series_gpu_smoke",
    "serve_h200.json": "serve",
    "bench_prefill_attention.json": "bench_prefill_attention",
    "bench_prefill_crossover.json": "bench_prefill_crossover",
    "nvfp4_dequant.json": "nvfp4_dequant",
    "prefill_ttft.json": "prefill_ttft",
}
# What a sitting leaves out, in this order, where the session's device time
# left (the device tool's budget_left_s) is short of the whole one: the
# switch of gpu/evidence.sh, the calls that take it (the batch inherits it
# from `bench`, which starts it, or `tests`) and what it drops. The
# benchmarks' last results stay (pr --check says which the series changed
# since); the smoke and serve runs are the engines beside the test files.
TRIMS = (
    ("NO_BENCH=1", ("bench",), "the benchmarks"),
    ("NO_ENGINES=1", ("bench", "tests"), "the smoke and serve runs"),
)
REFUSED_S = 90  # what a start the device tool refuses costs of the session's time
PURPOSE = (
    "the series' single-GPU evidence at its head, in one sitting of the GPU machine "
    "(nox -s evidence: gpu/evidence.sh stage, bench, tests)"
)


def _gpu_tag(gpu: str) -> str:
    """The model in a GPU's name for file names: ``NVIDIA H100 80GB HBM3`` ->
    ``h100``, ``NVIDIA H200`` -> ``h200``; else the name's last word."""
    m = re.search(r"\b([A-Za-z]{1,3}\d{2,4}[A-Za-z]?)\b", gpu.removeprefix("NVIDIA "))
    return (m.group(1) if m else gpu.split()[-1]).lower()


@dataclass
class Call:
    """One device call of the sitting: what it carries and the step it runs."""

    step: str
    parts: list[str]  # staged by this call (gpu/stage1.sh)
    carry: list[str]  # paths relative to the repository
    bytes: int  # the carried paths and the working tree
    expected_s: float
    env: list[str] = field(default_factory=list)  # gpu/evidence.sh's switches (TRIMS)

    @property
    def command(self) -> str:
        return " ".join(["export OUT;", *self.env, "bash gpu/evidence.sh", self.step, *self.parts])


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _newest_sitting(root: Path) -> dict:
    """The newest measured sitting (results/sitting_*.json), a whole one (that
    reached its `tests` call) before a step run again; {} where none was."""
    found = sorted(
        (json.loads(p.read_text()) for p in (root / "results").glob("sitting_*.json")),
        key=lambda d: (results.whole_sitting(d), str(d.get("date"))),
    )
    return found[-1] if found else {}


def measured_steps(root: Path) -> dict[str, float]:
    """Seconds per step of the newest measured sitting; the machine's start as
    ``start``; {} where none was measured."""
    sitting = _newest_sitting(root)
    out: dict[str, float] = {}
    for call in sitting.get("calls", []):
        out[call["step"]] = max(out.get(call["step"], 0.0), float(call["seconds"]))
    if (start := sitting.get("start_s")) is not None:
        out["start"] = float(start)
    return out


def trim_savings(root: Path) -> dict[str, tuple[str, float]]:
    """Per switch of TRIMS, the call it shortens and the seconds it saves
    there, from the parts of the newest measured sitting (0 where none was):
    the benchmarks less the first one's time beside the build; the batch's
    time beyond its test files (the engines run beside them)."""
    parts: dict[str, dict[str, float]] = {}
    for call in _newest_sitting(root).get("calls", []):
        for part in call.get("parts", []):
            parts.setdefault(call["step"], {})[part["part"]] = float(part["seconds"])
    bench = parts.get("bench", {})
    benches = [v for k, v in bench.items() if k + ".json" in RETURNED]
    beside = min(benches[0], bench.get("build", 0.0)) if benches else 0.0
    batch = measured_steps(root).get("batch", 0.0)
    tests = parts.get("batch", {}).get("tests", batch)
    return {
        "NO_BENCH=1": ("bench", max(0.0, sum(benches) - beside)),
        "NO_ENGINES=1": ("tests", max(0.0, batch - tests)),
    }


def plan(root: Path, load: Path) -> list[Call]:
    """The fewest calls that carry ``load`` (``nox -s overlay -- --gpu``'s
    folder), each within what a call takes: the staging parts (part1 in the
    first call: it clears what an earlier load left) first fit, part2 in the
    call that assembles and benchmarks, then the tests' call."""
    if not (load / "part2").is_dir() or not (load / "MANIFEST.sha256").is_file():
        raise ToolkitError(f"evidence: no {load}/part2: run `nox -s overlay -- --gpu` first")
    rel = str(load.relative_to(root))
    tree = sent_bytes(root)
    room = CALL_BYTES - MARGIN - tree

    def number(p: Path) -> tuple[int, int]:
        head, _, n = p.name.partition("-")
        return (0 if head == "part1" else 1, int(n or 1))

    staging = sorted([*load.glob("part1*"), *load.glob("wheels*")], key=number)
    last = Call("bench", [], [f"{rel}/part2", f"{rel}/MANIFEST.sha256"], 0, 0.0)
    used = {id(last): _size(load / "part2") + _size(load / "MANIFEST.sha256")}
    calls: list[Call] = []
    for part in staging:
        size = _size(part)
        if size > room:
            raise ToolkitError(
                f"evidence: {rel}/{part.name} is {size / 2**20:.1f} MiB; with the working tree "
                f"({tree / 2**20:.1f} MiB) it is over what one call carries (64 MiB): pack "
                "again (`nox -s overlay -- --gpu` sizes the parts to the room the tree leaves)"
            )
        fits = calls if part.name == "part1" else [*calls, last]
        home = next((c for c in fits if used[id(c)] + size <= room), None)
        if home is None:
            home = Call("stage", [], [], 0, 0.0)
            used[id(home)] = 0
            calls.append(home)
        home.parts.append(part.name)
        home.carry.append(f"{rel}/{part.name}")
        used[id(home)] += size
    if used[id(last)] > room:
        raise ToolkitError(f"evidence: {rel}/part2 is over what one call carries with the tree")
    steps = {**EXPECTED_S, **measured_steps(root)}
    for c in [*calls, last]:
        c.bytes = used[id(c)] + tree
        c.expected_s = steps[c.step]
    return [*calls, last, Call("tests", [], [], tree, steps["tests"])]


def engine_call(root: Path) -> Call:
    """The optional call after ``tests``: the time to first token through
    vLLM's engine on the tree ``bench`` assembled (it carries nothing)."""
    steps = {**EXPECTED_S, **measured_steps(root)}
    return Call("engine", [], [], sent_bytes(root), steps["engine"])


def fit(root: Path, calls: list[Call], total: float, budget_s: float) -> tuple[float, list[str]]:
    """The calls switched (TRIMS, in order) until their ``total`` expected
    seconds fit ``budget_s``: the new total and what was left out. Refuses
    where even the test files do not fit."""
    dropped: list[str] = []
    savings = trim_savings(root)
    for switch, takes, what in TRIMS:
        if total <= budget_s:
            break
        step, saved = savings[switch]
        for c in calls:
            if c.step in takes:
                c.env.append(switch)
            if c.step == step:
                c.expected_s -= saved
        total -= saved
        dropped.append(what)
    if total > budget_s:
        raise ToolkitError(
            f"evidence: the sitting needs {total / 60:.1f} min of device time"
            + (f" without {' and '.join(dropped)}" if dropped else "")
            + f", and {budget_s / 60:.1f} are left: keep it for a session with more"
        )
    return total, dropped


def print_plan(root: Path, load: Path, log=print, budget_s: float | None = None) -> list[Call]:
    """The plan's calls, printed; with ``budget_s`` (the device time left),
    fitted to it (:func:`fit`) and the engine call offered only where it fits."""
    calls = plan(root, load)
    measured = measured_steps(root)
    gaps = WARM_S * (len(calls) - 1) / 2  # the coordinator's time between calls, at most WARM_S
    steps = {**EXPECTED_S, **measured}
    total = steps["start"] + sum(c.expected_s for c in calls) + gaps
    dropped: list[str] = []
    if budget_s is not None:
        total, dropped = fit(root, calls, total, budget_s)
    source = "the last measured sitting" if measured else "the earlier one-H200 runs (estimates)"
    log(f"evidence: {len(calls)} device calls (kind nvidia-h200), each within {WARM_S} s of the")
    log("last (the machine is kept that long), in order:")
    for i, c in enumerate(calls, 1):
        carry = ", ".join(c.carry) or "nothing (the working tree only)"
        log(f"{i}. command: {c.command}")
        log(f"   carry: {carry}: {c.bytes / 2**20:.1f} of 64 MiB with the working tree")
        log(f"   expected: {c.expected_s / 60:.1f} min (timeout_s 600)")
    log(
        f"expected GPU time from a cold machine: {total / 60:.1f} min ({source}; the start "
        f"{steps['start'] / 60:.1f} min, the gaps {gaps:.0f} s) of the {SITTING_S // 60} "
        "allowed; give the machine back after the last call"
    )
    engine = engine_call(root)
    what = f"{engine.command} ({engine.expected_s / 60:.1f} min): the time to first token"
    if budget_s is None:
        log(f"where the device time allows, a last call on the same tree: {what}")
    else:
        if dropped:
            log(f"left out to fit the {budget_s / 60:.1f} min left: {'; '.join(dropped)}")
        fits = budget_s - total >= engine.expected_s + WARM_S
        log(
            f"{'the device time left allows' if fits else 'no device time left for'} "
            f"a last call on the same tree: {what}"
        )
        log(
            f"{(budget_s - total) / 60:.1f} min left after the sitting: a start the device "
            f"tool refuses costs about {REFUSED_S / 60:.1f} min of it"
        )
    log("then: nox -s evidence -- --collect FOLDER... (the calls' returned files), nox -s figures")
    return calls


def _timeline(folder: Path) -> list[dict]:
    """The longest timeline.jsonl of the returned steps (the last holds every step)."""
    found = [
        [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
        for p in folder.glob("*/timeline.jsonl")
    ]
    return max(found, key=len, default=[])


def sitting_document(timeline: list[dict], doc: dict, held_s: float | None) -> dict:
    """The ``sitting`` results file: each call's and part's time, and the machine's."""
    if not timeline:
        raise ToolkitError("evidence: the returned files hold no timeline")
    starts = {t.get("machine_start") for t in timeline}
    first = timeline[0]["machine_start"] or timeline[0]["start"]
    end = timeline[-1]["end"]
    calls = [
        {
            "step": t["step"],
            "args": t.get("args", ""),
            "seconds": t["end"] - t["start"],
            "rc": t["rc"],
            "parts": [
                {**{k: p[k] for k in ("part", "rc", "cap_s")}, "seconds": p["end"] - p["start"]}
                for p in t.get("parts", [])
            ],
        }
        for t in timeline
    ]
    span = "the machine's start to the end of the last call"
    figures = {"sitting.machine_s": results.figure(end - first, "s", span, "machine_s")}
    for i, c in enumerate(calls):
        figures[f"call{i + 1}.{c['step']}_s"] = results.figure(
            c["seconds"], "s", f"call {i + 1}: gpu/evidence.sh {c['step']}", f"calls[{i}].seconds"
        )
    body: dict = {
        "machine_s": end - first,
        "start_s": timeline[0]["start"] - first,
        "calls": calls,
        "one_machine": len(starts) == 1,
        "limit_s": SITTING_S,
        "purpose": PURPOSE,
    }
    if held_s is not None:
        body["lease_held_s"] = held_s
        figures["sitting.lease_held_s"] = results.figure(
            held_s, "s", "the device tool's lease: the machine held", "lease_held_s"
        )
    out = results.document(
        "sitting",
        body,
        machine=doc["machine"],
        series=doc["series"],
        figures=figures,
        date=datetime.datetime.fromtimestamp(first, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        torch_pin=None,
    )
    if "torch_note" in doc:  # the writers read the pin where it ran
        out["torch_note"] = doc["torch_note"]
    return out


def _sitting_tag(results_dir: Path, day: str, names: list[str], docs: dict, replace: bool) -> str:
    """The suffix of a sitting's results files: a second sitting of the day
    gets _2 (and so on), never an earlier one's files. With ``replace``, the
    tag whose files already hold this sitting's results (the same dates: the
    same calls collected again), else the day's first."""
    tags = [day, *(f"{day}_{k}" for k in range(2, 100))]

    def taken(tag: str) -> bool:
        return any((results_dir / m.format(tag)).exists() for m in names)

    if replace:
        for tag in filter(taken, tags):
            for stem, (doc, _) in docs.items():
                path = results_dir / f"{stem}_{tag}.json"
                if path.exists() and json.loads(path.read_text()).get("date") == doc["date"]:
                    return tag
        return day
    return next(t for t in tags if not taken(t))


def collect(
    root: Path, folders: list[Path], held_s: float | None = None, replace: bool = False, log=print
) -> list[Path]:
    """results/ from the files the sitting's calls returned (``evidence-STEP.tgz``
    in ``folders``): each writer's results file under its name with the base,
    machine and day, the logs under results/raw/, and the sitting's timing."""
    # Oldest first: a later call's files (a `tests` call made again) win.
    archives = sorted(
        {a for f in folders for a in Path(f).rglob("evidence-*.tgz")},
        key=lambda a: (a.stat().st_mtime, str(a)),
    )
    if not archives:
        raise ToolkitError(f"evidence: no evidence-STEP.tgz in {', '.join(map(str, folders))}")
    written: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        unpacked = Path(tmp)
        for a in archives:
            with tarfile.open(a) as tar:
                tar.extractall(unpacked, filter="data")
        docs = {}
        for name, stem in RETURNED.items():
            for path in sorted(unpacked.glob(f"*/{name}")):
                doc = json.loads(path.read_text())
                if problems := results.validate(doc):
                    raise ToolkitError(f"evidence: {path.name}: " + "; ".join(problems))
                docs[stem] = (doc, path.parent.name)
        missing = [s for s in RETURNED.values() if s not in docs]
        if not docs:
            raise ToolkitError("evidence: the returned files hold no results file")
        timeline = _timeline(unpacked)
        any_doc = next(iter(docs.values()))[0]
        when = str(any_doc["date"])[:10].replace("-", "")
        machine = any_doc["machine"]
        gpu = _gpu_tag(str(machine.get("gpu") or "cpu"))
        n = int(machine.get("gpus") or 1)
        base = str(any_doc["series"].get("base") or "").removeprefix("vllm==")
        day = f"{''.join(base.split('.')[:2])}_{gpu}{f'x{n}' if n > 1 else ''}_{when}"
        names = [*(f"{stem}_{{}}.json" for stem in docs), "sitting_{}.json"]
        tag = _sitting_tag(root / "results", day, names, docs, replace)
        out = {
            f"{stem}_{tag}.json": {"purpose": PURPOSE, **doc, "command": f"gpu/evidence.sh {step}"}
            for stem, (doc, step) in docs.items()
        }
        out[f"sitting_{tag}.json"] = sitting_document(timeline, any_doc, held_s)
        for name, doc in out.items():
            dest = root / "results" / name
            results.write(dest, doc)
            written.append(dest)
            log(f"evidence: wrote {dest.relative_to(root)}")
        raw = root / "results" / "raw" / f"evidence_{tag}"
        raw.mkdir(parents=True, exist_ok=True)
        for a in archives:
            for f in (a, a.with_suffix(".log")):
                if f.is_file():
                    shutil.copy2(f, raw / f.name)
        log(f"evidence: the returned archives and logs in {raw.relative_to(root)}")
    commits = {d["series"].get("commit") for d, _ in docs.values()}
    head = State.load(root).head
    if commits != {head}:
        log(f"evidence: warning: the sitting ran series commit(s) {commits}; the head is {head}")
    if missing:
        log(f"evidence: warning: no results file came back for {', '.join(missing)}")
    if timeline and len({t.get("machine_start") for t in timeline}) > 1:
        log("evidence: warning: the calls ran on more than one machine (one was given back)")
    return written


def evidence(
    root: Path,
    collect_from: list[Path] | None,
    held_s: float | None,
    replace: bool,
    budget_s: float | None = None,
) -> None:
    """``evidence``: the plan of the sitting's device calls, or (``--collect``) results/."""
    if collect_from:
        collect(root, collect_from, held_s=held_s, replace=replace)
        return
    print_plan(root, root / ".dev" / "gpu", budget_s=budget_s)
