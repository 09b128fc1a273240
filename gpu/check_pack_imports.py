"""Does the GPU machine's load carry what ``vllm serve`` needs?

    python3 gpu/check_pack_imports.py resolve [--json OUT]
    python3 gpu/check_pack_imports.py venv [--pack .dev/gpu] [--resolution R.json]
                                           [--drop NAME ...] [--fresh] [--json OUT]
    python3 gpu/check_pack_imports.py probe [--json OUT]

``resolve`` (here; reaches the package index): pip resolves the released
vLLM wheel's requirements for the GPU machine's Python and platform
(serieskit/build/pack_deps.py), less its image's packages and the GPU
packages vLLM imports only on demand (overlays/gpu.toml); exit 1 when
``[machine].wheels`` lacks one of the rest.

``venv`` (here, after ``nox -s overlay -- --gpu``): a Python 3.12
environment standing in for the GPU machine's image: the image's torch
(``[serve.check].torch``, 2.11.0+cu130 from the index, cached once; no GPU
is used) and those of the image's packages vLLM needs, at the versions the
resolution picks (the image's own versions are not known here); nothing
else. Then the load as the GPU machine gets it: ``gpu/stage1.sh`` keeps
part1, part1-2 and the wheels parts (``--drop NAME`` then removes a wheel,
as if the list lacked it), ``gpu/assemble.sh`` lays out the tree as stage 2
does, and ``probe`` runs in it with ``VLLM_TARGET_DEVICE=cpu``. The
environment is cached (~/.cache/vllm-series/serve-check) and made again when
the resolution's packages change or with ``--fresh``; the assembled tree is
new each time.

``probe`` (in the environment to check: the one ``venv`` makes, or the GPU
machine's after ``gpu/stage2.sh``, with stage 2's PYTHONPATH): imports what
``vllm serve`` imports at startup (``vllm.entrypoints.cli.main``,
``vllm.entrypoints.openai.api_server``, the serve command line, the app with
its routes, the serving state's modules, uvicorn's protocols), runs ``vllm
--version``, checks that none of the lazily imported GPU packages was
loaded, and walks vLLM's requirements through what is installed: a missing
distribution fails (a lazy GPU package is expected missing), a version
outside a requirement is reported (the image's torch 2.11 against vLLM's
torch==2.14.0 pin, say). Exit 1 when a step fails.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The probe runs inside the checked environment: the toolkit goes last on
# its path, so nothing of the toolkit's own stands in for a vLLM need.
sys.path.append(str(ROOT))
from serieskit.build import pack_deps, recipe  # noqa: E402

PACK = ROOT / ".dev" / "gpu"
# The command line of gpu/serve.py, as far as it parses without a model.
SERVE_ARGS = ["small", "--served-model-name", "small", "--dtype", "float16"]
# What the API server's state imports for a generating model (the routes'
# app state, launchers/api_server/app_state.py's lazy imports).
STATE_MODULES = [
    "vllm.entrypoints.launchers.api_server.app_state",
    "vllm.entrypoints.launchers.api_server.entry",
    "vllm.entrypoints.generate.api_router",
    "vllm.entrypoints.scale_out.factories",
    "vllm.entrypoints.generate.structured_decisions.api_router",
    "vllm.parser.metrics",
]


def cache() -> Path:
    from serieskit.series import base

    return base.cache_dir().parent / "serve-check"  # beside the sdists


def gpu_python() -> str:
    """An interpreter of the GPU machine's Python version (pyenv's, or one on
    PATH): pip evaluates markers with the interpreter that runs it, and the
    load's compiled wheels are built for that version."""
    v = recipe.gpu().python
    candidates = [shutil.which(f"python{v}") or ""]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(str(p) for p in pyenv.glob(f"{v}.*/bin/python{v}"))
    for exe in candidates:
        if not exe:
            continue
        proc = subprocess.run(
            [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if proc.returncode == 0 and proc.stdout.strip() == v:
            return exe
    raise SystemExit(
        f"error: no Python {v} here (the GPU machine's): install one "
        f"(e.g. `pyenv install {v}`) or put python{v} on PATH"
    )


def released_wheel() -> Path:
    from serieskit.series import base, target

    version = target.of(ROOT).version
    wheel, _ = base.fetch(recipe.gpu().wheel.format(v=version), version)
    return wheel


def pip_platforms() -> list[str]:
    gpu = recipe.gpu()
    return [
        "--only-binary=:all:",
        "--python-version",
        gpu.python,
        "--implementation",
        "cp",
        *[arg for p in gpu.platforms for arg in ("--platform", p)],
    ]


# --- resolve ---------------------------------------------------------------


def resolve(work: Path) -> dict:
    """pip's dry-run report for the released wheel, the torch family and the
    lazy GPU packages as stand-ins, the listed wheels' pins as constraints."""
    gpu = recipe.gpu()
    wheel = released_wheel()
    reqs = pack_deps.requires(pack_deps.metadata_of(wheel))
    stand_ins = {pack_deps.norm(n) for n in gpu.image_builds} | {
        pack_deps.norm(d) for d, _ in gpu.lazy_gpu
    }
    pins = pack_deps.write_stubs(reqs, stand_ins, work / "stubs")
    constraints = work / "constraints.txt"
    constraints.write_text("\n".join([*pins, *gpu.wheels]) + "\n")
    report = work / "report.json"
    cmd = [
        gpu_python(),
        "-m",
        "pip",
        "install",
        "-q",
        "--dry-run",
        "--ignore-installed",
        "--report",
        str(report),
        *pip_platforms(),
        "--target",
        str(work / "target"),
        "--find-links",
        str(work / "stubs"),
        "-c",
        str(constraints),
        str(wheel),
    ]
    print(f"resolve: pip resolves {wheel.name} for Python {gpu.python} (about a minute)")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"error: pip could not resolve vLLM's requirements:\n{proc.stderr[-3000:]}"
        )
    return json.loads(report.read_text())


def summarize(report: dict) -> dict:
    gpu = recipe.gpu()
    found = pack_deps.closure(report)
    p = pack_deps.plan(found, set(gpu.image), {d for d, _ in gpu.lazy_gpu}, list(gpu.wheels))

    def listing(nodes: dict[str, pack_deps.Node]) -> dict:
        return {
            n: {"version": v.version, "required_by": sorted(v.required_by)}
            for n, v in sorted(nodes.items())
        }

    return {
        "python": report["environment"]["python_version"],
        "needed": listing(p.needed),
        "from_image": listing(p.from_image),
        "lazy_gpu": listing(p.lazy),
        "missing": p.missing,
        "listed_not_needed": p.unneeded,
    }


def cmd_resolve(a) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        summary = summarize(resolve(Path(tmp)))
    if a.json:
        a.json.write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"resolve: vLLM needs {len(summary['needed'])} distributions beyond the image "
        f"({len(summary['from_image'])} from it, {len(summary['lazy_gpu'])} lazy GPU packages)"
    )
    for name in summary["listed_not_needed"]:
        print(f"resolve: listed, not a vLLM requirement (say why in {recipe.GPU}): {name}")
    for name in summary["missing"]:
        node = summary["needed"][name]
        print(
            f"resolve: MISSING from {recipe.GPU} [machine].wheels: "
            f'"{name}=={node["version"]}" (required by {", ".join(node["required_by"])})'
        )
    return 1 if summary["missing"] else 0


