"""The native build: kernel discovery, arch selection, ptxas report, errors."""

from __future__ import annotations

import shutil

import pytest

from serieskit import build
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
    src = tmp_path / "tree" / build.SRC_DIR
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
    report = build.build(tree, tmp_path / "out", archs=("75",), ptx=True, log=lambda *a: None)
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
