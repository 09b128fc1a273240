"""The per-file test runner: outcomes, skip reasons, failures, exit codes."""

from __future__ import annotations

import json

import pytest

from serieskit.checks import runner

PASSING = """
import pytest

def test_ok():
    assert 1 + 1 == 2

@pytest.mark.skip(reason="needs two GPUs")
def test_two_gpus():
    pass
"""
FAILING = """
def test_wrong():
    assert sum([0.1] * 10) == 1.0
"""
CRASHING = """
import os

def test_crash():
    os._exit(3)
"""


def make_tree(tmp_path):
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests/test_ok.py").write_text(PASSING)
    (tree / "tests/test_wrong.py").write_text(FAILING)
    (tree / "tests/test_crash.py").write_text(CRASHING)
    return tree


def test_each_file_in_its_own_process_with_a_summary(tmp_path):
    tree = make_tree(tmp_path)
    lines = []
    outcomes = runner.run_all(
        tree,
        ["tests/test_ok.py", "tests/test_wrong.py", "tests/test_crash.py"],
        tmp_path / "out",
        log=lines.append,
    )
    ok, wrong, crash = outcomes
    assert (ok.passed, ok.failed, ok.skipped, ok.ok) == (1, 0, 1, True)
    assert ok.skip_reasons == {"needs two GPUs": 1}
    assert (wrong.passed, wrong.failed, wrong.ok) == (0, 1, False)
    assert wrong.failures == ["tests.test_wrong::test_wrong"]
    assert not crash.ok and crash.returncode == 3
    text = lines[-1]
    assert "tests/test_ok.py: 1 passed, 0 failed, 1 skipped" in text
    assert "skipped 1: needs two GPUs" in text
    assert "FAILED tests.test_wrong::test_wrong" in text
    assert text.rstrip().endswith("1 passed, 2 failed, 1 skipped")
    assert (tmp_path / "out" / "tests__test_ok.py.xml").exists()


def test_no_test_files_says_so(tmp_path):
    lines = []
    assert runner.run_all(tmp_path, [], tmp_path / "out", log=lines.append) == []
    assert "no test files yet" in lines[0]


def test_results_json_names_the_machine_and_the_commit(tmp_path):
    tree = make_tree(tmp_path)
    outcome = runner.run_file(tree, "tests/test_ok.py", tmp_path)
    dest = tmp_path / "results" / "r.json"
    series = {
        "base": "vllm==0.26.0",
        "commit": "abc123",
        "tree": None,
        "files": {},
        "files_from": None,
    }
    runner.write_results(dest, [outcome], series)
    data = json.loads(dest.read_text())
    assert data["series"]["commit"] == "abc123" and data["date"]
    assert "driver" in data["machine"] and "torch" in data["machine"]
    assert data["files"][0]["file"] == "tests/test_ok.py"
    assert data["test_files"]["tests/test_ok.py"]["passed"] == 1


COVERED = """
import subprocess
import sys

from vllm.mod import f


def test_f():
    assert f(1) == 2


def test_in_a_subprocess():
    code = "from vllm.mod import g; g()"
    subprocess.run([sys.executable, "-c", code], check=True)
"""


def test_coverage_mode_writes_a_report_with_test_contexts(tmp_path):
    pytest.importorskip("coverage")
    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm/__init__.py").write_text("")
    (tree / "vllm/mod.py").write_text(
        "def f(x):\n    return x + 1\n\n\ndef g():\n    return 2\n\n\ndef h():\n    return 3\n"
    )
    (tree / "tests").mkdir()
    (tree / "tests/test_cov.py").write_text(COVERED)
    rc = runner.coverage_rc(tmp_path / "data" / "cpu")
    outcome = runner.run_file(tree, "tests/test_cov.py", tmp_path, coverage=rc)
    assert outcome.ok and outcome.passed == 2
    assert len(list((tmp_path / "data" / "cpu").glob(".coverage.*"))) >= 2  # per process
    dest = runner.coverage_report(tree, rc, tmp_path / "cpu.json", {"commit": "c0ffee"})
    report = json.loads(dest.read_text())
    assert set(report["files"]) == {"vllm/__init__.py", "vllm/mod.py"}  # relative, vllm/ only
    mod = report["files"]["vllm/mod.py"]
    assert 2 in mod["executed_lines"] and 10 in mod["missing_lines"]  # h() never ran
    assert 6 in mod["executed_lines"]  # g() ran in the test's subprocess
    assert any("test_f" in c for c in mod["contexts"]["2"])
    assert report["series"] == {"commit": "c0ffee"}
    assert runner.machine_slug({"gpus": []}) == "cpu"
    assert runner.machine_slug({"gpus": ["NVIDIA H200"] * 2}) == "h200x2"


def test_select_runs_part_of_a_file(tmp_path):
    tree = make_tree(tmp_path)
    outcome = runner.run_file(tree, "tests/test_ok.py", tmp_path, select="not two_gpus")
    # pytest reports the deselected test as neither run nor skipped.
    assert (outcome.passed, outcome.skipped, outcome.ok) == (1, 0, True)


UPSTREAM_BASE = """
import pytest

def test_kept():
    assert True

def test_broken_by_series():
    assert True

def test_skipped_by_series():
    assert True

def test_fails_on_base_too():
    assert False
"""
UPSTREAM_SERIES = """
import pytest

def test_kept():
    assert True

def test_broken_by_series():
    assert 1 == 2

@pytest.mark.skip(reason="needs a GPU now")
def test_skipped_by_series():
    pass

def test_fails_on_base_too():
    assert False
"""


def test_upstream_tests_fail_only_on_what_the_series_breaks(tmp_path):
    trees = {}
    for name, text in (("base", UPSTREAM_BASE), ("series", UPSTREAM_SERIES)):
        trees[name] = tmp_path / name
        (trees[name] / "tests").mkdir(parents=True)
        (trees[name] / "tests/test_up.py").write_text(text)
    (trees["base"] / "tests/test_gone.py").write_text("def test_a():\n    pass\n")
    (trees["series"] / "tests/test_gone.py").write_text("import nonexistent_module\n")
    lines: list[str] = []
    found = runner.compare_upstream(
        trees["base"],
        trees["series"],
        ["tests/test_up.py", "tests/test_gone.py"],
        tmp_path / "out",
        log=lines.append,
    )
    assert found == [
        "tests/test_up.py::tests.test_up::test_broken_by_series",
        "tests/test_gone.py::tests.test_gone::test_a",
    ]
    text = "\n".join(lines)
    assert (
        "base 3 passed (1 failed there too), series 1 passed, 1 regression(s); "
        "the series changes this file"
    ) in text
    assert "REGRESSION tests.test_gone::test_a: passes on the base, not reported" in text


def test_upstream_files_come_from_the_manifest_in_series_order():
    manifest = [
        {"file": "a", "upstream_tests": ["tests/x.py", "tests/y.py"]},
        {"file": "b"},
        {"file": "c", "upstream_tests": ["tests/y.py", "tests/z.py"]},
    ]
    assert runner.upstream_test_files(manifest) == ["tests/x.py", "tests/y.py", "tests/z.py"]
    assert runner.regressions(
        {"t": "passed", "u": "failed", "v": "passed"},
        {"t": "skipped", "u": "failed", "v": "failed"},
    ) == ["v"]
