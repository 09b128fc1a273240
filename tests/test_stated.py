"""Figures stated beside a cited results file must be in it (serieskit/checks/stated.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serieskit.checks import stated
from serieskit.errors import ToolkitError

DOC = {
    "kind": "bench",
    "rows": [{"m": 2048, "op_ms": 0.6671, "marlin_ms": 1.1243, "fraction": 0.5587}],
    "registers": 254,
    "figures": {
        "op": {"value": 0.6671, "unit": "ms"},
        "marlin": {"value": 1.1243, "unit": "ms"},
    },
}


def tree(tmp_path: Path, overview: str) -> Path:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "nvfp4_h100.json").write_text(json.dumps(DOC))
    pr = tmp_path / "reports" / "pr" / "nvfp4"
    pr.mkdir(parents=True)
    (pr / "overview.md").write_text(overview)
    return tmp_path


def test_figures_held_at_the_precision_written(tmp_path):
    root = tree(
        tmp_path,
        "The op takes 0.667 ms against Marlin's 1.124 ms at 2,048 tokens (1.69x), "
        "55.9 % of the ceiling (`results/nvfp4_h100.json`).\n",
    )
    assert stated.check(root, stated.pr_texts(root), cite=True) == []


@pytest.mark.parametrize(
    "claim, figure",
    [
        # A figure the code left behind: the bare path's time, not the op's.
        ("The op takes 0.558 ms (`results/nvfp4_h100.json`).", "0.558 ms"),
        # A crossover the file does not hold.
        ("No slower than Marlin from 128 tokens (`results/nvfp4_h100.json`).", "128 tokens"),
        # A ratio neither the claim's figures nor the file's give.
        ("The op is 2.10x faster (`results/nvfp4_h100.json`).", "2.10x"),
        # A compile's registers the file does not hold (the review's 255 for 254).
        ("The kernel fits in 255 registers (`results/nvfp4_h100.json`).", "255 registers"),
    ],
)
def test_a_figure_its_cited_file_does_not_hold_fails(tmp_path, claim, figure):
    root = tree(tmp_path, claim + "\n")
    found = stated.check(root, stated.pr_texts(root), cite=True)
    assert len(found) == 1 and f"`{figure}`" in found[0] and "nvfp4_h100.json" in found[0]


def test_a_measured_figure_without_a_citation_fails_in_pr_texts(tmp_path):
    root = tree(tmp_path, "Emulation is slower: 0.709 against 0.693 ms.\n")
    found = stated.check(root, stated.pr_texts(root), cite=True)
    assert len(found) == 1 and "without citing" in found[0]
    (root / "reports" / "pr" / "nvfp4" / "overview.md").write_text("It takes 254 registers.\n")
    assert "without citing" in stated.check(root, stated.pr_texts(root), cite=True)[0]
    (root / "reports" / "pr" / "nvfp4" / "overview.md").write_text(
        "Emulation is slower: 0.709 against 0.693 ms.\n"
    )
    # Inputs (tokens) need no citation; outside the PR texts none is asked.
    assert stated.check(root, stated.pr_texts(root), cite=False) == []
    (root / "reports" / "pr" / "nvfp4" / "overview.md").write_text("At 2,048 tokens.\n")
    assert stated.check(root, stated.pr_texts(root), cite=True) == []


def test_session_lists_every_problem(tmp_path):
    root = tree(tmp_path, "The op takes 0.558 ms (`results/nvfp4_h100.json`).\n")
    with pytest.raises(ToolkitError, match=r"overview.md:1: `0.558 ms`"):
        stated.session(root, log=lambda *a: None)


def test_a_path_contract_states_only_what_its_named_files_hold(tmp_path):
    # The manifest's path rows name their files apart (the body may not).
    root = tree(tmp_path, "")
    said = "sm_75 without spills: 254 registers at 2,048 tokens"
    assert stated.contract(root, said, ["results/nvfp4_h100.json"]) == []
    assert stated.contract(root, said.replace("254", "255"), ["results/nvfp4_h100.json"]) == [
        "`255 registers` is in none of nvfp4_h100.json"
    ]
    assert "without naming the results file" in stated.contract(root, said, [])[0]
    assert stated.contract(root, "at 2,048 tokens", []) == []  # inputs need no file
    assert "does not hold" in stated.contract(root, said, ["results/gone.json"])[0]
