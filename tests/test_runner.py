"""The per-file test runner: outcomes, skip reasons, failures, exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import quiet
from serieskit import cli, git
from serieskit.checks import runner, upstream_tests
from serieskit.errors import ToolkitError
from serieskit.series import apply, export, series, target

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
    # What failed, in the summary itself (CI shows only its tail), and where
    # pytest's whole output is.
    assert "FAILED tests.test_wrong::test_wrong: assert 0.9999999999999999 == 1.0" in text
    assert f"pytest's output: {tmp_path / 'out' / 'tests__test_wrong.py.log'}" in text
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
    assert "log" not in data["files"][0]  # a path of this machine's
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


def _baseline_of(tmp_path, trees, tests, lines):
    files = upstream_tests.outcomes_on(
        trees["base"], tests, tmp_path / "base-out", log=lines.append
    )
    return upstream_tests.Baseline("0.0.1", "b" * 40, "2.14.1", "3.11.7", "2026-01-02", files)


def test_upstream_tests_fail_only_on_what_the_series_breaks(tmp_path):
    trees = {}
    for name, text in (("base", UPSTREAM_BASE), ("series", UPSTREAM_SERIES)):
        trees[name] = tmp_path / name
        (trees[name] / "tests").mkdir(parents=True)
        (trees[name] / "tests/test_up.py").write_text(text)
    (trees["base"] / "tests/test_gone.py").write_text("def test_a():\n    pass\n")
    (trees["series"] / "tests/test_gone.py").write_text("import nonexistent_module\n")
    (trees["series"] / "tests/test_up.py").write_text(
        UPSTREAM_SERIES + "\n\ndef test_added_by_series():\n    assert False\n"
    )
    tests = ["tests/test_up.py", "tests/test_gone.py"]
    lines: list[str] = []
    recorded = _baseline_of(tmp_path, trees, tests, lines)
    assert "  tests/test_up.py: 3 passed, 1 failed, 0 skipped" in lines
    # What the file keeps is what the series is held to: written and read back.
    path = tmp_path / upstream_tests.BASELINE
    path.write_text(recorded.to_json())
    doc = json.loads(path.read_text())
    assert doc["base"] == {"version": "0.0.1", "commit": "b" * 40}
    assert doc["files"]["tests/test_up.py"]["failed"] == ["tests.test_up::test_fails_on_base_too"]
    baseline = upstream_tests.Baseline.read(path, upstream_tests.BASELINE)
    assert baseline == recorded

    lines = []
    found = upstream_tests.compare_with_baseline(
        baseline, trees["series"], tests, tmp_path / "out", jobs=2, log=lines.append
    )
    assert found == [
        "tests/test_up.py::tests.test_up::test_broken_by_series",
        "tests/test_up.py::tests.test_up::test_added_by_series",
        "tests/test_gone.py::tests.test_gone::test_a",
        "tests/test_gone.py::::tests.test_gone",  # its collection error, as pytest names it
    ]
    text = "\n".join(lines)
    # Each file's line leads with the verdict against the base, then its counts.
    assert (
        "  tests/test_up.py: 2 REGRESSION(S) against the base; on the series 1 passed, 3 failed"
        in text
    )
    assert (
        "REGRESSION tests.test_gone::test_a (tests/test_gone.py): passes on the base, not reported"
        in text
    )
    assert (
        "FAILED tests.test_up::test_added_by_series (tests/test_up.py): not in the baseline" in text
    )
    # A file that fails only where the base fails too says so first.
    lines = []
    found = upstream_tests.compare_with_baseline(
        baseline, trees["base"], tests[:1], tmp_path / "out-base", log=lines.append
    )
    assert found == []
    (line,) = [x for x in lines if x.startswith("  tests/test_up.py:")]
    assert line.startswith(
        "  tests/test_up.py: no regression against the base "
        "(its 1 failing test(s) fail there too); on the series 3 passed, 1 failed"
    ), line


def test_a_baseline_of_another_base_or_torch_is_refused_with_the_refresh_command(tmp_path):
    root = tmp_path / "root"
    (root / "patches").mkdir(parents=True)
    t = target.Target(root, "0.0.1", "s" * 64, "b" * 40, root / "patches")
    tests = ["tests/test_up.py"]
    refresh = "nox -s test -- --record-upstream-baseline"
    with pytest.raises(ToolkitError, match=f"upstream-baseline.json is missing.*`{refresh}`"):
        upstream_tests.load_baseline(t, "b" * 40, "2.14.1", tests)
    recorded = upstream_tests.Baseline(
        "0.0.1", "b" * 40, "2.14.1", "3.11.7", "2026-01-02", {tests[0]: {"t::a": "passed"}}
    )
    (root / "patches" / upstream_tests.BASELINE).write_text(recorded.to_json())
    assert upstream_tests.load_baseline(t, "b" * 40, "2.14.1", tests) == recorded
    with pytest.raises(ToolkitError, match=f"recorded on base bbbbbbbbbbbb .*`{refresh}`"):
        upstream_tests.load_baseline(t, "c" * 40, "2.14.1", tests)
    with pytest.raises(ToolkitError, match=f"recorded with torch 2.14.1; .* 2.15.0: .*`{refresh}`"):
        upstream_tests.load_baseline(t, "b" * 40, "2.15.0", tests)
    with pytest.raises(ToolkitError, match=f"no outcomes for tests/test_new.py: .*`{refresh}`"):
        upstream_tests.load_baseline(t, "b" * 40, "2.14.1", [*tests, "tests/test_new.py"])
    (root / "patches" / upstream_tests.BASELINE).write_text('{"base": 1}')
    with pytest.raises(ToolkitError, match="upstream-baseline.json is malformed"):
        upstream_tests.load_baseline(t, "b" * 40, "2.14.1", tests)


# Each file waits until the other has started: only files run at once pass.
MEETS = """
import os
import time
from pathlib import Path


