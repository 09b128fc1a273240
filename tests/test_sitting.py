"""One sitting of the GPU machine: the plan of its device calls from the
packed loads, and results/ from the files the calls return."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from serieskit import git, results
from serieskit.build import recipe, sitting
from serieskit.errors import ToolkitError


def sized(path: Path, mib: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(int(mib * 2**20))


@pytest.fixture
def load(tmp_path) -> tuple[Path, Path]:
    """A repository with a 7 MiB working tree and the loads of 0.33.0's sizes."""
    root = tmp_path / "repo"
    sized(root / "big.png", 7)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "big.png"], check=True)
    gpu = root / ".dev" / "gpu"
    (root / ".gitignore").write_text("/.dev/\n")
    sized(gpu / "part1" / "core.xz.00", 56)
    sized(gpu / "part1-2" / "core.xz.01", 4.8)
    sized(gpu / "wheels" / "whl" / "a.whl", 49)
    sized(gpu / "part2" / "overlay.tgz", 22)
    (gpu / "MANIFEST.sha256").write_text("x  part2/overlay.tgz\n")
    return root, gpu


def test_the_plan_carries_the_loads_in_the_fewest_calls(load):
    root, gpu = load
    calls = sitting.plan(root, gpu)
    assert [(c.step, c.parts) for c in calls] == [
        ("stage", ["part1"]),  # first: it clears what an earlier load left
        ("stage", ["wheels"]),
        ("bench", ["part1-2"]),  # beside part2, in the call that assembles
        ("tests", []),
    ]
    assert calls[2].carry == [".dev/gpu/part2", ".dev/gpu/MANIFEST.sha256", ".dev/gpu/part1-2"]
    assert calls[2].command == "export OUT; bash gpu/evidence.sh bench part1-2"
    tree = git.sent_bytes(root)
    assert 7 * 2**20 <= tree < 7 * 2**20 + 4096  # the tracked file and .gitignore
    assert all(c.bytes <= recipe.CALL_BYTES - recipe.MARGIN for c in calls)
    assert calls[0].bytes == tree + 56 * 2**20 and calls[3].bytes == tree
    # The time a sitting may take, on the estimates.
    assert sitting.EXPECTED_S["start"] + sum(c.expected_s for c in calls) < sitting.SITTING_S


def test_the_engine_call_comes_last_on_the_same_tree(load):
    # The time to first token boots vLLM on the tree `bench` assembled: a call
    # of its own after `tests`, carrying nothing, offered beside the plan.
    root, gpu = load
    engine = sitting.engine_call(root)
    assert engine.carry == [] and engine.expected_s == sitting.EXPECTED_S["engine"]
    assert engine.command == "export OUT; bash gpu/evidence.sh engine"
    assert "engine" not in [c.step for c in sitting.plan(root, gpu)]
    lines: list[str] = []
    sitting.print_plan(root, gpu, log=lines.append)
    assert any(engine.command in line for line in lines)
    script = (Path(__file__).resolve().parents[1] / "gpu" / "evidence.sh").read_text()
    assert re.search(r'^STEPS=".*\bengine\b.*"', script, re.M)
    assert "\n  engine)\n" in script and "prefill_ttft.json" in sitting.RETURNED


def test_the_plan_counts_the_untracked_files_that_travel(load):
    root, gpu = load
    sized(root / "notes.bin", 1)  # untracked, not ignored: it travels with every call
    with pytest.raises(ToolkitError, match=r"part1 is 56.0 MiB; with the working tree \(8.0 MiB"):
        sitting.plan(root, gpu)


