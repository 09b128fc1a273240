"""Build the series' native code (``csrc/sm7x/``) for sm_70 / sm_75.

``--link`` also links it into a module of its own for a released vLLM wheel.

The sources live in the patched tree under ``csrc/sm7x/`` (the convention is
in that folder's README): ``*.cu`` files hold kernels and launchers without
torch headers, so each compiles with plain nvcc; ``*_sm75.cu`` files are
Turing-only; ``*_ops.cpp`` files hold the torch bindings on the libtorch
stable ABI. In a vLLM build they join ``_C_stable_libtorch``; a released
wheel's ``_C_stable_libtorch`` cannot be rebuilt, so ``--link`` builds the
same sources as the module the recipe names, which registers the same ops
into the same namespace (``torch.ops._C``) and which vLLM imports where it
exists (``CudaPlatform.import_kernels``).

What it compiles, for which architectures and with which toolchain is the
recipe's, build/recipe.toml (:mod:`.recipe`); this module holds the how.
``build`` compiles every kernel for every architecture it targets and
collects the ptxas resource usage; ``link_extension`` (needs torch with CUDA)
turns them into an importable module. On a GPU machine the same session runs
on any tree: ``python3 -m serieskit build --tree TREE --out DIR --ptx --link``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from serieskit.build import recipe
from serieskit.errors import ToolkitError, failed
from serieskit.series.base import cache_dir


@dataclass
class Kernel:
    source: str
    archs: tuple[str, ...]


@dataclass
class Usage:
    """ptxas resource usage of one function for one architecture."""

    function: str
    arch: str
    name: str = ""  # demangled, where c++filt exists
    registers: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0


@dataclass
class Report:
    nvcc: dict[str, str] = field(default_factory=dict)
    kernels: list[dict] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)
    sass: dict[str, list[str]] = field(default_factory=dict)
    # object -> function -> SASS opcode -> count (HMMA.1688.F32, LDSM, ...)
    opcodes: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    module: str | None = None

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def discover(tree: Path) -> list[Kernel]:
    """The kernels of the series, each with the recipe's architectures for it
    (Turing-only files build for sm_75 alone)."""
    native = recipe.native()
    src = tree / native.sources
    if not src.is_dir():
        return []
    kernels = []
    for path in sorted(src.glob("*.cu")):
        kernels.append(Kernel(str(path.relative_to(tree)), native.archs_of(path.name)))
    return kernels


def nvcc_archs(nvcc: str) -> set[str]:
    """Real architectures this nvcc can target, e.g. {'75', '80'}."""
    out = _run([nvcc, "--list-gpu-arch"]).stdout
    return set(re.findall(r"compute_(\d+)", out))


def nvcc_version(nvcc: str) -> str:
    out = _run([nvcc, "--version"]).stdout
    m = re.search(r"release ([\d.]+)", out)
    return m.group(1) if m else "unknown"


def gencode_flags(archs: tuple[str, ...], ptx: bool) -> list[str]:
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    ptx_arch = recipe.native().ptx_arch
    if ptx and ptx_arch in archs:
        flags.append(f"-gencode=arch=compute_{ptx_arch},code=compute_{ptx_arch}")
    return flags


_FUNC = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def parse_ptxas(text: str) -> list[Usage]:
    """Per-function resource usage from ``nvcc -Xptxas -v`` output."""
    usages: list[Usage] = []
    current: Usage | None = None
    for line in text.splitlines():
        if m := _FUNC.search(line):
            current = Usage(function=m.group(1), arch=m.group(2)[3:])
            usages.append(current)
        elif current is not None and (m := _PROPS.search(line)):
            current.stack_bytes = int(m.group(1))
            current.spill_stores = int(m.group(2))
            current.spill_loads = int(m.group(3))
        elif current is not None and (m := _USED.search(line)):
            current.registers = int(m.group(1))
            current.shared_bytes = int(m.group(2) or 0)
    return usages


def compile_kernel(
    nvcc: str,
    tree: Path,
    kernel: Kernel,
    archs: tuple[str, ...],
    ptx: bool,
    out: Path,
    extra: list[str] | None = None,
) -> tuple[Path, list[Usage]]:
    """Compile one ``.cu`` to a relocatable object; return it and its usage."""
    obj = out / (Path(kernel.source).stem + ".o")
    cmd = [
        nvcc,
        "-c",
        str(tree / kernel.source),
        "-o",
        str(obj),
        *recipe.native().nvcc_flags,
        *gencode_flags(archs, ptx),
        *(extra or []),
    ]
    proc = _run(cmd, check=False)
    if proc.returncode != 0:
        raise ToolkitError(
            f"nvcc failed on {kernel.source} for sm_{'/sm_'.join(archs)}:\n"
            + _indent(proc.stdout + proc.stderr)
        )
    return obj, parse_ptxas(proc.stdout + proc.stderr)


def cuda12_toolchain(log=print) -> tuple[Path, Path]:
    """(libnvrtc, CUDA include dir) of the cached CUDA 12 environment: for
    the architectures the local nvcc dropped (CUDA 13: Volta), the recipe's
    CUDA 12 NVRTC from PyPI, installed once (build/recipe.toml says why)."""
    packages = recipe.native().cuda12_nvrtc
    env = cache_dir().parent / "cuda12"
    site = env / "site"
    lib = site / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    include = site / "nvidia" / "cuda_runtime" / "include"
    stamp = env / "installed.txt"
    if not lib.exists() or not stamp.exists() or stamp.read_text() != "\n".join(packages):
        log(
            f"build: installing a CUDA 12 compiler ({', '.join(packages)}) from PyPI "
            f"into {env} (once, about a minute)"
        )
        shutil.rmtree(env, ignore_errors=True)
        proc = _run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-cache-dir",  # installed here once: no second copy in pip's cache
                "--target",
                str(site),
                *packages,
            ],
            check=False,
        )
        if proc.returncode != 0 or not lib.exists():
            raise failed("build: installing the CUDA 12 compiler", proc)
        stamp.write_text("\n".join(packages))
    return lib, include


# NVRTC has no C library headers; the fixed-width integer types are all the
# device code of the series needs from them.
_RTC_PRELUDE = b"""
typedef unsigned char uint8_t; typedef signed char int8_t;
typedef unsigned short uint16_t; typedef short int16_t;
typedef unsigned int uint32_t; typedef int int32_t;
typedef unsigned long long uint64_t; typedef long long int64_t;
typedef unsigned long uintptr_t;
"""


def compile_kernel_nvrtc(
    nvrtc: Path, include: Path, tree: Path, kernel: Kernel, arch: str, out: Path
) -> tuple[Path, list[Usage]]:
    """Compile one kernel file's device code to an sm_XX cubin with NVRTC."""
    import ctypes

    lib = ctypes.CDLL(str(nvrtc))
    src = (tree / kernel.source).read_bytes()
    prog = ctypes.c_void_p()
    headers = (ctypes.c_char_p * 1)(_RTC_PRELUDE)
    names = (ctypes.c_char_p * 1)(b"sm7x_rtc_prelude.h")
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, kernel.source.encode(), 1, headers, names):
        raise ToolkitError(f"NVRTC could not take {kernel.source}")
    opts = [
        f"-arch=sm_{arch}",
        "-std=c++17",
        "-lineinfo",
        "-Xptxas=-v",
        "--pre-include=sm7x_rtc_prelude.h",
        f"-I{include}",
        f"-I{(tree / kernel.source).parent}",
    ]
    arr = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    text = buf.value.decode(errors="replace")
    try:
        if rc != 0:
            raise ToolkitError(
                f"NVRTC (CUDA 12) failed on {kernel.source} for sm_{arch}:\n" + _indent(text)
            )
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, cubin)
        dest = out / f"{Path(kernel.source).stem}.sm_{arch}.cubin"
        dest.write_bytes(cubin.raw)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return dest, parse_ptxas(text.replace("ptxas         .", "    "))


