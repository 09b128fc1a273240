"""The overlay and the GPU machine's two loads, from a synthetic wheel."""

from __future__ import annotations

import lzma
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from serieskit import base, overlay, results
from serieskit.errors import ToolkitError


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
    wheel = cache / overlay.WHEEL.format(v=version)
    wheel.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(overlay.CORE, core)
        z.writestr(overlay.FA_DIR + "__init__.py", "FA = 3\n")
        z.writestr(overlay.FA_DIR + overlay.FA_SKIP, b"\0" * 1000)
        z.writestr("vllm/other.py", "")
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


@pytest.fixture
def no_pip(monkeypatch):
    """pip download of the GPU image's wheels, recorded instead of run."""
    calls: list[list[str]] = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        (Path(cmd[cmd.index("-d") + 1]) / "dep-1.0-py3-none-any.whl").write_text("whl")
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
        assert tar.getnames() == [overlay.FA_DIR + "__init__.py"]  # FA2 library left out
    with tarfile.open(out / "part2" / "release.tar.xz") as tar:  # for `serieskit wheel` there
        assert tar.getnames() == ["vllm/other.py"]  # generated, not in part1 or fa.tar.xz
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
    listed = (out / "MANIFEST.sha256").read_text()
    assert "part2/whl/dep-1.0-py3-none-any.whl" in listed and "part1/" in listed


def test_part1_is_made_once_per_wheel(tmp_path, cache, no_pip):
    tree = make_tree(tmp_path / "tree")
    add_wheel(cache, "9.1.0", b"core")
    out = tmp_path / "gpu"
    overlay.pack_gpu(tree, out, "9.1.0", "a", log=lambda *a: None)
    core = out / "part1" / "_C_stable_libtorch.abi3.so.xz"
    stamp = core.stat().st_mtime_ns
    overlay.pack_gpu(tree, out, "9.1.0", "b", log=lambda *a: None)
    assert core.stat().st_mtime_ns == stamp


def test_a_load_over_the_limit_is_refused(tmp_path, cache, no_pip):
    tree = make_tree(tmp_path / "tree")
    (tree / "vllm/big.bin").write_bytes(os.urandom(61 * 2**20))
    add_wheel(cache, "9.1.0", b"core")
    with pytest.raises(ToolkitError, match="over what one run takes"):
        overlay.pack_gpu(tree, tmp_path / "gpu", "9.1.0", "a", log=lambda *a: None)


def test_core_module_in_pieces_that_each_fit_a_run(tmp_path, monkeypatch):
    # Larger than one run takes: cut in order over part1, part1-2, ...; the
    # pieces joined in name order are the module again (stage2.sh's cat).
    monkeypatch.setattr(overlay, "RUN_PIECE", 1000)
    (tmp_path / "part1").mkdir()
    xz = tmp_path / "part1" / "core.so.xz"
    data = bytes(range(256)) * 10  # 2560 bytes: three pieces
    xz.write_bytes(data)
    overlay._split_for_runs(xz, tmp_path)
    pieces = sorted(tmp_path.glob("part1*/core.so.xz.*"), key=lambda p: p.name)
    assert [p.parent.name for p in pieces] == ["part1", "part1-2", "part1-3"]
    assert all(p.stat().st_size <= 1000 for p in pieces)
    assert b"".join(p.read_bytes() for p in pieces) == data
    assert not xz.exists()


def test_core_module_that_fits_keeps_its_name(tmp_path):
    (tmp_path / "part1").mkdir()
    xz = tmp_path / "part1" / "core.so.xz"
    xz.write_bytes(b"x" * 100)
    overlay._split_for_runs(xz, tmp_path)
    assert xz.read_bytes() == b"x" * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part1"]


def test_gpu_pack_takes_the_test_helpers_the_series_tests_import(tmp_path):
    # The GPU machine's tree holds only what is packed: an upstream helper
    # module a series test imports (and what that imports) goes along, with
    # the packages on its way; vllm imports and missing modules do not.
    for name, text in {
        "tests/__init__.py": "",
        "tests/v1/__init__.py": "",
        "tests/v1/worker/__init__.py": "",
        "tests/v1/worker/test_ours.py": (
            "import vllm\ndef test():\n    from tests.v1.worker.helper import f\n"
        ),
        "tests/v1/worker/helper.py": "from tests.v1.attention.utils import g\nimport tests.gone\n",
        "tests/v1/attention/utils.py": "import torch\n",
        "tests/v1/worker/unrelated.py": "",
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert overlay.test_helpers(tmp_path, ["tests/v1/worker/test_ours.py"]) == [
        "tests/__init__.py",
        "tests/v1/__init__.py",
        "tests/v1/attention/utils.py",
        "tests/v1/worker/__init__.py",
        "tests/v1/worker/helper.py",
    ]
