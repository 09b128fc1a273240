#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Time to first token of long prompts through vLLM's engine: TRITON_TURING_ATTN
against TRITON_ATTN, on one GPU with its capability reported as SM75.

What a user of the backend would time: `LLM.generate` of one long prompt
with `max_tokens=1` (chunked prefill in 2,048-token steps, as on a Turing
pair), on a model written here with random weights (e2e/models.py `hd128`:
head dim 128, 32 query / 8 KV heads, 8 layers; nothing downloaded). Each arm
runs in a fresh process: an engine in that process (so that the capability
reported to the backend reaches its worker), torch.compile and CUDA graphs
as vLLM sets them up, prefix caching off, every timed prompt a different
one. Per length: one untimed prompt, then `--reps` prompts timed one at a
time; medians. Then the greedy ids of 16 tokens after one prompt per
length, compared between the arms.

On a GPU other than Turing the Turing kernel runs through compute_75 PTX
(the series' module built with `--ptx`): the figures are that GPU's, e.g. an
H100's or H200's, never Turing figures.

    python3 bench/prefill_ttft.py --out results/prefill_ttft_h200.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT))
import models  # noqa: E402

from serieskit import results  # noqa: E402

ARMS = ("TRITON_ATTN", "TRITON_TURING_ATTN")
LENGTHS = (8192, 32768)
CHUNK = 2048
GREEDY_TOKENS = 16


def engine_args(max_len: int) -> dict:
    return {
        "skip_tokenizer_init": True,
        "dtype": "float16",
        "load_format": "safetensors",
        "max_model_len": max_len + GREEDY_TOKENS + CHUNK,
        "max_num_batched_tokens": CHUNK,
        "max_num_seqs": 4,
        "enable_prefix_caching": False,
        "gpu_memory_utilization": 0.6,
        # One long request at a time: a cache the kernel's 32-bit offsets
        # reach (the backend declines larger ones), four such requests long.
        "num_gpu_blocks_override": 4 * (max_len + GREEDY_TOKENS + CHUNK) // 16,
        "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8]},
        "seed": 0,
    }


def run_arm(model: str, backend: str, lengths: list[int], reps: int) -> dict:
    """One engine in this (fresh) process; the Turing arm with the device
    reported as SM75 and the kernel's calls counted."""
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    calls = [0]
    if backend == "TRITON_TURING_ATTN":
        import vllm.v1.attention.backends.triton_turing_attn as tta

        kernel = tta.paged_prefill_attention_sm75

        def counted(*args, **kwargs):
            calls[0] += 1
            return kernel(*args, **kwargs)

        tta.device_capability = lambda device: (7, 5)
        tta.paged_prefill_attention_sm75 = counted
        tta.TritonTuringAttentionBackend.supports_compute_capability = classmethod(
            lambda cls, capability: True
        )
    t0 = time.perf_counter()
    llm = LLM(model=model, attention_config={"backend": backend}, **engine_args(max(lengths)))
    boot_s = time.perf_counter() - t0
    first = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, ignore_eos=True)
    greedy = SamplingParams(
        max_tokens=GREEDY_TOKENS, temperature=0.0, detokenize=False, ignore_eos=True
    )

    def once(length: int, seed: int, params) -> tuple[float, list[int]]:
        prompt = {"prompt_token_ids": models.prompt(length, seed)}
        start = time.perf_counter()
        out = llm.generate([prompt], params, use_tqdm=False)
        return time.perf_counter() - start, list(out[0].outputs[0].token_ids)

    per_length = {}
    for i, length in enumerate(lengths):
        once(length, 1000 + i, first)  # untimed: this length's shapes
        before = calls[0]
        times = [once(length, 100 * (i + 1) + r, first)[0] for r in range(reps)]
        routed = calls[0] - before
        _, ids = once(length, 7, greedy)
        per_length[str(length)] = {
            "ttft_s": times,
            "ttft_median_s": statistics.median(times),
            "kernel_calls_per_prompt": routed / reps,
            "greedy_ids": ids,
        }
    return {"backend": backend, "boot_s": boot_s, "lengths": per_length}


def in_fresh_process(fn, *args):
    import concurrent.futures
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=models.LAYERS["hd128"])
    a = ap.parse_args()
    model = models.write("hd128", a.layers)
    models.write_weights(model, device="cuda")
    cfg = models.config("hd128", a.layers)
    arms = {b: in_fresh_process(run_arm, str(model), b, a.lengths, a.reps) for b in ARMS}
    base, turing = arms["TRITON_ATTN"], arms["TRITON_TURING_ATTN"]
    figures, compared = {}, {}
    for length in map(str, a.lengths):
        b, t = base["lengths"][length], turing["lengths"][length]
        speedup = b["ttft_median_s"] / t["ttft_median_s"]
        same = b["greedy_ids"] == t["greedy_ids"]
        compared[length] = {"speedup": speedup, "greedy_identical": same}
        k = f"{int(length) // 1024}k"
        figures[f"ttft_turing_{k}"] = results.figure(
            round(t["ttft_median_s"] * 1e3, 1),
            "ms",
            f"time to first token, {length}-token prompt, TRITON_TURING_ATTN",
            f"arms.TRITON_TURING_ATTN.lengths.{length}.ttft_median_s",
        )
        figures[f"ttft_triton_{k}"] = results.figure(
            round(b["ttft_median_s"] * 1e3, 1),
            "ms",
            f"time to first token, {length}-token prompt, TRITON_ATTN",
            f"arms.TRITON_ATTN.lengths.{length}.ttft_median_s",
        )
        figures[f"speedup_{k}"] = results.figure(
            round(speedup, 2),
            "x",
            f"TRITON_ATTN / TRITON_TURING_ATTN, {length} tokens",
            f"compared.{length}.speedup",
        )
        figures[f"greedy_identical_{k}"] = results.figure(
            same,
            "bool",
            f"greedy ids of {GREEDY_TOKENS} tokens identical, {length} tokens",
            f"compared.{length}.greedy_identical",
        )
        print(
            f"ttft {length}: TRITON_ATTN {b['ttft_median_s'] * 1e3:.1f} ms, "
            f"TRITON_TURING_ATTN {t['ttft_median_s'] * 1e3:.1f} ms ({speedup:.2f}x; "
            f"{t['kernel_calls_per_prompt']:.0f} kernel calls a prompt), "
            f"greedy {'identical' if same else 'different'}",
            flush=True,
        )
    body = {
        "model": {
            k: cfg[k]
            for k in (
                "hidden_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "num_hidden_layers",
                "intermediate_size",
            )
        },
        "engine_args": engine_args(max(a.lengths)),
        "reps": a.reps,
        "arms": arms,
        "compared": compared,
        "method": (
            "LLM.generate of one prompt with max_tokens=1, each arm's engine in a fresh "
            "process, the Turing arm with the device reported as SM75 (its kernel through "
            "compute_75 PTX); per length one untimed prompt, then reps different prompts "
            "timed one at a time, median"
        ),
    }
    doc = results.document(
        "bench",
        body,
        machine=results.machine(detail="the Turing kernel through compute_75 PTX, JIT"),
        series=results.current_series(ROOT),
        figures=figures,
    )
    results.write(a.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
