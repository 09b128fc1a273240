#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Turing cycle model of paged_prefill_attention_sm75 (a model, not a run).

Per key tile, from the sm_75 SASS census of each head dim's key loop
(results/sm75_static_paged_prefill_attention_hd.json, written by
bench/prefill_attention_static.py) and a Turing SM's rates, it gives the
cycles an SM spends while each of its resident warps does one tile, then
list-schedules the CTAs of a chunk on a Quadro RTX 8000 (72 SMs, 1.77 GHz)
with the launcher's split rule. The same census with an H200's rates gives
the fraction of the mma.sync m16n8k8 ceiling that bench/prefill_attention.py
measures on the H200 (through compute_75 PTX): the issue's target metric.
See docs/turing_cycle_model.md for the assumptions.

    python3 bench/turing_cycle_model.py [--static FILE] \\
        [--h200-bench results/bench_prefill_attention_h200.json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATIC = ROOT / "results" / "sm75_static_paged_prefill_attention_hd.json"
SMS, CLOCK = 72, 1.77e9  # Quadro RTX 8000
HEADS, KV_HEADS = 12, 2  # the seed model's heads per rank
DRAM_BPS = 672e9
# Not overlapped (assumed): the softmax's dependent chain and the barrier of
# a tile, per CTA; other resident CTAs' work covers it in proportion.
EXPOSED = 300


@dataclass(frozen=True)
class Rates:
    """Cycles per warp-instruction of one SM sub-partition (SMSP), and shared
    memory bytes per cycle of the SM."""

    name: str
    hmma: float  # m16n8k8 on the SMSP's tensor pipe
    mufu: float  # MUFU.EX2 and the F2F conversions (assumed the same pipe)
    fp32: float
    smem_bytes: float = 128.0


# Turing: 128 FMA/clk per SMSP (1,024-FMA m16n8k8 in 8 cycles), 4 MUFU lanes,
# 16 FP32 lanes per SMSP, 128 B/clk of shared memory per SM.
TURING = Rates("Turing (TU102)", hmma=8.0, mufu=8.0, fp32=2.0)
# H200 through PTX: 4.5 cycles per m16n8k8 at the measured 462 TFLOP/s
# ceiling, 32 FP32 lanes per SMSP, the same MUFU and shared-memory rates.
H200 = Rates("H200 (mma.sync m16n8k8 ceiling)", hmma=4.5, mufu=8.0, fp32=1.0)


@dataclass(frozen=True)
class Kernel:
    """One head dim's instantiation: its shape and key-loop census."""

    head_dim: int
    warps: int
    ctas_per_sm: int
    keys: int
    hmma: int  # per warp per tile
    instructions: int  # common path per warp per tile
    smem_ops: int  # LDSM + STS (512 B each per warp)
    mufu_cvt: int
    fp32: int
    rows: int  # packed query rows per CTA


def load_kernels(path: Path) -> dict[int, Kernel]:
    doc = json.loads(path.read_text())
    out = {}
    for r in doc["head_dims"]:
        loop = r["key_loop_per_warp_per_tile"]
        c = loop["common_path_by_class"]
        out[r["head_dim"]] = Kernel(
            head_dim=r["head_dim"],
            warps=r["traits"]["warps"],
            ctas_per_sm=r["turing_ctas_per_sm"],
            keys=r["traits"]["keys_per_tile"],
            hmma=c.get("HMMA", 0),
            instructions=loop["common_path"],
            smem_ops=c.get("LDSM", 0) + c.get("STS", 0),
            mufu_cvt=c.get("MUFU", 0) + c.get("conversion", 0),
            fp32=c.get("FP32", 0),
            rows=r["traits"]["rows_per_cta"],
        )
    return out


def load_variants(path: Path) -> dict[str, tuple[Kernel, int]]:
    """The shapes of bench/prefill_attention_variants.py --static: each as a
    Kernel at its Turing residency, with the CTAs per SM an H200 holds."""
    out = {}
    for r in json.loads(path.read_text())["variants"]:
        if r.get("ping_pong"):
            # The loop holds both halves' P V and each warp runs one of
            # them: its census is not one warp's work, so it is not modelled.
            continue
        loop, c = (
            r["key_loop_per_warp_per_tile"],
            r["key_loop_per_warp_per_tile"]["common_path_by_class"],
        )
        k = Kernel(
            head_dim=r["head_dim"],
            warps=r["warps"],
            ctas_per_sm=r["turing_ctas_per_sm"],
            keys=r["keys_per_tile"],
            hmma=c.get("HMMA", 0),
            instructions=loop["common_path"],
            smem_ops=c.get("LDSM", 0) + c.get("STS", 0) + c.get("local (spill)", 0),
            mufu_cvt=c.get("MUFU", 0) + c.get("conversion", 0),
            fp32=c.get("FP32", 0),
            rows=r["warps"] * r["row_tiles_per_warp"] * 16,  # 16 per row tile
        )
        # An H200 SM: 65,536 registers, 227 KiB of shared memory, 64 warps.
        per_thread = -(-r["registers"] // 8) * 8
        h200 = min(
            65536 // (per_thread * 32 * r["warps"]),
            227 * 1024 // r["dynamic_shared_bytes"],
            64 // r["warps"],
        )
        out[r["name"]] = (k, h200)
    return out


def sweep_fractions(path: Path) -> dict[str, float]:
    """Each shape's measured fraction of the ceiling at the sweep's longest
    context (bench/prefill_attention_variants.py's GPU run)."""
    rows = [r for r in json.loads(path.read_text())["rows"] if r["kv"] == "paged"]
    longest = max(r["context_len"] for r in rows)
    return {r["variant"]: r["fraction_of_mma_ceiling"] for r in rows if r["context_len"] == longest}


def variants_table(
    shapes: dict[str, tuple[Kernel, int]], measured: dict[str, float] | None = None
) -> list[str]:
    """The model per shape; with ``measured``, the sweep's H200 fraction beside it."""
    lines = [
        "| shape | warps x CTAs per SM, Turing / H200 | HMMA / instr. / smem ops per warp-tile "
        "| Turing fraction of tensor peak A / S | H200 fraction of the m16n8k8 ceiling A / S |"
        + (" H200 measured |" if measured is not None else ""),
        "|---|---|---|---|---|" + ("---|" if measured is not None else ""),
    ]
    for name, (k, h200_ctas) in shapes.items():
        t, h = round_cycles(k, TURING), round_cycles(k, H200, h200_ctas)
        line = (
            f"| {name} | {k.warps} x {k.ctas_per_sm} / {k.warps} x {h200_ctas} | {k.hmma} / "
            f"{k.instructions} / {k.smem_ops} | {t['tensor'] / t['A']:.0%} / "
            f"{t['tensor'] / t['S']:.0%} | {h['tensor'] / h['A']:.0%} / "
            f"{h['tensor'] / h['S']:.0%} |"
        )
        if measured is not None:
            line += f" {measured[name]:.1%} |" if name in measured else " - |"
        lines.append(line)
    return lines


def round_cycles(k: Kernel, rates: Rates, ctas_per_sm: int | None = None) -> dict:
    """Cycles while every resident warp of an SM does one tile. Model A: the
    pipes overlap, the busiest one sets the time. Model S: shared memory
    serialised with the tensor pipe (with 2 warps per SMSP the ldmatrix ->
    MMA chains stall on a busy shared-memory pipe); it reproduces the H200's
    measured 43.9 % for head dim 256 within a few points."""
    c = ctas_per_sm or k.ctas_per_sm
    w = k.warps * c / 4  # warps per SMSP
    pipes = {
        "tensor": w * k.hmma * rates.hmma,
        "issue": w * k.instructions,
        "mufu": w * k.mufu_cvt * rates.mufu,
        "fp32": w * k.fp32 * rates.fp32,
        "smem": k.warps * c * k.smem_ops * 512 / rates.smem_bytes,
    }
    exposed = EXPOSED / c
    a = max(pipes.values()) + exposed
    s = max(pipes["tensor"], pipes["issue"], pipes["mufu"]) + pipes["smem"] + exposed
    return {**pipes, "exposed": exposed, "A": a, "S": s}


def ceiling_fraction(k: Kernel, rates: Rates, model: str) -> float:
    r = round_cycles(k, rates)
    return r["tensor"] / r[model]


# kPagedPrefillMaxSplits, kPagedPrefillMaxSplitWaves, kPagedPrefillMaxSplitsBelowWave,
# kPagedPrefillMinRangeKeys
MAX_SPLITS, MAX_SPLIT_WAVES, MAX_SPLITS_BELOW_WAVE, MIN_RANGE_KEYS = 16, 6, 4, 512


def splits_for(ctas: int, slots: int) -> tuple[int, int]:
    """The launcher's split (paged_prefill_attention_sm75_split_for): the
    split count and how many of the first CTAs run whole. The CTAs of whole
    waves run whole; the last, partial wave's are split where that finishes
    sooner, in at most MAX_SPLIT_WAVES waves of ranges, and at most
    MAX_SPLITS_BELOW_WAVE ways where there is no whole wave."""
    tail = ctas % slots if ctas > 0 and slots > 0 else 0
    most = MAX_SPLITS_BELOW_WAVE if ctas < slots else MAX_SPLITS
    best, best_w = 1, 1
    for s in range(2, most + 1) if tail else ():
        w = math.ceil(tail * s / slots)
        if w > MAX_SPLIT_WAVES:
            break
        if w * best < best_w * s:
            best, best_w = s, w
    return best, (ctas - tail if best > 1 else 0)


def uniform_splits_for(ctas: int, slots: int) -> int:
    """The split rule before 2026-12-02, kept for the side-by-side in the
    shapes sweep: every CTA split 1 to 4 ways, whichever finishes the CTAs
    in the fewest full-CTA times."""
    best, best_w = 1, math.ceil(ctas / slots)
    for s in range(2, 5):
        w = math.ceil(ctas * s / slots)
        if w * best < best_w * s:
            best, best_w = s, w
    return best


def predict_ms(
    q: int, ctx: int, k: Kernel, cycles_per_round: float, splits: int | None, group: int = 6
) -> dict:
    """A chunk of q tokens after ctx on the RTX 8000: each of an SM's resident
    CTAs advances one tile per round."""
    rows = q * group
    ctas = math.ceil(rows / k.rows)
    slots = SMS * k.ctas_per_sm
    s, whole = splits_for(ctas * KV_HEADS, slots) if splits is None else (splits, 0)
    # Past a wave, the automatic split gives no range fewer than MIN_RANGE_KEYS keys.
    least = MIN_RANGE_KEYS if splits is None and whole else 0
    jobs, units = [], []
    for c in range(ctas):
        last = min(k.rows * (c + 1), rows) - 1
        units += [(ctx + last // group) // k.keys + 1] * KV_HEADS
    # The first CTAs in launch order run whole: the longest (the kernel starts
    # a request's last tiles first).
    units.sort(reverse=True)
    merged = 0  # ranges of the split CTAs, each a partial output the merge reads
    for n, tiles in enumerate(units):
        ways = 1 if n < whole else s
        if ways > 1 and least:
            ways = max(1, min(ways, tiles * k.keys // least))
        if n >= whole and s > 1:
            merged += ways
        jobs += [tiles * (i + 1) // ways - tiles * i // ways for i in range(ways)]
    split = len(units) - whole if s > 1 else 0
    jobs.sort(reverse=True)  # the kernel starts the longest CTAs first
    free = [0.0] * slots
    heapq.heapify(free)
    for j in jobs:
        heapq.heappush(free, heapq.heappop(free) + j * cycles_per_round)
    ms = max(free) / CLOCK * 1e3
    if s > 1 and split:  # merge: read the fp32 partials of each split row, write fp16
        ms += (k.rows * k.head_dim * (4 * merged + 2 * split)) / DRAM_BPS * 1e3
    return {"splits": s, "ms": ms}


def causal_tflops(q: int, ctx: int, head_dim: int, ms: float) -> float:
    keys = q * ctx + q * (q + 1) / 2
    return 4.0 * head_dim * HEADS * keys / (ms * 1e-3) / 1e12


SEED = {  # Quadro RTX 8000, the seed's measured head-dim-256 kernel (ms): no split, auto
    (2048, 32 * 1024): (13.1, None),
    (2048, 150 * 1024): (61.5, None),
    (512, 150 * 1024): (20.0, None),
    (96, 150 * 1024): (19.8, None),
    (64, 150 * 1024): (19.9, None),
    (1600, 30_000): (12.40, 9.71),
    (1600, 100_000): (40.42, 31.75),
    (1600, 184_000): (75.59, 58.47),
    (801, 100_000): (27.08, 17.14),
    (801, 184_000): (49.65, 32.07),
    (1600, 1600): (1.28, 1.08),
}
BENCH_CONTEXTS = (0, 8192, 32768, 153600)  # bench/prefill_attention.py, 2048 tokens


def head_dim_table(kernels: dict[int, Kernel]) -> list[str]:
    lines = [
        "| head dim | warps x CTAs/SM | keys/tile | HMMA / instr. / smem ops / MUFU+F2F "
        "per warp-tile | Turing A / S (cycles per round) | Turing fraction of tensor "
        "peak A / S | H200 fraction of the m16n8k8 ceiling A / S |",
        "|---|---|---|---|---|---|---|",
    ]
    for hd, k in sorted(kernels.items()):
        t, h = round_cycles(k, TURING), round_cycles(k, H200)
        lines.append(
            f"| {hd} | {k.warps} x {k.ctas_per_sm} | {k.keys} | {k.hmma} / {k.instructions} / "
            f"{k.smem_ops} / {k.mufu_cvt} | {t['A']:.0f} / {t['S']:.0f} | "
            f"{t['tensor'] / t['A']:.0%} / {t['tensor'] / t['S']:.0%} | "
            f"{h['tensor'] / h['A']:.0%} / {h['tensor'] / h['S']:.0%} |"
        )
    return lines


def chunk_table(kernels: dict[int, Kernel]) -> list[str]:
    lines = [
        "| head dim | 2048 tokens after | model A: ms (TFLOP/s), split | "
        "model S: ms (TFLOP/s), split |",
        "|---|---|---|---|",
    ]
    for hd, k in sorted(kernels.items()):
        t = round_cycles(k, TURING)
        for ctx in BENCH_CONTEXTS:
            cells = []
            for m in ("A", "S"):
                p = predict_ms(2048, ctx, k, t[m], None)
                cells.append(
                    f"{p['ms']:.2f} ({causal_tflops(2048, ctx, hd, p['ms']):.0f}), s={p['splits']}"
                )
            lines.append(f"| {hd} | {ctx:,} | " + " | ".join(cells) + " |")
    return lines


def h200_check(kernels: dict[int, Kernel], h200_bench: str) -> list[str]:
    """The model's steady-state H200 fraction of the ceiling per head dim
    beside what the H200 benchmark measured (automatic split) per context."""
    rows = json.loads(Path(h200_bench).read_text())["rows"]
    measured: dict[int, dict[int, float]] = {}
    for r in rows:
        if r["query_len"] == 2048:
            frac = r["auto_split"]["fraction_of_mma_ceiling"]
            measured.setdefault(r.get("head_dim", 256), {})[r["context_len"]] = frac
    contexts = sorted({c for m in measured.values() for c in m})
    lines = [
        "| head dim | model A / S (steady state) | "
        + " | ".join(f"measured after {c:,}" for c in contexts)
        + " |",
        "|" + "---|" * (2 + len(contexts)),
    ]
    for hd, k in sorted(kernels.items()):
        h = round_cycles(k, H200)
        cells = [f"{measured.get(hd, {}).get(c, float('nan')):.1%}" for c in contexts]
        lines.append(
            f"| {hd} | {h['tensor'] / h['A']:.0%} / {h['tensor'] / h['S']:.0%} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def seed_table(k: Kernel, h200_bench: str | None) -> list[str]:
    """The head-dim-256 shapes of the seed's measurements, models A, B, C."""
    t = round_cycles(k, TURING)
    models = {"A": t["A"]}
    if h200_bench:
        b = json.loads(Path(h200_bench).read_text())
        row = next(
            r
            for r in b["rows"]
            if (r["query_len"], r["context_len"], r.get("head_dim", 256)) == (2048, 150 * 1024, 256)
        )
        frac = row["auto_split"]["fraction_of_mma_ceiling"]
        # B: the H200's non-tensor cycles per round added unchanged to Turing's
        # tensor cycles; C: the H200's fraction of the ceiling carried over.
        h200_tensor = round_cycles(k, H200)["tensor"]
        models["B"] = t["tensor"] + h200_tensor / frac - h200_tensor
        models["C"] = t["tensor"] / frac
    lines = [
        "| shape | seed RTX 8000 (ms) | "
        + " | ".join(f"model {m} no split / auto (ms)" for m in models)
        + " |",
        "|" + "---|" * (2 + len(models)),
    ]
    for (q, ctx), (seed_ns, seed_auto) in SEED.items():
        cells = []
        for cyc in models.values():
            ns = predict_ms(q, ctx, k, cyc, 1)
            au = predict_ms(q, ctx, k, cyc, None)
            cells.append(f"{ns['ms']:.1f} / {au['ms']:.1f} (s={au['splits']})")
        seed = f"{seed_ns}" + (f" / {seed_auto}" if seed_auto else "")
        lines.append(f"| {q} after {ctx} | {seed} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--static", type=Path, default=STATIC)
    ap.add_argument("--h200-bench")
    ap.add_argument(
        "--variants", type=Path, help="a --static file of bench/prefill_attention_variants.py"
    )
    ap.add_argument(
        "--sweep",
        type=Path,
        nargs="+",
        help="with --variants: that script's GPU runs, measured beside (a later file's "
        "shapes over an earlier's)",
    )
    a = ap.parse_args()
    if a.sweep and not a.variants:
        ap.error("--sweep goes with --variants")
    if a.variants:
        print("MODEL, not a measurement: inputs", a.variants)
        measured = (
            {k: v for f in a.sweep for k, v in sweep_fractions(f).items()} if a.sweep else None
        )
        print("\n".join(variants_table(load_variants(a.variants), measured)))
        return
    kernels = load_kernels(a.static)
    print("MODEL, not a measurement: inputs", a.static.relative_to(ROOT))
    for hd, k in sorted(kernels.items()):
        t = round_cycles(k, TURING)
        print(f"head dim {hd}, Turing cycles per round:", {n: round(v) for n, v in t.items()})
    print()
    print("\n".join(head_dim_table(kernels)))
    print()
    print("\n".join(chunk_table(kernels)))
    if a.h200_bench:
        print()
        print(f"H200 fraction of the m16n8k8 ceiling, model against {a.h200_bench}:")
        print("\n".join(h200_check(kernels, a.h200_bench)))
    if 256 in kernels:
        print()
        print("\n".join(seed_table(kernels[256], a.h200_bench)))


if __name__ == "__main__":
    main()
