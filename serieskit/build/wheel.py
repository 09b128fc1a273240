"""An installable wheel of vLLM with the series (``nox -s wheel``).

``dist/vllm-<base>+series.g<commit>-<tags>.whl`` is assembled directly: a
wheel is a zip file whose ``.dist-info`` folder holds METADATA, WHEEL and
RECORD (every file with its sha256). Three inputs, each checked before a byte
is written:

- the released wheel of the base version, checked against the sha256 that
  ``build/wheel.toml`` records for it (and its RECORD against that file's
  recorded sha256): its compiled modules and every other file vLLM's build
  generates are copied as they are, compressed data included (no
  recompression);
- the patched Python tree: the commit of ``.work/vllm`` with the whole series
  applied and nothing uncommitted, or (``--tree``) a tree assembled on the
  GPU machine with the overlay packer's stamps, whose files the stamps' blob
  ids check. Every file the series does not change must be the released
  wheel's own (RECORD's sha256): the wheel is the release plus the series,
  nothing else;
- ``vllm/_sm7x_C_stable_libtorch.abi3.so``, linked by this session for sm_75 (and sm_70 where
  the local nvcc targets it, CUDA 12.x) against this Python's torch, unless
  ``--no-module``: the wheel then says in its version (``.nosm7x``) that the
  extension is absent, and the series' kernels stay off.

Where the whole released wheel cannot travel (the GPU machine takes 64 MiB a
run), ``--release`` names a folder with its dist-info (``pack_release``
writes it into the GPU machine's load) and the compiled members are taken
from the assembled tree, each checked against RECORD; those not carried are
left out, listed in ``vllm/_series.json``, and the version says ``.partial``.

Why not upstream's precompiled path (``VLLM_USE_PRECOMPILED=1`` with
``VLLM_PRECOMPILED_WHEEL_LOCATION``): its setup.py extracts a fixed list of
members from the released wheel and then skips every native build
(``precompiled_build_ext``), so ``_sm7x_C_stable_libtorch`` is neither built nor packaged; it
needs the build requirements (torch 2.14.0, setuptools-scm, setuptools-rust,
cmake) in the build environment, which the GPU machine lacks without
network; it names the result ``+precompiled`` or after ``git describe``, and
it checks no sha256. docs/serve-on-turing.md says the same for users.

The wheel is written to a temporary file in the destination folder and
renamed when complete; a failure removes it, so ``dist/`` never holds half a
wheel.

This module plans and assembles it; its parts are :mod:`.wheel_release`
(the released wheel), :mod:`.wheel_tree` (the series' files),
:mod:`.wheel_zip` (the file itself) and :mod:`.wheel_verify` (``--verify``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from serieskit import git
from serieskit.build import build, recipe
from serieskit.build.overlay import LOADER, loader_entry_points
from serieskit.build.wheel_release import (
    DIST_INFO_FILES,
    Entry,
    ReleaseSource,
    open_release,
    read_release,
    record_digest,
)
from serieskit.build.wheel_tree import (
    SERIES_INFO,
    SeriesTree,
    assembled_tree,
    module_file,
    work_tree,
)
from serieskit.build.wheel_verify import verify_install
from serieskit.build.wheel_zip import clear_leftovers, record_file, write_atomically, write_zip
from serieskit.errors import ToolkitError
from serieskit.series import base, target
from serieskit.series.target import Target

SCHEMA = "vllm-series-wheel/1"
VERSION_FILE = "vllm/_version.py"
DIST = "dist"
# What the wheel names its extension's absence and a release not carried whole by.
NO_MODULE_LABEL = "nosm7x"
PARTIAL_LABEL = "partial"


NO_MODULE_HINT = (
    "or pass --no-module for a wheel without vllm._sm7x_C_stable_libtorch (the series' Turing "
    "kernels then stay off)"
)


# --- what goes in --------------------------------------------------------------------


@dataclass
class Plan:
    entries: dict[str, Entry]
    omitted: list[str]  # released members not at hand (the GPU machine's)


def plan(tree: SeriesTree, source: ReleaseSource) -> Plan:
    """The files of the wheel: the series' tree where it changes the release,
    the release's own files elsewhere (each of the tree's checked against
    RECORD), vLLM's generated files from the release."""
    dist_info = source.release.dist_info + "/"
    entries: dict[str, Entry] = {}
    for path, (mode, read) in sorted(tree.files.items()):
        if path in (VERSION_FILE, SERIES_INFO, module_file()):
            continue  # written by the wheel itself
        if path in tree.changed:
            entries[path] = Entry.of(path, read(), mode)
            continue
        rec = source.record.get(path)
        if rec is None:
            raise ToolkitError(
                f"wheel: {tree.label} holds {path}, which neither the released vLLM "
                f"{source.release.version} wheel has nor the series adds: commit it to its "
                "patch, or remove it"
            )
        data = read()
        if record_digest(data) != rec.digest:
            raise ToolkitError(
                f"wheel: {path} in {tree.label} differs from the released wheel's, and the "
                f"series does not change it: the tree is not vLLM {source.release.version} "
                "plus the series"
            )
        entries[path] = source.reuse(path) or Entry.of(path, data, mode)
    omitted = []
    for path in sorted(source.record):
        if path in entries or path == VERSION_FILE or path.startswith(dist_info):
            continue
        if path in tree.deleted:
            continue  # the series removes it
        entry = source.entry(path)
        if entry is None:
            omitted.append(path)
        else:
            entries[path] = entry
    return Plan(entries, omitted)