def test_meets_the_other_file():
    here = Path(os.environ["MEET_DIR"])
    (here / "{me}").touch()
    deadline = time.monotonic() + 60
    while not (here / "{other}").exists():
        assert time.monotonic() < deadline, "the other file never started"
        time.sleep(0.05)
"""


def test_files_run_at_once_and_report_in_their_order(tmp_path, monkeypatch):
    tree = make_tree(tmp_path)
    (tree / "tests/test_a.py").write_text(MEETS.format(me="a", other="b"))
    (tree / "tests/test_b.py").write_text(MEETS.format(me="b", other="a"))
    monkeypatch.setenv("MEET_DIR", str(tmp_path))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(runner, "cores", lambda: 4)
    tests = ["tests/test_a.py", "tests/test_wrong.py", "tests/test_b.py", "tests/test_ok.py"]
    lines: list[str] = []
    outcomes = runner.run_all(tree, tests, tmp_path / "out", log=lines.append, jobs=3)
    assert [o.file for o in outcomes] == tests
    assert [(o.passed, o.failed) for o in outcomes] == [(1, 0), (0, 1), (1, 0), (1, 0)]
    assert lines[0] == "test: 4 file(s), 3 at a time (one process each)"
    assert [line for line in lines[1:-1] if line.startswith("test ")] == [
        f"test {i}/4: {t}" for i, t in enumerate(tests, 1)
    ]
    summary = lines[-1].splitlines()
    assert [line.split(":")[0].strip() for line in summary[2:] if line.startswith("  tests/")] == (
        tests
    )
    # Each process gets its share of the cores for torch's threads.
    assert runner.thread_env(3) == {"OMP_NUM_THREADS": "1"}
    assert runner.thread_env(2) == {"OMP_NUM_THREADS": "2"}
    assert runner.thread_env(1) == {}


BYTECODE = """
import os
import sys
from pathlib import Path


def test_where_bytecode_goes():
    text = f"PREFIX {sys.pycache_prefix} NOWRITE {sys.flags.dont_write_bytecode}"
    Path(os.environ["SAY_TO"]).write_text(text)
