"""Run the series' test files in the patched tree, one pytest process each.

The files run with ``--noconftest``: vLLM's tests/conftest.py imports its
whole test stack (HF hub, PIL, tblib, the engine), which neither a CPU CI
machine nor the GPU machine has; the series' test files use none of its
fixtures.

One process per file, as the seed's Test Plan does: a file that crashes its
process, leaks CUDA state or initialises torch.distributed cannot affect the
next. On a machine without a GPU several files run at once (a process per
core); their lines and the summary keep the files' order. Each file writes
JUnit XML; the summary gives per file ``N passed, N failed, N skipped`` and
the skip reasons.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from serieskit import git, results
from serieskit.errors import ToolkitError
from serieskit.series import series, target


@dataclass
class Outcome:
    file: str
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    returncode: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        # pytest exits 5 when every test was deselected / none collected.
        return self.failed == 0 and self.errors == 0 and self.returncode in (0, 5)

    def line(self) -> str:
        text = (
            f"{self.file}: {self.passed} passed, {self.failed + self.errors} failed, "
            f"{self.skipped} skipped ({self.seconds:.1f} s)"
        )
        if self.returncode not in (0, 1, 5):
            text += f" [pytest exit {self.returncode}]"
        return text


def parse_junit(path: Path, name: str) -> Outcome:
    out = Outcome(name)
    if not path.exists():
        return out
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        if (node := case.find("skipped")) is not None:
            out.skipped += 1
            reason = (node.get("message") or "").removeprefix("Skipped: ").strip()
            out.skip_reasons[reason] = out.skip_reasons.get(reason, 0) + 1
        elif case.find("failure") is not None:
            out.failed += 1
            out.failures.append(test)
        elif case.find("error") is not None:
            out.errors += 1
            out.failures.append(test)
        else:
            out.passed += 1
    return out


def run_file(
    tree: Path,
    test: str,
    out_dir: Path,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    timeout: float = 1800,
    select: str | None = None,
    coverage: Path | None = None,
) -> Outcome:
    """One test file in a pytest process of its own; `select` is pytest's -k;
    `coverage` an rc file of :func:`coverage_rc` (run under coverage.py)."""
    if not (tree / test).is_file():
        raise ToolkitError(f"test file {test} is not in {tree}")
    xml = out_dir / (test.replace("/", "__") + ".xml")
    xml.unlink(missing_ok=True)
    start = time.monotonic()
    run_env = dict(os.environ, **(env or {}))
    run_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tree), run_env.get("PYTHONPATH", "")) if p
    )
    try:
        under = [python, "-m", "coverage", "run", f"--rcfile={coverage}"] if coverage else [python]
        proc = subprocess.run(
            [
                *under,
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                "--noconftest",
                f"--junitxml={xml}",
                *(["-k", select] if select else []),
                test,
            ],
            cwd=tree,
            env=run_env,
            timeout=timeout,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        code, log = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        code, log = 124, (e.stdout or "") if isinstance(e.stdout, str) else ""
    (out_dir / (test.replace("/", "__") + ".log")).write_text(log)
    outcome = parse_junit(xml, test)
    outcome.seconds = time.monotonic() - start
    outcome.returncode = code
    if code not in (0, 1, 5) and not outcome.failures:
        outcome.errors += 1  # crashed or timed out before reporting
        outcome.failures.append(f"{test} (pytest exit {code})")
    return outcome


def has_gpu() -> bool:
    """Whether nvidia-smi lists a GPU (without importing torch, which takes
    seconds)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "GPU" in out


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_jobs() -> int:
    """Files run at once: one per core on a machine without a GPU; one at a
    time where there is a GPU (the files would share its memory, and the
    host all-reduce's timeouts must not compete with another file)."""
    return 1 if has_gpu() else cores()