# --- venv ------------------------------------------------------------------


def torch_layer(py: str) -> Path:
    """The GPU machine's torch for Python ``py``, installed once into a
    folder of its own; every distribution in it must be one the image has."""
    gpu = recipe.gpu()
    key = hashlib.sha256(" ".join(gpu.check_torch).encode()).hexdigest()[:12]
    layer = cache() / f"torch-py{gpu.python}-{key}"
    if not (layer / ".complete").exists():
        shutil.rmtree(layer, ignore_errors=True)
        print(f"venv: installing {' '.join(gpu.check_torch)} into {layer} (once; about 5 GB)")
        run([py, "-m", "pip", "install", "-q", "--target", str(layer), *gpu.check_torch])
        (layer / ".complete").write_text(" ".join(gpu.check_torch) + "\n")
    names = {pack_deps.norm(p.name.split("-")[0]) for p in layer.glob("*.dist-info") if p.is_dir()}
    foreign = sorted(names - {pack_deps.norm(n) for n in gpu.image})
    if foreign:
        raise SystemExit(f"error: the torch layer holds what the image lacks: {foreign}")
    return layer


def run(cmd: list[str], **kw) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(
            f"error: {' '.join(cmd[:5])} ... exited {proc.returncode}:\n"
            + (proc.stdout + proc.stderr)[-3000:]
        )


