"""Does the assembled vLLM run here? Import it, boot one engine (TP=1,
TRITON_ATTN, the default torch.compile and CUDA graphs) on the harness's
small model (written here, e2e/models.py: nothing downloaded) and generate
greedily. Records every step's outcome, and the traceback of the first that
fails, as JSON: the answer to "which part of this release needs what this
machine lacks".

    python3 gpu/smoke.py OUT.json [--eager] [--engine-args JSON]

--engine-args: engine arguments (a JSON object) over the defaults below, a
null value dropping one (gpu/evidence.sh names the attention backend there).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT))
import models  # noqa: E402

from serieskit import results  # noqa: E402


def step(log: list[dict], name: str, fn):
    """Run one step; record its time, or its traceback and stop."""
    t = time.perf_counter()
    try:
        value = fn()
    except BaseException as e:  # noqa: BLE001 - the failure is the finding
        log.append(
            {
                "step": name,
                "ok": False,
                "seconds": time.perf_counter() - t,
                "error": repr(e),
                "traceback": traceback.format_exc()[-6000:],
            }
        )
        raise SystemExit(1) from e
    log.append({"step": name, "ok": True, "seconds": time.perf_counter() - t})
    print(f"smoke: {name} ok ({time.perf_counter() - t:.1f} s)", flush=True)
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no compile, no graphs)")
    ap.add_argument("--engine-args", type=json.loads, default={}, help="JSON over the defaults")
    a = ap.parse_args()
    # `timeout` (gpu/evidence.sh) ends a run with SIGTERM: the step fails, the file is written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("ended by SIGTERM"))
    log: list[dict] = []
    body: dict = {"steps": log, "eager": a.eager}
    engine = {
        "load_format": "safetensors",
        "skip_tokenizer_init": True,
        "dtype": "float16",
        "gpu_memory_utilization": 0.5,
        "max_model_len": 8192,
        "max_num_batched_tokens": 2048,
        "attention_backend": "TRITON_ATTN",
        "enforce_eager": a.eager,
        "seed": 0,
    }
    engine = {k: v for k, v in {**engine, **a.engine_args}.items() if v is not None}
    body["engine_args"] = engine
    try:
        import torch

        body["torch"] = torch.__version__
        vllm = step(log, "import vllm", lambda: __import__("vllm"))
        body["vllm"] = getattr(vllm, "__version__", None)
        step(log, "import vllm._C_stable_libtorch", lambda: __import__("vllm._C_stable_libtorch"))
        model = models.write("small", 2)
        step(log, "write the model", lambda: models.write_weights(model, device="cuda"))
        from vllm import LLM, SamplingParams

        llm = step(
            log,
            "boot the engine",
            lambda: LLM(model=str(model), **engine),
        )
        params = SamplingParams(max_tokens=16, temperature=0.0, detokenize=False, ignore_eos=True)
        for length in (300, 3000):
            out = step(
                log,
                f"generate 16 tokens after {length}",
                lambda n=length: llm.generate(
                    [{"prompt_token_ids": models.prompt(n, 1)}], params, use_tqdm=False
                ),
            )
            body[f"ids_{length}"] = list(out[0].outputs[0].token_ids)
    except SystemExit:
        pass
    finally:
        body["ok"] = bool(log) and all(s["ok"] for s in log)
        passed = sum(s["ok"] for s in log)
        figures = {
            "steps_passed": results.figure(
                passed, "steps", "smoke steps that ran (of 6)", "steps[ok]"
            )
        }
        doc = results.document(
            kind="tests",
            body=body,
            figures=figures,
            test_files={
                "gpu/smoke.py": {
                    "passed": passed,
                    "failed": len(log) - passed,
                    "skipped": 0,
                    "errors": 0,
                }
            },
            machine=results.machine(),
            series=results.current_series(ROOT),
        )
        results.write(a.out, doc)
        print(f"smoke: {'ok' if body['ok'] else 'FAILED'} -> {a.out}", flush=True)
    return 0 if body["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
