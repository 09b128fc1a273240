"""What the toolkit's messages point at exists: every ``README: "Heading"``
(or ``docs/FILE.md: "Heading"``) names a heading of that file, every link
between the README and docs/ reaches a file and a heading that exist, and no
message prints a raw ``None`` where a value is missing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(REPO / "serieskit").rglob("*.py"), REPO / "noxfile.py"])
POINTER = re.compile(r"\b(README|docs/[\w./-]+\.md):( \"([^\"]+)\")?")


def _prose(path: Path) -> str:
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)  # not code comments


def headings(doc: str) -> set[str]:
    path = REPO / ("README.md" if doc == "README" else doc)
    if not path.is_file():
        return set()
    return {m.group(1).strip() for m in re.finditer(r"^#+ +(.+)$", _prose(path), re.M)}


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def links() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for m in LINK.finditer(_prose(page)):
            if not re.match(r"[a-z]+:", m.group(1)):  # not https: or mailto:
                found.append((str(page.relative_to(REPO)), m.group(1)))
    return found


@pytest.mark.parametrize(("page", "link"), links())
def test_each_link_between_the_pages_resolves(page, link):
    path, _, fragment = link.partition("#")
    target = ((REPO / page).parent / path).resolve() if path else REPO / page
    assert target.exists(), f"{page}: {link} names no file"
    if fragment:
        doc = str(target.relative_to(REPO))
        found = {anchor(h) for h in headings("README" if doc == "README.md" else doc)}
        assert fragment in found, f"{page}: {link}: {doc} has no heading with that anchor"


def test_the_anchors_are_githubs():
    assert anchor("The 0.26.0 line") == "the-0260-line"
    assert anchor("Ports: moving to the next release") == "ports-moving-to-the-next-release"
    assert anchor("The seed's Turing figures") == "the-seeds-turing-figures"


def pointers() -> list[tuple[str, str, str | None]]:
    found = []
    for path in SOURCES:
        for m in POINTER.finditer(path.read_text()):
            found.append((str(path.relative_to(REPO)), m.group(1), m.group(3)))
    return found


def test_the_toolkit_points_at_the_docs_somewhere():
    assert pointers(), "no message names a README heading: the pattern is wrong"


@pytest.mark.parametrize(("source", "doc", "heading"), pointers())
def test_each_pointer_names_an_existing_heading(source, doc, heading):
    assert heading is not None, f'{source}: write {doc}: "Heading", with the heading quoted'
    assert heading in headings(doc), f'{source}: {doc} has no heading "{heading}"'


def test_stale_and_wrong_claims_say_what_is_missing_not_none(tmp_path):
    """A claim on a file whose run recorded no blob for a path, a path gone
    at the head, a figure without a unit and a machine without a name: each
    problem says so in words."""
    import json

    from serieskit.pr import claims

    (tmp_path / "results").mkdir()
    doc = {
        "schema": claims.SCHEMA,
        "kind": "bench",
        "date": "2026-01-01",
        "machine": {"label": "H200 figure"},
        "series": {"commit": "c" * 40, "files": {"vllm/gone.py": "a" * 40}},
        "figures": {"copy": {"value": 1.5}},
    }
    (tmp_path / "results/r.json").write_text(json.dumps(doc))
    claim = claims.Claim("results/r.json", "figures.copy", "copy", "ms", "h200x2")
    checked = claims.check(tmp_path, claim, {"vllm/gone.py": {None}, "vllm/new.py": {"b" * 40}})
    text = "\n".join(checked.problems)
    assert len(checked.problems) == 4, text
    assert "None" not in text, text
    assert "vllm/gone.py was removed since (recorded aaaaaaaaaaaa, at the head: no file)" in text
    assert "vllm/new.py was not changed by the series that ran (recorded: no blob" in text
    assert "the figure has no unit, the claim says 'ms'" in text
    assert "the file names no machine, the claim says 'h200x2'" in text
    assert claims.fmt(None, "ms") == "(missing)"
