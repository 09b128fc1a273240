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
import importlib.metadata
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

from filelock import FileLock, Timeout

from serieskit import files, git
from serieskit.errors import ToolkitError, failed, last_line
from serieskit.series import _pipfetch as pipfetch

PIN_FILE = "pin.toml"
PACKAGE = "vllm"
BASE_DATE = "946684800 +0000"  # 2000-01-01: fixed, so the id is reproducible
_VERSION = re.compile(r"^\d+(\.\d+)*([a-z]+\d+)?(\.post\d+)?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class NoSdist(ToolkitError):
    """The index has no sdist of the release asked for (the caller may name
    the releases it has)."""

    def __init__(self, message: str, version: str) -> None:
        super().__init__(message)
        self.version = version


@dataclass(frozen=True)
class Pin:
    version: str
    sha256: str
    commit: str | None = None
    torch: str | None = None  # the torch its CPU tests install (target.PIN_TORCH if unset)

    @property
    def sdist(self) -> str:
        return f"{PACKAGE}-{self.version}.tar.gz"

    @property
    def ref(self) -> str:
        return base_ref(self.version)


@dataclass(frozen=True)
class Port:
    """A port of the series to another release, kept beside the pin
    (a ``[[port]]`` table of pin.toml): its base, like the pin's, and the
    folder that holds its patches."""

    version: str
    sha256: str
    commit: str | None
    patches: str  # relative to the toolkit root, e.g. "ports/0.33.0"
    torch: str | None = None  # the torch its CPU tests install (default: the pin's)


PORT_KEYS = ("version", "sha256", "commit", "patches", "torch")


def base_ref(version: str) -> str:
    return f"refs/series/base/{version}"


# The work tree's base whatever its version (apply, a finished rebase and an
# abort move it), for commands that must not name one: `git rebase -i
# series/base/current` (git resolves the short name through refs/).
CURRENT_REF = "refs/series/base/current"
CURRENT = "series/base/current"


def mark_current(repo: Path, commit: str) -> None:
    git.git(repo, "update-ref", CURRENT_REF, commit)


def _load_pin_file(root: Path) -> tuple[Path, dict]:
    path = root / PIN_FILE
    try:
        return path, tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ToolkitError(f"no pin file: {path} is missing") from None
    except tomllib.TOMLDecodeError as e:
        raise ToolkitError(f"{path} is not valid TOML: {e}") from None


def _release_fields(path: Path, where: str, table: dict) -> tuple[str, str, str | None]:
    """version, sha256 and commit of a [base] or [[port]] table, checked: every
    key missing or invalid named in one line (a file cut short lacks some)."""
    version, sha256, commit = (table.get(k) for k in ("version", "sha256", "commit"))
    # The pin's commit is what the work tree's base is checked against: a
    # [base] without one (cut short) would pass any base.
    required = ("version", "sha256", "commit") if where == "base" else ("version", "sha256")
    problems = [f"{where}.{k} is missing" for k in required if k not in table]
    if "version" in table and (not isinstance(version, str) or not _VERSION.match(version)):
        problems.append(
            f'{where}.version must be a release string such as "0.26.0", not {version!r}'
        )
    if "sha256" in table and (not isinstance(sha256, str) or not _SHA256.match(sha256)):
        problems.append(f"{where}.sha256 must be 64 hex digits, not {sha256!r}")
    if commit not in (None, "") and (not isinstance(commit, str) or not _COMMIT.match(commit)):
        problems.append(f"{where}.commit must be a 40-digit commit id, not {commit!r}")
    if problems:
        raise ToolkitError(
            f"{path}: {'; '.join(problems)}: fix the file (`git diff {path.name}` shows what "
            "changed; `git checkout -- " + path.name + "` restores it); nothing was changed"
        )
    assert isinstance(version, str) and isinstance(sha256, str)
    return version, sha256, commit or None


def read_pin(root: Path) -> Pin:
    """The pin, checked field by field: a typo is one error line, not a traceback."""
    path, data = _load_pin_file(root)
    table = data.get("base")
    if not isinstance(table, dict):
        raise ToolkitError(f"{path} has no [base] table")
    return Pin(*_release_fields(path, "base", table), _torch_field(path, "base", table))


def _torch_field(path: Path, where: str, table: dict) -> str | None:
    torch = table.get("torch")
    if torch is not None and (not isinstance(torch, str) or not _VERSION.match(torch)):
        raise ToolkitError(
            f'{path}: {where}.torch must be a torch release such as "2.14.1", not {torch!r}'
        )
    return torch


def read_ports(root: Path) -> list[Port]:
    """The ``[[port]]`` tables of pin.toml, checked like the pin: every field,
    no unknown key (a typo would silently drop a setting), no version twice,
    none on the pin's own release, a patch folder of its own inside the root."""
    path, data = _load_pin_file(root)
    tables = data.get("port", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ToolkitError(f"{path}: port must be [[port]] tables (an array of tables)")
    pin = read_pin(root)
    ports: list[Port] = []
    for i, table in enumerate(tables, 1):
        where = f"port {i}"
        if unknown := sorted(set(table) - set(PORT_KEYS)):
            raise ToolkitError(
                f"{path}: {where} has unknown key(s) {', '.join(unknown)} "
                f"(known: {', '.join(PORT_KEYS)})"
            )
        version, sha256, commit = _release_fields(path, where, table)
        where = f"port {version}"
        if version == pin.version:
            raise ToolkitError(
                f"{path}: {where} is the pin's own release: a port is the series on another one"
            )
        if any(p.version == version for p in ports):
            raise ToolkitError(f"{path}: two [[port]] tables for vLLM {version}")
        folder = table.get("patches")
        parts = Path(folder).parts if isinstance(folder, str) else ()
        if not parts or parts[0] in ("/", "patches", ".work") or ".." in parts:
            raise ToolkitError(
                f"{path}: {where}.patches must be a folder inside the toolkit "
                f'of its own, such as "ports/{version}", not {folder!r}'
            )
        torch = _torch_field(path, where, table)
        ports.append(Port(version, sha256, commit, Path(folder).as_posix(), torch))
    return ports


def write_pin(root: Path, pin: Pin) -> None:
    """Write the [base] table's values. An existing file is edited in place:
    its comments (why the CPU tests use another torch, ...), the lines and
    tables the toolkit does not own ([[port]] ones included) stay as written."""
    path = root / PIN_FILE
    if path.exists():
        text = _pin_edited(path.read_text(), pin)
        try:  # a file the edit cannot keep valid is refused, not written
            _release_fields(path, "base", tomllib.loads(text)["base"])
        except (tomllib.TOMLDecodeError, KeyError, TypeError) as e:
            raise ToolkitError(
                f"cannot set the pin in {path} ({e}): edit its [base] by hand"
            ) from None
        files.write(path, text)
        return
    files.write(
        path,
        "# The upstream vLLM release the series applies to: its source\n"
        "# distribution from PyPI, that file's sha256, and the id of the base\n"
        "# commit the toolkit makes of it (the same on every machine).\n"
        "[base]\n"
        f'version = "{pin.version}"\n'
        f'sha256 = "{pin.sha256}"\n'
        f'commit = "{pin.commit or ""}"\n'
        + (f'# What its CPU tests install.\ntorch = "{pin.torch}"\n' if pin.torch else ""),
    )


_KEY_LINE = re.compile(r"^(\s*)(version|sha256|commit|torch)(\s*=\s*)(\"[^\"]*\"|'[^']*')(.*)$")


def _pin_edited(text: str, pin: Pin) -> str:
    """``text`` with the [base] table's values set to ``pin``'s, line by line:
    each key's value replaced where it stands (a trailing comment kept), a
    key it lacks added after the table's last one, torch dropped if unset."""
    values = {"version": pin.version, "sha256": pin.sha256, "commit": pin.commit or ""}
    if pin.torch:
        values["torch"] = pin.torch
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    table, last = None, None
    for line in lines:
        if m := re.match(r"^\s*\[+\s*([^\]]+?)\s*\]+", line):
            table = m.group(1)
        m = _KEY_LINE.match(line.rstrip("\n"))
        if table == "base" and m:
            key = m.group(2)
            if key not in values:  # torch, no longer set
                continue
            value = values.pop(key)
            line = f'{m.group(1)}{key}{m.group(3)}"{value}"{m.group(5)}\n'
            out.append(line)
            last = len(out)
            continue
        out.append(line)
        if table == "base" and last is None and line.strip() == "[base]":
            last = len(out)
    if last is None:  # no [base] table: one at the top
        out[:0] = ["[base]\n"]
        last = 1
    out[last:last] = [f'{key} = "{value}"\n' for key, value in values.items()]
    return "".join(out)


def torch_required(repo: Path, commit: str) -> str | None:
    """The torch release the vLLM tree at ``commit`` pins (``torch==`` in its
    requirements/cuda.txt, else pyproject.toml); None where neither says."""
    for name in ("requirements/cuda.txt", "pyproject.toml"):
        proc = git.run(repo, "show", f"{commit}:{name}")
        text = (proc.stdout or b"").decode(errors="replace") if proc.returncode == 0 else ""
        if m := re.search(r"""^\s*["']?torch\s*==\s*([0-9][^\s;,"'+]*)""", text, re.M):
            return m.group(1)
    return None


def _port_table(port: Port) -> str:
    return (
        "\n# A port of the series to another release, kept beside the pin\n"
        '# (README: "Ports: moving to the next release"): its base as above,\n'
        "# and its patch folder.\n"
        "[[port]]\n"
        f'version = "{port.version}"\n'
        f'sha256 = "{port.sha256}"\n'
        f'commit = "{port.commit or ""}"\n'
        f'patches = "{port.patches}"\n' + (f'torch = "{port.torch}"\n' if port.torch else "")
    )


def add_port(root: Path, port: Port) -> None:
    """Append a [[port]] table to pin.toml (checked as it will be read)."""
    path = root / PIN_FILE
    files.write(path, path.read_text().rstrip("\n") + "\n" + _port_table(port))
    read_ports(root)


DOWNLOAD_LOCK = ".download.lock"  # in the cache folder


def cache_dir() -> Path:
    given = os.environ.get("VLLM_SERIES_CACHE")
    if given and os.path.exists(given) and not os.path.isdir(given):
        raise ToolkitError(
            f"VLLM_SERIES_CACHE={given} is a file, not a folder: point it at a folder "
            "(or unset it for ~/.cache/vllm-series)"
        )
    root = given or os.path.join(
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


def fetch(name: str, version: str, sha256: str | None = None, log=print) -> tuple[Path, str]:
    """Return the cached file ``name`` of vLLM ``version`` and its sha256,
    downloading it once.

    With ``sha256`` given (the pin) the file must match it; without, the
    index's own sha256 is required and checked.
    """
    path = cache_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    # One download at a time per cache: another session (a second work tree,
    # a parallel test worker) fetching the same file waits and then finds it.
    lock = FileLock(str(path.parent / DOWNLOAD_LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log(f"base: waiting for another download into {path.parent} to finish")
        lock.acquire()
    try:
        return _fetch_locked(path, name, version, sha256, log)
    finally:
        lock.release()


def _fetch_locked(path: Path, name: str, version: str, sha256: str | None, log) -> tuple[Path, str]:
    cached = sha256_of(path) if path.exists() else None
    if cached is not None:
        if cached == (sha256 or _read_sidecar(path)):
            return path, cached
        log(
            f"base: the cached {name} ({cached[:16]}...) does not match "
            f"{'the pin' if sha256 else 'its record'}; downloading it again to compare "
            "(the cached file stays until a verified one replaces it)"
        )
    part = path.with_suffix(".part")
    log(f"base: downloading {name} through pip's index (once; cached in {path.parent})")
    try:
        info = _download(name, version, part)
        expected = sha256 or info.get("sha256")
        if not expected:
            raise ToolkitError(f"the package index gives no sha256 for {name}: cannot verify it")
        digest = sha256_of(part)
        if digest != expected:
            what = "the pin" if sha256 else "the package index"
            same = " (the cached file too)" if cached == digest else ""
            raise ToolkitError(
                f"sha256 mismatch for {name}: {what} says {expected}, the "
                f"index serves {digest}{same}" + (": is pin.toml right?" if sha256 else "")
            )
    except ToolkitError:
        part.unlink(missing_ok=True)  # a failed download; the cached file is untouched
        raise
    part.replace(path)
    files.write(path.with_suffix(".sha256"), digest + "\n")
    return path, digest


def _read_sidecar(path: Path) -> str | None:
    side = path.with_suffix(".sha256")
    return side.read_text().strip() if side.exists() else None


def _pip_python() -> str:
    # Asked of the installed distributions, not the import system: a lookup of
    # "pip" through it makes setuptools' finder (Python 3.11) turn its own
    # distutils off for the rest of the process, and a later import of
    # setuptools there (linking the module: torch.utils.cpp_extension) fails.
    try:
        importlib.metadata.version("pip")
        return sys.executable
    except importlib.metadata.PackageNotFoundError:
        pass
    for cand in ("python3", "python"):
        exe = shutil.which(cand)
        if exe and subprocess.run([exe, "-c", "import pip"], capture_output=True).returncode == 0:
            return exe
    raise ToolkitError("downloading the vLLM sdist needs pip (python3 -m pip)")


def _download(name: str, version: str, dest: Path) -> dict:
    pkg_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=pkg_root)
    proc = subprocess.run(
        [_pip_python(), "-m", "serieskit.series._pipfetch", PACKAGE, version, name, str(dest)],
        stdout=subprocess.PIPE,
        stderr=None if _progress_wanted() else subprocess.PIPE,
        env=env,
        text=True,
    )
    if proc.returncode == pipfetch.NOT_FOUND:
        raise NoSdist(
            f"vLLM {version} has no source distribution ({name}) on pip's configured index",
            version,
        )
    if proc.returncode == pipfetch.UNREACHABLE:
        raise ToolkitError(
            f"cannot reach pip's package index to fetch {name}: "
            f"{last_line(proc.stderr, 'see the lines above')}"
        )
    if proc.returncode != 0:
        raise failed(f"download of {name}", proc)
    return json.loads(last_line(proc.stdout, "{}"))


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
    ident = f"{git.COMMITTER[0]} <{git.COMMITTER[1]}> {BASE_DATE}"
    msg = commit_message(version, sha256).encode()
    proc = git.popen(repo, "fast-import", "--quiet", "--date-format=raw", "--force")
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
    err = proc.stderr.read() if proc.stderr else b""
    if proc.wait() != 0:
        raise ToolkitError(f"git fast-import failed: {last_line(err)}")
    commit = git.rev(repo, base_ref(version))
    assert commit
    log(f"base: unpacked {count} files of {sdist.name} into commit {commit[:12]}")
    return commit


def ensure_repo(repo: Path) -> None:
    if not git.is_repo(repo):
        repo.mkdir(parents=True, exist_ok=True)
        git.git(repo, "init", "-q")


def recorded_sha256(repo: Path, commit: str) -> str | None:
    """The sdist sha256 a base commit was made from (its message records it)."""
    m = re.search(r"sha256 ([0-9a-f]{64})", git.git(repo, "log", "-1", "--format=%B", commit))
    return m.group(1) if m else None


def ensure_base(
    repo: Path, version: str, sha256: str | None, commit: str | None = None, log=print
) -> tuple[str, str]:
    """Make sure ``repo`` holds the base commit of ``version``; return (id, sha256).

    Checked every time: the sha256 the base was made from must be the pin's
    (``sha256``), and ``commit``, when given (the pin's), must be its id.
    """
    ensure_repo(repo)
    have = git.rev(repo, base_ref(version))
    if have:
        made_from = recorded_sha256(repo, have) or ""
        if sha256 and made_from != sha256:
            raise ToolkitError(
                f"the pin says vLLM {version} has sha256 {sha256}, but the base in {repo} "
                f"was made from an sdist with sha256 {made_from}: check pin.toml"
            )
        if commit and have != commit:
            raise ToolkitError(
                f"the base commit of vLLM {version} in {repo} is {have[:12]}, "
                f"the pin says {commit[:12]}: check pin.toml"
            )
        return have, made_from
    sdist, digest = fetch_sdist(version, sha256, log=log)
    made = import_sdist(repo, sdist, version, digest, log=log)
    if commit and made != commit:
        raise ToolkitError(
            f"base commit of vLLM {version} is {made[:12]}, the pin says {commit[:12]}: "
            "the pin or the import is wrong"
        )
    return made, digest
