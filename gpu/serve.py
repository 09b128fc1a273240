"""GPU machine: the series' wheel, built there, installed with pip into a
fresh target, serving an OpenAI-compatible request (gpu/serve.sh runs it
after stage 1 and 2).

    python3 gpu/serve.py OUT.json [--root /tmp/vllm-run] [--port 8000]

Steps, each timed; the first that fails is recorded with its output and the
rest are skipped:

1. build the wheel with the toolkit from the assembled tree (stage2: the
   overlay, the core module, FlashAttention) and the released wheel's
   dist-info (serve.sh unpacks part2/release.tar.xz), vllm._sm7x_C_stable_libtorch linked
   here for sm_75 with compute_75 PTX (the H200 runs it through the PTX);
2. ``pip install --no-index --no-deps --target`` into a fresh folder;
3. what ``vllm serve`` imports at startup, from that folder and the image
   (``gpu/check_pack_imports.py probe``: the API server's modules, ``vllm
   --version``, vLLM's requirements walked through what is installed, the
   versions outside a requirement listed; written to serve_imports.json);
   recorded, the run goes on when it fails;
4. from that folder alone (its requirements from the image and stage2's
   wheels): the package's place and version, ``vllm --version``, and
   the csrc/sm7x ops registered (vllm._sm7x_C_stable_libtorch, imported by
   the wheel's vLLM general plugin, overlays/vllm_sm7x_loader.py) with a
   kernel image for this GPU (their probes);
5. the small Qwen3-shaped checkpoint of the A/B harness (e2e/models.py:
   written here, nothing downloaded);
6. ``vllm serve`` with the command line of a Turing pair (docs/serve-on-turing.md)
   minus what needs two ranks (TP=2, the host all-reduce, the TP prefill
   overlap: DBO for TP, which needs TP >= 2) or an SM75 GPU
   (--attention-backend TRITON_TURING_ATTN: TRITON_ATTN here);
7. requests through the ``openai`` package (completions, greedy, token ids as
   the prompt: the checkpoint has no tokenizer) and ``curl`` (/version);
8. the server log's lines that show which of the series' routes were taken.

The results file (kind e2e) takes its ``series`` block from the installed
wheel's vllm/_series.json. On one H200 at TP=1 none of the series' routes is
expected to engage (the attention route wants an SM75 device, the host
all-reduce and the overlap two ranks, NVFP4 an NVFP4 checkpoint): the run
shows the wheel installing, loading its extension and serving.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "e2e"))
sys.path.insert(0, str(ROOT))
import models  # noqa: E402

from serieskit import results  # noqa: E402

MODEL_NAME = "small"
SMOKE = ROOT / "results" / "series_gpu_smoke_033_h200.json"
# The series' settings on a Turing pair (docs/serve-on-turing.md) less what
# needs two ranks (--tensor-parallel-size 2, --enable-host-all-reduce, which
# vLLM rejects at one rank, and --enable-dbo: the TP prefill overlap) or an
# SM75 GPU (--attention-backend TRITON_TURING_ATTN).
COMPILATION_CONFIG = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4, 8]}
# The engine arguments --engine-args may replace (a null value drops one):
# gpu/evidence.sh keeps the sitting's in one place.
ENGINE = {
    "attention_backend": "TRITON_ATTN",
    "compilation_config": COMPILATION_CONFIG,
    "gpu_memory_utilization": 0.5,
}
# The log lines of the series' routes (patches/manifest.toml `route`, and the
# lines its code prints when a route is set up or turned off).
ROUTES = {
    "host all-reduce": [
        r"Host all-reduce enabled",
        r"Host all-reduce is disabled",
        r"Using \[.*'HOST_REDUCE'.*\] all-reduce backends",
    ],
    "Turing prefill attention": [r"The Turing prefill attention is off"],
    "TP prefill overlap": [r"Dual batch overlap is enabled"],
    "NVFP4 Marlin prefill dequantization": [
        r"NVFP4 Marlin: batches of at least",
        r"nvfp4_marlin_prefill_dequant needs fp16",
    ],
    "csrc/sm7x ops": [
        r"this vLLM build has no host all-reduce ops",
        r"this vLLM build has no paged_prefill_attention_sm75",
    ],
}
MODULE_CHECK = """
import json, torch
from vllm.plugins import load_general_plugins
load_general_plugins()  # the wheel's loader of its module, as vLLM's processes call it
import vllm._custom_ops  # the platform's kernels and the ops' fakes
loaded = hasattr(torch.ops._C, "host_reduce_probe")
probes = {}
if loaded:
    for name in ("host_reduce_probe", "paged_prefill_attention_sm75_probe"):
        probes[name] = getattr(torch.ops._C, name)(0) or "ok: a kernel image for this device"
print(json.dumps({"loaded": loaded, "probes": probes,
                  "capability": list(torch.cuda.get_device_capability(0))}))
