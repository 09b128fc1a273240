"""serieskit.checks.figures: the docs' figures come from results/, in marked
blocks that `figures` rewrites and `figures --check` (a CI stage) holds to
the files; each figure carries its machine's label; CI's own timing becomes
a results file only from a complete run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from serieskit import cli, results
from serieskit.checks import benchmarks, blocks, evidence, figures, pipeline
from serieskit.checks import timings as tblocks
from serieskit.errors import ToolkitError

REPO = Path(__file__).resolve().parent.parent
H200 = results.machine_block(["NVIDIA H200"], "580", "2.11.0+cu130", "13.0")
H200X2 = results.machine_block(["NVIDIA H200"] * 2, "580", "2.11.0+cu130", "13.0", p2p="off")
TEST = "tests/kernels/test_op.py"


def patch_file(subject: str, name: str) -> str:
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: A <a@example.com>\n"
        f"Subject: [PATCH] {subject}\n\nWhy.\n\nPatch-Name: {name}\n---\n"
    )


def write_run(root: Path, name: str, *, base: str, machine: dict, date: str, **body) -> None:
    series = {"base": base, "commit": None, "tree": None, "files": {}, "files_from": None}
    figs = body.pop("figures", {})
    tests = body.pop("test_files", None)
    kind = "tests" if tests else "bench"
    doc = results.document(
        kind, body, machine=machine, series=series, figures=figs, date=date, test_files=tests
    )
    results.write(root / "results" / name, doc)


def counts(passed: int, skipped: int = 0) -> dict:
    return {"passed": passed, "failed": 0, "skipped": skipped, "errors": 0}


@pytest.fixture
def root(tmp_path) -> Path:
    """A toolkit root with two patches, their manifest and a few results files."""
    (tmp_path / "pin.toml").write_text(
        f'[base]\nversion = "0.33.0"\nsha256 = "{"a" * 64}"\ncommit = "{"c" * 40}"\n'
    )
    p = tmp_path / "patches"
    p.mkdir()
    (p / "series").write_text("0001-Kernel-op.patch\n0002-Perf-overlap.patch\n")
    (p / "0001-Kernel-op.patch").write_text(
        patch_file("[Kernel] An op for head\n dim 256", "kernel-op")
    )
    (p / "0002-Perf-overlap.patch").write_text(patch_file("[Perf] Overlap", "tp-prefill-overlap"))
    (p / "manifest.toml").write_text(
        f'[[patch]]\nname = "kernel-op"\ntests = ["{TEST}"]\n\n'
        '[[patch]]\nname = "tp-prefill-overlap"\n'
        'tests = ["tests/distributed/test_dbo_tensor_parallel.py"]\n'
    )
    # An older file on the pin, a newer one on the old base, and the newest on the pin.
    write_run(
        tmp_path,
        "old.json",
        base="vllm==0.33.0",
        machine=H200,
        date="2026-01-01T00:00:00Z",
        test_files={TEST: counts(10)},
    )
    write_run(
        tmp_path,
        "older_base.json",
        base="vllm==0.26.0",
        machine=H200,
        date="2026-03-01T00:00:00Z",
        test_files={TEST: counts(99)},
    )
    write_run(
        tmp_path,
        "new.json",
        base="vllm==0.33.0",
        machine=H200,
        date="2026-02-01T00:00:00Z",
        test_files={TEST: counts(12, 1)},
    )
    write_run(
        tmp_path,
        "two.json",
        base="vllm==0.26.0",
        machine=H200X2,
        date="2025-12-01",
        test_files={"tests/distributed/test_dbo_tensor_parallel.py": counts(98)},
    )
    write_run(
        tmp_path,
        "ab.json",
        base="vllm==0.26.0",
        machine=H200X2,
        date="2025-12-02",
        figures={
            "overlap.prefill_change_pct": results.figure(-4.61, "%", "overlap", "x"),
            "overlap+copy-engine.prefill_change_pct": results.figure(-5.12, "%", "both", "y"),
        },
    )
    (tmp_path / "docs").mkdir()
    return tmp_path


def page(*names: str, before: str = "Intro.\n", after: str = "\nEnd.\n") -> str:
    body = "".join(f"<!-- figures:{n} -->\nold text\n<!-- /figures:{n} -->\n" for n in names)
    return before + body + after


def test_the_series_table_takes_the_newest_run_on_the_pin(root):
    text = blocks.series(evidence.Evidence(root))
    row = next(line for line in text.splitlines() if line.startswith("| `0001`"))
    # The pin's newest run, not the newer one on the old base, nor the older one.
    assert "`test_op.py` 12 passed, 1 skipped" in row
    assert "(`new.json`)" in row
    assert "[Kernel] An op for head dim 256" in row  # the folded subject, unfolded
    assert "| none needed |" in row
    assert "one H200, vLLM 0.33.0 (H200 figures, not Turing figures)" in text.splitlines()[0]


def test_two_gpu_evidence_says_which_base_it_ran_on(root):
    text = blocks.series(evidence.Evidence(root))
    row = next(line for line in text.splitlines() if line.startswith("| `0002`"))
    assert "`test_dbo_tensor_parallel.py`: not run on one GPU" in row
    # A base other than the pin is said to be history.
    assert (
        "last run on vLLM 0.26.0 (an earlier base): `test_dbo_tensor_parallel.py` 98 passed" in row
    )
    assert "A/B prefill -4.6 % (-5.1 % with the copy engine)" in row
    assert "(`ab.json`, `two.json`)" in row


def test_on_one_day_the_run_with_more_tests_wins(root):
    write_run(
        root,
        "same_day_small.json",
        base="vllm==0.26.0",
        machine=H200X2,
        date="2025-12-01",
        test_files={"tests/distributed/test_dbo_tensor_parallel.py": counts(60)},
    )
    ev = evidence.Evidence(root)
    run = ev.with_tests("tests/distributed/test_dbo_tensor_parallel.py", gpus=2)
    assert run is not None and run.name == "two.json"


def test_rewrite_keeps_the_text_around_blocks_and_is_idempotent(root):
    (root / "README.md").write_text(page("series"))
    assert figures.check(root) is not None
    figures.update(root, log=lambda _: None)
    text = (root / "README.md").read_text()
    assert text.startswith("Intro.\n<!-- figures:series -->\n\n| patch |")
    assert text.endswith("\n\n<!-- /figures:series -->\n\nEnd.\n")
    assert "old text" not in text
    assert figures.check(root) is None
    assert figures.update(root, log=lambda _: None) == []


def test_check_gives_a_diff_when_a_results_file_changes(root):
    (root / "docs" / "page.md").write_text(page("series"))
    figures.update(root, log=lambda _: None)
    write_run(
        root,
        "newest.json",
        base="vllm==0.33.0",
        machine=H200,
        date="2026-04-01",
        test_files={TEST: counts(13)},
    )
    diff = figures.check(root)
    assert diff is not None
    assert diff.startswith("--- a/docs/page.md\n+++ b/docs/page.md\n")
    assert "-| `0001`" in diff and "`test_op.py` 13 passed" in diff
    with pytest.raises(ToolkitError, match=r"run `nox -s figures` and commit\n--- a/docs/page.md"):
        figures.session(root, check_only=True)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (page("nonsense"), r"page.md:2: no block is named 'nonsense' \(known: "),
        ("<!-- figures:series -->\nrest\n", r"page.md:1: block 'series' is not closed"),
        (
            "<!-- figures:series -->\n<!-- /figures:runs -->\n",
            r"block 'series' is not closed by '<!-- /figures:series -->'",
        ),
        ("text\n<!-- /figures:series -->\n", r"page.md:2: '<!-- /figures:series -->' closes no"),
    ],
)
def test_a_broken_mark_is_one_error_naming_the_line(root, text, message):
    (root / "docs" / "page.md").write_text(text)
    with pytest.raises(ToolkitError, match=message):
        figures.check(root)


def test_a_missing_results_folder_entry_is_said_plainly(root):
    (root / "results" / "broken.json").write_text("{not json")
    (root / "README.md").write_text(page("series"))
    with pytest.raises(ToolkitError, match=r"results/broken.json is not readable JSON"):
        figures.check(root)


def test_the_command_line_fails_with_one_error_line_and_the_diff(root, capsys):
    (root / "README.md").write_text(page("series"))
    assert cli.run(["figures", "--check"], root) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "error: figures: blocks in the docs differ from results/: run `nox -s figures` and commit"
    )
    assert "  --- a/README.md" in err
    assert cli.run(["figures"], root) == 0
    assert cli.run(["figures", "--check"], root) == 0


@pytest.mark.parametrize(
    ("value", "unit", "signed", "text"),
    [
        (0.0390752, "ms", False, "0.039 ms"),
        (19.106111, "ms", False, "19.11 ms"),
        (165.8, "ms", False, "165.8 ms"),
        (1286.1, "ms", False, "1,286 ms"),
        (0.437984, "fraction", False, "43.8 %"),
        (-4.6118, "%", True, "-4.6 %"),
        (0.3191, "%", False, "0.3 %"),
        (4151.6, "GB/s", False, "4,151.6 GB/s"),
        (310, "tests", False, "310 tests"),
        (None, "ms", False, "(not recorded)"),
    ],
)
def test_values_are_written_the_same_way_everywhere(value, unit, signed, text):
    assert evidence.fmt(value, unit, signed=signed) == text


# --- CI's own timing ----------------------------------------------------------------


def write_timings(root: Path, complete: bool) -> None:
    stages = [
        {"name": n, "seconds": s, "budget_s": 600, "ok": ok}
        for n, s, ok in [
            ("apply", 20.0, True),
            ("test requirements", 100.0, True),
            ("build", 40.0, True),
            ("lint", 300.0, complete),
            ("series tests", 200.0, True),
        ][: 5 if complete else 4]
    ]
    dest = root / ".work" / pipeline.TIMINGS
    dest.parent.mkdir(parents=True, exist_ok=True)
    total = sum(s["seconds"] for s in stages)
    dest.write_text(json.dumps({"complete": complete, "total_s": total, "stages": stages}))


def test_ci_timing_is_not_yet_measured_without_a_recorded_run(root):
    text = tblocks.commands_timing(evidence.Evidence(root))
    assert "not yet measured" in text and "--record-ci" in text


def test_an_incomplete_ci_run_is_not_recorded(root):
    write_timings(root, complete=False)
    with pytest.raises(ToolkitError, match=r"did not complete \(stage 'lint' failed\)"):
        figures.record_ci(root, log=lambda _: None)
    assert not (root / "results" / evidence.CI_TIMINGS).exists()
    (root / ".work" / pipeline.TIMINGS).unlink()
    with pytest.raises(ToolkitError, match=r"no \.work/ci/timings\.json: run `nox -s ci` first"):
        figures.record_ci(root, log=lambda _: None)


def test_a_complete_ci_run_becomes_a_results_file_and_the_timing_blocks(root):
    write_timings(root, complete=True)
    dest = figures.record_ci(root, log=lambda _: None)
    doc = json.loads(dest.read_text())
    assert results.validate(doc) == []
    assert doc["kind"] == "ci" and doc["figures"]["total_s"]["value"] == 660.0
    assert doc["machine"]["label"].startswith("CPU run (no GPU")
    ev = evidence.Evidence(root)
    line = tblocks.commands_timing(ev)
    assert "`nox -s ci` took 11 min 0 s" in line
    # the main command: apply + test requirements + build + series tests
    assert "(apply, test requirements, build, series tests) 6 min 0 s" in line
    table = tblocks.ci_timings(ev)
    assert "| lint | 5 min 0 s | 10 min 0 s |" in table
    # A run whose pipeline names the main command's stages ([main_command]) is
    # summed as it says.
    timings = json.loads((root / ".work" / pipeline.TIMINGS).read_text())
    timings["main_command"] = {"command": "nox -s x", "stages": ["apply", "build"], "seconds": 1}
    timings["ci_machine"] = {"cores": 2, "load_at_start": [1.5, 1.0, 1.0]}
    timings["stages"][0]["load_at_end"] = [3.25, 2.0, 1.0]
    (root / ".work" / pipeline.TIMINGS).write_text(json.dumps(timings))
    figures.record_ci(root, log=lambda _: None)
    line = tblocks.commands_timing(evidence.Evidence(root))
    assert "(apply, build) 1 min 0 s, load average 1.5 to 3.2 on 2 cores;" in line


def timed(folder: Path, command: str, seconds: float, loads: list[float], rc: int = 0) -> Path:
    """What ci/time-command.sh leaves in ``folder``."""
    folder.mkdir(parents=True)
    files = {
        "command": command,
        "note": "a fresh clone",
        "commit": "d" * 40,
        "started": "2026-12-02T04:17:00Z",
        "wall_s": str(seconds),
        "rc": str(rc),
        "load.txt": "".join(f"2026-12-02T04:17:{i:02}Z {x} 1.0 0.5\n" for i, x in enumerate(loads)),
        "du.txt": "6200000000\t.nox\n800000000\t.work\n450000000\t/home/u/.cache/vllm-series\n",
    }
    for name, text in files.items():
        (folder / name).write_text(text + "\n")
    return folder


def test_without_a_loaded_timing_the_block_says_how_to_make_one(root):
    text = tblocks.commands_timing(evidence.Evidence(root))
    assert "on a loaded machine is not yet measured" in text and "--record-timing" in text


def test_a_timed_command_becomes_a_results_file_and_a_range_with_its_load(
    root, tmp_path, monkeypatch
):
    monkeypatch.setattr(figures.os, "cpu_count", lambda: 2)
    command = "python3 -m nox -s apply build test"
    dest = figures.record_timing(root, timed(tmp_path / "a", command, 612.4, [5.1, 8.5]), print)
    doc = json.loads(dest.read_text())
    assert results.validate(doc) == [] and doc["kind"] == "timing"
    assert dest.name == "timing_apply_build_test_2026-12-02.json"
    assert doc["load"]["min"] == 5.1 and doc["load"]["max"] == 8.5
    assert doc["disk"] == {
        ".nox": 6200000000,
        ".work": 800000000,
        "~/.cache/vllm-series": 450000000,
    }
    assert doc["machine"]["label"].endswith("cores shared with other work)")
    text = tblocks.commands_timing(evidence.Evidence(root))
    assert (
        "On 2 cores shared with other work, load average 5.1 to 8.5: `nox -s apply build test` "
        "took 10 min 12 s (one run, from a fresh clone; disk afterwards: " in text
    )
    assert "`.nox` 6.2 GB, `.work` 0.8 GB, `~/.cache/vllm-series` 0.5 GB: 7.5 GB in all" in text
    # A second run of the same command makes a range, its load widens the load's.
    second = timed(tmp_path / "b", command, 401.0, [2.0, 3.0])
    (second / "started").write_text("2026-12-03T01:00:00Z\n")
    figures.record_timing(root, second, print)
    text = tblocks.commands_timing(evidence.Evidence(root))
    assert (
        "load average 2.0 to 8.5: `nox -s apply build test` took 6 min 41 s to 10 min 12 s" in text
    )


def test_a_timing_with_disk_samples_gives_every_place_and_the_peak(root, tmp_path, monkeypatch):
    """ci/time-command.sh's disk.txt: every place sampled through the run; the
    block gives each place afterwards (an empty one as none) and the most
    the run took at once, with the place that held more then (issue 39)."""
    monkeypatch.setattr(figures.os, "cpu_count", lambda: 2)
    folder = timed(tmp_path / "a", "python3 -m nox -s ci", 900.0, [2.0, 3.0])
    (folder / "du.txt").write_text(
        "6200000000\t.nox\n250000000\t.work\n0\tdist\n"
        "800000000\t/home/u/.cache/vllm-series\n13000000\t/home/u/.cache/virtualenv\n0\tTMPDIR\n"
    )
    (folder / "disk.txt").write_text(
        "2026-12-02T04:17:00Z\t100 .nox\t0 .work\t0 dist\t0 TMPDIR\n"
        "2026-12-02T04:27:00Z\t6200000000 .nox\t250000000 .work\t340000000 dist"
        "\t800000000 /home/u/.cache/vllm-series\t900000000 TMPDIR\n"
        "2026-12-02T04:28:00Z\t6200000000 .nox\t5 \t0 TMPDIR\n"  # a cut sample line
    )
    doc = json.loads(figures.record_timing(root, folder, print).read_text())
    assert doc["disk"]["dist"] == 0 and doc["disk"]["~/.cache/virtualenv"] == 13000000
    assert doc["disk_peak"]["total"] == 8490000000 and doc["disk_peak"]["at"].endswith("27:00Z")
    assert doc["disk_peak"]["places"]["TMPDIR"] == 900000000
    assert doc["figures"]["disk.peak"]["value"] == 8490000000
    assert results.validate(doc) == []
    text = tblocks.commands_timing(evidence.Evidence(root))
    assert (
        "(one run, from a fresh clone); `results/timing_ci_2026-12-02.json`: CPU run (no GPU, 2 "
        "cores shared with other work), 2026-12-02. Its disk, in the run from a fresh clone, "
        "`results/timing_ci_2026-12-02.json`: at most 8.5 GB at once (sampled every 10 s; then "
        "`TMPDIR` 0.9 GB, `dist` 0.3 GB); afterwards `.nox` 6.2 GB, `.work` 0.2 GB, `dist` none, "
        "`~/.cache/vllm-series` 0.8 GB, `~/.cache/virtualenv` 13 MB, `TMPDIR` none: 7.3 GB in all."
    ) in text


def test_a_second_run_of_a_day_gets_a_file_of_its_own(root, tmp_path):
    command = "python3 -m nox -s ci"
    first = figures.record_timing(root, timed(tmp_path / "a", command, 900.0, [2.0]), print)
    again = figures.record_timing(root, tmp_path / "a", print)  # the same run recorded again
    assert again == first
    second = timed(tmp_path / "b", command, 700.0, [1.0])
    (second / "started").write_text("2026-12-02T09:00:00Z\n")
    other = figures.record_timing(root, second, print)
    assert other.name == "timing_ci_2026-12-02_2.json" and first.is_file()
    assert json.loads(first.read_text())["total_s"] == 900.0
    text = tblocks.commands_timing(evidence.Evidence(root))
    assert "took 11 min 40 s to 15 min 0 s (2 runs, from a fresh clone; the last run's disk" in text
    assert "afterwards: `.nox` 6.2 GB, `.work` 0.8 GB" in text  # the second run's du.txt


def test_a_failed_or_incomplete_timing_is_refused(root, tmp_path):
    failed = timed(tmp_path / "f", "python3 -m nox -s ci", 30.0, [1.0], rc=1)
    with pytest.raises(ToolkitError, match=r"the timed command failed \(exit 1"):
        figures.record_timing(root, failed, print)
    # A ci run that ran and passed every stage, failed only for its time: recorded.
    (failed / "timings.json").write_text(json.dumps({"complete": True}))
    slow = json.loads(figures.record_timing(root, failed, print).read_text())
    assert slow["outcome"].startswith("every stage passed; CI failed the run only for a stage")
    assert (
        "(one run, from a fresh clone; every stage passed; CI failed the run only"
        in tblocks.commands_timing(evidence.Evidence(root))
    )
    for made in (root / "results").glob("timing_*"):
        made.unlink()
    (failed / "timings.json").write_text(json.dumps({"complete": False}))
    with pytest.raises(ToolkitError, match=r"the timed command failed"):
        figures.record_timing(root, failed, print)
    (failed / "wall_s").unlink()
    with pytest.raises(ToolkitError, match="lacks wall_s: make it with `ci/time-command.sh"):
        figures.record_timing(root, failed, print)
    assert not list((root / "results").glob("timing_*"))


def test_the_readme_table_links_each_cell_to_its_results_file(root, tmp_path, monkeypatch):
    """The README's commands table (issue: figures that read like log output):
    one row per command, CI's own timing, each loaded run with its load, the
    last loaded run's disk at the end and at most; every figure a link to its
    results file, "not measured" where no run measured it."""
    empty = tblocks.commands_table(evidence.Evidence(root))
    rows = [line for line in empty.splitlines() if line.startswith("| `nox")]
    assert rows == [
        "| `nox -s apply build test` | not measured | not measured | not measured | not measured |",
        "| `nox -s ci` | not measured | not measured | not measured | not measured |",
    ]
    assert "Not measured yet" in empty
    monkeypatch.setattr(figures.os, "cpu_count", lambda: 2)
    write_timings(root, complete=True)
    timings = json.loads((root / ".work" / pipeline.TIMINGS).read_text())
    timings["ci_machine"] = {"cores": 2, "load_at_start": [1.5, 1.0, 1.0]}
    (root / ".work" / pipeline.TIMINGS).write_text(json.dumps(timings))
    figures.record_ci(root, log=lambda _: None)
    figures.record_timing(
        root, timed(tmp_path / "a", "python3 -m nox -s apply build test", 612.4, [5.1, 8.5]), print
    )
    folder = timed(tmp_path / "b", "python3 -m nox -s ci", 900.0, [2.0, 3.0])
    (folder / "du.txt").write_text("6200000000\t.nox\n250000000\t.work\n0\tTMPDIR\n")
    (folder / "disk.txt").write_text(
        "2026-12-02T04:27:00Z\t6200000000 .nox\t250000000 .work\t900000000 TMPDIR\n"
    )
    figures.record_timing(root, folder, print)
    second = timed(tmp_path / "c", "python3 -m nox -s ci", 700.0, [0.5, 1.25])
    (second / "started").write_text("2026-12-01T09:00:00Z\n")
    figures.record_timing(root, second, print)
    text = tblocks.commands_table(evidence.Evidence(root))
    lines = text.splitlines()
    assert lines[0] == (
        "| command | CI's machine (2 cores, measured by CI) | 2 cores shared with other work "
        "| disk at the end | disk at most |"
    )
    ci, main = "results/ci_timings.json", "results/timing_apply_build_test_2026-12-02.json"
    loaded, earlier = "results/timing_ci_2026-12-02.json", "results/timing_ci_2026-12-01.json"
    assert lines[2] == (
        f"| `nox -s apply build test` | [6 min 0 s]({ci}) (its stages of `nox -s ci`) "
        f"| [10 min 12 s]({main}), load average 5.1 to 8.5 "
        f"| [7.5 GB]({main}) (`.nox`, `.work`, `~/.cache/vllm-series` only) | not measured |"
    )
    assert lines[3] == (
        f"| `nox -s ci` | [11 min 0 s]({ci}) "
        f"| [11 min 40 s]({earlier}), load average 0.5 to 1.2; "
        f"[15 min 0 s]({loaded}), load average 2.0 to 3.0 "
        f"| [6.5 GB]({loaded}) | [7.3 GB]({loaded}) |"
    )
    # The fixture's runs record no base; CI's is dated the day it was recorded.
    assert lines[5].startswith("CPU runs (no GPU) on base not recorded, 2026-12-01 to ")
    assert lines[5].endswith(
        "; CI's load average 1.5 to 1.5 on 2 cores. Each run in full: "
        "[Measured figures](docs/measured.md)."
    )
    # Every linked file is a results file of the root.
    for path in re.findall(r"\]\((results/[^)]+)\)", text):
        assert (root / path).is_file(), path


def test_the_readme_has_the_table_and_measured_md_the_long_form():
    readme = [n for n, _, _ in figures.blocks_in((REPO / "README.md").read_text(), "README")]
    measured = (REPO / "docs" / "measured.md").read_text()
    assert "commands-table" in readme and "commands-timing" not in readme
    assert "commands-timing" in [n for n, _, _ in figures.blocks_in(measured, "measured")]


# --- the committed pages ----------------------------------------------------------------


def test_the_committed_pages_are_what_the_results_say():
    """What CI's `figures --check` stage runs."""
    assert figures.check(REPO) is None, "run `nox -s figures` and commit"


