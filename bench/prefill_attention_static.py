#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Static sm_75 evidence of the Turing paged prefill attention, per head dim.

No GPU needed: the series' native code is compiled for sm_75 by
``serieskit.build`` (nvcc ``-Xptxas -v``: registers, spill stores and loads,
stack), and the object's machine code read with ``cuobjdump -sass``: the
HMMA.1688.F32 (mma.sync m16n8k8) count of each instantiation of the kernel
template, and a census of its key loop per warp and 32-, 16- or 64-key tile
(the loop is the backward branch around the most HMMAs; its common path
leaves out the conditional blocks that hold no MMA, load, store or barrier:
the causal mask of the diagonal tiles and the rescale when a row's max
moves). The kernel's shape per head dim comes from the traits in the
template's mangled name. This is compile output, not a measurement of any
GPU; ``bench/turing_cycle_model.py`` turns it into a Turing cycle model.

Where cuobjdump (and the nvdisasm it calls) is not on PATH, it is installed
once from PyPI into the toolkit's cache.

    python3 bench/prefill_attention_static.py \\
        --out results/sm75_static_paged_prefill_attention_hd.json
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import results  # noqa: E402
from serieskit.build import build  # noqa: E402
from serieskit.series import series  # noqa: E402

KERNEL = "csrc/sm7x/paged_prefill_attention_sm75.cu"
SASS_TOOLS = ("nvidia-cuda-cuobjdump==13.4.92", "nvidia-cuda-nvdisasm==13.4.92")
# PrefillTraits<head dim, warps, row tiles per warp, keys per tile, CTAs per
# SM, shared lookups, XOR addressing, lazy max, lookups ahead, K and V staged
# together> in the kernel's mangled name. Older names still parse: before
# 2026-12-02 there were seven; the series at df72e25 had another eighth, a
# flag (the overlapped key loop); until 2026-12-03 the eighth was the number
# of S accumulator sets, the tenth where the lookups are read ahead (0 to 2),
# and builds of 2026-12-02 had a twelfth (key tiles per loop trip).
# The attention kernel's name only: the split-KV merge kernel is a template
# of the same traits.
TRAITS = re.compile(r"paged_prefill_attention_sm75_kernelI\w*?PrefillTraitsI((?:L[bi]\d+E){7,})E")
TRAIT_ARG = re.compile(r"L([bi])(\d+)E")
LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def traits_of(function: str) -> tuple[int | str, ...] | None:
    """The traits in a kernel's mangled name: seven numbers, then a tag for
    each later parameter that is not its default ("s2": two sets of S
    accumulators, "ov": df72e25's overlapped loop, "lz": the softmax's lazy
    max, "a1" / "a2": the block-table lookups a tile ahead, "r2": the key
    loop unrolled by two tiles, in the builds of 2026-12-02 that had it,
    "kv": the next tile's K and V staged together, "rs" / "ms": the row
    sums of the rounded probabilities / made by MMAs). So a
    shipped shape has the same traits in every revision. The dropped sweep
    options (the ping-pong, steps per tile) are named in their sweeps'
    results files, never parsed again from a build."""
    m = TRAITS.search(function)
    if not m:
        return None
    args = TRAIT_ARG.findall(m.group(1))
    later = args[7:]
    kinds = "".join(kind for kind, _ in later)
    if kinds in ("bbb", "bbbi"):  # since 2026-12-03; the row sums since 2026-12-07
        tags = ("lz", "a1", "kv")
        extra = [tag for tag, (_, value) in zip(tags, later[:3], strict=True) if value == "1"]
        if kinds == "bbbi" and later[3][1] != "0":
            extra.append({"1": "rs", "2": "ms"}.get(later[3][1], f"sums{later[3][1]}"))
        return tuple(int(v) for _, v in args[:7]) + tuple(extra)
    extra = []
    for i, (kind, value) in enumerate(later):
        if i == 0 and kind == "b":  # df72e25's eighth, a flag
            extra += ["ov"] if value == "1" else []
        elif i == 0:
            extra += [f"s{value}"] if value != "1" else []
        elif i == 1:
            extra += ["lz"] if value == "1" else []
        elif i == 2:
            extra += [f"a{value}"] if value != "0" else []
        elif i == 3:  # the unrolled loop's tiles per trip, in its builds
            extra += [f"r{value}"] if value != "1" else []
    return tuple(int(v) for _, v in args[:7]) + tuple(extra)


