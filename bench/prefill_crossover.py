#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Crossover query length of the Turing prefill attention against TRITON_ATTN.

TritonAttentionImpl takes the Turing kernel (`paged_prefill_attention_sm75`)
for a whole batch once a request in it brings at least
`attention_config.turing_prefill_min_query_len` query tokens (65 by default).
That default comes from the seed's RTX 8000 measurement against
FlashAttention-2's decode kernel, not against TRITON_ATTN's unified kernel,
which is what the route replaces in vLLM. This measures, side by side on the
same inputs, both kernels as the backend calls them, for query lengths
around the threshold after several context lengths, and reports per context
the smallest measured query length from which the Turing kernel stays faster.

On a GPU other than Turing the kernel runs through compute_75 PTX (the
extension built with `python3 -m serieskit build --ptx --link`), so the
figures are figures of that GPU, e.g. an H200, not Turing figures; the
unified kernel is compiled by Triton for the GPU itself. Keep the default
until a Turing measurement exists; this run says where the two kernels cross
on the machine it ran on.

Per shape: both kernels captured in CUDA graphs (the Turing kernel with its
automatic split and its scratch passed, as the route passes it), then
`--warmup` replays of each, then `--reps` rounds of one replay of each,
alternating which goes first, timed with CUDA events; medians. Batches: one
request with a chunk of `q` tokens at the end of `ctx` tokens of context,
optionally with `--decodes` one-token requests beside it (the route sends a
mixed batch to the Turing kernel whole).

    python3 bench/prefill_crossover.py --out results/bench_prefill_crossover_h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import results  # noqa: E402

HEAD = 256
HEADS, KV_HEADS, PAGE = 12, 2, 16  # the seed model's heads per TP rank
QUERY_LENS = [8, 16, 24, 32, 48, 64, 65, 80, 96, 128, 192, 256, 384, 512, 1024]
# 150k tokens of context beside 16 decode requests puts this bench's one
# cache past 32-bit offsets, which the kernel refuses (the route declines
# such a cache before it calls the kernel): measure up to 32k here.
CONTEXTS = [0, 2048, 8192, 32768]
DEFAULT_THRESHOLD = 65


