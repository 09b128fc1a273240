"""The versions the toolkit's pages state, checked against where each is decided.

A page that says which nox, pre-commit, git, Python, CUDA 12 NVRTC or torch
the project uses says what the data decides, or ``docs --check`` fails:

- ``nox==V``: ``.ci/run``, which installs it for CI;
- ``pre-commit==V``, ``pre-commit`` (V): ``PRE_COMMIT`` of ``noxfile.py``;
- ``git 2.20 or newer``: the floor ``serieskit/git.py`` enforces;
- ``Python 3.11 to 3.14``: the patched tree's ``requires-python``;
- ``CUDA 12.9 NVRTC``: the NVRTC package ``build/recipe.toml`` installs;
- ``torch X.Y.Z``: one the data names: the series' CPU tests' (``pin.toml``),
  the patched tree's own pin (``requirements/cuda.txt``), or a GPU machine's
  (a results file's ``machine.torch``). A line that names a vLLM release
  other than the pin speaks of an earlier line, and its torch is history;
- a vLLM release (the pin's, or a results file's base): the pin, or another
  release in a paragraph, list item or table row whose words say it is
  history ("earlier", "moved from", "before the move", "prior", ...) or under
  a heading that does: after a move, a page that still speaks of the old
  release as the present fails here.

The pages are those the names check reads as the toolkit's own: README.md,
docs/ and the top folders' README.md. Figures blocks are the figures
generator's, and checked by ``figures --check``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from serieskit.checks.evidence import Evidence, Run
from serieskit.checks.figures import claims, documents
from serieskit.errors import ToolkitError

BLOCK = re.compile(r"<!-- figures:([\w-]+) -->.*?<!-- /figures:\1 -->", re.S)


def pages(root: Path) -> list[Path]:
    """README.md, docs/ and the top folders' README.md."""
    tops = [p for p in sorted(root.glob("*/README.md")) if not p.parent.name.startswith(".")]
    return documents(root) + tops


def _found(pattern: str, path: Path, what: str) -> str:
    m = re.search(pattern, path.read_text()) if path.is_file() else None
    if not m:
        raise ToolkitError(f"facts: {path.name} names no {what}")
    return m.group(1)


def _python(tree: Path) -> str | None:
    """``requires-python = ">=3.11,<3.15"`` as ``3.11 to 3.14``."""
    path = tree / "pyproject.toml"
    if not path.is_file():
        return None
    spec = tomllib.loads(path.read_text()).get("project", {}).get("requires-python", "")
    low = re.search(r">=\s*3\.(\d+)", spec)
    high = re.search(r"<\s*3\.(\d+)", spec)
    if not (low and high):
        return None
    return f"3.{low.group(1)} to 3.{int(high.group(1)) - 1}"


def torches(root: Path, tree: Path, runs: list[Run]) -> set[str]:
    """The torch versions the data names."""
    out = {tomllib.loads((root / "pin.toml").read_text())["base"]["torch"]}
    cuda = tree / "requirements" / "cuda.txt"
    if cuda.is_file():
        out |= set(re.findall(r"^torch==([\w.+]+)", cuda.read_text(), re.M))
    return out | {str(r.machine["torch"]) for r in runs if r.machine.get("torch")}


def expected(root: Path, tree: Path) -> dict[str, str | None]:
    """Per fact, what the data says (None where the tree cannot tell)."""
    recipe = tomllib.loads((root / "build" / "recipe.toml").read_text())
    nvrtc = next(
        (
            p.split("==", 1)[1]
            for p in recipe.get("toolchain", {}).get("cuda12_nvrtc", {}).get("packages", [])
            if p.startswith("nvidia-cuda-nvrtc")
        ),
        None,
    )
    return {
        "nox": _found(r"nox==([\w.]+)", root / ".ci" / "run", "nox version"),
        "pre-commit": _found(
            r'PRE_COMMIT = "pre-commit==([\w.]+)"', root / "noxfile.py", "PRE_COMMIT"
        ),
        "git": _found(r"need git >= ([\d.]+)", root / "serieskit" / "git.py", "git floor"),
        "Python": _python(tree),
        "NVRTC": ".".join(nvrtc.split(".")[:2]) if nvrtc else None,
    }


