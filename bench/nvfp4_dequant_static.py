#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Static sm_75 evidence of the NVFP4 dequantization kernel (0008).

No GPU needed: for each tile (groups per program) the kernel that reads
Marlin's layout is compiled with
``triton.compile`` for a ``GPUTarget("cuda", cc, 32)`` and its PTX run
through Triton's own ptxas with ``-v``: registers, spill stores and loads,
stack, Triton's shared memory, and the global loads and stores of the PTX
(their vector widths: the stores should be 16-byte ``st.global.v4.b32``).
Pointers and strides are compiled as 16-divisible, as the launches
specialize them. This is compile output, not a measurement of any GPU.

Run with the interpreter that the test and ci sessions share (torch,
Triton 3.6.0, vLLM's requirements) on the work tree:

    .nox/torch_env/bin/python bench/nvfp4_dequant_static.py \\
        --out results/sm7x_static_nvfp4_dequant.json
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import results  # noqa: E402
from serieskit.series import series  # noqa: E402

TARGETS = (75,)
KERNELS = {
    "marlin": (
        "_dequant_marlin_kernel",
        {
            "q_ptr": "*i32",
            "s_ptr": "*u8",
            "g_ptr": "*fp32",
            "out_ptr": "*fp16",
            "size_n": "i32",
            "size_k": "i32",
            "padded_n": "i32",
            "out_stride": "i32",
        },
        ("q_ptr", "s_ptr", "out_ptr", "size_k", "padded_n", "out_stride"),
    ),
}


def compile_one(mod, triton, GPUTarget, layout: str, cc: int, groups: int) -> dict:
    name, signature, divisible = KERNELS[layout]
    names = list(signature)
    src = triton.compiler.ASTSource(
        fn=getattr(mod, name),
        signature={**signature, "GROUPS": "constexpr"},
        constexprs={"GROUPS": groups},
        attrs={(names.index(a),): [["tt.divisibility", 16]] for a in divisible},
    )
    num_warps = mod._num_warps(groups)
    compiled = triton.compile(
        src, target=GPUTarget("cuda", cc, 32), options={"num_warps": num_warps}
    )
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        f = Path(tmp) / "k.ptx"
        f.write_text(ptx)
        log = subprocess.run(
            [
                triton.knobs.nvidia.ptxas.path,
                "-lineinfo",
                "-v",
                f"--gpu-name=sm_{cc}",
                str(f),
                "-o",
                str(Path(tmp) / "k.cubin"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr

    def num(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0

    mem = collections.Counter(
        re.findall(r"^\s*(?:@!?%p\d+\s+)?((?:ld|st)\.global[.\w]*)", ptx, re.M)
    )
    return {
        "layout": layout,
        "target": f"sm_{cc}",
        "groups_per_program": groups,
        "num_warps": num_warps,
        "registers": num(r"Used (\d+) registers"),
        "spill_stores_bytes": num(r"(\d+) bytes spill stores"),
        "spill_loads_bytes": num(r"(\d+) bytes spill loads"),
        "stack_bytes": num(r"(\d+) bytes stack frame"),
        "triton_shared_memory_bytes": compiled.metadata.shared,
        "ptx_global_memory_ops_per_thread": dict(sorted(mem.items())),
        "fp8_types_in_ptx": bool(re.search(r"\.e4m3|\.e5m2", ptx)),
        "ptxas_log": log.strip().splitlines()[-2:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--tree",
        type=Path,
        default=ROOT / ".work" / "vllm",
        help="the patched vLLM tree (default: the work tree)",
    )
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()

    # vllm.triton_utils hands out the real Triton without a GPU driver only
    # when CUDA_VISIBLE_DEVICES is set and empty.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["TRITON_INTERPRET"] = "0"
    sys.path.insert(0, str(a.tree.resolve()))
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from vllm.kernels.triton import nvfp4_marlin_dequant as mod

    rows = []
    for layout in KERNELS:
        for cc in TARGETS:
            for groups in mod.GROUPS_PER_PROGRAM_CHOICES:
                row = compile_one(mod, triton, GPUTarget, layout, cc, groups)
                rows.append(row)
                print(
                    f"{layout:10s} sm_{cc} {groups:3d} groups: {row['registers']:3d} registers, "
                    f"spills {row['spill_stores_bytes']}/{row['spill_loads_bytes']} B, "
                    f"{row['ptx_global_memory_ops_per_thread']}",
                    flush=True,
                )

    figures = {}
    for r in rows:
        key = f"{r['layout']}.{r['target']}.g{r['groups_per_program']}"
        where = (
            f"rows[layout={r['layout']}, target={r['target']}, "
            f"groups_per_program={r['groups_per_program']}]"
        )
        what = f"{r['layout']} layout, {r['target']}, {r['groups_per_program']} groups per program"
        figures[f"{key}.registers"] = {
            "value": r["registers"],
            "unit": "registers",
            "label": f"{what}: registers per thread",
            "from": where + ".registers",
        }
        figures[f"{key}.spill_bytes"] = {
            "value": r["spill_stores_bytes"] + r["spill_loads_bytes"],
            "unit": "bytes",
            "label": f"{what}: spill stores + loads",
            "from": where + ".spill_stores_bytes + spill_loads_bytes",
        }
    defaults = {"sm_75": mod.default_groups_per_program((7, 5))}
    machine = {
        "name": "CPU (triton.compile for sm_75)",
        "kind": "cpu",
        "gpu": None,
        "gpus": 0,
        "driver": None,
        "torch": torch.__version__,
        "cuda": None,
        "label": "static sm_75 compile evidence (Triton "
        f"{triton.__version__}, its bundled ptxas), not a measurement "
        "and not a Turing figure",
    }
    body = {
        "what": "NVFP4 dequantization to fp16 (patch 0008, nvfp4_marlin_dequant.py): "
        "registers and spills per tile",
        "triton": triton.__version__,
        "ptxas": subprocess.run(
            [triton.knobs.nvidia.ptxas.path, "--version"], capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1],
        "host": platform.platform(),
        "default_groups_per_program": defaults,
        "layouts_used": {"sm_75": "marlin (Marlin serves decode; prefill reads its layout)"},
        "rows": rows,
    }
    doc = results.document(
        "static", body, machine=machine, series=series.results_header(ROOT, a.tree), figures=figures
    )
    results.write(a.out, doc)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