def test_every_gpu_figure_in_the_docs_carries_its_machine_label():
    ev = evidence.Evidence(REPO)
    for name, render in blocks.BLOCKS.items():
        text = render(ev)
        for run in ev.runs:
            if f"`{run.path}`" not in text:
                continue
            label = str(run.machine.get("label"))
            assert label in text, f"block {name} quotes {run.path} without its label {label!r}"
            if run.gpus and "H200" in label:
                assert "not a Turing figure" in label or "not Turing speed" in label
    assert "the seed's Turing figure" in benchmarks.seed(ev)


# A measured value: a time, a bandwidth, a rate, a share, a test count.
MEASURED = re.compile(
    r"\b\d[\d,]*(\.\d+)? ?(ms|us|µs|GB/s|TFLOP/s|%)(?!\w)|\b\d+ (passed|failed|skipped)\b"
)
OWN_PAGES = [
    "README.md",
    "docs/user-guide.md",
    "docs/contributing.md",
    "docs/gpu-evidence.md",
    "docs/evidence-runs.md",
    "docs/gpu-machine.md",
    "docs/measured.md",
    "docs/nothing-is-lost.md",
    "docs/pull-requests.md",
    "docs/serve-on-turing.md",
]


def outside_blocks(text: str) -> str:
    text = re.sub(r"<!-- figures:([\w-]+) -->.*?<!-- /figures:\1 -->", "", text, flags=re.S)
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