def sass_summary(obj: Path) -> list[str]:
    """Machine code the object holds, per cuobjdump (absent tool: empty)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return []
    out = _run([tool, "--list-elf", "--list-ptx", str(obj)], check=False).stdout
    return sorted({line.split()[-1] for line in out.splitlines() if line.strip()})


_SASS_FUNCTION = re.compile(r"Function : (\S+)")
_SASS_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def sass_opcodes(text: str) -> dict[str, dict[str, int]]:
    """Per function of ``cuobjdump -sass`` output, how often each opcode
    (with its modifiers, e.g. ``HMMA.1688.F32``) occurs."""
    out: dict[str, dict[str, int]] = {}
    counts: dict[str, int] | None = None
    for line in text.splitlines():
        if m := _SASS_FUNCTION.search(line):
            counts = out.setdefault(m.group(1), {})
        elif counts is not None and (m := _SASS_OPCODE.search(line)):
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return out


def sass_census(obj: Path) -> dict[str, dict[str, int]]:
    """sass_opcodes of an object's machine code (empty where cuobjdump, or
    the nvdisasm it calls, is missing)."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return {}
    proc = _run([tool, "-sass", str(obj)], check=False)
    return sass_opcodes(proc.stdout) if proc.returncode == 0 else {}


def cuda_root(nvcc: str) -> Path:
    """The CUDA toolkit's root of ``nvcc`` (its headers and libraries), from
    nvcc itself: ``nvcc`` on PATH may be a wrapper script outside it."""
    try:
        proc = _run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], False)
    except ToolkitError:  # not runnable: the caller's own error says so
        return Path(nvcc).resolve().parent.parent
    m = re.search(r"^#\$ TOP=(.+)$", proc.stdout + proc.stderr, re.MULTILINE)
    return Path(m.group(1).strip()).resolve() if m else Path(nvcc).resolve().parent.parent