"""


def test_bytecode_is_kept_under_work_where_the_shell_forbids_writing_it(tmp_path, monkeypatch):
    """With PYTHONDONTWRITEBYTECODE set, the test processes (whose torch pip
    did not byte-compile) keep their bytecode in the given folder instead of
    compiling everything anew in each process."""
    tree = make_tree(tmp_path)
    (tree / "tests/test_bytecode.py").write_text(BYTECODE)
    pycache = tmp_path / "pycache"
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("SAY_TO", str(tmp_path / "said"))
    outcome = runner.run_file(tree, "tests/test_bytecode.py", tmp_path, pycache=pycache)
    assert outcome.ok
    assert (tmp_path / "said").read_text() == f"PREFIX {pycache.resolve()} NOWRITE 0"
    assert list(pycache.rglob("*.pyc"))  # pytest's own modules, at least
    # Without the variable, Python's own placement stays.
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    env = runner.bytecode_env({"A": "1"}, pycache)
    assert env == {"A": "1"}


def test_one_file_at_a_time_where_there_is_a_gpu(monkeypatch):
    monkeypatch.setattr(runner, "cores", lambda: 16)
    monkeypatch.setattr(runner, "has_gpu", lambda: True)
    assert runner.default_jobs() == 1
    monkeypatch.setattr(runner, "has_gpu", lambda: False)
    assert runner.default_jobs() == 16


def test_a_missing_file_is_named_before_any_runs(tmp_path):
    tree = make_tree(tmp_path)
    with pytest.raises(ToolkitError, match="test file tests/test_nope.py is not in"):
        runner.run_all(tree, ["tests/test_ok.py", "tests/test_nope.py"], tmp_path / "o", jobs=2)
    assert not list((tmp_path / "o").glob("*.xml"))


def test_upstream_files_come_from_the_manifest_in_series_order():
    manifest = [
        {"file": "a", "upstream_tests": ["tests/x.py", "tests/y.py"]},
        {"file": "b"},
        {"file": "c", "upstream_tests": ["tests/y.py", "tests/z.py"]},
    ]
    assert upstream_tests.upstream_test_files(manifest) == [
        "tests/x.py",
        "tests/y.py",
        "tests/z.py",
    ]
    assert upstream_tests.regressions(
        {"t": "passed", "u": "failed", "v": "passed"},
        {"t": "skipped", "u": "failed", "v": "failed"},
    ) == ["v"]


def test_a_file_cut_short_by_the_timeout_keeps_what_it_printed(tmp_path):
    """The log of a file that runs past its time: what its tests printed up
    to the kill (unbuffered, decoded), and the timeout as its failure."""
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "tests" / "test_slow.py").write_text(
        "import time\n\n\n"
        "def test_quick():\n    print('quick ran')\n\n\n"
        "def test_slow():\n    time.sleep(120)\n"
    )
    # test_quick's progress mark (the log was empty: pytest's block-buffered
    # output, and the bytes the timeout leaves, were dropped); a line of
    # warnings may come first on a loaded machine. Pytest starts in a second
    # or two; where it had not reached test_quick by the first timeout (a
    # loaded machine), a second run gives it room; test_slow outlives both.
    for timeout in (4, 30):
        outcome = runner.run_file(tree, "tests/test_slow.py", tmp_path, timeout=timeout)
        assert outcome.returncode == 124
        assert outcome.failures == ["tests/test_slow.py (pytest exit 124)"]
        log = Path(outcome.log).read_text()
        if re.search(r"^\.", log, re.M):
            break
    assert re.search(r"^\.", log, re.M), log


# --- nox -s test -- PATCH-OR-FILE: which files a name gives --------------------

AUTHOR = {"GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.com"}
ENTRY = 'seed = "1"\nsummary = "x"\nconfig = []\n'


def _commit(repo: Path, files: dict[str, str], subject: str, name: str | None) -> None:
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
        git.git(repo, "add", path)
    trailer = ["-m", f"{series.NAME_TRAILER}: {name}"] if name else []
    git.git(repo, "commit", "-q", "-m", subject, "-m", "Why: a test.", *trailer, env=AUTHOR)


@pytest.fixture
def named_series(root):
    """Three named patches: alpha adds a test file its manifest lists; beta
    lists one and changes alpha's (and a helper, no test file); gamma has none."""
    apply.apply(root, log=quiet)
    repo = series.work_repo(root)
    ok = "def test_ok():\n    assert True\n"
    _commit(repo, {"vllm/a.py": "A = 1\n", "tests/test_alpha.py": ok}, "[Core] Alpha", "alpha")
    _commit(
        repo,
        {
            "vllm/b.py": "B = 1\n",
            "tests/test_beta.py": ok,
            "tests/test_alpha.py": ok + "\n\ndef test_more():\n    pass\n",
            "tests/helpers.py": "H = 1\n",
        },
        "[Core] Beta",
        "beta",
    )
    _commit(repo, {"vllm/c.py": "C = 1\n"}, "[Misc] Gamma", "gamma")
    (root / "patches" / "manifest.toml").write_text(
        f'[[patch]]\nname = "alpha"\n{ENTRY}tests = ["tests/test_alpha.py"]\n'
        f'[[patch]]\nname = "beta"\n{ENTRY}tests = ["tests/test_beta.py"]\n'
        f'[[patch]]\nname = "gamma"\n{ENTRY}tests = []\n'
    )
    export.export(root, log=quiet)
    return repo


