#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark of the Turing paged prefill attention on any GPU of CC >= 7.5.

Runs on the GPU machine, where ``vllm._sm7x_C`` is built with compute_75 PTX
and the patched tree's ``vllm`` package (or a minimal copy of it) is on
PYTHONPATH. For each head dim the kernel serves (64, 128, 256), with the
seed's heads per rank (12 query heads, 2 KV heads), a causal chunk of 2048
query tokens at the end of a context of 0, 8k, 32k and 150k tokens (one
sequence, pages of 16, the cache sized to the sequence so that its offsets
fit the kernel's 32 bits), it times, in CUDA graphs, median of many replays
after warm-up:

- the kernel with the automatic split (num_splits=0, what the route runs),
- the kernel without split-KV (num_splits=1),
- TRITON_ATTN's unified Triton kernel on the same inputs,
- at the longest context, the kernel on as many SMs as a Turing GPU has (72
  for an RTX 8000 / RTX 6000, 40 for a T4), through a CUDA green context of
  that many SMs where torch and the driver offer one, with the split count
  the kernel's rule picks for that many SMs (CUDA events: a green context's
  stream is not captured),

and an mma.sync m16n8k8 (fp16 in, fp32 accumulate) ceiling microbenchmark
built as compute_75 PTX in the same run. It reports time, TFLOPS (causal
FLOPs: 4 * head dim * visible keys per query row), the kernel's TFLOPS as a
fraction of that ceiling and its speed-up over TRITON_ATTN per case. Figures
are of the GPU it runs on (an H200 through compute_75 PTX), never of a
Turing card. About 2 minutes on one H200, most of it Triton's compilation.

    python3 bench/prefill_attention.py --out results/bench.json
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import results  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from timing import time_events, time_graph  # noqa: E402
from turing_cycle_model import splits_for  # noqa: E402

try:  # the GPU machine's; document() and the figures need none of it
    import torch
except ImportError:
    torch = None

HEAD_DIMS = (64, 128, 256)
HEADS, KV_HEADS, PAGE = 12, 2, 16
QUERY = 2048
CONTEXTS = (0, 8 * 1024, 32 * 1024, 150 * 1024)
# SMs of the Turing GPUs the series is for: RTX 8000 / RTX 6000, T4.
TURING_SMS = (72, 40)
# CTAs per SM of each head dim's shipped shape (its traits' launch bound,
# which sm_75's registers and 64 KiB of shared memory allow:
# results/sm75_static_paged_prefill_attention_hd.json).
TURING_CTAS_PER_SM = {64: 2, 128: 1, 256: 1}
# Packed query rows (tokens x query heads per KV head) per CTA: the traits
# of paged_prefill_attention_sm75.cu (warps x row tiles x 16).
ROWS_PER_CTA = {64: 128, 128: 192, 256: 128}

MMA_SRC = r"""
#include <cstdio>
#include <cuda_runtime.h>
__global__ void __launch_bounds__(256) mma_loop(float* out, int iters) {
  // fp16 pairs near 1.0 (never zeros or denormals).
  unsigned a0 = 0x3C003C00u ^ (threadIdx.x & 0xFFu), a1 = 0x3C013BFFu ^ (threadIdx.x & 0x7Fu),
           b = 0x3BF03C10u ^ (threadIdx.x & 0x3Fu);
  float d[8][4] = {};
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      asm volatile(
          "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
          "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
          : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
          : "r"(a0), "r"(a1), "r"(b));
    }
  }
  float s = 0.f;
  for (int j = 0; j < 8; ++j) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
int main() {
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int blocks = sms * 8, threads = 256, iters = 1024;
  float* out; cudaMalloc(&out, blocks * threads * sizeof(float));
  mma_loop<<<blocks, threads>>>(out, 64);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  float best = 1e30f;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(e0);
    mma_loop<<<blocks, threads>>>(out, iters);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); if (ms < best) best = ms;
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) { printf("error %s\n", cudaGetErrorString(err)); return 1; }
  double flops = 2.0 * 16 * 8 * 8 * 8.0 * iters * (blocks * threads / 32.0);
  printf("%.3f\n", flops / (best * 1e-3) / 1e12);
  return 0;
}
"""