"""


class Failed(Exception):
    pass


def flags(args: dict) -> list[str]:
    """Engine arguments as `vllm serve` flags: JSON for objects, a bare flag for true."""
    out = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        else:
            out += [flag, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return out


def run(cmd: list[str], log: Path | None = None, **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-4000:]
        raise Failed(f"{' '.join(cmd[:4])} ... exited {proc.returncode}:\n{output}")
    return proc.stdout


def get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_ready(server: subprocess.Popen, port: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise Failed(f"vllm serve exited {server.returncode} before it answered")
        try:
            get(f"http://127.0.0.1:{port}/health")
            return
        except OSError:
            time.sleep(2)
    raise Failed(f"vllm serve did not answer /health within {limit_s:.0f} s")


def routes(log_text: str) -> dict:
    """Per route of the series: its log lines in the server's log."""
    out = {}
    for name, patterns in ROUTES.items():
        lines = [
            line.strip()
            for line in log_text.splitlines()
            if any(re.search(p, line) for p in patterns)
        ]
        out[name] = {
            "lines": lines[:20],
            "taken": any(not re.search("off|disabled|Failed|not built", x) for x in lines),
        }
    return out


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--root", type=Path, default=Path("/tmp/vllm-run"))
    ap.add_argument("--port", type=int, default=8000)
    # One run on the GPU machine takes at most ten minutes, stage2 included.
    ap.add_argument("--boot-limit", type=float, default=420.0)
    ap.add_argument("--engine-args", type=json.loads, default={}, help="JSON over ENGINE")
    a = ap.parse_args()
    # `timeout` (gpu/evidence.sh) ends a run with SIGTERM: the step fails, the server
    # stops and the file is written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("ended by SIGTERM"))
    out_dir = a.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    steps: list[dict] = []
    body: dict = {"steps": steps}
    dist, target = a.root / "dist", a.root / "target"
    # gpu/site: the stand-in for an import the image cannot serve (its sitecustomize.py).
    stand_ins = Path(__file__).resolve().parent / "site"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(map(str, (target, a.root / "site", stand_ins))),
    )
    server = None
    log_file = None
    info: dict = {}

    def step(name: str, fn):
        t = time.perf_counter()
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 - the failure is the finding
            steps.append(
                {
                    "step": name,
                    "ok": False,
                    "seconds": time.perf_counter() - t,
                    "error": str(e)[-6000:],
                    "traceback": traceback.format_exc()[-4000:],
                }
            )
            raise
        steps.append({"step": name, "ok": True, "seconds": time.perf_counter() - t})
        print(f"serve: {name} ok ({time.perf_counter() - t:.1f} s)", flush=True)
        return value

    try:
        # 1. the wheel, built here from what the recipe carried
        def build_wheel() -> Path:
            for old in dist.glob("*.whl") if dist.is_dir() else ():
                old.unlink()
            run(
                [
                    sys.executable,
                    "-m",
                    "serieskit",
                    "wheel",
                    "--tree",
                    str(a.root / "src"),
                    "--release",
                    str(a.root / "release"),
                    "--ptx",
                    "--dist",
                    str(dist),
                ],
                log=out_dir / "wheel.log",
                cwd=ROOT,
            )
            (whl,) = dist.glob("vllm-*.whl")
            return whl

        whl = step("build the wheel (serieskit wheel --tree --release --ptx)", build_wheel)
        body["wheel"] = {"file": whl.name, "bytes": whl.stat().st_size}

        # 2. a fresh target
        def install() -> None:
            shutil.rmtree(target, ignore_errors=True)
            run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--no-index",
                    "--no-deps",
                    "--target",
                    str(target),
                    str(whl),
                ]
            )

        step("pip install --no-index --no-deps --target", install)

        # 3. the serve path's imports and vLLM's requirements, as installed
        def imports() -> None:
            dest = out_dir / "serve_imports.json"
            probe = [sys.executable, str(ROOT / "gpu" / "check_pack_imports.py"), "probe"]
            proc = subprocess.run(
                [*probe, "--json", str(dest)], capture_output=True, text=True, env=env, cwd="/"
            )
            print(proc.stdout, end="", flush=True)
            body["imports"] = json.loads(dest.read_text()) if dest.is_file() else None
            if proc.returncode != 0:
                raise Failed(f"gpu/check_pack_imports.py probe failed:\n{proc.stdout[-3000:]}")

        # recorded; the install may serve all the same
        with contextlib.suppress(Failed):
            step("the serve path's imports (gpu/check_pack_imports.py probe)", imports)

        # 4. the installed package, from the target alone
        def check() -> dict:
            printed = run(
                [
                    sys.executable,
                    "-c",
                    "import json, vllm, importlib.metadata as m; "
                    "print(json.dumps([vllm.__file__, m.version('vllm')]))",
                ],
                env=env,
                cwd="/",
            )
            where = json.loads(printed.strip().splitlines()[-1])  # vLLM may log before it
            cli = (
                run([str(target / "bin" / "vllm"), "--version"], env=env, cwd="/")
                .strip()
                .splitlines()[-1]
            )
            module = json.loads(
                run([sys.executable, "-c", MODULE_CHECK], env=env, cwd="/").strip().splitlines()[-1]
            )
            installed = json.loads((target / "vllm" / "_series.json").read_text())
            if (
                not where[0].startswith(str(target))
                or where[1] != installed["version"]
                or cli != installed["version"]
            ):
                raise Failed(
                    f"vllm from {where[0]}, version {where[1]}, vllm --version {cli}; "
                    f"wheel {installed['version']}"
                )
            info.update(installed)
            return {"vllm": where[0], "version": where[1], "vllm --version": cli, "sm7x_C": module}

        body["installed"] = step(
            "import vllm, vllm --version, csrc/sm7x probes from the target", check
        )

        # 5. the checkpoint
        model = models.folder(MODEL_NAME, 2)
        body["weights"] = step(
            "write the small checkpoint (e2e/models.py)",
            lambda: models.write_weights(models.write(MODEL_NAME, 2), device="cuda"),
        )

        # 6. vllm serve: the Turing pair's command line minus TP=2 and the overlap
        cmd = [
            str(target / "bin" / "vllm"),
            "serve",
            str(model),
            "--served-model-name",
            MODEL_NAME,
            "--dtype",
            "float16",
            *flags({k: v for k, v in {**ENGINE, **a.engine_args}.items() if v is not None}),
            "--disable-custom-all-reduce",
            "--max-num-batched-tokens",
            "2048",
            "--max-model-len",
            "8192",
            # the written checkpoint has no tokenizer: prompts are token ids
            "--skip-tokenizer-init",
            "--load-format",
            "safetensors",
            "--seed",
            "0",
            "--host",
            "127.0.0.1",
            "--port",
            str(a.port),
        ]
        body["command"] = " ".join(f"'{c}'" if c.startswith("{") else c for c in cmd)
        log_path = out_dir / "serve.log"
        log_file = open(log_path, "w")  # noqa: SIM115 - the server writes it until stopped
        server = subprocess.Popen(
            cmd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd="/",
            env=dict(env, PYTHONUNBUFFERED="1"),
        )
        step("vllm serve: up (/health answers)", lambda: wait_ready(server, a.port, a.boot_limit))

        # 7. a real client
        def ask() -> dict:
            from openai import OpenAI

            client = OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key="unused")
            answers = {}
            for length in (300, 3000):
                t = time.perf_counter()
                r = client.completions.create(
                    model=MODEL_NAME,
                    prompt=models.prompt(length, 1),
                    max_tokens=16,
                    temperature=0.0,
                    extra_body={"return_token_ids": True, "ignore_eos": True},
                )
                dump = r.model_dump()
                dump["seconds"] = time.perf_counter() - t
                answers[f"after_{length}"] = dump
            return answers

        body["responses"] = step("openai client: completions after 300 and 3000 tokens", ask)
        body["curl_version"] = step(
            "curl /version",
            lambda: run(["curl", "-sS", f"http://127.0.0.1:{a.port}/version"]).strip(),
        )
        if SMOKE.is_file():
            smoke = json.loads(SMOKE.read_text())
            body["same_ids_as_smoke"] = {
                str(n): (body["responses"][f"after_{n}"]["choices"][0].get("token_ids"))
                == smoke.get(f"ids_{n}")
                for n in (300, 3000)
            }
    except BaseException:  # noqa: BLE001 - recorded in steps
        pass
    finally:
        if server is not None:
            stop(server)
        if log_file is not None:
            log_file.close()
            body["routes"] = routes((out_dir / "serve.log").read_text(errors="replace"))
        body["ok"] = bool(steps) and all(s["ok"] for s in steps) and len(steps) == 8
        seconds = {s["step"]: s["seconds"] for s in steps if s["ok"]}
        figures = {
            "steps_passed": results.figure(
                sum(s["ok"] for s in steps), "steps", "serve steps that passed (of 8)", "steps[ok]"
            ),
        }
        for key, name, label in (
            (
                "wheel_s",
                "build the wheel (serieskit wheel --tree --release --ptx)",
                "building the wheel here",
            ),
            (
                "install_s",
                "pip install --no-index --no-deps --target",
                "pip install into a fresh target",
            ),
            ("boot_s", "vllm serve: up (/health answers)", "vllm serve up to /health"),
            (
                "requests_s",
                "openai client: completions after 300 and 3000 tokens",
                "two completions of 16 tokens",
            ),
        ):
            if name in seconds:
                figures[key] = results.figure(
                    seconds[name], "s", label, f"steps[step={name}].seconds"
                )
        series = info.get("series") or results.unrecorded("the wheel was not installed")
        series.setdefault("files_from", "vllm/_series.json of the installed wheel")
        doc = results.document(
            kind="e2e",
            body=body,
            figures=figures,
            machine=results.machine(detail="TP=1"),
            series=series,
        )
        results.write(a.out, doc)
        print(f"serve: {'ok' if body['ok'] else 'FAILED'} -> {a.out}", flush=True)
    return 0 if body["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