def test_a_patch_is_named_by_number_file_or_manifest_name(root, named_series):
    beta = "0002-Core-Beta.patch"
    for name in ("2", "0002", "beta", beta, f"patches/{beta}"):
        files, said, patches = runner.select_tests(root, named_series, [name])
        # Its manifest's tests, then the test files its commit adds or changes.
        assert files == ["tests/test_beta.py", "tests/test_alpha.py"], name
        assert said == [
            "test: 2 file(s) of 0002 beta: tests/test_beta.py (manifest), "
            "tests/test_alpha.py (its commit)"
        ]
        assert patches == ["beta"]
    files, _, patches = runner.select_tests(root, named_series, ["1", "beta", "alpha"])
    assert files == ["tests/test_alpha.py", "tests/test_beta.py"]  # each once
    assert patches == ["alpha", "beta"]


def test_a_test_file_is_named_as_in_the_tree_from_the_root_or_absolute(root, named_series):
    for name in (
        "tests/test_beta.py",
        ".work/vllm/tests/test_beta.py",
        str(named_series / "tests/test_beta.py"),
    ):
        files, said, patches = runner.select_tests(root, named_series, [name])
        assert (files, said, patches) == (
            ["tests/test_beta.py"],
            ["test: tests/test_beta.py (named)"],
            [],
        )


def test_an_unknown_name_lists_what_is_accepted(root, named_series):
    accepted = (
        r"name a patch by number \(1 to 3\), file name or manifest name \(alpha, beta, gamma\)"
    )
    for name in ("delta", "4", "0004-Core-Delta.patch"):
        with pytest.raises(ToolkitError, match=f"no patch or test file '{name}': {accepted}"):
            runner.select_tests(root, named_series, ["1", name])
    with pytest.raises(ToolkitError, match=f"tests/test_nope.py is not a file of .*: {accepted}"):
        runner.select_tests(root, named_series, ["tests/test_nope.py"])
    with pytest.raises(ToolkitError, match="0003 gamma has no test files .*manifest.toml"):
        runner.select_tests(root, named_series, ["gamma"])


def test_upstream_tests_of_the_named_patches_only(root, named_series):
    lines: list[str] = []
    assert upstream_tests.upstream(root, named_series, patches=["beta"], log=lines.append) == []
    assert lines == ["upstream: beta: no upstream_tests listed"]


def test_a_fixup_not_folded_in_yet_counts_as_its_patch(root, named_series):
    """Edit, commit --fixup, test before the autosquash: the fixup's test file runs."""
    _commit(
        named_series,
        {"tests/test_gamma.py": "def test_g():\n    pass\n"},
        "fixup! [Misc] Gamma",
        None,
    )
    files, said, _ = runner.select_tests(root, named_series, ["3"])
    assert files == ["tests/test_gamma.py"]
    assert said == ["test: 1 file(s) of 0003 gamma: tests/test_gamma.py (its commit)"]


def test_the_test_command_runs_only_the_named_files(root, named_series, capsys, monkeypatch):
    monkeypatch.setattr(runner, "default_jobs", lambda: 2)
    assert cli.run(["test", "alpha"], root) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "test: 1 file(s) of 0001 alpha: tests/test_alpha.py (manifest)\n"
        "test 1/1: tests/test_alpha.py\n"
    ), out
    assert out.rstrip().endswith("2 passed, 0 failed, 0 skipped"), out
    results = root / ".work" / "test-results"
    # Apart from the whole run's results, which the pr session reads.
    assert sorted(p.name for p in (results / "chosen").glob("*.xml")) == [
        "tests__test_alpha.py.xml"
    ]
    assert not list(results.glob("*.xml")) and not (results / runner.RAN).exists()
    assert cli.run(["test", "nope"], root) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: test: no patch or test file 'nope': ") and err.count("\n") == 1
    # The whole-series options take no names.
    assert cli.run(["test", "alpha", "--coverage"], root) == 1
    assert "run `nox -s test -- --coverage` without alpha" in capsys.readouterr().err