def mma_ceiling(workdir: Path) -> dict:
    """m16n8k8 fp16/fp32 peak through compute_75 PTX (JIT on this GPU)."""
    src = workdir / "mma_ceiling.cu"
    exe = workdir / "mma_ceiling"
    src.write_text(MMA_SRC)
    subprocess.run(
        ["nvcc", "-O3", "-gencode=arch=compute_75,code=compute_75", str(src), "-o", str(exe)],
        check=True,
    )
    runs = [
        float(
            subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()[
                -1
            ]
        )
        for _ in range(3)
    ]
    return {
        "tflops": max(runs),
        "runs": runs,
        "build": "nvcc -gencode=arch=compute_75,code=compute_75 (PTX, JIT)",
    }


def make_inputs(q_len: int, ctx: int, head: int, seed: int = 0):
    """One sequence on a cache of just its pages (plus one), shuffled: the
    largest element offset, (pages + 1) x 16 x 2 x 2 x head, stays below 2^31
    for every case here (159 M at 150k and head dim 256)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seq = q_len + ctx
    pages = math.ceil(seq / PAGE)
    cache = torch.empty((pages + 1, PAGE, KV_HEADS, 2 * head), dtype=torch.float16, device="cuda")
    assert cache.numel() < 2**31, "the kernel's cache offsets are 32-bit"
    cache.normal_(generator=gen)
    perm = torch.randperm(pages + 1, generator=gen, device="cuda")[:pages]
    block_table = perm.to(torch.int32)[None, :].contiguous()
    query = torch.randn((q_len, HEADS, head), dtype=torch.float16, device="cuda", generator=gen)
    return dict(
        query=query,
        key_cache=cache[..., :head],
        value_cache=cache[..., head:],
        block_table=block_table,
        cu_seqlens_q=torch.tensor([0, q_len], dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor([seq], dtype=torch.int32, device="cuda"),
        scale=1.0 / math.sqrt(head),
        descale=torch.ones((1, KV_HEADS), dtype=torch.float32, device="cuda"),
    )


def triton_attn(unified_attention, b: dict, out, max_seqlen_q: int, max_seqlen_k: int) -> None:
    """TRITON_ATTN's unified kernel on the inputs of make_inputs (or a batch
    of the same keys), called as the backend calls it for an fp16 cache."""
    unified_attention(
        q=b["query"],
        k=b["key_cache"],
        v=b["value_cache"],
        out=out,
        cu_seqlens_q=b["cu_seqlens_q"],
        max_seqlen_q=max_seqlen_q,
        seqused_k=b["seq_lens"],
        max_seqlen_k=max_seqlen_k,
        softmax_scale=b["scale"],
        causal=True,
        window_size=(-1, -1),
        block_table=b["block_table"],
        softcap=0,
        q_descale=None,
        k_descale=b["descale"],
        v_descale=b["descale"],
    )


def causal_flops(q_len: int, ctx: int, head: int = 256) -> float:
    keys = q_len * ctx + q_len * (q_len + 1) // 2
    return 4.0 * head * HEADS * keys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS))
    ap.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument(
        "--sms",
        type=int,
        nargs="*",
        default=list(TURING_SMS),
        help="SM counts to time the longest context on as well (a green context each); none: skip",
    )
    a = ap.parse_args()

    from vllm.v1.attention.ops.paged_prefill_attention_sm75 import (
        paged_prefill_attention_sm75,
        turing_prefill_available,
    )

    assert turing_prefill_available(), "vllm._sm7x_C not built"
    unified_attention = None
    if not a.no_triton:
        from vllm.v1.attention.ops import triton_unified_attention

        unified_attention = triton_unified_attention.unified_attention

    with tempfile.TemporaryDirectory() as tmp:
        ceiling = mma_ceiling(Path(tmp))
    print(f"mma.sync m16n8k8 ceiling: {ceiling['tflops']:.1f} TFLOP/s", flush=True)

    props = torch.cuda.get_device_properties(0)
    rows = []
    for head in a.head_dims:
        for ctx in a.contexts:
            rows.append(
                run_case(
                    head,
                    QUERY,
                    ctx,
                    a.reps,
                    ceiling,
                    paged_prefill_attention_sm75,
                    unified_attention,
                    a.sms if ctx == max(a.contexts) else (),
                    props.multi_processor_count,
                )
            )
            torch.cuda.empty_cache()

    run = {"sm_count": props.multi_processor_count, "triton": _version("triton")}
    doc = document(
        rows,
        ceiling,
        run,
        results.machine(detail="compute_75 PTX, JIT"),
        results.current_series(ROOT),
    )
    results.write(a.out, doc)
    return 0


def on_sms(num_sms: int, fn, reps: int) -> dict:
    """``fn`` timed with CUDA events on a green context of ``num_sms`` SMs
    (torch.cuda.green_contexts: 2.10 and 2.11 make it current, later
    releases hand out a stream of it)."""
    from torch.cuda.green_contexts import GreenContext

    gc = GreenContext.create(num_sms=num_sms, device_id=torch.cuda.current_device())
    if hasattr(gc, "Stream"):
        with torch.cuda.stream(gc.Stream()):
            return time_events(fn, reps, 3)
    gc.set_context()
    try:
        return time_events(fn, reps, 3)
    finally:
        gc.pop_context()


def run_on_turing_sms(row: dict, kern, head: int, q_len: int, sms, reps, ceiling, device_sms):
    """The kernel on each SM count of ``sms``, with the split count the
    launcher's rule gives a GPU of that many SMs (it reads the device's own
    count, which a green context does not change)."""
    ctas = math.ceil(q_len * HEADS // KV_HEADS / ROWS_PER_CTA[head]) * KV_HEADS
    for n in sms:
        splits, whole = splits_for(ctas, n * TURING_CTAS_PER_SM[head])
        try:
            t = on_sms(n, kern(splits, whole), max(5, reps // 3))
        except Exception as e:  # no green contexts in this torch / driver
            row.setdefault("on_sms", {})[str(n)] = {"error": f"{type(e).__name__}: {e}"}
            print(f"d{head:3d} on {n} SMs: not run ({type(e).__name__}: {e})", flush=True)
            continue
        t["splits"], t["whole_ctas"] = splits, whole
        t["tflops"] = row["flops"] / (t["median_ms"] * 1e-3) / 1e12
        # Against the ceiling scaled to the SMs the kernel had.
        t["fraction_of_mma_ceiling"] = t["tflops"] / (ceiling["tflops"] * n / device_sms)
        row.setdefault("on_sms", {})[str(n)] = t
        print(
            f"d{head:3d} {q_len:5d} on {n:3d} SMs, {splits} splits after {whole} whole CTAs: "
            f"{t['median_ms']:8.3f} ms "
            f"({100 * t['fraction_of_mma_ceiling']:.1f} % of the ceiling for {n} SMs)",
            flush=True,
        )


def run_case(
    head, q_len, ctx, reps, ceiling, kernel, unified_attention, sms=(), device_sms=0
) -> dict:
    """One head dim and context: the kernel with and without split-KV and
    TRITON_ATTN, each in a CUDA graph; and on each of ``sms`` SMs."""
    inp = make_inputs(q_len, ctx, head)
    out = torch.empty_like(inp["query"])
    flops = causal_flops(q_len, ctx, head)
    row: dict = {"head_dim": head, "query_len": q_len, "context_len": ctx, "flops": flops}

    def kern(splits: int, split_from: int = 0):
        return lambda: kernel(
            out,
            inp["query"],
            inp["key_cache"],
            inp["value_cache"],
            inp["block_table"],
            inp["cu_seqlens_q"],
            inp["seq_lens"],
            inp["scale"],
            num_splits=splits,
            split_from=split_from,
        )

    reps = reps if ctx + q_len < 120_000 else max(10, reps // 2)
    for name, splits in (("no_split", 1), ("auto_split", 0)):
        t = time_graph(kern(splits), reps)
        t["tflops"] = flops / (t["median_ms"] * 1e-3) / 1e12
        t["fraction_of_mma_ceiling"] = t["tflops"] / ceiling["tflops"]
        row[name] = t
    if unified_attention is not None:
        tout = torch.empty_like(inp["query"])
        seq = q_len + ctx

        def triton_fn():
            triton_attn(unified_attention, inp, tout, q_len, seq)

        t = time_graph(triton_fn, max(5, reps // 2))
        t["tflops"] = flops / (t["median_ms"] * 1e-3) / 1e12
        row["triton_attn"] = t
        row["speedup_vs_triton_attn"] = t["median_ms"] / row["auto_split"]["median_ms"]
        torch.cuda.synchronize()
        row["max_abs_diff_vs_triton_attn"] = (out.float() - tout.float()).abs().max().item()
    line = (
        f"d{head:3d} {q_len:5d} after {ctx:7d}: no split {row['no_split']['median_ms']:8.3f} ms, "
        f"auto {row['auto_split']['median_ms']:8.3f} ms "
        f"({row['auto_split']['tflops']:6.1f} TF, "
        f"{100 * row['auto_split']['fraction_of_mma_ceiling']:.1f} % of the ceiling)"
    )
    if "triton_attn" in row:
        line += (
            f", TRITON_ATTN {row['triton_attn']['median_ms']:8.3f} ms "
            f"(x{row['speedup_vs_triton_attn']:.2f}), max |diff| "
            f"{row['max_abs_diff_vs_triton_attn']:.2e}"
        )
    print(line, flush=True)
    run_on_turing_sms(row, kern, head, q_len, sms, reps, ceiling, device_sms)
    return row


WHAT = (
    "Turing paged prefill attention (compute_75 PTX, JIT) vs TRITON_ATTN unified kernel, "
    "per head dim; figures of the GPU it ran on, not Turing figures"
)
NAMES = {"no_split": "no split", "auto_split": "auto split", "triton_attn": "triton attn"}


def figures(rows: list[dict], ceiling: dict) -> dict:
    """The ceiling, and per shape the median time of each variant and the
    automatic split's fraction of the ceiling."""
    out = {
        "mma_m16n8k8_ceiling_tflops": results.figure(
            ceiling["tflops"],
            "TFLOP/s",
            "mma.sync m16n8k8 ceiling measured in the same run",
            "mma_m16n8k8_ceiling.tflops",
        )
    }
    for i, row in enumerate(rows):
        q, ctx = row["query_len"], row["context_len"]
        # Files before the head-dim runs (head dim 256 only) name no head dim.
        hd = row.get("head_dim")
        key = f"hd{hd}.q{q}_ctx{ctx}" if hd else f"q{q}_ctx{ctx}"
        what = f"head dim {hd}, " if hd else ""
        for v, name in NAMES.items():
            if v in row:
                out[f"{key}.{v}_ms"] = results.figure(
                    row[v]["median_ms"],
                    "ms",
                    f"{what}{q} query tokens after {ctx:,} of context, {name}, median "
                    "(CUDA graphs)",
                    f"rows[{i}].{v}.median_ms",
                )
        out[f"{key}.auto_split_fraction_of_ceiling"] = results.figure(
            row["auto_split"]["fraction_of_mma_ceiling"],
            "fraction",
            f"{what}{q} after {ctx:,}: automatic split, fraction of the mma.sync ceiling",
            f"rows[{i}].auto_split.fraction_of_mma_ceiling",
        )
        for n, t in row.get("on_sms", {}).items():
            if "median_ms" not in t:
                continue
            out[f"{key}.on_{n}_sms_ms"] = results.figure(
                t["median_ms"],
                "ms",
                f"{what}{q} after {ctx:,} on {n} of the GPU's SMs (a green context), "
                f"{t['splits']} splits, median (CUDA events)",
                f"rows[{i}].on_sms.{n}.median_ms",
            )
            out[f"{key}.on_{n}_sms_fraction_of_ceiling"] = results.figure(
                t["fraction_of_mma_ceiling"],
                "fraction",
                f"{what}{q} after {ctx:,} on {n} SMs: fraction of the mma.sync ceiling "
                f"scaled to {n} SMs",
                f"rows[{i}].on_sms.{n}.fraction_of_mma_ceiling",
            )
        if "speedup_vs_triton_attn" in row:
            out[f"{key}.speedup_vs_triton_attn"] = results.figure(
                row["speedup_vs_triton_attn"],
                "x",
                f"{what}{q} after {ctx:,}: TRITON_ATTN time / automatic split time",
                f"rows[{i}].speedup_vs_triton_attn",
            )
    return out


def document(rows: list[dict], ceiling: dict, run: dict, machine: dict, series: dict) -> dict:
    """The results file (results/README.md) of one run."""
    body = {
        "what": WHAT,
        **run,
        "shape": {
            "num_heads": HEADS,
            "num_kv_heads": KV_HEADS,
            "head_dims": sorted({r.get("head_dim", 256) for r in rows}),
            "page_size": PAGE,
            "causal": True,
        },
        "timing": "CUDA graph replay, CUDA events, median of reps after warm-up",
        "mma_m16n8k8_ceiling": ceiling,
        "rows": rows,
    }
    return results.document(
        "bench", body, machine=machine, series=series, figures=figures(rows, ceiling)
    )


def _version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
