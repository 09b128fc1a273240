"""serieskit.checks.layering and the check_layering.py it drives, on tiny trees."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import series_tool
from serieskit import git
from serieskit.checks import layering
from serieskit.errors import ToolkitError

SCRIPT = series_tool("check_layering.py")

FILES = {
    "vllm/__init__.py": "",
    "vllm/platforms/__init__.py": (
        "current_platform = object()\ndef f():\n    return current_platform.is_cuda()\n"
    ),
    "vllm/model_executor/models/registry.py": (
        "_TEXT_GENERATION_MODELS = {\n"
        '    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),\n'
        '    "MiMoForCausalLM": ("mimo", "MiMoForCausalLM"),\n'
        "}\n"
        "class _Registry:\n    pass\n"
        "ModelRegistry = _Registry()\n"
    ),
    "vllm/model_executor/models/llama.py": (
        "from vllm.platforms import current_platform\n"
        "class LlamaModel:\n    pass\n"
        "class LlamaForCausalLM:\n"
        "    def f(self):\n"
        "        return current_platform.is_rocm()\n"
    ),
    "vllm/config/speculative.py": (
        "from vllm.model_executor.models import ModelRegistry\n"  # 1 import
        "from vllm.model_executor.models.llama import LlamaModel as LM\n"  # 1 import
        "import vllm.model_executor.models.llama\n"  # 1 import
        "ARCHS = ['LlamaForCausalLM', 'MiMoForCausalLM', 'NotAModel']\n"  # 2 strings
        "def f(hf_config, module):\n"
        "    ModelRegistry.resolve(LM)\n"  # 2 bound names
        "    x = vllm.model_executor.models.llama.LlamaModel\n"  # 1 chain
        "    y = module.LlamaForCausalLM\n"  # 1 model class attribute
        "    if hf_config.model_type in ('mimo', 'mimo_mtp'):\n"  # 2 model types
        "        hf_config.model_type = 'mimo_mtp'\n"  # 1 model type
        "    return x, y\n"
    ),
    "vllm/layers/runner.py": (
        "import torch\n"
        "from vllm.platforms import current_platform\n"  # imports do not count
        "def f(x):\n"
        "    if current_platform.is_cuda() and current_platform.has_device_capability(75):\n"  # 2
        "        torch.cuda.synchronize()\n"  # 1
        "    s = torch.cuda.Stream()\n"  # 1
        "    d = current_platform.device_type\n"  # 1
        "    return x.cuda(), torch.backends.cudnn.enabled, d, s\n"  # 2
    ),
    "vllm/layers/clean.py": "import torch\ndef f(x):\n    return torch.relu(x)\n",
}


def make_tree(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


@pytest.fixture
def base(tmp_path) -> Path:
    return make_tree(tmp_path / "base", FILES)


def test_counts_follow_the_documented_rules(base):
    counts = layering.counts(base, SCRIPT)
    assert counts == {
        "vllm/config/speculative.py": {"model": 12, "platform": 0},
        "vllm/layers/runner.py": {"model": 0, "platform": 7},
        # model files count platform coupling only; vllm/platforms/ counts none
        "vllm/model_executor/models/llama.py": {"model": 0, "platform": 1},
    }


def test_unchanged_tree_passes(base, tmp_path):
    head = tmp_path / "head"
    shutil.copytree(base, head)
    increases, lines = layering.check(base, head, SCRIPT)
    assert increases == [] and lines == []


def test_raised_count_fails_naming_file_and_counts(base, tmp_path):
    head = tmp_path / "head"
    shutil.copytree(base, head)
    runner = head / "vllm/layers/runner.py"
    extra = "def g():\n    return current_platform.is_device_capability(75)\n"
    runner.write_text(runner.read_text() + extra)
    (head / "vllm/layers/clean.py").write_text('A = "LlamaForCausalLM"\n')
    increases, lines = layering.check(base, head, SCRIPT)
    assert increases == [
        layering.Change("vllm/layers/clean.py", "model", 0, 1),
        layering.Change("vllm/layers/runner.py", "platform", 7, 8),
    ]
    assert lines == [
        "vllm/layers/clean.py (model coupling 0 -> 1)",
        "vllm/layers/runner.py (platform coupling 7 -> 8)",
    ]


def test_decrease_passes(base, tmp_path):
    head = tmp_path / "head"
    shutil.copytree(base, head)
    (head / "vllm/layers/runner.py").write_text("def f(x):\n    return x\n")
    increases, lines = layering.check(base, head, SCRIPT)
    assert increases == [] and lines == []
    changes = layering.compare(layering.counts(base, SCRIPT), layering.counts(head, SCRIPT))
    assert changes == [layering.Change("vllm/layers/runner.py", "platform", 7, 0)]
    assert not changes[0].increase


def _ref_and_head(base, tmp_path):
    """ref: an older tree the hook compares against, over which the base
    already raised runner.py's platform coupling; head: a copy of the base."""
    ref = tmp_path / "ref"
    shutil.copytree(base, ref)
    (ref / "vllm/layers/runner.py").write_text("def f(x):\n    return x\n")
    head = tmp_path / "head"
    shutil.copytree(base, head)
    return ref, head


