"""A/B/A/B harness: one uncounted warm boot, then the arms alternately.

    python3 ci/e2e/ab.py --arms ci/e2e/arms/reference.json ci/e2e/arms/host_reduce.json \
        --out results/e2e.json [--model seed|small] [--layers N] [--ceiling]

Each arm file: {"name", "kernel_config", "attention_config", "env"}; every boot
runs with TP=2, NCCL_P2P_DISABLE=1 (unless the arm's env says otherwise),
--disable-custom-all-reduce, 2048-token chunks, eager prefill and decode
captured in CUDA graphs of 1, 2, 4 and 8 tokens. ``--ceiling`` adds one boot
of the first arm with peer access on: the speed the series aims at.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROUTES = re.compile(r"(?i)(backend|all[-_ ]reduce|host reduce|host_reduce|overlap|turing|"
                    r"prefill attention|p2p|peer|custom allreduce|cuda graph|capturing)")
BASE_ENV = {"NCCL_P2P_DISABLE": "1", "VLLM_USE_V2_MODEL_RUNNER": "1",
            "VLLM_USE_FLASHINFER_SAMPLER": "0", "PYTHONUNBUFFERED": "1",
            "VLLM_LOGGING_LEVEL": "INFO"}


def boot(arm: dict, args, label: str, env_extra: dict | None = None) -> dict:
    env = {**os.environ, **BASE_ENV, **arm.get("env", {}), **(env_extra or {})}
    cmd = [sys.executable, str(HERE / "boot.py"), "--model", args.model,
           "--arm", json.dumps(arm), "--prefill", args.prefill,
           "--decode-tokens", str(args.decode_tokens)]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    print(f"boot {label}: {arm['name']}", flush=True)
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    out = {"arm": arm["name"], "label": label, "wall_s": time.perf_counter() - t,
           "returncode": proc.returncode,
           "p2p": env.get("NCCL_P2P_DISABLE") != "1"}
    lines = (proc.stdout + proc.stderr).splitlines()
    for line in lines:
        if line.startswith("RESULT "):
            out.update(json.loads(line[7:]))
    routes = []
    for line in lines:
        text = re.sub(r"^\(\w+ pid=\d+\)\s*", "", line)
        text = re.sub(r"^(INFO|WARNING|DEBUG) \d\d-\d\d [\d:.]+ ", "", text)
        if ROUTES.search(text) and text not in routes and not text.startswith("PREFILL"):
            routes.append(text[:300])
    out["route_lines"] = routes[:60]
    if proc.returncode != 0 or "prefill_s" not in out:
        out["error_tail"] = lines[-40:]
    print(f"  -> rc {proc.returncode}, boot {out.get('boot_s', 0):.1f} s, prefill "
          + ", ".join(f"{k} {v:.3f}" for k, v in out.get("prefill_s", {}).items()), flush=True)
    return out


def summarize(boots: list[dict], arms: list[dict]) -> dict:
    counted = [b for b in boots if b["label"] != "warm" and not b["p2p"]]
    summary: dict = {"arms": {}}
    for arm in arms:
        mine = [b for b in counted if b["arm"] == arm["name"] and "prefill_s" in b]
        if not mine:
            continue
        per = {k: [b["prefill_s"][k] for b in mine] for k in mine[0]["prefill_s"]}
        summary["arms"][arm["name"]] = {
            "boots": len(mine),
            "prefill_s": {k: v for k, v in per.items()},
            "prefill_total_s": [sum(b["prefill_s"].values()) for b in mine],
            "decode_ms_per_step": {k: [b["decode"][k]["ms_per_step"] for b in mine]
                                   for k in mine[0]["decode"]},
            "peak_memory_mib": [b.get("peak_memory_mib") for b in mine],
        }
    ok = [b for b in boots if "greedy" in b]
    ref = ok[0]["greedy"] if ok else {}
    summary["greedy_identical_all_boots"] = bool(ok) and all(b["greedy"] == ref for b in ok)
    summary["greedy_differences"] = sorted({f"{b['label']}:{k}" for b in ok
                                            for k in ref if b["greedy"].get(k) != ref[k]})
    names = list(summary["arms"])
    if names:
        a = summary["arms"][names[0]]["prefill_total_s"]
        if len(a) >= 2:
            summary["noise_floor_pct"] = 100 * (max(a) - min(a)) / statistics.mean(a)
        for other in names[1:]:
            bb = summary["arms"][other]["prefill_total_s"]
            summary[f"prefill_change_pct_{other}"] = 100 * (statistics.mean(bb) / statistics.mean(a) - 1)
    ceiling = [b for b in boots if b["p2p"] and "prefill_s" in b]
    if ceiling and names:
        summary["p2p_on_prefill_total_s"] = sum(ceiling[0]["prefill_s"].values())
    return summary


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--arms", nargs="+", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="seed")
    p.add_argument("--layers", type=int)
    p.add_argument("--prefill", default="all")
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--ceiling", action="store_true")
    p.add_argument("--timeout", type=int, default=400)
    args = p.parse_args()
    arms = [json.loads(Path(f).read_text()) for f in args.arms]
    if len(arms) == 1:
        arms = [arms[0], dict(arms[0], name=arms[0]["name"] + "-again")]
    a, b = arms[0], arms[1]
    order = [(b, "warm"), (a, "a1"), (b, "b1"), (a, "a2"), (b, "b2")]
    if args.ceiling:
        order.append((a, "ceiling"))
    boots: list[dict] = []
    data = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "model": args.model,
            "layers": args.layers, "arms": arms, "order": [l for _, l in order],
            "boots": boots, "env": machine()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for arm, label in order:
        extra = {"NCCL_P2P_DISABLE": "0"} if label == "ceiling" else None
        try:
            boots.append(boot(arm, args, label, extra))
        except Exception as e:  # noqa: BLE001 - recorded; the boots so far are kept
            boots.append({"arm": arm["name"], "label": label, "p2p": bool(extra),
                          "error": repr(e)})
        data["summary"] = summarize(boots, arms)
        # Written after every boot: a later failure loses nothing measured.
        out.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(json.dumps(data["summary"], indent=2))


def machine() -> dict:
    info = {}
    try:
        import torch
        info = {"torch": torch.__version__, "gpus": [torch.cuda.get_device_name(i)
                for i in range(torch.cuda.device_count())],
                "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        info["error"] = repr(e)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    info["driver"] = smi.stdout.strip().splitlines()[0] if smi.stdout.strip() else None
    return info


if __name__ == "__main__":
    main()