HEAVY = ("HMMA", "LDG", "STS", "LDSM", "BAR")
# Turing's limits per SM (TU102 / TU104 / TU106 / TU117).
TURING_REGS, TURING_SMEM, TURING_WARPS = 65536, 64 * 1024, 32


def sass_tools(log=print) -> Path | None:
    """A folder holding cuobjdump and nvdisasm (None where they are on PATH)."""
    if shutil.which("cuobjdump") and shutil.which("nvdisasm"):
        return None
    from serieskit.series.base import cache_dir

    site = cache_dir().parent / "sass-tools"
    bindir = site / "nvidia" / "cu13" / "bin"
    if not (bindir / "cuobjdump").exists() or not (bindir / "nvdisasm").exists():
        log(f"static: installing {', '.join(SASS_TOOLS)} from PyPI into {site} (once)")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
            + list(SASS_TOOLS),
            check=True,
        )
    for tool in ("cuobjdump", "nvdisasm"):
        (bindir / tool).chmod(0o755)
    return bindir


def parse_sass(text: str) -> dict[str, list[tuple[int, str, str, str]]]:
    """Function -> [(address, predicate, opcode, operands)]."""
    funcs: dict[str, list[tuple[int, str, str, str]]] = {}
    cur: list | None = None
    for line in text.splitlines():
        if m := re.search(r"Function : (\S+)", line):
            cur = funcs.setdefault(m.group(1), [])
        elif cur is not None and (m := LINE.search(line)):
            cur.append((int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4)))
    return funcs


def op_class(op: str) -> str:
    base = op.split(".")[0]
    if base in ("HMMA", "LDSM", "LDS", "STS", "LDG", "STG", "MUFU", "BAR"):
        return base
    if base in ("LDL", "STL"):
        return "local (spill)"
    if base in ("F2F", "F2I", "I2F"):
        return "conversion"
    if base in ("FFMA", "FADD", "FMUL", "FMNMX", "FSEL", "FSETP", "FSET"):
        return "FP32"
    if base in ("SHFL", "VOTE", "WARPSYNC", "BSSY", "BSYNC"):
        return "shuffle / vote / sync"
    return "integer / address / control"


def _target(args: str) -> int:
    """A branch's target address (-1 where it has none, e.g. a register)."""
    m = re.search(r"0x([0-9a-f]+)", args)
    return int(m.group(1), 16) if m else -1


def key_loop(ins: list[tuple[int, str, str, str]], hmma_per_tile: int) -> dict | None:
    """The census of the loop around the most HMMAs, per key tile (a loop
    unrolled by two tiles holds twice ``hmma_per_tile``): all of it, and its
    common path without the conditional blocks that hold no MMA, load, store
    or barrier (the causal mask and the rescale)."""
    best = None
    for addr, _, op, args in ins:
        if op == "BRA" and 0 <= _target(args) < addr:
            body = [x for x in ins if _target(args) <= x[0] <= addr and x[2] != "NOP"]
            hmma = sum(x[2].startswith("HMMA") for x in body)
            if best is None or hmma > best[0]:
                best = (hmma, body)
    if best is None or best[0] == 0:
        return None
    body = best[1]
    skips = []
    for addr, pred, op, args in body:
        if op == "BRA" and pred and _target(args) > addr:
            block = [x for x in body if addr < x[0] < _target(args)]
            if not any(x[2].split(".")[0] in HEAVY for x in block):
                skips.append((addr, _target(args), block))
    outer = [s for s in skips if not any(o[0] < s[0] and s[1] <= o[1] for o in skips)]
    total = collections.Counter(op_class(x[2]) for x in body)
    common = total.copy()
    for _, _, block in outer:
        common.subtract(op_class(x[2]) for x in block)
    tiles = max(1, round(best[0] / hmma_per_tile))
    return {
        "tiles_per_trip": tiles,
        "instructions": round(sum(total.values()) / tiles),
        "common_path": round(sum(common.values()) / tiles),
        "common_path_by_class": {k: round(v / tiles) for k, v in sorted(common.items()) if v},
        "conditional_blocks": [len(b) for _, _, b in outer],
    }