def image_env(summary: dict, fresh: bool) -> Path:
    """The cached environment standing in for the image: the torch layer
    and the image's packages that vLLM needs, as resolved."""
    py = gpu_python()
    layer = torch_layer(py)
    # The image's torch fixes the versions it pins (triton, the CUDA
    # wheels): those come from the layer; the rest of the image's packages
    # at the resolution's versions, ahead of the layer's on the path.
    (torch_meta,) = layer.glob("torch-*.dist-info/METADATA")
    fixed = {pack_deps.norm(n) for n in recipe.gpu().image_builds} | {
        pack_deps.norm(r.name)
        for r in pack_deps.requires(torch_meta.read_text())
        if any(s.operator == "==" for s in r.specifier)
    }
    pins = sorted(
        f"{n}=={v['version']}"
        for n, v in summary["from_image"].items()
        if n not in fixed and pack_deps.STUB not in v["version"]
    )
    venv = cache() / f"venv-py{recipe.gpu().python}"
    stamp = "\n".join([str(layer), *pins]) + "\n"
    if fresh or not (venv / "stamp").exists() or (venv / "stamp").read_text() != stamp:
        shutil.rmtree(venv, ignore_errors=True)
        print(f"venv: {venv}: {len(pins)} of the image's packages (a few minutes)")
        run([py, "-m", "venv", str(venv)])
        site = next((venv / "lib").glob("python*/site-packages"))
        (site / "gpu_image_torch.pth").write_text(f"{layer}\n")
        run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", *pins])
        (venv / "stamp").write_text(stamp)
    return venv


def cmd_venv(a) -> int:
    pack = a.pack
    if not (pack / "part2" / "VERSION").exists() or not (pack / "wheels").is_dir():
        raise SystemExit(
            f"error: no GPU load in {pack} (with its wheels part): "
            "run `python3 -m serieskit overlay --gpu` first"
        )
    if a.resolution:
        summary = json.loads(a.resolution.read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            summary = summarize(resolve(Path(tmp)))
    venv = image_env(summary, a.fresh)
    with tempfile.TemporaryDirectory() as tmp:
        keep, root = Path(tmp) / "keep", Path(tmp) / "vllm-run"
        env = dict(
            os.environ, KEEP=str(keep), PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
        )
        for part in [*sorted(pack.glob("part1*")), *sorted(pack.glob("wheels*"))]:
            run(["bash", "gpu/stage1.sh", str(part)], cwd=ROOT, env=env)
        for name in a.drop:
            gone = [
                w
                for w in (keep / "whl").glob("*.whl")
                if pack_deps.wheel_name(w) == pack_deps.norm(name)
            ]
            if not gone:
                raise SystemExit(f"error: --drop {name}: no such wheel in the load")
            for w in gone:
                w.unlink()
                print(f"venv: dropped {w.name}, as if {recipe.GPU} did not list it")
        run(
            ["bash", "gpu/assemble.sh", str(root), str(pack / "part2"), str(keep)],
            cwd=ROOT,
            env=env,
        )
        probe_env = dict(
            env,
            PYTHONPATH=f"{root / 'src'}{os.pathsep}{root / 'site'}",
            VLLM_TARGET_DEVICE="cpu",
            PYTHONUNBUFFERED="1",
        )
        cmd = [str(venv / "bin" / "python"), str(Path(__file__).resolve()), "probe"]
        if a.json:
            cmd += ["--json", str(a.json.resolve())]
        print(f"venv: probing the assembled load with {venv / 'bin' / 'python'}")
        return subprocess.run(cmd, cwd=tmp, env=probe_env).returncode


# --- probe -----------------------------------------------------------------


def serve_app() -> str:
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.entrypoints.launchers.app import build_app
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(SERVE_ARGS)
    app = build_app(args, ("generate",))
    return f"{len(app.routes)} routes"


def uvicorn_protocols() -> str:
    """What uvicorn imports when vLLM's server starts (its "auto" choices)."""
    import uvicorn

    async def app(scope, receive, send) -> None:  # an ASGI app, never called
        pass

    config = uvicorn.Config(app=app, loop="auto", http="auto", ws="auto")
    config.load()
    ws = getattr(config.ws_protocol_class, "__module__", None)
    return f"http {config.http_protocol_class.__module__}, ws {ws}"


def version_cli() -> str:
    """``vllm --version``: the console script's entry point, in a process of its own."""
    from importlib.metadata import version

    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; main()",
            "--version",
        ],
        capture_output=True,
        text=True,
    )
    printed = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode != 0 or printed != version("vllm"):
        raise RuntimeError(
            f"vllm --version exited {proc.returncode}, printed {printed!r} "
            f"(expected {version('vllm')}):\n{proc.stderr[-3000:]}"
        )
    return printed