@pytest.mark.parametrize("page_path", OWN_PAGES)
def test_no_measured_figure_sits_outside_a_block(page_path):
    loose = [m.group(0) for m in MEASURED.finditer(outside_blocks((REPO / page_path).read_text()))]
    assert not loose, f"{page_path}: figures written by hand: {loose} (put them in a block)"


# Which pull-request groups pass `pr --check` changes with every patch and run:
# a page that says it by hand goes stale silently (issue 39: "every group passes
# `--check` but the Turing attention" after all five passed).
GROUPS_PASS = re.compile(
    r"(every|each|all|no|\w+ of the) (\w+ )?(pr )?groups? (\w+ )?(pass|fail)\w* `?(pr )?--check",
    re.I,
)


@pytest.mark.parametrize("page_path", OWN_PAGES)
def test_no_page_says_by_hand_which_groups_pass_the_pr_check(page_path):
    text = " ".join(outside_blocks((REPO / page_path).read_text()).split())
    said = [m.group(0) for m in GROUPS_PASS.finditer(text)]
    assert not said, f"{page_path}: which groups pass `--check`, by hand: {said}"


def test_the_groups_pattern_finds_the_stale_sentence():
    assert GROUPS_PASS.search("On this commit every group passes `--check` but the Turing")
    assert GROUPS_PASS.search("all five groups pass --check")
    assert not GROUPS_PASS.search("`--check` fails on: a branch that does not apply")