# (fact, the pattern of its mention in a page; group 1 is the value)
MENTIONS = [
    ("nox", re.compile(r"\bnox==([\w.]+)")),
    ("pre-commit", re.compile(r"\bpre-commit==([\w.]+)|`pre-commit` \((\d[\w.]*)\)")),
    ("git", re.compile(r"\bgit ([\d.]+) or newer")),
    ("Python", re.compile(r"\bPython (3\.\d+ to 3\.\d+)")),
    ("NVRTC", re.compile(r"\bCUDA (12\.\d+) NVRTC")),
]
# A torch release, in a paragraph that speaks of torch (torch is 2.x).
TORCH = re.compile(r"(?<![\w.])(2\.\d+\.\d+(?:\+\w+)?)(?![\w+]|\.\w)")
RELEASE = re.compile(r"\b0\.\d+\.\d+\b")
VERSION = re.compile(r"(?<![\w.])(\d+\.\d+\.\d+)(?![\w]|\.\d)")
# Words that put a release in the past.
HISTORY = re.compile(
    r"earlier|moved from|before the move|prior|previous|older|last commit|history|"
    r"was the pin|last run",
    re.I,
)


def releases(runs: list[Run]) -> set[str]:
    """The vLLM releases the results files ran on (their bases)."""
    bases = (r.base or "" for r in runs)
    return {b.removeprefix("vllm==") for b in bases if b.startswith("vllm==")}


def _present_releases(page: str, known: set[str], pin: str) -> list[tuple[int, str]]:
    """(line, release) of each claim (paragraph, list item or table row,
    outside figures blocks and code) that names a release other than the pin
    without words that make it history, and stands under no heading that does."""
    headings = {}
    past = False
    for n, line in enumerate(page.split("\n"), 1):
        if line.startswith("#"):
            past = bool(HISTORY.search(line))
        headings[n] = past
    out = []
    for n, claim in claims(page):
        if headings.get(n) or HISTORY.search(claim):
            continue
        named = [v for v in dict.fromkeys(VERSION.findall(claim)) if v in known and v != pin]
        out += [(n, v) for v in named]
    return out


def _torch_paragraphs(lines: list[str]) -> set[int]:
    """The numbers (1-based) of the lines in a paragraph that names torch."""
    out: set[int] = set()
    start = 0
    for i in range(len(lines) + 1):
        if i == len(lines) or not lines[i].strip():
            if any("torch" in line for line in lines[start:i]):
                out |= set(range(start + 1, i + 1))
            start = i + 1
    return out


def problems(root: Path, tree: Path, pin: str) -> list[str]:
    """One line per version a page states that the data does not."""
    want = expected(root, tree)
    runs = Evidence(root).runs
    known = torches(root, tree, runs)
    known_releases = releases(runs) | {pin}
    out = []
    for page in pages(root):
        label = page.relative_to(root).as_posix()
        text = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text())
        lines = text.splitlines()
        torch_said = _torch_paragraphs(lines)
        for n, release in _present_releases(page.read_text(), known_releases, pin):
            out.append(
                f"{label}:{n}: vLLM {release} as if current (the pin is {pin}): say it is "
                'history ("earlier", "moved from", ...) or name the pin'
            )
        for n, line in enumerate(lines, 1):
            for fact, rx in MENTIONS:
                for m in rx.finditer(line):
                    said = next(g for g in m.groups() if g)
                    if want[fact] is not None and said != want[fact]:
                        out.append(f"{label}:{n}: {fact} {said}, where the data says {want[fact]}")
            if n not in torch_said or any(r != pin for r in RELEASE.findall(line)):
                continue  # no torch, or an earlier line's history
            for m in TORCH.finditer(line):
                if m.group(1) not in known:
                    out.append(
                        f"{label}:{n}: torch {m.group(1)}, which neither pin.toml, the tree's "
                        f"requirements nor a results file names ({', '.join(sorted(known))})"
                    )
    return out
