"""Run the series' test files in the patched tree, one pytest process each.

The files run with ``--noconftest``: vLLM's tests/conftest.py imports its
whole test stack (HF hub, PIL, tblib, the engine), which neither a CPU CI
machine nor the GPU machine has; the series' test files use none of its
fixtures.

One process per file, as the seed's Test Plan does: a file that crashes its
process, leaks CUDA state or initialises torch.distributed cannot affect the
next. Each file writes JUnit XML; the summary gives per file
``N passed, N failed, N skipped`` and the skip reasons.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
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


def run_all(tree: Path, tests: list[str], out_dir: Path, log=print, **kw) -> list[Outcome]:
    out_dir.mkdir(parents=True, exist_ok=True)
    if not tests:
        log("test: the series has no test files yet (patches/manifest.toml lists none)")
        return []
    outcomes = []
    for i, test in enumerate(tests, 1):
        log(f"test {i}/{len(tests)}: {test}")
        outcomes.append(run_file(tree, test, out_dir, **kw))
        log("  " + outcomes[-1].line())
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


# -- upstream's own tests, on the base and on the series ---------------------
#
# Upstream's CPU-runnable test files that cover files the series changes
# (patches/manifest.toml, `upstream_tests` per patch) run one process each on
# the base (a detached worktree of the base commit, .work/upstream/base) and
# on the series. A test that passes on the base and neither passes nor skips
# with the series fails the session; upstream's own failures on this machine
# (tests that fail on the base too) are reported, not held against the series.

UPSTREAM = "upstream"


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


def worktree_at(repo: Path, dest: Path, commit: str) -> Path:
    """A detached worktree of ``repo`` at ``commit``, made or moved there."""
    if not (dest / ".git").exists():
        git.drop_worktree(repo, dest)  # one a killed session left, locked or not
        dest.parent.mkdir(parents=True, exist_ok=True)
        git.git(repo, "worktree", "add", "--force", "--detach", str(dest), commit)
    else:
        git.git(dest, "checkout", "--quiet", "--force", "--detach", commit)
        git.git(dest, "clean", "-fdq")
    return dest


def compare_upstream(
    base_tree: Path, series_tree: Path, tests: list[str], out_dir: Path, log=print, **kw
) -> list[str]:
    """Run ``tests`` on both trees; return the regressions as
    ``file::test``, after a line per file."""
    found = []
    for i, test in enumerate(tests, 1):
        log(f"upstream {i}/{len(tests)}: {test}")
        results = {}
        for name, tree in (("base", base_tree), ("series", series_tree)):
            run_file(tree, test, out_dir / name, **kw)
            results[name] = case_results(out_dir / name / (test.replace("/", "__") + ".xml"))
        lost = regressions(results["base"], results["series"])
        counts = {name: sum(r == "passed" for r in res.values()) for name, res in results.items()}
        fails = sum(r == "failed" for r in results["base"].values())
        changed = (base_tree / test).read_bytes() != (series_tree / test).read_bytes()
        log(
            f"  base {counts['base']} passed ({fails} failed there too), "
            f"series {counts['series']} passed, {len(lost)} regression(s)"
            + ("; the series changes this file" if changed else "")
        )
        for t in lost:
            log(
                f"      REGRESSION {t}: passes on the base, "
                f"{results['series'].get(t, 'not reported')} with the series"
            )
        found += [f"{test}::{t}" for t in lost]
    return found


def upstream(where, tree: Path, log=print) -> list[str]:
    """`nox -s test`'s second half: the manifest's upstream test files on the
    base and on the series (the pin's or a port's); returns the regressions."""
    t = target.of(where)
    tests = upstream_test_files(series.read_manifest(t))
    if not tests:
        return []
    state = series.State.load(t)
    assert state.base
    base_tree = worktree_at(tree, t.out(UPSTREAM) / "base", state.base)
    out = t.out("test-results") / UPSTREAM
    for d in ("base", "series"):
        (out / d).mkdir(parents=True, exist_ok=True)
    # Tests that would fetch a model fail at once instead of retrying the hub,
    # on both trees alike.
    found = compare_upstream(
        base_tree,
        tree,
        tests,
        out,
        log=log,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    log(f"upstream: {len(tests)} file(s), {len(found)} regression(s)")
    return found