def test_the_pattern_finds_a_figure_written_by_hand_and_only_there():
    text = "took 1.5 ms\n<!-- figures:series -->\n2 ms\n<!-- /figures:series -->\n```\n3 ms\n```\n"
    assert [m.group(0) for m in MEASURED.finditer(outside_blocks(text))] == ["1.5 ms"]
    assert MEASURED.search("98 passed") and MEASURED.search("43.8 %")
    assert not MEASURED.search("head dim 256, 2048 tokens, sm_75")


# --- runs on an earlier version of the files they cover ------------------------------

OLD_CU, NEW_CU, PY, TEST_BLOB = "1" * 40, "2" * 40, "3" * 40, "4" * 40


def diff(path: str, old: str, new: str) -> str:
    """One `git format-patch --full-index` diff that replaces one line."""
    return (
        f"diff --git a/{path} b/{path}\nindex {old}..{new} 100644\n--- a/{path}\n+++ b/{path}\n"
        "@@ -1 +1 @@\n-old\n+new\n"
    )


@pytest.fixture
def blobs_root(root) -> Path:
    """The root's two patches with diffs: 0001 adds csrc/op.cu and its test;
    0002 adds overlap.py, changes op.cu again (the last word on it), deletes
    gone.py and renames old.py."""
    p = root / "patches"
    (p / "0001-Kernel-op.patch").write_text(
        patch_file("[Kernel] An op", "kernel-op")
        + diff("csrc/op.cu", "0" * 40, OLD_CU)
        + diff(TEST, "0" * 40, TEST_BLOB)
    )
    (p / "0002-Perf-overlap.patch").write_text(
        patch_file("[Perf] Overlap", "tp-prefill-overlap")
        + diff("vllm/overlap.py", "0" * 40, PY)
        + diff("csrc/op.cu", OLD_CU, NEW_CU)
        + "diff --git a/vllm/gone.py b/vllm/gone.py\ndeleted file mode 100644\n"
        f"index {'5' * 40}..{'0' * 40}\n--- a/vllm/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
        "diff --git a/vllm/old.py b/vllm/moved.py\nsimilarity index 100%\n"
        "rename from vllm/old.py\nrename to vllm/moved.py\n"
    )
    return root


