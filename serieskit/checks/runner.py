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
the skip reasons. ``nox -s test -- PATCH-OR-FILE`` runs only the files those
names give (:func:`select_tests`): a patch's manifest tests and the test
files its commit adds or changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from serieskit import git, results
from serieskit.errors import ToolkitError
from serieskit.series import series, target
from serieskit.series.target import Target
from serieskit.state import State

# Beside the JUnit files: the series they ran on (results.series_block), so
# that a pull request's body says which revision its CPU counts are of.
RAN = "series.json"


def record_ran(t: Target, tree: Path) -> str | None:
    """Beside a whole run's results: the series it ran on (RAN). Returns the
    work tree's HEAD, None where there is no applied series."""
    state, head = State.load(t), git.rev(tree, "HEAD")
    if not (state.base and head):
        return None
    ran = results.series_block(tree, state.base, head, state.base_label or "?")
    ran_file = t.out("test-results") / RAN
    ran_file.parent.mkdir(parents=True, exist_ok=True)
    ran_file.write_text(json.dumps(ran, indent=2) + "\n")
    return head


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
    # Each failure's first line as pytest reported it, so that a log that
    # shows only the summary (CI's) still says what went wrong.
    why: dict[str, str] = field(default_factory=dict)
    log: str | None = None  # pytest's output, kept beside the junit XML

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
        elif (node := case.find("failure")) is not None:
            out.failed += 1
            out.failures.append(test)
            out.why[test] = first_line(node.get("message") or node.text or "")
        elif (node := case.find("error")) is not None:
            out.errors += 1
            out.failures.append(test)
            out.why[test] = first_line(node.get("message") or node.text or "")
        else:
            out.passed += 1
    return out


def first_line(text: str, limit: int = 240) -> str:
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def run_file(
    tree: Path,
    test: str,
    out_dir: Path,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    timeout: float = 1800,
    select: str | None = None,
    coverage: Path | None = None,
    pycache: Path | None = None,
) -> Outcome:
    """One test file in a pytest process of its own; `select` is pytest's -k;
    `coverage` an rc file of :func:`coverage_rc` (run under coverage.py);
    `pycache` see :func:`bytecode_env`."""
    if not (tree / test).is_file():
        raise ToolkitError(f"test file {test} is not in {tree}")
    xml = out_dir / (test.replace("/", "__") + ".xml")
    xml.unlink(missing_ok=True)
    start = time.monotonic()
    run_env = bytecode_env(dict(os.environ, **(env or {})), pycache)
    run_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tree), run_env.get("PYTHONPATH", "")) if p
    )
    # Unbuffered, so that a file cut short by the timeout keeps what it printed.
    run_env["PYTHONUNBUFFERED"] = "1"
    try:
        under = [python, "-m", "coverage", "run", f"--rcfile={coverage}"] if coverage else [python]
        proc = subprocess.run(
            [
                *under,
                "-m",
                "pytest",
                "-q",
                # Skip reasons, and what passing tests print: a figure a test
                # measures (the DBO micro-batches' peak memory) stays in the log.
                "-rsP",
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
        # What the file printed before the timeout; undecoded on POSIX.
        out = e.stdout or b""
        code, log = 124, out if isinstance(out, str) else out.decode(errors="replace")
    log_path = out_dir / (test.replace("/", "__") + ".log")
    log_path.write_text(log)
    outcome = parse_junit(xml, test)
    outcome.log = str(log_path)
    outcome.seconds = time.monotonic() - start
    outcome.returncode = code
    if code not in (0, 1, 5) and not outcome.failures:
        outcome.errors += 1  # crashed or timed out before reporting
        outcome.failures.append(f"{test} (pytest exit {code})")
    return outcome


def bytecode_env(env: dict[str, str], pycache: Path | None) -> dict[str, str]:
    """``env`` for a test process. The test environments skip pip's
    byte-compiling (noxfile.py): each module is compiled on its first import
    and its bytecode kept. Where PYTHONDONTWRITEBYTECODE is set (some shells
    and CI images set it), none would be kept, and every test process would
    compile torch, transformers and vLLM anew (about 17 s of CPU each here,
    more than its tests); with ``pycache`` given, the bytecode goes there
    instead (PYTHONPYCACHEPREFIX), never beside the sources."""
    if pycache is None or not env.get("PYTHONDONTWRITEBYTECODE"):
        return env
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(pycache.resolve())
    return env


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


def run_in_order(
    tree: Path,
    tests: list[str],
    out_dir: Path,
    jobs: int,
    kw: dict,
    label: str,
    log,
    line: Callable[[Outcome], str] = Outcome.line,
) -> list[Outcome]:
    """Run ``tests`` (``jobs`` at a time), logging each file's ``line`` in the
    files' order as its result is known."""
    for test in tests:  # every file is there before any starts
        if not (tree / test).is_file():
            raise ToolkitError(f"test file {test} is not in {tree}")
    outcomes: list[Outcome] = []
    if jobs <= 1:
        for i, test in enumerate(tests, 1):
            log(f"{label} {i}/{len(tests)}: {test}")
            outcomes.append(run_file(tree, test, out_dir, **kw))
            log("  " + line(outcomes[-1]))
        return outcomes
    log(f"{label}: {len(tests)} file(s), {jobs} at a time (one process each)")
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_file, tree, test, out_dir, **kw) for test in tests]
        for i, (test, future) in enumerate(zip(tests, futures, strict=True), 1):
            outcomes.append(future.result())
            log(f"{label} {i}/{len(tests)}: {test}")
            log("  " + line(outcomes[-1]))
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
    # No more at once than there are files: one file alone keeps every core
    # for torch's threads (thread_env).
    jobs = min(jobs, len(tests))
    if jobs > 1:
        kw["env"] = {**thread_env(jobs), **(kw.get("env") or {})}
    outcomes = run_in_order(tree, tests, out_dir, jobs, kw, "test", log)
    log(summary(outcomes))
    return outcomes