# The module's init: the bindings register their ops when the library loads;
# Python's import needs PyInit_<module>. What vLLM's REGISTER_EXTENSION
# (csrc/core/registration.h) expands to, written out: the GPU machine's tree
# and a wheel's build carry csrc/sm7x alone.
_MODULE_INIT = """#include <Python.h>
PyMODINIT_FUNC PyInit_{module}() {{
  static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{module}", nullptr, 0, nullptr}};
  return PyModule_Create(&def);
}}
"""


def link_extension(tree: Path, objects: list[Path], out: Path, nvcc: str) -> Path:
    """Compile the torch bindings and link them with the kernels into an
    importable module (needs torch + CUDA). The bindings use the libtorch
    stable ABI of the recipe's target version, as vLLM's ``_C_stable_libtorch``
    does, so one module serves every torch from that version on; the module is
    abi3, as vLLM's are."""
    try:
        import sysconfig

        from torch.utils import cpp_extension
    except ImportError as e:
        raise ToolkitError(f"linking {recipe.native().module} needs torch: {e}") from e
    native = recipe.native()
    cuda_home = cuda_root(nvcc)
    includes = [
        *cpp_extension.include_paths(),
        str(cuda_home / "include"),
        sysconfig.get_paths()["include"],
        str(tree / "csrc"),
    ]
    init = out / "module_init.cpp"
    init.write_text(_MODULE_INIT.format(module=native.module))
    src = tree / native.sources
    cpp_objs = []
    for cpp in [*sorted(src.glob("*.cpp")), init]:
        obj = out / (cpp.stem + ".cpp.o")
        _run_or_raise(
            [
                "c++",
                "-c",
                str(cpp),
                "-o",
                str(obj),
                "-O2",
                f"-std={native.cxx_std}",
                "-fPIC",
                *native.cxx_defines,
                *(f"-I{i}" for i in includes),
                f"-I{src}",
            ],
            f"compiling {cpp.name}",
        )
        cpp_objs.append(obj)
    so = out / f"{native.module}.abi3.so"
    libdirs = [
        *cpp_extension.library_paths(),
        str(cuda_home / "lib64"),
        str(cuda_home / "lib64" / "stubs"),
    ]
    _run_or_raise(
        [
            "c++",
            "-shared",
            "-o",
            str(so),
            *map(str, cpp_objs),
            *map(str, objects),
            *(f"-L{d}" for d in libdirs),
            *(f"-Wl,-rpath,{d}" for d in cpp_extension.library_paths()),
            # The stable ABI's C shims (aoti_torch_*) live in these.
            "-ltorch",
            "-ltorch_cpu",
            "-ltorch_cuda",
            "-lc10",
            "-lcudart",
        ],
        f"linking {so.name}",
    )
    return so


