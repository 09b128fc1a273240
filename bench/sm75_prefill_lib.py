# SPDX-License-Identifier: Apache-2.0
"""The shapes of the Turing prefill kernel template as one library:
``bench/prefill_attention_variants.cu`` built with nvcc against a kernel
tree and loaded by ctypes (no torch extension, no vLLM), its params struct
mirrored and checked against the library's own offsets, and a launcher per
shape on torch's current stream. Used by the sweep
(bench/prefill_attention_variants.py) and the profiler's target
(bench/prefill_attention_profile.py).
"""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit.build import build, recipe  # noqa: E402

SOURCE = ROOT / "bench" / "prefill_attention_variants.cu"
KERNEL_FILES = ("paged_prefill_attention_sm75.cu", "paged_prefill_attention_sm75.h")
PTX = "-gencode=arch=compute_75,code=compute_75"  # the H200 runs it through the driver's JIT
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
    ("split_from", ctypes.c_int32),
    ("min_range_keys", ctypes.c_int32),
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


def traits_key(shape: dict) -> tuple:
    """A shape of :func:`variants` (or of an older sweep's results file,
    which may name options measured and dropped on 2026-12-02: the ping-pong,
    steps per tile, K/V loads without L1 allocation or through another cache
    path, staged loads in slices, the head dim split across a pair of
    warps, Q in shared memory, and on 2026-12-03 two S accumulator sets,
    which head dim 256 shipped until then) as prefill_attention_static.traits_of reads
    it from the kernel's
    name: the later options only where not their defaults."""
    sets, steps = shape.get("score_sets", 1), shape.get("sub_tiles", 1)
    return (
        tuple(int(shape[k]) for k in TRAITS_KEYS)
        + ((f"s{sets}",) if sets > 1 else ())
        + (("pp",) if shape.get("ping_pong") else ())
        + ((f"u{steps}",) if steps > 1 else ())
        + (("lz",) if shape.get("lazy_max") else ())
        + (("st",) if shape.get("stream_kv") else ())
        + ((f"ld{shape['load_path']}",) if shape.get("load_path") else ())
        + ((f"sl{shape['slices']}",) if shape.get("slices", 1) > 1 else ())
        + ((f"d{shape['dim_split']}",) if shape.get("dim_split", 1) > 1 else ())
        + ((f"a{shape['lookup_ahead']}",) if shape.get("lookup_ahead") else ())
        + ((f"q{shape['q_smem_chunks']}",) if shape.get("q_smem_chunks") else ())
        + ((f"r{shape['unroll']}",) if shape.get("unroll", 1) > 1 else ())
        + (("pf",) if shape.get("prefetch_l2") else ())
        + (("kv",) if shape.get("stage_kv") else ())
        + ({1: ("rs",), 2: ("ms",)}.get(shape.get("row_sums", 0), ()))
    )


class Params(ctypes.Structure):
    _fields_ = PARAMS_FIELDS  # type: ignore[assignment]  # a list of the same pairs


# --- the library ------------------------------------------------------------------


def kernel_tree(dest: Path, rev: str | None = None) -> Path:
    """The kernel's files as the series leaves them, from patches/ alone (of
    the toolkit commit ``rev``, or of the work tree): each patch's hunks of
    the kernel applied in order into ``dest``."""
    subprocess.run(["git", "init", "-q", str(dest)], check=True)
    if rev is None:
        patches = [
            p.read_bytes() for p in sorted((ROOT / "patches").glob("[0-9]" * 4 + "-*.patch"))
        ]
    else:
        names = subprocess.run(
            ["git", "-C", str(ROOT), "ls-tree", "--name-only", rev, "patches/"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        patches = [
            subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{rev}:{name}"], capture_output=True, check=True
            ).stdout
            for name in sorted(names)
            if Path(name).name[:4].isdigit() and name.endswith(".patch")
        ]
    for patch in patches:
        subprocess.run(
            ["git", "apply", "--include=csrc/sm7x/paged_prefill_attention_sm75.*", "-"],
            cwd=dest,
            input=patch,
            check=True,
        )
    return dest


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
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    lib.sm75v_auto_split.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(Params),
        ctypes.POINTER(ctypes.c_int64),
    ]
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
        s = (ctypes.c_int * 14)()
        lib.sm75v_shape(i, s)
        hd, warps, mtiles, keys, ctas, lookups, xor, shipped, smem, kv, lazy, rows = list(s)[:12]
        ahead, sums = s[12], s[13]
        out.append(
            {
                "index": i,
                # The savings only where they are off, the other options
                # where on: hd128.w8m1k64c1, hd256.w8m1k32c1.l0.x0,
                # hd64.w4m2k64c2.lz.a1, hd256.w8m1k16c1.kv; .rs / .ms: the
                # row sums of the rounded probabilities / made by MMAs.
                "name": f"hd{hd}.w{warps}m{mtiles}k{keys}c{ctas}"
                + ("" if lookups else ".l0")
                + ("" if xor else ".x0")
                + (".lz" if lazy else "")
                + (f".a{ahead}" if ahead else "")
                + (".kv" if kv else "")
                + {0: "", 1: ".rs", 2: ".ms"}.get(sums, f".sums{sums}"),
                "traits": lib.sm75v_traits(i).decode(),
                "head_dim": hd,
                "warps": warps,
                "row_tiles_per_warp": mtiles,
                "keys_per_tile": keys,
                "min_ctas_per_sm": ctas,
                "shared_lookups": lookups,
                "xor_addressing": xor,
                "shipped": bool(shipped),
                "dynamic_shared_bytes": smem,
                "lazy_max": bool(lazy),
                "rows_per_cta": rows,
                "lookup_ahead": ahead,
                "stage_kv": bool(kv),
                "row_sums": sums,
            }
        )
    return out


