#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Sweep of the Turing prefill attention's shapes: the shipped traits per
head dim beside the alternatives that fit a Turing SM, on one GPU in one run.

``bench/prefill_attention_variants.cu`` instantiates the series' kernel
template with each shape (its list is the sweep's); it is built with nvcc
against a patched tree and loaded by ctypes, so no vLLM and no torch
extension are needed. Two modes:

- ``--static`` (no GPU): sm_75 machine code of every shape, registers,
  spills, resident CTAs per Turing SM and the key loop's census per warp and
  tile, as bench/prefill_attention_static.py reads the shipped ones.
- the GPU run: the mma.sync m16n8k8 ceiling (as bench/prefill_attention.py
  measures it) and the same microbenchmark at the kernel's occupancies
  (warps per SM x independent accumulators per warp: what 8 warps per SM can
  reach at all); every shape against a float64 reference on ragged batches
  (outputs poisoned with NaN, automatic and forced splits), then each shape
  timed in CUDA graphs, median after warm-up, on 2048 query tokens after
  32,768 and 153,600 of context, as a fraction of that ceiling and against
  the shipped shape. H200 figures through compute_75 PTX, never Turing
  figures. About 2 minutes on one H200.

    python3 bench/prefill_attention_variants.py --static --out results/x.json
    python3 bench/prefill_attention_variants.py --tree /tmp/vllm-run/src --out $OUT/x.json
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
from serieskit import results  # noqa: E402
from serieskit.build import build, recipe  # noqa: E402

SOURCE = ROOT / "bench" / "prefill_attention_variants.cu"
KERNEL_FILES = ("paged_prefill_attention_sm75.cu", "paged_prefill_attention_sm75.h")
PTX = "-gencode=arch=compute_75,code=compute_75"  # the H200 runs it through the driver's JIT
CONTEXTS = (32 * 1024, 150 * 1024)
# (query lengths, context lengths, query heads, KV heads, page size): ragged
# batches with a request of one token, one that starts a sequence, and one
# whose chunk crosses several pages and tiles.
CHECKS = (
    ((77, 1, 300, 129), (0, 45, 1200, 3000), 12, 2, 16),
    ((200, 5, 64), (333, 0, 2500), 8, 1, 64),
    ((150, 31), (70, 511), 4, 4, 32),
)

# PagedPrefillAttentionParams (csrc/sm7x/paged_prefill_attention_sm75.h), in
# declaration order; checked against the library's offsets when it loads.
PARAMS_FIELDS = [
    ("query", ctypes.c_void_p),
    ("query_stride_token", ctypes.c_int64),
    ("query_stride_head", ctypes.c_int64),
    ("key_cache", ctypes.c_void_p),
    ("value_cache", ctypes.c_void_p),
    ("cache_stride_block", ctypes.c_int32),
    ("cache_stride_slot", ctypes.c_int32),
    ("cache_stride_head", ctypes.c_int32),
    ("block_table", ctypes.c_void_p),
    ("block_table_stride", ctypes.c_int64),
    ("cu_seqlens_q", ctypes.c_void_p),
    ("seq_lens", ctypes.c_void_p),
    ("out", ctypes.c_void_p),
    ("out_stride_token", ctypes.c_int64),
    ("out_stride_head", ctypes.c_int64),
    ("lse", ctypes.c_void_p),
    ("num_splits", ctypes.c_int32),
    ("part_out", ctypes.c_void_p),
    ("part_lse", ctypes.c_void_p),
    ("num_seqs", ctypes.c_int32),
    ("num_tokens", ctypes.c_int32),
    ("num_heads", ctypes.c_int32),
    ("num_kv_heads", ctypes.c_int32),
    ("head_dim", ctypes.c_int32),
    ("page_size", ctypes.c_int32),
    ("page_shift", ctypes.c_int32),
    ("softmax_scale", ctypes.c_float),
    ("scale_log2", ctypes.c_float),
    ("group", ctypes.c_int32),
]


# A shape's keys in the order of PrefillTraits' template arguments.
TRAITS_KEYS = (
    "head_dim",
    "warps",
    "row_tiles_per_warp",
    "keys_per_tile",
    "min_ctas_per_sm",
    "shared_lookups",
    "xor_addressing",
)


class Params(ctypes.Structure):
    _fields_ = PARAMS_FIELDS  # type: ignore[assignment]  # a list of the same pairs


# --- the library ------------------------------------------------------------------


def nvcc_command(tree: Path, out: Path, gencode: list[str]) -> list[str]:
    return [
        os.environ.get("NVCC", "nvcc"),
        "-shared",
        "-o",
        str(out),
        str(SOURCE),
        f"-I{tree / 'csrc' / 'sm7x'}",
        *recipe.native().nvcc_flags,
        # Its own runtime: ctypes loads it beside torch's, on the same
        # primary context, so torch's pointers and streams are valid here.
        "-cudart",
        "static",
        *gencode,
    ]


def build_library(tree: Path, workdir: Path, gencode: list[str]) -> tuple[Path, list[build.Usage]]:
    """The sweep's library and ptxas's usage of its functions."""
    if not (tree / "csrc" / "sm7x" / "paged_prefill_attention_sm75.cu").is_file():
        sys.exit(f"error: {tree} holds no csrc/sm7x kernel: apply the series first (nox -s apply)")
    lib = workdir / "libsm75_prefill_variants.so"
    proc = subprocess.run(nvcc_command(tree, lib, gencode), capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        sys.exit(f"error: nvcc failed on {SOURCE.name} (last 40 lines):\n{tail}")
    return lib, build.parse_ptxas(proc.stdout + proc.stderr)


def load(path: Path) -> ctypes.CDLL:
    """The library, its signatures set and its params layout checked."""
    lib = ctypes.CDLL(str(path))
    lib.sm75v_traits.restype = ctypes.c_char_p
    lib.sm75v_launch.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(Params),
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    lib.sm75v_auto_splits.argtypes = [ctypes.c_int, ctypes.POINTER(Params)]
    check_layout(lib)
    return lib


def check_layout(lib) -> None:
    """Exit with a clear error where the C++ struct and its mirror differ."""
    buf = (ctypes.c_int64 * 64)()
    n = lib.sm75v_params_layout(buf, 64)
    theirs = list(buf)[:n]
    ours = [ctypes.sizeof(Params)] + [getattr(Params, f).offset for f, _ in PARAMS_FIELDS]
    if theirs != ours:
        sys.exit(
            "error: PagedPrefillAttentionParams changed: the library's size and offsets "
            f"{theirs} differ from this script's mirror {ours} (update PARAMS_FIELDS)"
        )


def variants(lib: ctypes.CDLL) -> list[dict]:
    """Each shape the library holds: its traits and place in the list."""
    out = []
    for i in range(lib.sm75v_count()):
        s = (ctypes.c_int * 8)()
        lib.sm75v_shape(i, s)
        hd, warps, mtiles, keys, ctas, lookups, xor, shipped = list(s)
        out.append(
            {
                "index": i,
                # The flags only where they are off: hd128.w4m2k16c2, hd256.w8m1k32c1.l0.x0.
                "name": f"hd{hd}.w{warps}m{mtiles}k{keys}c{ctas}"
                + ("" if lookups else ".l0")
                + ("" if xor else ".x0"),
                "traits": lib.sm75v_traits(i).decode(),
                "head_dim": hd,
                "warps": warps,
                "row_tiles_per_warp": mtiles,
                "keys_per_tile": keys,
                "min_ctas_per_sm": ctas,
                "shared_lookups": lookups,
                "xor_addressing": xor,
                "shipped": bool(shipped),
            }
        )
    return out


# --- static (no GPU) ---------------------------------------------------------------


def static_rows(lib: ctypes.CDLL, usage: list[build.Usage], sass: str) -> list[dict]:
    """Per shape: ptxas usage on sm_75, Turing residency and the key loop."""
    import prefill_attention_static as st

    funcs = st.parse_sass(sass)
    by_traits = {
        tuple(int(g) for g in m.groups()): u
        for u in usage
        if u.arch == "75" and (m := st.TRAITS.search(u.function))
    }
    rows = []
    for v in variants(lib):
        u = by_traits[tuple(v[k] for k in TRAITS_KEYS)]
        smem = 2 * 2 * v["keys_per_tile"] * v["head_dim"] * 2  # 2 stages x (K + V)
        rows.append(
            {
                **v,
                "registers": u.registers,
                "spill_stores": u.spill_stores,
                "spill_loads": u.spill_loads,
                "dynamic_shared_bytes": smem,
                "turing_ctas_per_sm": st.turing_ctas_per_sm(u.registers, 32 * v["warps"], smem),
                "hmma_per_warp_per_tile": v["head_dim"]
                * v["keys_per_tile"]
                * v["row_tiles_per_warp"]
                // 32,
                "key_loop_per_warp_per_tile": st.key_loop(funcs.get(u.function, [])),
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
            f"{r['name']:22s}{' (shipped)' if r['shipped'] else '          '} "
            f"{r['registers']} registers, spills {r['spill_stores']}/{r['spill_loads']} B, "
            f"{r['turing_ctas_per_sm']} CTAs x {r['warps']} warps per Turing SM; key loop "
            f"{r['hmma_per_warp_per_tile']} HMMA in {loop.get('common_path')} instructions",
            flush=True,
        )
    return rows, {"nvcc": build.nvcc_version(os.environ.get("NVCC", "nvcc"))}


# --- GPU ----------------------------------------------------------------------------

MICRO_SRC = r"""
#include <cstdio>
#include <cuda_runtime.h>
__device__ __forceinline__ void mma(float (&d)[4], unsigned a0, unsigned a1, unsigned b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(b));
}
// CHAINS independent accumulators per warp; the B operands either fixed in
// registers (AHEAD 0) or read by ldmatrix.x4 from shared memory, AHEAD loads
// in flight, 4 MMAs per load: the kernel's inner loops at its occupancy.
template <int CHAINS, int AHEAD>
__global__ void __launch_bounds__(256) mma_loop(float* out, int iters) {
  __shared__ __align__(16) unsigned short tile[8 * 512];
  for (int i = threadIdx.x; i < 8 * 512; i += 256) tile[i] = 0x3C00u ^ (i & 0x3Fu);
  __syncthreads();
  const unsigned a0 = 0x3C003C00u ^ (threadIdx.x & 0xFFu), a1 = 0x3C013BFFu ^ (threadIdx.x & 0x7Fu);
  const unsigned base =
      static_cast<unsigned>(__cvta_generic_to_shared(tile)) + (threadIdx.x & 31) * 16;
  float d[CHAINS][4] = {};
  unsigned b[AHEAD + 1][4];
#pragma unroll
  for (int s = 0; s <= AHEAD; ++s)
#pragma unroll
    for (int c = 0; c < 4; ++c) b[s][c] = 0x3BF03C10u ^ (threadIdx.x & 0x3Fu) ^ c;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int s = 0; s <= AHEAD; ++s) {
      if (AHEAD > 0) {
        unsigned* r = b[(s + AHEAD) % (AHEAD + 1)];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(base + ((i * (AHEAD + 1) + s) & 7) * 1024));
      }
#pragma unroll
      for (int k = 0; k < CHAINS; k += 4)
#pragma unroll
        for (int c = 0; c < 4; ++c) mma(d[(k + c) % CHAINS], a0, a1, b[s][c]);
    }
  }
  float t = 0.f;
  for (int j = 0; j < CHAINS; ++j) t += d[j][0] + d[j][1] + d[j][2] + d[j][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = t;
}
template <int CHAINS, int AHEAD>
void run(int sms, int per_sm, float* out) {
  const int blocks = sms * per_sm, iters = 8192 / (CHAINS * (AHEAD + 1));
  mma_loop<CHAINS, AHEAD><<<blocks, 256>>>(out, 16);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  float best = 1e30f;
  for (int r = 0; r < 7; ++r) {
    cudaEventRecord(e0);
    mma_loop<CHAINS, AHEAD><<<blocks, 256>>>(out, iters);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); if (ms < best) best = ms;
  }
  const double mmas = double(iters) * (AHEAD + 1) * CHAINS * blocks * 8.0;
  int resident = 0;  // CTAs per SM that registers and shared memory allow
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, mma_loop<CHAINS, AHEAD>, 256, 0);
  printf("%d %d %d %.3f\n", (per_sm < resident ? per_sm : resident) * 8, CHAINS, AHEAD,
         2.0 * 16 * 8 * 8 * mmas / (best * 1e-3) / 1e12);
}
int main() {
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  float* out;
  cudaError_t err = cudaMalloc(&out, sms * 8 * 256 * sizeof(float));
  if (err != cudaSuccess) { printf("error %s\n", cudaGetErrorString(err)); return 1; }
  for (int per_sm : {1, 2, 8}) {  // 8, 16 and 64 warps per SM
    run<4, 0>(sms, per_sm, out); run<8, 0>(sms, per_sm, out); run<16, 0>(sms, per_sm, out);
    run<4, 1>(sms, per_sm, out); run<16, 1>(sms, per_sm, out);
    run<4, 2>(sms, per_sm, out); run<16, 2>(sms, per_sm, out);
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) { printf("error %s\n", cudaGetErrorString(err)); return 1; }
  return 0;
}
"""


def mma_microbench(workdir: Path, nvcc: str = "nvcc") -> list[dict]:
    """m16n8k8 throughput by warps per SM, accumulators per warp and
    ldmatrix loads in flight (0: B in registers), as compute_75 PTX (JIT)."""
    src, exe = workdir / "mma_micro.cu", workdir / "mma_micro"
    src.write_text(MICRO_SRC)
    subprocess.run(
        [nvcc, "-O3", "-gencode=arch=compute_75,code=compute_75", str(src), "-o", str(exe)],
        check=True,
    )
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    if proc.returncode != 0:
        # A diagnostic, not the sweep: say so and go on without it.
        print(f"warning: the mma microbenchmark failed: {proc.stdout}{proc.stderr}", flush=True)
        return []
    rows = []
    for line in proc.stdout.splitlines():
        warps, chains, ahead, tflops = line.split()
        rows.append(
            {
                "warps_per_sm": int(warps),
                "chains_per_warp": int(chains),
                "ldmatrix_in_flight": int(ahead),
                "tflops": float(tflops),
            }
        )
    return rows


def params_for(torch, inp: dict, out, lse, scratch) -> Params:
    """The launcher's params, filled as the op's C++ fills them."""
    q, k = inp["query"], inp["key_cache"]
    p = Params()
    p.query, p.query_stride_token, p.query_stride_head = q.data_ptr(), q.stride(0), q.stride(1)
    p.key_cache, p.value_cache = k.data_ptr(), inp["value_cache"].data_ptr()
    p.cache_stride_block, p.cache_stride_slot, p.cache_stride_head = (
        k.stride(0),
        k.stride(1),
        k.stride(2),
    )
    p.block_table, p.block_table_stride = (
        inp["block_table"].data_ptr(),
        inp["block_table"].stride(0),
    )
    p.cu_seqlens_q, p.seq_lens = inp["cu_seqlens_q"].data_ptr(), inp["seq_lens"].data_ptr()
    p.out, p.out_stride_token, p.out_stride_head = out.data_ptr(), out.stride(0), out.stride(1)
    p.lse = lse.data_ptr() if lse is not None else None
    rows, hd = q.shape[0] * q.shape[1], q.shape[2]
    p.part_out = scratch.data_ptr()
    p.part_lse = scratch.data_ptr() + 4 * 4 * rows * hd  # after 4 splits' outputs
    p.num_seqs, p.num_tokens = inp["seq_lens"].numel(), q.shape[0]
    p.num_heads, p.num_kv_heads, p.head_dim = q.shape[1], k.shape[2], hd
    p.page_size, p.softmax_scale = k.shape[1], inp["scale"]
    return p


def scratch_for(torch, query):
    rows, hd = query.shape[0] * query.shape[1], query.shape[2]
    return torch.empty(4 * rows * (hd + 1), dtype=torch.float32, device="cuda")


def launcher(torch, lib: ctypes.CDLL, index: int, p: Params, splits: int):
    def fn():
        err = lib.sm75v_launch(
            index, ctypes.byref(p), splits, torch.cuda.current_stream().cuda_stream
        )
        if err:
            raise RuntimeError(f"variant {index}: CUDA error {err}")

    return fn


def ragged_inputs(
    torch, q_lens, ctx_lens, heads, kv_heads, page, hd, seed=0, device="cuda"
) -> dict:
    """Requests on one shuffled page pool, random fp16 everywhere."""
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
        query=torch.randn((cu[-1], heads, hd), dtype=torch.float16, device=device, generator=gen),
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


def check_variants(torch, lib, vs: list[dict]) -> dict[str, dict]:
    """Max error of each shape against float64, beside the shipped shape's,
    over the ragged batches and splits 0 (automatic), 1 and 3."""
    worst: dict[str, dict] = {v["name"]: {"max_abs_err": 0.0, "max_lse_err": 0.0} for v in vs}
    for hd in sorted({v["head_dim"] for v in vs}):
        for q_lens, ctx_lens, heads, kvh, page in CHECKS:
            inp = ragged_inputs(torch, q_lens, ctx_lens, heads, kvh, page, hd)
            ref, ref_lse = reference(torch, inp, q_lens, ctx_lens)
            scratch = scratch_for(torch, inp["query"])
            for v in (v for v in vs if v["head_dim"] == hd):
                for splits in (0, 1, 3):
                    out = torch.full_like(inp["query"], float("nan"))
                    lse = torch.full(
                        ref_lse.shape, float("nan"), dtype=torch.float32, device="cuda"
                    )
                    p = params_for(torch, inp, out, lse, scratch)
                    launcher(torch, lib, v["index"], p, splits)()
                    torch.cuda.synchronize()
                    w = worst[v["name"]]
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
                w["finite"]
                and w["max_abs_err"] <= base["max_abs_err"] + 2**-11
                and w["max_lse_err"] <= 2e-3
            )
    return worst


def time_variants(torch, lib, vs: list[dict], contexts, reps: int, ceiling: float) -> list[dict]:
    """Each shape on bench/prefill_attention.py's cases, automatic split; the
    shipped shape also with every page of the table one of 64 (the keys an
    L2-resident 1,024 repeated): what the loads from memory cost it."""
    from prefill_attention import QUERY, causal_flops, make_inputs, time_graph

    rows = []
    for hd in sorted({v["head_dim"] for v in vs}):
        for ctx in contexts:
            inp = make_inputs(QUERY, ctx, hd)
            resident = dict(
                inp,
                block_table=(torch.arange(inp["block_table"].shape[1], device="cuda") % 64)
                .to(torch.int32)[None, :]
                .contiguous(),
            )
            scratch = scratch_for(torch, inp["query"])
            flops = causal_flops(QUERY, ctx, hd)
            shipped_out = None
            runs = [(v, "paged", inp) for v in vs if v["head_dim"] == hd]
            runs += [
                (v, "l2_resident", resident) for v in vs if v["head_dim"] == hd and v["shipped"]
            ]
            for v, kv, case in runs:
                out = torch.empty_like(inp["query"])
                p = params_for(torch, case, out, None, scratch)
                n = reps if ctx < 100_000 else max(10, reps // 2)
                t = time_graph(launcher(torch, lib, v["index"], p, 0), n)
                torch.cuda.synchronize()
                row = {
                    "variant": v["name"],
                    "kv": kv,
                    "head_dim": hd,
                    "query_len": QUERY,
                    "context_len": ctx,
                    "splits": lib.sm75v_auto_splits(v["index"], ctypes.byref(p)),
                    **t,
                    "tflops": flops / (t["median_ms"] * 1e-3) / 1e12,
                }
                row["fraction_of_mma_ceiling"] = row["tflops"] / ceiling
                if kv == "paged":
                    if v["shipped"]:
                        shipped_out = out.clone()
                    if shipped_out is not None:
                        diff = (out.float() - shipped_out.float()).abs().max().item()
                        row["max_abs_diff_vs_shipped"] = diff
                rows.append(row)
                print(
                    f"{v['name']:22s} {kv:11s} {QUERY} after {ctx:7d}: {t['median_ms']:8.3f} ms, "
                    f"{row['tflops']:6.1f} TF ({100 * row['fraction_of_mma_ceiling']:.1f} %), "
                    f"{row['splits']} splits",
                    flush=True,
                )
            del inp, resident, scratch
            torch.cuda.empty_cache()
    for r in rows:
        base = next(
            x
            for x in rows
            if (x["head_dim"], x["context_len"], x["kv"])
            == (r["head_dim"], r["context_len"], "paged")
        )
        r["speedup_vs_shipped"] = base["median_ms"] / r["median_ms"]
    return rows


def run_gpu(tree: Path, reps: int, contexts) -> tuple[dict, dict]:
    import torch
    from prefill_attention import mma_ceiling

    with tempfile.TemporaryDirectory() as tmp:
        ceiling = mma_ceiling(Path(tmp))
        micro = mma_microbench(Path(tmp))
        print(f"mma.sync m16n8k8 ceiling: {ceiling['tflops']:.1f} TFLOP/s", flush=True)
        for o in micro:
            print(
                f"  {o['warps_per_sm']:2d} warps/SM, "
                f"{o['chains_per_warp']:2d} accumulators per warp, "
                f"{o['ldmatrix_in_flight']} ldmatrix in flight: {o['tflops']:.1f} TFLOP/s",
                flush=True,
            )
        path, _ = build_library(tree, Path(tmp), [PTX])
        lib = load(path)
        vs = variants(lib)
        for v in vs:
            attr = (ctypes.c_int * 5)()
            err = lib.sm75v_attributes(v["index"], attr)
            if err:
                sys.exit(f"error: {v['name']}: CUDA error {err} reading its attributes")
            v["registers"], v["local_bytes"], v["ctas_per_sm"] = attr[0], attr[1], attr[2]
        checks = check_variants(torch, lib, vs)
        for v in vs:
            v["check"] = checks[v["name"]]
            print(f"{v['name']:22s} check {v['check']}", flush=True)
        good = [v for v in vs if v["check"]["ok"]]
        timed = time_variants(torch, lib, good, contexts, reps, ceiling["tflops"])
    return {
        "mma_m16n8k8_ceiling": ceiling,
        "mma_microbench": micro,
        "variants": vs,
        "rows": timed,
        "timing": (
            "CUDA graph replay, CUDA events, median of reps after warm-up "
            "(bench/prefill_attention.py's time_graph)"
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
    for i, r in enumerate(body["rows"]):
        resident = r.get("kv") == "l2_resident"
        key = f"{r['variant']}.ctx{r['context_len']}" + (".l2_resident" if resident else "")
        what = f"shape {r['variant']}, {r['query_len']} query tokens after {r['context_len']:,}" + (
            ", keys L2-resident (64 pages repeated)" if resident else ""
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


def sweep(tree: Path, out: Path, reps: int, contexts: list[int]) -> int:
    """The GPU run: microbenchmarks, checks and timings of every shape."""
    body, run = run_gpu(tree, reps, contexts)
    body = {
        "what": (
            "Shapes of the Turing prefill attention template on one GPU through compute_75 PTX, "
            "each against float64 and timed beside the shipped shape; not Turing figures"
        ),
        **run,
        **body,
    }
    stamped = (tree / results.STAMPS["commit"]).is_file()
    doc = results.document(
        "bench",
        body,
        machine=results.machine(detail="compute_75 PTX, JIT"),
        series=results.series_from_stamps(tree) if stamped else results.current_series(ROOT),
        figures=figures_gpu(body),
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
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    a = ap.parse_args()
    if a.prepare:
        return prepare(a.prepare, a.tree)
    if a.build:
        return build_only(a.tree, a.build)
    if a.static:
        return static(a.tree, a.out)
    return sweep(a.tree, a.out, a.reps, a.contexts)


if __name__ == "__main__":
    sys.exit(main())
