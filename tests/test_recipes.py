"""The build's data files: build/recipe.toml (the native build, its toolchain,
``build --full``) and overlays/gpu.toml (the GPU machine's loads) are what
the code does, and a broken one is one error that names file and key."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_overlay import add_wheel, make_tree

from serieskit.build import build, overlay, recipe
from serieskit.errors import ToolkitError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def toolkit(tmp_path, monkeypatch):
    """A toolkit root with copies of the recipes, read afresh."""
    for rel in (recipe.BUILD, recipe.GPU):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    monkeypatch.setattr(recipe, "ROOT", tmp_path)
    readers = (recipe.native, recipe.gpu)  # a test may stand in for one
    for read in readers:
        read.cache_clear()
    yield tmp_path
    for read in readers:
        read.cache_clear()


def edit(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_every_kernel_file_of_the_series_has_its_architectures():
    """Each csrc/sm7x/*.cu the patches add builds for what the recipe says:
    Turing-only files for sm_75, the rest for sm_70 and sm_75."""
    names = set()
    for patch in (REPO / "patches").glob("*.patch"):
        names |= set(re.findall(r"^\+\+\+ b/csrc/sm7x/([^/\s]+\.cu)$", patch.read_text(), re.M))
    assert names, "the series adds kernel files"
    native = recipe.native()
    for name in names:
        expected = ("75",) if name.endswith("_sm75.cu") else ("70", "75")
        assert native.archs_of(name) == expected


def test_the_build_follows_the_recipe(toolkit, tmp_path):
    edit(toolkit, recipe.BUILD, '"*.cu" = ["70", "75"]', '"*_v100.cu" = ["70"]\n"*.cu" = ["75"]')
    edit(toolkit, recipe.BUILD, 'ptx_arch = "75"', 'ptx_arch = "70"')
    src = tmp_path / "tree" / "csrc" / "sm7x"
    src.mkdir(parents=True)
    for name in ("a.cu", "b_v100.cu", "c_sm75.cu"):
        (src / name).write_text("// kernel\n")
    assert [(k.source, k.archs) for k in build.discover(tmp_path / "tree")] == [
        ("csrc/sm7x/a.cu", ("75",)),
        ("csrc/sm7x/b_v100.cu", ("70",)),
        ("csrc/sm7x/c_sm75.cu", ("75",)),
    ]
    assert build.gencode_flags(("70",), ptx=True)[-1] == "-gencode=arch=compute_70,code=compute_70"


def test_a_kernel_file_no_pattern_matches_is_an_error(toolkit):
    edit(toolkit, recipe.BUILD, '"*.cu" = ["70", "75"]', '"*_sm70.cu" = ["70"]')
    with pytest.raises(ToolkitError, match=r"build/recipe.toml gives no architectures for "):
        recipe.native().archs_of("new.cu")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('ptx_arch = "75"', "", r"build/recipe.toml lacks native.ptx_arch$"),
        ('archs = ["70", "75"]\n', "archs = [70, 75]\n", r"native.archs is not a list of strings"),
        ("[full]", "[full", r"build/recipe.toml is malformed"),
    ],
)
def test_a_broken_recipe_names_file_and_key(toolkit, old, new, message):
    edit(toolkit, recipe.BUILD, old, new)
    with pytest.raises(ToolkitError, match=message):
        recipe.native()


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('"nvtx" = "nvtx"', '"nvtx" = 1', r"overlays/gpu.toml: serve.lazy_gpu.nvtx is not a str"),
        ("image_builds = ", "builds = ", r"overlays/gpu.toml lacks serve.image_builds$"),
        ("image = [", "image = [1, ", r"machine.image is not a list of strings"),
    ],
)
def test_a_broken_gpu_recipe_names_file_and_key(toolkit, old, new, message):
    edit(toolkit, recipe.GPU, old, new)
    with pytest.raises(ToolkitError, match=message):
        recipe.gpu()


def test_a_missing_recipe_says_so(toolkit):
    (toolkit / recipe.GPU).unlink()
    with pytest.raises(ToolkitError, match=r"overlays/gpu.toml is missing"):
        recipe.gpu()


def test_full_build_takes_arch_list_and_environment_from_the_recipe(toolkit, monkeypatch):
    edit(toolkit, recipe.BUILD, 'torch_cuda_arch_list = "7.0 7.5"', 'torch_cuda_arch_list = "7.5"')
    seen: dict = {}
    monkeypatch.setattr(build.shutil, "which", lambda name: "/cuda/bin/nvcc")
    monkeypatch.setattr(build, "nvcc_archs", lambda nvcc: {"70", "75", "80"})

    def run(cmd, env):
        seen.update(cmd=cmd, env=env)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(build.subprocess, "run", run)
    lines: list[str] = []
    build.full_build(Path("/tree"), log=lines.append)
    assert seen["env"]["TORCH_CUDA_ARCH_LIST"] == "7.5"
    assert seen["env"]["VLLM_TARGET_DEVICE"] == "cuda"
    assert "tens of minutes" in lines[0]


def test_the_gpu_loads_follow_overlays_gpu_toml(toolkit, tmp_path, cache, monkeypatch):
    edit(toolkit, recipe.GPU, 'python = "3.12"', 'python = "3.13"')
    edit(
        toolkit, recipe.GPU, '"coverage==7.17.5",\n', '"coverage==7.17.5",\n    "only-here==1.0",\n'
    )
    calls: list[list[str]] = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        (Path(cmd[cmd.index("-d") + 1]) / "dep-1.0-py3-none-any.whl").write_text("whl")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(overlay.subprocess, "run", fake_run)
    tree = make_tree(tmp_path / "tree")
    add_wheel(cache, "9.1.0", b"core")
    lines: list[str] = []
    overlay.pack_gpu(tree, tmp_path / "gpu", "9.1.0", "a", log=lines.append)
    (cmd,) = calls
    n = len(recipe.gpu().wheels)
    assert f"gpu: downloading the {n} wheels the GPU image lacks (overlays/gpu.toml)" in lines
    assert cmd[cmd.index("--python-version") + 1] == "3.13"
    assert cmd[-1] == "only-here==1.0"
    assert cmd.count("--platform") == len(recipe.gpu().platforms)


def test_a_part_over_the_recipes_limit_is_refused(toolkit, tmp_path, cache, monkeypatch):
    small = dataclasses.replace(recipe.gpu(), part_bytes=2**20)
    monkeypatch.setattr(recipe, "gpu", lambda: small)
    monkeypatch.setattr(
        overlay.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", "")
    )
    tree = make_tree(tmp_path / "tree")
    (tree / "vllm/big.bin").write_bytes(os.urandom(2 * 2**20))
    add_wheel(cache, "9.1.0", b"core")
    with pytest.raises(ToolkitError, match="over what one run takes"):
        overlay.pack_gpu(tree, tmp_path / "gpu", "9.1.0", "a", log=lambda *a: None)
