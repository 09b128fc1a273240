#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark of the Turing paged prefill attention on any GPU of CC >= 7.5.

Runs on the GPU machine, where ``vllm._sm7x_C`` is built with compute_75 PTX
and the patched tree's ``vllm`` package (or a minimal copy of it) is on
PYTHONPATH. For the seed's per-rank shapes (12 query heads, 2 KV heads, head
dim 256, causal chunk at the end of a context, pages of 16) it times, in CUDA
graphs, median of many replays after warm-up:

- the kernel without split-KV (num_splits=1),
- the kernel with the automatic split (num_splits=0),
- TRITON_ATTN's unified Triton kernel on the same inputs,

and an mma.sync m16n8k8 (fp16 in, fp32 accumulate) ceiling microbenchmark
built as compute_75 PTX in the same run. It reports time, TFLOPS (causal
FLOPs: 4 * 256 * visible keys per query row) and the kernel's TFLOPS as a
fraction of that ceiling, the figure that carries over to Turing. Figures are
of the GPU it runs on, never of a Turing card.

    python3 bench/prefill_attention.py --out results/bench.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import results  # noqa: E402

try:  # the GPU machine's; document() and the figures need none of it
    import torch
except ImportError:
    torch = None

HEAD = 256
HEADS, KV_HEADS, PAGE = 12, 2, 16
# (query tokens, context tokens before them): the seed's shapes.
SHAPES = [
    (2048, 32 * 1024),
    (2048, 150 * 1024),
    (512, 150 * 1024),
    (96, 150 * 1024),
    (64, 150 * 1024),
    (1600, 30_000),
    (1600, 100_000),
    (1600, 184_000),
    (801, 100_000),
    (801, 184_000),
    (1600, 1600),
]

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
        ["nvcc", "-O3", "-gencode=arch=compute_75,code=compute_75", str(src),
         "-o", str(exe)],
        check=True,
    )
    runs = [float(subprocess.run([str(exe)], capture_output=True, text=True,
                                 check=True).stdout.split()[-1]) for _ in range(3)]
    return {"tflops": max(runs), "runs": runs,
            "build": "nvcc -gencode=arch=compute_75,code=compute_75 (PTX, JIT)"}


