#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A profiler's target: the Turing prefill attention kernel, launched twice
on one shape of bench/prefill_attention.py, without importing vLLM.

Under Nsight Compute every CUDA call of the process is intercepted, and
importing vLLM (torch.compile's and Triton's modules with it) took longer
than a device call's limit before the kernel ran. This loads the built
extension by path (``torch.ops.load_library``: its ops are defined in C++)
and calls the op alone: a warm-up launch, then the launch to profile, both
without split-KV (the key loop only; no merge kernel).

    ncu --clock-control none -k regex:paged_prefill_attention_sm75_kernel \\
        --launch-skip 1 -c 1 --section WarpStateStats ... \\
        python3 bench/prefill_attention_profile.py --lib .../_sm7x_C.abi3.so \\
        --head-dim 128 --context 32768

gpu/profile_attention.sh runs it under ncu for each head dim.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefill_attention import QUERY, make_inputs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", type=Path, required=True, help="the built _sm7x_C library")
    ap.add_argument("--head-dim", type=int, default=256, choices=(64, 128, 256))
    ap.add_argument("--context", type=int, default=32 * 1024)
    ap.add_argument("--query", type=int, default=QUERY)
    a = ap.parse_args()
    if not a.lib.is_file():
        sys.exit(f"error: {a.lib} is not a file (build _sm7x_C first: gpu/stage2.sh)")
    import torch

    torch.ops.load_library(str(a.lib))
    op = torch.ops._sm7x_C.paged_prefill_attention_sm75
    inp = make_inputs(a.query, a.context, a.head_dim)
    out = torch.empty_like(inp["query"])
    args = [inp[k] for k in ("query", "key_cache", "value_cache", "block_table")]
    args += [inp["cu_seqlens_q"], inp["seq_lens"], inp["scale"]]
    for _ in range(2):  # the warm-up, then the one to profile (--launch-skip 1)
        op(out, *args, None, 1)
    torch.cuda.synchronize()
    finite = bool(torch.isfinite(out).all())
    print(f"head dim {a.head_dim}, {a.query} query tokens after {a.context}: finite {finite}")
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