def test_base_reports_the_same(base, tmp_path):
    # The series (head) raises speculative.py on its own.
    ref, head = _ref_and_head(base, tmp_path)
    spec = head / "vllm/config/speculative.py"
    spec.write_text(spec.read_text() + "B = ['LlamaForCausalLM', 'MiMoForCausalLM']\n")
    increases, lines = layering.check(base, head, SCRIPT, ref_root=ref)
    assert increases == [layering.Change("vllm/config/speculative.py", "model", 12, 14)]
    assert lines == [
        "vllm/config/speculative.py (model coupling 12 -> 14)",
        "vllm/layers/runner.py (platform coupling 0 -> 7); base reports the same",
    ]


def test_raised_beyond_the_base_shows_the_base_figure(base, tmp_path):
    ref, head = _ref_and_head(base, tmp_path)
    runner = head / "vllm/layers/runner.py"
    runner.write_text(runner.read_text() + "def g(t):\n    return t.cuda()\n")
    increases, lines = layering.check(base, head, SCRIPT, ref_root=ref)
    assert increases == [layering.Change("vllm/layers/runner.py", "platform", 7, 8)]
    assert lines == ["vllm/layers/runner.py (platform coupling 0 -> 8); base reports 0 -> 7"]


def test_format():
    assert layering.format(layering.Change("vllm/config/speculative.py", "model", 142, 144)) == (
        "vllm/config/speculative.py (model coupling 142 -> 144)"
    )


def test_missing_script_and_broken_tree(base, tmp_path):
    with pytest.raises(ToolkitError, match="no layering check"):
        layering.counts(base, tmp_path / "nope.py")
    (base / "vllm/broken.py").write_text("def (:\n")
    with pytest.raises(ToolkitError, match="check_layering.py on .* failed"):
        layering.counts(base, SCRIPT)


def _git(repo: Path, *args: str) -> None:
    git.git(repo, *args, env={"GIT_AUTHOR_NAME": "A", "GIT_AUTHOR_EMAIL": "a@example.com"})


def test_hook_against_a_git_ref(base):
    """Pre-commit mode: the working tree against the merge base of a ref."""
    _git(base, "init", "-q")
    _git(base, "add", "-A")
    _git(base, "commit", "-q", "-m", "base")
    (base / "tools/pre_commit").mkdir(parents=True)
    shutil.copy(SCRIPT, base / "tools/pre_commit/check_layering.py")
    script = base / "tools/pre_commit/check_layering.py"
    env = {k: v for k, v in os.environ.items() if k != "PRE_COMMIT_FROM_REF"}

    def hook(*args: str, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(script), *args],
            capture_output=True,
            text=True,
            env={**env, **extra},
        )

    assert hook("--base-ref", "HEAD").returncode == 0
    runner = base / "vllm/layers/runner.py"
    runner.write_text(runner.read_text() + "def g(t):\n    return t.cuda()\n")
    proc = hook("--base-ref", "HEAD")
    assert proc.returncode == 1
    assert "vllm/layers/runner.py (platform coupling 7 -> 8)" in proc.stdout
    # pre-commit's --from-ref wins over --base-ref
    _git(base, "commit", "-q", "-am", "raise")
    assert hook("--base-ref", "HEAD").returncode == 0
    assert hook("--base-ref", "HEAD", PRE_COMMIT_FROM_REF="HEAD~1").returncode == 1
    # a ref that does not exist skips with a message
    proc = hook("--base-ref", "no-such-ref")
    assert proc.returncode == 0 and "not found" in proc.stderr
    # --json of the committed tree equals the toolkit's view
    proc = hook("--json", "--root", str(base))
    assert json.loads(proc.stdout)["vllm/layers/runner.py"] == {"model": 0, "platform": 8}


def test_check_series_on_a_fork_base(tmp_path):
    """Upstream (the pin), a fork's base on top, the series on top of that:
    the fork's own increase is "base reports the same", the series' own
    fails unless a patch declares it."""
    from conftest import commit_file

    repo = tmp_path / "repo"
    repo.mkdir()
    git.git(None, "init", "-q", str(repo))
    use = "from vllm.platforms import current_platform\n\nX = current_platform.is_cuda()\n"
    upstream = commit_file(repo, "vllm/a.py", "A = 1\n", "upstream")
    fork = commit_file(repo, "vllm/a.py", use, "fork")
    commit_file(repo, "vllm/base.py", use, "series")
    lines: list[str] = []
    assert not layering.check_series(repo, fork, SCRIPT, {}, ref=upstream, log=lines.append)
    text = "\n".join(lines)
    assert "vllm/a.py (platform coupling 0 -> 1); base reports the same" in text
    assert "vllm/base.py (platform coupling 0 -> 1)" in text
    assert lines[-1] == "  check-layering: FAILED"
    lines = []
    assert layering.check_series(
        repo, fork, SCRIPT, {"vllm/base.py": "on purpose"}, ref=upstream, log=lines.append
    )
    assert any(line.endswith("declared, on purpose") for line in lines)
