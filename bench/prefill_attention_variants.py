#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sweep of the Turing prefill attention's shapes: the shipped traits per
head dim beside the alternatives that fit a Turing SM, on one GPU in one run.

The shapes are those of ``bench/prefill_attention_variants.cu``, loaded
through bench/sm75_prefill_lib.py (no vLLM, no torch extension). Modes:

- ``--prepare DIR`` (here): the kernel's files and the series' stamps, for
  a GPU machine that has no assembled tree (the call carries DIR).
- ``--static`` (no GPU): sm_75 machine code of every shape, registers,
  spills, resident CTAs per Turing SM and the key loop's census per warp and
  tile, as bench/prefill_attention_static.py reads the shipped ones.
- ``--build LIB``: only the GPU build (compute_75 PTX), for the profiler.
- the GPU run: the mma.sync m16n8k8 ceiling (bench/prefill_attention.py's)
  and bench/mma_microbench.py at the kernel's occupancy; every shape against
  a float64 reference on ragged batches (outputs poisoned with NaN,
  automatic and forced splits); then each shape timed in CUDA graphs, median
  after warm-up, the shapes of a case in turn over four rounds, on 2048
  query tokens (or --queries) after 32,768 and 153,600 of context, as a
  fraction of that ceiling and against the shipped shape, and the shipped
  shapes once more on L2-resident keys.
  H200 figures through compute_75 PTX, never Turing figures. About 3
  minutes on one H200.

    python3 bench/prefill_attention_variants.py --static --out results/x.json
    python3 bench/prefill_attention_variants.py --prepare .dev/gpu/kernel
    python3 bench/prefill_attention_variants.py --tree .dev/gpu/kernel --out $OUT/x.json
    python3 bench/prefill_attention_variants.py --tree .dev/gpu/kernel --head-dims 256 --out ...
    python3 bench/prefill_attention_variants.py --tree .dev/gpu/kernel --queries 1408 2048 ...
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from prefill_attention import QUERY  # noqa: E402
from sm75_prefill_lib import (  # noqa: E402
    KERNEL_FILES,
    PTX,
    auto_split,
    build_library,
    launcher,
    load,
    nvcc_command,
    params_for,
    scratch_for,
    time_on_sms,
    traits_key,
    variants,
)
from timing import time_interleaved  # noqa: E402

from serieskit import results  # noqa: E402
from serieskit.build import build  # noqa: E402

CONTEXTS = (32 * 1024, 150 * 1024)
ROUNDS = 4  # the runs of a case are timed in turn, this many times (timing.in_rounds)
# (query lengths, context lengths, query heads, KV heads, page size): ragged
# batches with a request of one token, one that starts a sequence, and one
# whose chunk crosses several pages and tiles.
CHECKS = (
    ((77, 1, 300, 129), (0, 45, 1200, 3000), 12, 2, 16),
    ((200, 5, 64), (333, 0, 2500), 8, 1, 64),
    ((150, 31), (70, 511), 4, 4, 32),
)
# (split count, CTAs run whole first) of each check: automatic, unsplit,
# every CTA split 3 and 16 ways (more ranges than some CTAs have tiles), and
# the later CTAs alone split, as the automatic split does past a whole wave.
SPLITS_CHECKED = ((0, 0), (1, 0), (3, 0), (16, 0), (5, 2), (11, 7))


def static_rows(lib: ctypes.CDLL, usage: list[build.Usage], sass: str) -> list[dict]:
    """Per shape: ptxas usage on sm_75, Turing residency and the key loop."""
    import prefill_attention_static as st

    funcs = st.parse_sass(sass)
    by_traits = {
        traits: u for u in usage if u.arch == "75" and (traits := st.traits_of(u.function))
    }
    rows = []
    for v in variants(lib):
        u = by_traits[traits_key(v)]
        hmma_per_tile = v["head_dim"] * v["keys_per_tile"] * v["row_tiles_per_warp"] // 32
        rows.append(
            {
                **v,
                "registers": u.registers,
                "spill_stores": u.spill_stores,
                "spill_loads": u.spill_loads,
                "turing_ctas_per_sm": st.turing_ctas_per_sm(
                    u.registers, 32 * v["warps"], v["dynamic_shared_bytes"]
                ),
                "hmma_per_warp_per_tile": hmma_per_tile,
                "key_loop_per_warp_per_tile": st.key_loop(funcs.get(u.function, []), hmma_per_tile),
            }
        )
    return rows


def run_static(tree: Path) -> tuple[list[dict], dict]:
    import prefill_attention_static as st

    if (bindir := st.sass_tools()) is not None:
        os.environ["PATH"] = f"{os.environ['PATH']}{os.pathsep}{bindir}"
    with tempfile.TemporaryDirectory() as tmp:
        path, usage = build_library(tree, Path(tmp), ["-gencode=arch=compute_75,code=sm_75"])
        sass = subprocess.run(
            ["cuobjdump", "-sass", str(path)], capture_output=True, text=True, check=True
        ).stdout
        rows = static_rows(load(path), usage, sass)
    for r in rows:
        loop = r["key_loop_per_warp_per_tile"] or {}
        print(
            f"{r['name']:26s}{' (shipped)' if r['shipped'] else '          '} "
            f"{r['registers']} registers, spills {r['spill_stores']}/{r['spill_loads']} B, "
            f"{r['turing_ctas_per_sm']} CTAs x {r['warps']} warps per Turing SM; key loop "
            f"{r['hmma_per_warp_per_tile']} HMMA in {loop.get('common_path')} instructions",
            flush=True,
        )
    return rows, {"nvcc": build.nvcc_version(os.environ.get("NVCC", "nvcc"))}


# --- GPU ----------------------------------------------------------------------------


def ragged_inputs(
    torch, q_lens, ctx_lens, heads, kv_heads, page, hd, seed=0, device="cuda", q_std=1.0
) -> dict:
    """Requests on one shuffled page pool, random fp16 everywhere (queries
    with standard deviation ``q_std``: 3 makes a sharp softmax)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pages = [math.ceil((q + c) / page) for q, c in zip(q_lens, ctx_lens, strict=True)]
    pool = torch.empty((sum(pages) + 3, page, kv_heads, 2 * hd), dtype=torch.float16, device=device)
    pool.normal_(generator=gen)
    perm = torch.randperm(pool.shape[0], generator=gen, device=device)
    table = torch.zeros((len(q_lens), max(pages)), dtype=torch.int32, device=device)
    at = 0
    for i, n in enumerate(pages):
        table[i, :n] = perm[at : at + n].to(torch.int32)
        at += n
    cu = [0]
    for q in q_lens:
        cu.append(cu[-1] + q)
    return dict(
        query=(
            torch.randn((cu[-1], heads, hd), dtype=torch.float32, device=device, generator=gen)
            * q_std
        ).half(),
        key_cache=pool[..., :hd],
        value_cache=pool[..., hd:],
        block_table=table,
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(
            [q + c for q, c in zip(q_lens, ctx_lens, strict=True)], dtype=torch.int32, device=device
        ),
        scale=1.0 / math.sqrt(hd),
    )


def reference(torch, inp: dict, q_lens, ctx_lens):
    """float64 causal attention from the same pages: output and LSE."""
    q, kc, vc = inp["query"], inp["key_cache"], inp["value_cache"]
    device = q.device
    heads, kvh, hd = q.shape[1], kc.shape[2], q.shape[2]
    group, page = heads // kvh, kc.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=device)
    lse = torch.zeros((heads, q.shape[0]), dtype=torch.float64, device=device)
    start = 0
    for i, (ql, ctx) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        s = ql + ctx
        blocks = inp["block_table"][i, : math.ceil(s / page)].long()
        k = kc[blocks].reshape(-1, kvh, hd)[:s].double()
        v = vc[blocks].reshape(-1, kvh, hd)[:s].double()
        allowed = (
            torch.arange(s, device=device)[None, :]
            <= ctx + torch.arange(ql, device=device)[:, None]
        )
        for h in range(heads):
            sc = (q[start : start + ql, h].double() @ k[:, h // group].T) * inp["scale"]
            sc = sc.masked_fill(~allowed, -math.inf)
            lse[h, start : start + ql] = torch.logsumexp(sc, dim=-1)
            out[start : start + ql, h] = torch.softmax(sc, dim=-1) @ v[:, h // group]
        start += ql
    return out, lse


def one_hot_queries(torch, inp: dict, q_lens, ctx_lens, gain: float = 600.0, seed: int = 1) -> None:
    """Each query row made ``gain`` times one key it sees (a random one of
    its causal range, from the pages): scores of about 10^4 in the log2
    domain, a softmax that is one key."""
    q, kc, table = inp["query"], inp["key_cache"], inp["block_table"]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    heads, kvh, page = q.shape[1], kc.shape[2], kc.shape[1]
    start = 0
    for i, (ql, ctx) in enumerate(zip(q_lens, ctx_lens, strict=True)):
        for t in range(ql):
            pos = int(torch.randint(0, ctx + t + 1, (1,), generator=gen))
            key = kc[table[i, pos // page].long(), pos % page]  # (kv heads, hd)
            q[start + t] = (key.float().repeat_interleave(heads // kvh, 0) * gain).half()
        start += ql


def check_sharp(torch, lib, vs: list[dict]) -> dict[str, dict]:
    """Per shape, on sharp softmaxes (queries of std 3, and one-hot rows):
    the largest error against float64 and its RMS, automatic split. The
    shapes differ here in their row sums (kRowSums): the numbers that
    show whether a dominant key's fp16 rounding reaches the output."""
    out: dict[str, dict] = {}
    for hd in sorted({v["head_dim"] for v in vs}):
        for mode in ("std3", "one_hot"):
            for q_lens, ctx_lens, heads, kvh, page in CHECKS:
                inp = ragged_inputs(
                    torch, q_lens, ctx_lens, heads, kvh, page, hd, seed=7, q_std=3.0
                )
                if mode == "one_hot":
                    one_hot_queries(torch, inp, q_lens, ctx_lens)
                ref, _ = reference(torch, inp, q_lens, ctx_lens)
                scratch = scratch_for(torch, inp["query"], len(q_lens), kvh)
                for v in (v for v in vs if v["head_dim"] == hd):
                    o = torch.full_like(inp["query"], float("nan"))
                    lse = torch.empty((heads, o.shape[0]), dtype=torch.float32, device="cuda")
                    launcher(torch, lib, v["index"], params_for(torch, inp, o, lse, scratch), 0)()
                    torch.cuda.synchronize()
                    err = (o.double() - ref).abs()
                    w = out.setdefault(v["name"], {}).setdefault(
                        mode, {"max_abs_err": 0.0, "sq": 0.0, "n": 0, "max_abs_ref": 0.0}
                    )
                    w["max_abs_err"] = max(w["max_abs_err"], err.max().item())
                    w["max_abs_ref"] = max(w["max_abs_ref"], ref.abs().max().item())
                    w["sq"] += (err**2).sum().item()
                    w["n"] += err.numel()
    for modes in out.values():
        for w in modes.values():
            w["rms_err"] = math.sqrt(w.pop("sq") / w.pop("n"))
    return out


def check_variants(torch, lib, vs: list[dict]) -> dict[str, dict]:
    """Max error of each shape against float64, beside the shipped shape's,
    over the ragged batches and SPLITS_CHECKED."""
    worst: dict[str, dict] = {v["name"]: {"max_abs_err": 0.0, "max_lse_err": 0.0} for v in vs}
    for hd in sorted({v["head_dim"] for v in vs}):
        for q_lens, ctx_lens, heads, kvh, page in CHECKS:
            inp = ragged_inputs(torch, q_lens, ctx_lens, heads, kvh, page, hd)
            ref, ref_lse = reference(torch, inp, q_lens, ctx_lens)
            scratch = scratch_for(torch, inp["query"], len(q_lens), kvh)
            for v in (v for v in vs if v["head_dim"] == hd):
                for splits, split_from in SPLITS_CHECKED:
                    out = torch.full_like(inp["query"], float("nan"))
                    lse = torch.full(
                        ref_lse.shape, float("nan"), dtype=torch.float32, device="cuda"
                    )
                    p = params_for(torch, inp, out, lse, scratch)
                    w = worst[v["name"]]
                    try:
                        launcher(torch, lib, v["index"], p, splits, split_from)()
                        torch.cuda.synchronize()
                    except RuntimeError as e:
                        # A launch the GPU refused (resources): this shape
                        # is left out of the timing, the others go on.
                        w["error"] = str(e)
                        print(f"{v['name']}: {e}", flush=True)
                        continue
                    finite = bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
                    w["finite"] = w.get("finite", True) and finite
                    w["max_abs_err"] = max(
                        w["max_abs_err"], (out.double() - ref).abs().max().item()
                    )
                    w["max_lse_err"] = max(
                        w["max_lse_err"], (lse.double() - ref_lse).abs().max().item()
                    )
    for hd in sorted({v["head_dim"] for v in vs}):
        base = next(worst[v["name"]] for v in vs if v["head_dim"] == hd and v["shipped"])
        for v in (v for v in vs if v["head_dim"] == hd):
            w = worst[v["name"]]
            # The tests' bound: the shipped kernel's error (itself held to
            # TRITON_ATTN's) plus one fp16 ulp at the output's magnitude.
            w["ok"] = (
                "error" not in w
                and w.get("finite", False)
                and w["max_abs_err"] <= base["max_abs_err"] + 2**-11
                and w["max_lse_err"] <= 2e-3
            )
    return worst


def time_variants(
    torch, lib, vs: list[dict], contexts, reps: int, ceiling: float, queries=(QUERY,)
) -> list[dict]:
    """Each shape on bench/prefill_attention.py's cases, automatic split; the
    shipped shape also with every page of the table one of 64 (the keys an
    L2-resident 1,024 repeated): what the loads from memory cost it; and
    with the split of the previous rule (uniform_splits_for), beside the
    launcher's. ``queries``: the query lengths, e.g. ones whose CTAs fill
    whole waves beside 2,048, whose last wave is split."""
    from prefill_attention import KV_HEADS, causal_flops, make_inputs
    from turing_cycle_model import uniform_splits_for

    device_sms = torch.cuda.get_device_properties(0).multi_processor_count

    rows = []
    for hd, query, ctx in (
        (hd, q, c) for hd in sorted({v["head_dim"] for v in vs}) for q in queries for c in contexts
    ):
        inp = make_inputs(query, ctx, hd)
        resident = dict(
            inp,
            block_table=(torch.arange(inp["block_table"].shape[1], device="cuda") % 64)
            .to(torch.int32)[None, :]
            .contiguous(),
        )
        scratch = scratch_for(torch, inp["query"], 1, KV_HEADS)
        flops = causal_flops(query, ctx, hd)
        shipped_out = None
        runs = [(v, "paged", inp) for v in vs if v["head_dim"] == hd]
        for kind, case in (("l2_resident", resident), ("previous_rule", inp)):
            runs += [(v, kind, case) for v in vs if v["head_dim"] == hd and v["shipped"]]
        # Every run of the case set up first, then timed in interleaved
        # rounds, so that a drift of the clocks falls on the shapes alike.
        planned = []
        for v, kv, case in runs:
            out = torch.empty_like(inp["query"])
            p = params_for(torch, case, out, None, scratch)
            split = auto_split(lib, v["index"], p)
            if kv == "previous_rule":
                ctas = -(-query * (p.num_heads // KV_HEADS) // v["rows_per_cta"]) * KV_HEADS
                split = uniform_splits_for(ctas, device_sms * v["ctas_per_sm"]), 0
            planned.append((v, kv, out, p, split, launcher(torch, lib, v["index"], p, *split)))
        n = reps if ctx < 100_000 else max(10, reps // 2)
        times = time_interleaved([fn for *_, fn in planned], n, ROUNDS)
        torch.cuda.synchronize()
        for (v, kv, out, _p, split, _fn), t in zip(planned, times, strict=True):
            row = {
                "variant": v["name"],
                "kv": kv,
                "head_dim": hd,
                "query_len": query,
                "context_len": ctx,
                "splits": split[0],
                "whole_ctas": split[1],
                **t,
                "tflops": flops / (t["median_ms"] * 1e-3) / 1e12,
            }
            row["fraction_of_mma_ceiling"] = row["tflops"] / ceiling
            if kv != "l2_resident":
                if v["shipped"] and kv == "paged":
                    shipped_out = out.clone()
                if shipped_out is not None:
                    diff = (out.float() - shipped_out.float()).abs().max().item()
                    row["max_abs_diff_vs_shipped"] = diff
            rows.append(row)
            print(
                f"{v['name']:26s} {kv:11s} {query} after {ctx:7d}: {t['median_ms']:8.3f} ms, "
                f"{row['tflops']:6.1f} TF ({100 * row['fraction_of_mma_ceiling']:.1f} %), "
                f"{row['splits']} splits after {row['whole_ctas']} whole CTAs",
                flush=True,
            )
        del planned
        del inp, resident, scratch
        torch.cuda.empty_cache()
    for r in rows:
        base = next(
            x
            for x in rows
            if (x["head_dim"], x["query_len"], x["context_len"], x["kv"])
            == (r["head_dim"], r["query_len"], r["context_len"], "paged")
        )
        r["speedup_vs_shipped"] = base["median_ms"] / r["median_ms"]
    return rows


def run_gpu(
    tree: Path, reps: int, contexts, head_dims=None, sms=(), queries=(QUERY,)
) -> tuple[dict, dict]:
    import torch
    from mma_microbench import describe, mma_microbench
    from prefill_attention import mma_ceiling

    with tempfile.TemporaryDirectory() as tmp:
        ceiling = mma_ceiling(Path(tmp))
        micro = mma_microbench(Path(tmp))
        print(f"mma.sync m16n8k8 ceiling: {ceiling['tflops']:.1f} TFLOP/s", flush=True)
        for o in micro:
            print(f"  {describe(o)}", flush=True)
        path, _ = build_library(tree, Path(tmp), [PTX])
        lib = load(path)
        vs = [v for v in variants(lib) if not head_dims or v["head_dim"] in head_dims]
        for v in vs:
            attr = (ctypes.c_int * 5)()
            err = lib.sm75v_attributes(v["index"], attr)
            if err:
                sys.exit(f"error: {v['name']}: CUDA error {err} reading its attributes")
            v["registers"], v["local_bytes"], v["ctas_per_sm"] = attr[0], attr[1], attr[2]
        checks = check_variants(torch, lib, vs)
        for v in vs:
            v["check"] = checks[v["name"]]
            print(f"{v['name']:26s} check {v['check']}", flush=True)
        launched = [v for v in vs if "error" not in v["check"]]
        for name, modes in check_sharp(torch, lib, launched).items():
            v = next(v for v in vs if v["name"] == name)
            v["check_sharp"] = modes
            print(f"{name:26s} sharp {modes}", flush=True)
        good = [v for v in vs if v["check"]["ok"]]
        timed = time_variants(torch, lib, good, contexts, reps, ceiling["tflops"], queries)
        on = time_on_sms(torch, lib, good, sms, ceiling["tflops"]) if sms else []
    return {
        **({"on_sms": on} if on else {}),
        "mma_m16n8k8_ceiling": ceiling,
        "mma_microbench": micro,
        "variants": vs,
        "rows": timed,
        "timing": (
            "CUDA graph replay, CUDA events, median of reps after warm-up, the runs of a "
            f"case interleaved in {ROUNDS} rounds (bench/timing.py's time_interleaved; a "
            "row's timing says 'events' where capture failed)"
        ),
    }, {"sm_count": torch.cuda.get_device_properties(0).multi_processor_count}


def figures_static(rows: list[dict]) -> dict:
    out = {}
    for i, r in enumerate(rows):
        for key, unit, what in (
            ("registers", "registers", "registers per thread"),
            ("spill_stores", "bytes", "spill stores"),
            ("turing_ctas_per_sm", "CTAs", "resident CTAs per Turing SM"),
        ):
            out[f"{r['name']}.{key}"] = results.figure(
                r[key], unit, f"sm_75 build, shape {r['name']}: {what}", f"variants[{i}].{key}"
            )
    return out


def figures_gpu(body: dict) -> dict:
    out = {
        "mma_m16n8k8_ceiling_tflops": results.figure(
            body["mma_m16n8k8_ceiling"]["tflops"],
            "TFLOP/s",
            "mma.sync m16n8k8 ceiling measured in the same run",
            "mma_m16n8k8_ceiling.tflops",
        )
    }
    for i, o in enumerate(body["mma_microbench"]):
        w, c, ld = o["warps_per_sm"], o["chains_per_warp"], o["ldmatrix_in_flight"]
        out[f"mma.w{w}c{c}l{ld}_tflops"] = results.figure(
            o["tflops"],
            "TFLOP/s",
            f"m16n8k8 at {w} warps per SM, {c} accumulators per warp, "
            + (f"{ld} ldmatrix loads in flight" if ld else "B operands in registers"),
            f"mma_microbench[{i}].tflops",
        )
    kinds = {
        "l2_resident": ", keys L2-resident (64 pages repeated)",
        "previous_rule": ", split by the previous rule (every CTA, 1 to 4 ways)",
    }
    for i, r in enumerate(body["rows"]):
        kind = r.get("kv", "paged")
        # The query length in the key only where it is not the default.
        q = "" if r["query_len"] == QUERY else f".q{r['query_len']}"
        key = f"{r['variant']}{q}.ctx{r['context_len']}" + (f".{kind}" if kind in kinds else "")
        what = f"shape {r['variant']}, {r['query_len']} query tokens after {r['context_len']:,}" + (
            kinds.get(kind, "")
        )
        out[f"{key}.ms"] = results.figure(
            r["median_ms"], "ms", f"{what}, median", f"rows[{i}].median_ms"
        )
        out[f"{key}.fraction_of_ceiling"] = results.figure(
            r["fraction_of_mma_ceiling"],
            "fraction",
            f"{what}, fraction of the mma.sync ceiling",
            f"rows[{i}].fraction_of_mma_ceiling",
        )
    for i, r in enumerate(body.get("on_sms", [])):
        previous = r.get("rule") == "previous"
        key = f"{r['variant']}.ctx{r['context_len']}.on_{r['sms']}_sms" + (
            ".previous_rule" if previous else ""
        )
        out[f"{key}_fraction"] = results.figure(
            r["fraction_of_mma_ceiling"],
            "fraction",
            f"shape {r['variant']} after "
            f"{r['context_len']:,} on {r['sms']} SMs ({r['splits']} splits after "
            f"{r.get('whole_ctas', 0)} whole CTAs"
            + (", the previous rule" if previous else "")
            + "), fraction of the ceiling scaled to them",
            f"on_sms[{i}].fraction_of_mma_ceiling",
        )
    return out


def prepare(dest: Path, tree: Path) -> int:
    """What the GPU machine needs, here: the kernel's files from the applied
    tree and the stamps that name the series (results.series_from_stamps)."""
    from serieskit.series import series

    header = series.results_header(ROOT, tree)
    if header.get("note"):
        sys.exit(f"error: {tree}: {header['note']}; commit or export first")
    kernel = dest / "csrc" / "sm7x"
    kernel.mkdir(parents=True, exist_ok=True)
    for name in KERNEL_FILES:
        (kernel / name).write_bytes((tree / "csrc" / "sm7x" / name).read_bytes())
    # The base's torch pin, for the results file's torch note.
    (dest / "requirements").mkdir(exist_ok=True)
    (dest / "requirements" / "cuda.txt").write_bytes(
        (tree / "requirements" / "cuda.txt").read_bytes()
    )
    for key, stamp in results.STAMPS.items():
        value = header[key] if key != "base" else header["base"].removeprefix("vllm==")
        (dest / stamp).write_text(
            (json.dumps(value, sort_keys=True) if key == "files" else value) + "\n"
        )
    print(f"prepared {dest} (series {header['commit'][:12]}): carry it and pass --tree {dest}")
    return 0


def static(tree: Path, out: Path) -> int:
    """sm_75 compile output of every shape (no GPU)."""
    import prefill_attention_static as st

    from serieskit.series import series

    rows, tools = run_static(tree)
    gencode = ["-gencode=arch=compute_75,code=sm_75"]
    body = {
        "what": "Shapes of the Turing prefill attention template: sm_75 compile output per shape",
        **tools,
        "flags": " ".join(nvcc_command(tree, Path("lib.so"), gencode)[5:]),
        "variants": rows,
    }
    doc = results.document(
        "static",
        body,
        machine=st.static_machine(tools["nvcc"]),
        series=series.results_header(ROOT, tree),
        figures=figures_static(rows),
    )
    results.write(out, doc)
    print(f"wrote {out}")
    return 0


def build_only(tree: Path, lib: Path) -> int:
    """The GPU build (compute_75 PTX) to ``lib``, e.g. for a profiler's run."""
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = build_library(tree, Path(tmp), [PTX])
        lib.write_bytes(path.read_bytes())
    print(f"built {lib}")
    return 0


def sweep(
    tree: Path, out: Path, reps: int, contexts: list[int], head_dims=None, sms=(), queries=(QUERY,)
) -> int:
    """The GPU run: microbenchmarks, checks and timings of every shape (of
    ``head_dims`` only, where given; the shipped ones also on ``sms`` SMs)."""
    body, run = run_gpu(tree, reps, contexts, head_dims, sms, queries)
    body = {
        "what": (
            "Shapes of the Turing prefill attention template on one GPU through compute_75 PTX, "
            "each against float64 and timed beside the shipped shape; not Turing figures"
        ),
        **run,
        **body,
    }
    stamped = (tree / results.STAMPS["commit"]).is_file()
    series = results.series_from_stamps(tree) if stamped else results.current_series(ROOT)
    doc = results.document(
        "bench",
        body,
        machine=results.machine(detail="compute_75 PTX, JIT"),
        series=series,
        figures=figures_gpu(body),
        # The pin from the tree that ran (a prepared folder carries its
        # requirements), not from a vLLM installed beside it.
        torch_pin=results.pinned_torch((series["base"] or "").removeprefix("vllm=="), [tree]),
    )
    results.write(out, doc)
    print(f"wrote {out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--tree",
        type=Path,
        default=ROOT / ".work" / "vllm",
        help="a patched vLLM tree, or a folder made by --prepare (default: .work/vllm)",
    )
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="the results file of the sweep (or of --static)")
    mode.add_argument(
        "--prepare", type=Path, metavar="DIR", help="copy the kernel and the series' stamps to DIR"
    )
    mode.add_argument(
        "--build", type=Path, metavar="LIB", help="only build the library (compute_75 PTX)"
    )
    ap.add_argument(
        "--static", action="store_true", help="with --out: sm_75 compile output only (no GPU)"
    )
    ap.add_argument("--reps", type=int, default=20, help="timed replays per shape and case")
    ap.add_argument(
        "--contexts", type=int, nargs="+", default=list(CONTEXTS), help="context lengths timed"
    )
    ap.add_argument("--queries", type=int, nargs="+", default=[QUERY], help="query lengths timed")
    ap.add_argument(
        "--head-dims",
        type=int,
        nargs="+",
        choices=(64, 128, 256),
        help="only these head dims' shapes (default: all)",
    )
    ap.add_argument(
        "--sms", type=int, nargs="*", default=[], help="SM counts for the shipped shapes"
    )
    a = ap.parse_args()
    if a.static and not a.out:
        ap.error("--static writes a results file: give --out")
    if a.prepare:
        return prepare(a.prepare, a.tree)
    if a.build:
        return build_only(a.tree, a.build)
    if a.static:
        return static(a.tree, a.out)
    return sweep(a.tree, a.out, a.reps, a.contexts, a.head_dims, a.sms, a.queries)


if __name__ == "__main__":
    sys.exit(main())
