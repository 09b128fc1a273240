"""lint: ruff and mypy on the files the series changes, nothing else."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from conftest import commit_file
from serieskit import lint

needs_tools = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None or importlib.util.find_spec("mypy") is None,
    reason="needs ruff and mypy (installed by nox -s ci / lint)")


@pytest.fixture
def tree(tmp_path):
    t = tmp_path / "tree"
    t.mkdir()
    subprocess.run(["git", "init", "-q", str(t)], check=True)
    (t / "pyproject.toml").write_text("[tool.ruff]\nline-length = 88\n")
    commit_file(t, "vllm/old.py", "import os\n", "base with a ruff finding of its own")
    return t


@needs_tools
def test_only_the_series_files_are_checked_and_a_finding_fails(tree):
    base = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    commit_file(tree, "vllm/new.py", "def f(x: int) -> int:\n    return x\n", "clean")
    assert lint.changed_python_files(tree, base) == ["vllm/new.py"]
    lines = []
    assert lint.lint(tree, base, log=lines.append) == []  # vllm/old.py is not the series'
    commit_file(tree, "vllm/new.py", "import os\ndef f(x: int) -> str:\n    return x\n", "bad")
    lines = []
    failed = lint.lint(tree, base, log=lines.append)
    assert failed == ["ruff check", "ruff format", "mypy"]
    assert any("F401" in line for line in lines)  # the unused import, named


def test_no_python_changes_say_so(tree):
    base = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    lines = []
    assert lint.lint(tree, base, log=lines.append) == []
    assert lines == ["lint: the series changes no Python files"]


def test_base_files_are_checked_inside_their_packages(tree, monkeypatch):
    """The base's run sees the packages' __init__.py, as the tree's run does:
    mypy reports some of upstream's errors only there."""
    commit_file(tree, "pyproject.toml", "[tool.ruff]\nline-length = 88\n", "config")
    commit_file(tree, "vllm/__init__.py", "", "package")
    commit_file(tree, "vllm/sub/__init__.py", "", "subpackage")
    commit_file(tree, "vllm/sub/mod.py", "x = 1\n", "module")
    base = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    assert lint.package_inits(["vllm/sub/mod.py", "vllm/old.py"]) == [
        "vllm/__init__.py", "vllm/sub/__init__.py"]
    seen = {}

    def fake_mypy_errors(root, files):
        seen["files"] = files
        seen["tree"] = sorted(str(p.relative_to(root)) for p in root.rglob("*.py"))
        return set()

    monkeypatch.setattr(lint, "mypy_errors", fake_mypy_errors)
    lint._base_mypy_errors(tree, base, ["vllm/sub/mod.py"])
    assert seen["files"] == ["vllm/sub/mod.py"]
    assert seen["tree"] == ["vllm/__init__.py", "vllm/sub/__init__.py", "vllm/sub/mod.py"]
