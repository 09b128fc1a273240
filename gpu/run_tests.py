"""Run the series' test files in the assembled tree on the GPU machine and
write the results JSON (GPU, driver, torch, date, series commit, outcomes).

    python3 gpu/run_tests.py TREE OUT.json [-k EXPR] [TEST_FILE ...]

With test files named, only those run (they must be the series' own); -k
selects tests in them as pytest's -k does (a long file over two runs)."""

import shutil
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from serieskit import runner, series  # noqa: E402

root = Path(__file__).resolve().parents[1]
tree, dest, chosen = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
select = None
if chosen[:1] == ["-k"]:
    select, chosen = chosen[1], chosen[2:]
commit = (tree / "SERIES_COMMIT").read_text().strip() if (tree / "SERIES_COMMIT").exists() else "?"
files = series.test_files(root)
unknown = [f for f in chosen if f not in files]
if unknown:
    sys.exit(f"error: not a test file of the series: {', '.join(unknown)}")
logs = Path("/tmp/test-logs")
shutil.rmtree(logs, ignore_errors=True)
outcomes = runner.run_all(tree, chosen or files, logs, select=select)
runner.write_results(dest, outcomes, commit)
# One archive: the GPU machine returns at most eight files from its output folder.
with tarfile.open(dest.parent / "test-logs.tgz", "w:gz") as tar:
    tar.add(logs, arcname="test-logs")
sys.exit(0 if all(o.ok for o in outcomes) else 1)
