#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Crossover query length of the Turing prefill attention against TRITON_ATTN.

On SM75 the TRITON_TURING_ATTN backend sends a batch to the Turing kernel
(`paged_prefill_attention_sm75`) once a request in it brings at least the
query length that the backend's crossover table
(`TURING_PREFILL_MIN_QUERY_LEN`, one table per head size) names for the
request's context length; TRITON_ATTN's unified kernel serves every other
batch. This measures, side by side on the same inputs, both kernels as the
backend calls them, per head size (64, 128, 256), for query lengths after
several context lengths, and reports per head size and context the smallest
measured query length from which the Turing kernel stays faster, and the
table those crossovers make (`proposed_tables`: per context the larger
crossover of the batches with and without decode requests beside, rows kept
where the length changes).

On a GPU other than Turing the kernel runs through compute_75 PTX (the
extension built with `python3 -m serieskit build --ptx --link`), so the
figures are figures of that GPU, e.g. an H200, not Turing figures; the
unified kernel is compiled by Triton for the GPU itself. They give the
shape of the crossover; the backend's table keeps the Turing anchor (no
route below 65 query tokens) on top.

Per shape: both kernels captured in CUDA graphs (the Turing kernel with its
automatic split and its scratch passed, as the backend passes it), then
`--warmup` replays of each, then `--reps` rounds of one replay of each,
alternating which goes first, timed with CUDA events; medians. Batches: one
request with a chunk of `q` tokens at the end of `ctx` tokens of context,
optionally with `--decodes` one-token requests beside it (the backend sends
a mixed batch to the Turing kernel whole).

    python3 bench/prefill_crossover.py --out results/bench_prefill_crossover_h200.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import results  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from prefill_attention import triton_attn  # noqa: E402
from timing import capture_graph  # noqa: E402

try:  # the GPU machine's; the table and figure helpers need none of it
    import torch
except ImportError:
    torch = None

HEAD_DIMS = [64, 128, 256]
HEADS, KV_HEADS, PAGE = 12, 2, 16  # the seed model's heads per TP rank
QUERY_LENS = [8, 16, 24, 32, 48, 64, 65, 80, 96, 128, 192, 256, 384, 512, 1024]
# 150k tokens of context beside 16 decode requests puts this bench's one
# cache past 32-bit offsets, which the kernel refuses (the route declines
# such a cache before it calls the kernel): measure up to 32k here.
CONTEXTS = [0, 2048, 8192, 32768]
DEFAULT_THRESHOLD = 65


def make_batch(head: int, q_len: int, ctx: int, decodes: int, seed: int = 0) -> dict:
    """One chunk of q_len after ctx tokens, and `decodes` one-token requests
    after ctx tokens each; pages shuffled over the cache."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    query_lens = [q_len] + [1] * decodes
    seq_lens = [ctx + q for q in query_lens]
    pages = [math.ceil(s / PAGE) for s in seq_lens]
    num_blocks = sum(pages) + 1
    cache = torch.empty((num_blocks, PAGE, KV_HEADS, 2 * head), dtype=torch.float16, device="cuda")
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
    query = torch.randn((cu[-1], HEADS, head), dtype=torch.float16, device="cuda", generator=gen)
    return dict(
        query=query,
        key_cache=cache[..., :head],
        value_cache=cache[..., head:],
        block_table=table,
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device="cuda"),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        scale=1.0 / math.sqrt(head),
        descale=torch.ones((1, KV_HEADS), dtype=torch.float32, device="cuda"),
    )


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


def measure(kernels, head: int, q_len: int, ctx: int, decodes: int, reps: int, warmup: int):
    """One shape: both kernels in CUDA graphs, replayed side by side."""
    kernel, scratch_numel, unified_attention = kernels
    b = make_batch(head, q_len, ctx, decodes)
    out_t = torch.empty_like(b["query"])
    out_u = torch.empty_like(b["query"])
    device = torch.accelerator.current_device_index()
    numel = scratch_numel(b["query"].shape[0], HEADS, KV_HEADS, head, device)
    scratch = torch.empty(numel, dtype=torch.float32, device="cuda")

    def turing():
        kernel(
            out_t,
            b["query"],
            b["key_cache"],
            b["value_cache"],
            b["block_table"],
            b["cu_seqlens_q"],
            b["seq_lens"],
            b["scale"],
            scratch=scratch,
        )

    def unified():
        triton_attn(unified_attention, b, out_u, b["max_query_len"], b["max_seq_len"])

    reps = reps if ctx < 100_000 else max(20, reps // 2)
    graphs = {
        "turing": capture_graph(turing, 3, warmup),
        "triton_attn": capture_graph(unified, 3, warmup),
    }
    t = side_by_side(graphs, reps)
    torch.cuda.synchronize()
    row = {
        "head_dim": head,
        "query_len": q_len,
        "context_len": ctx,
        "decodes": decodes,
        "turing_ms": t["turing"]["median_ms"],
        "triton_attn_ms": t["triton_attn"]["median_ms"],
        "timing": t,
        "max_abs_diff": (out_t.float() - out_u.float()).abs().max().item(),
    }
    row["ratio"] = row["turing_ms"] / row["triton_attn_ms"]
    print(
        f"d{head:3d} decodes {decodes:3d} ctx {ctx:7d} q {q_len:5d}: Turing "
        f"{row['turing_ms']:8.3f} ms, TRITON_ATTN {row['triton_attn_ms']:8.3f} ms "
        f"({row['ratio']:.2f}x)",
        flush=True,
    )
    return row


def case_figures(
    key: str, head: int, ctx: int, decodes: int, x: int | None, sel: list[dict]
) -> dict:
    """The crossover of one head dim, context and batch, and the time ratio
    at the Turing anchor's 65 tokens where measured."""
    out = {
        f"{key}.crossover_query_len": results.figure(
            x,
            "tokens",
            f"head dim {head}: smallest measured query length from which the "
            f"Turing kernel stays faster than TRITON_ATTN, after {ctx:,} tokens "
            f"of context, {decodes} decode requests beside it (None: never)",
            f"crossovers['{key}']",
        )
    }
    at = {r["query_len"]: r for r in sel}
    if DEFAULT_THRESHOLD in at:
        out[f"{key}.ratio_at_{DEFAULT_THRESHOLD}"] = results.figure(
            at[DEFAULT_THRESHOLD]["ratio"],
            "ratio",
            f"head dim {head}: Turing / TRITON_ATTN time at {DEFAULT_THRESHOLD} "
            f"query tokens after {ctx:,} tokens",
            f"rows[head_dim={head},query_len={DEFAULT_THRESHOLD},context_len={ctx},"
            f"decodes={decodes}].ratio",
        )
    return out


