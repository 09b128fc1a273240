"""The benchmark and static-evidence blocks of docs/evidence-runs.md (a table per results file).

Each function finds the newest results file that holds its figures (the
pin's base preferred), lays them out as a markdown table and ends with that
file's caption: its path, its machine's own label, base, torch and date,
and which files of the patches the table covers (:data:`COVERS`) changed
since the run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from serieskit.checks.evidence import Evidence, Run, fmt, table

HOST_REDUCE = ["host-reduce-kernel", "host-reduce-copy-engine"]
TURING = ["turing-prefill-attention", "turing-prefill-split-kv", "turing-prefill-head-dims"]
NVFP4 = ["nvfp4-sm7x-dequant"]
# The patches (Patch-Names) whose code each table measures.
COVERS: dict[str, list[str]] = {
    "host_reduce": HOST_REDUCE,
    "attention": TURING,
    "crossover": TURING,
    "nvfp4": NVFP4,
    "static_kernels": HOST_REDUCE + TURING,
    "static_head_dims": TURING,
    "variants": TURING,
    "static_nvfp4": NVFP4,
    "e2e": ["dbo-ubatch-abort", "tp-prefill-overlap", *HOST_REDUCE],
}


def _end(ev: Evidence, run: Run, block: str) -> str:
    """A caption's end: the full stop, then the files of the patches the
    table covers that changed since the run."""
    return "." + ev.predates_note(run, COVERS[block])


def _newest_matching(ev: Evidence, pattern: str, kind: str | None = None) -> Run | None:
    rx = re.compile(pattern)
    return ev.newest(
        r
        for r in ev.runs
        if (kind is None or r.doc.get("kind") == kind) and any(rx.match(k) for k in r.figures)
    )


def missing(what: str) -> str:
    return f"No results file holds {what} yet."


def _bytes(b: int) -> str:
    if b % (1 << 20) == 0:
        return f"{b:,} B ({b >> 20} MiB)"
    if b < 1 << 20 and b % (1 << 10) == 0:
        return f"{b:,} B ({b >> 10} KiB)"
    return f"{b:,} B"


_CROSSOVER = re.compile(r"^(?:hd(\d+)\.)?ctx(\d+)_decodes(\d+)\.crossover_query_len$")


def _e2e_run(ev: Evidence) -> Run | None:
    # At TP >= 2 only: a TP=1 run checks the harness, not the series' features
    # (runs before the harness recorded its TP were at TP=2).
    return ev.newest(
        r
        for r in ev.runs
        if r.doc.get("kind") == "e2e"
        and (r.doc.get("tp") or 2) >= 2
        and "reference.prefill_total_mean_s" in r.figures
    )


# The results file each table shows (the sweep's tables, one per file, are
# found in variants()); docs/gpu-evidence.md's list of current runs names the same.
PICK: dict[str, Callable[[Evidence], Run | None]] = {
    "host_reduce": lambda ev: _newest_matching(ev, r"allreduce_\d+B\."),
    # The op's benchmark: the shapes sweep measures the same ceiling.
    "attention": lambda ev: _newest_matching(ev, r"^(?:hd\d+\.)?q\d+_ctx\d+\.auto_split_ms$"),
    "crossover": lambda ev: _newest_matching(ev, _CROSSOVER.pattern),
    "nvfp4": lambda ev: _newest_matching(ev, r"^copy_bandwidth_gbps$"),
    "static_kernels": lambda ev: _newest_matching(ev, r"^\w+\.sm_\d+\.registers$", kind="static"),
    "static_head_dims": lambda ev: _newest_matching(ev, r"^hd\d+\.registers$", kind="static"),
    "static_nvfp4": lambda ev: _newest_matching(
        ev, r"^(marlin|checkpoint)\.sm_\d+\.g\d+\.registers$", kind="static"
    ),
    "e2e": _e2e_run,
    "seed": lambda ev: ev.newest(r for r in ev.runs if r.doc.get("kind") == "external"),
}


def host_reduce(ev: Evidence) -> str:
    """Two-rank all-reduce time per call by payload: NCCL, the two modes, the floor."""
    run = PICK["host_reduce"](ev)
    if run is None:
        return missing("the host all-reduce benchmark")
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
    text = "; ".join(extra + [run.caption()]) + _end(ev, run, "host_reduce")
    return "\n".join(out + ["", text[:1].upper() + text[1:]])


_ATTN = re.compile(r"^(?:hd(\d+)\.)?q(\d+)_ctx(\d+)\.(\w+)$")


def attention(ev: Evidence) -> str:
    """The Turing prefill attention against TRITON_ATTN per shape, and the fraction
    of the mma.sync ceiling."""
    run = PICK["attention"](ev)
    if run is None:
        return missing("the Turing attention benchmark")
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
        + [
            "",
            f"mma.sync m16n8k8 ceiling measured in the same run: {ceiling}; {run.caption()}"
            + _end(ev, run, "attention"),
        ]
    )


def variants(ev: Evidence) -> str:
    """The shapes sweep: per head dim, each shape's time and fraction of the
    ceiling at the longest context, beside the shape shipped when it ran;
    each head dim from the newest sweep that timed it (a sweep may cover
    some head dims only), a table per results file."""
    pattern = re.compile(r"^hd\d+\.w\d+m\d+k\d+c\d+.*\.fraction_of_ceiling$")
    runs = [r for r in ev.runs if any(pattern.match(k) for k in r.figures)]
    parts: list[tuple[int, list[str]]] = []
    covered: set[int] = set()
    while runs:
        run = ev.newest(runs)
        assert run is not None
        runs.remove(run)
        # The table's chunk is 2,048 query tokens (a sweep may time others).
        rows_in = [
            r
            for r in run.doc.get("rows", [])
            if r.get("kv") == "paged" and r.get("query_len", 2048) == 2048
        ]
        head_dims = {r["head_dim"] for r in rows_in} - covered
        if head_dims:
            covered |= head_dims
            rows_in = [r for r in rows_in if r["head_dim"] in head_dims]
            parts.append((min(head_dims), _variants_table(ev, run, rows_in)))
    if not parts:
        return missing("a timed shape of the Turing attention's shapes sweep")
    return "\n\n".join("\n".join(lines) for _, lines in sorted(parts))


def _variants_table(ev: Evidence, run: Run, rows_in: list[dict]) -> list[str]:
    longest = max(r["context_len"] for r in rows_in)
    shapes = {v["name"]: v for v in run.doc.get("variants", [])}
    rows = []
    for r in sorted(
        (r for r in rows_in if r["context_len"] == longest),
        key=lambda r: (r["head_dim"], -r["fraction_of_mma_ceiling"]),
    ):
        v = shapes.get(r["variant"], {})
        rows.append(
            [
                str(r["head_dim"]),
                f"`{r['variant']}`" + (" (shipped then)" if v.get("shipped") else ""),
                str(v.get("registers", "-")),
                fmt(r["median_ms"], "ms"),
                fmt(r["fraction_of_mma_ceiling"], "fraction"),
                f"{r['speedup_vs_shipped']:.2f}x",
            ]
        )
    ceiling = fmt(run.value("mma_m16n8k8_ceiling_tflops"), "TFLOP/s")
    return table(
        [
            "head dim",
            "shape",
            "registers (sm_90 from the PTX)",
            f"{rows_in[0]['query_len']:,} after {longest:,}",
            "of the ceiling",
            "against the shape shipped then",
        ],
        rows,
    ) + [
        "",
        f"mma.sync m16n8k8 ceiling measured in the same run: {ceiling}; {run.caption()}"
        + _end(ev, run, "variants"),
    ]


def crossover(ev: Evidence) -> str:
    """From which query length the Turing kernel beats TRITON_ATTN, per head
    dim, context and batch (files before the per-head-dim run: head dim 256,
    keys without the ``hdN.`` prefix)."""
    run = PICK["crossover"](ev)
    if run is None:
        return missing("the crossover benchmark")
    shape = run.doc.get("shape") or {}
    default_hd = int(shape.get("head_dim") or 256)
    cases = {}
    for key in run.figures:
        if m := _CROSSOVER.match(key):
            hd, ctx, dec = m.groups()
            prefix = f"hd{hd}." if hd else ""
            cases[(int(hd or default_hd), int(dec), int(ctx))] = f"{prefix}ctx{ctx}_decodes{dec}"
    rows = []
    for (hd, dec, ctx), key in sorted(cases.items()):
        q = (run.figure(f"{key}.crossover_query_len") or {}).get("value")
        ratio = (run.figure(f"{key}.ratio_at_65") or {}).get("value")
        rows.append(
            [str(hd), f"{ctx:,}", str(dec), "never" if q is None else f"{q:,}", fmt(ratio, "ratio")]
        )
    out = table(
        [
            "head dim",
            "context",
            "decode requests beside",
            "crossover query length",
            "Turing / TRITON_ATTN time at 65 tokens",
        ],
        rows,
    )
    return "\n".join(out + ["", run.caption() + _end(ev, run, "crossover")])


def nvfp4(ev: Evidence) -> str:
    """NVFP4 dequantization bandwidth per shape, and the prefill GEMM against Marlin
    and the emulation kernel (runs before its arm was added record none for it)."""
    run = PICK["nvfp4"](ev)
    if run is None:
        return missing("the NVFP4 benchmark")
    shapes = sorted(
        {k.split(".")[0] for k in run.figures if re.match(r"^\d+x\d+\.", k)},
        key=lambda s: [-int(x) for x in s.split("x")],
    )

    def v(key: str, unit: str) -> str:
        return fmt((run.figure(key) or {}).get("value"), unit)

    rows = [
        [
            s,
            v(f"{s}.marlin.default_tile.fraction_of_copy_bandwidth", "fraction"),
            v(f"{s}.emulation.fraction_of_copy_bandwidth", "fraction"),
            v(f"{s}.m2048.dequant_cublas_ms", "ms"),
            v(f"{s}.m2048.marlin_ms", "ms"),
            v(f"{s}.m2048.emulation_ms", "ms"),
            v(f"{s}.crossover_m", ""),
        ]
        for s in shapes
    ]
    out = table(
        [
            "weight (N x K)",
            "dequantization, Marlin's layout (of the copy bandwidth)",
            "the emulation's dequantization, checkpoint layout",
            "M = 2048: dequantization + cuBLAS",
            "Marlin",
            "EmulationNvFp4LinearKernel",
            "no slower than Marlin from M =",
        ],
        rows,
    )
    copy = fmt(run.value("copy_bandwidth_gbps"), "GB/s")
    return "\n".join(
        out
        + [
            "",
            f"Device-to-device copy bandwidth in the same run: {copy}; this GPU's default "
            f"tile; {run.caption()}" + _end(ev, run, "nvfp4"),
        ]
    )


def static_kernels(ev: Evidence) -> str:
    """ptxas and SASS figures of the series' CUDA kernels per target."""
    run = PICK["static_kernels"](ev)
    if run is None:
        return missing("static evidence of the CUDA kernels")
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
    return "\n".join(out + ["", run.caption() + _end(ev, run, "static_kernels")])


