"""The build's recipes, read from the toolkit's data files: build/ and overlays/.

``build/recipe.toml`` says what the native build compiles and with what;
``overlays/gpu.toml`` what an overlay for the GPU machine is made from. The
code in this package holds only the how; a malformed or missing recipe is
one ``error:`` line that names the file and the key.
"""

from __future__ import annotations

import fnmatch
import functools
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from serieskit.errors import ToolkitError

ROOT = Path(__file__).resolve().parents[2]
BUILD = "build/recipe.toml"
GPU = "overlays/gpu.toml"


@dataclass(frozen=True)
class Native:
    """``build/recipe.toml``: the series' extension, its toolchain, ``--full``."""

    sources: str
    module: str
    archs: tuple[str, ...]
    ptx_arch: str
    nvcc_flags: tuple[str, ...]
    cxx_std: str  # -std= of the torch bindings
    cxx_defines: tuple[str, ...]  # -D flags of the torch bindings (stable ABI, abi3)
    kernels: tuple[tuple[str, tuple[str, ...]], ...]  # (file name glob, archs), in order
    cuda12_nvrtc: tuple[str, ...]
    full_arch_list: str
    full_env: tuple[tuple[str, str], ...]

    def archs_of(self, file_name: str) -> tuple[str, ...]:
        """The architectures of one kernel file: its first matching pattern's."""
        for pattern, archs in self.kernels:
            if fnmatch.fnmatchcase(file_name, pattern):
                return archs
        raise ToolkitError(
            f"{BUILD} gives no architectures for {self.sources}/{file_name}: "
            "add a pattern for it under [native.kernels]"
        )


@dataclass(frozen=True)
class Gpu:
    """``overlays/gpu.toml``: the GPU machine's loads, made from a released wheel."""

    wheel: str
    core: str
    flash_attn_dir: str
    flash_attn_skip: str
    part_bytes: int  # what one part may hold (a run carries the working tree too)
    piece_bytes: int  # the core module's pieces, where it is larger than a part
    python: str
    image: tuple[str, ...]  # the machine image's Python packages (names)
    wheels: tuple[str, ...]  # what the load carries (pip requirement specs)
    platforms: tuple[str, ...]
    image_builds: tuple[str, ...]  # vLLM requirements the image builds itself (torch)
    lazy_gpu: tuple[tuple[str, str], ...]  # (distribution, module) imported only on demand
    check_torch: tuple[str, ...]  # the torch of gpu/check_pack_imports.py's environment


def _load(rel: str) -> dict:
    path = ROOT / rel
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ToolkitError(f"{rel} is missing: the toolkit's checkout is incomplete") from None
    except tomllib.TOMLDecodeError as e:
        raise ToolkitError(f"{rel} is malformed: {e}") from None


def _get(data: dict, rel: str, keys: tuple[str, ...], kind: type) -> object:
    """``data[k1][k2]...``, of ``kind`` (a list: of strings), or an error naming it."""
    node: object = data
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            raise ToolkitError(f"{rel} lacks {'.'.join(keys)}")
        node = node[key]
    strings = kind is not list or all(isinstance(x, str) for x in node)  # type: ignore[attr-defined]
    if not isinstance(node, kind) or not strings:
        what = "a list of strings" if kind is list else f"a {kind.__name__}"
        raise ToolkitError(f"{rel}: {'.'.join(keys)} is not {what}")
    return node


@functools.cache
def native() -> Native:
    data = _load(BUILD)

    def get(key: str, kind: type = str):
        return _get(data, BUILD, tuple(key.split(".")), kind)

    kernels = get("native.kernels", dict)
    for pattern in kernels:
        _get(data, BUILD, ("native", "kernels", pattern), list)
    return Native(
        sources=get("native.sources"),
        module=get("native.module"),
        archs=tuple(get("native.archs", list)),
        ptx_arch=get("native.ptx_arch"),
        nvcc_flags=tuple(get("native.nvcc_flags", list)),
        cxx_std=get("native.cxx_std"),
        cxx_defines=tuple(get("native.cxx_defines", list)),
        kernels=tuple((p, tuple(a)) for p, a in kernels.items()),
        cuda12_nvrtc=tuple(get("toolchain.cuda12_nvrtc.packages", list)),
        full_arch_list=get("full.torch_cuda_arch_list"),
        full_env=tuple(sorted(get("full.env", dict).items())),
    )


CALL_BYTES = 64 * 2**20  # what one device call carries, the working tree included
MARGIN = 2**19  # kept free in every call
# The results files a sitting writes into the tree before its later calls.
RESULTS_HEADROOM = 2 * 2**20


def _slack(g: Gpu) -> int:
    """What a part holds beside a piece of the core module (its SOURCE):
    the config's difference between the two sizes."""
    return max(g.part_bytes - g.piece_bytes, 2**16)


def fitted(g: Gpu, tree_bytes: int) -> Gpu:
    """``g`` with parts and pieces no larger than what a call leaves beside
    a working tree of ``tree_bytes`` (the config's sizes are upper bounds)."""
    room = CALL_BYTES - MARGIN - RESULTS_HEADROOM - tree_bytes
    if room < 8 * 2**20:
        raise ToolkitError(
            f"gpu: the working tree is {tree_bytes / 2**20:.1f} MiB: a device call "
            f"({CALL_BYTES // 2**20} MiB) has too little room left for the GPU load's parts"
        )
    part = min(g.part_bytes, room)
    # A part holding a piece holds its SOURCE too: the config's slack stays.
    return replace(g, part_bytes=part, piece_bytes=min(g.piece_bytes, part - _slack(g)))


@functools.cache
def gpu() -> Gpu:
    data = _load(GPU)

    def get(key: str, kind: type = str):
        return _get(data, GPU, tuple(key.split(".")), kind)

    lazy = get("serve.lazy_gpu", dict)
    for dist in lazy:
        _get(data, GPU, ("serve", "lazy_gpu", dist), str)
    return Gpu(
        wheel=get("wheel.file"),
        core=get("wheel.core"),
        flash_attn_dir=get("wheel.flash_attn_dir"),
        flash_attn_skip=get("wheel.flash_attn_skip"),
        part_bytes=get("machine.part_mib", int) * 2**20,
        piece_bytes=get("machine.piece_mib", int) * 2**20,
        python=get("machine.python"),
        image=tuple(get("machine.image", list)),
        wheels=tuple(get("machine.wheels", list)),
        platforms=tuple(get("machine.platforms", list)),
        image_builds=tuple(get("serve.image_builds", list)),
        lazy_gpu=tuple(lazy.items()),
        check_torch=tuple(get("serve.check.torch", list)),
    )