def build(
    tree: Path,
    out: Path,
    *,
    archs: tuple[str, ...] | None = None,
    ptx: bool = False,
    link: bool = False,
    nvcc: str | None = None,
    log=print,
) -> Report:
    """Compile (and optionally link) the series' native code under ``out``
    (for ``archs``, default: every architecture of the recipe)."""
    archs = archs or recipe.native().archs
    kernels = discover(tree)
    report = Report()
    if not kernels:
        log(f"build: the series has no native code yet ({recipe.native().sources}/ is empty)")
        return report
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        raise ToolkitError("build: nvcc not found (install the CUDA toolkit)")
    report.nvcc = {"path": nvcc, "version": nvcc_version(nvcc)}
    supported = nvcc_archs(nvcc)
    out.mkdir(parents=True, exist_ok=True)
    jobs, rtc_jobs = [], []
    for k in kernels:
        want = tuple(a for a in k.archs if a in archs)
        native = tuple(a for a in want if a in supported)
        if native:
            jobs.append((k, native))
        rtc_jobs += [(k, a) for a in want if a not in supported]
        if want:
            report.kernels.append({"source": k.source, "archs": list(want)})
    if rtc_jobs and link:
        missing = sorted({a for _, a in rtc_jobs})
        raise ToolkitError(
            f"build: {nvcc} (CUDA {report.nvcc['version']}) cannot target "
            f"sm_{', sm_'.join(missing)}: linking a module for it needs a CUDA 12.x nvcc "
            "on PATH (or leave --link out to compile-check through CUDA 12 NVRTC)"
        )
    if jobs:
        log(
            f"build: compiling {len(jobs)} kernel file(s) with {nvcc} "
            f"(CUDA {report.nvcc['version']}), {os.cpu_count() or 2} at a time"
        )
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda j: compile_kernel(nvcc, tree, j[0], j[1], ptx, out), jobs))
    if rtc_jobs:
        missing = sorted({a for _, a in rtc_jobs})
        log(
            f"build: {nvcc} (CUDA {report.nvcc['version']}) cannot target "
            f"sm_{', sm_'.join(missing)}; compiling for it through CUDA 12 NVRTC"
        )
        lib, include = cuda12_toolchain(log)
        report.nvcc["nvrtc"] = recipe.native().cuda12_nvrtc[0]
        results += [compile_kernel_nvrtc(lib, include, tree, k, a, out) for k, a in rtc_jobs]
    objects = [obj for obj, _ in results[: len(jobs)]]
    names = _demangle([u.function for _, usage in results for u in usage])
    sources = [k for k, _ in jobs] + [k for k, _ in rtc_jobs]
    for k, (obj, usage) in zip(sources, results, strict=True):
        report.usage.extend(usage)
        report.sass[obj.name] = sass_summary(obj)
        if census := sass_census(obj):
            report.opcodes[obj.name] = census
        for u in usage:
            u.name = names.get(u.function, u.function)
            log(
                f"  {k.source} sm_{u.arch} {_short(u.name)}: "
                f"{u.registers} regs, {u.shared_bytes} B smem, "
                f"{u.stack_bytes} B stack, spills {u.spill_stores}/{u.spill_loads}"
            )
    if link:
        report.module = str(link_extension(tree, objects, out, nvcc))
        log(f"build: linked {report.module}")
    return report


