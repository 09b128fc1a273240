"""The overlay and the GPU machine's loads, from a synthetic wheel; the GPU
machine's scripts (gpu/stage1.sh, gpu/assemble.sh) laying them out."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import lzma
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from serieskit import results
from serieskit.build import overlay, recipe
from serieskit.errors import ToolkitError
from serieskit.series import base

REPO = Path(__file__).resolve().parent.parent


def make_tree(path: Path) -> Path:
    for name, text in {
        "vllm/__init__.py": "X = 1\n",
        "vllm/sub/mod.py": "Y = 2\n",
        "vllm/_sm7x_C.abi3.so": "stale\n",
        "vllm/__pycache__/m.pyc": "x",
        "csrc/sm7x/k.cu": "// kernel\n",
        "tests/t.py": "def test(): pass\n",
    }.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def add_wheel(cache: Path, version: str, core: bytes) -> Path:
    """A wheel in the cache, as base.fetch leaves a verified download."""
    gpu = recipe.gpu()
    wheel = cache / gpu.wheel.format(v=version)
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(gpu.core, core)
        z.writestr(gpu.flash_attn_dir + "__init__.py", "FA = 3\n")
        z.writestr(gpu.flash_attn_dir + gpu.flash_attn_skip, b"\0" * 1000)
        z.writestr("vllm/other.py", "")
        z.writestr(
            f"vllm-{version}.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\nRequires-Dist: dep\n",
        )
    wheel.with_suffix(".sha256").write_text(base.sha256_of(wheel) + "\n")
    return wheel


def test_overlay_copies_the_python_tree_and_the_built_module(tmp_path):
    tree = make_tree(tmp_path / "tree")
    module = tmp_path / "build" / "_sm7x_C.abi3.so"
    module.parent.mkdir()
    module.write_text("fresh\n")
    out = overlay.build_overlay(tree, tmp_path / "ov", module, log=lambda *a: None)
    assert (out / "vllm/sub/mod.py").read_text() == "Y = 2\n"
    assert not (out / "vllm/__pycache__").exists()
    assert (out / "vllm/_sm7x_C.abi3.so").read_text() == "fresh\n"  # the built one, not the tree's
    # its loader, declared as a vLLM general plugin where PYTHONPATH finds it
    assert (out / "vllm_sm7x_loader.py").read_bytes() == overlay.LOADER.read_bytes()
    (dist,) = importlib.metadata.distributions(path=[str(out)])
    eps = dist.entry_points
    assert [(e.group, e.name, e.value) for e in eps] == [
        ("vllm.general_plugins", "sm7x_ops", "vllm_sm7x_loader:register")
    ]


def write_wheel(folder: Path, name: str, version: str, size: int = 0) -> Path:
    """A wheel pip installs: one module ``name`` (``size`` bytes of padding)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}.py", f"VERSION = {version!r}\n" + "#" * size)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def no_pip(monkeypatch):
    """pip download of the GPU image's wheels, recorded instead of run."""
    calls: list[list[str]] = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        write_wheel(Path(cmd[cmd.index("-d") + 1]), "dep", "1.0")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(overlay.subprocess, "run", fake_run)
    return calls