def test_the_plan_takes_the_last_measured_sitting(load):
    root, gpu = load
    (root / "results").mkdir()
    (root / "results" / "sitting_033_h200_20261202.json").write_text(
        json.dumps(
            {
                "date": "2026-12-02T05:00:00Z",
                "start_s": 80.0,
                "calls": [{"step": "stage", "seconds": 9.0}, {"step": "bench", "seconds": 200.0}],
            }
        )
    )
    calls = sitting.plan(root, gpu)
    assert [c.expected_s for c in calls] == [9.0, 9.0, 200.0, sitting.EXPECTED_S["tests"]]
    assert sitting.measured_steps(root)["start"] == 80.0
    # A whole sitting, then a step of one run again: the whole one is the estimate.
    for name, date, calls_ in (
        (
            "sitting_033_h200_20261202_2.json",
            "2026-12-02T06:00:00Z",
            [("bench", 380.0), ("tests", 330.0)],
        ),
        ("sitting_033_h200_20261202_3.json", "2026-12-02T07:00:00Z", [("bench", 250.0)]),
    ):
        (root / "results" / name).write_text(
            json.dumps(
                {
                    "date": date,
                    "start_s": 40.0,
                    "calls": [{"step": k, "seconds": v} for k, v in calls_],
                }
            )
        )
    assert sitting.measured_steps(root) == {"bench": 380.0, "tests": 330.0, "start": 40.0}


def returned(folder: Path, step: str, members: dict[str, dict | str]) -> None:
    """An evidence-STEP.tgz as gpu/evidence.sh returns it."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(folder / f"evidence-{step}.tgz", "w:gz") as tar:
        for name, content in members.items():
            data = (content if isinstance(content, str) else json.dumps(content)).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (folder / f"evidence-{step}.log").write_text(f"evidence {step}: done\n")


LATE = "2026-12-02T21:40:00Z"


def sitting_files(tmp_path, date: str = "2026-12-02T05:10:00Z") -> list[Path]:
    """The files of a sitting's bench and tests calls, as they come back."""
    machine = results.machine_block(["NVIDIA H200"], "580", "2.11.0+cu130", "13.0")
    series = {
        "base": "vllm==0.33.0",
        "commit": "c0ffee",
        "tree": "7ree",
        "files": {"csrc/sm7x/k.cu": "1" * 40},
        "files_from": "SERIES_FILES packed with the tree (nox -s overlay -- --gpu)",
    }

    def doc(kind: str, **kw) -> dict:
        return results.document(
            kind,
            {},
            machine=machine,
            series=series,
            figures={},
            date=date,
            torch_pin=None,
            **kw,
        )

    tests = doc(
        "tests", test_files={"tests/t.py": {"passed": 3, "failed": 0, "skipped": 0, "errors": 0}}
    )
    t0 = 1_790_000_000.0
    line = lambda step, a, b, parts=(): json.dumps(  # noqa: E731
        {
            "step": step,
            "args": "",
            "start": t0 + a,
            "end": t0 + b,
            "rc": 0,
            "machine_start": t0,
            "parts": [
                {"part": p, "start": t0 + a, "end": t0 + b, "rc": 0, "cap_s": 60} for p in parts
            ],
        }
    )
    timeline = (
        "\n".join(
            [
                line("stage", 60, 70, ["stage-part1"]),
                line("stage", 80, 90),
                line("bench", 100, 400, ["build"]),
                line("batch", 400, 800),
                line("tests", 420, 810),
            ]
        )
        + "\n"
    )
    bench, rest = tmp_path / "call3", tmp_path / "call4"
    returned(
        bench,
        "bench",
        {
            "bench/bench_prefill_attention.json": doc("bench"),
            "bench/nvfp4_dequant.json": doc("bench"),
            "bench/timeline.jsonl": timeline.rsplit("\n", 3)[0] + "\n",
        },
    )
    returned(
        rest,
        "tests",
        {
            "batch/series_gpu_tests.json": tests,
            "batch/series_gpu_smoke.json": doc(
                "tests",
                test_files={"gpu/smoke.py": {"passed": 6, "failed": 0, "skipped": 0, "errors": 0}},
            ),
            "batch/serve_h200.json": doc("e2e"),
            "batch/timeline.jsonl": timeline,
            "tests/timeline.jsonl": timeline,
        },
    )
    return [bench, rest]


