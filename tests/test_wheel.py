"""The series' wheel, from a synthetic base and a small fake released wheel:
what goes in, its metadata, pip installs it, and every bad input refused
with one line and nothing half-written in dist/."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import pytest

from conftest import commit_file, quiet
from serieskit import cli, git, results
from serieskit.build import build, overlay, recipe, wheel, wheel_release, wheel_tree, wheel_verify
from serieskit.errors import ToolkitError
from serieskit.series import apply, base, export, series
from serieskit.state import State

VERSION = "0.0.1"
RELEASE_FILE = f"vllm-{VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl"
# What vLLM's build generates, beside the sdist's files: a compiled module
# (reused as it is), a FlashAttention file, and a large package that the GPU
# machine's load leaves out.
GENERATED = {
    "vllm/_core.abi3.so": b"\x7fELF core module " * 200,
    "vllm/vllm_flash_attn/fa.py": b"FA = 3\n",
    "vllm/third_party/big/__init__.py": b"",
    "vllm/third_party/big/kernels.so": os.urandom(1 << 16),
    "vllm/vllm-rs": b"#!/bin/sh\necho rust frontend\n",
}
KERNEL = "__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n"


def digest(data: bytes) -> str:
    return wheel_release.record_digest(data)


@pytest.fixture
def series_root(root):
    """The synthetic toolkit root with a series of two patches applied: one
    changes vllm/utils.py, one adds vllm/new.py and a kernel file."""
    apply.apply(root, log=quiet)
    repo = series.work_repo(root)
    commit_file(repo, "vllm/utils.py", "def f0():\n    return 100\n", "[Kernel] Change f0")
    (repo / "csrc/sm7x").mkdir(parents=True)
    (repo / "csrc/sm7x/k.cu").write_text(KERNEL)
    git.git(repo, "add", "csrc/sm7x/k.cu")
    commit_file(repo, "vllm/new.py", "NEW = 1\n", "[Core] Add new module")
    export.export(root, log=quiet)
    return root


def base_files(root: Path) -> dict[str, bytes]:
    """vllm/ of the base commit as a build packages it (a link as its target)."""
    repo = series.work_repo(root)
    out = {}
    base_commit = State.load(root).base
    for line in git.git(repo, "ls-tree", "-r", base_commit, "--", "vllm").splitlines():
        meta, path = line.split("\t", 1)
        data = git.run(repo, "cat-file", "blob", meta.split()[2]).stdout
        if meta.startswith("120000"):
            data = git.run(repo, "show", f"{base_commit}:vllm/{data.decode()}").stdout
        out[path] = data
    return out


def make_release(path: Path, files: dict[str, bytes], record_override=None) -> bytes:
    """A wheel laid out like vLLM's release: the files, a dist-info, RECORD."""
    info = f"vllm-{VERSION}.dist-info"
    meta = {
        "METADATA": (
            f"Metadata-Version: 2.4\nName: vllm\nVersion: {VERSION}\n"
            "Summary: A high-throughput engine\nRequires-Dist: torch==2.14.0\n\n"
            "# vLLM\n\nThe README.\n"
        ).encode(),
        "WHEEL": b"Wheel-Version: 1.0\nGenerator: setuptools\nRoot-Is-Purelib: false\n",
        "entry_points.txt": b"[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n",
        "top_level.txt": b"vllm\n",
        "licenses/LICENSE": b"Apache-2.0\n",
    }
    everything = {**files, **{f"{info}/{k}": v for k, v in meta.items()}}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for name, data in everything.items():
        w.writerow([name, f"sha256={digest(data)}", len(data)])
    w.writerow([f"{info}/RECORD", "", ""])
    record = (record_override or buf.getvalue()).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in everything.items():
            zi = zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if name.endswith("vllm-rs") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
        z.writestr(f"{info}/RECORD", record)
    return record


