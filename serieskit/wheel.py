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
- ``vllm/_sm7x_C.abi3.so``, linked by this session for sm_75 (and sm_70 where
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
(``precompiled_build_ext``), so ``_sm7x_C`` is neither built nor packaged; it
needs the build requirements (torch 2.14.0, setuptools-scm, setuptools-rust,
cmake) in the build environment, which the GPU machine lacks without
network; it names the result ``+precompiled`` or after ``git describe``, and
it checks no sha256. docs/serve-on-turing.md says the same for users.

The wheel is written to a temporary file in the destination folder and
renamed when complete; a failure removes it, so ``dist/`` never holds half a
wheel.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from serieskit import base, build, claims, git, results, target
from serieskit.errors import ToolkitError, failed, last_line
from serieskit.state import State
from serieskit.target import Target

RELEASES = "build/wheel.toml"
SCHEMA = "vllm-series-wheel/1"
SERIES_INFO = "vllm/_series.json"
VERSION_FILE = "vllm/_version.py"
MODULE = f"vllm/{build.MODULE}.abi3.so"
DIST = "dist"
# The released dist-info files the series' wheel keeps (RECORD is rewritten).
DIST_INFO_FILES = ("METADATA", "entry_points.txt", "top_level.txt", "licenses/LICENSE")
# What the wheel names its extension's absence and a release not carried whole by.
NO_MODULE_LABEL = "nosm7x"
PARTIAL_LABEL = "partial"
CHECK_SCRIPT = Path(__file__).with_name("wheel_check.py")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

NO_MODULE_HINT = (
    "or pass --no-module for a wheel without vllm._sm7x_C (the series' Turing "
    "kernels then stay off)"
)


# --- the released wheel ----------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """A released vLLM wheel as build/wheel.toml records it."""

    version: str
    file: str
    sha256: str
    record_sha256: str

    @property
    def dist_info(self) -> str:
        return f"vllm-{self.version}.dist-info"

    @property
    def tags(self) -> tuple[str, str, str]:
        """(python, abi, platform) tags of the released file's name."""
        parts = self.file.removesuffix(".whl").split("-")
        return parts[-3], parts[-2], parts[-1]


def read_release(root: Path, version: str) -> Release:
    path = root / RELEASES
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ToolkitError(
            f"wheel: {path} is missing: it records the released wheels the series' wheel reuses"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ToolkitError(f"{path} is not valid TOML: {e}") from None
    table = data.get("release", {}).get(version)
    if not isinstance(table, dict):
        raise ToolkitError(
            f'wheel: {path} has no [release."{version}"] table: record the released '
            f"wheel of vLLM {version} there (file, sha256, record_sha256) first"
        )
    file, sha, record = (table.get(k) for k in ("file", "sha256", "record_sha256"))
    if not (
        isinstance(file, str) and file.startswith(f"vllm-{version}-") and file.endswith(".whl")
    ):
        raise ToolkitError(f"{path}: release {version}: file must be vllm-{version}-TAGS.whl")
    for key, value in (("sha256", sha), ("record_sha256", record)):
        if not (isinstance(value, str) and _SHA256.match(value)):
            raise ToolkitError(f"{path}: release {version}: {key} must be 64 hex digits")
    return Release(version, file, str(sha), str(record))


@dataclass(frozen=True)
class Recorded:
    """One line of a RECORD: the file's sha256 (urlsafe base64, as RECORD
    writes it) and size."""

    digest: str
    size: int


def record_digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def parse_record(text: str, where: str) -> dict[str, Recorded]:
    out: dict[str, Recorded] = {}
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if len(row) != 3:
            raise ToolkitError(f"wheel: {where}: a line is not PATH,HASH,SIZE: {row!r}")
        path, digest, size = row
        if not digest:  # RECORD's own line
            continue
        algorithm, _, value = digest.partition("=")
        if algorithm != "sha256" or not value or not size.isdigit():
            raise ToolkitError(f"wheel: {where}: {path} has no sha256 and size: {row!r}")
        out[path] = Recorded(value, int(size))
    return out


@dataclass
class Entry:
    """One file of the wheel: bytes to compress, or compressed data copied
    from the released wheel as it is."""

    path: str
    mode: int = 0o644
    data: bytes | None = None
    raw: zipfile.ZipInfo | None = None
    digest: str = ""  # RECORD's sha256 of the content
    size: int = 0

    @classmethod
    def of(cls, path: str, data: bytes, mode: int = 0o644) -> Entry:
        return cls(path, mode, data=data, digest=record_digest(data), size=len(data))


class ReleaseSource:
    """What the wheel takes from the release: its RECORD, its dist-info files
    and the members vLLM's build generates."""

    release: Release
    record: dict[str, Recorded]
    meta: dict[str, bytes]

    def entry(self, path: str) -> Entry | None:
        """The released member ``path``, checked; None where it is not here."""
        raise NotImplementedError

    def reuse(self, path: str) -> Entry | None:
        """The released member ``path`` as it is, where that is cheaper than
        compressing the tree's identical file again."""
        return None

    def close(self) -> None:
        pass

    def _take_record(self, data: bytes, where: str) -> None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.release.record_sha256:
            raise ToolkitError(
                f"wheel: the RECORD of {where} has sha256 {digest}, {RELEASES} records "
                f"{self.release.record_sha256}: not the released vLLM {self.release.version} "
                f"wheel ({self.release.file})"
            )
        self.record = parse_record(data.decode(), f"{where} RECORD")


class ReleasedWheel(ReleaseSource):
    """The released wheel file, checked against its recorded sha256; its
    members are copied compressed, as they are."""

    def __init__(self, path: Path, release: Release, digest: str | None = None):
        self.release, self.path = release, path
        digest = digest or base.sha256_of(path)
        if digest != release.sha256:
            raise ToolkitError(
                f"wheel: {path} has sha256 {digest}, {RELEASES} records {release.sha256} "
                f"for {release.file}: not the released wheel (a partial download or "
                "another build): remove it and run again"
            )
        try:
            self.zip = zipfile.ZipFile(path)
        except zipfile.BadZipFile as e:
            raise ToolkitError(f"wheel: {path} is not a zip file: {e}") from None
        self.infos = {i.filename: i for i in self.zip.infolist()}
        self._take_record(self._read(f"{release.dist_info}/RECORD"), str(path))
        self.meta = {n: self._read(f"{release.dist_info}/{n}") for n in DIST_INFO_FILES}

    def _read(self, name: str) -> bytes:
        if name not in self.infos:
            raise ToolkitError(f"wheel: {self.path} has no {name}: not a vLLM wheel")
        return self.zip.read(name)

    def entry(self, path: str) -> Entry | None:
        info = self.infos.get(path)
        if info is None:
            return None
        rec = self.record[path]
        mode = (info.external_attr >> 16) & 0o777 or 0o644
        return Entry(path, mode, raw=info, digest=rec.digest, size=rec.size)

    def reuse(self, path: str) -> Entry | None:
        return self.entry(path)

    def close(self) -> None:
        self.zip.close()


class ReleaseFolder(ReleaseSource):
    """Part of the release, where the whole wheel cannot travel: a folder with
    its dist-info (RECORD checked against its recorded sha256) and the members
    carried beside it; members are looked up there, then in ``tree``, and each
    is checked against RECORD when taken."""

    def __init__(self, folder: Path, release: Release, tree: Path):
        self.release, self.folder, self.tree = release, folder, tree
        info = folder / release.dist_info
        if not (info / "RECORD").is_file():
            raise ToolkitError(
                f"wheel: {folder} holds no {release.dist_info}/RECORD: --release takes the "
                "released wheel or the folder that `nox -s overlay -- --gpu` packs "
                "(part2/release.tar.xz, unpacked)"
            )
        self._take_record((info / "RECORD").read_bytes(), str(info))
        missing = [n for n in DIST_INFO_FILES if not (info / n).is_file()]
        if missing:
            raise ToolkitError(f"wheel: {info} lacks {', '.join(missing)}")
        self.meta = {n: (info / n).read_bytes() for n in DIST_INFO_FILES}

    def entry(self, path: str) -> Entry | None:
        rec = self.record.get(path)
        for where in (self.folder, self.tree):
            f = where / path
            if rec is not None and f.is_file():
                data = f.read_bytes()
                if record_digest(data) != rec.digest:
                    raise ToolkitError(
                        f"wheel: {f} differs from the released wheel's {path} (RECORD's "
                        "sha256): a damaged or foreign file"
                    )
                return Entry.of(path, data, 0o755 if os.access(f, os.X_OK) else 0o644)
        return None


def open_release(rel: Release, path: Path | None, tree_root: Path, log=print) -> ReleaseSource:
    """The released wheel (``path``, or downloaded once into the toolkit's
    cache), or a folder of its dist-info (``path`` a folder)."""
    if path is not None:
        if path.is_dir():
            return ReleaseFolder(path, rel, tree_root)
        if not path.is_file():
            raise ToolkitError(f"wheel: --release {path} does not exist")
        return ReleasedWheel(path, rel)
    try:
        cached, digest = base.fetch(rel.file, rel.version, log=log)
    except ToolkitError as e:
        raise ToolkitError(
            f"wheel: the released wheel {rel.file} could not be fetched ({e}): download it "
            f"(pip download vllm=={rel.version} --no-deps --only-binary=:all: -d DIR) and "
            "pass --release DIR/" + rel.file
        ) from None
    return ReleasedWheel(cached, rel, digest)


# --- the patched tree ------------------------------------------------------------


@dataclass
class SeriesTree:
    """The patched tree the wheel is made of: its ``vllm/`` files, which of
    them the series changes, and the results' ``series`` block."""

    root: Path  # where csrc/sm7x lies, for the module
    label: str
    version: str  # the release it sits on
    series: dict
    files: dict[str, tuple[int, Callable[[], bytes]]] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)


def _what_to_finish(state: State, t: Target) -> str | None:
    """Why the work tree does not hold the whole series, with the way on."""
    if state.rebase_stopped:
        return (
            f"a rebase is stopped there: finish it (`{t.cmd('rebase', '--continue')}`) "
            f"or give it up (`{t.cmd('rebase', '--abort')}`)"
        )
    if state.failed:
        return (
            f"an apply stopped at {state.failed} ({state.applied} of {state.total} patches "
            f"applied): finish that patch and run `{t.cmd('apply', '--continue')}`, or "
            f"`{t.cmd('apply', '--force')}` to start over from the patch files"
        )
    if state.in_progress:
        return (
            f"an {state.in_progress} did not finish ({state.applied} of {state.total} "
            f"patches applied): run `{t.cmd('apply')}` again"
        )
    return None


def work_tree(t: Target) -> SeriesTree:
    """The series' commit in the work tree, refused unless it holds the whole
    series on the release, committed."""
    tree = t.work
    state = State.load(t)
    if not git.is_repo(tree) or not state.base:
        raise ToolkitError(f"wheel: no work tree: run `{t.cmd('apply')}` first")
    if reason := _what_to_finish(state, t):
        raise ToolkitError(f"wheel: {tree} holds a half-applied series ({reason})")
    if op := git.operation_in_progress(tree):
        raise ToolkitError(
            f"wheel: a git {op} is stopped in {tree}: finish it (git {op} --continue) or "
            f"abort it (git {op} --abort) first"
        )
    if state.base_label != t.version or (t.commit and state.base != t.commit):
        raise ToolkitError(
            f"wheel: {tree} is on {state.base_label}, not on vLLM {t.version}: the wheel "
            f"reuses the released {t.version} wheel; run `{t.cmd('apply')}` first"
        )
    dirty = [
        line
        for line in git.dirty_files(tree)
        if line[3:].startswith(("vllm/", build.SRC_DIR + "/"))
    ]
    if dirty:
        raise ToolkitError(
            f"wheel: {tree} has uncommitted changes ({', '.join(d[3:] for d in dirty[:3])}"
            f"{', ...' if len(dirty) > 3 else ''}): the wheel is made of a commit; commit "
            "them (and `nox -s export`) or stash them"
        )
    head = git.rev(tree, "HEAD") or ""
    if git.run(tree, "merge-base", "--is-ancestor", state.base, head).returncode != 0:
        raise ToolkitError(f"wheel: HEAD of {tree} is not on the base {state.base[:12]}")
    out = SeriesTree(
        tree,
        f"{tree} at {head[:12]}",
        t.version,
        claims.series_block(tree, state.base, head, t.version),
    )
    diff = git.git(
        tree, "diff", "--no-renames", "--name-status", "-z", state.base, head, "--", "vllm"
    )
    fields = diff.split("\0")
    for status, path in zip(fields[0:-1:2], fields[1::2], strict=False):
        (out.deleted if status == "D" else out.changed).add(path)
    for path, (mode, data) in _read_blobs(tree, head, out).items():
        out.files[path] = (mode, _constant(data))
    return out


def _constant(data: bytes) -> Callable[[], bytes]:
    return lambda: data


def _read_blobs(tree: Path, head: str, out: SeriesTree) -> dict[str, tuple[int, bytes]]:
    """Every file under vllm/ at ``head``: (mode, content), read in one git call."""
    listing = git.git(tree, "ls-tree", "-r", "-z", head, "--", "vllm").split("\0")
    entries: list[tuple[str, int, str]] = []
    links: list[tuple[str, int, str]] = []
    for item in filter(None, listing):
        meta, path = item.split("\t", 1)
        git_mode, kind, blob = meta.split()
        if kind != "blob":
            raise ToolkitError(f"wheel: {path} in {out.label} is a {kind}, not a file")
        into = links if git_mode == "120000" else entries
        into.append((path, int(git_mode, 8) & 0o777, blob))
    proc = git.run(
        tree, "cat-file", "--batch", input="".join(f"{b}\n" for _, _, b in entries).encode()
    )
    if proc.returncode != 0:
        raise failed(f"wheel: reading {out.label}", proc)
    stream, pos = proc.stdout, 0
    blobs: dict[str, tuple[int, bytes]] = {}
    for path, mode, _ in entries:
        nl = stream.index(b"\n", pos)
        size = int(stream[pos:nl].split()[2])
        blobs[path] = (mode, stream[nl + 1 : nl + 1 + size])
        pos = nl + 2 + size
    # A symbolic link is packaged as the file it names (as setuptools does).
    for path, _, blob in links:
        text = git.git(tree, "cat-file", "blob", blob).strip()
        target_path = os.path.normpath(os.path.join(os.path.dirname(path), text))
        if target_path not in blobs:
            raise ToolkitError(f"wheel: {path} in {out.label} links to {text}, not a file of vllm/")
        blobs[path] = (0o644, blobs[target_path][1])
        if target_path in out.changed:  # the series changes what it packages
            out.changed.add(path)
    return blobs


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def assembled_tree(folder: Path) -> SeriesTree:
    """A tree assembled from the GPU machine's load (gpu/stage2.sh): its
    stamps name the series, and every file they list is checked by its git
    blob id."""
    if not (folder / results.STAMPS["commit"]).is_file():
        raise ToolkitError(
            f"wheel: {folder} has no {results.STAMPS['commit']} stamp: --tree takes a "
            "tree assembled from `nox -s overlay -- --gpu` (gpu/stage2.sh: /tmp/vllm-run/src)"
        )
    series = results.series_from_stamps(folder)
    commit, version = series.get("commit"), (series.get("base") or "").removeprefix("vllm==")
    if not commit or not version:
        raise ToolkitError(f"wheel: the stamps in {folder} name no series commit or base")
    out = SeriesTree(folder, f"{folder} (series {commit[:12]})", version, series)
    for path, blob in series["files"].items():
        f = folder / path
        if not f.is_file():
            if path.startswith("vllm/"):
                raise ToolkitError(f"wheel: {f} is missing: the stamps list it")
            continue  # the packer carries vllm/, csrc/sm7x and the test files only
        if git_blob_id(f.read_bytes()) != blob:
            raise ToolkitError(
                f"wheel: {f} is not the series' (git blob {blob[:12]}): the tree was changed "
                "after it was packed"
            )
        if path.startswith("vllm/"):
            out.changed.add(path)
    for f in sorted((folder / "vllm").rglob("*")):
        rel = f.relative_to(folder).as_posix()
        if f.is_dir() or "__pycache__" in f.parts or rel == MODULE or f.suffix == ".pyc":
            continue
        mode = 0o755 if os.access(f, os.X_OK) else 0o644
        out.files[rel] = (mode, f.read_bytes)
        if f.is_symlink():  # packaged as the file it names: changed with it
            named = f.resolve()
            if named.is_relative_to(folder) and named.relative_to(folder).as_posix() in out.changed:
                out.changed.add(rel)
    return out


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
        if path in (VERSION_FILE, SERIES_INFO, MODULE):
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


# --- the zip -----------------------------------------------------------------------

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_DOS_DATE = (1 << 5) | 1  # 1980-01-01, 00:00: the same bytes from the same inputs
_LIMIT = 0xFFFFFFFF


class ZipWriter:
    """A plain zip (no zip64: a wheel of vLLM stays far below 4 GiB and 65535
    files) that takes compressed data from another zip as it is."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.central: list[bytes] = []

    def _header(self, name: str, method: int, crc: int, csize: int, size: int) -> tuple[bytes, int]:
        if max(csize, size, self.out.tell()) >= _LIMIT or len(self.central) >= 0xFFFF:
            raise ToolkitError("wheel: too large for a zip without zip64")
        encoded = name.encode()
        flags = 0 if name.isascii() else 0x800
        offset = self.out.tell()
        self.out.write(
            _LOCAL.pack(
                0x04034B50, 20, flags, method, 0, _DOS_DATE, crc, csize, size, len(encoded), 0
            )
            + encoded
        )
        return encoded, offset

    def _central(
        self,
        encoded: bytes,
        flags: int,
        method: int,
        crc: int,
        csize: int,
        size: int,
        mode: int,
        offset: int,
    ) -> None:
        self.central.append(
            _CENTRAL.pack(
                0x02014B50,
                (3 << 8) | 20,
                20,
                flags,
                method,
                0,
                _DOS_DATE,
                crc,
                csize,
                size,
                len(encoded),
                0,
                0,
                0,
                0,
                (0o100000 | mode) << 16,
                offset,
            )
            + encoded
        )

    def add(self, name: str, data: bytes, mode: int = 0o644) -> None:
        comp = zlib.compressobj(6, zlib.DEFLATED, -15)
        packed = comp.compress(data) + comp.flush()
        crc = zlib.crc32(data)
        encoded, offset = self._header(name, zipfile.ZIP_DEFLATED, crc, len(packed), len(data))
        self.out.write(packed)
        self._central(
            encoded,
            0 if name.isascii() else 0x800,
            zipfile.ZIP_DEFLATED,
            crc,
            len(packed),
            len(data),
            mode,
            offset,
        )

    def add_raw(self, name: str, src: BinaryIO, info: zipfile.ZipInfo, mode: int) -> None:
        """``info``'s compressed data from ``src`` (an open zip file), as it is."""
        if info.flag_bits & 0x1:
            raise ToolkitError(f"wheel: {info.filename} of the released wheel is encrypted")
        src.seek(info.header_offset)
        head = src.read(_LOCAL.size)
        fields = _LOCAL.unpack(head)
        if fields[0] != 0x04034B50:
            raise ToolkitError(f"wheel: the released wheel is damaged at {info.filename}")
        src.seek(fields[9] + fields[10], os.SEEK_CUR)
        encoded, offset = self._header(
            name, info.compress_type, info.CRC, info.compress_size, info.file_size
        )
        left = info.compress_size
        while left:
            chunk = src.read(min(left, 1 << 20))
            if not chunk:
                raise ToolkitError(f"wheel: the released wheel ends inside {info.filename}")
            self.out.write(chunk)
            left -= len(chunk)
        self._central(
            encoded,
            0 if name.isascii() else 0x800,
            info.compress_type,
            info.CRC,
            info.compress_size,
            info.file_size,
            mode,
            offset,
        )

    def close(self) -> None:
        start = self.out.tell()
        for record in self.central:
            self.out.write(record)
        size = self.out.tell() - start
        if start >= _LIMIT:
            raise ToolkitError("wheel: too large for a zip without zip64")
        n = len(self.central)
        self.out.write(_END.pack(0x06054B50, 0, 0, n, n, size, start, 0))


def write_zip(out: BinaryIO, entries: list[Entry], source: ReleaseSource) -> None:
    writer = ZipWriter(out)
    src = open(source.path, "rb") if isinstance(source, ReleasedWheel) else None  # noqa: SIM115
    try:
        for e in entries:
            if e.raw is not None:
                assert src is not None
                writer.add_raw(e.path, src, e.raw, e.mode)
            else:
                assert e.data is not None
                writer.add(e.path, e.data, e.mode)
        writer.close()
    finally:
        if src is not None:
            src.close()


def record_file(entries: list[Entry], record_path: str) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for e in entries:
        w.writerow([e.path, f"sha256={e.digest}", e.size])
    w.writerow([record_path, "", ""])
    return buf.getvalue().encode()


def clear_leftovers(dist: Path, log=print) -> None:
    """Temporary files of a writer that was killed (a kill -9 cannot be caught)."""
    for stale in dist.glob(".vllm-*.whl.*.part") if dist.is_dir() else ():
        stale.unlink()
        log(f"wheel: removed {stale}, left by an interrupted run")


def write_atomically(dest: Path, fill: Callable[[BinaryIO], None]) -> None:
    """``fill`` a temporary file beside ``dest`` and rename it into place once
    complete; on any failure nothing is left (a folder made for it included)."""
    made = not dest.parent.exists()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        if made and not any(dest.parent.iterdir()):
            dest.parent.rmdir()
        raise


# --- vllm._sm7x_C ------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    path: Path
    info: dict


def _torch_with_cuda() -> tuple[str, str]:
    try:
        import torch
    except ImportError:
        raise ToolkitError(
            f"wheel: linking vllm._sm7x_C needs torch with CUDA in this Python "
            f"({sys.executable}): run the session where the torch you serve with is "
            f"installed, {NO_MODULE_HINT}"
        ) from None
    if not torch.version.cuda:
        raise ToolkitError(
            f"wheel: torch {torch.__version__} in {sys.executable} has no CUDA: linking "
            f"vllm._sm7x_C needs a CUDA build of torch, {NO_MODULE_HINT}"
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
    """Link ``_sm7x_C`` from ``tree``'s csrc/sm7x for sm_75 (and sm_70 where
    nvcc targets it) against this Python's torch; a build of the same sources
    with the same toolchain, whose file is unchanged, is reused."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise ToolkitError(
            "wheel: no CUDA toolkit (nvcc not found on PATH): vllm._sm7x_C is compiled "
            "here; install the CUDA toolkit (12.x builds sm_70 and sm_75, 13.x sm_75 only) "
            f"and torch with CUDA, {NO_MODULE_HINT}"
        )
    src = tree / build.SRC_DIR
    if not build.discover(tree):
        raise ToolkitError(f"wheel: {src} holds no kernels: {NO_MODULE_HINT.removeprefix('or ')}")
    torch_version, cuda = _torch_with_cuda()
    nvcc_version = build.nvcc_version(nvcc)
    archs = tuple(a for a in build.ALL_ARCHS if a in build.nvcc_archs(nvcc))
    if "75" not in archs:
        raise ToolkitError(f"wheel: {nvcc} (CUDA {nvcc_version}) cannot target sm_75")
    if "70" not in archs:
        log(f"wheel: sm_70 left out: {nvcc} (CUDA {nvcc_version}) cannot target it (CUDA 12.x can)")
    wanted = {
        "file": MODULE,
        "sources": sources_digest(src),
        "archs": [f"sm_{a}" for a in archs],
        "ptx": "compute_75" if ptx else None,
        "torch": torch_version,
        "cuda": cuda,
        "nvcc": nvcc_version,
    }
    so, stamp = out / f"{build.MODULE}.abi3.so", out / "module.json"
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
            f"wheel: linking vllm._sm7x_C failed ({first}): fix the toolchain (CUDA headers "
            f"and libraries under {Path(nvcc).resolve().parent.parent}), {NO_MODULE_HINT}"
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
        entries[MODULE] = Entry.of(MODULE, data, 0o755)
    note = (
        f"**This wheel is vLLM {rel.version} with the Turing / no-P2P prefill series**, "
        f"series commit {commit} (vllm/_series.json), assembled by the series toolkit from "
        f"the released wheel {rel.file} (sha256 {rel.sha256}) and the patched Python tree; "
        + (
            f"vllm._sm7x_C linked for {', '.join(module.info['archs'])} against torch "
            f"{module.info['torch']}."
            if module is not None
            else "without vllm._sm7x_C: the series' Turing kernels are absent."
        )
        + (f" {len(p.omitted)} released files were not carried (see omitted)." if p.omitted else "")
    )
    dist_info = f"vllm-{version}.dist-info"
    ordered = [entries[k] for k in sorted(entries)]
    meta = [
        Entry.of(f"{dist_info}/METADATA", metadata(source.meta["METADATA"], version, note)),
        Entry.of(f"{dist_info}/WHEEL", wheel_file(tags)),
        *(Entry.of(f"{dist_info}/{n}", source.meta[n]) for n in DIST_INFO_FILES if n != "METADATA"),
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
        + (f"vllm._sm7x_C for {', '.join(module.info['archs'])}" if module else "no vllm._sm7x_C")
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


# --- the install check -------------------------------------------------------------


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def verify_install(wheel: Path, log=print) -> dict:
    """Install ``wheel`` with pip into a fresh virtual environment and check
    there (CPU): ``import vllm`` (from that environment), the version,
    ``vllm --version`` and the series' ops. The environment gets vLLM's
    requirements from this Python's (torch with its CUDA libraries is
    gigabytes: not downloaded again); vLLM itself only from the wheel."""
    import importlib.util
    import sysconfig

    if importlib.util.find_spec("torch") is None:
        raise ToolkitError(
            f"wheel --verify: vLLM's requirements (torch, ...) are not installed in "
            f"{sys.executable}: run it in `nox -s ci`'s environment, or install them "
            "(pip install torch -r .work/vllm/requirements/common.txt)"
        )
    expected = wheel_version(wheel)
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="vllm-wheel-check-") as tmp:
        venv = Path(tmp) / "venv"
        py = venv / "bin" / "python"
        t0 = time.perf_counter()
        _run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)],
            "creating a virtual environment",
        )
        site = _run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            "asking the new environment",
        ).strip()
        deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
        (Path(site) / "zz_vllm_requirements.pth").write_text(
            "".join(f"import site; site.addsitedir({d!r})\n" for d in deps)
        )
        _run(
            # --no-compile: byte-compiling vLLM's 5,000 files takes three times the
            # install (30 s of 42 on two cores) and checks nothing that import does not
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(py),
                "install",
                "-q",
                "--no-compile",
                "--no-deps",
                "--no-index",
                str(wheel),
            ],
            f"pip install {wheel.name}",
        )
        times["install_s"] = time.perf_counter() - t0
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # vLLM 0.33.0's CLI builds its parser from a device config that must find
        # a platform: without a GPU only this names one (the released wheel's too).
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        t0 = time.perf_counter()
        report = json.loads(
            last_line(
                _run(
                    [str(py), "-I", str(CHECK_SCRIPT), expected, str(venv)],
                    "the check in the new environment",
                    cwd=tmp,
                    env=env,
                )
            )
        )
        times["check_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        shown = last_line(
            _run([str(venv / "bin" / "vllm"), "--version"], "vllm --version", cwd=tmp, env=env)
        )
        times["version_s"] = time.perf_counter() - t0
    if shown != expected:
        raise ToolkitError(
            f"wheel --verify: vllm --version says {shown!r}, the wheel is {expected}"
        )
    report.update(times, vllm_version_cli=shown)
    how = (
        "by the extension"
        if report["extension_loaded"]
        else "from their schemas, with their fakes: no extension here"
    )
    log(
        f"wheel --verify: pip installed {wheel.name} into a fresh environment "
        f"({times['install_s']:.1f} s); import vllm from it, version {expected}, "
        f"{len(report['ops'])} ops of _sm7x_C registered "
        f"({how}), "
        f"torch.ops.vllm.nvfp4_sm7x_linear registered ({times['check_s']:.1f} s); "
        f"vllm --version: {shown} ({times['version_s']:.1f} s)"
    )
    return report


def _run(cmd: list[str], what: str, **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise failed(f"wheel --verify: {what}", proc)
    return proc.stdout


# --- the GPU machine's load ----------------------------------------------------------

# Released members carried beside the dist-info to the GPU machine, by group
# (a package under vllm/third_party, or one file): those up to this size,
# compressed. The large ones (FA2, the MoE module, the Rust frontend,
# DeepGEMM, ...) do not fit in the machine's runs; the core module and FA3
# travel in part1 / part2 already (serieskit.overlay).
CARRY_GROUP_BYTES = 1 << 20


def _group(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[:3]) if len(parts) > 3 and parts[1] == "third_party" else path


def pack_release(
    z: zipfile.ZipFile, version: str, tree: Path, dest: Path, skip: tuple[str, ...]
) -> None:
    """``dest`` (a .tar.xz): the released wheel's dist-info, and its small
    generated members that the GPU machine's load does not carry otherwise
    (not in the patched ``tree``, not under ``skip``)."""
    dist_info = f"vllm-{version}.dist-info/"
    infos = [i for i in z.infolist() if not i.is_dir()]
    sizes: dict[str, int] = {}
    for i in infos:
        if not i.filename.startswith(dist_info):
            sizes[_group(i.filename)] = sizes.get(_group(i.filename), 0) + i.compress_size
    with tarfile.open(dest, "w:xz") as tar:
        for i in infos:
            name = i.filename
            generated = not (tree / name).exists() and not name.startswith(skip)
            if name.startswith(dist_info) or (
                generated and sizes[_group(name)] <= CARRY_GROUP_BYTES
            ):
                data = z.read(i)
                ti = tarfile.TarInfo(name)
                ti.size, ti.mode = len(data), (i.external_attr >> 16) & 0o777 or 0o644
                tar.addfile(ti, io.BytesIO(data))
