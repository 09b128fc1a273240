"""The wheel file itself: a byte-stable zip, its RECORD, written atomically.

The same inputs give the same bytes (fixed dates and order); members taken
from the released wheel keep their compressed data as it is.
"""

from __future__ import annotations

import csv
import io
import os
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from serieskit.build.wheel_release import Entry, ReleasedWheel, ReleaseSource
from serieskit.errors import ToolkitError

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