def run_on(root: Path, name: str, files: dict[str, str], **extra) -> None:
    """A one-GPU run on the pin of TEST that recorded ``files``."""
    write_run(
        root,
        name,
        base="vllm==0.33.0",
        machine=H200,
        date="2026-05-01",
        test_files={TEST: counts(20)},
        **extra,
    )
    path = root / "results" / name
    doc = json.loads(path.read_text())
    doc["series"]["files"] = files
    path.write_text(json.dumps(doc))


def test_the_series_head_is_read_from_the_patch_files_index_lines(blobs_root):
    ev = evidence.Evidence(blobs_root)
    assert ev.head == {
        "csrc/op.cu": NEW_CU,  # the last patch that touches it
        TEST: TEST_BLOB,
        "vllm/overlap.py": PY,
        "vllm/gone.py": None,  # deleted
        "vllm/old.py": None,  # renamed away; the new name has no index line, so no blob
    }
    assert ev.patches[0].files == frozenset({"csrc/op.cu", TEST})


def test_a_run_on_the_current_files_is_not_marked(blobs_root):
    run_on(blobs_root, "now.json", {"csrc/op.cu": NEW_CU, TEST: TEST_BLOB, "vllm/overlap.py": PY})
    row = next(
        line
        for line in blocks.series(evidence.Evidence(blobs_root)).splitlines()
        if line.startswith("| `0001`")
    )
    assert "`test_op.py` 20 passed (`now.json`)" in row
    assert "ran before" not in row


