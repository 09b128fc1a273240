"""A/B/A/B harness: one uncounted warm boot, then the arms in rounds.

    python3 e2e/ab.py --arms e2e/arms/reference.json e2e/arms/copy_engine.json \
        --out results/e2e.json [--model seed|small] [--layers N] [--rounds 2] [--ceiling]
    python3 e2e/ab.py --merge run1.json run2.json --out results/e2e.json

Each arm file: {"name", "kernel_config", "attention_config", "env"}; every boot
runs with TP=2, NCCL_P2P_DISABLE=1 (unless the arm's env says otherwise),
--disable-custom-all-reduce, 2048-token chunks, eager prefill and decode
captured in CUDA graphs of 1, 2, 4 and 8 tokens. Rounds alternate the order
(A B C, C B A, ...) so that a drift over the run does not favour one arm. The
first arm is the reference the others are compared with; one arm file alone
runs against itself (the noise floor). ``--ceiling`` adds one boot of the
first arm with peer access on: the speed the series aims at. The JSON is
written after every boot, so a failure later loses nothing measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
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
    # The workers import the weight re-initialisation from here.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(HERE / "boot.py"), "--model", args.model,
           "--arm", json.dumps(arm), "--prefill", args.prefill,
           "--decode-tokens", str(args.decode_tokens)]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    if label == "warm":
        cmd.append("--warm-only")
    print(f"boot {label}: {arm['name']}", flush=True)
    # Streamed to one file beside the JSON as it runs (a boot that hangs still
    # leaves its log), then kept in OUT.logs.tgz: few files in the output
    # folder, which the GPU machine returns only eight of.
    log = Path(args.out).with_suffix(".boot.log")
    t = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            returncode: int | str = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            # The whole group: vLLM's engine and workers hold the GPUs.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = "timeout"
    name = f"boot-{label}-{re.sub(r'[^A-Za-z0-9._-]', '_', arm['name'])}.log"
    out = {"arm": arm["name"], "label": label, "wall_s": time.perf_counter() - t,
           "returncode": returncode, "p2p": env.get("NCCL_P2P_DISABLE") != "1", "log": name}
    lines = log.read_text(errors="replace").splitlines()
    keep_log(log, name, Path(args.out))
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
    if returncode != 0 or "boot_s" not in out:
        out["error_tail"] = lines[-60:]
    print(f"  -> rc {returncode}, wall {out['wall_s']:.0f} s, boot "
          f"{out.get('boot_s', 0):.1f} s, prefill "
          + ", ".join(f"{k} {v:.3f}" for k, v in out.get("prefill_s", {}).items()), flush=True)
    if "error_tail" in out:
        print("\n".join("  | " + x for x in out["error_tail"][-25:]), flush=True)
    return out


def keep_log(live: Path, name: str, out: Path) -> None:
    """Move a finished boot's log into OUT.logs.tgz (rewritten whole)."""
    store = Path("/tmp/e2e-logs") / out.stem
    store.mkdir(parents=True, exist_ok=True)
    live.replace(store / name)
    tmp = out.with_suffix(".logs.tgz.part")
    with tarfile.open(tmp, "w:gz") as tar:
        for f in sorted(store.iterdir()):
            tar.add(f, arcname=f.name)
    tmp.replace(out.with_suffix(".logs.tgz"))


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):  # the shorter run ends it
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_greedy(boots: list[dict]) -> dict:
    """Greedy ids of every measured boot against the first reference boot's;
    a difference names the step and the reference's top-2 gap there."""
    ok = [b for b in boots if b.get("greedy")]
    if not ok:
        return {"identical_all_boots": False, "differences": ["no boot with greedy outputs"]}
    ref = ok[0]
    diffs = []
    for b in ok[1:]:
        for name, ids in ref["greedy"].items():
            i = first_difference(ids, b["greedy"].get(name, []))
            if i is not None:
                gaps = ref.get("greedy_margin", {}).get(name) or []
                diffs.append({"boot": b["label"], "arm": b["arm"], "prompt": name, "step": i,
                              "reference_gap": gaps[i] if i < len(gaps) else None})
    gaps = [g for m in ref.get("greedy_margin", {}).values() for g in (m or []) if g is not None]
    return {"reference_boot": ref["label"], "identical_all_boots": not diffs,
            "differences": diffs,
            "smallest_reference_gap": min(gaps) if gaps else None}