def record_release(root: Path, wheel_path: Path, record: bytes) -> None:
    (root / "build").mkdir(exist_ok=True)
    (root / wheel_release.RELEASES).write_text(
        f'[release."{VERSION}"]\nfile = "{RELEASE_FILE}"\n'
        f'sha256 = "{base.sha256_of(wheel_path)}"\n'
        f'record_sha256 = "{hashlib.sha256(record).hexdigest()}"\n'
    )


@pytest.fixture
def release(series_root, cache) -> Path:
    """The fake released wheel in the toolkit's cache (as a verified
    download leaves it) and recorded in build/wheel.toml."""
    path = cache / RELEASE_FILE
    record = make_release(path, {**base_files(series_root), **GENERATED})
    path.with_suffix(".sha256").write_text(base.sha256_of(path) + "\n")
    record_release(series_root, path, record)
    return path


def read_wheel(path: Path) -> tuple[zipfile.ZipFile, dict[str, wheel_release.Recorded]]:
    z = zipfile.ZipFile(path)
    assert z.testzip() is None
    record_name = next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))
    return z, wheel_release.parse_record(z.read(record_name).decode(), "test")


def only_wheel(dist: Path) -> Path:
    (found,) = list(dist.iterdir())
    return found


def commit_of(root: Path) -> str:
    return git.rev(series.work_repo(root), "HEAD") or ""


# --- what goes in ----------------------------------------------------------------


def test_wheel_is_the_release_plus_the_series(series_root, release):
    out = wheel.session(series_root, module=False, log=quiet)
    head = commit_of(series_root)
    version = f"{VERSION}+series.g{head[:12]}.nosm7x"
    assert out == series_root / "dist" / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert only_wheel(series_root / "dist") == out  # no temporary file left
    z, record = read_wheel(out)
    names = set(z.namelist())
    # every file in RECORD with its true sha256 and size, RECORD last
    for name in names - {f"vllm-{version}.dist-info/RECORD"}:
        data = z.read(name)
        assert record[name] == wheel_release.Recorded(digest(data), len(data)), name
    assert z.namelist()[-1] == f"vllm-{version}.dist-info/RECORD"
    # the series where it changes the release, the release elsewhere
    assert z.read("vllm/utils.py") == b"def f0():\n    return 100\n"
    assert z.read("vllm/new.py") == b"NEW = 1\n"
    assert z.read("vllm/__init__.py") == b"VERSION = 1\n"
    for name, data in GENERATED.items():
        assert z.read(name) == data
    assert z.getinfo("vllm/vllm-rs").external_attr >> 16 & 0o777 == 0o755
    assert not any(n.startswith("csrc/") or n.endswith(".pyc") for n in names)
    # the compiled member's compressed data is the release's, byte for byte
    with zipfile.ZipFile(release) as rz:
        old = rz.getinfo("vllm/_core.abi3.so")
        new = z.getinfo("vllm/_core.abi3.so")
        assert (new.CRC, new.compress_size, new.compress_type) == (
            old.CRC,
            old.compress_size,
            old.compress_type,
        )
    # which series it carries
    meta = z.read(f"vllm-{version}.dist-info/METADATA").decode()
    assert f"\nVersion: {version}\n" in meta and f"series commit {head}" in meta
    assert "Requires-Dist: torch==2.14.0" in meta  # the release's requirements, as they are
    assert "without vllm._sm7x_C_stable_libtorch" in meta
    info = json.loads(z.read("vllm/_series.json"))
    assert info["version"] == version and info["series"]["commit"] == head
    assert info["sm7x_C"] is None and info["released_wheel"]["omitted"] == []
    # no module, so no loader of it and no plugin entry point
    assert "vllm_sm7x_loader.py" not in names
    assert b"vllm.general_plugins" not in z.read(f"vllm-{version}.dist-info/entry_points.txt")
    assert info["released_wheel"]["sha256"] == base.sha256_of(release)
    assert f"__version__ = version = {version!r}" in z.read("vllm/_version.py").decode()
    assert (
        z.read(f"vllm-{version}.dist-info/WHEEL")
        .decode()
        .endswith("Tag: cp38-abi3-manylinux_2_28_x86_64\n")
    )


