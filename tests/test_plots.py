"""bench/plots.py draws the committed no-P2P results files."""

from __future__ import annotations

import json

import pytest
from test_results import ROOT, committed, script


def test_plots_of_the_committed_files(tmp_path):
    pytest.importorskip("matplotlib")
    plots = script("bench/plots.py")
    written = plots.main(["--out", str(tmp_path)])
    assert [f.name for f in written] == ["host_reduce_h200x2.png", "e2e_prefill_h200x2.png"]
    for f in written:
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 10_000
    for f in ("host_reduce_h200x2.png", "e2e_prefill_h200x2.png"):  # what the README shows
        assert (ROOT / "docs" / "figures" / f).is_file()


def test_plotted_values_are_the_files():
    plots = script("bench/plots.py")
    bench = committed("bench_host_reduce_h200x2.json")
    lines = plots.allreduce_series(bench)
    assert set(lines) == {"nccl", "kernel_mode", "copy_engine_mode", "floor"}
    assert dict((b, ms) for b, ms, _ in lines["floor"])[8192000] == pytest.approx(0.2221, abs=1e-4)
    assert dict((b, ms) for b, ms, _ in lines["copy_engine_mode"])[20971520] == pytest.approx(
        bench["figures"]["allreduce_20971520B.copy_engine_mode_ms"]["value"]
    )
    bars = plots.prefill_bars(committed("e2e_seed16_h200x2.json"))
    assert list(bars["arms"])[0] == "reference"  # the file's first arm, whatever the key order
    assert bars["arms"]["overlap"]["change_pct"] == pytest.approx(-4.61, abs=0.01)
    assert bars["ceiling"] == pytest.approx(24.915, abs=1e-3) and bars["ideal"] is None
    assert plots.slug(bench) == "h200x2"


def test_host_issue_and_ideal_bound_are_drawn_where_measured(tmp_path):
    pytest.importorskip("matplotlib")
    plots = script("bench/plots.py")
    bench = committed("bench_host_reduce_h200x2.json")
    for row in bench["summary"]["per_size"]:
        row["copy_engine_host_issue_ms"] = 0.25
    assert "copy_engine_host" in plots.allreduce_series(bench)
    e2e = committed("e2e_seed16_h200x2.json")
    e2e["summary"]["ideal_overlap"] = {"ideal_saving_s": 3.0}
    assert plots.prefill_bars(e2e)["ideal"] == pytest.approx(27.2677 - 3.0, abs=1e-3)
    (tmp_path / "b.json").write_text(json.dumps(bench))
    (tmp_path / "e.json").write_text(json.dumps(e2e))
    assert (
        len(
            plots.main(
                [
                    "--bench",
                    str(tmp_path / "b.json"),
                    "--e2e",
                    str(tmp_path / "e.json"),
                    "--out",
                    str(tmp_path),
                ]
            )
        )
        == 2
    )


def test_prefill_title_names_tp_and_base():
    plots = script("bench/plots.py")
    e2e = committed("e2e_seed16_h200x2.json")
    assert plots.prefill_title(e2e) == (
        "End to end, TP=2, vLLM 0.26.0, H200 figure (2 x H200, P2P off): not a Turing figure"
    )
    assert plots.prefill_title(dict(e2e, tp=1)).startswith("End to end, TP=1, ")
