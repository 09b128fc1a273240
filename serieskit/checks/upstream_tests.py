"""Upstream's tests of the files the series touches, against the base's recorded outcomes.

Upstream's CPU-runnable test files that cover files the series changes
(patches/manifest.toml, ``upstream_tests`` per patch). Their outcomes on the
base alone are recorded once per base and torch, in the patch folder's
upstream-baseline.json (``nox -s test -- --record-upstream-baseline``, on a
detached worktree of the base commit, .work/upstream/base); each run then
runs them on the series only, one process per file as
:mod:`serieskit.checks.runner` runs the series' own. A test that passed in
the baseline and neither passes nor skips with the series fails the
session, as does a failing test the baseline does not know (the series adds
or renames it); upstream's own failures on this machine (tests that fail on
the base too) are reported, not held against the series.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from serieskit import git
from serieskit.checks.runner import Outcome, run_in_order, thread_env
from serieskit.errors import ToolkitError
from serieskit.series import series, target

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
    tree: Path,
    tests: list[str],
    out: Path,
    jobs: int = 1,
    log=print,
    pycache: Path | None = None,
) -> dict[str, dict[str, str]]:
    """{file: {test id: outcome}} of ``tests`` run on ``tree`` (a file that
    reports no test at all is an error: a baseline of nothing holds nothing)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**thread_env(jobs), **UPSTREAM_ENV}
    run_in_order(tree, tests, out, jobs, {"env": env, "pycache": pycache}, "upstream (base)", log)
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
    base_tree = git.detached_worktree(tree, t.out(UPSTREAM) / "base", state.base)
    log(f"upstream: recording the base's outcomes ({state.base[:12]}, torch {torch})")
    baseline = Baseline(
        t.version,
        state.base,
        torch,
        platform.python_version(),
        datetime.datetime.now(datetime.UTC).date().isoformat(),
        outcomes_on(
            base_tree,
            tests,
            t.out("test-results") / UPSTREAM / "base",
            jobs,
            log,
            t.out("pycache"),
        ),
    )
    path = t.patches / BASELINE
    path.write_text(baseline.to_json())
    log(f"upstream: wrote {t.patches_label}/{BASELINE}")
    return path


def upstream(
    where, tree: Path, jobs: int = 1, log=print, patches: list[str] | None = None
) -> list[str]:
    """`nox -s test -- --upstream`: the manifest's upstream test files (of the
    ``patches`` named, where given) on the series (the pin's or a port's),
    against the recorded baseline; returns the failures as ``file::test``."""
    t = target.of(where)
    entries = series.read_manifest(t)
    if patches is not None:
        entries = [e for e in entries if e.get("name") in patches]
    tests = upstream_test_files(entries)
    if not tests:
        if patches is not None:
            log(f"upstream: {', '.join(patches) or 'no patch named'}: no upstream_tests listed")
        return []
    state = series.State.load(t)
    assert state.base
    baseline = load_baseline(t, state.base, installed_torch(), tests)
    log(
        f"upstream: {len(tests)} file(s) on the series, against {t.patches_label}/{BASELINE} "
        f"(recorded {baseline.recorded}, torch {baseline.torch})"
    )
    out = t.out("test-results") / UPSTREAM / "series"
    found = compare_with_baseline(baseline, tree, tests, out, jobs, log, t.out("pycache"))
    verdict = f"{len(found)} REGRESSION(S)" if found else "no regression"
    log(f"upstream: {verdict} against the base in {len(tests)} file(s)")
    return found


def compare_with_baseline(
    baseline: Baseline,
    tree: Path,
    tests: list[str],
    out: Path,
    jobs: int = 1,
    log=print,
    pycache: Path | None = None,
) -> list[str]:
    """Run ``tests`` on ``tree``; return, as ``file::test``, the tests that
    passed in the baseline and neither pass nor skip now, and the failing
    tests the baseline does not know."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**thread_env(jobs), **UPSTREAM_ENV}
    held: dict[str, tuple[list[str], list[str], dict[str, str]]] = {}  # file -> lost, new, now

    def verdict(outcome: Outcome) -> str:
        """The file's line, leading with the verdict against the base: its
        failures are upstream's own where the base fails them too."""
        test, base = outcome.file, baseline.files[outcome.file]
        now = case_results(out / (test.replace("/", "__") + ".xml"))
        held[test] = (regressions(base, now), new_failures(base, now), now)
        bad = len(held[test][0]) + len(held[test][1])
        on_base = sum(r == "failed" for r in base.values())
        lead = (
            f"{bad} REGRESSION(S) against the base"
            if bad
            else "no regression against the base"
            + (f" (its {on_base} failing test(s) fail there too)" if on_base else "")
        )
        return f"{test}: {lead}; on the series {outcome.line().split(': ', 1)[1]}"

    run_in_order(tree, tests, out, jobs, {"env": env, "pycache": pycache}, "upstream", log, verdict)
    found = []
    for test in tests:
        lost, new, now = held[test]
        for name in lost:
            log(
                f"      REGRESSION {name} ({test}): passes on the base, "
                f"{now.get(name, 'not reported')} with the series"
            )
        for name in new:
            log(
                f"      FAILED {name} ({test}): not in the baseline (the series adds or renames it)"
            )
        found += [f"{test}::{name}" for name in lost + new]
    return found
