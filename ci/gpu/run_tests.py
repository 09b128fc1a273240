"""Run the series' test files in the assembled tree on the GPU machine and
write the results JSON (GPU, driver, torch, date, series commit, outcomes)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from serieskit import runner, series  # noqa: E402

root = Path(__file__).resolve().parents[2]
tree, dest = Path(sys.argv[1]), Path(sys.argv[2])
commit = (tree / "SERIES_COMMIT").read_text().strip() if (tree / "SERIES_COMMIT").exists() else "?"
outcomes = runner.run_all(tree, series.test_files(root), dest.parent / "test-logs")
runner.write_results(dest, outcomes, commit)
sys.exit(0 if all(o.ok for o in outcomes) else 1)
