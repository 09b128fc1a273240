"""The pinned upstream base: a vLLM sdist from PyPI as a reproducible commit.

The sdist is downloaded once into a cache outside the work tree and checked
against its sha256. Its files become one git commit written with
``git fast-import`` straight from the tarball: fixed author, committer, date
and message, modes from the archive (644 / 755 / symlink), nothing added.
The commit id therefore depends only on the sdist's bytes and is the same on
every machine; the pin records it and every import is checked against it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from serieskit import git as g
from serieskit.errors import ToolkitError

PIN_FILE = "pin.toml"
PACKAGE = "vllm"
BASE_DATE = "946684800 +0000"  # 2000-01-01: fixed, so the id is reproducible
_VERSION = re.compile(r"^\d+(\.\d+)*([a-z]+\d+)?(\.post\d+)?$")


@dataclass(frozen=True)
class Pin:
    version: str
    sha256: str
    commit: str | None = None

    @property
    def sdist(self) -> str:
        return f"{PACKAGE}-{self.version}.tar.gz"

    @property
    def ref(self) -> str:
        return base_ref(self.version)


def base_ref(version: str) -> str:
    return f"refs/series/base/{version}"


def read_pin(root: Path) -> Pin:
    path = root / PIN_FILE
    try:
        data = tomllib.loads(path.read_text())["base"]
        return Pin(data["version"], data["sha256"], data.get("commit") or None)
    except FileNotFoundError:
        raise ToolkitError(f"no pin file: {path} is missing") from None
    except (KeyError, tomllib.TOMLDecodeError) as e:
        raise ToolkitError(f"{path} is malformed: {e}") from None


def write_pin(root: Path, pin: Pin) -> None:
    (root / PIN_FILE).write_text(
        "# The upstream vLLM release the series applies to: its source\n"
        "# distribution from PyPI, that file's sha256, and the id of the base\n"
        "# commit the toolkit makes of it (the same on every machine).\n"
        "[base]\n"
        f'version = "{pin.version}"\n'
        f'sha256 = "{pin.sha256}"\n'
        f'commit = "{pin.commit or ""}"\n'
    )


def cache_dir() -> Path:
    root = os.environ.get("VLLM_SERIES_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "vllm-series",
    )
    return Path(root) / "sdists"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_version(version: str) -> None:
    if not _VERSION.match(version):
        raise ToolkitError(f"not a vLLM release version: {version!r}")


def fetch_sdist(version: str, sha256: str | None = None, log=print) -> tuple[Path, str]:
    """The cached sdist of ``version`` and its sha256 (see :func:`fetch`)."""
    check_version(version)
    return fetch(f"{PACKAGE}-{version}.tar.gz", version, sha256, log=log)


def fetch(name: str, version: str, sha256: str | None = None,
          log=print) -> tuple[Path, str]:
    """Return the cached file ``name`` of vLLM ``version`` and its sha256,
    downloading it once.

    With ``sha256`` given (the pin) the file must match it; without, the
    index's own sha256 is required and checked.
    """
    path = cache_dir() / name
    if path.exists():
        digest = sha256_of(path)
        known = sha256 or _read_sidecar(path)
        if known == digest:
            return path, digest
        log(f"base: cached {name} does not match its sha256; downloading again")
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part")
    info = _download(name, version, part)
    index_sha = info.get("sha256")
    expected = sha256 or index_sha
    if not expected:
        part.unlink(missing_ok=True)
        raise ToolkitError(f"the package index gives no sha256 for {name}: cannot verify it")
    digest = sha256_of(part)
    if digest != expected:
        part.unlink(missing_ok=True)
        what = "the pin" if sha256 else "the package index"
        raise ToolkitError(
            f"sha256 mismatch for {name}: {what} says {expected}, the download is {digest}"
        )
    part.replace(path)
    path.with_suffix(".sha256").write_text(digest + "\n")
    return path, digest


def _read_sidecar(path: Path) -> str | None:
    side = path.with_suffix(".sha256")
    return side.read_text().strip() if side.exists() else None


def _pip_python() -> str:
    if importlib.util.find_spec("pip") is not None:
        return sys.executable
    for cand in ("python3", "python"):
        exe = shutil.which(cand)
        if exe and subprocess.run([exe, "-c", "import pip"], capture_output=True).returncode == 0:
            return exe
    raise ToolkitError("downloading the vLLM sdist needs pip (python3 -m pip)")


def _download(name: str, version: str, dest: Path) -> dict:
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=pkg_root)
    proc = subprocess.run(
        [_pip_python(), "-m", "serieskit._pipfetch", PACKAGE, version, name, str(dest)],
        stdout=subprocess.PIPE, stderr=None if _progress_wanted() else subprocess.PIPE,
        env=env, text=True,
    )
    if proc.returncode == 2:
        raise ToolkitError(
            f"vLLM {version} has no source distribution ({name}) on pip's configured index"
        )
    if proc.returncode != 0:
        dest.unlink(missing_ok=True)
        tail = (proc.stderr or "").strip().splitlines()
        raise ToolkitError(tail[-1] if tail else f"download of {name} failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _progress_wanted() -> bool:
    return os.environ.get("VLLM_SERIES_QUIET") != "1"


def commit_message(version: str, sha256: str) -> str:
    return (
        f"vLLM {version}\n\n"
        f"The files of {PACKAGE}-{version}.tar.gz, the source distribution on\n"
        f"PyPI (sha256 {sha256}), as they are.\n"
    )


def _quote(path: str) -> str:
    """C-style quoting for a fast-import path, safe for any file name."""
    out = []
    for b in path.encode():
        c = chr(b)
        if c in '"\\':
            out.append("\\" + c)
        elif 32 <= b < 127:
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def import_sdist(repo: Path, sdist: Path, version: str, sha256: str, log=print) -> str:
    """Write the sdist's files as one commit at ``base_ref(version)``; return its id."""
    ident = f"{g.COMMITTER[0]} <{g.COMMITTER[1]}> {BASE_DATE}"
    msg = commit_message(version, sha256).encode()
    proc = subprocess.Popen(
        ["git", "-C", str(repo), "fast-import", "--quiet", "--date-format=raw",
         "--force"],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=g.git_env(),
    )
    assert proc.stdin is not None
    w = proc.stdin.write
    count = 0
    try:
        w(f"commit {base_ref(version)}\nauthor {ident}\ncommitter {ident}\n".encode())
        w(b"data %d\n" % len(msg) + msg + b"\n")
        w(b"deleteall\n")
        # In archive order: fast-import's later "M" of a name wins, as in tar.
        with tarfile.open(sdist, "r:gz") as tar:
            for m in tar:
                parts = m.name.split("/", 1)
                if len(parts) < 2 or not parts[1]:
                    continue
                if m.issym():
                    mode, data = "120000", m.linkname.encode()
                elif m.isfile() or m.islnk():
                    src = tar.extractfile(m)
                    if src is None:
                        continue
                    data = src.read()
                    mode = "100755" if m.mode & 0o100 else "100644"
                else:
                    continue
                w(f"M {mode} inline {_quote(parts[1])}\n".encode())
                w(b"data %d\n" % len(data) + data + b"\n")
                count += 1
        proc.stdin.close()
    except (tarfile.TarError, OSError, EOFError) as e:
        proc.kill()
        proc.wait()
        raise ToolkitError(f"cannot read {sdist.name}: {e}") from None
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.wait() != 0:
        raise ToolkitError(f"git fast-import failed: {err.strip()}")
    commit = g.rev(repo, base_ref(version))
    assert commit
    log(f"base: unpacked {count} files of {sdist.name} into commit {commit[:12]}")
    return commit


def ensure_repo(repo: Path) -> None:
    if not g.is_repo(repo):
        repo.mkdir(parents=True, exist_ok=True)
        g.git(repo, "init", "-q")


def ensure_base(repo: Path, version: str, sha256: str | None,
                commit: str | None = None, log=print) -> tuple[str, str]:
    """Make sure ``repo`` holds the base commit of ``version``; return (id, sha256).

    ``commit``, when given (the pin's), must equal the id made here.
    """
    ensure_repo(repo)
    have = g.rev(repo, base_ref(version))
    if have and (commit is None or have == commit):
        return have, sha256 or _sidecar_or_none(version) or ""
    sdist, digest = fetch_sdist(version, sha256, log=log)
    made = import_sdist(repo, sdist, version, digest, log=log)
    if commit and made != commit:
        raise ToolkitError(
            f"base commit of vLLM {version} is {made[:12]}, the pin says {commit[:12]}: "
            "the pin or the import is wrong"
        )
    return made, digest


def _sidecar_or_none(version: str) -> str | None:
    return _read_sidecar(cache_dir() / f"{PACKAGE}-{version}.tar.gz")