def thread_env(jobs: int) -> dict[str, str]:
    """With ``jobs`` files at once, each process's share of the cores for
    torch's intra-op threads (unless the caller set OMP_NUM_THREADS): two
    processes with a thread per core each would fight over the cores."""
    if jobs <= 1 or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cores() // jobs))}


def _in_order(
    tree: Path, tests: list[str], out_dir: Path, jobs: int, kw: dict, label: str, log
) -> list[Outcome]:
    """Run ``tests`` (``jobs`` at a time), logging each file's line in the
    files' order as its result is known."""
    for test in tests:  # every file is there before any starts
        if not (tree / test).is_file():
            raise ToolkitError(f"test file {test} is not in {tree}")
    outcomes: list[Outcome] = []
    if jobs <= 1:
        for i, test in enumerate(tests, 1):
            log(f"{label} {i}/{len(tests)}: {test}")
            outcomes.append(run_file(tree, test, out_dir, **kw))
            log("  " + outcomes[-1].line())
        return outcomes
    log(f"{label}: {len(tests)} file(s), {jobs} at a time (one process each)")
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_file, tree, test, out_dir, **kw) for test in tests]
        for i, (test, future) in enumerate(zip(tests, futures, strict=True), 1):
            outcomes.append(future.result())
            log(f"{label} {i}/{len(tests)}: {test}")
            log("  " + outcomes[-1].line())
    return outcomes


