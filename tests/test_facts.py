"""The versions the pages state are the data's (serieskit/checks/facts.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from serieskit.checks import facts

REPO = Path(__file__).resolve().parent.parent


def _root(tmp_path: Path, page: str) -> tuple[Path, Path]:
    root, tree = tmp_path / "root", tmp_path / "tree"
    files = {
        root / ".ci" / "run": "python3 -m pip install -q nox==2026.10.20\n",
        root / "noxfile.py": 'PRE_COMMIT = "pre-commit==4.7.0"\n',
        root / "serieskit" / "git.py": 'raise E("git is not installed (need git >= 2.20)")\n',
        root / "build" / "recipe.toml": '[toolchain.cuda12_nvrtc]\npackages = ["nvidia-cuda-nvrtc'
        '-cu12==12.9.86", "nvidia-cuda-runtime-cu12==12.9.79"]\n',
        root / "pin.toml": '[base]\nversion = "0.34.0"\ntorch = "2.14.1"\n',
        root / "results" / "run.json": json.dumps({"machine": {"torch": "2.11.0+cu130"}}),
        root / "docs" / "page.md": page,
        root / "patches" / "series": "",
        root / "patches" / "manifest.toml": "",
        tree / "pyproject.toml": '[project]\nrequires-python = ">=3.11,<3.15"\n',
        tree / "requirements" / "cuda.txt": "torch==2.14.0\ntorchaudio==2.11.0\n",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root, tree


RIGHT = """\
Install `python3 -m pip install nox==2026.10.20`, Python 3.11 to 3.14, git 2.20 or newer.
`pre-commit==4.7.0`, or through `pre-commit` (4.7.0); sm_70 through a CUDA 12.9 NVRTC.

The tests' torch is **2.14.1**; vLLM pins torch==2.14.0,
the GPU machine's is 2.11.0+cu130.
"""


def test_the_pages_state_what_the_data_says(tmp_path):
    root, tree = _root(tmp_path, RIGHT)
    assert facts.problems(root, tree, "0.34.0") == []


def test_each_version_the_data_does_not_say_fails_with_its_line(tmp_path):
    page = (
        RIGHT.replace("nox==2026.10.20", "nox==2025.1.1")
        .replace("(4.7.0)", "(4.6.0)")
        .replace("3.11 to 3.14", "3.10 to 3.13")
        .replace("12.9 NVRTC", "12.8 NVRTC")
        .replace("git 2.20", "git 2.17")
        .replace("**2.14.1**", "**2.15.0**")
    )
    root, tree = _root(tmp_path, page)
    got = facts.problems(root, tree, "0.34.0")
    assert [g.split(",")[0] for g in got] == [
        "docs/page.md:1: nox 2025.1.1",
        "docs/page.md:1: git 2.17",
        "docs/page.md:1: Python 3.10 to 3.13",
        "docs/page.md:2: pre-commit 4.6.0",
        "docs/page.md:2: NVRTC 12.8",
        "docs/page.md:4: torch 2.15.0",
    ], got
    assert "where the data says 2026.10.20" in got[0]


def test_history_and_figures_blocks_are_not_checked(tmp_path):
    page = (
        "The 0.26.0 line's CI ran torch 2.13.0.\n\n"
        "<!-- figures:runs -->\ntorch 2.99.0\n<!-- /figures:runs -->\n\n"
        "A version of something else: 2.99.1.\n"
    )
    root, tree = _root(tmp_path, page)
    assert facts.problems(root, tree, "0.34.0") == []


def test_a_release_other_than_the_pin_is_history_or_fails(tmp_path):
    """After a move, a page that still speaks of the old release as the
    present fails; one that says it is history, or stands under a heading
    that does, passes."""
    page = (
        "The series runs on vLLM 0.33.0.\n\n"
        "The series moved from vLLM 0.33.0 to vLLM 0.34.0.\n\n"
        "## Earlier lines\n\nvLLM 0.26.0: its last commit.\n\n"
        "## Running it\n\nServe with 0.26.0, as ruff 0.14.0 checks.\n"
    )
    root, tree = _root(tmp_path, page)
    # The releases the data names: the pin and the results files' bases
    # (ruff's 0.14.0 is none of them).
    for name, base in (("old", "0.33.0"), ("older", "0.26.0")):
        (root / "results" / f"{name}.json").write_text(
            json.dumps({"series": {"base": f"vllm=={base}"}})
        )
    got = facts.problems(root, tree, "0.34.0")
    assert [g.split(" as if")[0] for g in got] == [
        "docs/page.md:1: vLLM 0.33.0",
        "docs/page.md:11: vLLM 0.26.0",
    ], got


def test_this_repository_states_the_data(tmp_path):
    # The patched tree decides Python's range and vLLM's torch: without it
    # (no applied tree here), only what the toolkit's own data decides.
    pin = tomllib.loads((REPO / "pin.toml").read_text())["base"]["version"]
    got = facts.problems(REPO, tmp_path, pin)
    tree_torch = "torch 2.14.0,"  # vLLM's own pin, read from the tree
    assert [g for g in got if tree_torch not in g] == []