def test_the_same_inputs_give_the_same_bytes(series_root, release, tmp_path):
    first = wheel.session(series_root, module=False, dist=tmp_path / "a", log=quiet)
    second = wheel.session(series_root, module=False, dist=tmp_path / "b", log=quiet)
    assert first.read_bytes() == second.read_bytes()


def test_pip_installs_it(series_root, release, tmp_path):
    out = wheel.session(series_root, module=False, log=quiet)
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
        + ["--target", str(target), str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    version = wheel_verify.wheel_version(out)
    assert (target / "vllm/new.py").read_text() == "NEW = 1\n"
    assert (target / "vllm/_core.abi3.so").read_bytes() == GENERATED["vllm/_core.abi3.so"]
    meta = (target / f"vllm-{version}.dist-info" / "METADATA").read_text()
    assert f"Version: {version}" in meta
    assert "vllm" in (target / "bin" / "vllm").read_text()


def test_the_local_version_names_the_series_commit():
    assert wheel.local_version("0.33.0", "d6e29d6ef0ea" + "0" * 28, True, False) == (
        "0.33.0+series.gd6e29d6ef0ea"
    )
    # digits only would be a number in a local version label: the g keeps it a name
    assert wheel.local_version("0.33.0", "0123456789012345", False, True) == (
        "0.33.0+series.g012345678901.nosm7x.partial"
    )


# --- bad input: one error line, nothing in dist/ ------------------------------------------


def refused(root: Path, *args: str, capsys) -> str:
    """Run the command line; return its one error line (nothing else printed on stderr)."""
    assert cli.run(["wheel", *args], root) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: wheel"), err
    assert not (root / "dist").exists()
    return err[0]


def test_a_half_applied_series_is_refused(series_root, release, capsys):
    p = series_root / "patches" / "0001-Kernel-Change-f0.patch"
    p.write_text(
        p.read_text().replace(" def f0():", " def nothere():").replace("index ", "index-x ")
    )
    shutil.rmtree(series_root / ".work")
    with pytest.raises(ToolkitError, match="does not apply"):
        apply.apply(series_root, log=quiet)
    line = refused(series_root, "--no-module", capsys=capsys)
    assert "half-applied series" in line and "apply stopped at 0001" in line
    assert "nox -s apply -- --continue" in line


def test_an_apply_that_did_not_finish_is_refused(series_root, release, capsys):
    state = State.load(series_root)
    state.in_progress, state.applied = "apply", 1
    state.save(series_root)
    line = refused(series_root, "--no-module", capsys=capsys)
    assert "half-applied series" in line and "1 of 2 patches" in line


def test_a_stopped_git_am_is_refused(series_root, release, capsys):
    repo = series.work_repo(series_root)
    (git.gitdir(repo) / "rebase-apply").mkdir()
    (git.gitdir(repo) / "rebase-apply" / "applying").write_text("")
    assert "git am is stopped" in refused(series_root, "--no-module", capsys=capsys)


def test_uncommitted_changes_are_refused(series_root, release, capsys):
    (series.work_repo(series_root) / "vllm/utils.py").write_text("edited\n")
    line = refused(series_root, "--no-module", capsys=capsys)
    assert "uncommitted changes (vllm/utils.py)" in line


def test_a_missing_released_wheel_says_how_to_get_it(series_root, release, monkeypatch, capsys):
    release.unlink()

    def unreachable(*_a, **_k):
        raise ToolkitError("cannot reach pip's package index to fetch it: Connection refused")

    monkeypatch.setattr(base, "fetch", unreachable)
    line = refused(series_root, "--no-module", capsys=capsys)
    assert f"the released wheel {RELEASE_FILE} could not be fetched" in line
    assert "Connection refused" in line and "--release" in line
    line = refused(series_root, "--no-module", "--release", str(release), capsys=capsys)
    assert "does not exist" in line


def test_a_mismatched_released_wheel_is_refused(series_root, release, tmp_path, capsys):
    other = tmp_path / RELEASE_FILE
    make_release(other, {**base_files(series_root), **GENERATED, "vllm/_core.abi3.so": b"x"})
    line = refused(series_root, "--no-module", "--release", str(other), capsys=capsys)
    assert "not the released wheel" in line
    # the same file, but build/wheel.toml records another RECORD
    text = (series_root / wheel_release.RELEASES).read_text()
    recorded = text.split('record_sha256 = "')[1][:64]
    (series_root / wheel_release.RELEASES).write_text(text.replace(recorded, "0" * 64))
    assert "not the released vLLM" in refused(series_root, "--no-module", capsys=capsys)


def test_a_release_not_of_the_base_is_refused(series_root, cache, capsys):
    files = base_files(series_root)
    files["vllm/__init__.py"] = b"VERSION = 2\n"  # another build's file
    path = cache / RELEASE_FILE
    record = make_release(path, {**files, **GENERATED})
    record_release(series_root, path, record)
    path.with_suffix(".sha256").write_text(base.sha256_of(path) + "\n")
    line = refused(series_root, "--no-module", capsys=capsys)
    assert "vllm/__init__.py" in line and "differs from the released wheel's" in line


def test_an_unrecorded_release_is_refused(series_root, release, capsys):
    (series_root / wheel_release.RELEASES).write_text("")
    assert f'no [release."{VERSION}"] table' in refused(series_root, "--no-module", capsys=capsys)


def test_no_cuda_toolkit_is_refused_with_the_way_on(series_root, release, monkeypatch, capsys):
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "nvcc" else which(name))
    line = refused(series_root, capsys=capsys)
    assert "no CUDA toolkit (nvcc not found" in line and "--no-module" in line