def run_all(
    tree: Path, tests: list[str], out_dir: Path, log=print, jobs: int = 1, **kw
) -> list[Outcome]:
    """Each file in a pytest process of its own, ``jobs`` at a time; the
    keyword arguments are :func:`run_file`'s."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if not tests:
        log("test: the series has no test files yet (patches/manifest.toml lists none)")
        return []
    if jobs > 1:
        kw["env"] = {**thread_env(jobs), **(kw.get("env") or {})}
    outcomes = _in_order(tree, tests, out_dir, jobs, kw, "test", log)
    log(summary(outcomes))
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    lines = ["", "summary:"]
    for o in outcomes:
        lines.append(f"  {o.line()}")
        for reason, n in sorted(o.skip_reasons.items()):
            lines.append(f"      skipped {n}: {reason}")
        for name in o.failures:
            lines.append(f"      FAILED {name}")
    tot = [sum(getattr(o, k) for o in outcomes) for k in ("passed", "failed", "skipped")]
    tot[1] += sum(o.errors for o in outcomes)
    lines.append(f"{tot[0]} passed, {tot[1]} failed, {tot[2]} skipped")
    return "\n".join(lines)


# -- coverage of the series' test runs (opt-in) --------------------------------
#
# Each test file's pytest process, and every Python process it starts, writes
# its own data file into one folder per machine (parallel = true); the
# contexts name the test function. coverage_report combines them into the
# JSON report the pr session reads (.work/pr/coverage/<machine>.json), with
# the series that ran, so a report older than a file is named stale there.

COVERAGE = "coverage==7.17.5"
COVERAGE_RC = """\
[run]
data_file = {data}
parallel = true
relative_files = true
dynamic_context = test_function
patch = subprocess
include = vllm/*
"""


def coverage_rc(folder: Path) -> Path:
    """A fresh data folder and its rc file (data files of earlier runs removed)."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(".coverage*"):
        old.unlink()
    rc = folder / "coveragerc"
    rc.write_text(COVERAGE_RC.format(data=folder.resolve() / ".coverage"))
    return rc


def machine_slug(info: dict | None = None) -> str:
    """``cpu``, or the GPU and count: ``h200x2``."""
    gpus = (info or results.probe())["gpus"]
    if not gpus:
        return "cpu"
    short = gpus[0].removeprefix("NVIDIA ").split()[-1].lower()
    return f"{short}x{len(gpus)}"


def coverage_report(
    tree: Path, rc: Path, dest: Path, series: dict, python: str = sys.executable
) -> Path:
    """Combine the folder's data files; write the JSON report with contexts
    and the series that ran (its ``series`` key) to ``dest``."""
    for step in (
        ["combine", "--keep", "-q"],
        ["json", "--show-contexts", "-q", "-o", str(dest.resolve())],
    ):
        proc = subprocess.run(
            [python, "-m", "coverage", *step, f"--rcfile={rc}"],
            cwd=tree,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ToolkitError(f"coverage {step[0]} failed: {(proc.stdout + proc.stderr).strip()}")
    report = json.loads(dest.read_text())
    report["series"] = series
    dest.write_text(json.dumps(report) + "\n")
    return dest


def test_counts(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    """The header's ``test_files``: file -> passed, failed, skipped, errors."""
    return {
        o.file: {"passed": o.passed, "failed": o.failed, "skipped": o.skipped, "errors": o.errors}
        for o in outcomes
    }


def test_figures(outcomes: list[Outcome]) -> dict[str, dict]:
    return {
        f"{Path(o.file).stem}.{k}": results.figure(
            getattr(o, k), "tests", f"{o.file}: tests {k}", f"test_files['{o.file}'].{k}"
        )
        for o in outcomes
        for k in ("passed", "failed")
    }


def write_results(
    path: Path,
    outcomes: list[Outcome],
    series: dict,
    extra: dict | None = None,
    machine: dict | None = None,
) -> dict:
    """A ``tests`` results file (results/README.md): the header (this
    machine unless ``machine`` is given; ``series`` from
    :mod:`serieskit.results`), then each file's outcome and ``extra``."""
    doc = results.document(
        "tests",
        {"files": [asdict(o) for o in outcomes], **(extra or {})},
        machine=machine or results.machine(),
        series=series,
        figures=test_figures(outcomes),
        test_files=test_counts(outcomes),
    )
    results.write(path, doc)
    return doc


# -- upstream's own tests of the files the series touches --------------------
#
# Upstream's CPU-runnable test files that cover files the series changes
# (patches/manifest.toml, `upstream_tests` per patch). Their outcomes on the
# base alone are recorded once per base and torch, in the patch folder's
# upstream-baseline.json (`nox -s test -- --record-upstream-baseline`, on a
# detached worktree of the base commit, .work/upstream/base); each run then
# runs them on the series only. A test that passed in the baseline and
# neither passes nor skips with the series fails the session, as does a
# test the baseline does not know (the series adds or renames it) that
# fails; upstream's own failures on this machine (tests that fail on the
# base too) are reported, not held against the series.

UPSTREAM = "upstream"
BASELINE = "upstream-baseline.json"
# Tests that would fetch a model fail at once instead of retrying the hub,
# on the base and on the series alike.
UPSTREAM_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
OUTCOMES = ("passed", "failed", "skipped")


def upstream_test_files(manifest: list[dict]) -> list[str]:
    """The manifest's `upstream_tests`, in series order, each once."""
    files: list[str] = []
    for entry in manifest:
        for test in entry.get("upstream_tests", []):
            if test not in files:
                files.append(test)
    return files


def case_results(xml: Path) -> dict[str, str]:
    """{test id: passed / failed / skipped} from a JUnit XML file."""
    if not xml.exists():
        return {}
    results = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("skipped") is not None:
            results[test] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            results[test] = "failed"
        else:
            results[test] = "passed"
    return results


def regressions(base: dict[str, str], series: dict[str, str]) -> list[str]:
    """Tests that pass on the base and do not pass (or skip) with the series;
    a test the series no longer reports at all counts too."""
    return sorted(
        t for t, r in base.items() if r == "passed" and series.get(t) not in ("passed", "skipped")
    )


def new_failures(base: dict[str, str], series: dict[str, str]) -> list[str]:
    """Tests the base does not have (the series adds or renames them) that fail."""
    return sorted(t for t, r in series.items() if r == "failed" and t not in base)


def worktree_at(repo: Path, dest: Path, commit: str) -> Path:
    """A detached worktree of ``repo`` at ``commit``, made or moved there."""
    if not (dest / ".git").exists():
        git.run(repo, "worktree", "prune")
        dest.parent.mkdir(parents=True, exist_ok=True)
        git.git(repo, "worktree", "add", "--force", "--detach", str(dest), commit)
    else:
        git.git(dest, "checkout", "--quiet", "--force", "--detach", commit)
        git.git(dest, "clean", "-fdq")
    return dest


def installed_torch(python: str = sys.executable) -> str:
    """The torch version of the Python that runs the tests."""
    if python == sys.executable:
        try:
            return importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            raise ToolkitError(
                "torch is not installed here: run the tests through `nox -s test`"
            ) from None
    proc = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ToolkitError(f"torch is not installed in {python}: run the tests through nox")
    return proc.stdout.strip()


@dataclass
class Baseline:
    """upstream-baseline.json: upstream's tests of the touched files on the base."""

    version: str  # vLLM release of the base
    commit: str  # the base commit
    torch: str
    python: str
    recorded: str  # YYYY-MM-DD
    files: dict[str, dict[str, str]]  # test file -> {test id: outcome}

    def to_json(self) -> str:
        doc = {
            "about": (
                "Outcomes of upstream's tests of the files the series touches, on the base "
                "alone (no patch), on a machine without a GPU. `nox -s test -- --upstream` "
                "runs them on the series and fails on a test that passed here and neither "
                "passes nor skips there. Written by `nox -s test -- --record-upstream-baseline`."
            ),
            "base": {"version": self.version, "commit": self.commit},
            "torch": self.torch,
            "python": self.python,
            "recorded": self.recorded,
            "files": {
                f: {o: sorted(t for t, r in tests.items() if r == o) for o in OUTCOMES}
                for f, tests in self.files.items()
            },
        }
        return json.dumps(doc, indent=1) + "\n"

    @classmethod
    def read(cls, path: Path, label: str) -> Baseline:
        try:
            doc = json.loads(path.read_text())
            files = {
                f: {t: o for o in OUTCOMES for t in outcomes.get(o, [])}
                for f, outcomes in doc["files"].items()
            }
            return cls(
                doc["base"]["version"],
                doc["base"]["commit"],
                doc["torch"],
                doc.get("python", ""),
                doc.get("recorded", ""),
                files,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ToolkitError(f"{label} is malformed ({e!r})") from None


def load_baseline(where, base_commit: str, torch: str, tests: list[str]) -> Baseline:
    """The target's baseline, refused (with the command that refreshes it)
    when it was recorded on another base or torch or lacks a test file."""
    t = target.of(where)
    path = t.patches / BASELINE
    label = f"{t.patches_label}/{BASELINE}"
    refresh = f"refresh it with `{t.cmd('test', '--record-upstream-baseline')}`"
    if not path.exists():
        raise ToolkitError(f"{label} is missing (upstream's tests on the base): {refresh}")
    b = Baseline.read(path, label)
    if b.commit != base_commit:
        raise ToolkitError(
            f"{label} was recorded on base {b.commit[:12]} (vLLM {b.version}); the series is on "
            f"{base_commit[:12]} (vLLM {t.version}): {refresh}"
        )
    if b.torch != torch:
        raise ToolkitError(
            f"{label} was recorded with torch {b.torch}; this environment has torch {torch}: "
            f"{refresh}"
        )
    if missing := [f for f in tests if f not in b.files]:
        raise ToolkitError(f"{label} has no outcomes for {', '.join(missing)}: {refresh}")
    return b


def outcomes_on(
    tree: Path, tests: list[str], out: Path, jobs: int = 1, log=print
) -> dict[str, dict[str, str]]:
    """{file: {test id: outcome}} of ``tests`` run on ``tree`` (a file that
    reports no test at all is an error: a baseline of nothing holds nothing)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**thread_env(jobs), **UPSTREAM_ENV}
    _in_order(tree, tests, out, jobs, {"env": env}, "upstream (base)", log)
    files = {f: case_results(out / (f.replace("/", "__") + ".xml")) for f in tests}
    for f, results in files.items():
        counts = ", ".join(f"{sum(r == o for r in results.values())} {o}" for o in OUTCOMES)
        log(f"  {f}: {counts}")
        if not results:
            raise ToolkitError(f"upstream: {f} reported no test on the base (its log is in {out})")
    return files


def record_baseline(where, tree: Path, jobs: int = 1, log=print) -> Path:
    """Run the manifest's upstream test files on the base alone (a detached
    worktree of the base commit) and write the target's baseline."""
    t = target.of(where)
    tests = upstream_test_files(series.read_manifest(t))
    if not tests:
        raise ToolkitError(
            f"{t.patches_label}/manifest.toml names no upstream_tests: there is nothing to record"
        )
    state = series.State.load(t)
    assert state.base
    torch = installed_torch()
    base_tree = worktree_at(tree, t.out(UPSTREAM) / "base", state.base)
    log(f"upstream: recording the base's outcomes ({state.base[:12]}, torch {torch})")
    baseline = Baseline(
        t.version,
        state.base,
        torch,
        platform.python_version(),
        datetime.datetime.now(datetime.UTC).date().isoformat(),
        outcomes_on(base_tree, tests, t.out("test-results") / UPSTREAM / "base", jobs, log),
    )
    path = t.patches / BASELINE
    path.write_text(baseline.to_json())
    log(f"upstream: wrote {t.patches_label}/{BASELINE}")
    return path


def upstream(where, tree: Path, jobs: int = 1, log=print) -> list[str]:
    """`nox -s test -- --upstream`: the manifest's upstream test files on the
    series (the pin's or a port's), against the recorded baseline; returns the
    failures as ``file::test``."""
    t = target.of(where)
    tests = upstream_test_files(series.read_manifest(t))
    if not tests:
        return []
    state = series.State.load(t)
    assert state.base
    baseline = load_baseline(t, state.base, installed_torch(), tests)
    log(
        f"upstream: {len(tests)} file(s) on the series, against {t.patches_label}/{BASELINE} "
        f"(recorded {baseline.recorded}, torch {baseline.torch})"
    )
    found = compare_with_baseline(
        baseline, tree, tests, t.out("test-results") / UPSTREAM / "series", jobs, log
    )
    log(f"upstream: {len(tests)} file(s), {len(found)} regression(s)")
    return found


def compare_with_baseline(
    baseline: Baseline, tree: Path, tests: list[str], out: Path, jobs: int = 1, log=print
) -> list[str]:
    """Run ``tests`` on ``tree``; return, as ``file::test``, the tests that
    passed in the baseline and neither pass nor skip now, and the failing
    tests the baseline does not know."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**thread_env(jobs), **UPSTREAM_ENV}
    outcomes = _in_order(tree, tests, out, jobs, {"env": env}, "upstream", log)
    found = []
    for test, outcome in zip(tests, outcomes, strict=True):
        base = baseline.files[test]
        now = case_results(out / (test.replace("/", "__") + ".xml"))
        lost, new = regressions(base, now), new_failures(base, now)
        fails = sum(r == "failed" for r in base.values())
        log(
            f"  {test}: baseline {sum(r == 'passed' for r in base.values())} passed "
            f"({fails} failed there too), series {outcome.passed} passed, "
            f"{len(lost) + len(new)} regression(s)"
        )
        for name in lost:
            log(
                f"      REGRESSION {name}: passes on the base, "
                f"{now.get(name, 'not reported')} with the series"
            )
        for name in new:
            log(f"      FAILED {name}: not in the baseline (the series adds or renames it)")
        found += [f"{test}::{name}" for name in lost + new]
    return found