def test_a_run_before_the_current_version_of_a_file_says_which(blobs_root):
    # op.cu as 0001 left it, before 0002 changed it again; the test file current.
    run_on(blobs_root, "then.json", {"csrc/op.cu": OLD_CU, TEST: TEST_BLOB})
    ev = evidence.Evidence(blobs_root)
    row = next(line for line in blocks.series(ev).splitlines() if line.startswith("| `0001`"))
    assert "(`then.json`: ran before the current version of `op.cu`)" in row
    run = ev.named("then.json")
    # 0002's files: overlap.py was not in that run's series at all.
    assert ev.predates(run, ["tp-prefill-overlap"]) == (
        "ran before the current version of `op.cu` and `overlap.py`"
    )
    assert ev.predates_note(run, ["kernel-op"]) == (
        " It ran before the current version of `op.cu` of patch 0001."
    )
    runs_row = next(line for line in blocks.runs(ev).splitlines() if "`then.json`" in line)
    assert runs_row.endswith("| every patch |")  # 0001's op.cu, 0002's op.cu and overlap.py
    tests_row = next(line for line in blocks.gpu_tests(ev).splitlines() if "`then.json`" in line)
    assert tests_row.endswith("| ran before the current version of `op.cu` |")


def test_current_says_per_kind_which_runs_ran_on_the_series_head(blobs_root):
    run_on(blobs_root, "now.json", {"csrc/op.cu": NEW_CU, TEST: TEST_BLOB, "vllm/overlap.py": PY})
    text = blocks.current(evidence.Evidence(blobs_root))
    rows = {line.split(" | ")[1]: line for line in text.splitlines() if line.startswith("| the")}
    # The one-GPU tests: the newest run on the pin, on the current files.
    assert rows["`now.json`"].endswith("| yes |")
    # The two-GPU tests and the A/B: on an earlier base, so not current.
    assert rows["`two.json`"].endswith("| no: an earlier base |")
    assert "`old.json`" not in rows and "`new.json`" not in rows  # older than now.json
    assert (
        text.splitlines()[-1]
        == "To run again on the series head: the series' test files, two GPUs."
    )
    run_on(blobs_root, "then.json", {"csrc/op.cu": OLD_CU, TEST: TEST_BLOB})
    doc = json.loads((blobs_root / "results" / "then.json").read_text())
    doc["date"] = "2026-06-01"
    (blobs_root / "results" / "then.json").write_text(json.dumps(doc))
    text = blocks.current(evidence.Evidence(blobs_root))
    assert (
        "| `then.json` |" in text and "| no: it ran before the current version of `op.cu` |" in text
    )


def test_a_test_file_no_patch_lists_is_named_without_code_format(blobs_root):
    # A run of a test file since renamed: its row stays, its name is plain
    # text (the names check fails on a code-format name the trees lack).
    write_run(
        blobs_root,
        "renamed.json",
        base="vllm==0.33.0",
        machine=H200,
        date="2026-05-01",
        test_files={"tests/test_gone.py": counts(3), TEST: counts(20)},
    )
    rows = [
        line
        for line in blocks.gpu_tests(evidence.Evidence(blobs_root)).splitlines()
        if "`renamed.json`" in line
    ]
    gone = next(line for line in rows if "test_gone.py" in line)
    assert gone.startswith("| tests/test_gone.py |")
    assert gone.endswith("| a test file the series no longer has |")
    assert any(line.startswith(f"| `{TEST}` |") for line in rows)


def test_the_code_is_named_first_and_the_rest_counted(blobs_root):
    run_on(blobs_root, "old.json", {})  # recorded nothing it changed: every file differs
    path = blobs_root / "results" / "old.json"
    doc = json.loads(path.read_text())
    doc["series"]["files"] = {"unrelated.py": "9" * 40}
    path.write_text(json.dumps(doc))
    ev = evidence.Evidence(blobs_root)
    words = ev.predates(ev.named("old.json"), ["kernel-op", "tp-prefill-overlap"], shown=1)
    assert words == "ran before the current version of `op.cu` and 2 other files"


def test_only_the_patches_whose_files_changed_are_named(blobs_root):
    # Current for 0002's overlap.py, but op.cu (0001's and 0002's) and 0001's test are older.
    run_on(blobs_root, "mixed.json", {"csrc/op.cu": NEW_CU, TEST: "6" * 40, "vllm/overlap.py": PY})
    ev = evidence.Evidence(blobs_root)
    runs_row = next(line for line in blocks.runs(ev).splitlines() if "`mixed.json`" in line)
    assert runs_row.endswith("| 0001 |")
    assert ev.predates(ev.named("mixed.json"), ["tp-prefill-overlap"]) == ""
    assert ev.predates(ev.named("mixed.json"), ["kernel-op"]) == (
        "ran before the current version of `test_op.py`"
    )


def test_a_run_that_recorded_no_files_says_so(blobs_root):
    ev = evidence.Evidence(blobs_root)
    run = ev.named("new.json")  # the fixture's runs record no files
    assert ev.outdated(run, ["kernel-op"]) is None
    assert ev.predates_note(run, ["kernel-op", "tp-prefill-overlap"]) == (
        " Which version of the files of the series it ran on is not recorded."
    )
    runs_row = next(line for line in blocks.runs(ev).splitlines() if "`new.json`" in line)
    assert runs_row.endswith("| not recorded |")


