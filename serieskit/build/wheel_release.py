"""The released vLLM wheel the series' wheel reuses, checked member by member.

build/wheel.toml records, per release, the file on PyPI, its sha256 and the
sha256 of its RECORD; the wheel comes whole (downloaded once) or, on the GPU
machine, as its dist-info with the compiled members from the assembled tree
(``pack_release`` writes that load), each checked against RECORD.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from serieskit.errors import ToolkitError
from serieskit.series import base

RELEASES = "build/wheel.toml"


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


# The released dist-info files the series' wheel keeps (RECORD is rewritten).
DIST_INFO_FILES = ("METADATA", "entry_points.txt", "top_level.txt", "licenses/LICENSE")


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


# Released members carried beside the dist-info to the GPU machine, by group
# (a package under vllm/third_party, or one file): those up to this size,
# compressed. The large ones (FA2, the MoE module, the Rust frontend,
# DeepGEMM, ...) do not fit in the machine's runs; the core module and FA3
# travel in part1 / part2 already (serieskit.build.overlay).
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