def local_version(version: str, commit: str, module: bool, partial: bool) -> str:
    """``0.33.0+series.g<12 hex>`` (the ``g`` as in ``git describe``: a local
    label of digits only would be read as a number), ``.nosm7x`` without the
    extension, ``.partial`` where released members were left out."""
    label = f"series.g{commit[:12]}"
    label += "" if module else f".{NO_MODULE_LABEL}"
    label += f".{PARTIAL_LABEL}" if partial else ""
    return f"{version}+{label}"


def version_py(version: str, commit: str) -> bytes:
    head, _, local = version.partition("+")
    numbers = tuple(int(x) if x.isdigit() else x for x in head.split("."))
    return (
        "# The version of this wheel: a released vLLM with the series "
        "(serieskit wheel; vllm/_series.json).\n"
        "__all__ = [\n"
        '    "__version__",\n    "__version_tuple__",\n    "version",\n'
        '    "version_tuple",\n    "__commit_id__",\n    "commit_id",\n]\n\n'
        f"__version__ = version = {version!r}\n"
        f"__version_tuple__ = version_tuple = {(*numbers, local)!r}\n\n"
        f"__commit_id__ = commit_id = {commit[:12]!r}\n"
    ).encode()


def metadata(released: bytes, version: str, note: str) -> bytes:
    """The release's METADATA with this wheel's version, the series named in
    the summary and a first paragraph of the description."""
    text = released.decode()
    head, sep, body = text.partition("\n\n")
    lines = head.split("\n")
    found = [i for i, line in enumerate(lines) if line.startswith("Version: ")]
    if len(found) != 1:
        raise ToolkitError("wheel: the released METADATA has no single Version line")
    lines[found[0]] = f"Version: {version}"
    lines = [
        f"{line} (with the Turing / no-P2P prefill series)"
        if line.startswith("Summary: ")
        else line
        for line in lines
    ]
    return ("\n".join(lines) + "\n\n" + note + "\n\n" + body).encode()


def wheel_file(tags: tuple[str, str, str]) -> bytes:
    return (
        "Wheel-Version: 1.0\n"
        "Generator: serieskit (vLLM series toolkit)\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {'-'.join(tags)}\n"
    ).encode()


# --- vllm._sm7x_C_stable_libtorch ---------------------------------------------------


@dataclass(frozen=True)
class Module:
    path: Path
    info: dict


def _torch_with_cuda() -> tuple[str, str]:
    try:
        import torch
    except ImportError:
        raise ToolkitError(
            f"wheel: linking vllm._sm7x_C_stable_libtorch needs torch with CUDA in this Python "
            f"({sys.executable}): run the session where the torch you serve with is "
            f"installed, {NO_MODULE_HINT}"
        ) from None
    if not torch.version.cuda:
        raise ToolkitError(
            f"wheel: torch {torch.__version__} in {sys.executable} has no CUDA: linking "
            f"vllm._sm7x_C_stable_libtorch needs a CUDA build of torch, {NO_MODULE_HINT}"
        )
    return str(torch.__version__), str(torch.version.cuda)


