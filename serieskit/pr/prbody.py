"""The text of a pull request: the target tree's template, filled from evidence.

Each ``## Section`` of the template gets the blocks its name asks for
(:data:`SECTIONS`; 0.26.0's Purpose / Test Plan / Test Result and 0.33.0's
Overview / Claims / Validation / Details), after the section's own comment.
The template's instruction above the first section ("PLEASE FILL IN ...")
is dropped; the checklist and the statements only a person can make are
left to the contributor (:mod:`.bodycheck`).
The figures are claims read from results files, in words
(:mod:`.evidence`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from serieskit import git
from serieskit.pr import bodycheck, claims, evidence
from serieskit.pr.coverage import line_coverage
from serieskit.pr.markdown import table

SECTIONS = {
    "purpose": ("overview", "base", "stack", "details", "duplicates", "contributor"),
    "test plan": ("test_plan", "precommit"),
    "test result": ("claims", "test_results", "ab", "measured", "coverage"),
    "overview": ("overview", "base", "stack"),
    "claims": ("claims",),
    "validation": ("test_plan", "test_results", "precommit", "ab", "measured", "coverage"),
    "details": ("details", "duplicates", "contributor"),
}
HEADING = re.compile(r"^## +(.+?)\s*$", re.M)
RFC_LINES = 500  # vLLM's contributing guide: an RFC issue first above this


@dataclass
class Context:
    """What the body says beyond the group's own text, from the session."""

    base_label: str  # the release the branch targets, e.g. 0.33.0
    base: str | None = None  # its commit in the work tree
    on_main: str = ""  # whether it applies on upstream main, in words
    rfc_lines: int = 0  # changed lines outside kernels, config, tests and docs
    precommit: bool | None = None  # the tree's hooks on the changed files
    hooks: bool = True  # the tree has pre-commit hooks at all
    docs: bool = False  # the pull request adds or changes a docs/ page


def hand_text(root: Path, path: str) -> dict[str, str]:
    """The group's hand-written file: its ``## Overview``, ``## Claims``, ``## Details``."""
    text = (root / path).read_text() if (root / path).is_file() else ""
    # Its comments name the results files its figures are from, for
    # serieskit/checks/stated.py: evidence of the series, not of the PR.
    text = re.sub(r"[ \t]*<!--.*?-->", "", text, flags=re.S)
    parts = HEADING.split(text)
    return {h.strip().lower(): t.strip() for h, t in zip(parts[1::2], parts[2::2], strict=True)}


def fill(template: str, blocks: dict[str, str]) -> str:
    """Insert the blocks under each ``## heading`` of the template, after the
    section's comment; drop the instruction text above the first heading."""
    out: list[str] = []
    pending: str = ""
    seen_heading = False
    in_comment = False
    for line in template.splitlines():
        m = HEADING.match(line)
        if not seen_heading and not m:
            # the preamble: keep comments (markdownlint switches), drop instructions
            if line.strip().startswith("<!--") or in_comment or not line.strip():
                out.append(line)
                in_comment = (in_comment or "<!--" in line) and "-->" not in line
            continue
        if m:
            if pending:
                out += ["", pending, ""]
                pending = ""
            seen_heading = True
            out.append(line)
            names = SECTIONS.get(m.group(1).strip().lower(), ())
            pending = "\n\n".join(blocks[n] for n in names if blocks.get(n))
            continue
        if pending and not (line.strip().startswith("<!--") or not line.strip()):
            out += ["", pending, ""]
            pending = ""
        out.append(line)
    if pending:
        out += ["", pending]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).rstrip("\n") + "\n"


def _stack(g, b, built, stacks) -> str:
    chain = stacks[g.name]
    if b.head is None:
        return "**Not built:** " + "; ".join(b.problems)
    own = "\n".join(f"- `{c[:12]}` {s}" for c, s in b.own)
    lines = []
    if len(chain) > 1:
        lower = chain[-2]
        lines.append(
            f"**Stacked pull request.** This branch carries the commits of "
            f"{lower.title}, which has to land first (a pull request from a fork "
            f"cannot stack on another). Please review only the last {len(b.own)} "
            f"commit(s): `git log {(b.lower or '')[:12]}..{b.head[:12]}`, where "
            f"`{(b.lower or '')[:12]}` is that pull request's head:\n\n{own}"
        )
    else:
        lines.append(f"The commits to review:\n\n{own}")
    uppers = [n for n, c in stacks.items() if len(c) > 1 and c[-2].name == g.name]
    if uppers:
        lines.append(
            "Stacked on this one: " + "; ".join(built[n].group.title for n in uppers) + "."
        )
    return "\n\n".join(lines)