def make_inputs(q_len: int, ctx: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seq = q_len + ctx
    pages = math.ceil(seq / PAGE)
    cache = torch.empty((pages + 1, PAGE, KV_HEADS, 2 * HEAD), dtype=torch.float16,
                        device="cuda")
    cache.normal_(generator=gen)
    perm = torch.randperm(pages + 1, generator=gen, device="cuda")[:pages]
    block_table = perm.to(torch.int32)[None, :].contiguous()
    query = torch.randn((q_len, HEADS, HEAD), dtype=torch.float16, device="cuda",
                        generator=gen)
    return dict(
        query=query,
        key_cache=cache[..., :HEAD],
        value_cache=cache[..., HEAD:],
        block_table=block_table,
        cu_seqlens_q=torch.tensor([0, q_len], dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor([seq], dtype=torch.int32, device="cuda"),
        scale=1.0 / math.sqrt(HEAD),
    )


def causal_flops(q_len: int, ctx: int) -> float:
    keys = sum(ctx + t + 1 for t in range(q_len))
    return 4.0 * HEAD * HEADS * keys


def time_graph(fn, reps: int, warmup: int = 3) -> dict:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return {"median_ms": statistics.median(times), "min_ms": min(times),
            "max_ms": max(times), "reps": reps}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-triton", action="store_true")
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

    rows = []
    for q_len, ctx in SHAPES:
        inp = make_inputs(q_len, ctx)
        out = torch.empty_like(inp["query"])
        flops = causal_flops(q_len, ctx)
        row: dict = {"query_len": q_len, "context_len": ctx, "flops": flops}

        def kern(splits: int, out=out, inp=inp):  # bound now: called in this iteration
            return lambda: paged_prefill_attention_sm75(
                out, inp["query"], inp["key_cache"], inp["value_cache"],
                inp["block_table"], inp["cu_seqlens_q"], inp["seq_lens"],
                inp["scale"], num_splits=splits)

        reps = a.reps if ctx + q_len < 120_000 else max(10, a.reps // 2)
        for name, splits in (("no_split", 1), ("auto_split", 0)):
            t = time_graph(kern(splits), reps)
            t["tflops"] = flops / (t["median_ms"] * 1e-3) / 1e12
            t["fraction_of_mma_ceiling"] = t["tflops"] / ceiling["tflops"]
            row[name] = t
        if unified_attention is not None:
            tout = torch.empty_like(inp["query"])
            descale = torch.ones((1, KV_HEADS), dtype=torch.float32, device="cuda")
            seq = q_len + ctx

            def triton_fn(inp=inp, tout=tout, q_len=q_len, seq=seq, descale=descale):
                unified_attention(
                    q=inp["query"], k=inp["key_cache"], v=inp["value_cache"],
                    out=tout, cu_seqlens_q=inp["cu_seqlens_q"], max_seqlen_q=q_len,
                    seqused_k=inp["seq_lens"], max_seqlen_k=seq,
                    softmax_scale=inp["scale"], causal=True, window_size=(-1, -1),
                    block_table=inp["block_table"], softcap=0, q_descale=None,
                    k_descale=descale, v_descale=descale)

            t = time_graph(triton_fn, max(5, reps // 2))
            t["tflops"] = flops / (t["median_ms"] * 1e-3) / 1e12
            row["triton_attn"] = t
            torch.cuda.synchronize()
            row["max_abs_diff_vs_triton_attn"] = (
                (out.float() - tout.float()).abs().max().item())
        rows.append(row)
        line = (f"{q_len:5d} after {ctx:7d}: no split {row['no_split']['median_ms']:8.3f} ms "
                f"({row['no_split']['tflops']:6.1f} TF), "
                f"auto {row['auto_split']['median_ms']:8.3f} ms "
                f"({row['auto_split']['tflops']:6.1f} TF, "
                f"{100 * row['auto_split']['fraction_of_mma_ceiling']:.1f} %)")
        if "triton_attn" in row:
            line += f", TRITON_ATTN {row['triton_attn']['median_ms']:8.3f} ms"
        print(line, flush=True)
        del inp, out
        torch.cuda.empty_cache()

    props = torch.cuda.get_device_properties(0)
    run = {"sm_count": props.multi_processor_count, "triton": _version("triton")}
    doc = document(rows, ceiling, run, results.machine(detail="compute_75 PTX, JIT"),
                   results.current_series(ROOT))
    results.write(a.out, doc)
    return 0


WHAT = ("Turing paged prefill attention (compute_75 PTX, JIT) vs TRITON_ATTN unified kernel; "
        "figures of the GPU it ran on, not Turing figures")
NAMES = {"no_split": "no split", "auto_split": "auto split", "triton_attn": "triton attn"}


def figures(rows: list[dict], ceiling: dict) -> dict:
    """The ceiling, and per shape the median time of each variant and the
    automatic split's fraction of the ceiling."""
    out = {"mma_m16n8k8_ceiling_tflops": results.figure(
        ceiling["tflops"], "TFLOP/s", "mma.sync m16n8k8 ceiling measured in the same run",
        "mma_m16n8k8_ceiling.tflops")}
    for i, row in enumerate(rows):
        q, ctx = row["query_len"], row["context_len"]
        key = f"q{q}_ctx{ctx}"
        for v, name in NAMES.items():
            if v in row:
                out[f"{key}.{v}_ms"] = results.figure(
                    row[v]["median_ms"], "ms", f"{q} query tokens after {ctx:,} of context, "
                    f"{name}, median (CUDA graphs)", f"rows[{i}].{v}.median_ms")
        out[f"{key}.auto_split_fraction_of_ceiling"] = results.figure(
            row["auto_split"]["fraction_of_mma_ceiling"], "fraction",
            f"{q} after {ctx:,}: automatic split, fraction of the mma.sync ceiling",
            f"rows[{i}].auto_split.fraction_of_mma_ceiling")
    return out


def document(rows: list[dict], ceiling: dict, run: dict, machine: dict, series: dict) -> dict:
    """The results file (results/README.md) of one run."""
    body = {"what": WHAT, **run,
            "shape": {"num_heads": HEADS, "num_kv_heads": KV_HEADS, "head_dim": HEAD,
                      "page_size": PAGE, "causal": True},
            "timing": "CUDA graph replay, CUDA events, median of reps after warm-up",
            "mma_m16n8k8_ceiling": ceiling, "rows": rows}
    return results.document("bench", body, machine=machine, series=series,
                            figures=figures(rows, ceiling))


def _version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