def full_build(tree: Path, log=print) -> None:
    """Build and install the whole patched vLLM for the recipe's architectures
    (with the series' own extension), into the current environment. Needs
    torch with CUDA and an nvcc that targets them all (CUDA 12.x)."""
    native = recipe.native()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise ToolkitError("build --full: nvcc not found (install CUDA 12.x)")
    missing = [a for a in native.archs if a not in nvcc_archs(nvcc)]
    if missing:
        raise ToolkitError(
            f"build --full: {nvcc} (CUDA {nvcc_version(nvcc)}) cannot "
            f"target sm_{', sm_'.join(missing)}: put a CUDA 12.x nvcc first on PATH"
        )
    env = dict(os.environ, **dict(native.full_env), TORCH_CUDA_ARCH_LIST=native.full_arch_list)
    log(
        f"build --full: pip install --no-build-isolation {tree} for "
        f'TORCH_CUDA_ARCH_LIST="{native.full_arch_list}" (a whole vLLM build: tens of minutes)'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-v", "--no-build-isolation", str(tree)], env=env
    )
    if proc.returncode != 0:
        raise ToolkitError(f"build --full: pip install failed (exit {proc.returncode})")


def _demangle(symbols: list[str]) -> dict[str, str]:
    """Readable kernel names: the function name without namespaces and
    parameters (mangled names of kernels in anonymous namespaces all share a
    long prefix). Empty where c++filt is missing."""
    tool = shutil.which("c++filt")
    if tool is None or not symbols:
        return {}
    out = subprocess.run(
        [tool], input="\n".join(symbols), capture_output=True, text=True
    ).stdout.splitlines()
    short = {}
    for sym, full in zip(symbols, out, strict=False):  # c++filt may stop early
        head = full.replace("(anonymous namespace)::", "").split("(", 1)[0]
        short[sym] = head.rsplit("::", 1)[-1] if "::" in head else head
    return short


def _short(name: str) -> str:
    return name if len(name) <= 60 else name[:57] + "..."


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a tool; with ``check``, a failure is a ToolkitError with its reason."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise ToolkitError(f"build: cannot run {cmd[0]}: {e}") from None
    if check and proc.returncode != 0:
        raise failed(f"build: {Path(cmd[0]).name} {' '.join(cmd[1:2])}", proc)
    return proc


def _run_or_raise(cmd: list[str], what: str) -> None:
    proc = _run(cmd, check=False)
    if proc.returncode != 0:
        raise ToolkitError(f"build: {what} failed:\n{_indent(proc.stdout + proc.stderr)}")


def _indent(text: str) -> str:
    """A tool's own output under an error line (shown whole: a compiler's
    first error is the one that matters)."""
    return "\n".join(f"  {line}" for line in text.rstrip().splitlines())


def session(
    tree: Path,
    out: Path,
    *,
    archs: tuple[str, ...] | None = None,
    ptx: bool = False,
    link: bool = False,
    report: Path | None = None,
    log=print,
) -> Report:
    """``nox -s build``: compile (and link) under ``out``; write the JSON report;
    put a linked module into the tree (vLLM's .gitignore ignores ``*.so``)."""
    result = build(tree, out, archs=archs, ptx=ptx, link=link, log=log)
    if result.kernels and report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(result.to_json())
        log(f"build: report {report}")
    if result.module:
        shutil.copy2(result.module, tree / "vllm" / Path(result.module).name)
        log(f"build: {Path(result.module).name} copied into {tree / 'vllm'}")
    return result