def sources_digest(folder: Path) -> str:
    """One sha256 over the extension's sources (names and contents)."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f.relative_to(folder).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def build_module(tree: Path, out: Path, ptx: bool, log=print) -> Module:
    """Link ``_sm7x_C_stable_libtorch`` from ``tree``'s csrc/sm7x for sm_75 (and sm_70 where
    nvcc targets it) against this Python's torch; a build of the same sources
    with the same toolchain, whose file is unchanged, is reused."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise ToolkitError(
            "wheel: no CUDA toolkit (nvcc not found on PATH): "
            "vllm._sm7x_C_stable_libtorch is compiled here; install the CUDA toolkit "
            "(12.x builds sm_70 and sm_75, 13.x sm_75 only) "
            f"and torch with CUDA, {NO_MODULE_HINT}"
        )
    src = tree / recipe.native().sources
    if not build.discover(tree):
        raise ToolkitError(f"wheel: {src} holds no kernels: {NO_MODULE_HINT.removeprefix('or ')}")
    torch_version, cuda = _torch_with_cuda()
    nvcc_version = build.nvcc_version(nvcc)
    archs = tuple(a for a in recipe.native().archs if a in build.nvcc_archs(nvcc))
    if "75" not in archs:
        raise ToolkitError(f"wheel: {nvcc} (CUDA {nvcc_version}) cannot target sm_75")
    if "70" not in archs:
        log(f"wheel: sm_70 left out: {nvcc} (CUDA {nvcc_version}) cannot target it (CUDA 12.x can)")
    wanted = {
        "file": module_file(),
        "sources": sources_digest(src),
        "archs": [f"sm_{a}" for a in archs],
        "ptx": "compute_75" if ptx else None,
        "torch": torch_version,
        "cuda": cuda,
        "nvcc": nvcc_version,
    }
    so, stamp = out / f"{recipe.native().module}.abi3.so", out / "module.json"
    if so.is_file() and stamp.is_file():
        done = json.loads(stamp.read_text())
        if {k: done.get(k) for k in wanted} == wanted and done.get("sha256") == base.sha256_of(so):
            log(f"wheel: {so} is built from these sources with this toolchain: reused")
            return Module(so, done)
    shutil.rmtree(out, ignore_errors=True)  # the session's own build folder
    try:
        report = build.build(tree, out, archs=archs, ptx=ptx, link=True, nvcc=nvcc, log=log)
    except ToolkitError as e:
        first, _, details = str(e).partition("\n")
        raise ToolkitError(
            f"wheel: linking vllm._sm7x_C_stable_libtorch failed ({first}): fix the toolchain "
            f"(CUDA headers and libraries under {build.cuda_root(nvcc)}), {NO_MODULE_HINT}"
            + (f"\n{details}" if details else "")
        ) from None
    if not report.module:
        raise ToolkitError(f"wheel: no module was linked from {src}")
    info = {**wanted, "sha256": base.sha256_of(so)}
    stamp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return Module(so, info)


# --- the session -------------------------------------------------------------------


def toolkit_commit(root: Path) -> str | None:
    proc = (
        git.run(root, "rev-parse", "--verify", "--quiet", "HEAD")
        if (root / ".git").exists()
        else None
    )
    return (
        proc.stdout.decode().strip() or None if proc is not None and proc.returncode == 0 else None
    )


