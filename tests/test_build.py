"""The native build: kernel discovery, arch selection, ptxas report, errors."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from serieskit.build import build, recipe
from serieskit.errors import ToolkitError

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_75'
ptxas info    : Function properties for _Z6kernelPf
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 49152 bytes smem, 352 bytes cmem[0]
ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_70'
ptxas info    : Function properties for _Z6kernelPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 352 bytes cmem[0]
"""
SASS = """\
\t\tFunction : _Z6kernelPf
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDSM.16.M88.4 R4, [R2] ;
        /*0020*/                   HMMA.1688.F32 R8, R4, R6, R8 ;
        /*0030*/              @!P0 HMMA.1688.F32 R8, R4, R7, R8 ;
        /*0040*/                   EXIT ;
\t\tFunction : _Z5otherv
        /*0000*/                   EXIT ;
"""
GOOD = "__global__ void scale(float* x) { x[threadIdx.x] *= 2.f; }\n"
BAD = "__global__ void scale(float* x) { x[threadIdx.x] *= undefined_name; }\n"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


def tree_with(tmp_path, files):
    src = tmp_path / "tree" / recipe.native().sources
    src.mkdir(parents=True)
    for name, text in files.items():
        (src / name).write_text(text)
    return tmp_path / "tree"


def test_ptxas_report_is_parsed_per_function_and_arch():
    usage = build.parse_ptxas(PTXAS)
    assert [
        (u.arch, u.registers, u.shared_bytes, u.stack_bytes, u.spill_stores) for u in usage
    ] == [("75", 255, 49152, 8, 4), ("70", 32, 0, 0, 0)]


def test_sass_opcodes_are_counted_per_function_with_predicated_ones():
    assert build.sass_opcodes(SASS) == {
        "_Z6kernelPf": {"MOV": 1, "LDSM.16.M88.4": 1, "HMMA.1688.F32": 2, "EXIT": 1},
        "_Z5otherv": {"EXIT": 1},
    }


def test_turing_only_files_build_for_sm75_alone(tmp_path):
    tree = tree_with(tmp_path, {"a.cu": GOOD, "b_sm75.cu": GOOD})
    assert [(k.source, k.archs) for k in build.discover(tree)] == [
        ("csrc/sm7x/a.cu", ("70", "75")),
        ("csrc/sm7x/b_sm75.cu", ("75",)),
    ]
    assert build.gencode_flags(("75",), ptx=True) == [
        "-gencode=arch=compute_75,code=sm_75",
        "-gencode=arch=compute_75,code=compute_75",
    ]


def test_no_native_code_says_so_and_succeeds(tmp_path):
    lines = []
    report = build.build(tmp_path, tmp_path / "out", log=lines.append)
    assert report.kernels == [] and "no native code yet" in lines[0]


@needs_nvcc
def test_kernel_compiles_with_a_resource_report(tmp_path):
    tree = tree_with(tmp_path, {"ok_sm75.cu": GOOD})
    lines: list[str] = []
    report = build.build(tree, tmp_path / "out", archs=("75",), ptx=True, log=lines.append)
    assert lines[0].startswith("build: compiling 1 kernel file(s) with ")  # before it starts
    (usage,) = report.usage
    assert usage.arch == "75" and usage.registers > 0 and usage.spill_stores == 0
    if shutil.which("c++filt"):
        assert usage.name == "scale"
    assert '"registers"' in report.to_json()


@needs_nvcc
def test_kernel_that_does_not_compile_names_the_file(tmp_path):
    tree = tree_with(tmp_path, {"broken_sm75.cu": BAD})
    with pytest.raises(ToolkitError, match=r"nvcc failed on csrc/sm7x/broken_sm75.cu for sm_75"):
        build.build(tree, tmp_path / "out", archs=("75",), log=lambda *a: None)


@needs_nvcc
def test_arch_the_local_nvcc_lacks_compiles_through_cuda12(tmp_path):
    kernel = (
        "#include <cuda_fp16.h>\n"
        "__global__ void add(__half* a, const __half* b) {\n"
        "  a[threadIdx.x] = __hadd(a[threadIdx.x], b[threadIdx.x]);\n}\n"
        "#ifndef __CUDACC_RTC__\n"
        "void launch(__half* a, const __half* b, cudaStream_t s) {\n"
        "  add<<<1, 32, 0, s>>>(a, b);\n}\n"
        "#endif\n"
    )
    tree = tree_with(tmp_path, {"add.cu": kernel})
    lines = []
    report = build.build(tree, tmp_path / "out", archs=("70", "75"), log=lines.append)
    assert sorted(u.arch for u in report.usage) == ["70", "75"]
    assert all(u.registers > 0 for u in report.usage)
    if "70" not in build.nvcc_archs("nvcc"):
        assert any("compiling for it through CUDA 12 NVRTC" in line for line in lines)
        assert (tmp_path / "out" / "add.sm_70.cubin").stat().st_size > 0
        with pytest.raises(ToolkitError, match="linking a module for it needs a CUDA 12.x nvcc"):
            build.build(tree, tmp_path / "out", archs=("70",), link=True, log=lambda *a: None)


