"""Figures of the no-P2P results files (matplotlib), for the README.

    python3 bench/plots.py [--bench results/bench_host_reduce_h200x2.json] \
        [--e2e results/e2e_seed16_h200x2.json] [--out docs/figures]

1. ``host_reduce_<machine>.png``: time per call and bandwidth (payload / time)
   against payload for NCCL, the kernel mode, the copy-engine mode and the
   pinned-copy floor (payload over the slower copy direction with both
   directions on both GPUs at once); where the file has it, the copy-engine
   mode's host time of one call (bench/host_reduce.py's host-issue figures).
2. ``e2e_prefill_<machine>.png``: prefill of the five prompts per arm (mean of
   the boots, each boot a dot), the P2P-on ceiling as a line and, where the
   file has it, the ideal-overlap bound.

Every title carries the file's machine label (an H200 figure is named so).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "results" / "bench_host_reduce_h200x2.json"
E2E = ROOT / "results" / "e2e_seed16_h200x2.json"
OUT = ROOT / "docs" / "figures"
IMPLS = {"nccl": "NCCL", "kernel_mode": "kernel mode", "copy_engine_mode": "copy-engine mode"}
MARKERS = {"nccl": "o", "kernel_mode": "s", "copy_engine_mode": "^"}


def slug(data: dict) -> str:
    """``h200x2`` from the machine header."""
    m = data["machine"]
    short = str(m["gpu"]).removeprefix("NVIDIA ").split()[-1].lower()
    return f"{short}x{m['gpus']}"


def allreduce_series(data: dict) -> dict[str, list[tuple[int, float, float]]]:
    """Line -> [(payload bytes, ms per call, GB/s)] from the bench's summary."""
    rows = data["summary"]["per_size"]
    out = {
        impl: [(r["bytes"], r[f"{impl}_ms"], r[f"{impl}_algbw_GBps"]) for r in rows]
        for impl in IMPLS
    }
    floor = data["summary"]["floor_bandwidth_GBps"]
    out["floor"] = [(r["bytes"], r["floor_ms"], floor) for r in rows]
    if all("copy_engine_host_issue_ms" in r for r in rows):
        out["copy_engine_host"] = [
            (
                r["bytes"],
                r["copy_engine_host_issue_ms"],
                r["bytes"] / (r["copy_engine_host_issue_ms"] * 1e6),
            )
            for r in rows
        ]
    return out


def prefill_bars(data: dict) -> dict:
    """Per arm, reference first: mean and the boots' totals (s), change
    against the reference (%); the P2P-on ceiling and the ideal bound (s)."""
    s = data["summary"]
    order = [a["name"] for a in data.get("arms", []) if a["name"] in s["arms"]]
    order += [n for n in s["arms"] if n not in order]
    ref = s["arms"][order[0]]["prefill_total_mean_s"]
    arms = {
        n: {
            "mean": s["arms"][n]["prefill_total_mean_s"],
            "boots": s["arms"][n]["prefill_total_s"],
            "change_pct": 100 * (s["arms"][n]["prefill_total_mean_s"] / ref - 1),
        }
        for n in order
    }
    bound = s.get("ideal_overlap", {}).get("ideal_saving_s")
    return {
        "arms": arms,
        "ceiling": s.get("p2p_on_prefill_total_mean_s"),
        "ideal": None if bound is None else ref - bound,
    }


def _payload_axis(ax) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("payload per call (bytes, fp16)")
    ax.grid(True, which="both", alpha=0.3)