def summarize(boots: list[dict], arms: list[dict]) -> dict:
    counted = [b for b in boots if b["label"] != "warm" and not b["p2p"] and "prefill_s" in b]
    summary: dict = {"arms": {}}
    for arm in arms:
        mine = [b for b in counted if b["arm"] == arm["name"]]
        if not mine:
            continue
        totals = [sum(b["prefill_s"].values()) for b in mine]
        summary["arms"][arm["name"]] = {
            "boots": len(mine),
            "prefill_s": {k: [b["prefill_s"][k] for b in mine] for k in mine[0]["prefill_s"]},
            "prefill_total_s": totals,
            "prefill_total_mean_s": statistics.mean(totals),
            "decode_ms_per_step": {k: [b["decode"][k]["ms_per_step"] for b in mine]
                                   for k in mine[0]["decode"]},
            "peak_memory_mib": [b.get("peak_memory_mib") for b in mine],
        }
    names = list(summary["arms"])
    if names:
        ref = summary["arms"][names[0]]
        if ref["boots"] >= 2:
            t = ref["prefill_total_s"]
            summary["noise_floor_pct"] = 100 * (max(t) - min(t)) / statistics.mean(t)
            for k, v in ref["decode_ms_per_step"].items():
                spread = 100 * (max(v) - min(v)) / statistics.mean(v)
                summary[f"decode_{k}_noise_floor_pct"] = spread
        for other in names[1:]:
            o = summary["arms"][other]
            summary.setdefault("prefill_change_pct", {})[other] = (
                100 * (o["prefill_total_mean_s"] / ref["prefill_total_mean_s"] - 1))
            summary.setdefault("decode_change_pct", {})[other] = {
                k: 100 * (statistics.mean(o["decode_ms_per_step"][k])
                          / statistics.mean(v) - 1)
                for k, v in ref["decode_ms_per_step"].items()}
    ceiling = [b for b in boots if b["p2p"] and "prefill_s" in b]
    if ceiling:
        summary["p2p_on"] = [{"arm": c["arm"], "prefill_total_s": sum(c["prefill_s"].values()),
                              "prefill_s": c["prefill_s"],
                              "decode_ms_per_step": {k: v["ms_per_step"]
                                                     for k, v in c["decode"].items()}}
                             for c in ceiling]
        if names:
            # How much of the no-P2P penalty (reference minus P2P on) an arm hides.
            top = statistics.mean(c["prefill_total_s"] for c in summary["p2p_on"])
            ref_s = summary["arms"][names[0]]["prefill_total_mean_s"]
            summary["p2p_on_prefill_total_mean_s"] = top
            if ref_s > top:
                summary["penalty_hidden_pct"] = {
                    other: 100 * (ref_s - summary["arms"][other]["prefill_total_mean_s"])
                    / (ref_s - top) for other in names[1:]}
    summary["greedy"] = compare_greedy([b for b in boots if b["label"] != "warm"])
    return summary


def boot_order(arms: list[dict], rounds: int, ceiling: bool,
               warm: bool = True) -> list[tuple[dict, str]]:
    order = [(arms[0], "warm")] if warm else []
    for r in range(rounds):
        seq = arms if r % 2 == 0 else arms[::-1]
        order += [(arm, f"r{r + 1}") for arm in seq]
    if ceiling:
        order.append((arms[0], "ceiling"))
    return order


def merge(files: list[str], out: Path) -> None:
    """One summary over the boots of several runs (e.g. the rounds of two
    calls on the GPU machine); the first file's first arm is the reference."""
    runs = [json.loads(Path(f).read_text()) for f in files]
    arms: list[dict] = []
    boots: list[dict] = []
    for i, run in enumerate(runs):
        arms += [a for a in run["arms"] if a["name"] not in {x["name"] for x in arms}]
        boots += [dict(b, run=Path(files[i]).name) for b in run["boots"]]
    data = {"merged_from": [Path(f).name for f in files], "model": runs[0]["model"],
            "layers": runs[0]["layers"], "arms": arms, "boots": boots,
            "env": runs[0]["env"], "dates": [r["date"] for r in runs],
            "order": [o for r in runs for o in r["order"]],
            "summary": summarize(boots, arms)}
    out.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(json.dumps(data["summary"], indent=2))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--merge", nargs="+", metavar="RUN_JSON",
                   help="summarize the boots of these runs together (no boots)")
    p.add_argument("--arms", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="seed")
    p.add_argument("--layers", type=int)
    p.add_argument("--prefill", default="all")
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ceiling", action="store_true")
    p.add_argument("--no-warm", action="store_true",
                   help="skip the warm boot (the kernel caches on disk are already filled)")
    p.add_argument("--timeout", type=int, default=400)
    args = p.parse_args()
    if args.merge:
        return merge(args.merge, Path(args.out))
    if not args.arms:
        p.error("--arms is required (or --merge)")
    arms = [json.loads(Path(f).read_text()) for f in args.arms]
    if len(arms) == 1:
        arms = [arms[0], dict(arms[0], name=arms[0]["name"] + "-again")]
    order = boot_order(arms, args.rounds, args.ceiling, not args.no_warm)
    boots: list[dict] = []
    data = {"date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "model": args.model,
            "layers": args.layers, "arms": arms,
            "order": [f"{label}:{a['name']}" for a, label in order],
            "boots": boots, "env": machine()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(Path("/tmp/e2e-logs") / out.stem, ignore_errors=True)  # an earlier run's
    for arm, label in order:
        extra = {"NCCL_P2P_DISABLE": "0"} if label == "ceiling" else None
        try:
            boots.append(boot(arm, args, label, extra))
        except Exception as e:  # noqa: BLE001 - recorded; the boots so far are kept
            boots.append({"arm": arm["name"], "label": label, "p2p": bool(extra),
                          "error": repr(e)})
        data["summary"] = summarize(boots, arms)
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
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout
        info["driver"] = smi.strip().splitlines()[0] if smi.strip() else None
    except OSError as e:
        info["driver"] = repr(e)
    return info


if __name__ == "__main__":
    main()