def test_a_benchmark_caption_names_the_files_changed_since(blobs_root, monkeypatch):
    monkeypatch.setitem(benchmarks.COVERS, "crossover", ["kernel-op"])
    run_on(
        blobs_root,
        "cross.json",
        {"csrc/op.cu": OLD_CU, TEST: TEST_BLOB},
        figures={"ctx0_decodes0.crossover_query_len": results.figure(256, "tokens", "q", "x")},
    )
    text = benchmarks.crossover(evidence.Evidence(blobs_root))
    assert text.endswith("2026-05-01. It ran before the current version of `op.cu` of patch 0001.")


def test_the_a_b_block_skips_a_tp1_harness_check(blobs_root):
    def e2e_run(name: str, **extra) -> None:
        figures = {"reference.prefill_total_mean_s": results.figure(2.0, "s", "p", "x")}
        run_on(blobs_root, name, {"csrc/op.cu": OLD_CU}, figures=figures)
        path = blobs_root / "results" / name
        doc = json.loads(path.read_text())
        doc.update(kind="e2e", **extra)
        path.write_text(json.dumps(doc))

    e2e_run("ab.json")
    assert "`results/ab.json`" in benchmarks.e2e(evidence.Evidence(blobs_root))
    e2e_run("tp1.json", tp=1, date="2026-06-01")
    text = benchmarks.e2e(evidence.Evidence(blobs_root))
    assert "`results/ab.json`" in text and "tp1.json" not in text
    e2e_run("tp2.json", tp=2, date="2026-06-02")
    assert "`results/tp2.json`" in benchmarks.e2e(evidence.Evidence(blobs_root))


def test_crossover_table_per_head_dim(blobs_root):
    f = results.figure
    run_on(
        blobs_root,
        "cross.json",
        {"csrc/op.cu": OLD_CU, TEST: TEST_BLOB},
        figures={
            "hd128.ctx0_decodes16.crossover_query_len": f(384, "tokens", "q", "x"),
            "hd128.ctx2048_decodes0.crossover_query_len": f(None, "tokens", "q", "x"),
            "hd256.ctx0_decodes0.crossover_query_len": f(256, "tokens", "q", "x"),
            "hd256.ctx0_decodes0.ratio_at_65": f(1.5, "ratio", "r", "x"),
        },
    )
    rows = [
        line
        for line in benchmarks.crossover(evidence.Evidence(blobs_root)).splitlines()
        if line.startswith("| 1") or line.startswith("| 2")
    ]
    assert rows == [
        "| 128 | 2,048 | 0 | never | (not recorded) |",
        "| 128 | 0 | 16 | 384 | (not recorded) |",
        "| 256 | 0 | 0 | 256 | 1.50 |",
    ]


def test_figures_and_claims_follow_one_rule(blobs_root):
    """The pull requests' claims and the docs' figures name the same files as
    changed since a run (serieskit.results.changed_since)."""
    from serieskit.pr import claims

    run_on(
        blobs_root,
        "claim.json",
        {"csrc/op.cu": OLD_CU, TEST: TEST_BLOB},
        figures={"t": results.figure(1.0, "ms", "t", "x")},
    )
    ev = evidence.Evidence(blobs_root)
    files = ev.patches[0].files
    checked = claims.check(
        blobs_root,
        claims.Claim("results/claim.json", "figures.t", "t", "ms", "NVIDIA H200"),
        {f: {ev.head[f]} for f in files},
    )
    stale = [p for p in checked.problems if p.startswith("stale:")]
    assert [c.path for c in ev.outdated(ev.named("claim.json"), ["kernel-op"]) or []] == [
        "csrc/op.cu"
    ]
    assert stale == [
        "stale: results/claim.json ran on a series where csrc/op.cu changed since the run "
        f"(recorded {OLD_CU[:12]}, head {NEW_CU[:12]})"
    ]


def test_the_sweep_and_the_op_benchmark_each_have_their_block():
    """Both files measure the mma.sync ceiling: the attention table takes the
    op's benchmark, the shapes table the sweep, fastest shape first."""
    ev = evidence.Evidence(REPO)
    attention = benchmarks.attention(ev)
    assert "bench_prefill_attention_034_h100_20261207_2.json" in attention
    assert "bench_prefill_variants" not in attention
    shapes = benchmarks.variants(ev)
    assert "bench_prefill_variants_034_h100_rowsums_2.json" in shapes
    rows = [line for line in shapes.splitlines() if line.startswith("| 128 |")]
    fractions = [float(r.split(" | ")[4].rstrip(" %")) for r in rows]
    assert fractions == sorted(fractions, reverse=True) and len(rows) > 1
    assert sum("(shipped then)" in r for r in rows) == 1


def test_each_head_dim_of_the_sweep_comes_from_the_newest_run_that_timed_it():
    """A sweep of some head dims only (--head-dims) replaces those head dims'
    rows; a later sweep of every head dim replaces them all: the newest (the
    row sums, every head dim, run twice) gives every table row, and no
    earlier file is cited."""
    ev = evidence.Evidence(REPO)
    shapes = benchmarks.variants(ev)
    cited = set(re.findall(r"bench_prefill_variants_[0-9a-z_]+\.json", shapes))
    assert cited == {"bench_prefill_variants_034_h100_rowsums_2.json"}
    tables = shapes.split("| head dim | shape |")[1:]
    assert len(tables) == 1
    assert all(f"| {hd} |" in tables[0] for hd in (64, 128, 256))
    assert "2,048 after 153,600" in tables[0]
    for shipped in ("hd64.w4m2k64c2.lz.a1.rs", "hd128.w12m1k32c1.rs", "hd256.w8m1k16c1.kv.rs"):
        assert f"`{shipped}` (shipped then)" in shapes


# --- text citing a one-GPU run ----------------------------------------------------


def cite(root: Path, page: str, text: str) -> list[str]:
    (root / page).parent.mkdir(parents=True, exist_ok=True)
    (root / page).write_text(text)
    return figures.stale_citations(root)


