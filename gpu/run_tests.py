"""Run the series' test files in the assembled tree on the GPU machine and
write the results JSON (GPU, driver, torch, date, series commit and tree,
base version, outcomes).

    python3 gpu/run_tests.py TREE OUT.json [-k EXPR] [TEST_FILE ...]

With test files named, only those run (they must be the series' own); -k
selects tests in them as pytest's -k does (a long file over two runs)."""

import shutil
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from serieskit import runner, series  # noqa: E402


def stamp(tree: Path, name: str) -> str:
    """What the overlay packer recorded of the tested series."""
    return (tree / name).read_text().strip() if (tree / name).exists() else "?"


def main(argv: list[str]) -> int:
    tree, dest, chosen = Path(argv[0]), Path(argv[1]), argv[2:]
    select = None
    if chosen[:1] == ["-k"]:
        select, chosen = chosen[1], chosen[2:]
    files = series.test_files(ROOT)
    unknown = [f for f in chosen if f not in files]
    if unknown:
        sys.exit(f"error: not a test file of the series: {', '.join(unknown)}")
    logs = Path("/tmp/test-logs")
    shutil.rmtree(logs, ignore_errors=True)
    outcomes = runner.run_all(tree, chosen or files, logs, select=select)
    runner.write_results(dest, outcomes, stamp(tree, "SERIES_COMMIT"),
                         {"series_tree": stamp(tree, "SERIES_TREE"),
                          "base_version": stamp(tree, "BASE_VERSION")})
    # One archive: the GPU machine returns at most eight files from its output folder.
    with tarfile.open(dest.parent / "test-logs.tgz", "w:gz") as tar:
        tar.add(logs, arcname="test-logs")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
