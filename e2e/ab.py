"""A/B/A/B harness: one uncounted warm boot, then the arms in rounds.

    python3 e2e/ab.py --arms e2e/arms/reference.json e2e/arms/copy_engine.json \
        --out results/e2e.json [--model seed|small] [--layers N] [--rounds 2] [--ceiling]
    python3 e2e/ab.py --merge run1.json run2.json --out results/e2e.json

Each arm file: {"name", "parallel_config", "kernel_config",
"attention_config", "env"} (parallel_config: the host all-reduce's engine
arguments, enable_host_all_reduce and host_all_reduce_config), optionally
"compilation_config" and "engine_args" (more keyword arguments of vllm.LLM: the
overlap arms set enable_dbo and dbo_prefill_token_threshold); every boot
runs with TP=2 (``--tp 1`` checks the harness on one GPU), NCCL_P2P_DISABLE=1
and vLLM's P2P check answering "no peer access" (boot.hide_peer_access;
unless the arm's env says otherwise),
--disable-custom-all-reduce, 2048-token chunks, eager prefill and decode
captured in CUDA graphs of 1, 2, 4 and 8 tokens. Rounds alternate the order
(A B C, C B A, ...) so that a drift over the run does not favour one arm. The
first arm is the reference the others are compared with; one arm file alone
runs against itself (the noise floor). ``--ceiling`` adds one boot of the
first arm with peer access on: the speed the series aims at. The JSON is
written after every boot, so a failure later loses nothing measured; it
starts with the schema header of results/README.md (serieskit.results).

The model's checkpoint is written first, once per machine (models.py: std
0.02, norms 1). The run fails (exit 1, after writing) when the median top-2
logit gap of the reference boot's greedy steps is below 0.01: flat logits
make the greedy comparison meaningless. Each reference boot also profiles
one prompt of --profile-tokens (one 2048-token chunk by default; 0: none;
the arm named by --profile-arm, "reference" by default, in any order):
per-kernel device times give the compute and communication time of a
layer-chunk, and from them an ideal-overlap bound, the prefill saving if
every layer-chunk hid min(compute, communication); each arm's measured
saving is reported as the fraction of that bound it reached.
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
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
import models  # noqa: E402

from serieskit import results  # noqa: E402

MIN_MEDIAN_GAP = 0.01  # below it the logits are flat and greedy ids compare nothing
COMM = re.compile(r"(?i)nccl|host_reduce|allreduce|all_reduce|reduce_scatter|all_gather")
COPY = re.compile(r"(?i)^memcpy|^memset")
P2P_OFF = "off (NCCL_P2P_DISABLE=1)"
ROUTES = re.compile(
    r"(?i)(backend|all[-_ ]reduce|host reduce|host_reduce|overlap|turing|"
    r"prefill attention|p2p|peer|custom allreduce|cuda graph|capturing)"
)
BASE_ENV = {
    "NCCL_P2P_DISABLE": "1",
    "VLLM_USE_V2_MODEL_RUNNER": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "PYTHONUNBUFFERED": "1",
    "VLLM_LOGGING_LEVEL": "INFO",
}


def boot(arm: dict, args, label: str, env_extra: dict | None = None) -> dict:
    env = {**os.environ, **BASE_ENV, **arm.get("env", {}), **(env_extra or {})}
    # The workers import their extension (e2e_worker.py) from here.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    cmd = [
        sys.executable,
        str(HERE / "boot.py"),
        "--model",
        args.model,
        "--arm",
        json.dumps(arm),
        "--prefill",
        args.prefill,
        "--decode-tokens",
        str(args.decode_tokens),
        "--tp",
        str(args.tp),
    ]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    if label == "warm":
        cmd.append("--warm-only")
    elif args.profile_tokens and arm is args.reference_arm and label != "ceiling":
        cmd += ["--profile-tokens", str(args.profile_tokens)]
    print(f"boot {label}: {arm['name']}", flush=True)
    # Streamed to one file beside the JSON as it runs (a boot that hangs still
    # leaves its log), then kept in OUT.logs.tgz: few files in the output
    # folder, which the GPU machine returns only eight of.
    log = Path(args.out).with_suffix(".boot.log")
    t = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode: int | str = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            # The whole group: vLLM's engine and workers hold the GPUs.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            returncode = "timeout"
    name = f"boot-{label}-{re.sub(r'[^A-Za-z0-9._-]', '_', arm['name'])}.log"
    out = {
        "arm": arm["name"],
        "label": label,
        "wall_s": time.perf_counter() - t,
        "returncode": returncode,
        "p2p": env.get("NCCL_P2P_DISABLE") != "1",
        "log": name,
    }
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
    print(
        f"  -> rc {returncode}, wall {out['wall_s']:.0f} s, boot "
        f"{out.get('boot_s', 0):.1f} s, prefill "
        + ", ".join(f"{k} {v:.3f}" for k, v in out.get("prefill_s", {}).items()),
        flush=True,
    )
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
                diffs.append(
                    {
                        "boot": b["label"],
                        "arm": b["arm"],
                        "prompt": name,
                        "step": i,
                        "reference_gap": gaps[i] if i < len(gaps) else None,
                    }
                )
    gaps = [g for m in ref.get("greedy_margin", {}).values() for g in (m or []) if g is not None]
    return {
        "reference_boot": ref["label"],
        "identical_all_boots": not diffs,
        "differences": diffs,
        "smallest_reference_gap": min(gaps) if gaps else None,
        "median_reference_gap": statistics.median(gaps) if gaps else None,
        "reference_gaps": len(gaps),
    }


def flat_logits(greedy: dict) -> str | None:
    """Why the greedy comparison proves nothing, or None: the top-2 logit gaps
    (log-probability gaps: the same numbers) of the reference boot's greedy
    steps have a median below MIN_MEDIAN_GAP, or were not recorded."""
    median = greedy.get("median_reference_gap")
    if median is None:
        return "no top-2 logit gaps recorded in the reference boot"
    if median < MIN_MEDIAN_GAP:
        return (
            f"median top-2 logit gap {median:.2g} < {MIN_MEDIAN_GAP}: flat logits, the "
            "greedy comparison says nothing (are the written weights loaded?)"
        )
    return None


def memory(mine: list[dict]) -> dict:
    """Per arm, over its boots and ranks (MiB): the startup profile's
    activation peak, the measured prompts' activation peak, the KV cache."""
    ranks = [r for b in mine for r in (b.get("memory") or []) if isinstance(r, dict)]
    if not ranks:
        return {}

    def values(key: str) -> list[float]:
        return [r[key] for r in ranks if r.get(key) is not None]

    covered = [r["covered_by_profile"] for r in ranks if r.get("covered_by_profile") is not None]
    return {
        "profile_activation_peak_mib": max(values("profile_activation_peak_mib"), default=None),
        "runtime_activation_peak_mib": max(values("runtime_activation_peak_mib"), default=None),
        "kv_cache_mib": min(values("kv_cache_mib"), default=None),
        "weights_mib": max(values("weights_mib"), default=None),
        "cudagraph_estimate_mib": max(values("profile_cudagraph_estimate_mib"), default=None),
        "covered_by_profile": all(covered) if covered else None,
    }


