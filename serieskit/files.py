"""Files written whole or not at all, and a filesystem's failure said in one line.

:func:`write` puts the bytes in a temporary file beside the target, flushes
them to the disk, then renames it over the target: whoever reads the target
(and a kill or a full disk at any moment) finds the old file or the new one,
never a cut one. :func:`write_dir` does the same for a folder of small files.
A temporary file is named ``.NAME.serieskit-PID.tmp``; one a killed session
left is removed by :func:`clear_leftovers`.

:func:`describe` is what the command line prints for an ``OSError``: the path,
what went wrong, and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from pathlib import Path

from serieskit import killpoint

_SUFFIX = ".serieskit-{pid}.tmp"
_LEFTOVER = re.compile(r"^\..+\.serieskit-(\d+)\.tmp$")


def _temp(path: Path) -> Path:
    return path.with_name(f".{path.name}{_SUFFIX.format(pid=os.getpid())}")


def write(path: Path, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` atomically (text as UTF-8); the target
    keeps its permission bits. A failure leaves the old file and no temporary
    one, and names ``path``."""
    path = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    tmp = _temp(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
        killpoint.reach("write")  # written, not yet in place
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OSError(e.errno, e.strerror, str(path)) from None
    _sync_dir(path.parent)


def write_dir(path: Path, files: dict[str, bytes]) -> None:
    """Make the folder ``path`` hold ``files`` (relative paths to bytes), whole or not
    at all: built beside it, then renamed into place (it must not exist)."""
    path = Path(path)
    tmp = _temp(path)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)  # a name may hold folders
            (tmp / name).write_bytes(data)
        killpoint.reach("write")
        os.rename(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(e.errno, e.strerror, str(path)) from None
    _sync_dir(path.parent)


def _sync_dir(folder: Path) -> None:
    """The rename itself on the disk (where the system lets a folder be synced)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def clear_leftovers(folder: Path) -> list[Path]:
    """Remove the temporary files and folders that killed sessions left in
    ``folder`` (never one of a process still running); return them."""
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        m = _LEFTOVER.match(p.name)
        if not m or _alive(int(m.group(1))):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- an OSError, said in one line ----------------------------------------------

_WHAT_TO_DO = {
    errno.ENOSPC: "the disk is full: free some space, then run this again",
    errno.EDQUOT: "the disk quota is used up: free some space, then run this again",
    errno.EROFS: "it is on a read-only file system: make it writable (or work in a "
    "writable copy), then run this again",
    errno.EACCES: "permission denied: make it readable and writable for you, then run this again",
    errno.EPERM: "operation not permitted: make it writable for you, then run this again",
    errno.EFBIG: "a file size limit stops the write (`ulimit -f`): raise it, then run this again",
    errno.EISDIR: "a folder is where a file belongs: move that folder aside, then run this again",
    errno.ENOENT: "it does not exist: make it (or give another path), then run this again",
    errno.EIO: "the disk reports an I/O error: check it, then run this again",
}


def describe(e: OSError) -> str:
    """``PATH: what went wrong: what to do`` for a failed filesystem call."""
    if e.filename is None:
        return f"{e.strerror or e}: check the disk and the permissions, then run this again"
    path = os.fsdecode(e.filename)
    if e.errno in (errno.ENOTDIR, errno.EEXIST) and (found := _blocking(Path(path))):
        return found
    if e.filename2 is not None:  # a copy or a rename: the destination is what failed
        path = f"{os.fsdecode(e.filename2)} (from {path})"
    what = _WHAT_TO_DO.get(e.errno or 0)
    if what is None:
        what = f"{e.strerror or 'failed'}: fix that, then run this again"
    elif e.strerror:
        what = f"{e.strerror}: {what}"
    return f"{path}: {what}"


def _blocking(path: Path) -> str | None:
    """A dangling symbolic link, or a file, where the path needs a folder."""
    for p in (path, *path.parents):
        if p.is_symlink() and not p.exists():
            return (
                f"{p} is a symbolic link to {os.readlink(p)}, which does not exist: "
                "make that folder, or remove the link, then run this again"
            )
        if p.exists() and not p.is_dir():
            within = f" (for {path})" if p != path else ""
            return (
                f"{p} is a file where a folder belongs{within}: move it aside, then run this again"
            )
    return None