def test_pack_gpu_splits_the_wheel_into_two_loads(tmp_path, cache, no_pip):
    tree = make_tree(tmp_path / "tree")
    add_wheel(cache, "9.1.0", b"core module " * 100)
    out = tmp_path / "gpu"
    overlay.pack_gpu(
        tree,
        out,
        "9.1.0",
        "c0ffee",
        ["csrc/sm7x", "tests/t.py"],
        log=lambda *a: None,
        tree_id="7ree",
        files={"vllm/a.py": "b10b"},
    )
    with lzma.open(out / "part1" / "_C_stable_libtorch.abi3.so.xz") as f:
        assert f.read() == b"core module " * 100
    assert (out / "part2" / "VERSION").read_text() == "9.1.0\n"  # what stage2 assembles
    with tarfile.open(out / "part2" / "fa.tar.xz") as tar:
        # the FA2 library left out
        assert tar.getnames() == [recipe.gpu().flash_attn_dir + "__init__.py"]
    with tarfile.open(out / "part2" / "release.tar.xz") as tar:  # for `serieskit wheel` there
        # generated, not in part1 or fa.tar.xz; and the dist-info
        assert tar.getnames() == ["vllm/other.py", "vllm-9.1.0.dist-info/METADATA"]
    with tarfile.open(out / "part2" / "overlay.tgz") as tar:
        names = set(tar.getnames())
        stamps = {
            n: tar.extractfile(n).read() for n in ("SERIES_COMMIT", "SERIES_TREE", "BASE_VERSION")
        }
        tar.extractall(tmp_path / "src", filter="data")
    assert stamps == {
        "SERIES_COMMIT": b"c0ffee\n",
        "SERIES_TREE": b"7ree\n",
        "BASE_VERSION": b"9.1.0\n",
    }
    # what every results writer on the GPU machine records (serieskit.results)
    assert results.series_from_stamps(tmp_path / "src") == {
        "base": "vllm==9.1.0",
        "commit": "c0ffee",
        "tree": "7ree",
        "files": {"vllm/a.py": "b10b"},
        "files_from": "SERIES_FILES packed with the tree (nox -s overlay -- --gpu)",
    }
    assert {"vllm/sub/mod.py", "csrc/sm7x/k.cu", "tests/t.py"} <= names
    assert not any(n.endswith((".so", ".pyc")) for n in names)
    assert "--python-version" in no_pip[0] and "3.12" in no_pip[0]
    # the wheels in a part of their own: part2 keeps room for the tree
    assert not (out / "part2" / "whl").exists()
    assert [p.name for p in (out / "wheels" / "whl").iterdir()] == ["dep-1.0-py3-none-any.whl"]
    listed = (out / "MANIFEST.sha256").read_text()
    assert "wheels/whl/dep-1.0-py3-none-any.whl" in listed and "part1/" in listed


def test_part1_is_made_once_per_wheel_and_piece_size(tmp_path, cache, no_pip, monkeypatch):
    tree = make_tree(tmp_path / "tree")
    add_wheel(cache, "9.1.0", b"core")
    out = tmp_path / "gpu"
    overlay.pack_gpu(tree, out, "9.1.0", "a", log=lambda *a: None)
    core = out / "part1" / "_C_stable_libtorch.abi3.so.xz"
    stamp = core.stat().st_mtime_ns
    overlay.pack_gpu(tree, out, "9.1.0", "b", log=lambda *a: None)
    assert core.stat().st_mtime_ns == stamp
    # Pieces of another size (overlays/gpu.toml's piece_mib): made anew.
    monkeypatch.setattr(recipe, "gpu", lambda g=recipe.gpu(): dataclasses.replace(g, piece_bytes=8))
    overlay.pack_gpu(tree, out, "9.1.0", "c", log=lambda *a: None)
    assert not core.exists() and (out / "part1-2").is_dir()


def test_a_load_over_the_limit_is_refused(tmp_path, cache, no_pip):
    tree = make_tree(tmp_path / "tree")
    (tree / "vllm/big.bin").write_bytes(os.urandom(61 * 2**20))
    add_wheel(cache, "9.1.0", b"core")
    with pytest.raises(ToolkitError, match="over what one run takes"):
        overlay.pack_gpu(tree, tmp_path / "gpu", "9.1.0", "a", log=lambda *a: None)


def test_core_module_in_pieces_that_each_fit_a_run(tmp_path):
    # Larger than one run takes: cut in order over part1, part1-2, ...; the
    # pieces joined in name order are the module again (stage2.sh's cat).
    (tmp_path / "part1").mkdir()
    xz = tmp_path / "part1" / "core.so.xz"
    data = bytes(range(256)) * 10  # 2560 bytes: three pieces
    xz.write_bytes(data)
    overlay._split_for_runs(xz, tmp_path, 1000)
    pieces = sorted(tmp_path.glob("part1*/core.so.xz.*"), key=lambda p: p.name)
    assert [p.parent.name for p in pieces] == ["part1", "part1-2", "part1-3"]
    assert all(p.stat().st_size <= 1000 for p in pieces)
    assert b"".join(p.read_bytes() for p in pieces) == data
    assert not xz.exists()


def test_core_module_that_fits_keeps_its_name(tmp_path):
    (tmp_path / "part1").mkdir()
    xz = tmp_path / "part1" / "core.so.xz"
    xz.write_bytes(b"x" * 100)
    overlay._split_for_runs(xz, tmp_path, recipe.gpu().piece_bytes)
    assert xz.read_bytes() == b"x" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part1"]


