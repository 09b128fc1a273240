#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Whether the Turing prefill kernel compiles to the same machine code as at
an earlier toolkit commit: for a change to the kernel's source that should
leave the instantiations a run measured untouched (a new template option,
comments), the evidence that it does.

Both versions of the kernel come from patches/ (of the commit named and of
the work tree); each is compiled as the extension and the H200 runs build it
(sm_75 machine code, and the compute_75 PTX compiled for sm_90 by this
nvcc's ptxas), read with cuobjdump, and compared function by function,
instruction by instruction (addresses left out; a kernel is matched by its
traits, so a template parameter added with a default still matches). Exits
1 where a function of the earlier version differs or is gone. No GPU.

    python3 bench/same_machine_code.py 922bf91
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import prefill_attention_static as st  # noqa: E402
from sm75_prefill_lib import kernel_tree  # noqa: E402

from serieskit.build import build  # noqa: E402

# The anonymous namespace's mangled name carries a hash of the file.
ANONYMOUS = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}")
TARGETS = {
    "sm_75": "-gencode=arch=compute_75,code=sm_75",
    "sm_90 from compute_75 PTX": "-gencode=arch=compute_75,code=sm_90",
}


def machine_code(tree: Path, gencode: str, out: Path) -> dict[object, list[tuple[str, str, str]]]:
    """Function -> its instructions (predicate, opcode, operands)."""
    kernel = build.Kernel(st.KERNEL, ("75",))
    obj, _ = build.compile_kernel(
        os.environ.get("NVCC", "nvcc"), tree, kernel, (), False, out, [gencode]
    )
    sass = subprocess.run(
        ["cuobjdump", "-sass", str(obj)], capture_output=True, text=True, check=True
    )
    return {
        st.traits_of(name) or ANONYMOUS.sub("(anonymous namespace)", name): [
            (pred, op, args) for _, pred, op, args in ins
        ]
        for name, ins in st.parse_sass(sass.stdout).items()
    }


def compare(base: dict, head: dict) -> list[tuple[object, str]]:
    """(function, verdict) for each function of ``base``."""
    verdicts = []
    for key, ins in base.items():
        if key not in head:
            verdicts.append((key, "gone"))
        elif head[key] == ins:
            verdicts.append((key, "same"))
        else:
            diff = sum(a != b for a, b in zip(ins, head[key], strict=False))
            diff += abs(len(ins) - len(head[key]))
            verdicts.append((key, f"differs ({diff} of {len(ins)} instructions)"))
    return verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the toolkit commit whose patches/ hold the earlier kernel")
    a = ap.parse_args()
    if (bindir := st.sass_tools()) is not None:
        os.environ["PATH"] = f"{os.environ['PATH']}{os.pathsep}{bindir}"
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        trees = {
            "base": kernel_tree(Path(tmp) / "base", a.rev),
            "head": kernel_tree(Path(tmp) / "head"),
        }
        for target, gencode in TARGETS.items():
            code = {}
            for side, tree in trees.items():
                out = Path(tmp) / f"{side}-{target.split()[0]}"
                out.mkdir()
                code[side] = machine_code(tree, gencode, out)
            for key, verdict in compare(code["base"], code["head"]):
                print(f"{target}: {key}: {verdict}")
                ok &= verdict == "same"
    print("same machine code" if ok else "the machine code differs")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