def turing_ctas_per_sm(regs: int, threads: int, smem: int) -> int:
    """Resident CTAs per Turing SM: registers (allocated per warp in units of
    256, so per thread in units of 8), shared memory and warps."""
    per_thread = -(-regs // 8) * 8
    by_regs = TURING_REGS // (per_thread * threads)
    by_smem = TURING_SMEM // smem
    return min(by_regs, by_smem, TURING_WARPS // (threads // 32))


def sm90_from_ptx(tree: Path, nvcc: str, out: Path) -> dict[str, build.Usage]:
    """ptxas usage of the compute_75 PTX compiled for sm_90, as the H200's
    driver compiles it for the benchmark (this nvcc's ptxas, not the
    driver's), by function."""
    kernel = build.Kernel(KERNEL, ("75",))
    _, usage = build.compile_kernel(
        nvcc, tree, kernel, (), False, out, ["-gencode=arch=compute_75,code=sm_90"]
    )
    return {u.function: u for u in usage if u.arch == "90"}


def static_machine(nvcc_version: str | None) -> dict:
    """The machine header of compile output: no GPU ran."""
    return {
        "name": "CPU",
        "kind": os.environ.get("SERIES_MACHINE_KIND"),
        "gpu": None,
        "gpus": 0,
        "driver": None,
        "torch": None,
        "cuda": nvcc_version,
        "label": (
            f"static sm_75 evidence (nvcc {nvcc_version}, "
            "compile output on a machine without a GPU; no GPU ran)"
        ),
    }


def analyse(report: build.Report, sass: str, sm90: dict[str, build.Usage]) -> list[dict]:
    """One entry per head dim: traits, ptxas usage, HMMAs, key-loop census."""
    funcs = parse_sass(sass)
    rows = []
    for u in report.usage:
        traits = traits_of(u.function)
        if not traits or u.arch != "75":
            continue
        hd, warps, mtiles, keys, ctas, shared, xor = (int(t) for t in traits[:7])
        threads = 32 * warps
        smem = 2 * 2 * keys * hd * 2  # 2 stages x (K + V) x keys x head dim x fp16
        ins = funcs.get(u.function, [])
        hmma_per_tile = (2 * hd * keys * 16 * mtiles) // (16 * 8 * 8)
        loop = key_loop(ins, hmma_per_tile)
        rows.append(
            {
                "head_dim": hd,
                "function": u.function,
                "traits": {
                    "warps": warps,
                    "row_tiles_per_warp": mtiles,
                    "rows_per_cta": 16 * mtiles * warps,
                    "keys_per_tile": keys,
                    "min_ctas_per_sm": ctas,
                    "shared_lookups": bool(shared),
                    "xor_addressing": bool(xor),
                },
                "registers": u.registers,
                "spill_stores": u.spill_stores,
                "spill_loads": u.spill_loads,
                "stack_bytes": u.stack_bytes,
                "dynamic_shared_bytes": smem,
                "turing_ctas_per_sm": turing_ctas_per_sm(u.registers, threads, smem),
                "hmma_in_kernel": sum(x[2].startswith("HMMA.1688.F32") for x in ins),
                "sm90_from_compute75_ptx": {
                    k: getattr(sm90[u.function], k)
                    for k in ("registers", "spill_stores", "spill_loads", "stack_bytes")
                }
                if u.function in sm90
                else None,
                "hmma_per_warp_per_tile": hmma_per_tile,
                "key_loop_per_warp_per_tile": loop,
            }
        )
    return sorted(rows, key=lambda r: r["head_dim"])


def figures(rows: list[dict]) -> dict:
    out = {}
    for i, r in enumerate(rows):
        hd = r["head_dim"]
        at = f"head_dims[{i}]"
        for key, unit, what in (
            ("registers", "registers", "registers per thread"),
            ("spill_stores", "bytes", "spill stores"),
            ("spill_loads", "bytes", "spill loads"),
            ("stack_bytes", "bytes", "stack frame"),
            ("dynamic_shared_bytes", "bytes", "dynamic shared memory per CTA"),
            ("turing_ctas_per_sm", "CTAs", "resident CTAs per Turing SM"),
            ("hmma_in_kernel", "instructions", "HMMA.1688.F32 in the kernel's SASS"),
        ):
            out[f"hd{hd}.{key}"] = results.figure(
                r[key], unit, f"sm_75 kernel, head dim {hd}: {what}", f"{at}.{key}"
            )
        if sm90 := r["sm90_from_compute75_ptx"]:
            for key, unit, what in (
                ("registers", "registers", "registers per thread"),
                ("spill_stores", "bytes", "spill stores"),
            ):
                out[f"hd{hd}.sm90_from_ptx.{key}"] = results.figure(
                    sm90[key],
                    unit,
                    f"head dim {hd}, compute_75 PTX compiled for sm_90 (the H200 benchmark's "
                    f"build; this nvcc's ptxas): {what}",
                    f"{at}.sm90_from_compute75_ptx.{key}",
                )
        if r["key_loop_per_warp_per_tile"]:
            out[f"hd{hd}.key_loop_common_path"] = results.figure(
                r["key_loop_per_warp_per_tile"]["common_path"],
                "instructions",
                f"sm_75 kernel, head dim {hd}: key loop, common path per warp and "
                f"{r['traits']['keys_per_tile']}-key tile "
                f"({r['hmma_per_warp_per_tile']} HMMA)",
                f"{at}.key_loop_per_warp_per_tile.common_path",
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT / ".work" / "vllm")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    if (bindir := sass_tools()) is not None:
        os.environ["PATH"] = f"{os.environ['PATH']}{os.pathsep}{bindir}"
    with tempfile.TemporaryDirectory() as tmp:
        report = build.build(a.tree, Path(tmp), archs=("75",), log=lambda *_: None)
        obj = Path(tmp) / (Path(KERNEL).stem + ".o")
        sass = subprocess.run(
            ["cuobjdump", "-sass", str(obj)], capture_output=True, text=True, check=True
        ).stdout
        sm90_dir = Path(tmp) / "sm90"
        sm90_dir.mkdir()
        sm90 = sm90_from_ptx(a.tree, report.nvcc["path"], sm90_dir)
    rows = analyse(report, sass, sm90)
    for r in rows:
        loop = r["key_loop_per_warp_per_tile"] or {}
        print(
            f"head dim {r['head_dim']}: {r['registers']} registers, spills "
            f"{r['spill_stores']}/{r['spill_loads']} B, stack {r['stack_bytes']} B, "
            f"{r['dynamic_shared_bytes']} B shared, {r['turing_ctas_per_sm']} CTAs/SM, "
            f"{r['hmma_in_kernel']} HMMA; key loop per warp and tile: "
            f"{r['hmma_per_warp_per_tile']} HMMA, {loop.get('common_path')} instructions; "
            f"sm_90 from the PTX: {r['sm90_from_compute75_ptx']}"
        )
    machine = static_machine(report.nvcc.get("version"))
    body = {
        "what": (
            "Static sm_75 evidence of paged_prefill_attention_sm75 per head dim "
            "(the Turing build; no Turing GPU was run)"
        ),
        "nvcc": report.nvcc,
        "flags": "serieskit.build: -O3 -gencode arch=compute_75,code=sm_75, -Xptxas -v",
        "sass": "cuobjdump -sass of the sm_75 object",
        "sm90_from_compute75_ptx": (
            "ptxas -v of the compute_75 PTX compiled for sm_90 by this nvcc: what the "
            "H200's driver JIT compiles for the benchmark (its ptxas may differ)"
        ),
        "key_loop_method": (
            "the backward branch around the most HMMAs; common path: without the "
            "conditional blocks that hold no HMMA, LDG, STS, LDSM or BAR (the causal "
            "mask of the diagonal tiles, the rescale when a row's max moves)"
        ),
        "turing_limits": {
            "registers_per_sm": TURING_REGS,
            "shared_bytes_per_sm": TURING_SMEM,
            "warps_per_sm": TURING_WARPS,
        },
        "head_dims": rows,
    }
    doc = results.document(
        "static",
        body,
        machine=machine,
        series=series.results_header(ROOT, a.tree),
        figures=figures(rows),
    )
    results.write(a.out, doc)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
