"""PYTHONPATH overlays, and what a GPU machine without network needs to run them.

An overlay is the patched Python tree (``vllm/`` of the work tree) plus the
series' built native module, placed in front of a released vLLM wheel of the
same version: the way the seed ran its A/B without a full rebuild.

``pack_gpu`` prepares the two loads for a GPU machine that has torch but no
network and takes at most 64 MiB per run: part1 is the wheel's compiled core
module (it must arrive in a first run and wait in /tmp; where it is larger
than one run takes, in pieces: part1, part1-2, ..., one run each), part2 the
rest (the overlay, the FA3 package vLLM's model inspection imports, and the
wheels that machine lacks). ``gpu/stage1.sh`` and ``stage2.sh`` unpack them
there.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from serieskit import base, claims, series, target
from serieskit.errors import ToolkitError, failed
from serieskit.state import State
from serieskit.target import Target
from serieskit.wheel import pack_release

WHEEL = "vllm-{v}-cp38-abi3-manylinux_2_28_x86_64.whl"
CORE = "vllm/_C_stable_libtorch.abi3.so"
FA_DIR = "vllm/vllm_flash_attn/"
FA_SKIP = "_vllm_fa2_C.abi3.so"  # never loaded on this path; 140 MB
# What the GPU image (Python 3.12, torch 2.11) lacks for the pinned vLLM's engine.
GPU_WHEELS = (
    "cbor2",
    "pyzmq",
    "openai-harmony",
    "openai<3",
    "msgspec",
    "pybase64",
    "cachetools",
    "llguidance>=1.7,<1.8",
    "xgrammar==0.2.8",
    "apache-tvm-ffi",
    "fastapi>=0.133,<0.137",
    "partial-json-parser",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "starlette",
    "jiter",
    "distro",
    "sniffio",
    "blake3",
    "depyf",
    "astor",
    "dill",
    "coverage==7.17.5",  # coverage: gpu/run_tests.py with COVERAGE=1
    # vLLM 0.33.0's model loader imports it for every model; on 0.26.0 the
    # NVFP4 compressed-tensors tests need it.
    "compressed-tensors==0.17.0",
    "loguru",
)
GPU_PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def build_overlay(tree: Path, out: Path, module: Path | None = None, log=print) -> Path:
    """Copy the patched ``vllm/`` package (and the built module) to ``out``."""
    dest = out / "vllm"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(tree / "vllm", dest, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    if module is not None and module.exists():
        shutil.copy2(module, dest / module.name)
    log(
        f"overlay: {out} ({sum(1 for _ in dest.rglob('*.py'))} Python files"
        + (f", {module.name}" if module is not None and module.exists() else "")
        + ")"
    )
    return out


# What one run may carry beside the working tree (a run takes 64 MiB in all).
RUN_PIECE = 56 * 2**20


def _split_for_runs(xz: Path, out: Path) -> None:
    """Cut the compressed core module into pieces that one run each carries:
    ``NAME.xz.00`` in part1, ``NAME.xz.01`` in part1-2, ...; stage2 joins them
    in order. One piece keeps its name."""
    if xz.stat().st_size <= RUN_PIECE:
        return
    with xz.open("rb") as src:
        i = 0
        while chunk := src.read(RUN_PIECE):
            folder = out / ("part1" if i == 0 else f"part1-{i + 1}")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{xz.name}.{i:02d}").write_bytes(chunk)
            i += 1
    xz.unlink()


def pack_gpu(
    tree: Path,
    out: Path,
    version: str,
    commit: str,
    extra: tuple[str, ...] | list[str] = (),
    log=print,
    tree_id: str = "?",
    files: dict[str, str] | None = None,
) -> None:
    """Write ``out/part1`` and ``out/part2`` for the two runs on the GPU machine."""
    wheel, wheel_sha = base.fetch(WHEEL.format(v=version), version, log=log)
    p1, p2 = out / "part1", out / "part2"
    source = p1 / "SOURCE"
    fresh = not (source.exists() and source.read_text().strip() == wheel_sha)
    for d in (*out.glob("part1-*"), p1, p2) if fresh else (p2,):
        shutil.rmtree(d, ignore_errors=True)
    for d in (p1, p2) if fresh else (p2,):
        d.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        if fresh:  # part1 depends on the wheel alone: made once
            log(f"gpu: compressing {CORE} (about a minute)")
            xz = p1 / (Path(CORE).name + ".xz")
            with z.open(CORE) as src, lzma.open(xz, "wb", preset=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            _split_for_runs(xz, out)
            source.write_text(wheel_sha + "\n")
        with tarfile.open(p2 / "fa.tar.xz", "w:xz") as tar:
            for info in z.infolist():
                if info.filename.startswith(FA_DIR) and not info.filename.endswith(FA_SKIP):
                    data = z.read(info)
                    ti = tarfile.TarInfo(info.filename)
                    ti.size = len(data)
                    tar.addfile(ti, fileobj=io.BytesIO(data))
        # For `serieskit wheel` there (gpu/serve.sh): the release's RECORD checks
        # every compiled member the wheel takes from the assembled tree.
        pack_release(z, version, tree, p2 / "release.tar.xz", skip=(CORE, FA_DIR))
    with tarfile.open(p2 / "overlay.tgz", "w:gz") as tar:
        tar.add(
            tree / "vllm",
            arcname="vllm",
            filter=lambda ti: (None if "__pycache__" in ti.name or ti.name.endswith(".so") else ti),
        )
        for path in extra:
            if (tree / path).exists():
                tar.add(
                    tree / path,
                    arcname=path,
                    filter=lambda ti: None if "__pycache__" in ti.name else ti,
                )
        # What the results files name (serieskit.results): the commit, the
        # tree (the content, whatever the commit ids), the release it sits on
        # and the blob of every file the series changes.
        for name, value in (
            ("SERIES_COMMIT", commit),
            ("SERIES_TREE", tree_id),
            ("BASE_VERSION", version),
            ("SERIES_FILES", json.dumps(files or {}, sort_keys=True)),
        ):
            stamp = f"{value}\n".encode()
            info_ = tarfile.TarInfo(name)
            info_.size = len(stamp)
            tar.addfile(info_, io.BytesIO(stamp))
    (p2 / "VERSION").write_text(version + "\n")
    whl = p2 / "whl"
    whl.mkdir()
    plats = [arg for p in GPU_PLATFORMS for arg in ("--platform", p)]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *plats,
            "-d",
            str(whl),
            *GPU_WHEELS,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise failed("gpu: downloading the wheels the GPU image lacks", proc)
    for part in (*sorted(out.glob("part1*")), p2):
        size = sum(f.stat().st_size for f in part.rglob("*") if f.is_file())
        log(f"gpu: {part} {size / 2**20:.1f} MiB")
        if size > 60 * 2**20:
            raise ToolkitError(f"gpu: {part} is {size / 2**20:.0f} MiB, over what one run takes")
    (out / "MANIFEST.sha256").write_text(
        "".join(
            f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(out)}\n"
            for f in sorted(out.rglob("*"))
            if f.is_file() and f.name != "MANIFEST.sha256"
        )
    )


def test_helpers(tree: Path, tests: list[str]) -> list[str]:
    """The upstream test modules the series' test files import (``from
    tests.x import ...``, at any depth), with the packages on their way:
    the GPU machine's tree has no other tests."""
    found: set[str] = set()
    todo = list(tests)
    while todo:
        path = tree / todo.pop()
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in names:
                parts = name.split(".")
                if parts[0] != "tests":
                    continue
                module = "/".join(parts) + ".py"
                if (tree / module).is_file() and module not in found and module not in tests:
                    found.add(module)
                    todo.append(module)
                for i in range(1, len(parts)):
                    init = "/".join(parts[:i]) + "/__init__.py"
                    if (tree / init).is_file():
                        found.add(init)
    return sorted(found)


def session(where: Path | Target, gpu: bool = False, log=print) -> None:
    """``nox -s overlay``: overlays/vllm-VERSION from the target's work tree
    (with the built module where there is one); ``gpu`` also packs the GPU
    machine's loads (``.dev/gpu``, a port's ``.dev/gpu-VERSION``)."""
    t = target.of(where)
    tree = series.applied_tree(t)
    module = next(t.out("build").glob("_sm7x_C*.so"), None)
    build_overlay(tree, t.root / "overlays" / f"vllm-{t.version}", module, log=log)
    if gpu:
        head = State.load(t).head or "?"
        tests = series.test_files(t)
        extra = ["csrc/sm7x", *tests, *test_helpers(tree, tests)]
        block = claims.series_block(tree, State.load(t).base or "", head, t.version)
        dest = t.root / ".dev" / (f"gpu-{t.version}" if t.port else "gpu")
        pack_gpu(
            tree, dest, t.version, head, extra, log=log, tree_id=block["tree"], files=block["files"]
        )