def test_torch_without_cuda_is_refused(series_root, release, monkeypatch, tmp_path, capsys):
    fake_nvcc(tmp_path, monkeypatch)
    cpu_torch = types.ModuleType("torch")
    cpu_torch.__version__ = "2.14.1+cpu"  # type: ignore[attr-defined]
    cpu_torch.version = types.SimpleNamespace(cuda=None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", cpu_torch)  # a CPU build, for this test only
    line = refused(series_root, capsys=capsys)
    assert "torch 2.14.1+cpu" in line and "has no CUDA" in line and "--no-module" in line


def test_a_failed_write_leaves_nothing(series_root, release, monkeypatch):
    dist = series_root / "dist"
    write_zip = wheel.write_zip

    def broken(out, entries, source):
        out.write(b"PK half a wheel")
        raise KeyboardInterrupt  # a user's ^C in the middle

    monkeypatch.setattr(wheel, "write_zip", broken)
    with pytest.raises(KeyboardInterrupt):
        wheel.session(series_root, module=False, log=quiet)
    assert not dist.exists()
    # a wheel written before stays whole when a rewrite fails
    monkeypatch.setattr(wheel, "write_zip", write_zip)
    out = wheel.session(series_root, module=False, log=quiet)
    before = out.read_bytes()
    monkeypatch.setattr(wheel, "write_zip", broken)
    with pytest.raises(KeyboardInterrupt):
        wheel.session(series_root, module=False, log=quiet)
    assert list(dist.iterdir()) == [out] and out.read_bytes() == before


def test_a_killed_writers_leftover_is_removed(series_root, release):
    dist = series_root / "dist"
    dist.mkdir()
    (dist / f".vllm-{VERSION}+x-cp38-abi3-linux_x86_64.whl.abc.part").write_bytes(b"PK")
    (dist / "mine.txt").write_text("not ours")
    lines: list[str] = []
    out = wheel.session(series_root, module=False, log=lines.append)
    assert sorted(p.name for p in dist.iterdir()) == sorted([out.name, "mine.txt"])
    assert any("left by an interrupted run" in line for line in lines)


# --- vllm._sm7x_C --------------------------------------------------------------------


def fake_nvcc(tmp_path: Path, monkeypatch) -> None:
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(build, "nvcc_archs", lambda nvcc: {"75", "80"})
    monkeypatch.setattr(build, "nvcc_version", lambda nvcc: "13.0")


@pytest.fixture
def linker(tmp_path, monkeypatch):
    """nvcc 13.0 (no sm_70) and torch with CUDA, stood in for: build.build
    writes a module whose bytes name the sources it was given."""
    fake_nvcc(tmp_path, monkeypatch)
    monkeypatch.setattr(wheel, "_torch_with_cuda", lambda: ("2.11.0+cu130", "13.0"))
    calls: list[tuple] = []

    def link(tree, out, *, archs, ptx, link, nvcc, log):
        calls.append((archs, ptx, link))
        out.mkdir(parents=True, exist_ok=True)
        so = out / f"{recipe.native().module}.abi3.so"
        so.write_bytes(b"\x7fELF sm7x " + (tree / "csrc/sm7x/k.cu").read_bytes())
        return build.Report(module=str(so))

    monkeypatch.setattr(build, "build", link)
    return calls


def test_the_module_goes_in_and_is_reused(series_root, release, linker):
    lines: list[str] = []
    out = wheel.session(series_root, ptx=True, log=lines.append)
    assert linker == [(("75",), True, True)]
    assert any("sm_70 left out" in line for line in lines)
    head = commit_of(series_root)
    assert out.name == f"vllm-{VERSION}+series.g{head[:12]}-cp38-abi3-linux_x86_64.whl"
    z, _ = read_wheel(out)
    assert z.read(wheel_tree.module_file()) == b"\x7fELF sm7x " + KERNEL.encode()
    assert z.getinfo(wheel_tree.module_file()).external_attr >> 16 & 0o777 == 0o755
    info = json.loads(z.read("vllm/_series.json"))["sm7x_C"]
    assert info["archs"] == ["sm_75"] and info["ptx"] == "compute_75"
    assert info["torch"] == "2.11.0+cu130"
    assert info["sha256"] == hashlib.sha256(z.read(wheel_tree.module_file())).hexdigest()
    # vLLM imports no such module: the wheel's own loader, a vLLM general plugin, does
    assert z.read("vllm_sm7x_loader.py") == overlay.LOADER.read_bytes()
    dist_info = out.name.split("-cp38")[0] + ".dist-info"
    entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
    assert "[console_scripts]\nvllm = vllm.entrypoints.cli.main:main\n" in entry_points
    assert entry_points.endswith("[vllm.general_plugins]\nsm7x_ops = vllm_sm7x_loader:register\n")
    assert z.read(f"{dist_info}/top_level.txt") == b"vllm\nvllm_sm7x_loader\n"
    # the same sources and toolchain: the module is reused, not linked again
    wheel.session(series_root, ptx=True, log=quiet)
    assert len(linker) == 1
    # a module changed after it was linked is linked again
    so = series_root / ".work" / "wheel" / "sm7x" / f"{recipe.native().module}.abi3.so"
    so.write_bytes(b"tampered")
    wheel.session(series_root, ptx=True, log=quiet)
    assert len(linker) == 2


def test_a_failed_link_names_the_way_on(series_root, release, linker, monkeypatch, capsys):
    def fails(*_a, **_k):
        raise ToolkitError("build: compiling k_ops.cpp failed:\n  cuda_runtime_api.h: no such file")

    monkeypatch.setattr(build, "build", fails)
    assert cli.run(["wheel"], series_root) == 1
    first, *details = capsys.readouterr().err.strip().splitlines()
    assert first.startswith(
        "error: wheel: linking vllm._sm7x_C_stable_libtorch failed (build: compiling"
    )
    assert "--no-module" in first and details == ["  cuda_runtime_api.h: no such file"]
    assert not (series_root / "dist").exists()


def test_a_module_changed_during_the_session_is_refused(series_root, release, linker, monkeypatch):
    original = wheel.build_module

    def then_changed(*a, **k):
        module = original(*a, **k)
        module.path.write_bytes(b"swapped")
        return module

    monkeypatch.setattr(wheel, "build_module", then_changed)
    with pytest.raises(ToolkitError, match="not the module this session linked"):
        wheel.session(series_root, log=quiet)
    assert not (series_root / "dist").exists()


# --- the GPU machine: an assembled tree and part of the release ------------------------


def assemble_like_stage2(root: Path, release: Path, dest: Path) -> tuple[Path, Path]:
    """What gpu/stage2.sh leaves, and the release folder serve.sh unpacks:
    the overlay with its stamps, the core module and FA beside it; the large
    third-party package not carried."""
    repo = series.work_repo(root)
    state = State.load(root)
    head = commit_of(root)
    tree = dest / "src"
    shutil.copytree(repo / "vllm", tree / "vllm", symlinks=True)  # as tar keeps them
    shutil.copytree(repo / "csrc", tree / "csrc")
    block = results.series_block(repo, state.base or "", head, VERSION)
    for key, value in (
        ("commit", head),
        ("tree", block["tree"]),
        ("base", VERSION),
        ("files", json.dumps(block["files"])),
    ):
        (tree / results.STAMPS[key]).write_text(f"{value}\n")
    (tree / "vllm/__pycache__").mkdir()
    (tree / "vllm/__pycache__/x.cpython-312.pyc").write_bytes(b"compiled here")
    (tree / "vllm" / f"{recipe.native().module}.abi3.so").write_bytes(b"stage2's own build")
    for name in ("vllm/_core.abi3.so", "vllm/vllm_flash_attn/fa.py"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(GENERATED[name])
    pack = dest / "release.tar.xz"
    with zipfile.ZipFile(release) as z:
        wheel_release.pack_release(
            z, VERSION, repo, pack, skip=("vllm/_core.abi3.so", "vllm/vllm_flash_attn/")
        )
    folder = dest / "release"
    folder.mkdir()
    with tarfile.open(pack) as tar:
        tar.extractall(folder, filter="data")
    return tree, folder


def test_pack_release_carries_the_dist_info_and_the_small_generated_files(
    series_root, release, tmp_path, monkeypatch
):
    monkeypatch.setattr(wheel_release, "CARRY_GROUP_BYTES", 1024)
    _, folder = assemble_like_stage2(series_root, release, tmp_path / "gpu")
    carried = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    info = f"vllm-{VERSION}.dist-info"
    assert carried == sorted(
        [f"{info}/{n}" for n in ("METADATA", "WHEEL", "entry_points.txt", "top_level.txt")]
        + [f"{info}/licenses/LICENSE", f"{info}/RECORD", "vllm/vllm-rs"]
    )  # not the tree's files, not what part1 / fa.tar.xz carry, not the 64 KiB package
    assert os.access(folder / "vllm/vllm-rs", os.X_OK)


def test_the_gpu_machine_builds_it_from_what_it_carries(
    series_root, release, tmp_path, linker, monkeypatch
):
    monkeypatch.setattr(wheel_release, "CARRY_GROUP_BYTES", 1024)  # the 64 KiB package stays behind
    tree, folder = assemble_like_stage2(series_root, release, tmp_path / "gpu")
    lines: list[str] = []
    out = wheel.session(
        series_root, tree=tree, release=folder, dist=tmp_path / "dist", log=lines.append
    )
    head = commit_of(series_root)
    assert out.name == f"vllm-{VERSION}+series.g{head[:12]}.partial-cp38-abi3-linux_x86_64.whl"
    z, _ = read_wheel(out)
    names = set(z.namelist())
    assert z.read("vllm/_core.abi3.so") == GENERATED["vllm/_core.abi3.so"]
    assert z.read("vllm/vllm-rs") == GENERATED["vllm/vllm-rs"]
    assert z.read("vllm/utils.py") == b"def f0():\n    return 100\n"
    assert (
        z.read(wheel_tree.module_file()) == b"\x7fELF sm7x " + KERNEL.encode()
    )  # linked by the session
    assert not any("__pycache__" in n for n in names)
    info = json.loads(z.read("vllm/_series.json"))
    assert info["released_wheel"]["omitted"] == [
        "vllm/third_party/big/__init__.py",
        "vllm/third_party/big/kernels.so",
    ]
    assert info["series"]["commit"] == head
    assert any("2 released files not carried" in line for line in lines)


def test_an_assembled_tree_changed_after_packing_is_refused(series_root, release, tmp_path):
    tree, folder = assemble_like_stage2(series_root, release, tmp_path / "gpu")
    (tree / "vllm/new.py").write_text("NEW = 'edited on the machine'\n")
    with pytest.raises(ToolkitError, match="not the series'"):
        wheel.session(series_root, tree=tree, release=folder, module=False, log=quiet)


def test_a_damaged_carried_module_is_refused(series_root, release, tmp_path):
    tree, folder = assemble_like_stage2(series_root, release, tmp_path / "gpu")
    (tree / "vllm/_core.abi3.so").write_bytes(b"\x7fELF truncated")
    with pytest.raises(ToolkitError, match="differs from the released wheel's"):
        wheel.session(series_root, tree=tree, release=folder, module=False, log=quiet)
    assert not (series_root / "dist").exists()


def test_a_tree_without_stamps_is_refused(series_root, release, tmp_path):
    with pytest.raises(ToolkitError, match="no SERIES_COMMIT stamp"):
        wheel.session(series_root, tree=tmp_path, module=False, log=quiet)


# --- the install check ---------------------------------------------------------------


def test_verify_needs_vllms_requirements_here(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    with pytest.raises(ToolkitError, match="requirements .torch, .... are not installed"):
        wheel_verify.verify_install(tmp_path / "vllm-0.0.1+series.g1-cp38-abi3-linux_x86_64.whl")


@pytest.mark.parametrize("dont_write", ["1", None])
def test_the_install_check_keeps_pythons_no_bytecode_setting(tmp_path, monkeypatch, dont_write):
    """The check runs isolated (-I), which drops PYTHONDONTWRITEBYTECODE: it
    passes -B where that is set, else the check would write the bytecode of
    torch and its dependencies into the shared environment (issue 39)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: object() if name == "torch" else real(name, *a),
    )
    if dont_write:
        monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", dont_write)
    else:
        monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    wheel_file = tmp_path / "vllm-0.0.1+series.g1-cp38-abi3-linux_x86_64.whl"
    ran: list[list[str]] = []

    def fake_run(cmd, what, **kw):  # the environment, pip and the check, faked
        ran.append(cmd)
        if what == "asking the new environment":
            return str(tmp_path / "site") + "\n"
        if what == "the check in the new environment":
            return json.dumps({"extension_loaded": False, "ops": ["a"]}) + "\n"
        if what == "vllm --version":
            return "0.0.1+series.g1\n"
        return ""

    (tmp_path / "site").mkdir()
    monkeypatch.setattr(wheel_verify, "_run", fake_run)
    wheel_verify.verify_install(wheel_file, log=quiet)
    (check,) = [c for c in ran if str(wheel_verify.CHECK_SCRIPT) in c]
    assert check[1] == "-I" and ("-B" in check) == bool(dont_write)
