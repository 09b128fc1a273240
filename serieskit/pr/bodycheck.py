"""What a reviewer reads: the checks of a body that stands without this repository.

- the template's checklist: the items the body backs are ticked
  (:func:`tick`); the contributor's own declarations ("AI assistance was
  used", "I used ... skill") are theirs to answer and stay as they are;
  any other unticked item is a problem (a new template item nobody handled);
- no placeholder of the template left ("PLEASE FILL IN ...");
- none of this project's words ("seed", "series", "toolkit", "stale", a raw
  ``None``) outside code;
- every file path the body names exists in the pull request's tree (no
  results files, GPU-machine scripts or toolkit commands a reviewer cannot
  open).
"""

from __future__ import annotations

import re
from collections.abc import Callable

ITEM = re.compile(r"^(\s*[-*] )\[([ xX])\] (.*)$")

# Checklist items by what they ask -> the body's blocks (any of each tuple) that answer it.
BACKED: list[tuple[re.Pattern, tuple[tuple[str, ...], ...]]] = [
    (re.compile(r"purpose of the PR", re.I), (("overview",),)),
    (re.compile(r"test plan", re.I), (("test_plan",),)),
    (re.compile(r"test results", re.I), (("claims", "test_results"),)),
    (re.compile(r"documentation update", re.I), (("docs",),)),
    (re.compile(r"Design Fit", re.I), (("details",),)),
    (re.compile(r"Testing and Validation", re.I), (("test_plan",), ("claims", "test_results"))),
    (re.compile(r"Code Quality and Style", re.I), (("precommit_ok",),)),
    (re.compile(r"Pull Request Contents", re.I), (("overview",), ("claims",), ("details",))),
]
# The contributor's statements about how they worked: never answered for them.
DECLARATIONS = re.compile(r"\bI used\b|\bAI assistance\b|\bI (?:have|am|confirm)\b", re.I)
OPTIONAL = re.compile(r"^\(Optional\)", re.I)

PLACEHOLDERS = re.compile(r"PLEASE FILL IN|\bTODO\b|\bTBD\b|\bFIXME\b|<to be [a-z]+>")

JARGON = [
    (
        re.compile(r"(?<!random )\bseed(?:'s|s)?\b", re.I),
        "the original pull request in Peuqui's vLLM fork",
    ),
    (re.compile(r"\bseries\b", re.I), "this change / these commits"),
    (re.compile(r"\btoolkit\b", re.I), "(nothing: the reviewer has only the vLLM tree)"),
    (re.compile(r"\bthe pin\b|\bpinned (?:base|release)\b", re.I), "vLLM 0.33.0"),
    (re.compile(r"\bport(?:ed|s)?\b", re.I), "this change on vLLM X"),
    (re.compile(r"\bstale\b", re.I), "measured on an earlier revision / another base, in words"),
    (re.compile(r"check\.json|\bnox\b", re.I), "(a file or tool the reviewer does not have)"),
    (re.compile(r"\bNone\b"), "a value, or nothing (a raw None)"),
]
PATH = re.compile(
    r"(?<![\w/.:@-])((?:[\w.-]+/)+[\w.-]+\.(?:py|json|sh|md|cu|cuh|h|hpp|cpp|cmake|yaml|yml|toml|txt))\b"
)


def _answered(pattern_blocks: tuple[tuple[str, ...], ...], blocks: dict[str, str]) -> bool:
    return all(any(blocks.get(n) for n in group) for group in pattern_blocks)


def tick(body: str, blocks: dict[str, str]) -> str:
    """Tick the checklist items that the filled blocks answer."""
    out = []
    for line in body.splitlines():
        m = ITEM.match(line)
        if m and m.group(2) == " " and not DECLARATIONS.search(m.group(3)):
            need = next((b for p, b in BACKED if p.search(m.group(3))), None)
            if need is not None and _answered(need, blocks):
                line = f"{m.group(1)}[x] {m.group(3)}"
        out.append(line)
    return "\n".join(out) + ("\n" if body.endswith("\n") else "")


def declarations(body: str) -> list[str]:
    """The checklist's unticked statements the contributor answers."""
    return [
        m.group(3).strip()
        for m in map(ITEM.match, body.splitlines())
        if m and m.group(2) == " " and DECLARATIONS.search(m.group(3))
    ]


def unhandled(body: str) -> list[str]:
    """Unticked checklist items that are neither declarations nor optional."""
    return [
        f"checklist item not answered by the body: {m.group(3).strip()[:80]!r}"
        for m in map(ITEM.match, body.splitlines())
        if m
        and m.group(2) == " "
        and not DECLARATIONS.search(m.group(3))
        and not OPTIONAL.match(m.group(3).strip())
    ]


def prose(body: str) -> str:
    """The body without code (fenced blocks, inline spans) and HTML comments."""
    text = re.sub(r"^```.*?^```", "", body, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def placeholders(body: str) -> list[str]:
    return [
        f"template placeholder left: {line.strip()[:80]!r}"
        for line in prose(body).splitlines()
        if PLACEHOLDERS.search(line)
    ]


def jargon(body: str) -> list[str]:
    """Words of this project in the body's prose, with what to say instead."""
    problems = []
    for line in prose(body).splitlines():
        for pattern, instead in JARGON:
            if m := pattern.search(line):
                where = line.strip()[max(0, m.start() - 40) : m.end() + 40]
                problems.append(f"{m.group(0)!r} in {where!r}: say {instead}")
    return list(dict.fromkeys(problems))


def missing_paths(body: str, exists: Callable[[str], bool]) -> list[str]:
    """File paths the body names that are not in the pull request's tree."""
    named = dict.fromkeys(m.group(1) for m in PATH.finditer(body))
    return [
        f"the body names {p}, which is not in the pull request's tree"
        for p in named
        if not exists(p)
    ]