def lazy_not_loaded() -> str:
    loaded = sorted(m for _, m in recipe.gpu().lazy_gpu if m in sys.modules)
    if loaded:
        raise RuntimeError(f"lazily imported GPU packages were loaded: {loaded}")
    return f"none of {len(recipe.gpu().lazy_gpu)} loaded"


def requirements(found: dict) -> str:
    """Walk vLLM's requirements through the installed distributions."""
    from importlib import metadata

    from packaging.requirements import Requirement

    lazy = {pack_deps.norm(d) for d, _ in recipe.gpu().lazy_gpu}
    missing: list[str] = []
    lazy_missing: list[str] = []
    off: list[str] = []
    todo: list[tuple[str, frozenset[str]]] = [("vllm", frozenset())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = metadata.distribution(name)
        for line in dist.requires or ():
            req = Requirement(line)
            if not pack_deps.applies(req, default_env(), set(extras)):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                entry = f"{req} (for {name})"
                (lazy_missing if pack_deps.norm(req.name) in lazy else missing).append(entry)
                continue
            if not req.specifier.contains(have, prereleases=True):
                off.append(f"{req.name} {have}: {name} asks {req.specifier}")
            todo.append((req.name, frozenset(req.extras)))
    found.update(missing=sorted(set(missing)), lazy_missing=sorted(set(lazy_missing)),
                 version_off=sorted(set(off)))  # fmt: skip
    if missing:
        raise RuntimeError("not installed: " + "; ".join(sorted(set(missing))))
    return f"{len(seen)} distributions walked, {len(set(off))} versions outside a requirement"


def default_env() -> dict[str, str]:
    from packaging.markers import default_environment

    return {k: str(v) for k, v in default_environment().items()}


def cmd_probe(a) -> int:
    import platform

    out: dict = {
        "python": platform.python_version(),
        "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE"),
        "steps": [],
    }
    details: dict = {}

    def step(name: str, fn) -> None:
        try:
            note = fn()
            out["steps"].append({"step": name, "ok": True, "note": note})
            print(f"probe: ok    {name}: {note}", flush=True)
        except BaseException as e:  # noqa: BLE001 - a failure is the finding
            out["steps"].append(
                {
                    "step": name,
                    "ok": False,
                    "error": str(e)[-4000:],
                    "traceback": traceback.format_exc()[-4000:],
                }
            )
            print(f"probe: FAIL  {name}: {str(e)[-2000:]}", flush=True)

    step("import torch", lambda: importlib.import_module("torch").__version__)
    step(
        "import vllm.entrypoints.cli.main",
        lambda: importlib.import_module("vllm.entrypoints.cli.main").__name__,
    )
    step(
        "import vllm.entrypoints.openai.api_server",
        lambda: importlib.import_module("vllm.entrypoints.openai.api_server").__name__,
    )
    step("vllm serve's command line and app (build_app, its routes)", serve_app)
    step(
        "the serving state's modules",
        lambda: f"{len([importlib.import_module(m) for m in STATE_MODULES])} modules",
    )
    step("uvicorn's protocols (Config.load)", uvicorn_protocols)
    step("vllm --version", version_cli)
    step("no lazily imported GPU package loaded", lazy_not_loaded)
    step("vLLM's requirements, as installed", lambda: requirements(details))
    out.update(details)
    out["ok"] = all(s["ok"] for s in out["steps"])
    for line in details.get("version_off", []):
        print(f"probe: version outside a requirement: {line}")
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"probe: {'ok' if out['ok'] else 'FAILED'}", flush=True)
    return 0 if out["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resolve")
    r.add_argument("--json", type=Path)
    v = sub.add_parser("venv")
    v.add_argument("--pack", type=Path, default=PACK)
    v.add_argument("--resolution", type=Path, help="a `resolve --json` file to reuse")
    v.add_argument("--drop", action="append", default=[], metavar="NAME")
    v.add_argument("--fresh", action="store_true")
    v.add_argument("--json", type=Path)
    p = sub.add_parser("probe")
    p.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    return {"resolve": cmd_resolve, "venv": cmd_venv, "probe": cmd_probe}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
