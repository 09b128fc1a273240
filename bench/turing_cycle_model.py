#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Turing cycle model of paged_prefill_attention_sm75 (a model, not a run).

Per 32-key tile, from the sm_75 SASS of the key loop (results/
sm75_static_paged_prefill_attention.json) and a Turing SM's rates, it gives
the cycles one CTA (8 warps, 1 per SM) spends per tile, then list-schedules
the CTAs of the seed's shapes on a Quadro RTX 8000 (72 SMs, 1.77 GHz) with
the launcher's split rule. See docs/turing_cycle_model.md for assumptions.

    python3 bench/turing_cycle_model.py [--h200-bench results/bench_prefill_attention_h200.json]
"""

import argparse
import heapq
import json
import math
from pathlib import Path

SMS, CLOCK = 72, 1.77e9
GROUP, KV_HEADS, ROWS, KEYS = 6, 2, 128, 32
DRAM_BPS = 672e9

# Per warp per tile, common path of the key loop (sm_75 SASS census).
SASS = {"HMMA": 256, "all": 732, "LDSM": 64, "STS128": 8, "MUFU": 16, "F2F": 16, "FP32": 62}
WARPS_PER_SMSP = 2


def tile_cycles_bound() -> dict:
    tensor = WARPS_PER_SMSP * SASS["HMMA"] * 8  # 128 FMA/clk/SMSP -> 8 clk per m16n8k8
    issue = WARPS_PER_SMSP * SASS["all"]  # 1 warp-instruction per clk per SMSP
    smem = 8 * (SASS["LDSM"] + SASS["STS128"]) * 512 / 128  # 128 B/clk per SM
    mufu = WARPS_PER_SMSP * (SASS["MUFU"] + SASS["F2F"]) * 8  # 4 lanes/clk/SMSP
    fp32 = WARPS_PER_SMSP * SASS["FP32"] * 2  # 16 lanes/clk/SMSP
    # Not overlapped: both warps of an SMSP leave Q.K^T together after each
    # barrier, so the softmax's dependent chain (HMMA drain, max, 2 shuffles,
    # vote, exp2, cvt, first LDSM of P.V) and the barrier wait stay exposed.
    exposed = 300
    return {
        "tensor": tensor,
        "issue": issue,
        "smem": smem,
        "mufu_f2f": mufu,
        "fp32": fp32,
        "exposed_softmax_barrier": exposed,
        "total": max(tensor, issue, smem) + exposed,
    }


def splits_for(ctas: int, slots: int) -> int:
    best, best_w = 1, math.ceil(ctas / slots)
    for s in range(2, 5):
        w = math.ceil(ctas * s / slots)
        if w * best < best_w * s:
            best, best_w = s, w
    return best


def predict_ms(q: int, ctx: int, cycles_per_tile: float, splits: int | None) -> dict:
    rows = q * GROUP
    ctas = math.ceil(rows / ROWS)
    s = splits_for(ctas * KV_HEADS, SMS) if splits is None else splits
    jobs = []
    for c in range(ctas):
        last = min(ROWS * (c + 1), rows) - 1
        tiles = (ctx + last // GROUP) // KEYS + 1
        for k in range(s):
            share = tiles * (k + 1) // s - tiles * k // s
            jobs += [share] * KV_HEADS
    jobs.sort(reverse=True)  # the kernel starts the longest CTAs first
    free = [0.0] * SMS
    heapq.heapify(free)
    for j in jobs:
        heapq.heappush(free, heapq.heappop(free) + j * cycles_per_tile)
    ms = max(free) / CLOCK * 1e3
    if s > 1:  # merge: read s fp32 partials, write fp16
        ms += (q * 12 * 256 * (4 * s + 2)) / DRAM_BPS * 1e3
    return {"splits": s, "ms": ms}


SEED = {  # Quadro RTX 8000, the seed's measured kernel (ms): no split, auto
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--h200-bench")
    a = ap.parse_args()
    bound = tile_cycles_bound()
    print("per-tile cycles (one SMSP, 2 warps):", json.dumps(bound))
    models = {"A (bound + exposed softmax)": bound["total"]}
    if a.h200_bench:
        b = json.loads(Path(a.h200_bench).read_text())
        row = next(
            r for r in b["rows"] if r["query_len"] == 2048 and r["context_len"] == 150 * 1024
        )
        frac = row["auto_split"]["fraction_of_mma_ceiling"]
        # H200: cycles per tile = tensor cycles / fraction; the non-tensor
        # remainder, carried over unchanged in cycles, is added to Turing's
        # tensor cycles (pessimistic: Turing's longer tensor phases hide more).
        h200_tensor = 2 * 256 * 4.5
        models["B (H200 remainder added)"] = bound["tensor"] + h200_tensor / frac - h200_tensor
        models["C (H200 fraction carried over)"] = bound["tensor"] / frac
    print("model cycles per tile:", {k: round(v) for k, v in models.items()})
    hdr = (
        "| shape | seed RTX 8000 (ms) | "
        + " | ".join(f"model {k.split()[0]} no split / auto (ms)" for k in models)
        + " |"
    )
    print(hdr)
    print("|" + "---|" * (2 + len(models)))
    for (q, ctx), (seed_ns, seed_auto) in SEED.items():
        cells = []
        for cyc in models.values():
            ns = predict_ms(q, ctx, cyc, 1)
            au = predict_ms(q, ctx, cyc, None)
            cells.append(f"{ns['ms']:.1f} / {au['ms']:.1f} (s={au['splits']})")
        seed = f"{seed_ns}" + (f" / {seed_auto}" if seed_auto else "")
        print(f"| {q} after {ctx} | {seed} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