def kernel_split(rows: list[dict]) -> dict:
    """Device microseconds of one rank's kernels: communication, copies,
    compute (everything else)."""
    comm = sum(r["us"] for r in rows if COMM.search(r["name"]))
    copy = sum(r["us"] for r in rows if COPY.search(r["name"]) and not COMM.search(r["name"]))
    return {
        "comm_us": comm,
        "copy_us": copy,
        "compute_us": sum(r["us"] for r in rows) - comm - copy,
    }


def ideal_overlap(boots: list[dict], summary: dict, layers: int) -> dict:
    """The bound from the reference boots' profiled prompt: per layer-chunk
    compute C and communication A (rank means); perfect overlap hides
    min(C, A) in every layer-chunk of the measured prompts; each arm's
    measured saving as the fraction of that it reached."""
    prof = [
        b["profile"]
        for b in boots
        if isinstance(b.get("profile"), dict) and b["profile"].get("ranks")
    ]
    names = list(summary["arms"])
    if not prof or not names:
        return {}
    per = [kernel_split(r) for p in prof for r in p["ranks"]]
    n = prof[0]["chunks"] * layers
    c = statistics.mean(x["compute_us"] for x in per) / n / 1e3
    a = statistics.mean(x["comm_us"] for x in per) / n / 1e3
    ref = summary["arms"][names[0]]
    measured = [name for name, _ in models.PREFILL if name in ref["prefill_s"]]
    chunks = sum(models.chunks(length) for name, length in models.PREFILL if name in measured)
    saving_s = min(c, a) * layers * chunks / 1e3
    out = {
        "profiled_tokens": prof[0]["tokens"],
        "profiled_boots": len(prof),
        "compute_ms_per_layer_chunk": c,
        "comm_ms_per_layer_chunk": a,
        "hideable_ms_per_layer_chunk": min(c, a),
        "layers": layers,
        "chunks_in_measured_prompts": chunks,
        "ideal_saving_s": saving_s,
        "ideal_change_pct": -100 * saving_s / ref["prefill_total_mean_s"],
        "assumes": "every chunk of the measured prompts has the profiled chunk's per-layer "
        "compute and communication; attention grows with context, so deeper "
        "chunks have more compute to hide communication under",
    }
    if saving_s > 0:
        out["fraction_reached"] = {
            other: (ref["prefill_total_mean_s"] - summary["arms"][other]["prefill_total_mean_s"])
            / saving_s
            for other in names[1:]
        }
    return out


