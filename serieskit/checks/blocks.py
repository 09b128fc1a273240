"""The text of each figures block of the docs, made from the results files.

One function per block name (:data:`BLOCKS`); each returns markdown and
names, for every figure, the results file it was read from and that file's
machine label ("H200 figure ...: not a Turing figure", "the seed's Turing
figure ..."). Which run a block shows is found, not named: the newest file
that holds the figures, preferring the pin's base (:class:`Evidence`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from serieskit.checks.evidence import (
    CI_TIMINGS,
    Evidence,
    Patch,
    Run,
    counts,
    duration,
    fmt,
    table,
    version,
)

# The series table's headline figures per patch (its Patch-Name) beside the
# counts of its test files: (figure key, words with {} for the value). One
# GPU: the newest run on the pin. Two GPUs: the newest run on two or more
# GPUs, any base, and the test files whose two-GPU cases matter.
ONE_GPU: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "turing-prefill-attention": [
        (
            "2048 after 153,600 in {} ({} of the mma.sync ceiling), TRITON_ATTN {}",
            (
                "q2048_ctx153600.auto_split_ms",
                "q2048_ctx153600.auto_split_fraction_of_ceiling",
                "q2048_ctx153600.triton_attn_ms",
            ),
        )
    ],
    "turing-prefill-split-kv": [
        (
            "2048 after 153,600: {} without split, {} with the automatic split",
            ("q2048_ctx153600.no_split_ms", "q2048_ctx153600.auto_split_ms"),
        )
    ],
    "nvfp4-sm7x-dequant": [
        (
            "dequantization at {} / {} of the copy bandwidth (checkpoint / Marlin layout)",
            (
                "17408x5120.checkpoint.default_tile.fraction_of_copy_bandwidth",
                "17408x5120.marlin.default_tile.fraction_of_copy_bandwidth",
            ),
        ),
        (
            "M = 2048: {} against Marlin's {}",
            ("17408x5120.m2048.dequant_cublas_ms", "17408x5120.m2048.marlin_ms"),
        ),
    ],
}
TWO_GPUS: dict[str, tuple[list[str], list[tuple[str, tuple[str, ...]]]]] = {
    "host-reduce-kernel": (
        ["tests/distributed/test_host_reduce.py"],
        [
            (
                "256 KiB in {} (NCCL {})",
                ("allreduce_262144B.kernel_mode_ms", "allreduce_262144B.nccl_ms"),
            )
        ],
    ),
    "tp-prefill-overlap": (
        ["tests/v1/worker/test_prefill_overlap.py"],
        [
            (
                "A/B prefill {} ({} with the copy engine)",
                ("overlap.prefill_change_pct", "overlap+copy-engine.prefill_change_pct"),
            )
        ],
    ),
    "host-reduce-copy-engine": (
        ["tests/distributed/test_host_reduce.py"],
        [
            (
                "20 MiB in {} (NCCL {})",
                ("allreduce_20971520B.copy_engine_mode_ms", "allreduce_20971520B.nccl_ms"),
            ),
            ("A/B prefill {}", ("copy-engine.prefill_change_pct",)),
        ],
    ),
    "nvfp4-sm7x-dequant": (["tests/kernels/quantization/test_nvfp4_sm7x_linear.py"], []),
}
SMOKE = "gpu/smoke.py"
MAIN_STAGES = ("apply", "test requirements", "build", "series tests")  # nox -s apply build test


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _part(run: Run, words: str, keys: tuple[str, ...]) -> str:
    values = []
    for key in keys:
        f = run.figure(key) or {}
        values.append(fmt(f.get("value"), str(f.get("unit", "")), signed="change" in key))
    return words.format(*values)


def _with_all(ev: Evidence, keys: tuple[str, ...], gpus: int, pin_only: bool) -> Run | None:
    """The newest run holding every one of ``keys`` (a part's figures come from one run)."""
    run = ev.with_figure(keys[0], gpus=gpus, pin_only=pin_only)
    return run if run and all(run.figure(k) for k in keys) else None


def _sources(runs: list[Run]) -> str:
    names = sorted({r.name for r in runs})
    return "(" + ", ".join(f"`{n}`" for n in names) + ")" if names else ""


def _one_gpu(ev: Evidence, p: Patch, used: list[Run]) -> str:
    parts, runs = [], []
    for test in p.tests:
        run = ev.with_tests(test, gpus=1, pin_only=True)
        if run:
            runs.append(run)
            parts.append(f"`{_short(test)}` {counts(run.tests(test) or {})}")
        elif ev.with_tests(test) is None:
            parts.append(f"`{_short(test)}` (CPU, in CI)")
        else:
            parts.append(f"`{_short(test)}`: not run on one GPU")
    for words, keys in ONE_GPU.get(p.name, []):
        run = _with_all(ev, keys, gpus=1, pin_only=True)
        if run:
            runs.append(run)
            parts.append(_part(run, words, keys))
    used += runs
    return "; ".join(parts) + (" " + _sources(runs) if runs else "") if parts else "CPU (CI)"


def _two_gpus(ev: Evidence, p: Patch) -> str:
    if p.name not in TWO_GPUS:
        return "none needed"
    tests, figures = TWO_GPUS[p.name]
    parts, runs = [], []
    for test in tests:
        run = ev.with_tests(test, gpus=2)
        if run:
            runs.append(run)
            parts.append(f"`{_short(test)}` {counts(run.tests(test) or {})}")
        else:
            parts.append(f"`{_short(test)}` TP=2 cases: not run")
    for words, keys in figures:
        run = _with_all(ev, keys, gpus=2, pin_only=False)
        if run:
            runs.append(run)
            parts.append(_part(run, words, keys))
    bases = sorted({version(r.base) or "base not recorded" for r in runs})
    lead = (
        f"last run on {', '.join(bases)}: " if runs and any(r.base != ev.pin for r in runs) else ""
    )
    return lead + "; ".join(parts) + (" " + _sources(runs) if runs else "")


def _gpu_words(runs: list[Run]) -> str:
    gpus = sorted({str(r.machine.get("gpu", "")).removeprefix("NVIDIA ") for r in runs})
    return ", ".join(gpus) or "GPU"


def series(ev: Evidence) -> str:
    """One row per patch: what ran on one GPU on the pin, and the two-GPU evidence."""
    used: list[Run] = []
    rows = [
        [f"`{p.number}`", p.subject, _one_gpu(ev, p, used), _two_gpus(ev, p)] for p in ev.patches
    ]
    gpu = _gpu_words(used)
    not_turing = used and all("not a Turing figure" in str(r.machine.get("label")) for r in used)
    torch = sorted({str(r.machine.get("torch")) for r in used if r.machine.get("torch")})
    head = [
        "patch",
        "what",
        f"one {gpu}, {version(ev.pin)}"
        + (f" ({gpu} figures, not Turing figures)" if not_turing else ""),
        "two GPUs (P2P off)",
    ]
    out = table(head, rows)
    smoke = ev.with_tests(SMOKE, gpus=1, pin_only=True)
    if smoke:
        c = smoke.tests(SMOKE) or {}
        ran = sum(int(c.get(k) or 0) for k in ("passed", "failed", "errors"))
        out += [
            "",
            f"The engine's smoke run (`{SMOKE}`: boot with torch.compile and CUDA graphs, greedy "
            f"generation): {int(c.get('passed') or 0)} of {ran} steps passed; {smoke.caption()}.",
        ]
    if torch:
        out += ["", f"The one-GPU runs used the GPU machine's torch ({', '.join(torch)})."]
    return "\n".join(out)


def runs(ev: Evidence) -> str:
    """Every results file: what kind, which machine (its label), which base, when."""
    rows = [
        [
            f"`{r.name}`",
            str(r.doc.get("kind")),
            str(r.machine.get("label") or r.machine.get("name")),
            version(r.base) or "-",
            str(r.machine.get("torch") or "-"),
            r.day,
        ]
        for r in sorted(ev.runs, key=lambda r: (r.base == ev.pin, r.date, r.name), reverse=True)
    ]
    return "\n".join(table(["results file", "kind", "machine", "base", "torch", "date"], rows))


def gpu_tests(ev: Evidence) -> str:
    """Per GPU run of the series' test files: the outcome of each file."""
    rows = []
    tests = [r for r in ev.gpu_runs() if r.doc.get("kind") == "tests"]
    for r in sorted(tests, key=lambda r: (r.base == ev.pin, r.date, r.name), reverse=True):
        for test, c in sorted((r.doc.get("test_files") or {}).items()):
            rows.append(
                [
                    f"`{test}`",
                    counts(c),
                    str(r.machine.get("name")),
                    version(r.base) or "-",
                    r.day,
                    f"`{r.name}`",
                ]
            )
    return "\n".join(
        table(["test file", "outcome", "machine", "base", "date", "results file"], rows)
    )


def _newest_matching(ev: Evidence, pattern: str, kind: str | None = None) -> Run | None:
    rx = re.compile(pattern)
    return ev.newest(
        r
        for r in ev.runs
        if (kind is None or r.doc.get("kind") == kind) and any(rx.match(k) for k in r.figures)
    )


def _missing(what: str) -> str:
    return f"No results file holds {what} yet."


def _bytes(b: int) -> str:
    if b % (1 << 20) == 0:
        return f"{b:,} B ({b >> 20} MiB)"
    if b < 1 << 20 and b % (1 << 10) == 0:
        return f"{b:,} B ({b >> 10} KiB)"
    return f"{b:,} B"


def host_reduce(ev: Evidence) -> str:
    """Two-rank all-reduce time per call by payload: NCCL, the host all-reduce's two modes, the floor."""
    run = _newest_matching(ev, r"allreduce_\d+B\.")
    if run is None:
        return _missing("the host all-reduce benchmark")
    payloads = sorted(
        {int(m.group(1)) for k in run.figures if (m := re.match(r"allreduce_(\d+)B\.", k))}
    )
    cols = ("nccl_ms", "kernel_mode_ms", "copy_engine_mode_ms", "floor_ms")
    rows = [
        [_bytes(b)]
        + [fmt((run.figure(f"allreduce_{b}B.{c}") or {}).get("value"), "ms") for c in cols]
        for b in payloads
    ]
    out = table(
        ["payload", "NCCL", "kernel mode", "copy-engine mode", "pipelined host floor"], rows
    )
    extra = [
        f"{(run.figure(k) or {}).get('label')}: {fmt(run.value(k), 'GB/s')}"
        for k in ("copy_h2d_both_GBps", "copy_d2h_both_GBps")
        if run.figure(k)
    ]
    text = "; ".join(extra + [run.caption()]) + "."
    return "\n".join(out + ["", text[:1].upper() + text[1:]])


_ATTN = re.compile(r"^(?:hd(\d+)\.)?q(\d+)_ctx(\d+)\.(\w+)$")


def attention(ev: Evidence) -> str:
    """The Turing prefill attention against TRITON_ATTN per shape, and the fraction of the mma.sync ceiling."""
    run = _newest_matching(ev, r"^mma_m16n8k8_ceiling_tflops$")
    if run is None:
        return _missing("the Turing attention benchmark")
    default_hd = (run.doc.get("shape") or {}).get("head_dim")
    shapes: dict[tuple, dict[str, object]] = {}
    for key, f in run.figures.items():
        if m := _ATTN.match(key):
            hd, q, ctx, what = m.groups()
            shapes.setdefault((int(hd or default_hd or 0), int(ctx), int(q)), {})[what] = f.get(
                "value"
            )
    rows = [
        [
            str(hd or "-"),
            f"{q:,} after {ctx:,}",
            fmt(v.get("no_split_ms"), "ms"),
            fmt(v.get("auto_split_ms"), "ms"),
            fmt(v.get("auto_split_fraction_of_ceiling"), "fraction"),
            fmt(v.get("triton_attn_ms"), "ms"),
        ]
        for (hd, ctx, q), v in sorted(shapes.items())
    ]
    out = table(
        [
            "head dim",
            "query tokens after context",
            "no split",
            "automatic split",
            "of the ceiling",
            "TRITON_ATTN",
        ],
        rows,
    )
    ceiling = fmt(run.value("mma_m16n8k8_ceiling_tflops"), "TFLOP/s")
    return "\n".join(
        out
        + ["", f"mma.sync m16n8k8 ceiling measured in the same run: {ceiling}; {run.caption()}."]
    )


def crossover(ev: Evidence) -> str:
    """From which query length the Turing kernel beats TRITON_ATTN, per context and batch."""
    run = _newest_matching(ev, r"^ctx\d+_decodes\d+\.crossover_query_len$")
    if run is None:
        return _missing("the crossover benchmark")
    cases = sorted(
        {
            (int(m.group(2)), int(m.group(1)))
            for k in run.figures
            if (m := re.match(r"^ctx(\d+)_decodes(\d+)\.", k))
        }
    )
    rows = []
    for dec, ctx in cases:
        q = (run.figure(f"ctx{ctx}_decodes{dec}.crossover_query_len") or {}).get("value")
        ratio = (run.figure(f"ctx{ctx}_decodes{dec}.ratio_at_65") or {}).get("value")
        rows.append([f"{ctx:,}", str(dec), "never" if q is None else f"{q:,}", fmt(ratio, "ratio")])
    out = table(
        [
            "context",
            "decode requests beside",
            "crossover query length",
            "Turing / TRITON_ATTN time at 65 tokens",
        ],
        rows,
    )
    return "\n".join(out + ["", run.caption() + "."])


def nvfp4(ev: Evidence) -> str:
    """NVFP4 dequantization bandwidth per shape, and the prefill GEMM against Marlin."""
    run = _newest_matching(ev, r"^copy_bandwidth_gbps$")
    if run is None:
        return _missing("the NVFP4 benchmark")
    shapes = sorted(
        {k.split(".")[0] for k in run.figures if re.match(r"^\d+x\d+\.", k)},
        key=lambda s: [-int(x) for x in s.split("x")],
    )

    def v(key: str, unit: str) -> str:
        return fmt((run.figure(key) or {}).get("value"), unit)

    rows = [
        [
            s,
            v(f"{s}.checkpoint.default_tile.fraction_of_copy_bandwidth", "fraction"),
            v(f"{s}.marlin.default_tile.fraction_of_copy_bandwidth", "fraction"),
            v(f"{s}.m2048.dequant_cublas_ms", "ms"),
            v(f"{s}.m2048.marlin_ms", "ms"),
            v(f"{s}.crossover_m", ""),
        ]
        for s in shapes
    ]
    out = table(
        [
            "weight (N x K)",
            "dequantization, checkpoint layout (of the copy bandwidth)",
            "Marlin layout",
            "M = 2048: dequantization + cuBLAS",
            "Marlin",
            "no slower than Marlin from M =",
        ],
        rows,
    )
    copy = fmt(run.value("copy_bandwidth_gbps"), "GB/s")
    return "\n".join(
        out
        + [
            "",
            f"Device-to-device copy bandwidth in the same run: {copy}; default tile per layout on this GPU; {run.caption()}.",
        ]
    )


def static_kernels(ev: Evidence) -> str:
    """ptxas and SASS figures of the series' CUDA kernels per target."""
    run = _newest_matching(ev, r"^\w+\.sm_\d+\.registers$", kind="static")
    if run is None:
        return _missing("static evidence of the CUDA kernels")
    cells: dict[tuple[str, str], dict[str, object]] = {}
    for key, f in run.figures.items():
        if m := re.match(r"^(\w+)\.(sm_\d+)\.(\w+)$", key):
            cells.setdefault((m.group(2), m.group(1)), {})[m.group(3)] = f.get("value")
    rows = [
        [
            f"`{k}`",
            arch,
            fmt(v.get("registers"), ""),
            fmt(v.get("spill_bytes"), "bytes"),
            fmt(v.get("hmma"), ""),
        ]
        for (arch, k), v in sorted(cells.items(), reverse=True)
    ]
    out = table(["kernel", "target", "registers", "spills", "HMMA in SASS"], rows)
    return "\n".join(out + ["", run.caption() + "."])


def static_head_dims(ev: Evidence) -> str:
    """The Turing attention kernel per head dim: registers, spills, shared memory, CTAs per SM."""
    run = _newest_matching(ev, r"^hd\d+\.registers$", kind="static")
    if run is None:
        return _missing("static evidence per head dim")
    dims = sorted({int(m.group(1)) for k in run.figures if (m := re.match(r"^hd(\d+)\.", k))})
    keys = [
        ("registers", ""),
        ("spill_stores", "bytes"),
        ("stack_bytes", "bytes"),
        ("dynamic_shared_bytes", "bytes"),
        ("turing_ctas_per_sm", ""),
        ("hmma_in_kernel", ""),
        ("sm90_from_ptx.registers", ""),
    ]
    rows = [
        [str(d)] + [fmt((run.figure(f"hd{d}.{k}") or {}).get("value"), u) for k, u in keys]
        for d in dims
    ]
    out = table(
        [
            "head dim",
            "registers",
            "spills",
            "stack",
            "shared memory per CTA",
            "CTAs per Turing SM",
            "HMMA in SASS",
            "registers, compute_75 PTX for sm_90",
        ],
        rows,
    )
    return "\n".join(out + ["", run.caption() + "."])


def static_nvfp4(ev: Evidence) -> str:
    """The NVFP4 dequantization's Triton kernels compiled for sm_75 / sm_70, per tile."""
    run = _newest_matching(ev, r"^(marlin|checkpoint)\.sm_\d+\.g\d+\.registers$", kind="static")
    if run is None:
        return _missing("static evidence of the NVFP4 kernels")
    found: dict[tuple[str, str], dict[int, tuple]] = {}
    for key, f in run.figures.items():
        if m := re.match(r"^(marlin|checkpoint)\.(sm_\d+)\.g(\d+)\.(registers|spill_bytes)$", key):
            slot = found.setdefault((m.group(1), m.group(2)), {}).setdefault(
                int(m.group(3)), (None, None)
            )
            value = f.get("value")
            found[(m.group(1), m.group(2))][int(m.group(3))] = (
                (value, slot[1]) if m.group(4) == "registers" else (slot[0], value)
            )
    tiles = sorted({t for v in found.values() for t in v})
    rows = [
        [f"{layout}'s", arch]
        + [fmt(v.get(t, (None, None))[0], "") for t in tiles]
        + [fmt(sum(int(s or 0) for _, s in v.values()), "bytes")]
        for (layout, arch), v in sorted(
            found.items(), key=lambda x: (x[0][0] != "marlin", x[0][1]), reverse=False
        )
    ]
    out = table(
        ["layout", "target"]
        + [f"registers, {t} groups per program" for t in tiles]
        + ["spills (all tiles)"],
        rows,
    )
    return "\n".join(out + ["", run.caption() + "."])


def e2e(ev: Evidence) -> str:
    """The end-to-end A/B: prefill of the measured prompts per arm, against the reference and the P2P-on ceiling."""
    run = _newest_matching(ev, r"^reference\.prefill_total_mean_s$", kind="e2e")
    if run is None:
        return _missing("an end-to-end A/B")
    configs = {a.get("name"): a for a in run.doc.get("arms") or [] if isinstance(a, dict)}
    arms = [
        k.removesuffix(".prefill_total_mean_s")
        for k in run.figures
        if k.endswith(".prefill_total_mean_s")
    ]
    rows = []
    for arm in sorted(arms, key=lambda a: (a != "reference", a)):
        cfg = json.dumps((configs.get(arm) or {}).get("kernel_config") or {}, sort_keys=True)

        def v(what: str, unit: str, arm: str = arm) -> str:
            f = run.figure(f"{arm}.{what}")
            return fmt(f.get("value"), unit, signed="change" in what) if f else "-"

        rows.append(
            [
                f"{arm} (`{cfg}`)",
                v("prefill_total_mean_s", "s"),
                v("prefill_change_pct", "%"),
                v("penalty_hidden_pct", "%"),
            ]
        )
    if f := run.figure("p2p_on_prefill_total_mean_s"):
        rows.append(["P2P on, reference (the ceiling)", fmt(f.get("value"), "s"), "-", "-"])
    out = table(
        [
            "arm (kernel config)",
            "prefill of the measured prompts, mean of the boots",
            "against the reference",
            "of the no-P2P penalty hidden",
        ],
        rows,
    )
    noise = (
        fmt(run.value("noise_floor_pct"), "%")
        if run.figure("noise_floor_pct")
        else "(not recorded)"
    )
    return "\n".join(
        out + ["", f"Noise floor between the reference boots: {noise}; {run.caption()}."]
    )


def seed(ev: Evidence) -> str:
    """The seed's own Turing figures, as the seed states them."""
    runs = [r for r in ev.runs if r.doc.get("kind") == "external"]
    run = ev.newest(runs)
    if run is None:
        return _missing("the seed's figures")
    rows = [
        [str(f.get("label")), fmt(f.get("value"), str(f.get("unit", "")), signed="change" in k)]
        for k, f in run.figures.items()
    ]
    return "\n".join(
        table(["figure (the seed's, not measured by this series)", "value"], rows)
        + ["", run.caption() + "."]
    )


def _serve_run(ev: Evidence) -> Run | None:
    found = sorted(ev.find("**/serve*.json"), key=lambda r: (r.date, r.path))
    return found[-1] if found else None


def serve_status(ev: Evidence) -> str:
    """One sentence: how far the last serve run on the GPU machine got."""
    run = _serve_run(ev)
    return serve(ev).split("\n", 1)[0] if run else _missing("a run of gpu/serve.sh")


def serve(ev: Evidence) -> str:
    """The wheel built, installed and served on the GPU machine (gpu/serve.sh)."""
    run = _serve_run(ev)
    if run is None:
        return _missing("a run of gpu/serve.sh")
    steps = [s for s in run.doc.get("steps") or [] if isinstance(s, dict)]
    failed = [s for s in steps if not s.get("ok")]
    rows = [
        [str(s.get("step")), "passed" if s.get("ok") else "failed", fmt(s.get("seconds"), "s")]
        for s in steps
    ]
    lead = f"{len(steps) - len(failed)} of the {len(steps)} steps that ran passed"
    if failed:
        error = str(failed[0].get("error") or "").strip().splitlines() or ["no error recorded"]
        lead += f'; it stopped at "{failed[0].get("step")}" ({error[-1].strip()}), so nothing was served yet'
    lead += f"; {run.caption()}."
    return "\n".join([lead, ""] + table(["step", "outcome", "took"], rows))


def _ci(ev: Evidence) -> Run | None:
    return next((r for r in ev.runs if r.name == CI_TIMINGS), None)


NOT_MEASURED = "not yet measured: no `results/{}` (a copy of a complete CI run's `.work/ci/timings.json`, made by `python3 -m serieskit figures --record-ci`)"


def ci_timings(ev: Evidence) -> str:
    """Each CI stage's duration against its budget, from a real run's timings."""
    run = _ci(ev)
    if run is None:
        return "CI's stage durations are " + NOT_MEASURED.format(CI_TIMINGS) + "."
    stages = [s for s in run.doc.get("stages") or [] if isinstance(s, dict)]
    rows = [
        [
            str(s.get("name")),
            duration(float(s.get("seconds") or 0)),
            duration(float(s.get("budget_s") or 0)),
        ]
        for s in stages
    ]
    total = duration(float(run.doc.get("total_s") or 0))
    return "\n".join(
        table(["stage (ci/pipeline.toml)", "took", "budget"], rows)
        + ["", f"`nox -s ci` in all: {total}; {run.caption()}."]
    )


def _main_command(run: Run) -> str:
    took = {
        s.get("name"): float(s.get("seconds") or 0)
        for s in run.doc.get("stages") or []
        if isinstance(s, dict)
    }
    return duration(sum(took.get(s, 0.0) for s in MAIN_STAGES))


def commands_timing(ev: Evidence) -> str:
    """The two commands' durations, from CI's own timing of a real run."""
    run = _ci(ev)
    if run is None:
        return "Their duration on a fresh machine is " + NOT_MEASURED.format(CI_TIMINGS) + "."
    total = duration(float(run.doc.get("total_s") or 0))
    return (
        f"Measured by CI itself: `nox -s ci` took {total}, and the stages that make up the main job "
        f"({', '.join(MAIN_STAGES)}) {_main_command(run)}; {run.caption()}."
    )


BLOCKS: dict[str, Callable[[Evidence], str]] = {
    "series": series,
    "commands-timing": commands_timing,
    "ci-timings": ci_timings,
    "runs": runs,
    "gpu-tests": gpu_tests,
    "host-reduce": host_reduce,
    "attention": attention,
    "crossover": crossover,
    "nvfp4": nvfp4,
    "static-kernels": static_kernels,
    "static-head-dims": static_head_dims,
    "static-nvfp4": static_nvfp4,
    "e2e": e2e,
    "seed": seed,
    "serve": serve,
    "serve-status": serve_status,
}
