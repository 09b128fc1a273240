#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Static sm_75 / sm_70 evidence of the series' CUDA kernels, as a results file.

No GPU needed. Reads the report of ``python3 -m serieskit build`` (ptxas -v:
registers, spills, stack and shared memory per kernel and architecture) and
the SASS of the built objects (``cuobjdump -sass``, of each ``.o`` and
``.cubin`` in the build folder, or text dumps given with ``--sass``), and
counts per kernel the instructions that decide its speed on Turing / Volta:
tensor-core MMAs (HMMA), ldmatrix (LDSM), global and shared loads and
stores, special functions (MUFU), barriers and local-memory traffic (STL /
LDL, which is where spills go). This is compile output, not a measurement.

    python3 -m serieskit build
    python3 bench/sm7x_static.py --build .work/build --out results/sm7x_static.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import results  # noqa: E402
from serieskit.build import build  # noqa: E402

# SASS opcode prefixes counted per kernel, and what they are.
OPCODES = {
    "HMMA": "tensor-core MMA",
    "LDSM": "ldmatrix",
    "LDG": "global load",
    "STG": "global store",
    "LDS": "shared load",
    "STS": "shared store",
    "MUFU": "special function (exp2, rcp)",
    "BAR": "barrier",
    "LDL": "local load (spill)",
    "STL": "local store (spill)",
}
_ARCH = re.compile(r"code for (sm_\d+)")


def census(dumps: list[str]) -> dict[tuple[str, str], dict[str, int]]:
    """(arch, function) -> counts of OPCODES and of all instructions, from
    ``cuobjdump -sass`` dumps of single-architecture objects."""
    out = {}
    for text in dumps:
        arch = m.group(1) if (m := _ARCH.search(text)) else "?"
        for function, ops in build.sass_opcodes(text).items():
            row = dict.fromkeys((*OPCODES, "instructions"), 0)
            for op, n in ops.items():
                row["instructions"] += n
                if (prefix := op.split(".")[0]) in OPCODES:
                    row[prefix] += n
            out[(arch, function)] = row
    return out


def dump_sass(build_dir: Path, tool: str) -> list[str]:
    texts = []
    for f in sorted([*build_dir.glob("*.o"), *build_dir.glob("*.cubin")]):
        proc = subprocess.run([tool, "-sass", str(f)], capture_output=True, text=True)
        if proc.returncode == 0:
            texts.append(proc.stdout)
    return texts


def rows(report: dict, counts: dict) -> list[dict]:
    """One row per kernel and architecture: ptxas's figures and the SASS census."""
    out = []
    for u in report["usage"]:
        arch = f"sm_{u['arch']}"
        row = {k: u.get(k) for k in ("name", "function", "registers", "shared_bytes")}
        row.update(
            arch=arch,
            spill_stores=u.get("spill_stores"),
            spill_loads=u.get("spill_loads"),
            stack_bytes=u.get("stack_bytes"),
            sass=counts.get((arch, u["function"])),
        )
        out.append(row)
    return out


def figures(table: list[dict]) -> dict:
    figs = {}
    for r in table:
        key = f"{r['name']}.{r['arch']}"
        src = f"rows[name={r['name']},arch={r['arch']}]"
        figs[f"{key}.registers"] = results.figure(
            r["registers"], "registers", f"{r['name']} ({r['arch']}): registers per thread", src
        )
        figs[f"{key}.spill_bytes"] = results.figure(
            (r["spill_stores"] or 0) + (r["spill_loads"] or 0),
            "bytes",
            f"{r['name']} ({r['arch']}): spill stores + loads",
            src,
        )
        if r["sass"]:
            figs[f"{key}.hmma"] = results.figure(
                r["sass"]["HMMA"], "instructions", f"{r['name']} ({r['arch']}): HMMA in SASS", src
            )
    return figs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", type=Path, default=ROOT / ".work" / "build")
    ap.add_argument("--sass", type=Path, nargs="*", default=[], help="cuobjdump -sass text dumps")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    report = json.loads((a.build / "report.json").read_text())
    if a.sass:
        dumps = [p.read_text() for p in a.sass]
    elif a.cuobjdump:
        dumps = dump_sass(a.build, a.cuobjdump)
    else:
        print("error: no cuobjdump on PATH: give --cuobjdump or --sass", file=sys.stderr)
        return 1
    table = rows(report, census(dumps))
    body = {
        "what": "static sm_75 / sm_70 evidence of the series' CUDA kernels "
        "(ptxas -v and a SASS census); compile output, not a measurement",
        "nvcc": report.get("nvcc"),
        "kernels": report.get("kernels"),
        "opcodes": OPCODES,
        "rows": table,
    }
    machine = {
        "name": "CPU (nvcc / NVRTC, no GPU)",
        "kind": "cpu",
        "gpu": None,
        "gpus": 0,
        "driver": None,
        "torch": None,
        "label": "static sm_75 / sm_70 compile evidence, not a measurement and not a "
        "Turing or Volta figure",
    }
    doc = results.document(
        "static", body, machine=machine, series=results.current_series(ROOT), figures=figures(table)
    )
    results.write(a.out, doc)
    for r in table:
        s = r["sass"] or {}
        print(
            f"{r['name']:45s} {r['arch']}: {r['registers']:3d} regs, "
            f"spills {r['spill_stores']}/{r['spill_loads']}, HMMA {s.get('HMMA', '-')}, "
            f"LDSM {s.get('LDSM', '-')}, STL/LDL {s.get('STL', '-')}/{s.get('LDL', '-')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