def summarize(boots: list[dict], arms: list[dict], layers: int) -> dict:
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
            "decode_ms_per_step": {
                k: [b["decode"][k]["ms_per_step"] for b in mine] for k in mine[0]["decode"]
            },
            "peak_memory_mib": [b.get("peak_memory_mib") for b in mine],
            "memory": memory(mine),
        }
    names = list(summary["arms"])
    if names:
        ref = summary["arms"][names[0]]
        if ref["boots"] >= 2:
            t = ref["prefill_total_s"]
            summary["noise_floor_pct"] = 100 * (max(t) - min(t)) / statistics.mean(t)
            for k, v in ref["decode_ms_per_step"].items():
                spread = max(v) - min(v)
                summary[f"decode_{k}_noise_floor_pct"] = 100 * spread / statistics.mean(v)
        for other in names[1:]:
            o = summary["arms"][other]
            summary.setdefault("prefill_change_pct", {})[other] = 100 * (
                o["prefill_total_mean_s"] / ref["prefill_total_mean_s"] - 1
            )
            summary.setdefault("decode_change_pct", {})[other] = {
                k: 100 * (statistics.mean(o["decode_ms_per_step"][k]) / statistics.mean(v) - 1)
                for k, v in ref["decode_ms_per_step"].items()
            }
    ceiling = [b for b in boots if b["p2p"] and "prefill_s" in b]
    if ceiling:
        summary["p2p_on"] = [
            {
                "arm": c["arm"],
                "prefill_total_s": sum(c["prefill_s"].values()),
                "prefill_s": c["prefill_s"],
                "decode_ms_per_step": {k: v["ms_per_step"] for k, v in c["decode"].items()},
            }
            for c in ceiling
        ]
        if names:
            # How much of the no-P2P penalty (reference minus P2P on) an arm hides.
            top = statistics.mean(c["prefill_total_s"] for c in summary["p2p_on"])
            ref_s = summary["arms"][names[0]]["prefill_total_mean_s"]
            summary["p2p_on_prefill_total_mean_s"] = top
            if ref_s > top:
                summary["penalty_hidden_pct"] = {
                    other: 100
                    * (ref_s - summary["arms"][other]["prefill_total_mean_s"])
                    / (ref_s - top)
                    for other in names[1:]
                }
    summary["greedy"] = compare_greedy([b for b in boots if b["label"] != "warm"])
    summary["greedy"]["flat_logits"] = flat_logits(summary["greedy"])
    if bound := ideal_overlap(
        [b for b in counted if names and b["arm"] == names[0]], summary, layers
    ):
        summary["ideal_overlap"] = bound
    return summary


def boot_order(
    arms: list[dict], rounds: int, ceiling: bool, warm: bool = True
) -> list[tuple[dict, str]]:
    order = [(arms[0], "warm")] if warm else []
    for r in range(rounds):
        seq = arms if r % 2 == 0 else arms[::-1]
        order += [(arm, f"r{r + 1}") for arm in seq]
    if ceiling:
        order.append((arms[0], "ceiling"))
    return order


