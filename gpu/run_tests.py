"""Run the series' test files in the assembled tree on the GPU machine and
write the results JSON: the schema header of results/README.md (machine,
GPU, driver, torch, date, series commit, tree and files from the packer's
stamps, base version), then the outcomes.

    python3 gpu/run_tests.py TREE OUT.json [-k EXPR] [TEST_FILE ...]

With test files named, only those run (they must be the series' own); -k
selects tests in them as pytest's -k does (a long file over two runs). With
COVERAGE=1 they run under coverage.py (test contexts, every Python process
they start included) and the report goes beside OUT.json as
coverage-<machine>.json (e.g. coverage-h200x2.json): copied here to
.work/pr/coverage/h200x2.json, the pr session lists it beside the CPU's.
TEST_TIMEOUT=SECONDS ends a file's pytest after that long (default 1800): it
is counted as an error and the JSON is still written. JOBS=N runs N files at
once (default 1: files that time nothing may share the GPU, gpu/evidence.sh)."""

import os
import shlex
import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import results  # noqa: E402
from serieskit.checks import runner  # noqa: E402
from serieskit.series import series  # noqa: E402


def commands(files: list[str], select: str | None) -> list[str]:
    """The pytest command of each file as it ran (one process each)."""
    env = "NCCL_P2P_DISABLE=1 " if os.environ.get("NCCL_P2P_DISABLE") == "1" else ""
    k = f"-k {shlex.quote(select)} " if select else ""
    return [f"{env}python -m pytest {k}{f}" for f in files]


def main(argv: list[str]) -> int:
    tree, dest, chosen = Path(argv[0]), Path(argv[1]), argv[2:]
    select = None
    if chosen[:1] == ["-k"]:
        select, chosen = chosen[1], chosen[2:]
    files = series.test_files(ROOT)
    unknown = [f for f in chosen if f not in files]
    if unknown:
        sys.exit(f"error: not a test file of the series: {', '.join(unknown)}")
    # Per results file, so that runs side by side (files that share the GPU
    # without timing anything) keep their own logs.
    logs = Path(f"/tmp/test-logs-{dest.stem}")
    shutil.rmtree(logs, ignore_errors=True)
    ran = chosen or files
    rc = (
        runner.coverage_rc(Path("/tmp/coverage-data"))
        if os.environ.get("COVERAGE") == "1"
        else None
    )
    # TEST_TIMEOUT (seconds per file): a file cut short still leaves its
    # outcome and this JSON, inside a device call's own time limit.
    timeout = float(os.environ.get("TEST_TIMEOUT") or 1800)
    jobs = int(os.environ.get("JOBS") or 1)
    outcomes = runner.run_all(
        tree, ran, logs, jobs=jobs, select=select, coverage=rc, timeout=timeout
    )
    runner.write_results(
        dest, outcomes, results.series_from_stamps(tree), {"commands": commands(ran, select)}
    )
    if rc:
        report = dest.parent / f"coverage-{runner.machine_slug()}.json"
        runner.coverage_report(tree, rc, report, results.series_from_stamps(tree))
    # One archive: the GPU machine returns at most eight files from its output folder.
    with tarfile.open(dest.parent / f"{dest.stem}-logs.tgz", "w:gz") as tar:
        tar.add(logs, arcname=f"{dest.stem}-logs")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
