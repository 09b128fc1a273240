"""The GPU machine's scripts against the series they run on: the config
fields they set exist in the series' patches, the test selections of
gpu/two_gpu.sh select tests of the series, and every path that script names
exists. Read from the patch files: no applied tree, no vLLM, no GPU."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile

from test_results import ROOT, script

from serieskit.series import series

PATCHES = sorted((ROOT / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch"))
TWO_GPU = ROOT / "gpu" / "two_gpu.sh"
KERNEL_PY = "vllm/config/kernel.py"
DBO_ARGS = {"enable_dbo", "dbo_prefill_token_threshold", "dbo_decode_token_threshold"}
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
    assert "host_reduce" not in kernel and "tp_prefill_overlap_min_tokens" not in kernel
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
            "engine_args",
            "env",
        }
        # The overlap is DBO's switch and thresholds (ParallelConfig upstream).
        assert set(arm.get("engine_args", {})) <= DBO_ARGS, f.name
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
    assert len(calls) >= 4
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
    docs = (ROOT / "docs" / "gpu-machine.md").read_text()
    for step in two_gpu_steps():
        assert re.search(rf"^\s+{re.escape(step)}\)$", text, re.M), f"no case for {step}"
        assert f"two_gpu.sh {step}" in docs, f"docs/gpu-machine.md lacks step {step}"


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


# --- gpu/evidence.sh ----------------------------------------------------------------

EVIDENCE = ROOT / "gpu" / "evidence.sh"


def evidence_setting(name: str) -> str:
    m = re.search(rf"^{name}=(\S+)$", EVIDENCE.read_text(), re.M)
    assert m, f"gpu/evidence.sh sets no {name}"
    return m.group(1)


def test_evidence_script_parses_and_names_only_what_exists():
    assert subprocess.run(["bash", "-n", str(EVIDENCE)], capture_output=True).returncode == 0
    named = set(re.findall(r"\b(?:gpu|bench)/[\w./-]+\.(?:sh|py)\b", EVIDENCE.read_text()))
    assert {"gpu/stage2.sh", "gpu/run_tests.py", "gpu/serve.sh", "bench/nvfp4_dequant.py"} <= named
    for path in sorted(named):
        assert (ROOT / path).is_file(), f"{path} does not exist"


def test_evidence_waits_for_its_own_jobs_by_id():
    """A bare `wait` also waits for the process substitution that tees the
    step's log (bash 5.1 on), which ends only with the script: it would hang
    the call until its limit."""
    bare = [x for x in EVIDENCE.read_text().splitlines() if re.match(r"^\s*wait\s*(#.*)?$", x)]
    assert bare == []
    assert 'wait "$beside"' in EVIDENCE.read_text()


def test_evidence_builds_in_one_line_as_the_other_recipes():
    lines = [x for x in EVIDENCE.read_text().splitlines() if "serieskit build" in x]
    assert len(lines) == 1
    assert "python3 -m serieskit build" in lines[0]
    assert "--arch 75 --ptx --link" in lines[0]


def test_evidence_runs_every_single_gpu_test_file_of_the_series():
    """The batch runs the pack's list (SERIES_TESTS): every test file of the
    series but the upstream files a patch extends (the micro-batch abort's
    GPU case sits in upstream's test_gpu_ubatch_slicing.py, whose other cases
    read a model config from the hub); TEST_GLOBS only put the longest
    first, each selecting a file of that list; the files run alone are the
    ones whose engines profile memory."""
    import fnmatch

    text = EVIDENCE.read_text()
    files = series.gpu_test_files(ROOT)
    assert "tests/v1/worker/test_gpu_ubatch_slicing.py" not in files
    assert "tests/v1/worker/test_ubatching.py" in files
    assert "SERIES_TESTS" in re.search(r"^    test_files .*$", text, re.M).group(0)
    # That file's own GPU case runs by itself (-k), from the pack's list.
    cases = series.gpu_test_cases(ROOT)
    assert cases == {
        "tests/v1/worker/test_gpu_ubatch_slicing.py": (
            "(test_ubatch_runner_failure_stops_the_parked_microbatch)"
        )
    }
    assert set(cases) <= set(series.test_files(ROOT)) - set(files)
    assert '"$root/src/SERIES_TEST_CASES"' in text and '-k "$expr"' in text
    chosen: dict[str, set[str]] = {}
    for name in ("ALONE_GLOBS", "TEST_GLOBS"):
        globs = re.search(rf'^{name}="([^"]+)"', text, re.M | re.S)
        assert globs, name
        chosen[name] = set()
        for g in globs.group(1).split():
            hits = fnmatch.filter(files, g)
            assert hits, f"{g} selects no test file of the series"
            chosen[name].update(hits)
    assert not chosen["ALONE_GLOBS"] & chosen["TEST_GLOBS"]
    # The backend's GPU tests boot vLLM on one GPU (memory profiled); NVFP4's
    # boot only at TP=2 and skip on one GPU.
    assert chosen["ALONE_GLOBS"] == {"tests/v1/attention/test_triton_turing_attn.py"}


def test_the_sittings_engine_settings_are_the_series_own():
    """The smoke and serve runs' backend, their share of the GPU, and the
    series' settings of the serve run: every config field they set is one
    the series defines (a field moved or renamed shows here)."""
    backend = evidence_setting("ATTENTION_BACKEND")
    assert backend == "TRITON_ATTN" or any(backend in p.read_text() for p in PATCHES)
    assert 0 < float(evidence_setting("GPU_SHARE")) <= 0.35  # beside the other tests
    assert int(evidence_setting("KV_CACHE_BYTES")) > 0  # no memory profiling beside the tests
    serve = script("gpu/serve.py")
    kernel = class_fields(KERNEL_PY, "KernelConfig")
    assert set(serve.ENGINE.get("kernel_config", {})) <= kernel
    attention = class_fields("vllm/config/attention.py", "AttentionConfig")
    assert set(serve.ENGINE.get("attention_config", {})) <= attention
    # vLLM refuses the host all-reduce at one rank: the one-GPU run leaves it off.
    assert "enable_host_all_reduce" not in serve.ENGINE


def evidence_run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """gpu/evidence.sh in a repository copy at ``tmp_path`` (gpu/ linked)."""
    if not (tmp_path / "gpu").exists():
        (tmp_path / "gpu").symlink_to(ROOT / "gpu")
    return subprocess.run(
        ["bash", "gpu/evidence.sh", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(
            os.environ,
            OUT=str(tmp_path / "out"),
            KEEP=str(tmp_path / "keep"),
            EVIDENCE=str(tmp_path / "ev"),
            RUN_ROOT=str(tmp_path / "run"),
        ),
    )


def test_evidence_stage_keeps_the_part_and_returns_its_log_and_timeline(tmp_path):
    part = tmp_path / ".dev" / "gpu" / "part1"
    part.mkdir(parents=True)
    (part / "core.xz.00").write_bytes(b"piece")
    proc = evidence_run(tmp_path, "stage", "part1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "keep" / "core.xz.00").read_bytes() == b"piece"
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["evidence-stage.log", "evidence-stage.tgz"]
    with tarfile.open(out / "evidence-stage.tgz") as tar:
        timeline = tar.extractfile("stage/timeline.jsonl").read().decode()
    (entry,) = [json.loads(x) for x in timeline.splitlines()]
    assert entry["step"] == "stage" and entry["args"] == "part1" and entry["rc"] == 0
    assert entry["end"] >= entry["start"] >= entry["machine_start"]
    assert [p["part"] for p in entry["parts"]] == ["stage-part1"]


def test_evidence_on_a_fresh_machine_says_so_and_still_returns_its_files(tmp_path):
    proc = evidence_run(tmp_path, "tests")
    assert proc.returncode == 1
    log = (tmp_path / "out" / "evidence-tests.log").read_text()
    assert "a fresh machine" in log
    assert (tmp_path / "out" / "evidence-tests.tgz").is_file()


def test_evidence_refuses_an_unknown_step(tmp_path):
    proc = evidence_run(tmp_path, "everything")
    assert proc.returncode == 2 and "STEP one of" in proc.stdout


def test_serve_takes_engine_arguments_as_flags():
    serve = script("gpu/serve.py")
    args = {
        "attention_backend": "X",
        "enforce_eager": True,
        "async_scheduling": False,
        "kernel_config": {"a": 1},
        "gpu_memory_utilization": 0.25,
    }
    assert serve.flags(args) == [
        "--attention-backend",
        "X",
        "--enforce-eager",
        "--no-async-scheduling",
        "--kernel-config",
        '{"a": 1}',
        "--gpu-memory-utilization",
        "0.25",
    ]


def test_evidence_tests_starts_the_batch_waits_and_returns_what_it_wrote(tmp_path):
    """The hand-off of the batch (its own session) to the call that returns
    it, on an assembled tree without the series' test files: the batch
    stops at once, saying so, and the call packs its log and the timeline."""
    (tmp_path / "run" / "src" / "vllm").mkdir(parents=True)
    proc = evidence_run(tmp_path, "tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(tmp_path / "out" / "evidence-tests.tgz") as tar:
        names = set(tar.getnames())
        log = tar.extractfile("batch/evidence-batch.log").read().decode()
        timeline = tar.extractfile("batch/timeline.jsonl").read().decode()
    assert {"batch/done", "tests/timeline.jsonl"} <= names
    assert "error: no test file in" in log
    steps = [(e["step"], e["rc"]) for e in map(json.loads, timeline.splitlines())]
    assert steps == [("batch", 1), ("tests", 0)]
    # Called again, it returns the finished batch without starting another.
    again = evidence_run(tmp_path, "tests")
    assert again.returncode == 0 and "the batch starts" not in again.stdout


def test_the_sittings_scripts_import_what_the_series_has():
    """The series' own modules, names and ops that the sitting's benchmarks
    and scripts import are in the patches (one renamed shows here, before a
    sitting spends its time on it)."""
    import ast

    added = {
        line.split(" b/", 1)[1]
        for p in PATCHES
        for line in p.read_text().splitlines()
        if line.startswith("diff --git ")
    }
    text = "\n".join(p.read_text() for p in PATCHES)
    own = re.compile(r"sm7x|sm75|turing", re.I)
    checked = 0
    for path in (
        "bench/nvfp4_dequant.py",
        "bench/prefill_attention.py",
        "bench/prefill_crossover.py",
        "gpu/serve.py",
        "gpu/smoke.py",
    ):
        source = (ROOT / path).read_text()
        code = [source, *re.findall(r'^[A-Z_]+ = """(.*?)"""', source, re.M | re.S)]
        for node in (n for c in code for n in ast.walk(ast.parse(c))):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm")):
                continue
            module = node.module or ""
            if own.search(module):
                where = module.replace(".", "/")
                assert f"{where}.py" in added or f"{where}/__init__.py" in added, (
                    f"{path}: {module} is not a module of the series"
                )
                checked += 1
            for alias in node.names:
                if own.search(alias.name) and not own.search(module):
                    assert re.search(rf"\b{alias.name}\b", text), f"{path}: {alias.name}"
                    checked += 1
        for op in re.findall(r"torch\.ops\.vllm\.(\w+)", source):
            assert re.search(rf'"{op}\b|\b{op}\(', text), f"{path}: op {op} is not the series'"
            checked += 1
        # The series' ops in torch.ops._C that a script names (gpu/serve.py's probes).
        for op in set(re.findall(r'"((?:host_reduce|paged_prefill_attention_sm75)\w*)"', source)):
            assert f'm.def("{op}(' in text, f"{path}: op {op} is not the series'"
            checked += 1
    assert checked >= 4