def test_text_citing_an_earlier_run_as_current_fails(blobs_root):
    run_on(blobs_root, "then.json", {"csrc/op.cu": OLD_CU, TEST: TEST_BLOB})
    found = cite(
        blobs_root, "docs/k.md", "Intro.\n\nThe kernel takes 1 ms (`results/then.json`).\n"
    )
    assert found == [
        "docs/k.md:3: cites `then.json`, which ran before the current version of `op.cu`: say it "
        'is earlier evidence (e.g. "It ran before the current version of ..."), or cite a run '
        "of the current version (nox -s evidence)"
    ]
    with pytest.raises(ToolkitError, match="cites `then.json`"):
        figures.session(blobs_root, check_only=True)


@pytest.mark.parametrize(
    "text",
    [
        "It took 1 ms (`then.json`). It ran before the current version of `op.cu`.\n",
        "Earlier evidence: 1 ms (`then.json`).\n",
        "```\npython3 bench/x.py --out results/then.json\n```\n",
        "<!-- figures:runs -->\n`then.json` 1 ms\n<!-- /figures:runs -->\n",
        "The run on the current files (`now.json`).\n",
        "The two-GPU run (`two.json`) and a file that is not a run (`pin.json`).\n",
    ],
)
def test_labelled_generated_current_or_other_citations_pass(blobs_root, text):
    run_on(blobs_root, "then.json", {"csrc/op.cu": OLD_CU, TEST: TEST_BLOB})
    run_on(blobs_root, "now.json", {"csrc/op.cu": NEW_CU, TEST: TEST_BLOB, "vllm/overlap.py": PY})
    assert cite(blobs_root, "README.md", text) == []


def test_a_label_covers_its_own_row_and_item_only(blobs_root):
    run_on(blobs_root, "then.json", {"csrc/op.cu": OLD_CU, TEST: TEST_BLOB})
    text = (
        "| a | b |\n|---|---|\n| `then.json` | ran before the current version |\n"
        "| `then.json` | 1 ms |\n\n- earlier evidence: `then.json`\n- now: `then.json`\n"
    )
    found = cite(blobs_root, "docs/t.md", text)
    assert [f.split(": cites")[0] for f in found] == ["docs/t.md:4", "docs/t.md:7"]


def test_a_pull_request_body_is_held_to_its_own_patches(blobs_root):
    # Current for 0002's files, older for 0001's test file.
    run_on(blobs_root, "mixed.json", {"csrc/op.cu": NEW_CU, TEST: "6" * 40, "vllm/overlap.py": PY})
    manifest = blobs_root / "patches" / "manifest.toml"
    manifest.write_text(
        manifest.read_text()
        + '\n[[pr]]\nname = "overlap"\npatches = ["tp-prefill-overlap"]\n'
        + '\n[[pr]]\nname = "op"\npatches = ["kernel-op"]\n'
    )
    assert cite(blobs_root, "reports/pr/overlap/body.md", "Measured: `mixed.json`.\n") == []
    found = cite(blobs_root, "reports/pr/op/body.md", "Measured: `mixed.json`.\n")
    assert len(found) == 1 and "`test_op.py`" in found[0]


def test_the_committed_text_cites_no_earlier_run_as_current():
    assert figures.stale_citations(REPO) == []


# --- the sitting's block --------------------------------------------------------------


def test_the_sitting_block_before_and_after_a_measured_sitting(blobs_root):
    ev = evidence.Evidence(blobs_root)
    assert blocks.sitting(ev).startswith("Not measured yet")
    calls = [
        {"step": "stage", "args": "part1", "seconds": 12.0, "rc": 0, "parts": []},
        {
            "step": "bench",
            "args": "part1-2",
            "seconds": 250.0,
            "rc": 0,
            "parts": [{"part": "build", "seconds": 41.0, "rc": 0, "cap_s": 300}],
        },
        {"step": "batch", "args": "", "seconds": 400.0, "rc": 0, "parts": []},
        {"step": "tests", "args": "", "seconds": 390.0, "rc": 0, "parts": []},
    ]
    doc = results.document(
        "sitting",
        {"machine_s": 800.0, "start_s": 75.0, "calls": calls, "one_machine": True, "limit_s": 900},
        machine=H200,
        series={"base": "vllm==0.33.0", "commit": "c", "tree": "t", "files": {}, "files_from": "x"},
        figures={},
        date="2026-12-02T05:00:00Z",
        torch_pin=None,
    )
    results.write(blobs_root / "results" / "sitting_033_h200_20261202.json", doc)
    text = blocks.sitting(evidence.Evidence(blobs_root))
    assert text.startswith(
        "Measured: 13 min 20 s of GPU time from the machine's start to the end of its last call "
        "(within the 15 min 0 s a sitting may take), of which 1 min 15 s before the first command."
    )
    assert "| 2 | `gpu/evidence.sh bench part1-2` | 4 min 10 s | passed | build 41 s |" in text
    assert "| beside | `gpu/evidence.sh batch` | 6 min 40 s | passed | - |" in text
    assert "| 3 | `gpu/evidence.sh tests` |" in text
    assert "`results/sitting_033_h200_20261202.json`: H200 figure" in text
    # A step of a sitting run again later does not stand for the sitting:
    # the block keeps the whole one and says what ran after it.
    again = results.document(
        "sitting",
        {"machine_s": 300.0, "start_s": 40.0, "calls": calls[:2], "limit_s": 900},
        machine=H200,
        series={"base": "vllm==0.33.0", "commit": "c", "tree": "t", "files": {}, "files_from": "x"},
        figures={},
        date="2026-12-02T06:00:00Z",
        torch_pin=None,
    )
    again["purpose"] = "the backend's tests alone again"
    results.write(blobs_root / "results" / "sitting_033_h200_20261202_2.json", again)
    text = blocks.sitting(evidence.Evidence(blobs_root))
    assert text.startswith("Measured: 13 min 20 s")
    assert text.rstrip().endswith(
        "After it: the backend's tests alone again (`results/sitting_033_h200_20261202_2.json`)."
    )
