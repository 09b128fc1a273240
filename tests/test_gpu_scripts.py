"""The GPU machine's scripts against the series they run on: the config
fields they set exist in the series' patches, the test selections of
gpu/two_gpu.sh select tests of the series, and every path that script names
exists. Read from the patch files: no applied tree, no vLLM, no GPU."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

from test_results import ROOT, script

from serieskit.series import series

PATCHES = sorted((ROOT / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch"))
TWO_GPU = ROOT / "gpu" / "two_gpu.sh"
KERNEL_PY = "vllm/config/kernel.py"
PARALLEL_PY = "vllm/config/parallel.py"


def _diff_lines(path: str):
    """(patch, line) of every diff line of ``path`` in the series, in order."""
    for patch in PATCHES:
        current = None
        for line in patch.read_text().splitlines():
            if line.startswith("diff --git "):
                current = line.split(" b/", 1)[1]
            elif current == path and not line.startswith(("+++", "---")):
                yield patch.name, line


def class_fields(path: str, cls: str) -> set[str]:
    """The fields (``    name: type``) the series adds to class ``cls`` of
    ``path``, less those it removes; a hunk's class is the one its header
    names (git's function context) until a top-level line says otherwise."""
    fields: set[str] = set()
    klass = None
    for _, line in _diff_lines(path):
        if line.startswith("@@"):
            m = re.search(r"@@ class (\w+)", line)
            klass = m.group(1) if m else None
            continue
        top = re.match(r"^[ +-](?:class (\w+)|[^\s#@)\]}])", line)
        if top:
            klass = top.group(1)
            continue
        m = re.match(r"^([+-])    (\w+): ", line)
        if m and klass == cls:
            (fields.add if m.group(1) == "+" else fields.discard)(m.group(2))
    return fields


def test_class_fields_reads_the_series_configs():
    host = class_fields(PARALLEL_PY, "HostAllReduceConfig")
    assert {"max_bytes", "copy_engine_max_bytes", "timeout_s"} <= host
    parallel = class_fields(PARALLEL_PY, "ParallelConfig")
    assert {"enable_host_all_reduce", "host_all_reduce_config"} <= parallel
    kernel = class_fields(KERNEL_PY, "KernelConfig")
    assert "tp_prefill_overlap_min_tokens" in kernel and "host_reduce" not in kernel
    # a function's parameters after the class are not its fields
    assert "tensor_parallel_size" not in kernel


def check_host_all_reduce(config: dict, fields: set[str], where: str) -> None:
    """``config`` names only fields of the series' HostAllReduceConfig and
    passes its own checks (its pydantic constraints and validator)."""
    assert set(config) <= fields, f"{where}: {sorted(set(config) - fields)} not in the series"
    max_bytes = config.get("max_bytes", 256 * 1024)
    assert max_bytes > 0 and max_bytes % 16 == 0, where
    ce = config.get("copy_engine_max_bytes", 0)
    assert ce == 0 or (ce > max_bytes and ce % 16 == 0), where


def test_host_reduce_bench_builds_configs_of_the_series():
    fields = class_fields(PARALLEL_PY, "HostAllReduceConfig")
    bench = script("bench/host_reduce.py")
    for name, config in bench.CHANNELS.items():
        check_host_all_reduce(config, fields, f"bench/host_reduce.py {name}")
    # the kernel mode serves every size, the copy engines every size
    assert bench.CHANNELS["kernel_mode"]["max_bytes"] >= max(bench.SIZES)
    assert bench.CHANNELS["copy_engine_mode"]["copy_engine_max_bytes"] >= max(bench.SIZES)
    source = (ROOT / "bench/host_reduce.py").read_text()
    # vLLM's own class: a field the series adds reaches HostAllReduce at its default
    assert "SimpleNamespace" not in source and "HostAllReduceConfig(**CHANNELS" in source


def test_e2e_arms_set_fields_of_the_series():
    kernel = class_fields(KERNEL_PY, "KernelConfig")
    parallel = class_fields(PARALLEL_PY, "ParallelConfig")
    host = class_fields(PARALLEL_PY, "HostAllReduceConfig")
    for f in sorted((ROOT / "e2e" / "arms").glob("*.json")):
        arm = json.loads(f.read_text())
        assert set(arm) <= {
            "name",
            "parallel_config",
            "kernel_config",
            "attention_config",
            "compilation_config",
            "env",
        }
        config = arm["kernel_config"]
        assert set(config) <= kernel, f"{f.name}: {sorted(set(config) - kernel)}"
        engine = arm.get("parallel_config", {})
        assert set(engine) <= parallel, f"{f.name}: {sorted(set(engine) - parallel)}"
        check_host_all_reduce(engine.get("host_all_reduce_config", {}), host, f.name)
        if engine.get("host_all_reduce_config"):
            assert engine.get("enable_host_all_reduce"), f"{f.name}: settings of an off switch"


# --- gpu/two_gpu.sh ----------------------------------------------------------------


def two_gpu_steps() -> list[str]:
    m = re.search(r'^STEPS="([^"]+)"', TWO_GPU.read_text(), re.M)
    assert m
    return m.group(1).split()


def test_two_gpu_script_parses():
    assert subprocess.run(["bash", "-n", str(TWO_GPU)], capture_output=True).returncode == 0


def test_two_gpu_script_names_only_what_exists():
    text = TWO_GPU.read_text()
    named = set(re.findall(r"\b(?:gpu|bench|e2e|tests)/[\w./-]+\.(?:sh|py|json)\b", text))
    assert "gpu/stage2.sh" in named and "e2e/arms/reference.json" in named
    test_files = set(series.test_files(ROOT))
    for path in sorted(named):
        if path.startswith("tests/"):
            assert path in test_files, f"{path}: not a test file of the series"
        else:
            assert (ROOT / path).is_file(), f"{path} does not exist"


def test_two_gpu_selections_select_tests_of_the_series():
    """Each ``tests NAME CAP SELECT FILE...`` of the script: every word of its
    -k expression is in the name of a test the series adds to those files."""
    text = TWO_GPU.read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^(\w+)=(\S+)$", text, re.M))
    calls = [shlex.split(m) for m in re.findall(r"^\s*tests (\w+ \d+ .+)$", text, re.M)]
    assert len(calls) >= 5
    for name, _, select, *files in calls:
        files = [variables.get(f.strip('"$'), f) for f in files]
        tests = [
            line
            for f in files
            for _, line in _diff_lines(f)
            if re.match(r"^\+(async )?def test_", line)
        ]
        assert tests, f"{name}: no tests in {files}"
        words = [w for w in re.findall(r"\w+", select) if w not in ("and", "or", "not")]
        for word in words:
            assert any(word in t for t in tests), f"{name}: -k {select!r} ({word})"


def test_two_gpu_steps_are_the_documented_calls():
    text = TWO_GPU.read_text()
    docs = (ROOT / "docs" / "gpu-evidence.md").read_text()
    for step in two_gpu_steps():
        assert re.search(rf"^\s+{re.escape(step)}\)$", text, re.M), f"no case for {step}"
        assert f"two_gpu.sh {step}" in docs, f"docs/gpu-evidence.md lacks step {step}"


# --- gpu/profile_attention.sh ----------------------------------------------------------


def test_profile_script_parses_and_names_what_exists():
    script = ROOT / "gpu" / "profile_attention.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    named = set(re.findall(r"\b(?:gpu|bench)/[\w./-]+\.(?:sh|py)\b", text))
    assert "bench/prefill_attention_profile.py" in named
    for path in sorted(named):
        assert (ROOT / path).is_file(), f"{path} does not exist"
    # The kernel the filter names is the one the extension defines.
    patch = (ROOT / "patches").glob("*head-d*.patch")
    assert any("paged_prefill_attention_sm75_kernel(" in f.read_text() for f in patch)
    assert "regex:paged_prefill_attention_sm75_kernel" in text


def test_profile_target_refuses_a_missing_library(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "prefill_attention_profile.py"),
            "--lib",
            str(tmp_path / "none.so"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "is not a file" in proc.stderr