def _measured(root: Path) -> None:
    """A whole sitting with its parts, as gpu/evidence.sh's timeline has them."""
    (root / "results").mkdir(exist_ok=True)

    def parts(**seconds: float) -> list[dict]:
        return [
            {"part": k.replace("_", "-") if k.startswith("tests_") else k, "seconds": v}
            for k, v in seconds.items()
        ]

    (root / "results" / "sitting_034_h100_20261207.json").write_text(
        json.dumps(
            {
                "date": "2026-12-07T23:00:00Z",
                "start_s": 25.0,
                "calls": [
                    {"step": "stage", "seconds": 1.0, "parts": []},
                    {
                        "step": "bench",
                        "seconds": 226.0,
                        "parts": parts(
                            assemble=8.0,
                            build=14.0,
                            nvfp4_dequant=46.0,
                            bench_prefill_attention=19.0,
                            bench_prefill_crossover=38.0,
                            tests_alone=115.0,
                        ),
                    },
                    {"step": "batch", "seconds": 383.0, "parts": parts(smoke=124.0, tests=324.0)},
                    {"step": "tests", "seconds": 378.0, "parts": []},
                ],
            }
        )
    )


def test_the_plan_fits_the_device_time_left(load):
    root, gpu = load
    _measured(root)
    # The benchmarks less the first one's time beside the build; the batch
    # beyond its test files (the engines beside them).
    assert sitting.trim_savings(root) == {
        "NO_BENCH=1": ("bench", 46.0 + 19.0 + 38.0 - 14.0),
        "NO_ENGINES=1": ("tests", 383.0 - 324.0),
    }
    whole = 25.0 + 1.0 + 1.0 + 226.0 + 378.0 + sitting.WARM_S * 3 / 2

    def planned(budget: float | None) -> tuple[list[sitting.Call], str]:
        lines: list[str] = []
        calls = sitting.print_plan(root, gpu, log=lines.append, budget_s=budget)
        return calls, "\n".join(lines)

    calls, text = planned(None)
    assert all(not c.env for c in calls) and "where the device time allows" in text
    calls, text = planned(whole + 300.0)  # all of it, and the engine call after
    assert all(not c.env for c in calls) and "allows a last call" in text
    calls, text = planned(whole)
    assert all(not c.env for c in calls) and "no device time left for a last call" in text
    calls, text = planned(whole - 50.0)  # the benchmarks' 89 s are enough
    bench, tests = calls[-2], calls[-1]
    assert bench.command == "export OUT; NO_BENCH=1 bash gpu/evidence.sh bench part1-2"
    assert tests.command == "export OUT; bash gpu/evidence.sh tests"
    assert bench.expected_s == 226.0 - 89.0 and "left out" in text and "the benchmarks" in text
    calls, _ = planned(whole - 100.0)  # and the engines beside the tests (the batch inherits)
    assert calls[-2].env == ["NO_BENCH=1", "NO_ENGINES=1"] and calls[-1].env == ["NO_ENGINES=1"]
    assert calls[-1].expected_s == 378.0 - 59.0
    with pytest.raises(ToolkitError, match=r"needs 8.8 min .* without the benchmarks and the "):
        planned(whole - 200.0)
    script = (Path(__file__).resolve().parents[1] / "gpu" / "evidence.sh").read_text()
    for switch, _, _ in sitting.TRIMS:
        assert "${" + switch.split("=")[0] + ":-0}" in script