def _base(tree: Path, g, b, ctx: Context) -> str:
    """The release it targets, whether it applies on main, credit, RFC."""
    text = [f"Targets vLLM {ctx.base_label} (the `v{ctx.base_label}` release)."]
    text.append(ctx.on_main or "Not yet checked against upstream `main`.")
    if b.head:
        start = b.lower or ctx.base or ""
        authors = git.git(
            tree, "log", "--format=%(trailers:key=Co-authored-by,valueonly)", f"{start}..{b.head}"
        ).split("\n")
        who = sorted({a.strip() for a in authors if a.strip()})
        if who:
            origin = f"derives from {g.origin}" if g.origin else "derives from their work"
            text.append(
                f"The code {origin}; its commits credit "
                + ", ".join(f"`Co-authored-by: {w}`" for w in who)
                + "."
            )
    if ctx.rfc_lines > RFC_LINES:
        text.append(
            f"It changes {ctx.rfc_lines:,} lines outside kernels, config, tests and docs, more "
            f"than the contributing guide's {RFC_LINES}, so its design goes to an RFC issue "
            + (f"first: {g.rfc_issue}." if g.rfc_issue else "first, linked here once opened.")
        )
    return " ".join(text)


def _coverage(root: Path, g, coverage: str, said: evidence.Said) -> str:
    if not g.paths:
        return coverage
    rows = [
        [
            r.get("path", ""),
            r.get("format", ""),
            r.get("conditions", ""),
            r.get("expected", ""),
            "; ".join(
                [f"{k}: {r[k]}" for k in ("source", "static", "executed", "measured") if r.get(k)]
                + ([evidence.routes(root, r["route"], said)] if r.get("route") else [])
            ),
            r.get("unverified", ""),
        ]
        for r in g.paths
    ]
    text = (
        "<details>\n<summary>Which path runs where, and what is not verified</summary>\n\n"
        + table(
            [
                "path",
                "format",
                "key conditions",
                "expected selection / fallback",
                "evidence (source / static / executed / measured)",
                "not verified",
            ],
            rows,
        )
        + "\n\n</details>"
    )
    return text + ("\n\n" + coverage if coverage else "")


def _measured(g) -> str:
    """How the figures were measured and how to reproduce what the tree can run."""
    c = g.contract
    if not c:
        return ""
    lines = ["How it is switched and measured:", ""]
    for key, label in (
        ("defaults", "Default"),
        ("switches", "Switches"),
        ("entry", "What was measured"),
        ("overlays", "Build"),
    ):
        if c.get(key):
            lines.append(f"- {label}: {c[key]}")
    if c.get("commands"):
        lines += ["", "To reproduce in the vLLM tree:", "", "```", *c["commands"], "```"]
    return "\n".join(lines)


def _precommit(b, ctx: Context) -> str:
    if ctx.precommit is None or not b.head or not ctx.hooks:
        return ""
    start = f"{b.lower[:12]}" if b.lower else f"v{ctx.base_label}"
    state = "pass" if ctx.precommit else "do not pass yet"
    return (
        f"The tree's own pre-commit hooks {state} on the changed files "
        f"(`pre-commit run --from-ref {start} --to-ref HEAD`)."
    )


def render(
    root: Path,
    tree: Path,
    template: str,
    g,
    b,
    built,
    stacks,
    checked: list[claims.Checked],
    dup: str | None,
    ctx: Context,
    blobs: dict[str, set[str | None]],
    coverage: str | None = None,
) -> str:
    """The body; ``blobs``: the pull request's files -> their blobs at its head
    (and at the series head), to say which runs saw this revision."""
    hand = hand_text(root, g.text)
    start = b.lower or ctx.base
    files = (
        git.git(tree, "diff", "--name-only", "--diff-filter=AM", start, b.head).split()
        if b.head and start
        else []
    )
    tests = [f for f in files if f.startswith("tests/") and Path(f).name.startswith("test_")]
    said = evidence.Said()  # blocks in the order of the body: each qualifier said once
    claims_text = evidence.claims_block(checked, hand.get("claims", ""), said)
    plan, results = evidence.tests_block(root, tests, blobs, ctx.base_label, said)
    if coverage is None:
        coverage = line_coverage(root, tree, start, b.head) if b.head and start else ""
    blocks = {
        "overview": hand.get("overview", ""),
        "base": _base(tree, g, b, ctx),
        "stack": _stack(g, b, built, stacks),
        "details": hand.get("details", ""),
        "duplicates": dup or "",
        "claims": claims_text,
        "test_plan": plan,
        "test_results": results,
        "precommit": _precommit(b, ctx),
        "ab": evidence.ab_block(root, g.ab, checked, said),
        "measured": _measured(g),
        "coverage": _coverage(root, g, coverage, said),
        "contributor": bodycheck.contributor_block(),
    }
    return fill(template, blocks)
