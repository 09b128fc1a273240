"""PYTHONPATH overlays and the GPU machine's loads.

An overlay is the patched ``vllm/`` and the series' module laid in front of a
released wheel of the same version. ``pack_gpu`` writes what a GPU machine
without network needs, in runs of at most 64 MiB (overlays/gpu.toml): part1
the wheel's core module (in pieces: part1, part1-2, ...), ``wheels`` the
wheels it lacks, part2 the rest; gpu/stage1.sh and stage2.sh unpack them.
serieskit.build.sitting plans the device calls that carry them.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from serieskit import files, git, results
from serieskit.build import recipe
from serieskit.build.wheel_release import pack_release
from serieskit.errors import ToolkitError, failed
from serieskit.series import base, series, target
from serieskit.series.target import Target
from serieskit.state import State

# The toolkit's loader of the series' module (overlays/vllm_sm7x_loader.py):
# vLLM imports no module that its own build does not produce, so the overlay
# and the wheel declare the loader as a vLLM general plugin in a dist-info.
LOADER = Path(__file__).resolve().parents[2] / "overlays" / "vllm_sm7x_loader.py"
LOADER_DIST_INFO = "vllm_sm7x_loader-1.0.dist-info"
PLUGIN_GROUP = "vllm.general_plugins"


def loader_entry_points() -> str:
    """The ``entry_points.txt`` lines that make vLLM call the loader."""
    return f"[{PLUGIN_GROUP}]\nsm7x_ops = vllm_sm7x_loader:register\n"


def loader_files() -> dict[str, bytes]:
    """The loader and its dist-info, by their paths beside ``vllm/``."""
    meta = "Metadata-Version: 2.1\nName: vllm-sm7x-loader\nVersion: 1.0\n"
    return {
        LOADER.name: LOADER.read_bytes(),
        f"{LOADER_DIST_INFO}/METADATA": meta.encode(),
        f"{LOADER_DIST_INFO}/entry_points.txt": loader_entry_points().encode(),
    }


def build_overlay(tree: Path, out: Path, module: Path | None = None, log=print) -> Path:
    """Copy the patched ``vllm/`` package (and the built module, with the
    loader that registers it as a vLLM plugin) to ``out``."""
    dest = out / "vllm"
    # Made beside it, then swapped in: a kill never leaves half an overlay there.
    files.clear_leftovers(out)
    new = out / f".vllm.new.serieskit-{os.getpid()}.tmp"
    old = out / f".vllm.old.serieskit-{os.getpid()}.tmp"
    shutil.copytree(tree / "vllm", new, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    if module is not None and module.exists():
        shutil.copy2(module, new / module.name)
    if dest.exists():
        dest.rename(old)
    new.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    for name, data in loader_files().items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    log(
        f"overlay: {out} ({sum(1 for _ in dest.rglob('*.py'))} Python files"
        + (f", {module.name}" if module is not None and module.exists() else "")
        + ")"
    )
    return out


def _split_for_runs(xz: Path, out: Path, piece: int) -> None:
    """Cut the compressed core module into pieces that one run each carries:
    ``NAME.xz.00`` in part1, ``NAME.xz.01`` in part1-2, ...; stage2 joins them
    in order. One piece keeps its name."""
    if xz.stat().st_size <= piece:
        return
    with xz.open("rb") as src:
        i = 0
        while chunk := src.read(piece):
            folder = out / ("part1" if i == 0 else f"part1-{i + 1}")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{xz.name}.{i:02d}").write_bytes(chunk)
            i += 1
    xz.unlink()


def _wheel_parts(downloaded: Path, out: Path, limit: int) -> None:
    """Move the downloaded wheels into parts of their own, each within what
    one run carries: ``wheels/whl`` first, then ``wheels-2/whl``, ... (in
    name order); gpu/stage1.sh keeps each in /tmp/keep/whl."""
    part, used = 1, 0
    for whl in sorted(downloaded.glob("*.whl")):
        size = whl.stat().st_size
        if size > limit:
            raise ToolkitError(
                f"gpu: {whl.name} is {size / 2**20:.0f} MiB, over what one run takes"
            )
        if used + size > limit:
            part, used = part + 1, 0
        dest = out / ("wheels" if part == 1 else f"wheels-{part}") / "whl"
        dest.mkdir(parents=True, exist_ok=True)
        whl.rename(dest / whl.name)
        used += size
    shutil.rmtree(downloaded)


def pack_gpu(
    tree: Path,
    out: Path,
    version: str,
    commit: str,
    extra: tuple[str, ...] | list[str] = (),
    log=print,
    tree_id: str = "?",
    files: dict[str, str] | None = None,
    tree_bytes: int = 0,
    tests: tuple[str, ...] | list[str] = (),
    cases: dict[str, str] | None = None,
) -> None:
    """Write ``out/part1`` (and ``part1-2``, ...), ``out/wheels`` (and
    ``wheels-2``, ...) and ``out/part2`` for the runs on the GPU machine (what
    they hold: overlays/gpu.toml), each within what a call leaves beside a
    working tree of ``tree_bytes``."""
    gpu = recipe.fitted(recipe.gpu(), tree_bytes)
    wheel, wheel_sha = base.fetch(gpu.wheel.format(v=version), version, log=log)
    p1, p2 = out / "part1", out / "part2"
    # part1 depends on the wheel and the size of its pieces alone: made once.
    source, made_from = p1 / "SOURCE", f"{wheel_sha} {gpu.piece_bytes}"
    fresh = not (source.exists() and source.read_text().strip() == made_from)
    for d in (*out.glob("part1-*"), p1, p2) if fresh else (p2,):
        shutil.rmtree(d, ignore_errors=True)
    for d in out.glob("wheels*"):  # the list may have changed: made anew
        shutil.rmtree(d)
    for d in (p1, p2) if fresh else (p2,):
        d.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z:
        if fresh:
            log(f"gpu: compressing {gpu.core} (about a minute)")
            xz = p1 / (Path(gpu.core).name + ".xz")
            with z.open(gpu.core) as src, lzma.open(xz, "wb", preset=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            _split_for_runs(xz, out, gpu.piece_bytes)
            source.write_text(made_from + "\n")
        with tarfile.open(p2 / "fa.tar.xz", "w:xz") as tar:
            for info in z.infolist():
                name = info.filename
                if name.startswith(gpu.flash_attn_dir) and not name.endswith(gpu.flash_attn_skip):
                    data = z.read(info)
                    ti = tarfile.TarInfo(info.filename)
                    ti.size = len(data)
                    tar.addfile(ti, fileobj=io.BytesIO(data))
        # For `serieskit wheel` there (gpu/serve.sh): the release's RECORD checks
        # every compiled member the wheel takes from the assembled tree.
        pack_release(z, version, tree, p2 / "release.tar.xz", skip=(gpu.core, gpu.flash_attn_dir))
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
        # The loader of the module that gpu/stage2.sh builds there, as in
        # build_overlay: $root/src, where these land, is on PYTHONPATH.
        for name, data in loader_files().items():
            info_ = tarfile.TarInfo(name)
            info_.size = len(data)
            tar.addfile(info_, io.BytesIO(data))
        # What the results files name (serieskit.results): the commit, the
        # tree (the content, whatever the commit ids), the release it sits on
        # and the blob of every file the series changes.
        for name, value in (
            ("SERIES_COMMIT", commit),
            ("SERIES_TREE", tree_id),
            ("BASE_VERSION", version),
            ("SERIES_FILES", json.dumps(files or {}, sort_keys=True)),
            # The series' test files, which gpu/evidence.sh runs, and its
            # cases in upstream files (a file and a -k expression per line).
            ("SERIES_TESTS", "\n".join(tests)),
            ("SERIES_TEST_CASES", "\n".join(f"{f} {e}" for f, e in (cases or {}).items())),
        ):
            stamp = f"{value}\n".encode()
            info_ = tarfile.TarInfo(name)
            info_.size = len(stamp)
            tar.addfile(info_, io.BytesIO(stamp))
    (p2 / "VERSION").write_text(version + "\n")
    whl = out / "wheels-download"
    whl.mkdir()
    plats = [arg for p in gpu.platforms for arg in ("--platform", p)]
    log(f"gpu: downloading the {len(gpu.wheels)} wheels the GPU image lacks ({recipe.GPU})")
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
            gpu.python,
            "--implementation",
            "cp",
            *plats,
            "-d",
            str(whl),
            *gpu.wheels,
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise failed("gpu: downloading the wheels the GPU image lacks", proc)
    _wheel_parts(whl, out, gpu.part_bytes)
    for part in (*sorted(out.glob("part1*")), *sorted(out.glob("wheels*")), p2):
        size = sum(f.stat().st_size for f in part.rglob("*") if f.is_file())
        log(f"gpu: {part} {size / 2**20:.1f} MiB")
        if size > gpu.part_bytes:
            raise ToolkitError(f"gpu: {part} is {size / 2**20:.0f} MiB, over what one run takes")
    (out / "MANIFEST.sha256").write_text(
        "".join(
            f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(out)}\n"
            for f in sorted(out.rglob("*"))
            if f.is_file() and f.name != "MANIFEST.sha256"
        )
    )


def _imported(path: Path, node: ast.AST) -> list[str]:
    """The dotted names an import statement of ``path`` may load: the
    module, and each imported name as a module of it (``from tests import
    ci_envs``); a relative import resolved from the file's package."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    package = list(path.parent.parts)
    base = package[: len(package) - node.level + 1] if node.level else []
    module = ".".join(base + ([node.module] if node.module else []))
    return [module] + [f"{module}.{a.name}" for a in node.names]


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
            for name in _imported(path.relative_to(tree), node):
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
    module = next(t.out("build").glob(f"{recipe.native().module}*.so"), None)
    build_overlay(tree, t.root / "overlays" / f"vllm-{t.version}", module, log=log)
    if gpu:
        head = State.load(t).head or "?"
        tests = series.test_files(t)
        # csrc/torch_utils.h: the bindings' stream helper, vLLM's own.
        extra = ["csrc/sm7x", "csrc/torch_utils.h", *tests, *test_helpers(tree, tests)]
        block = results.series_block(tree, State.load(t).base or "", head, t.version)
        dest = t.root / ".dev" / (f"gpu-{t.version}" if t.port else "gpu")
        pack_gpu(
            tree,
            dest,
            t.version,
            head,
            extra,
            log=log,
            tree_id=block["tree"],
            files=block["files"],
            tree_bytes=git.sent_bytes(t.root),
            tests=series.gpu_test_files(t),
            cases=series.gpu_test_cases(t),
        )
