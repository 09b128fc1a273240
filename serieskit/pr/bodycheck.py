"""What a reviewer reads: the checks of a body that stands without this repository.

- what only a person can vouch for (the checklist's boxes, the tests run
  locally, AI assistance, the duplicate search) is left to the contributor:
  nothing is ticked for them, and :func:`contributor_block` asks for the
  statements (:func:`left` says what is left);
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
from pathlib import Path

ITEM = re.compile(r"^(\s*[-*] )\[([ xX])\] (.*)$")

# What only the person opening the pull request can vouch for: never said for
# them. The body asks for each as a statement to fill in (vLLM's AGENTS.md
# asks AI-assisted work for the tests run, the duplicate search and a clear
# statement of AI assistance); the checklist's boxes stay unticked.
STATEMENTS = (
    ("Tests I ran locally", "the commands you ran and their results"),
    ("AI assistance", "whether AI assistance was used, and for what"),
    (
        "Not a duplicate",
        "why no open pull request or issue already does this, from your search of them",
    ),
)


def contributor_block() -> str:
    """The statements left to the contributor, after one line that says so."""
    lines = [
        "**Left to the contributor:** the checklist's boxes and these statements, "
        "which only the person opening this pull request can make:",
        "",
    ]
    lines += [f"- {label}: [contributor: {ask}]" for label, ask in STATEMENTS]
    return "\n".join(lines)


PLACEHOLDERS = re.compile(r"PLEASE FILL IN|\bTODO\b|\bTBD\b|\bFIXME\b|<to be [a-z]+>")

JARGON = [
    (
        re.compile(r"(?<!random )\bseed(?:'s|s)?\b", re.I),
        "the original pull request in Peuqui's vLLM fork",
    ),
    (re.compile(r"\bseries\b", re.I), "this change / these commits"),
    (re.compile(r"\btoolkit\b", re.I), "(nothing: the reviewer has only the vLLM tree)"),
    (re.compile(r"\bthe pin\b|\bpinned (?:base|release)\b", re.I), "vLLM X.Y.Z, the release"),
    (re.compile(r"\bport(?:ed|s)?\b", re.I), "this change on vLLM X"),
    (re.compile(r"\bstale\b", re.I), "measured on an earlier revision / another base, in words"),
    (re.compile(r"check\.json|\bnox\b", re.I), "(a file or tool the reviewer does not have)"),
    (re.compile(r"\bNone\b"), "a value, or nothing (a raw None)"),
]
PATH = re.compile(
    r"(?<![\w/.:@-])((?:[\w.-]+/)+[\w.-]+\.(?:py|json|sh|md|cu|cuh|h|hpp|cpp|cmake|yaml|yml|toml|txt))\b"
)


def left(body: str) -> str:
    """What the body leaves to the contributor, in one line."""
    boxes = sum(1 for m in map(ITEM.match, body.splitlines()) if m and m.group(2) == " ")
    said = [label for label, _ in STATEMENTS if f"- {label}: [contributor: " in body]
    return "; ".join(([f"the checklist's {boxes} boxes"] if boxes else []) + said) or "nothing"


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


# An RFC draft's count of the change: "changes 941 lines outside kernels, ...".
RFC_COUNT = re.compile(
    r"(?:adds|changes)\s+(?:about\s+)?(\d{1,3}(?:,\d{3})+|\d+)\s+lines\s+outside"
)


def rfc_count(path: Path, counted: int) -> list[str]:
    """An RFC draft that gives the change's size must give the one the pull
    request's commits have (``counted``: pr.rfc_lines), not a count kept by hand."""
    m = RFC_COUNT.search(path.read_text()) if path.is_file() else None
    said = int(m.group(1).replace(",", "")) if m else None
    if said is None or said == counted:
        return []
    return [f"{path.name} says the change has {said:,} lines outside them; it has {counted:,}"]
