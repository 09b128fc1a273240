#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Benchmark of the NVFP4 dequantization to fp16 (patch 0008) on any CUDA GPU
of compute capability 7.5 or higher (Marlin's layout needs gptq_marlin_repack;
the emulation arms need 8.9, for Triton's fp8 types).

Runs on the GPU machine with the patched tree's ``vllm`` first on PYTHONPATH
(``gpu/stage2.sh`` sets it up). For the seed's per-rank shapes (N x K of
Qwen3.8-27B at TP=2) and every tile (16-element groups per program) of the
kernel that reads Marlin's layout (what the layer keeps):

- the kernel's bandwidth, bytes read (codes and scales) plus bytes written
  (fp16), over the median time of single launches after warm-up, each launch
  after an L2 flush;
- that bandwidth as a fraction of the device-to-device copy bandwidth
  (read + write of a 1 GiB copy) measured in the same run; the goal at the
  device's default tile is 0.8 or more;
- every tile's output against the default tile's (bit-identical expected);
- beside it, upstream's own dequantization of the checkpoint's layout
  (``dequantize_to_dtype``, the emulation backend's), timed the same way and
  compared bit for bit.

And for the prefill GEMM at M = 2048 (plus a sweep of M, for the crossover
on this GPU): dequantization + cuBLAS (F.linear) against Marlin's FP4 GEMM
on the same weights, cuBLAS alone, the registered op end to end, and
upstream's EmulationNvFp4LinearKernel in the same run: its apply_weights as
it is (activations quantized to FP4, then dequantize + matmul) and its
weight dequantization + cuBLAS alone (the one step the two paths share).

Figures are of the GPU it runs on (an H200 here), never of a Turing or Volta
card; the seed's Turing figures are quoted in the output as the seed's.

    python3 bench/nvfp4_dequant.py --out results/nvfp4_dequant_h200.json
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from timing import time_events  # noqa: E402

from serieskit import results  # noqa: E402

# N x K per rank (the seed's shapes, Qwen3.8-27B at TP=2).
SHAPES = [(17408, 5120), (5120, 8704), (5120, 2560), (8192, 5120)]
GEMM_M = 2048
M_SWEEP = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096]
SEED_TURING = {
    "source": "/work/shared/seeds/000_9a4eb9d6ad5f6d16.txt (commit 0d83b1b)",
    "label": "the seed's Turing figures: its own NVFP4 (QPN2) dequantization kernel "
    "of its fork on one Quadro RTX 8000 (Tesla V100 where named), not this "
    "kernel; whether CUDA graphs were used is not recorded",
    "ms_64_to_16_groups": {
        "17408x5120": [1.090, 0.496],
        "5120x8704": [0.580, 0.250],
        "5120x2560": [0.166, 0.075],
        "8192x5120": [0.525, 0.230],
    },
    "gbps_17408x5120_16_groups": 460,
    "v100_17408x5120_64_groups_ms": 0.930,
    "results_file": "results/seed_turing_rtx8000x2.json (figures nvfp4_dequant.*)",
}


def copy_bandwidth(reps: int) -> dict:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    t = time_events(lambda: dst.copy_(src), reps, 5, None)
    t["bytes"] = 2 * n
    t["gbps"] = 2 * n / (t["median_ms"] * 1e-3) / 1e9
    return t


