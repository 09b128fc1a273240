"""Fixtures: small synthetic vLLM "sdists" and toolkit roots around them."""

from __future__ import annotations

import functools
import io
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest

from serieskit import git
from serieskit.series import base, series

REPO_ROOT = Path(__file__).resolve().parent.parent

BASE_FILES = {
    "vllm/__init__.py": "VERSION = 1\n",
    "vllm/config/kernel.py": "class KernelConfig:\n    a = 1\n    b = 2\n    c = 3\n",
    "vllm/utils.py": "".join(f"def f{i}():\n    return {i}\n\n" for i in range(20)),
    "setup.py": "print('setup')\n",
    "tools/run.sh": "#!/bin/sh\necho run\n",
    ".gitignore": "*.so\nbuild/\n",
    "vllm/_C.so": "not really a library\n",
}


def make_sdist(
    path: Path, version: str, files: dict[str, str], executable: tuple[str, ...] = ("tools/run.sh",)
) -> Path:
    """A .tar.gz laid out like a PyPI sdist: everything under vllm-VERSION/."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(data)
            info.mode = 0o755 if name in executable else 0o644
            info.mtime = 1234567890
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo(f"vllm-{version}/vllm/link.py")
        link.type = tarfile.SYMTYPE
        link.linkname = "utils.py"
        tar.addfile(link)
    return path


@pytest.fixture(autouse=True)
def bare_pytest(monkeypatch):
    """A pytest that a test starts (the runner's, gpu/run_tests.py's, on the
    small trees the tests write) loads no plugins installed beside it: the
    files need none, and loading them took most of each process's second.
    Set per test, after the workers of this session have started."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("VLLM_SERIES_CACHE", str(d))
    monkeypatch.setenv("VLLM_SERIES_QUIET", "1")
    return d / "sdists"


def add_release(cache: Path, version: str, files: dict[str, str]) -> str:
    """Put a synthetic sdist in the cache (as if downloaded); return its sha256."""
    path = make_sdist(cache / f"vllm-{version}.tar.gz", version, files)
    digest = base.sha256_of(path)
    path.with_suffix(".sha256").write_text(digest + "\n")
    return digest


_BASE_COMMITS: dict[tuple[str, str], str] = {}


def base_commit(sdist: Path, version: str, sha256: str) -> str:
    """The base commit ``import_sdist`` makes of ``sdist`` (what a pin names):
    its id depends on the version and the sdist's content (its sha256) alone,
    so it is made once per test process, in a scratch repository. The work
    tree's own import (apply's) runs in every test; test_base.py checks that
    the same sdist gives the same id."""
    key = (version, sha256)
    if key not in _BASE_COMMITS:
        scratch = Path(tempfile.mkdtemp(prefix="base-commit-"))
        try:
            base.ensure_repo(scratch)
            _BASE_COMMITS[key] = base.import_sdist(scratch, sdist, version, sha256, log=quiet)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return _BASE_COMMITS[key]


def make_root(folder: Path, cache: Path) -> Path:
    """A toolkit root (``folder/root``) on synthetic vLLM 0.0.1, with an empty series."""
    r = folder / "root"
    (r / "patches").mkdir(parents=True)
    (r / "patches" / "series").write_text("")
    sha = add_release(cache, "0.0.1", BASE_FILES)
    commit = base_commit(cache / "vllm-0.0.1.tar.gz", "0.0.1", sha)
    base.write_pin(r, base.Pin("0.0.1", sha, commit))
    return r


@pytest.fixture
def root(tmp_path, cache) -> Path:
    """A toolkit root on synthetic vLLM 0.0.1, with an empty series."""
    return make_root(tmp_path, cache)


def commit_file(
    repo: Path,
    path: str,
    text: str,
    subject: str,
    author: str = "Ada <ada@example.com>",
    date: str = "1700000000 +0100",
) -> str:
    """Commit one file change in ``repo`` as a user would."""
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    name, email = author[:-1].split(" <")
    env = {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": "Someone",
        "GIT_COMMITTER_EMAIL": "someone@example.com",
    }
    git.git(repo, "add", path)
    git.git(repo, "commit", "-q", "-m", subject, "-m", "Why: because the test says so.", env=env)
    return git.rev(repo, "HEAD") or ""


def quiet(*_args) -> None:
    pass


@functools.cache
def series_tool(name: str) -> Path:
    """``tools/pre_commit/<name>`` as the series carries it (its first patch):
    the toolkit drives these scripts, so its tests run the real ones."""
    wanted = f"tools/pre_commit/{name}"
    for patch in series.read_series(REPO_ROOT):
        path = REPO_ROOT / "patches" / patch
        if f"diff --git a/{wanted} b/{wanted}" in path.read_text(errors="replace"):
            dest = Path(tempfile.mkdtemp(prefix="series-tool-"))
            git.git(dest, "apply", f"--include={wanted}", str(path))
            return dest / wanted
    raise LookupError(f"no patch of the series adds {wanted}")