# --- static (no GPU) ---------------------------------------------------------------


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
    hd = q.shape[2]
    p.part_out = scratch.data_ptr()
    p.part_lse = scratch.data_ptr() + 4 * scratch.numel() // (hd + 1) * hd  # after the outputs
    p.num_seqs, p.num_tokens = inp["seq_lens"].numel(), q.shape[0]
    p.num_heads, p.num_kv_heads, p.head_dim = q.shape[1], k.shape[2], hd
    p.page_size, p.softmax_scale = k.shape[1], inp["scale"]
    return p


MAX_SPLITS, MAX_ROWS_PER_CTA, MIN_ROWS_PER_CTA = 16, 256, 128  # the kernel's bounds


def scratch_for(torch, query, num_seqs: int, num_kv_heads: int):
    """Split scratch for any split of any shape: 16 ranges of every CTA of
    the most CTAs a shape's grid has (its fewest rows per CTA), each range of
    the most rows per CTA, head dim + 1 fp32 values a row."""
    tokens, heads, hd = query.shape
    group = heads // num_kv_heads
    ctas = (tokens * group // MIN_ROWS_PER_CTA + num_seqs) * num_kv_heads
    rows = MAX_SPLITS * ctas * MAX_ROWS_PER_CTA
    return torch.empty(rows * (hd + 1), dtype=torch.float32, device=query.device)


def auto_split(lib: ctypes.CDLL, index: int, p: Params) -> tuple[int, int]:
    """The split of splits 0 for these params: the count, and how many of the
    grid's first CTAs run whole."""
    whole = ctypes.c_int64()
    splits = lib.sm75v_auto_split(index, ctypes.byref(p), ctypes.byref(whole))
    return splits, whole.value


def launcher(torch, lib: ctypes.CDLL, index: int, p: Params, splits: int, split_from: int = 0):
    def fn():
        err = lib.sm75v_launch(
            index, ctypes.byref(p), splits, split_from, torch.cuda.current_stream().cuda_stream
        )
        if err:
            raise RuntimeError(f"variant {index}: CUDA error {err}")

    return fn


def time_on_sms(torch, lib: ctypes.CDLL, vs: list[dict], sms, ceiling: float) -> list[dict]:
    """The shipped shapes on bench/prefill_attention.py's longest case on green
    contexts of each of ``sms`` SMs, with the split count the launcher's rule
    gives a Turing GPU of that many SMs: its CTAs of this shape's rows, in
    slots of the shape's CTAs per SM (the library's own rule reads the whole
    device's count); and, beside it, with the previous rule's split
    (uniform_splits_for). The ceiling is scaled to the SMs the kernel had."""
    from prefill_attention import CONTEXTS, HEADS, KV_HEADS, QUERY, causal_flops, make_inputs
    from prefill_attention import on_sms as timed_on
    from turing_cycle_model import splits_for, uniform_splits_for

    rows, ctx = [], max(CONTEXTS)
    device_sms = torch.cuda.get_device_properties(0).multi_processor_count
    for v in (v for v in vs if v["shipped"]):
        inp = make_inputs(QUERY, ctx, v["head_dim"])
        # Kept alive beside the params, which hold their pointers.
        out = torch.empty_like(inp["query"])
        scratch = scratch_for(torch, inp["query"], 1, KV_HEADS)
        p = params_for(torch, inp, out, None, scratch)
        ctas = math.ceil(QUERY * (HEADS // KV_HEADS) / v["rows_per_cta"]) * KV_HEADS
        runs = [(n, rule) for n in sms for rule in ("launcher", "previous")]
        for n, rule in runs:
            slots = n * v["min_ctas_per_sm"]
            splits, whole = (
                splits_for(ctas, slots)
                if rule == "launcher"
                else (uniform_splits_for(ctas, slots), 0)
            )
            t = timed_on(n, launcher(torch, lib, v["index"], p, splits, whole), 10)
            tflops = causal_flops(QUERY, ctx, v["head_dim"]) / (t["median_ms"] * 1e-3) / 1e12
            frac = tflops / (ceiling * n / device_sms)
            rows.append(
                {
                    "variant": v["name"],
                    "head_dim": v["head_dim"],
                    "query_len": QUERY,
                    "context_len": ctx,
                    "sms": n,
                    "rule": rule,
                    "splits": splits,
                    "whole_ctas": whole,
                    **t,
                    "tflops": tflops,
                    "fraction_of_mma_ceiling": frac,
                }
            )
            print(
                f"{v['name']:26s} on {n:3d} SMs, {rule} rule, {splits} splits after {whole} whole "
                "CTAs: "
                f"{t['median_ms']:8.3f} ms "
                f"({100 * frac:.1f} % of the ceiling for {n} SMs)",
                flush=True,
            )
        del inp, out, scratch
        torch.cuda.empty_cache()
    return rows