def static_head_dims(ev: Evidence) -> str:
    """The Turing attention kernel per head dim: registers, spills, shared memory, CTAs per SM."""
    run = PICK["static_head_dims"](ev)
    if run is None:
        return missing("static evidence per head dim")
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
    return "\n".join(out + ["", run.caption() + _end(ev, run, "static_head_dims")])


def static_nvfp4(ev: Evidence) -> str:
    """The NVFP4 dequantization's Triton kernels compiled for sm_75 / sm_70, per tile."""
    run = PICK["static_nvfp4"](ev)
    if run is None:
        return missing("static evidence of the NVFP4 kernels")
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
    return "\n".join(out + ["", run.caption() + _end(ev, run, "static_nvfp4")])


def e2e(ev: Evidence) -> str:
    """The end-to-end A/B: prefill per arm, against the reference and the P2P-on ceiling."""
    run = PICK["e2e"](ev)
    if run is None:
        return missing("an end-to-end A/B")
    configs = {a.get("name"): a for a in run.doc.get("arms") or [] if isinstance(a, dict)}
    arms = [
        k.removesuffix(".prefill_total_mean_s")
        for k in run.figures
        if k.endswith(".prefill_total_mean_s")
    ]
    rows = []
    for arm in sorted(arms, key=lambda a: (a != "reference", a)):
        conf = configs.get(arm) or {}
        # The engine arguments of the arm: the host all-reduce's (parallel_config,
        # kernel_config.host_reduce in runs before it moved) and kernel_config's.
        cfg = json.dumps(
            {**(conf.get("parallel_config") or {}), **(conf.get("kernel_config") or {})},
            sort_keys=True,
        )

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
        out
        + [
            "",
            f"Noise floor between the reference boots: {noise}; {run.caption()}"
            + _end(ev, run, "e2e"),
        ]
    )


def seed(ev: Evidence) -> str:
    """The seed's own Turing figures, as the seed states them."""
    run = PICK["seed"](ev)
    if run is None:
        return missing("the seed's figures")
    rows = [
        [str(f.get("label")), fmt(f.get("value"), str(f.get("unit", "")), signed="change" in k)]
        for k, f in run.figures.items()
    ]
    return "\n".join(
        table(["figure (the seed's, not measured by this series)", "value"], rows)
        + ["", run.caption() + "."]
    )