def make_weight(n: int, k: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    weight = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    # Positive normal e4m3 scales (what trained checkpoints hold).
    scales = torch.randint(
        0x20, 0x60, (n, k // 16), dtype=torch.uint8, device="cuda", generator=gen
    )
    return weight, scales, torch.tensor([0.01], device="cuda")


def marlin_layer(weight, scales, global_scale):
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import (
        prepare_fp4_layer_for_marlin,
    )

    n, k = weight.shape[0], weight.shape[1] * 2
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(
        scales.view(torch.float8_e4m3fn).clone(), requires_grad=False
    )
    layer.weight_global_scale = torch.nn.Parameter(
        global_scale.reshape(()).clone(), requires_grad=False
    )
    layer.output_size_per_partition = n
    layer.input_size_per_partition = k
    layer.params_dtype = torch.float16
    layer.bias = None
    prepare_fp4_layer_for_marlin(layer)
    return layer


def emulation_arm(checkpoint_args):
    """Upstream's EmulationNvFp4LinearKernel on a layer that keeps the
    checkpoint's layout, as the emulation backend serves it."""
    from vllm.model_executor.kernels.linear import NvFp4LinearLayerConfig
    from vllm.model_executor.kernels.linear.nvfp4.emulation import (
        EmulationNvFp4LinearKernel,
    )

    weight, scales, g = checkpoint_args
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(weight, requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(scales.view(torch.float8_e4m3fn), requires_grad=False)
    layer.weight_global_scale = torch.nn.Parameter(g, requires_grad=False)
    kernel = EmulationNvFp4LinearKernel(NvFp4LinearLayerConfig())
    kernel.process_weights_after_loading(layer)
    return kernel, layer


def emulation_dequant(checkpoint_args):
    """The emulation backend's weight dequantization (upstream's Triton kernel
    for the checkpoint's layout), to a new fp16 tensor as it runs there."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
        dequantize_to_dtype,
    )

    weight, scales, g = checkpoint_args
    return dequantize_to_dtype(
        weight, scales.view(torch.float8_e4m3fn), g, torch.float16, 16, swizzle=False
    )


def gemm_sweep(layer, marlin_args, checkpoint_args, out, groups, a, flush, figures) -> list[dict]:
    """Marlin, dequantization + cuBLAS, cuBLAS alone, the op and the emulation
    kernel at each M of the sweep, on one layer's weights."""
    from vllm.kernels.triton import nvfp4_marlin_dequant as dq
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import (
        apply_fp4_marlin_linear,
    )

    emulation, emulation_layer = emulation_arm(checkpoint_args)
    n, k = out.shape
    shape = f"{n}x{k}"
    g = marlin_args[2]
    w = dq.nvfp4_dequant_marlin(*marlin_args)
    rows = []
    for m in M_SWEEP:
        x = torch.randn(m, k, dtype=torch.float16, device="cuda")
        # The emulation quantizes activations with the checkpoint's input
        # scale: amax maps to e4m3's max times e2m1's (448 * 6).
        emulation_layer.input_global_scale_inv = (448.0 * 6.0) / x.abs().max().float()
        fns = {
            "marlin": lambda x=x: apply_fp4_marlin_linear(
                input=x,
                weight=layer.weight,
                weight_scale=layer.weight_scale,
                weight_global_scale=layer.weight_global_scale,
                workspace=None,  # 0.33.0's Marlin takes none
                size_n=n,
                size_k=k,
            ),
            "dequant_cublas": lambda x=x: F.linear(
                x, dq.nvfp4_dequant_marlin(*marlin_args, out=out, groups=groups)
            ),
            "cublas": lambda x=x: F.linear(x, w),
            # The registered op as MarlinNvFp4LinearKernel calls it with
            # kernel_config.nvfp4_marlin_prefill_dequant enabled: Marlin below
            # its threshold, dequantization + cuBLAS from it.
            "op": lambda x=x: torch.ops.vllm.nvfp4_marlin_prefill_dequant_apply(
                x,
                layer.weight,
                layer.weight_scale,
                layer.weight_global_scale,
                g,
                None,
                None,
                n,
                k,
                groups,
            ),
            # Upstream's emulation kernel as it serves a W4A4 layer, and its
            # weight dequantization alone with the same cuBLAS call.
            "emulation": lambda x=x: emulation.apply_weights(emulation_layer, x),
            "emulation_dequant_cublas": lambda x=x: F.linear(x, emulation_dequant(checkpoint_args)),
        }
        row: dict = {"shape": shape, "m": m}
        reps = a.reps if m <= 2048 else max(20, a.reps // 2)
        for name, fn in fns.items():
            row[f"{name}_ms"] = time_events(fn, reps, a.warmup, flush)["median_ms"]
        row["marlin_over_dequant_cublas"] = row["marlin_ms"] / row["dequant_cublas_ms"]
        row["emulation_over_op"] = row["emulation_ms"] / row["op_ms"]
        rows.append(row)
        print(
            f"{shape:11s} M={m:5d}: Marlin {row['marlin_ms']:8.3f} ms, dequant + "
            f"cuBLAS {row['dequant_cublas_ms']:8.3f} ms (cuBLAS {row['cublas_ms']:8.3f},"
            f" op {row['op_ms']:8.3f}), emulation {row['emulation_ms']:8.3f} ms"
            f" (its dequant + cuBLAS {row['emulation_dequant_cublas_ms']:8.3f})",
            flush=True,
        )
        if m == GEMM_M:
            for name, label in (
                ("marlin", "Marlin FP4 GEMM"),
                ("dequant_cublas", "dequantization + cuBLAS"),
                ("cublas", "cuBLAS alone on the fp16 weight"),
                ("op", "the op end to end (dequant route)"),
                ("emulation", "EmulationNvFp4LinearKernel.apply_weights (W4A4 emulation)"),
                (
                    "emulation_dequant_cublas",
                    "the emulation's weight dequantization (checkpoint layout) + cuBLAS",
                ),
            ):
                figures[f"{shape}.m{m}.{name}_ms"] = {
                    "value": round(row[f"{name}_ms"], 4),
                    "unit": "ms",
                    "label": f"{shape}, M={m}: {label}",
                    "from": f"gemm[shape={shape}, m={m}].{name}_ms",
                }
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()

    import triton
    from vllm.kernels.triton import nvfp4_marlin_dequant as dq
    from vllm.model_executor.kernels.linear.nvfp4 import marlin as op_module  # the op

    cap = torch.cuda.get_device_capability()
    default_groups = dq.default_groups_per_program(cap)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    copy = copy_bandwidth(a.reps)
    print(f"device-to-device copy: {copy['gbps']:.0f} GB/s (read + write)", flush=True)

    figures: dict = {
        "copy_bandwidth_gbps": {
            "value": round(copy["gbps"], 1),
            "unit": "GB/s",
            "label": "device-to-device copy of 1 GiB, read + write bytes over the median time",
            "from": "copy.gbps",
        }
    }
    rows: list[dict] = []
    gemm_rows: list[dict] = []
    layouts_agree: dict[str, bool] = {}
    for n, k in SHAPES:
        shape = f"{n}x{k}"
        weight, scales, g = make_weight(n, k, seed=n + k)
        layer = marlin_layer(weight, scales, g)
        checkpoint_args = (weight, scales, g)
        marlin_args = (layer.weight.data, layer.weight_scale.data.view(torch.uint8), g, n, k)
        out = torch.empty(n, k, dtype=torch.float16, device="cuda")
        nbytes = weight.nbytes + scales.nbytes + out.nbytes  # the same in both layouts
        dq.nvfp4_dequant_marlin(*marlin_args, out=out, groups=default_groups)
        ref = out.clone()
        arms = {
            f"marlin.g{groups}": partial(
                dq.nvfp4_dequant_marlin, *marlin_args, out=out, groups=groups
            )
            for groups in dq.GROUPS_PER_PROGRAM_CHOICES
        }
        arms["emulation"] = partial(emulation_dequant, checkpoint_args)
        for arm, launch in arms.items():
            t = time_events(launch, a.reps, a.warmup, flush)
            t["gbps"] = nbytes / (t["median_ms"] * 1e-3) / 1e9
            t["fraction_of_copy_bandwidth"] = t["gbps"] / copy["gbps"]
            got = launch()
            t["bit_identical_to_default_tile"] = bool(
                torch.equal(got.view(torch.int16), ref.view(torch.int16))
            )
            # Upstream's emulation rounds on its own way (not a tile of this
            # kernel): how far it is, not whether it is identical.
            t["max_abs_diff_vs_default_tile"] = (got.float() - ref.float()).abs().max().item()
            layout, _, tile = arm.partition(".g")
            rows.append(
                {
                    "shape": shape,
                    "n": n,
                    "k": k,
                    "layout": "checkpoint" if layout == "emulation" else layout,
                    "kernel": "emulation's dequantize_to_dtype" if tile == "" else "this",
                    "groups_per_program": int(tile) if tile else None,
                    "bytes": nbytes,
                    **t,
                }
            )
            label = (
                f"{shape}, the emulation's dequantization (checkpoint layout)"
                if layout == "emulation"
                else f"{shape}, marlin layout, {tile} groups per program"
            )
            key = f"{shape}.{arm}"
            figures[f"{key}.gbps"] = {
                "value": round(t["gbps"], 1),
                "unit": "GB/s",
                "label": label,
                "from": f"rows[shape={shape}, arm={arm}].gbps",
            }
            figures[f"{key}.fraction_of_copy_bandwidth"] = {
                "value": round(t["fraction_of_copy_bandwidth"], 3),
                "unit": "fraction",
                "label": f"{label}, of the device-to-device copy bandwidth",
                "from": f"rows[shape={shape}, arm={arm}].fraction_of_copy_bandwidth",
            }
            print(
                f"{shape:11s} {arm:10s}: "
                f"{t['median_ms'] * 1e3:8.1f} us {t['gbps']:7.0f} GB/s "
                f"({100 * t['fraction_of_copy_bandwidth']:.0f} % of copy)"
                + (
                    ""
                    if t["bit_identical_to_default_tile"]
                    else f"  max |diff| {t['max_abs_diff_vs_default_tile']:.3g}"
                    + ("" if layout == "emulation" else "  NOT IDENTICAL")
                ),
                flush=True,
            )
        figures[f"{shape}.marlin.default_tile.fraction_of_copy_bandwidth"] = dict(
            figures[f"{shape}.marlin.g{default_groups}.fraction_of_copy_bandwidth"],
            label=f"{shape}, marlin layout, this device's default tile "
            f"({default_groups} groups per program), of the copy bandwidth",
        )
        # Every tile of this kernel gives the same bits.
        layouts_agree[shape] = all(
            r["bit_identical_to_default_tile"]
            for r in rows
            if r["shape"] == shape and r["kernel"] == "this"
        )
        # GEMMs on the same weights: dequantization + cuBLAS against Marlin.
        gemm_rows += gemm_sweep(
            layer, marlin_args, checkpoint_args, out, default_groups, a, flush, figures
        )
        faster = [
            r["m"]
            for r in gemm_rows
            if r["shape"] == shape and r["dequant_cublas_ms"] <= r["marlin_ms"]
        ]
        figures[f"{shape}.crossover_m"] = {
            "value": min(faster) if faster else None,
            "unit": "tokens",
            "label": f"{shape}: smallest M of the sweep where dequantization + cuBLAS "
            "is no slower than Marlin on this GPU (not a Turing figure)",
            "from": "gemm",
        }
        torch.cuda.empty_cache()

    props = torch.cuda.get_device_properties(0)
    body = {
        "what": "NVFP4 dequantization to fp16 (patch 0008): bandwidth per shape and "
        "tile against the device-to-device copy, beside the emulation backend's "
        "dequantization; prefill GEMM, dequantization + cuBLAS against Marlin and "
        "against EmulationNvFp4LinearKernel, in one run",
        "triton": triton.__version__,
        "capability": list(cap),
        "sm_count": props.multi_processor_count,
        "default_groups_per_program": default_groups,
        "goal": "fraction_of_copy_bandwidth >= 0.8 at the default tile",
        "timing": "CUDA events around single launches, median of reps after warm-up, "
        "L2 flushed (256 MiB written) before each; bytes: codes + scales read, "
        "fp16 written",
        "copy": copy,
        "rows": rows,
        "layouts_bit_identical": layouts_agree,
        "gemm": gemm_rows,
        "seed_turing": SEED_TURING,
        "op_module": op_module.__name__,
        "op_min_tokens": op_module.PREFILL_DEQUANT_MIN_TOKENS,
    }
    doc = results.document(
        "bench",
        body,
        machine=results.machine(),
        series=results.current_series(ROOT),
        figures=figures,
    )
    results.write(a.out, doc)
    print(f"wrote {a.out}")
    ok = all(layouts_agree.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