def figures(summary: dict) -> dict:
    """The headline figures of a summary, each with where it is in the file."""
    out: dict = {}

    def add(key: str, path: list[str], unit: str, label: str) -> None:
        node: object = summary
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, int | float) and not isinstance(node, bool):
            out[key] = results.figure(node, unit, label, "summary." + ".".join(path))

    add(
        "noise_floor_pct",
        ["noise_floor_pct"],
        "%",
        "prefill total, difference between the two reference boots",
    )
    add(
        "p2p_on_prefill_total_mean_s",
        ["p2p_on_prefill_total_mean_s"],
        "s",
        "prefill of all five prompts, P2P on (ceiling)",
    )
    add(
        "greedy.median_reference_gap",
        ["greedy", "median_reference_gap"],
        "logit",
        "median top-2 logit gap of the reference boot's greedy steps",
    )
    for arm in summary.get("arms", {}):
        add(
            f"{arm}.prefill_total_mean_s",
            ["arms", arm, "prefill_total_mean_s"],
            "s",
            f"{arm}: prefill of all five prompts, mean of the boots",
        )
        add(
            f"{arm}.prefill_change_pct",
            ["prefill_change_pct", arm],
            "%",
            f"{arm}: prefill change against the reference",
        )
        add(
            f"{arm}.penalty_hidden_pct",
            ["penalty_hidden_pct", arm],
            "%",
            f"{arm}: share of the no-P2P penalty (reference minus P2P on) hidden",
        )
        for key, what in (
            ("profile_activation_peak_mib", "startup profile's activation peak"),
            ("runtime_activation_peak_mib", "measured prompts' activation peak"),
            ("kv_cache_mib", "KV cache"),
        ):
            add(
                f"{arm}.{key}",
                ["arms", arm, "memory", key],
                "MiB",
                f"{arm}: {what} per GPU (highest rank and boot; KV cache: lowest)",
            )
        add(
            f"{arm}.ideal_overlap_fraction_reached",
            ["ideal_overlap", "fraction_reached", arm],
            "fraction",
            f"{arm}: measured prefill saving over the ideal-overlap bound",
        )
    add(
        "ideal_overlap.ideal_change_pct",
        ["ideal_overlap", "ideal_change_pct"],
        "%",
        "ideal-overlap bound: prefill change if every layer-chunk hid min(compute, comm)",
    )
    return out


def document(body: dict, machine: dict, series: dict, date: str | None = None) -> dict:
    """The results file: the schema header (results/README.md), then the run."""
    return results.document(
        "e2e", body, machine=machine, series=series, figures=figures(body["summary"]), date=date
    )


def header_of(runs: list[dict]) -> tuple[dict, dict, str]:
    """(machine, series, date) of runs to merge: their own header, or for
    runs written before the harness wrote one, the machine from their env."""
    if all(r.get("schema") == results.SCHEMA for r in runs):
        commits = {r["series"].get("commit") for r in runs}
        if len(commits) > 1:
            raise SystemExit(
                "error: the runs are of different series: " + ", ".join(sorted(map(str, commits)))
            )
        return runs[0]["machine"], runs[0]["series"], runs[0]["date"]
    env = runs[0].get("env", {})
    machine = results.machine_block(
        env.get("gpus") or [], env.get("driver"), env.get("torch"), env.get("cuda"), P2P_OFF
    )
    date = runs[0]["date"].replace(" ", "T") + "Z"  # "2026-11-30 15:11", UTC
    return machine, results.unrecorded("written before the harness recorded its series"), date


def merge(files: list[str], out: Path) -> dict:
    """One summary over the boots of several runs (e.g. the rounds of two
    calls on the GPU machine); the first file's first arm is the reference."""
    runs = [json.loads(Path(f).read_text()) for f in files]
    arms: list[dict] = []
    boots: list[dict] = []
    for i, run in enumerate(runs):
        arms += [a for a in run["arms"] if a["name"] not in {x["name"] for x in arms}]
        boots += [dict(b, run=Path(files[i]).name) for b in run["boots"]]
    layers = runs[0]["layers"] or models.LAYERS[runs[0]["model"]]
    tps = {r.get("tp", 2) for r in runs}  # 2 in runs before the harness recorded it
    if len(tps) > 1:
        raise SystemExit(f"error: the runs are of different TP: {sorted(tps)}")
    body = {
        "merged_from": [Path(f).name for f in files],
        "model": runs[0]["model"],
        "layers": runs[0]["layers"],
        "tp": tps.pop(),
        "arms": arms,
        "boots": boots,
        "env": runs[0]["env"],
        "dates": [r["date"] for r in runs],
        "order": [o for r in runs for o in r["order"]],
        "summary": summarize(boots, arms, layers),
    }
    data = document(body, *header_of(runs))
    results.write(out, data)
    print(json.dumps(data["summary"], indent=2))
    return data