def test_gpu_pack_takes_the_test_helpers_the_series_tests_import(tmp_path):
    # The GPU machine's tree holds only what is packed: an upstream helper
    # module a series test imports (and what that imports, relative imports
    # and modules imported by name from a package included) goes along, with
    # the packages on its way; vllm imports and missing modules do not.
    for name, text in {
        "tests/__init__.py": "",
        "tests/v1/__init__.py": "",
        "tests/v1/worker/__init__.py": "",
        "tests/v1/worker/test_ours.py": (
            "import vllm\ndef test():\n    from tests.v1.worker.helper import f\n"
        ),
        "tests/v1/worker/helper.py": "from tests.v1.attention.utils import g\nimport tests.gone\n",
        "tests/v1/attention/utils.py": "import torch\nfrom ... import ci_envs\nfrom .. import x\n",
        "tests/ci_envs.py": "from tests import ci_more\n",
        "tests/ci_more.py": "",
        "tests/v1/x.py": "",
        "tests/v1/worker/unrelated.py": "",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert overlay.test_helpers(tmp_path, ["tests/v1/worker/test_ours.py"]) == [
        "tests/__init__.py",
        "tests/ci_envs.py",
        "tests/ci_more.py",
        "tests/v1/__init__.py",
        "tests/v1/attention/utils.py",
        "tests/v1/worker/__init__.py",
        "tests/v1/worker/helper.py",
        "tests/v1/x.py",
    ]


def test_wheels_that_outgrow_one_run_take_further_parts(tmp_path):
    downloaded = tmp_path / "wheels-download"
    made = {name: write_wheel(downloaded, name, "1.0", 2000) for name in "abc"}
    write_wheel(downloaded, "d", "1.0", 100)
    limit = made["a"].stat().st_size + made["b"].stat().st_size  # a and b fill a part
    overlay._wheel_parts(downloaded, tmp_path, limit)
    parts = {p.parent.name: sorted(w.name[0] for w in p.iterdir()) for p in tmp_path.glob("*/whl")}
    assert parts == {"wheels": ["a", "b"], "wheels-2": ["c", "d"]}
    assert not downloaded.exists()
    write_wheel(downloaded, "huge", "1.0", limit)
    with pytest.raises(ToolkitError, match="huge-1.0-py3-none-any.whl is 0 MiB, over what one run"):
        overlay._wheel_parts(downloaded, tmp_path / "again", limit)


REAL_RUN = subprocess.run  # no_pip stands in for subprocess.run, the packing's


def run_script(script: str, *args: str | Path, keep: Path) -> subprocess.CompletedProcess:
    return REAL_RUN(
        ["bash", str(REPO / "gpu" / script), *map(str, args)],
        capture_output=True,
        text=True,
        env=dict(os.environ, KEEP=str(keep)),
    )


def test_stage1_keeps_the_parts_and_assemble_lays_out_the_load(tmp_path, cache, no_pip):
    """What the GPU machine does with the load (gpu/stage1.sh per part, then
    gpu/assemble.sh from stage2.sh), on the synthetic one: the wheels
    installed into site with vLLM's own METADATA, the core module joined
    from part1, the overlay and FA3 beside it."""
    tree = make_tree(tmp_path / "tree")
    add_wheel(cache, "9.1.0", b"core module " * 100)
    out, keep, root = tmp_path / "gpu", tmp_path / "keep", tmp_path / "run"
    overlay.pack_gpu(tree, out, "9.1.0", "c0ffee", log=lambda *a: None)
    keep.mkdir()
    (keep / "stale.xz").write_text("from an earlier release")
    assert run_script("stage1.sh", out / "part1", keep=keep).returncode == 0
    assert not (keep / "stale.xz").exists()  # part1 comes first and clears
    # stage 2 before the wheels' run: told which run is missing
    early = run_script("assemble.sh", root, out / "part2", keep, keep=keep)
    assert early.returncode == 1
    assert "run gpu/stage1.sh .dev/gpu/wheels" in early.stdout
    assert run_script("stage1.sh", out / "wheels", keep=keep).returncode == 0
    done = run_script("assemble.sh", root, out / "part2", keep, keep=keep)
    assert done.returncode == 0, done.stderr
    assert (root / "site" / "dep.py").read_text().startswith("VERSION = '1.0'")
    metadata = (root / "site" / "vllm-9.1.0.dist-info" / "METADATA").read_text()
    assert "Version: 9.1.0" in metadata and "Requires-Dist: dep" in metadata
    assert (root / "src/vllm/_C_stable_libtorch.abi3.so").read_bytes() == b"core module " * 100
    assert (root / "src/vllm/sub/mod.py").read_text() == "Y = 2\n"
    assert (root / "src" / recipe.gpu().flash_attn_dir / "__init__.py").read_text() == "FA = 3\n"