# A binding on the libtorch stable ABI, as csrc/sm7x's are, in a namespace of
# the test's own, and the module-init header of vLLM's tree it is built with.
STABLE_BINDING = """\
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <cuda_runtime.h>

namespace {
int64_t twice(int64_t x) {
  STD_TORCH_CHECK(x >= 0, "twice: x must be non-negative");
  return 2 * x;
}
}  // namespace

STABLE_TORCH_LIBRARY_FRAGMENT(_serieskit_link_test, m) {
  m.def("twice(int x) -> int");
}
STABLE_TORCH_LIBRARY_IMPL(_serieskit_link_test, CompositeExplicitAutograd, m) {
  m.impl("twice", TORCH_BOX(&twice));
}
"""
REGISTRATION_H = """\
#pragma once
#include <Python.h>
#define _CONCAT(A, B) A##B
#define CONCAT(A, B) _CONCAT(A, B)
#define _STRINGIFY(A) #A
#define STRINGIFY(A) _STRINGIFY(A)
#define REGISTER_EXTENSION(NAME)                                               \\
  PyMODINIT_FUNC CONCAT(PyInit_, NAME)() {                                     \\
    static struct PyModuleDef module = {PyModuleDef_HEAD_INIT,                 \\
                                        STRINGIFY(NAME), nullptr, 0, nullptr}; \\
    return PyModule_Create(&module);                                           \\
  }
"""


def test_cuda_root_sees_through_a_wrapper_script(tmp_path):
    # nvcc on PATH may be a script that runs the toolkit's nvcc: its headers
    # are in the toolkit's root, not beside the script.
    root = tmp_path / "cuda-13.9"
    (root / "bin").mkdir(parents=True)
    real = root / "bin" / "nvcc"
    real.write_text(f'#!/bin/sh\necho "#$ TOP={root}/bin/.."\n')
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    for f in (real, wrapper):
        f.chmod(0o755)
    assert build.cuda_root(str(wrapper)) == root


@needs_nvcc
def test_link_builds_an_importable_stable_abi_module(tmp_path):
    """--link: the bindings compiled for the stable ABI of the recipe's torch
    (no libtorch C++ symbol in the module), linked with the kernels into an
    abi3 module that Python imports and that registers its ops."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    assert "-DTORCH_TARGET_VERSION=0x020B000000000000ULL" in recipe.native().cxx_defines
    tree = tree_with(tmp_path, {"k.cu": GOOD, "k_ops.cpp": STABLE_BINDING})
    (tree / "csrc" / "core").mkdir()
    (tree / "csrc" / "core" / "registration.h").write_text(REGISTRATION_H)
    report = build.build(tree, tmp_path / "out", archs=("75",), link=True, log=lambda *a: None)
    so = tmp_path / "out" / f"{recipe.native().module}.abi3.so"
    assert report.module == str(so) and so.exists()
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(so)], capture_output=True, text=True, check=True
    ).stdout
    assert "aoti_torch_" in undefined or "torch_library_impl" in undefined
    for cxx_api in ("_ZN3c10", "_ZN2at", "_ZN5torch"):
        assert cxx_api not in undefined, cxx_api
    code = (
        f"import sys; sys.path.insert(0, {str(so.parent)!r})\n"
        "import torch\n"
        f"import {recipe.native().module}\n"
        "print(torch.ops._serieskit_link_test.twice(21))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == "42"


def test_the_cuda12_compiler_is_installed_without_a_copy_in_pips_cache(tmp_path, monkeypatch):
    """It is installed once into the toolkit's cache: pip keeps no second
    copy of its wheels (issue 39)."""
    monkeypatch.setenv("VLLM_SERIES_CACHE", str(tmp_path / "cache"))
    ran = []

    def fake_run(cmd, **kw):
        ran.append(cmd)
        lib = Path(cmd[cmd.index("--target") + 1]) / "nvidia" / "cuda_nvrtc" / "lib"
        lib.mkdir(parents=True)
        (lib / "libnvrtc.so.12").write_bytes(b"")
        return subprocess.CompletedProcess(cmd, 0, b"", b"")

    monkeypatch.setattr(build, "_run", fake_run)
    lib, _ = build.cuda12_toolchain(log=lambda *a: None)
    assert lib.is_file()
    (pip,) = ran
    assert pip[1:4] == ["-m", "pip", "install"] and "--no-cache-dir" in pip