def make_batch(q_len: int, ctx: int, decodes: int, seed: int = 0) -> dict:
    """One chunk of q_len after ctx tokens, and `decodes` one-token requests
    after ctx tokens each; pages shuffled over the cache."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    query_lens = [q_len] + [1] * decodes
    seq_lens = [ctx + q for q in query_lens]
    pages = [math.ceil(s / PAGE) for s in seq_lens]
    num_blocks = sum(pages) + 1
    cache = torch.empty((num_blocks, PAGE, KV_HEADS, 2 * HEAD), dtype=torch.float16, device="cuda")
    cache.normal_(generator=gen)
    perm = torch.randperm(num_blocks, generator=gen, device="cuda").to(torch.int32)
    table = torch.zeros((len(seq_lens), max(pages)), dtype=torch.int32, device="cuda")
    start = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[start : start + n]
        start += n
    cu = [0]
    for q in query_lens:
        cu.append(cu[-1] + q)
    query = torch.randn((cu[-1], HEADS, HEAD), dtype=torch.float16, device="cuda", generator=gen)
    return dict(
        query=query,
        key_cache=cache[..., :HEAD],
        value_cache=cache[..., HEAD:],
        block_table=table,
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        scale=1.0 / math.sqrt(HEAD),
    )


def capture(fn, warmup: int) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def side_by_side(graphs: dict, reps: int) -> dict:
    """Median ms of each graph, replayed in alternating order."""
    names = list(graphs)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        order = names if r % 2 == 0 else names[::-1]
        for n in order:
            e0 = torch.cuda.Event(enable_timing=True)
            e1 = torch.cuda.Event(enable_timing=True)
            e0.record()
            graphs[n].replay()
            e1.record()
            e1.synchronize()
            times[n].append(e0.elapsed_time(e1))
    return {
        n: {
            "median_ms": statistics.median(t),
            "min_ms": min(t),
            "max_ms": max(t),
            "reps": len(t),
        }
        for n, t in times.items()
    }


def crossover(rows: list[dict]) -> int | None:
    """Smallest measured query length from which the Turing kernel is faster
    at it and at every longer measured one (None: never)."""
    best = None
    for row in sorted(rows, key=lambda r: r["query_len"], reverse=True):
        if row["turing_ms"] < row["triton_attn_ms"]:
            best = row["query_len"]
        else:
            break
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    ap.add_argument("--query-lens", type=int, nargs="+", default=QUERY_LENS)
    ap.add_argument("--decodes", type=int, nargs="+", default=[0, 16])
    a = ap.parse_args()

    from vllm.v1.attention.ops.paged_prefill_attention_sm75 import (
        paged_prefill_attention_sm75,
        turing_prefill_image_error,
        turing_prefill_scratch_numel,
    )
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    error = turing_prefill_image_error(torch.accelerator.current_device_index())
    assert error is None, f"the Turing kernel cannot run here: {error}"

    rows = []
    for decodes in a.decodes:
        for ctx in a.contexts:
            for q_len in a.query_lens:
                b = make_batch(q_len, ctx, decodes)
                out_t = torch.empty_like(b["query"])
                out_u = torch.empty_like(b["query"])
                tokens = b["query"].shape[0]
                scratch = torch.empty(
                    turing_prefill_scratch_numel(tokens, HEADS),
                    dtype=torch.float32,
                    device="cuda",
                )
                descale = torch.ones((1, KV_HEADS), dtype=torch.float32, device="cuda")

                def turing(b=b, out=out_t, scratch=scratch):
                    paged_prefill_attention_sm75(
                        out,
                        b["query"],
                        b["key_cache"],
                        b["value_cache"],
                        b["block_table"],
                        b["cu_seqlens_q"],
                        b["seq_lens"],
                        b["scale"],
                        scratch=scratch,
                    )

                def unified(b=b, out=out_u, descale=descale):
                    unified_attention(
                        q=b["query"],
                        k=b["key_cache"],
                        v=b["value_cache"],
                        out=out,
                        cu_seqlens_q=b["cu_seqlens_q"],
                        max_seqlen_q=b["max_query_len"],
                        seqused_k=b["seq_lens"],
                        max_seqlen_k=b["max_seq_len"],
                        softmax_scale=b["scale"],
                        causal=True,
                        window_size=(-1, -1),
                        block_table=b["block_table"],
                        softcap=0,
                        q_descale=None,
                        k_descale=descale,
                        v_descale=descale,
                    )

                reps = a.reps if ctx < 100_000 else max(20, a.reps // 2)
                t = side_by_side(
                    {
                        "turing": capture(turing, a.warmup),
                        "triton_attn": capture(unified, a.warmup),
                    },
                    reps,
                )
                torch.cuda.synchronize()
                row = {
                    "query_len": q_len,
                    "context_len": ctx,
                    "decodes": decodes,
                    "turing_ms": t["turing"]["median_ms"],
                    "triton_attn_ms": t["triton_attn"]["median_ms"],
                    "timing": t,
                    "max_abs_diff": (out_t.float() - out_u.float()).abs().max().item(),
                }
                row["ratio"] = row["turing_ms"] / row["triton_attn_ms"]
                rows.append(row)
                print(
                    f"decodes {decodes:3d} ctx {ctx:7d} q {q_len:5d}: Turing "
                    f"{row['turing_ms']:8.3f} ms, TRITON_ATTN "
                    f"{row['triton_attn_ms']:8.3f} ms ({row['ratio']:.2f}x)",
                    flush=True,
                )
                del b, out_t, out_u, scratch
                torch.cuda.empty_cache()

    figures = {}
    crossovers = {}
    for decodes in a.decodes:
        for ctx in a.contexts:
            sel = [r for r in rows if r["decodes"] == decodes and r["context_len"] == ctx]
            x = crossover(sel)
            key = f"ctx{ctx}_decodes{decodes}"
            crossovers[key] = x
            figures[f"{key}.crossover_query_len"] = {
                "value": x,
                "unit": "tokens",
                "label": (
                    f"smallest measured query length from which the Turing kernel "
                    f"stays faster than TRITON_ATTN, after {ctx:,} tokens of context"
                    f", {decodes} decode requests beside it (None: never)"
                ),
                "from": f"crossovers['{key}']",
            }
            at = {r["query_len"]: r for r in sel}
            if DEFAULT_THRESHOLD in at:
                figures[f"{key}.ratio_at_{DEFAULT_THRESHOLD}"] = {
                    "value": at[DEFAULT_THRESHOLD]["ratio"],
                    "unit": "ratio",
                    "label": (
                        f"Turing / TRITON_ATTN time at the default threshold "
                        f"({DEFAULT_THRESHOLD} query tokens) after {ctx:,} tokens"
                    ),
                    "from": f"rows[query_len={DEFAULT_THRESHOLD},context_len={ctx},"
                    f"decodes={decodes}].ratio",
                }

    props = torch.cuda.get_device_properties(0)
    body = {
        "what": "crossover query length, Turing paged prefill attention vs "
        "TRITON_ATTN's unified kernel, side by side",
        "sm_count": props.multi_processor_count,
        "triton": _version("triton"),
        "shape": {
            "num_heads": HEADS,
            "num_kv_heads": KV_HEADS,
            "head_dim": HEAD,
            "page_size": PAGE,
            "causal": True,
        },
        "timing": "CUDA graphs, alternating replays of both kernels, CUDA "
        f"events; median of {a.reps} (contexts >= 100k: half) after "
        f"{a.warmup} warm-up replays",
        "default_threshold": DEFAULT_THRESHOLD,
        "crossovers": crossovers,
        "rows": rows,
    }
    # The header every results file has (results/README.md): the series as
    # packed for the GPU machine, the machine as probed there.
    doc = results.document(
        "bench",
        body,
        machine=results.machine(detail="the Turing kernel through compute_75 PTX, JIT"),
        series=results.current_series(ROOT),
        figures=figures,
    )
    results.write(a.out, doc)
    print(json.dumps(crossovers, indent=2))
    return 0


def _version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