def write_weights(args) -> dict:
    """The model's checkpoint, written once in a process of its own (its
    CUDA context must not stay on GPU 0 during the boots)."""
    cmd = [sys.executable, str(HERE / "models.py"), "--write", args.model]
    if args.layers:
        cmd += ["--layers", str(args.layers)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("WEIGHTS ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"error: writing the weights failed:\n{proc.stdout}{proc.stderr}")
    return json.loads(line[len("WEIGHTS ") :])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="RUN_JSON",
        help="summarize the boots of these runs together (no boots)",
    )
    p.add_argument("--arms", nargs="+")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="seed")
    p.add_argument("--layers", type=int)
    p.add_argument("--prefill", default="all")
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ceiling", action="store_true")
    p.add_argument(
        "--no-warm",
        action="store_true",
        help="skip the warm boot (the kernel caches on disk are already filled)",
    )
    p.add_argument(
        "--profile-tokens",
        type=int,
        default=models.CHUNK,
        help="tokens of the prompt each reference boot profiles (0: none)",
    )
    p.add_argument(
        "--profile-arm",
        default="reference",
        help="the arm whose boots profile that prompt (default: reference)",
    )
    p.add_argument("--timeout", type=int, default=400)
    p.add_argument(
        "--tp",
        type=int,
        default=2,
        help="tensor parallelism (1 checks the harness on one GPU: the overlap arms then "
        "fail at startup, as vLLM rejects DBO without TP or DP)",
    )
    args = p.parse_args(argv)
    if args.merge:
        return verdict(merge(args.merge, Path(args.out))["summary"])
    if not args.arms:
        p.error("--arms is required (or --merge)")
    arms = [json.loads(Path(f).read_text()) for f in args.arms]
    if len(arms) == 1:
        arms = [arms[0], dict(arms[0], name=arms[0]["name"] + "-again")]
    # Profiled: the arm named by --profile-arm (the reference, whatever the
    # order of this call), else the first.
    args.reference_arm = next((a for a in arms if a["name"] == args.profile_arm), arms[0])
    layers = args.layers or models.LAYERS[args.model]
    order = boot_order(arms, args.rounds, args.ceiling, not args.no_warm)
    boots: list[dict] = []
    body = {
        "model": args.model,
        "layers": args.layers,
        "tp": args.tp,
        "arms": arms,
        "order": [f"{label}:{a['name']}" for a, label in order],
        "boots": boots,
        "env": machine(),
        "weights": write_weights(args),
    }
    head = (results.machine(p2p=P2P_OFF), results.current_series(HERE.parent), results.now())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(Path("/tmp/e2e-logs") / out.stem, ignore_errors=True)  # an earlier run's
    for arm, label in order:
        extra = {"NCCL_P2P_DISABLE": "0"} if label == "ceiling" else None
        try:
            boots.append(boot(arm, args, label, extra))
        except Exception as e:  # noqa: BLE001 - recorded; the boots so far are kept
            boots.append({"arm": arm["name"], "label": label, "p2p": bool(extra), "error": repr(e)})
        body["summary"] = summarize(boots, arms, layers)
        results.write(out, document(body, *head))
    print(json.dumps(body["summary"], indent=2))
    return verdict(body["summary"])


def verdict(summary: dict) -> int:
    """Exit status of a run: 1 when its greedy comparison proves nothing."""
    if why := summary.get("greedy", {}).get("flat_logits"):
        print(f"error: {why}", file=sys.stderr)
        return 1
    return 0


def machine() -> dict:
    info = {}
    try:
        import torch

        info = {
            "torch": torch.__version__,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        }
    except Exception as e:  # noqa: BLE001 - recorded, not fatal
        info["error"] = repr(e)
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout
        info["driver"] = smi.strip().splitlines()[0] if smi.strip() else None
    except OSError as e:
        info["driver"] = repr(e)
    return info


if __name__ == "__main__":
    sys.exit(main())
