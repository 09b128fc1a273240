"""PYTHONPATH overlays, the GPU machine's loads, and the plan of a sitting.

An overlay is the patched ``vllm/`` and the series' module laid in front of a
released wheel of the same version. ``pack_gpu`` writes what a GPU machine
without network needs, in runs of at most 64 MiB (overlays/gpu.toml): part1
the wheel's core module (in pieces: part1, part1-2, ...), ``wheels`` the
wheels it lacks, part2 the rest; gpu/stage1.sh and stage2.sh unpack them.
``plan`` and ``collect`` are ``nox -s evidence``'s (docs/gpu-evidence.md).
"""

from __future__ import annotations

import ast
import datetime
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from serieskit import files, results
from serieskit.build import recipe
from serieskit.build.wheel_release import pack_release
from serieskit.errors import ToolkitError, failed
from serieskit.series import base, series, target
from serieskit.series.target import Target
from serieskit.state import State


def build_overlay(tree: Path, out: Path, module: Path | None = None, log=print) -> Path:
    """Copy the patched ``vllm/`` package (and the built module) to ``out``."""
    dest = out / "vllm"
    # Made beside it, then swapped in: a kill never leaves half an overlay there.
    files.clear_leftovers(out)
    new = out / f".vllm.new.serieskit-{os.getpid()}.tmp"
    old = out / f".vllm.old.serieskit-{os.getpid()}.tmp"
    shutil.copytree(tree / "vllm", new, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    if module is not None and module.exists():
        shutil.copy2(module, new / module.name)
    if dest.exists():
        dest.rename(old)
    new.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    log(
        f"overlay: {out} ({sum(1 for _ in dest.rglob('*.py'))} Python files"
        + (f", {module.name}" if module is not None and module.exists() else "")
        + ")"
    )
    return out


def _split_for_runs(xz: Path, out: Path) -> None:
    """Cut the compressed core module into pieces that one run each carries:
    ``NAME.xz.00`` in part1, ``NAME.xz.01`` in part1-2, ...; stage2 joins them
    in order. One piece keeps its name."""
    piece = recipe.gpu().piece_bytes
    if xz.stat().st_size <= piece:
        return
    with xz.open("rb") as src:
        i = 0
        while chunk := src.read(piece):
            folder = out / ("part1" if i == 0 else f"part1-{i + 1}")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{xz.name}.{i:02d}").write_bytes(chunk)
            i += 1
    xz.unlink()


def _wheel_parts(downloaded: Path, out: Path) -> None:
    """Move the downloaded wheels into parts of their own, each within what
    one run carries: ``wheels/whl`` first, then ``wheels-2/whl``, ... (in
    name order); gpu/stage1.sh keeps each in /tmp/keep/whl."""
    limit = recipe.gpu().part_bytes
    part, used = 1, 0
    for whl in sorted(downloaded.glob("*.whl")):
        size = whl.stat().st_size
        if size > limit:
            raise ToolkitError(
                f"gpu: {whl.name} is {size / 2**20:.0f} MiB, over what one run takes"
            )
        if used + size > limit:
            part, used = part + 1, 0
        dest = out / ("wheels" if part == 1 else f"wheels-{part}") / "whl"
        dest.mkdir(parents=True, exist_ok=True)
        whl.rename(dest / whl.name)
        used += size
    shutil.rmtree(downloaded)


def pack_gpu(
    tree: Path,
    out: Path,
    version: str,
    commit: str,
    extra: tuple[str, ...] | list[str] = (),
    log=print,
    tree_id: str = "?",
    files: dict[str, str] | None = None,
) -> None:
    """Write ``out/part1`` (and ``part1-2``, ...), ``out/wheels`` (and
    ``wheels-2``, ...) and ``out/part2`` for the runs on the GPU machine (what
    they hold: overlays/gpu.toml)."""
    gpu = recipe.gpu()
    wheel, wheel_sha = base.fetch(gpu.wheel.format(v=version), version, log=log)
    p1, p2 = out / "part1", out / "part2"
    source = p1 / "SOURCE"
    fresh = not (source.exists() and source.read_text().strip() == wheel_sha)
    for d in (*out.glob("part1-*"), p1, p2) if fresh else (p2,):
        shutil.rmtree(d, ignore_errors=True)
    for d in out.glob("wheels*"):  # the list may have changed: made anew
        shutil.rmtree(d)
    for d in (p1, p2) if fresh else (p2,):
        d.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        if fresh:  # part1 depends on the wheel alone: made once
            log(f"gpu: compressing {gpu.core} (about a minute)")
            xz = p1 / (Path(gpu.core).name + ".xz")
            with z.open(gpu.core) as src, lzma.open(xz, "wb", preset=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            _split_for_runs(xz, out)
            source.write_text(wheel_sha + "\n")
        with tarfile.open(p2 / "fa.tar.xz", "w:xz") as tar:
            for info in z.infolist():
                name = info.filename
                if name.startswith(gpu.flash_attn_dir) and not name.endswith(gpu.flash_attn_skip):
                    data = z.read(info)
                    ti = tarfile.TarInfo(info.filename)
                    ti.size = len(data)
                    tar.addfile(ti, fileobj=io.BytesIO(data))
        # For `serieskit wheel` there (gpu/serve.sh): the release's RECORD checks
        # every compiled member the wheel takes from the assembled tree.
        pack_release(z, version, tree, p2 / "release.tar.xz", skip=(gpu.core, gpu.flash_attn_dir))
    with tarfile.open(p2 / "overlay.tgz", "w:gz") as tar:
        tar.add(
            tree / "vllm",
            arcname="vllm",
            filter=lambda ti: (None if "__pycache__" in ti.name or ti.name.endswith(".so") else ti),
        )
        for path in extra:
            if (tree / path).exists():
                tar.add(
                    tree / path,
                    arcname=path,
                    filter=lambda ti: None if "__pycache__" in ti.name else ti,
                )
        # What the results files name (serieskit.results): the commit, the
        # tree (the content, whatever the commit ids), the release it sits on
        # and the blob of every file the series changes.
        for name, value in (
            ("SERIES_COMMIT", commit),
            ("SERIES_TREE", tree_id),
            ("BASE_VERSION", version),
            ("SERIES_FILES", json.dumps(files or {}, sort_keys=True)),
        ):
            stamp = f"{value}\n".encode()
            info_ = tarfile.TarInfo(name)
            info_.size = len(stamp)
            tar.addfile(info_, io.BytesIO(stamp))
    (p2 / "VERSION").write_text(version + "\n")
    whl = out / "wheels-download"
    whl.mkdir()
    plats = [arg for p in gpu.platforms for arg in ("--platform", p)]
    log(f"gpu: downloading the {len(gpu.wheels)} wheels the GPU image lacks ({recipe.GPU})")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            gpu.python,
            "--implementation",
            "cp",
            *plats,
            "-d",
            str(whl),
            *gpu.wheels,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise failed("gpu: downloading the wheels the GPU image lacks", proc)
    _wheel_parts(whl, out)
    for part in (*sorted(out.glob("part1*")), *sorted(out.glob("wheels*")), p2):
        size = sum(f.stat().st_size for f in part.rglob("*") if f.is_file())
        log(f"gpu: {part} {size / 2**20:.1f} MiB")
        if size > gpu.part_bytes:
            raise ToolkitError(f"gpu: {part} is {size / 2**20:.0f} MiB, over what one run takes")
    (out / "MANIFEST.sha256").write_text(
        "".join(
            f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(out)}\n"
            for f in sorted(out.rglob("*"))
            if f.is_file() and f.name != "MANIFEST.sha256"
        )
    )


def test_helpers(tree: Path, tests: list[str]) -> list[str]:
    """The upstream test modules the series' test files import (``from
    tests.x import ...``, at any depth), with the packages on their way:
    the GPU machine's tree has no other tests."""
    found: set[str] = set()
    todo = list(tests)
    while todo:
        path = tree / todo.pop()
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                parts = name.split(".")
                if parts[0] != "tests":
                    continue
                module = "/".join(parts) + ".py"
                if (tree / module).is_file() and module not in found and module not in tests:
                    found.add(module)
                    todo.append(module)
                for i in range(1, len(parts)):
                    init = "/".join(parts[:i]) + "/__init__.py"
                    if (tree / init).is_file():
                        found.add(init)
    return sorted(found)


def session(where: Path | Target, gpu: bool = False, log=print) -> None:
    """``nox -s overlay``: overlays/vllm-VERSION from the target's work tree
    (with the built module where there is one); ``gpu`` also packs the GPU
    machine's loads (``.dev/gpu``, a port's ``.dev/gpu-VERSION``)."""
    t = target.of(where)
    tree = series.applied_tree(t)
    module = next(t.out("build").glob(f"{recipe.native().module}*.so"), None)
    build_overlay(tree, t.root / "overlays" / f"vllm-{t.version}", module, log=log)
    if gpu:
        head = State.load(t).head or "?"
        tests = series.test_files(t)
        extra = ["csrc/sm7x", *tests, *test_helpers(tree, tests)]
        block = results.series_block(tree, State.load(t).base or "", head, t.version)
        dest = t.root / ".dev" / (f"gpu-{t.version}" if t.port else "gpu")
        pack_gpu(
            tree, dest, t.version, head, extra, log=log, tree_id=block["tree"], files=block["files"]
        )


# --- One sitting of the GPU machine: the calls that carry the loads, and what comes back ---

CALL_BYTES = 64 * 2**20  # what one device call carries, the working tree included
MARGIN = 2**19  # kept free in every call
WARM_S = 30  # the machine is kept this long after a call
SITTING_S = 15 * 60  # the GPU time a sitting may take from a cold machine, staging included
# Before a sitting has been measured (results/sitting_*.json), each step's
# seconds as the earlier one-H200 runs had them (bench: assembling, the build
# beside the NVFP4 benchmark, the attention benchmark and crossover and
# test_triton_turing_attn.py alone; tests: test_host_reduce.py, the longest
# file, beside the others; a machine's start "a minute or more").
EXPECTED_S = {"start": 90, "stage": 20, "bench": 380, "tests": 330}
# What gpu/evidence.sh writes on the machine -> the stem of its results file.
RETURNED = {
    "series_gpu_tests.json": "series_gpu_tests",
    "series_gpu_tests_alone.json": "series_gpu_tests_alone",
    "series_gpu_smoke.json": "series_gpu_smoke",
    "serve_h200.json": "serve",
    "bench_prefill_attention.json": "bench_prefill_attention",
    "bench_prefill_crossover.json": "bench_prefill_crossover",
    "nvfp4_dequant.json": "nvfp4_dequant",
}
PURPOSE = (
    "the series' single-GPU evidence at its head, in one sitting of the GPU machine "
    "(nox -s evidence: gpu/evidence.sh stage, bench, tests)"
)


@dataclass
class Call:
    """One device call of the sitting: what it carries and the step it runs."""

    step: str
    parts: list[str]  # staged by this call (gpu/stage1.sh)
    carry: list[str]  # paths relative to the repository
    bytes: int  # the carried paths and the working tree
    expected_s: float

    @property
    def command(self) -> str:
        return " ".join(["export OUT; bash gpu/evidence.sh", self.step, *self.parts])


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def tree_bytes(root: Path) -> int:
    """What a device call sends besides its carried paths: the tracked files
    and the untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    paths = (root / p for p in listed.split("\0") if p)
    return sum(p.lstat().st_size for p in paths if p.is_file() or p.is_symlink())


def measured_steps(root: Path) -> dict[str, float]:
    """Seconds per step of the newest measured sitting (results/sitting_*.json),
    the machine's start as ``start``; {} where none was measured."""
    found = sorted(
        (json.loads(p.read_text()) for p in (root / "results").glob("sitting_*.json")),
        key=lambda d: str(d.get("date")),
    )
    if not found:
        return {}
    out: dict[str, float] = {}
    for call in found[-1].get("calls", []):
        out[call["step"]] = max(out.get(call["step"], 0.0), float(call["seconds"]))
    if (start := found[-1].get("start_s")) is not None:
        out["start"] = float(start)
    return out


def plan(root: Path, load: Path) -> list[Call]:
    """The fewest calls that carry ``load`` (``nox -s overlay -- --gpu``'s
    folder), each within what a call takes: the staging parts (part1 in the
    first call: it clears what an earlier load left) first fit, part2 in the
    call that assembles and benchmarks, then the tests' call."""
    if not (load / "part2").is_dir() or not (load / "MANIFEST.sha256").is_file():
        raise ToolkitError(f"evidence: no {load}/part2: run `nox -s overlay -- --gpu` first")
    rel = str(load.relative_to(root))
    tree = tree_bytes(root)
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
                f"({tree / 2**20:.1f} MiB) it is over what one call carries (64 MiB): lower "
                "[machine] piece_mib or part_mib in overlays/gpu.toml and pack again"
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


def print_plan(root: Path, load: Path, log=print) -> list[Call]:
    calls = plan(root, load)
    measured = measured_steps(root)
    gaps = WARM_S * (len(calls) - 1) / 2  # the coordinator's time between calls, at most WARM_S
    steps = {**EXPECTED_S, **measured}
    total = steps["start"] + sum(c.expected_s for c in calls) + gaps
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
        gpu = str(machine.get("gpu") or "cpu").removeprefix("NVIDIA ").split()[-1].lower()
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
    root: Path, collect_from: list[Path] | None, held_s: float | None, replace: bool
) -> None:
    """``evidence``: the plan of the sitting's device calls, or (``--collect``) results/."""
    if collect_from:
        collect(root, collect_from, held_s=held_s, replace=replace)
        return
    print_plan(root, root / ".dev" / "gpu")