def test_collect_writes_each_results_file_the_logs_and_the_sitting(tmp_path):
    root = tmp_path / "repo"
    (root / "results").mkdir(parents=True)
    said: list[str] = []
    written = sitting.collect(root, sitting_files(tmp_path), held_s=870.0, log=said.append)
    names = sorted(p.name for p in written)
    assert names == [
        "bench_prefill_attention_033_h200_20261202.json",
        "nvfp4_dequant_033_h200_20261202.json",
        "series_gpu_smoke_033_h200_20261202.json",
        "series_gpu_tests_033_h200_20261202.json",
        "serve_033_h200_20261202.json",
        "sitting_033_h200_20261202.json",
    ]
    for p in written:
        assert not results.validate(json.loads(p.read_text())), p.name
    tests = json.loads((root / "results" / names[3]).read_text())
    assert tests["command"] == "gpu/evidence.sh batch" and "one sitting" in tests["purpose"]
    assert tests["series"]["commit"] == "c0ffee"
    sitting_doc = json.loads((root / "results" / names[5]).read_text())
    assert sitting_doc["kind"] == "sitting" and sitting_doc["one_machine"]
    # from the machine's start to the end of the last call
    assert sitting_doc["machine_s"] == pytest.approx(810.0)
    assert [c["step"] for c in sitting_doc["calls"]] == [
        "stage",
        "stage",
        "bench",
        "batch",
        "tests",
    ]
    assert sitting_doc["calls"][2]["parts"] == [
        {"part": "build", "rc": 0, "cap_s": 60, "seconds": 300.0}
    ]
    assert sitting_doc["figures"]["sitting.lease_held_s"]["value"] == 870.0
    raw = root / "results" / "raw" / "evidence_033_h200_20261202"
    assert sorted(p.name for p in raw.iterdir()) == [
        "evidence-bench.log",
        "evidence-bench.tgz",
        "evidence-tests.log",
        "evidence-tests.tgz",
    ]
    missing = next(s for s in said if "no results file came back for" in s)
    assert "series_gpu_tests_alone" in missing and "bench_prefill_crossover" in missing
    assert any("the head is None" in s for s in said)
    # A second sitting of the day writes over nothing: its files take _2,
    # unless told to replace the first's.
    before = {p: p.read_bytes() for p in (root / "results").glob("*.json")}
    again = sitting.collect(root, sitting_files(tmp_path / "again"), log=said.append)
    assert sorted(p.name for p in again) == sorted(
        n.replace("_20261202.json", "_20261202_2.json") for n in names
    )
    assert all(p.read_bytes() == b for p, b in before.items())
    replaced = sitting.collect(
        root, sitting_files(tmp_path / "third"), replace=True, log=said.append
    )
    assert sorted(p.name for p in replaced) == sorted(names)
    # The same calls collected again (another --held-s, say) replace their
    # own files: the third sitting's, found by its dates.
    first = {p: p.read_bytes() for p in replaced}
    late = sitting.collect(root, sitting_files(tmp_path / "late", date=LATE), log=said.append)
    assert all(p.name.endswith("_20261202_3.json") for p in late)
    redone = sitting.collect(
        root, sitting_files(tmp_path / "late2", date=LATE), replace=True, log=said.append
    )
    assert sorted(p.name for p in redone) == sorted(p.name for p in late)
    assert all(p.read_bytes() == b for p, b in first.items())


def test_collect_refuses_a_folder_without_returned_files(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ToolkitError, match="no evidence-STEP.tgz"):
        sitting.collect(tmp_path, [tmp_path / "empty"])


def test_parts_shrink_to_the_room_a_call_leaves() -> None:
    """The configured part and piece sizes are upper bounds: a working tree
    that grew (results added by every sitting) lowers them, so a part and
    the tree still fit one call."""
    g = recipe.gpu()
    assert recipe.fitted(g, 0) == g
    tree = 30 * 2**20
    small = recipe.fitted(g, tree)
    room = recipe.CALL_BYTES - recipe.MARGIN - tree
    assert small.part_bytes <= room and small.piece_bytes <= room
    # A piece leaves its part room for the piece's SOURCE file.
    assert small.part_bytes - small.piece_bytes == g.part_bytes - g.piece_bytes
    with pytest.raises(ToolkitError, match="too little room"):
        recipe.fitted(g, 60 * 2**20)