def plot_allreduce(data: dict, dest: Path) -> Path:
    import matplotlib.pyplot as plt

    series = allreduce_series(data)
    fig, (t_ax, bw_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    for impl, name in IMPLS.items():
        xs, ms, bw = zip(*series[impl], strict=True)
        t_ax.plot(xs, ms, marker=MARKERS[impl], label=name)
        bw_ax.plot(xs, bw, marker=MARKERS[impl], label=name)
    xs, ms, bw = zip(*series["floor"], strict=True)
    t_ax.plot(xs, ms, "k--", label="pinned-copy floor")
    bw_ax.plot(xs, bw, "k--", label="pinned-copy floor")
    if "copy_engine_host" in series:
        xs, ms, _ = zip(*series["copy_engine_host"], strict=True)
        t_ax.plot(xs, ms, ":", color="C2", label="copy-engine mode, host time of one call")
    t_ax.set_yscale("log")
    t_ax.set_ylabel("time per call (ms, back to back)")
    bw_ax.set_ylabel("bandwidth: payload / time (GB/s)")
    for ax in (t_ax, bw_ax):
        _payload_axis(ax)
        ax.legend(fontsize=8)
    fig.suptitle("Two-rank fp16 all-reduce, " + data["machine"]["label"], fontsize=10)
    fig.tight_layout()
    return _save(fig, dest)


def prefill_title(data: dict) -> str:
    """The e2e figure's title: tensor parallelism (2 in files before the
    harness recorded it), the base the run was on and the machine label."""
    base = (data.get("series", {}).get("base") or "").replace("vllm==", "vLLM ")
    return ", ".join(
        x for x in (f"End to end, TP={data.get('tp', 2)}", base, data["machine"]["label"]) if x
    )


def plot_prefill(data: dict, dest: Path) -> Path:
    import matplotlib.pyplot as plt

    bars = prefill_bars(data)
    names = list(bars["arms"])
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, n in enumerate(names):
        arm = bars["arms"][n]
        ax.hlines(
            arm["mean"],
            i - 0.3,
            i + 0.3,
            color="C0",
            lw=3,
            label="P2P off, mean of the boots" if i == 0 else None,
        )
        ax.plot([i] * len(arm["boots"]), arm["boots"], "k.", label="one boot" if i == 0 else None)
        text = f"{arm['mean']:.2f} s" + (f" ({arm['change_pct']:+.1f} %)" if i else "")
        ax.annotate(
            text,
            (i, arm["mean"]),
            xytext=(0, 8),
            textcoords="offset points",
            ha="center",
            fontsize=8,
        )
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.6, len(names) - 0.4)
    means = [bars["arms"][n]["mean"] for n in names]
    if bars["ceiling"]:
        ax.axhline(
            bars["ceiling"],
            color="C3",
            ls="--",
            label=f"P2P on, reference (ceiling): {bars['ceiling']:.2f} s",
        )
    if bars["ideal"]:
        ax.axhline(
            bars["ideal"], color="C2", ls=":", label=f"ideal overlap bound: {bars['ideal']:.2f} s"
        )
    low = min([*means, *(x for x in (bars["ceiling"], bars["ideal"]) if x)])
    ax.set_ylim(low * 0.97, max(means) * 1.02)
    ax.set_ylabel("prefill of 4 x ~29k + 100k tokens (s; axis not from 0)")
    ax.set_title(prefill_title(data), fontsize=10)
    ax.legend(fontsize=8, loc="lower left")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, dest)


def _save(fig, dest: Path) -> Path:
    import matplotlib.pyplot as plt

    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest, dpi=110, metadata={"Software": None})  # no version: stable bytes
    plt.close(fig)
    return dest


def main(argv: list[str] | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    p = argparse.ArgumentParser()
    p.add_argument("--bench", type=Path, default=BENCH)
    p.add_argument("--e2e", type=Path, default=E2E)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    bench, e2e = (json.loads(f.read_text()) for f in (a.bench, a.e2e))
    written = [
        plot_allreduce(bench, a.out / f"host_reduce_{slug(bench)}.png"),
        plot_prefill(e2e, a.out / f"e2e_prefill_{slug(e2e)}.png"),
    ]
    for f in written:
        print(f"plots: {f}")
    return written


if __name__ == "__main__":
    main()