def proposed_table(
    crossovers: dict, head: int, contexts: list[int], decodes: list[int]
) -> list[list[int]] | None:
    """(context, query length) rows: per measured context the larger
    crossover of the batches with and without decodes beside, kept where it
    changes; each row holds from its context to the next measured one. None
    where the kernel never stays ahead at some context."""
    table: list[list[int]] = []
    for ctx in sorted(contexts):
        xs = [crossovers[f"hd{head}.ctx{ctx}_decodes{d}"] for d in decodes]
        if any(x is None for x in xs):
            return None
        q = max(xs)
        if not table or table[-1][1] != q:
            table.append([ctx, q])
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--contexts", type=int, nargs="+", default=CONTEXTS)
    ap.add_argument("--query-lens", type=int, nargs="+", default=QUERY_LENS)
    ap.add_argument("--decodes", type=int, nargs="+", default=[0, 16])
    ap.add_argument("--head-dims", type=int, nargs="+", default=HEAD_DIMS)
    a = ap.parse_args()

    from vllm.v1.attention.ops.paged_prefill_attention_sm75 import (
        paged_prefill_attention_sm75,
        turing_prefill_image_error,
        turing_prefill_scratch_numel,
    )
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    error = turing_prefill_image_error(torch.accelerator.current_device_index())
    assert error is None, f"the Turing kernel cannot run here: {error}"

    kernels = (paged_prefill_attention_sm75, turing_prefill_scratch_numel, unified_attention)
    rows: list[dict] = []
    for head in a.head_dims:
        for decodes, ctx, q_len in itertools.product(a.decodes, a.contexts, a.query_lens):
            rows.append(measure(kernels, head, q_len, ctx, decodes, a.reps, a.warmup))
            torch.cuda.empty_cache()  # the shape's buffers, before the next one's
        # Written after each head dim: a run cut short keeps what it measured.
        done = a.head_dims[: a.head_dims.index(head) + 1]
        crossovers = write(a, done, rows)
    print(json.dumps(crossovers, indent=2))
    return 0


def write(a: argparse.Namespace, head_dims: list[int], rows: list[dict]) -> dict:
    """The results file of the head dims measured so far; their crossovers."""
    figures: dict = {}
    crossovers: dict = {}
    for head, decodes, ctx in itertools.product(head_dims, a.decodes, a.contexts):
        sel = [
            r
            for r in rows
            if (r["head_dim"], r["decodes"], r["context_len"]) == (head, decodes, ctx)
        ]
        key = f"hd{head}.ctx{ctx}_decodes{decodes}"
        crossovers[key] = crossover(sel)
        figures.update(case_figures(key, head, ctx, decodes, crossovers[key], sel))
    tables = {
        str(head): proposed_table(crossovers, head, a.contexts, a.decodes) for head in head_dims
    }
    for hd, table in tables.items():
        figures[f"hd{hd}.proposed_table"] = results.figure(
            table,
            "[[context tokens, query tokens]]",
            f"head dim {hd}: per context the larger crossover of the batches "
            "measured, rows where it changes (before the Turing anchor of 65)",
            f"proposed_tables['{hd}']",
        )
    props = torch.cuda.get_device_properties(0)
    body = {
        "what": "crossover query length, Turing paged prefill attention vs "
        "TRITON_ATTN's unified kernel, side by side",
        "sm_count": props.multi_processor_count,
        "triton": _version("triton"),
        "shape": {
            "num_heads": HEADS,
            "num_kv_heads": KV_HEADS,
            "head_dims": head_dims,
            "page_size": PAGE,
            "causal": True,
        },
        "timing": "CUDA graphs, alternating replays of both kernels, CUDA "
        f"events; median of {a.reps} (contexts >= 100k: half) after "
        f"{a.warmup} warm-up replays",
        "default_threshold": DEFAULT_THRESHOLD,
        "crossovers": crossovers,
        "proposed_tables": tables,
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
    return crossovers


def _version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
