"""serieskit.checks.docs: the runtime reference generator driven on a tiny tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import commit_file, series_tool
from serieskit import git
from serieskit.checks import docs
from serieskit.errors import ToolkitError

KERNEL = '''\
from dataclasses import field
from typing import Literal

from pydantic import Field

from vllm.config.utils import config

HostReduceMode = Literal["kernel", "copy_engine"]


@config
class HostReduceConfig:
    """Two-rank all-reduce through pinned host memory. Details follow."""

    enabled: bool = False
    """Use the host all-reduce. Off by default."""

    mode: HostReduceMode = "kernel"
    """How data moves, e.g. `kernel` or `copy_engine`."""

    max_bytes: int = Field(default=1 << 20, ge=1)
    """Largest message in bytes."""

    def __post_init__(self):
        if self.enabled and self.mode not in ("kernel", "copy_engine"):
            raise ValueError(f"unknown host reduce mode {self.mode!r}")
        self._verify()

    def _verify(self):
        assert self.max_bytes % 16 == 0, "max_bytes must be a multiple of 16"


@config
class KernelConfig:
    """Configuration for kernel selection."""

    host_reduce: HostReduceConfig = Field(default_factory=HostReduceConfig)
    """Host all-reduce settings."""

    moe_backend: str = "auto"
    """Backend for MoE kernels. Long text."""
'''

ATTENTION = '''\
from dataclasses import field

from pydantic import field_validator

from vllm.config.utils import config


@config
class AttentionConfig:
    """Configuration for attention."""

    backend_per_kind: dict[str, str] = field(default_factory=dict)
    """Per-group overrides (e.g. `{"mla": "X"}`). More."""

    @field_validator("backend_per_kind", mode="before")
    @classmethod
    def _parse(cls, value):
        if not isinstance(value, dict):
            raise TypeError("backend_per_kind must be a dict")
        return value
'''


@pytest.fixture
def tree(tmp_path) -> Path:
    t = tmp_path / "vllm-tree"
    (t / "vllm" / "config").mkdir(parents=True)
    (t / "vllm" / "config" / "kernel.py").write_text(KERNEL)
    (t / "vllm" / "config" / "attention.py").write_text(ATTENTION)
    (t / "tools" / "pre_commit").mkdir(parents=True)
    shutil.copy(series_tool("generate_runtime_reference.py"), t / docs.GENERATOR)
    return t


def test_missing_reference_is_stale_then_regenerated(tree):
    diff = docs.check(tree)
    assert diff is not None
    assert diff.startswith(f"--- a/{docs.OUTPUT}\n+++ b/{docs.OUTPUT}\n")
    assert "+### `KernelConfig.host_reduce`" in diff

    assert docs.regenerate(tree) is True
    assert docs.check(tree) is None
    assert docs.regenerate(tree) is False


def test_reference_content(tree):
    docs.regenerate(tree)
    text = (tree / docs.OUTPUT).read_text()
    # KernelConfig first, then the config nested in it, then the next file.
    assert text.index("## KernelConfig") < text.index("## HostReduceConfig")
    assert text.index("## HostReduceConfig") < text.index("## AttentionConfig")
    section = text[text.index("### `HostReduceConfig.mode`") :]
    section = section[: section.index("\n### ", 1)]
    assert "How data moves, e.g. `kernel` or `copy_engine`.\n" in section
    assert "- Type: `HostReduceMode`" in section
    assert '- Default: `"kernel"`' in section
    assert "- Source: `vllm/config/kernel.py:18`" in section
    assert (
        '`self.enabled and self.mode not in ("kernel", "copy_engine")` -> '
        "`ValueError`: unknown host reduce mode {self.mode!r}" in section
    )
    assert "- Default: `HostReduceConfig()` (factory)" in text
    assert "- Default: `1 << 20`" in text
    assert "`ge=1` (`Field`" in text
    assert (
        "`assert self.max_bytes % 16 == 0`: max_bytes must be a multiple of 16 (`_verify`" in text
    )
    assert "`not isinstance(value, dict)` -> `TypeError`" in text
    assert "Use the host all-reduce.\n" in text and "Off by default" not in text


def test_stale_reference_gives_a_diff(tree):
    docs.regenerate(tree)
    kernel = tree / "vllm" / "config" / "kernel.py"
    kernel.write_text(KERNEL.replace('moe_backend: str = "auto"', 'moe_backend: str = "triton"'))
    diff = docs.check(tree)
    assert diff is not None
    assert '-- Default: `"auto"`' in diff
    assert '+- Default: `"triton"`' in diff
    assert docs.regenerate(tree) is True
    assert docs.check(tree) is None


def test_deterministic(tree, tmp_path):
    docs.regenerate(tree)
    first = (tree / docs.OUTPUT).read_bytes()
    other = tmp_path / "copy"
    shutil.copytree(tree, other)
    (other / docs.OUTPUT).unlink()
    docs.regenerate(other)
    assert (other / docs.OUTPUT).read_bytes() == first


def test_tree_without_generator(tmp_path):
    (tmp_path / "vllm").mkdir()
    with pytest.raises(ToolkitError, match="has no tools/pre_commit/generate_runtime_reference.py"):
        docs.check(tmp_path)
    with pytest.raises(ToolkitError, match="has no"):
        docs.regenerate(tmp_path)


def test_generator_error_is_one_line(tree):
    (tree / "vllm" / "config" / "attention.py").write_text("class (:\n")
    with pytest.raises(ToolkitError, match="generate_runtime_reference.py failed"):
        docs.check(tree)


def test_sources(tree):
    assert docs.sources(tree) == [
        "vllm/config/kernel.py",
        "vllm/config/attention.py",
        docs.GENERATOR,
        docs.OUTPUT,
    ]


def test_amend_gives_every_patch_the_reference_of_its_own_fields(tree):
    git.git(None, "init", "-q", str(tree))
    docs.regenerate(tree)
    git.git(tree, "add", "-A")
    base = commit_file(tree, "README", "base\n", "base")
    field = '    moe_backend: str = "auto"'
    more = KERNEL.replace(field, '    extra: int = 3\n    """An added field."""\n\n' + field)
    commit_file(tree, "vllm/config/kernel.py", more, "fields")
    unrelated = commit_file(tree, "vllm/other.py", "x = 1\n", "unrelated")
    commit_file(tree, "vllm/config/attention.py", ATTENTION.replace("More.", "Changed."), "attn")
    assert docs.check(tree) is not None
    lines = []
    assert docs.amend(tree, base, log=lines.append) == ["fields", "attn"]
    branch = git.branch(tree)
    assert branch
    for commit in docs.stale_commits(tree, base):
        git.git(tree, "checkout", "-q", commit)
        assert docs.check(tree) is None
    subject = git.commit_subject(tree, "HEAD~1")
    assert subject == "unrelated"
    assert unrelated  # replayed, but its own change is untouched
    git.git(tree, "checkout", "-q", branch)
    assert docs.amend(tree, base, log=lines.append) == []
    assert lines[-1].endswith("is current at every patch")
