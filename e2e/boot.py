"""One boot of vLLM for the A/B harness; prints its measurements as JSON.

Run by ab.py in a process of its own per boot, on the checkpoint that
``models.py --write`` wrote (std 0.02, norms 1). Prefill: each fixed prompt
generates one token (prefix caching off, so nothing is reused). Decode: the
time of N tokens minus the time of one, per step, at a short and a long
context. Greedy: token ids of fixed prompts, with the log-probability gap
between the first and second choice at each step (a flip at a small gap is
rounding, at a large one a real difference). Peak memory: nvidia-smi polled
beside the boot, and per worker the startup profile's activation peak (with
an overlap arm the profile runs the halves) beside the activation peak of the
measured prompts. ``--profile-tokens N``: device time per kernel over one
more prompt of N tokens (after everything measured), for the ideal-overlap
bound. ``--warm-only`` boots and runs the warm-up prompts alone (the
harness's uncounted warm boot: it fills the kernel caches on disk).

With NCCL_P2P_DISABLE=1 the boot also makes vLLM's own P2P check report no
peer access (hide_peer_access), so that a GPU pair with P2P is, to vLLM as
to NCCL, the pair without it that the host all-reduce is for.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402


def hide_peer_access(num_gpus: int) -> None:
    """Make vLLM's P2P check (the custom all-reduce's, which the host
    all-reduce asks too) report no peer access between any of the GPUs.

    The check reads its answer from a cache file in VLLM_CACHE_ROOT when
    VLLM_SKIP_P2P_CHECK=0: written here, in a fresh folder (never the
    machine's own cache), for the keys vLLM looks it up by.
    """
    root = Path(tempfile.mkdtemp(prefix="vllm-no-p2p-"))
    pairs = {f"{i}->{j}": False for i in range(num_gpus) for j in range(num_gpus)}
    keys = {",".join(map(str, range(num_gpus))), os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    for key in keys - {""}:
        (root / f"gpu_p2p_access_cache_for_{key}.json").write_text(json.dumps(pairs))
    os.environ["VLLM_CACHE_ROOT"] = str(root)
    os.environ["VLLM_SKIP_P2P_CHECK"] = "0"


class PeakMemory(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                out = subprocess.run(
                    [
                        "nvidia-smi",
                        "--query-gpu=index,memory.used",
                        "--format=csv,noheader,nounits",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout
                for line in out.strip().splitlines():
                    i, used = (int(x) for x in line.split(","))
                    self.peak[i] = max(self.peak.get(i, 0), used)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
            self.stop.wait(0.5)


def margins(logprobs) -> list[float | None] | None:
    """Gap between the best and second-best log-probability at each step."""
    if not logprobs:
        return None
    out: list[float | None] = []
    for entry in logprobs:
        vals = sorted((lp.logprob for lp in entry.values()), reverse=True)
        out.append(vals[0] - vals[1] if len(vals) > 1 else None)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="seed")
    p.add_argument("--layers", type=int)
    p.add_argument(
        "--arm",
        required=True,
        help="JSON: parallel_config, kernel_config, attention_config, engine_args",
    )
    p.add_argument("--prefill", default="all", help="'all' or a comma list of names")
    p.add_argument("--decode-tokens", type=int, default=256)
    p.add_argument("--warm-only", action="store_true")
    p.add_argument("--profile-tokens", type=int, default=0)
    p.add_argument("--tp", type=int, default=2, help="tensor parallelism (1: one GPU)")
    a = p.parse_args()
    arm = json.loads(a.arm)
    model = models.folder(a.model, a.layers)
    if not (model / "weights.json").is_file():
        sys.exit(f"error: no weights in {model}: python3 e2e/models.py --write {a.model}")
    if os.environ.get("NCCL_P2P_DISABLE") == "1":
        hide_peer_access(max(a.tp, 2))
    mem = PeakMemory()
    mem.start()
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        model=str(model),
        load_format="safetensors",
        skip_tokenizer_init=True,
        tensor_parallel_size=a.tp,
        dtype="float16",
        gpu_memory_utilization=0.6,
        max_model_len=131072,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
        disable_custom_all_reduce=True,
        attention_backend="TRITON_ATTN",
        seed=0,
        compilation_config={
            "mode": 0,
            "cudagraph_mode": "FULL_DECODE_ONLY",
            "cudagraph_capture_sizes": [1, 2, 4, 8],
            **arm.get("compilation_config", {}),
        },
        **(arm.get("parallel_config") or {}),
        kernel_config=arm.get("kernel_config") or {},
        attention_config=arm.get("attention_config") or {},
        worker_extension_cls="e2e_worker.HarnessWorker",
        # Engine arguments of their own (the overlap: enable_dbo and DBO's
        # thresholds, which live in ParallelConfig).
        **arm.get("engine_args", {}),
    )
    result = {
        "boot_s": time.perf_counter() - t0,
        "prefill_s": {},
        "greedy": {},
        "greedy_margin": {},
        "decode": {},
        "weights": json.loads((model / "weights.json").read_text()),
        "weight_scale": record(llm, "weight_scale"),
    }

    def gen(ids, n, logprobs=None):
        sp = SamplingParams(
            max_tokens=n, temperature=0.0, detokenize=False, ignore_eos=True, logprobs=logprobs
        )
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
        return time.perf_counter() - t, out[0].outputs[0]

    # Uncounted: the first batches of a boot JIT-compile and autotune kernels;
    # 8k tokens reach the attention kernels' long-context configurations.
    gen(models.prompt(8192, 1), 1)
    gen(models.prompt(32, 2), 8)
    if a.warm_only:
        print("RESULT " + json.dumps({"boot_s": result["boot_s"], "warm_only": True}), flush=True)
        return
    record(llm, "reset_peak_memory")
    wanted = [x for x in models.PREFILL if a.prefill == "all" or x[0] in a.prefill.split(",")]
    for i, (name, length) in enumerate(wanted):
        dt, out = gen(models.prompt(length, 10 + i), 1)
        result["prefill_s"][name] = dt
        result["greedy"][f"prefill-{name}"] = list(out.token_ids)
        print(f"PREFILL {name} {length} {dt:.3f}s", file=sys.stderr, flush=True)
    for i, (name, length) in enumerate(models.GREEDY):
        try:
            _, out = gen(models.prompt(length, 100 + i), 32, logprobs=2)
            result["greedy_margin"][name] = margins(out.logprobs)
            # The first steps as returned (token: [logprob, rank]), to read
            # the gaps against.
            result.setdefault("logprobs_head", {})[name] = [
                {str(t): [lp.logprob, lp.rank] for t, lp in entry.items()}
                for entry in (out.logprobs or [])[:3]
            ]
        except Exception as e:  # noqa: BLE001 - the ids matter more than the gaps
            print(f"greedy with logprobs failed ({e!r}); ids only", file=sys.stderr)
            _, out = gen(models.prompt(length, 100 + i), 32)
        result["greedy"][name] = list(out.token_ids)
    n = a.decode_tokens
    for label, length in (("short", 32), ("long", 29167)):
        t1, _ = gen(models.prompt(length, 200), 1)
        tn, _ = gen(models.prompt(length, 300), n)  # another prompt: nothing cached
        step = (tn - t1) / (n - 1)
        result["decode"][label] = {
            "context": length,
            "ms_per_step": step * 1e3,
            "tokens_per_s": 1.0 / step,
        }
    mem.stop.set()
    mem.join()
    result["peak_memory_mib"] = mem.peak
    result["memory"] = record(llm, "memory_stats")
    if a.profile_tokens:
        result["profile"] = profile(llm, gen, a.profile_tokens)
    print("RESULT " + json.dumps(result), flush=True)


def record(llm, method: str) -> object:
    """A worker extension call (e2e_worker.py) whose failure is recorded, not fatal."""
    try:
        return llm.collective_rpc(method)
    except Exception as e:  # noqa: BLE001 - a record; the measurements go on
        return {"error": repr(e)}


def profile(llm, gen, tokens: int) -> dict:
    """Device time per kernel over one prompt of ``tokens`` (after the
    measured ones, so the profiler slows nothing measured)."""
    try:
        llm.collective_rpc("profile_start")
        gen(models.prompt(tokens, 400), 1)
        kernels = llm.collective_rpc("profile_stop")
    except Exception as e:  # noqa: BLE001 - the bound is optional; the boot is not
        return {"error": repr(e)}
    return {"tokens": tokens, "chunks": models.chunks(tokens), "ranks": kernels}


if __name__ == "__main__":
    main()
