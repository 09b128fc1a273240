#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A profiler's target: one shape of the Turing prefill attention kernel,
launched twice on one case of bench/prefill_attention.py, without vLLM.

Under Nsight Compute every CUDA call of the process is intercepted, and
importing vLLM (torch.compile's and Triton's modules with it) took longer
than a device call's limit before the kernel ran. This loads the sweep's
library (``bench/prefill_attention_variants.py --build LIB``: the series'
kernel template, the shipped shapes and their alternatives) by ctypes and
launches one shape: a warm-up, then the launch to profile, both without
split-KV (the key loop only; no merge kernel).

    ncu --clock-control none -k regex:paged_prefill_attention_sm75_kernel \\
        --launch-skip 1 -c 1 --section WarpStateStats ... \\
        python3 bench/prefill_attention_profile.py --lib /tmp/libsm75v.so \\
        --head-dim 128 --context 32768 [--variant hd128.w8m1k32c1]

gpu/profile_attention.sh runs it under ncu for each shape it is given and
exports the report's source page (per SASS instruction: the warp stall
samples by reason); ``--stalls CSV`` summarizes such a page here.
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def stalls(page: Path) -> str:
    """Where the warps of one profiled launch waited: the stall samples of
    ncu's source page (``--page source --csv --print-source sass``) by
    reason, then by opcode with each opcode's three main reasons, as
    percentages of all samples."""
    opener = gzip.open if page.suffix == ".gz" else open
    with opener(page, "rt") as f:
        rows = list(csv.reader(f))
    head, body = rows[1], rows[2:]
    source = head.index("Source")
    reasons = [
        (i, h.removeprefix("stall_"))
        for i, h in enumerate(head)
        if h.startswith("stall_") and "Not Issued" not in h
    ]
    by_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in body:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[source].strip()).split(".")[0].split(" ")[0]
        for i, h in reasons:
            by_op[op or "?"][h] += int(r[i] or 0)
    total: collections.Counter = collections.Counter()
    for c in by_op.values():
        total.update(c)
    n = sum(total.values()) or 1

    def pct(c: collections.Counter, k: int) -> str:
        return ", ".join(f"{h} {100 * v / n:.1f}" for h, v in c.most_common(k) if v)

    lines = [f"{page.name}: {n:,} samples; by reason (% of all): {pct(total, 9)}"]
    for op, c in sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:10]:
        lines.append(f"  {op:<6} {100 * sum(c.values()) / n:5.1f} %: {pct(c, 3)}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", type=Path, help="the sweep's library (--build LIB)")
    ap.add_argument("--stalls", type=Path, nargs="+", help="summarize ncu source pages (CSV)")
    ap.add_argument("--head-dim", type=int, default=256, choices=(64, 128, 256))
    ap.add_argument("--variant", help="a shape's name (default: the shipped one of the head dim)")
    ap.add_argument("--context", type=int, default=32 * 1024)
    ap.add_argument("--query", type=int, default=2048)
    a = ap.parse_args()
    if a.stalls:
        print("\n".join(stalls(page) for page in a.stalls))
        return 0
    # Checked before torch is imported: the refusal needs no GPU machine.
    if a.lib is None or not a.lib.is_file():
        sys.exit(
            f"error: {a.lib} is not a file (build it first: "
            "python3 bench/prefill_attention_variants.py --tree TREE --build LIB)"
        )
    import torch
    from prefill_attention import KV_HEADS, make_inputs
    from sm75_prefill_lib import launcher, load, params_for, scratch_for, variants

    lib = load(a.lib)
    shapes = variants(lib)
    want = [
        v
        for v in shapes
        if (v["name"] == a.variant if a.variant else v["head_dim"] == a.head_dim and v["shipped"])
    ]
    if len(want) != 1:
        sys.exit(
            f"error: no shape {a.variant!r}; the library has {', '.join(v['name'] for v in shapes)}"
        )
    v = want[0]
    inp = make_inputs(a.query, a.context, v["head_dim"])
    out = torch.empty_like(inp["query"])
    # Kept alive beside the params, which hold its pointer (the run is unsplit).
    scratch = scratch_for(torch, inp["query"], 1, KV_HEADS)
    p = params_for(torch, inp, out, None, scratch)
    launch = launcher(torch, lib, v["index"], p, 1)
    for _ in range(2):  # the warm-up, then the one to profile (--launch-skip 1)
        launch()
    torch.cuda.synchronize()
    finite = bool(torch.isfinite(out).all())
    print(f"{v['name']}: {a.query} query tokens after {a.context}: finite {finite}")
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
