"""The pinned base: reproducible import, verification, clear errors."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from conftest import BASE_FILES, REPO_ROOT, add_release, make_sdist, quiet
from serieskit import git
from serieskit.errors import ToolkitError
from serieskit.series import base


def test_import_is_reproducible_and_complete(tmp_path, cache, monkeypatch):
    sha = add_release(cache, "0.0.1", BASE_FILES)
    sdist = cache / "vllm-0.0.1.tar.gz"
    ids = []
    for i, user in enumerate(["Alice", "Bob"]):
        monkeypatch.setenv("GIT_AUTHOR_NAME", user)  # must not leak into the base
        monkeypatch.setenv("GIT_COMMITTER_DATE", f"{1600000000 + i} +0200")
        repo = tmp_path / f"r{i}"
        base.ensure_repo(repo)
        ids.append(base.import_sdist(repo, sdist, "0.0.1", sha, log=quiet))
    assert ids[0] == ids[1]
    listing = git.git(tmp_path / "r0", "ls-tree", "-r", ids[0])
    modes = {line.split("\t")[1]: line.split()[0] for line in listing.splitlines()}
    # Every file of the sdist, those its own .gitignore names included, nothing added.
    assert set(modes) == set(BASE_FILES) | {"vllm/link.py"}
    assert modes["tools/run.sh"] == "100755"
    assert modes["setup.py"] == "100644"
    assert modes["vllm/link.py"] == "120000"
    msg = git.git(tmp_path / "r0", "log", "-1", "--format=%an %ad %s", "--date=raw", ids[0])
    assert msg.strip() == f"{git.COMMITTER[0]} 946684800 +0000 vLLM 0.0.1"


def test_other_content_gives_other_id(tmp_path, cache):
    sha1 = add_release(cache, "0.0.1", BASE_FILES)
    sha2 = add_release(cache, "0.0.2", {**BASE_FILES, "setup.py": "changed\n"})
    repo = tmp_path / "r"
    base.ensure_repo(repo)
    one = base.import_sdist(repo, cache / "vllm-0.0.1.tar.gz", "0.0.1", sha1, log=quiet)
    two = base.import_sdist(repo, cache / "vllm-0.0.2.tar.gz", "0.0.2", sha2, log=quiet)
    assert one != two


def test_ensure_base_checks_the_pinned_commit(tmp_path, cache):
    sha = add_release(cache, "0.0.1", BASE_FILES)
    with pytest.raises(ToolkitError, match="the pin says 000000000000"):
        base.ensure_base(tmp_path / "r", "0.0.1", sha, "0" * 40, log=quiet)


def test_cached_sdist_is_reused_without_download(cache, monkeypatch):
    sha = add_release(cache, "0.0.1", BASE_FILES)
    monkeypatch.setattr(base, "_download", lambda *a: pytest.fail("downloaded again"))
    path, digest = base.fetch_sdist("0.0.1", sha)
    assert digest == sha and path.exists()


def test_checksum_mismatch_is_an_error_and_leaves_nothing(tmp_path, cache, monkeypatch):
    def fake_download(name, version, dest):
        make_sdist(dest, version, {"x": "tampered"})
        return {"sha256": "f" * 64}

    monkeypatch.setattr(base, "_download", fake_download)
    with pytest.raises(ToolkitError, match="sha256 mismatch for vllm-0.0.9.tar.gz: the pin"):
        base.fetch_sdist("0.0.9", "a" * 64)
    assert list(cache.glob("vllm-0.0.9*")) == []


def test_corrupt_cache_is_downloaded_again(cache, monkeypatch):
    sha = add_release(cache, "0.0.1", BASE_FILES)
    good = (cache / "vllm-0.0.1.tar.gz").read_bytes()
    (cache / "vllm-0.0.1.tar.gz").write_bytes(b"garbage")
    calls = []

    def fake_download(name, version, dest):
        calls.append(name)
        dest.write_bytes(good)
        return {"sha256": sha}

    monkeypatch.setattr(base, "_download", fake_download)
    _, digest = base.fetch_sdist("0.0.1", sha, log=quiet)
    assert calls == ["vllm-0.0.1.tar.gz"] and digest == sha


def test_index_without_hash_is_refused(cache, monkeypatch):
    def fake_download(name, version, dest):
        dest.write_bytes(b"x")
        return {"sha256": None}

    monkeypatch.setattr(base, "_download", fake_download)
    with pytest.raises(ToolkitError, match="gives no sha256"):
        base.fetch_sdist("0.0.8")


@pytest.mark.parametrize("bad", ["latest", "0.26.0; rm -rf /", "../0.1"])
def test_bad_version_is_refused(bad):
    with pytest.raises(ToolkitError, match="not a vLLM release version"):
        base.check_version(bad)


def test_pin_round_trip_and_errors(tmp_path):
    pin = base.Pin("0.26.0", "ab" * 32, "cd" * 20)
    base.write_pin(tmp_path, pin)
    assert base.read_pin(tmp_path) == pin
    for text, why in [
        ("[base]\nversion = 1\n", "base.version must be"),
        (f'[base]\nversion = "0.26.0"\nsha256 = "{"ab" * 31}"\n', "64 hex digits"),
        ("[base\n", "not valid TOML"),
        ("x = 1\n", "no \\[base\\] table"),
    ]:
        (tmp_path / "pin.toml").write_text(text)
        with pytest.raises(ToolkitError, match=why):
            base.read_pin(tmp_path)
    with pytest.raises(ToolkitError, match="no pin file"):
        base.read_pin(tmp_path / "nowhere")


def test_git_missing_or_too_old(monkeypatch):
    monkeypatch.setattr(git.shutil, "which", lambda name: None)
    with pytest.raises(ToolkitError, match="git is not installed"):
        git.require_version()
    monkeypatch.undo()
    monkeypatch.setattr(git, "version", lambda: (2, 17))
    with pytest.raises(ToolkitError, match="git 2.17 is too old"):
        git.require_version()


def test_two_sessions_fetching_at_once_download_once(cache, monkeypatch):
    """Two work trees (or test workers) sharing the cache: the second waits
    for the first's download instead of writing the same .part file."""
    sha = add_release(cache, "0.0.1", BASE_FILES)
    good = (cache / "vllm-0.0.1.tar.gz").read_bytes()
    (cache / "vllm-0.0.1.tar.gz").unlink()
    calls = []

    def slow_download(name, version, dest):
        calls.append(name)
        dest.write_bytes(good[: len(good) // 2])
        time.sleep(0.5)
        dest.write_bytes(good)
        return {"sha256": sha}

    monkeypatch.setattr(base, "_download", slow_download)
    got, lines = [], []
    threads = [
        threading.Thread(
            target=lambda: got.append(base.fetch_sdist("0.0.1", sha, log=lines.append))
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["vllm-0.0.1.tar.gz"]
    assert [digest for _, digest in got] == [sha, sha]
    assert any("waiting for another download" in line for line in lines)


def test_a_download_is_announced_before_it_starts(cache, monkeypatch):
    sha = add_release(cache, "0.0.1", BASE_FILES)
    good = (cache / "vllm-0.0.1.tar.gz").read_bytes()
    (cache / "vllm-0.0.1.tar.gz").unlink()
    lines: list[str] = []

    def fake_download(name, version, dest):
        assert any(f"downloading {name}" in line for line in lines), lines
        dest.write_bytes(good)
        return {"sha256": sha}

    monkeypatch.setattr(base, "_download", fake_download)
    base.fetch_sdist("0.0.1", sha, log=lines.append)
    assert "once; cached in" in lines[0]


def test_a_download_keeps_no_second_copy_in_pips_cache():
    """The sdist and the released wheel are kept in the toolkit's cache; pip's
    session, which would keep another copy of each (336 MB for the wheel),
    has no cache (issue 39)."""
    # In a process of its own, as the toolkit runs it: pip imported into a
    # pytest worker on Python 3.11 turns setuptools' distutils off for the
    # rest of it (_distutils_hack's spec_for_pip), and a later test that
    # imports setuptools (torch.utils.cpp_extension: test_build.py) fails.
    probe = (
        "from serieskit.series import _pipfetch; "
        "print(_pipfetch._finder_and_session()[1].cache_dir)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_looking_for_pip_leaves_setuptools_importable():
    """Linking the module imports setuptools (torch.utils.cpp_extension) in a
    process that may have looked for pip first: on Python 3.11 a lookup of
    "pip" through the import system turned setuptools' own distutils off, and
    that import failed."""
    probe = (
        "from serieskit.series import base; base._pip_python(); "
        "import setuptools, distutils.core; print(distutils.core.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    if sys.version_info < (3, 12):
        assert "_distutils" in out.stdout  # setuptools' copy, as it expects