def summary(outcomes: list[Outcome]) -> str:
    lines = ["", "summary:"]
    for o in outcomes:
        lines.append(f"  {o.line()}")
        for reason, n in sorted(o.skip_reasons.items()):
            lines.append(f"      skipped {n}: {reason}")
        for name in o.failures:
            why = o.why.get(name)
            lines.append(f"      FAILED {name}" + (f": {why}" if why else ""))
        if o.failures and o.log is not None:
            lines.append(f"      pytest's output: {o.log}")
    tot = [sum(getattr(o, k) for o in outcomes) for k in ("passed", "failed", "skipped")]
    tot[1] += sum(o.errors for o in outcomes)
    lines.append(f"{tot[0]} passed, {tot[1]} failed, {tot[2]} skipped")
    return "\n".join(lines)


# -- the files a name gives: nox -s test -- PATCH-OR-FILE ------------------------


def is_test_file(path: str) -> bool:
    """pytest's default: tests/**/test_*.py or *_test.py."""
    name = PurePosixPath(path).name
    return path.startswith("tests/") and (
        (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py")
    )


def find_patch(where: Path | Target, arg: str) -> tuple[str, str | None] | None:
    """(file, Patch-Name) of the patch ``arg`` names: its number ("4", "0004"),
    its file name (with or without the patch folder) or its manifest name."""
    t = target.of(where)
    names = series.read_series(t)
    file = None
    if arg.isdigit():
        file = next((n for n in names if n.startswith(f"{int(arg):04d}-")), None)
    elif arg.endswith(".patch"):
        file = next((n for n in names if n == PurePosixPath(arg).name), None)
    if file is not None:
        return file, series.read_patch(t.patches / file).name
    return next(((n, arg) for n in names if series.read_patch(t.patches / n).name == arg), None)


def patch_commit_tests(tree: Path, base_commit: str, patch: series.PatchFile) -> list[str]:
    """The test files that the patch's commit in ``tree`` (found by its
    Patch-Name trailer, else its subject), and any fixup! / squash! commit of
    it not folded in yet, add or change and the tree still has."""
    commits = series.commit_names(tree, base_commit)
    mine = next(((c, s) for c, s, n in commits if patch.name and n == patch.name), None)
    mine = mine or next(((c, s) for c, s, _ in commits if s == patch.subject), None)
    if mine is None:
        return []
    folds = {f"{how}! {mine[1]}" for how in ("fixup", "squash", "amend")}
    ours = [mine[0], *(c for c, s, _ in commits if s in folds)]
    found: list[str] = []
    for cid in ours:
        out = git.git(
            tree, "diff-tree", "--no-commit-id", "--name-only", "-r", "--diff-filter=AM", cid
        )
        found += [p for p in out.splitlines() if is_test_file(p) and p not in found]
    return [p for p in found if (tree / p).is_file()]


def select_tests(
    where: Path | Target, tree: Path, wanted: list[str]
) -> tuple[list[str], list[str], list[str]]:
    """The test files ``wanted`` names (patches, see :func:`find_patch`, or
    test files), each once in the order named; a line per name saying which
    files it gave and why; the Patch-Names of the patches named. A name that
    is neither is an error listing what is accepted."""
    t = target.of(where)
    state = State.load(t)
    files: list[str] = []
    said: list[str] = []
    patches: list[str] = []
    for arg in wanted:
        if arg.endswith(".py"):
            path = _in_tree(t, tree, arg)
            if not (tree / path).is_file():
                raise ToolkitError(f"test: {arg} is not a file of {tree}: {_accepted(t)}")
            files += [path] if path not in files else []
            said.append(f"test: {path} (named)")
            continue
        found = find_patch(t, arg)
        if found is None:
            raise ToolkitError(f"test: no patch or test file {arg!r}: {_accepted(t)}")
        file, name = found
        patches += [name] if name and name not in patches else []
        entry = series.manifest_entry(t, name) if name else None
        listed = list((entry or {}).get("tests", []))
        patch = series.read_patch(t.patches / file)
        touched = patch_commit_tests(tree, state.base or "", patch) if state.base else []
        mine = listed + [p for p in touched if p not in listed]
        label = f"{file[:4]} {name or patch.subject}"
        if not mine:
            raise ToolkitError(
                f"test: {label} has no test files (its manifest entry lists none and its commit "
                f"adds or changes none): name a test file, or add its tests to "
                f"{t.patches_label}/{series.MANIFEST}"
            )
        why = [f"{p} ({'manifest' if p in listed else 'its commit'})" for p in mine]
        said.append(f"test: {len(mine)} file(s) of {label}: {', '.join(why)}")
        files += [p for p in mine if p not in files]
    return files, said, patches


def _in_tree(t: Target, tree: Path, arg: str) -> str:
    """A file of the work tree as a path in it, whether named so, from the
    toolkit's root (.work/vllm/tests/...) or absolute."""
    if Path(arg).is_absolute():
        full = Path(arg).resolve()
        return (
            full.relative_to(tree.resolve()).as_posix()
            if full.is_relative_to(tree.resolve())
            else arg
        )
    return arg.removeprefix("./").removeprefix(f"{t.work.relative_to(t.root).as_posix()}/")


def _accepted(t: Target) -> str:
    """What ``nox -s test -- NAME`` accepts, for an error line."""
    names = series.read_series(t)
    known = [series.read_patch(t.patches / n).name or n for n in names]
    numbers = f"1 to {len(names)}" if names else "none"
    return (
        f"name a patch by number ({numbers}), file name or manifest name "
        f"({', '.join(known) or 'none'}), or a test file of the work tree (tests/...py)"
    )


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
        # The log's path is this machine's, of no use in a results file.
        {"files": [{k: v for k, v in asdict(o).items() if k != "log"} for o in outcomes]}
        | (extra or {}),
        machine=machine or results.machine(),
        series=series,
        figures=test_figures(outcomes),
        test_files=test_counts(outcomes),
    )
    results.write(path, doc)
    return doc