def assemble(
    tree: SeriesTree,
    source: ReleaseSource,
    module: Module | None,
    dist: Path,
    toolkit: str | None = None,
    p: Plan | None = None,
    log=print,
) -> Path:
    """Write the wheel into ``dist`` (atomically); return its path."""
    p = p or plan(tree, source)
    rel = source.release
    commit = tree.series["commit"]
    version = local_version(rel.version, commit, module is not None, bool(p.omitted))
    py, abi, plat = rel.tags
    tags = (py, abi, "linux_x86_64" if module is not None else plat)
    name = f"vllm-{version}-{'-'.join(tags)}.whl"
    info = {
        "schema": SCHEMA,
        "version": version,
        "base": f"vllm=={rel.version}",
        "series": tree.series,
        "released_wheel": {
            "file": rel.file,
            "sha256": rel.sha256,
            "record_sha256": rel.record_sha256,
            "omitted": p.omitted,
        },
        "sm7x_C": module.info if module is not None else None,
        "toolkit_commit": toolkit,
    }
    entries = dict(p.entries)
    entries[VERSION_FILE] = Entry.of(VERSION_FILE, version_py(version, commit))
    entries[SERIES_INFO] = Entry.of(
        SERIES_INFO, (json.dumps(info, indent=2, sort_keys=True) + "\n").encode()
    )
    if module is not None:
        data = module.path.read_bytes()
        if hashlib.sha256(data).hexdigest() != module.info["sha256"]:
            raise ToolkitError(
                f"wheel: {module.path} is not the module this session linked (its sha256 "
                "changed since): run the session again"
            )
        entries[module_file()] = Entry.of(module_file(), data, 0o755)
        # vLLM imports no such module: the toolkit's loader does, as a vLLM
        # general plugin that the dist-info's entry_points.txt declares.
        entries[LOADER.name] = Entry.of(LOADER.name, LOADER.read_bytes())
    note = (
        f"**This wheel is vLLM {rel.version} with the Turing / no-P2P prefill series**, "
        f"series commit {commit} (vllm/_series.json), assembled by the series toolkit from "
        f"the released wheel {rel.file} (sha256 {rel.sha256}) and the patched Python tree; "
        + (
            f"vllm._sm7x_C_stable_libtorch linked for {', '.join(module.info['archs'])} "
            f"against torch {module.info['torch']} (stable ABI of torch 2.11)."
            if module is not None
            else "without vllm._sm7x_C_stable_libtorch: the series' Turing kernels are absent."
        )
        + (f" {len(p.omitted)} released files were not carried (see omitted)." if p.omitted else "")
    )
    dist_info = f"vllm-{version}.dist-info"
    ordered = [entries[k] for k in sorted(entries)]
    own = dict(source.meta)
    if module is not None:
        own["entry_points.txt"] = (
            own["entry_points.txt"].rstrip(b"\n") + b"\n\n" + loader_entry_points().encode()
        )
        own["top_level.txt"] = own["top_level.txt"].rstrip(b"\n") + b"\nvllm_sm7x_loader\n"
    meta = [
        Entry.of(f"{dist_info}/METADATA", metadata(source.meta["METADATA"], version, note)),
        Entry.of(f"{dist_info}/WHEEL", wheel_file(tags)),
        *(Entry.of(f"{dist_info}/{n}", own[n]) for n in DIST_INFO_FILES if n != "METADATA"),
    ]
    ordered += meta
    record = Entry.of(f"{dist_info}/RECORD", record_file(ordered, f"{dist_info}/RECORD"))

    def fill(f: BinaryIO) -> None:
        write_zip(f, [*ordered, record], source)

    dest = dist / name
    clear_leftovers(dist, log)
    write_atomically(dest, fill)
    log(
        f"wheel: {dest} ({dest.stat().st_size / 2**20:.0f} MiB, {len(ordered) + 1} files; "
        + (
            f"vllm._sm7x_C_stable_libtorch for {', '.join(module.info['archs'])}"
            if module
            else "no vllm._sm7x_C_stable_libtorch"
        )
        + (f"; {len(p.omitted)} released files not carried" if p.omitted else "")
        + ")"
    )
    return dest


def session(
    where: Path | Target,
    *,
    tree: Path | None = None,
    release: Path | None = None,
    dist: Path | None = None,
    module: bool = True,
    ptx: bool = False,
    verify: bool = False,
    log=print,
) -> Path:
    """``nox -s wheel``: check every input, link the extension (unless
    ``module`` is False), write the wheel; ``verify`` then installs it into a
    fresh virtual environment and checks it there (CPU)."""
    t = target.of(where)
    start = time.perf_counter()
    series_tree = assembled_tree(tree.resolve()) if tree is not None else work_tree(t)
    if series_tree.version != t.version:
        raise ToolkitError(
            f"wheel: {series_tree.label} sits on vLLM {series_tree.version}, the target on "
            f"{t.version}: pass --port {series_tree.version} or the matching tree"
        )
    rel = read_release(t.root, t.version)
    source = open_release(rel, release, series_tree.root, log=log)
    try:
        files = plan(series_tree, source)  # every file checked before the slow part
        built = (
            build_module(series_tree.root, t.out("wheel") / "sm7x", ptx, log=log)
            if module
            else None
        )
        out = assemble(
            series_tree,
            source,
            built,
            dist or t.root / DIST,
            toolkit=toolkit_commit(t.root),
            p=files,
            log=log,
        )
    finally:
        source.close()
    log(f"wheel: written in {time.perf_counter() - start:.1f} s")
    if verify:
        verify_install(out, log=log)
    return out
