"""The text of a pull request: the target tree's template, filled from evidence.

Each ``## Section`` of the template gets the blocks its name asks for
(:data:`SECTIONS`; 0.26.0's Purpose / Test Plan / Test Result and 0.33.0's
Overview / Claims / Validation / Details); everything else in the template
(comments, checklist) stays as it is. Every figure is a claim read from a
results file, printed with that file's machine label and its path in the file.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from serieskit.pr import claims
from serieskit.pr.coverage import line_coverage
from serieskit.pr.markdown import table
from serieskit.series import series
from serieskit.state import WORK

SECTIONS = {
    "purpose": ("overview", "stack", "details", "duplicates"),
    "test plan": ("test_plan",),
    "test result": ("claims", "test_results", "ab", "coverage", "contract"),
    "overview": ("overview", "stack"),
    "claims": ("claims",),
    "validation": ("test_plan", "test_results", "ab", "coverage"),
    "details": ("details", "contract", "duplicates"),
}


def hand_text(root: Path, path: str) -> dict[str, str]:
    """The group's hand-written file: its ``## Overview`` and ``## Details``."""
    text = (root / path).read_text() if (root / path).is_file() else ""
    parts = re.split(r"^## +(.+?)\s*$", text, flags=re.M)
    return {h.strip().lower(): t.strip() for h, t in zip(parts[1::2], parts[2::2], strict=True)}


def fill(template: str, blocks: dict[str, str]) -> str:
    """Insert the blocks under each ``## heading`` of the template."""
    lines = template.splitlines()
    out: list[str] = []
    for line in lines:
        out.append(line)
        m = re.match(r"^## +(.+?)\s*$", line)
        if m:
            names = SECTIONS.get(m.group(1).strip().lower(), ())
            text = "\n\n".join(blocks[n] for n in names if blocks.get(n))
            if text:
                out += ["", text, ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _stack(g, b, built, stacks, base_label: str) -> str:
    chain = stacks[g.name]
    lines = []
    if b.head is None:
        return "**Not built:** " + "; ".join(b.problems)
    own = "\n".join(f"- `{c[:12]}` {s}" for c, s in b.own)
    if len(chain) > 1:
        lower = chain[-2]
        below = ", ".join(f"{x.title} ({x.name})" for x in chain[:-1])
        lines.append(
            f"**Stacked PR.** This branch carries the commits of {below}, which must land "
            f"first (fork PRs cannot stack). Please review only the last {len(b.own)} "
            f"commit(s): `git log {(b.lower or '')[:12]}..{b.head[:12]}`, where "
            f"`{(b.lower or '')[:12]}` is the head of {lower.name}:\n\n{own}"
        )
    else:
        lines.append(f"On vLLM {base_label}; the commits to review:\n\n{own}")
    uppers = [n for n, c in stacks.items() if len(c) > 1 and c[-2].name == g.name]
    if uppers:
        lines.append(
            "Stacked on this one: "
            + ", ".join(f"{built[n].group.title} ({n})" for n in uppers)
            + "."
        )
    left = sorted({f for fs in b.left_out.values() for f in fs})
    if left:
        lines.append(
            "The hunks of "
            + ", ".join(f"`{f}`" for f in left)
            + " (the series' own generated reference and tooling, not part of upstream)"
            " are left out of these commits."
        )
    return "\n\n".join(lines)


def _claims(checked: list[claims.Checked]) -> str:
    if not checked:
        return ""
    rows = []
    for c in checked:
        value = claims.fmt(c.value, c.claim.unit) if c.ok or c.value is not None else "(missing)"
        where = f"`{c.claim.file}` `{c.claim.path}`"
        flag = "" if c.ok else " **(stale: see check.json)**"
        rows.append([c.claim.label, value + flag, c.label, where])
    text = table(["claim", "figure", "machine", "evidence (file, JSON path)"], rows)
    notes = sorted({f"`{p}`: {why}" for c in checked for p, why in c.accepted.items()})
    if notes:
        text += (
            "\n\nFiles changed since some of these runs, and why the figures still hold:\n"
            + "\n".join(f"- {n}" for n in notes)
        )
    return "Figures (each read from the results file named beside it):\n\n" + text


def _results(root: Path, base_label: str | None = None) -> list[tuple[str, dict]]:
    """The results files; with ``base_label``, only the runs of a series on
    that base (``series.base`` ``vllm==<base_label>``): a port's runs on
    another release are not evidence for this pull request's branch."""
    out = []
    for f in sorted((root / "results").glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError:
            continue
        if data.get("schema") != claims.SCHEMA:
            continue
        ran_on = (data.get("series") or {}).get("base")
        if base_label and ran_on not in (f"vllm=={base_label}", base_label):
            continue
        out.append((f"results/{f.name}", data))
    return out


def _test_files(root: Path, g) -> list[str]:
    files: list[str] = []
    for p in g.patches:
        entry = series.manifest_entry(root, p) or {}
        files += [t for t in entry.get("tests", []) if t not in files]
    return files


def _junit(root: Path, test_file: str) -> dict[str, int] | None:
    """CPU counts of one test file from `nox -s test`'s JUnit XML, if present."""
    folder = root / WORK / "test-results"
    for xml in folder.glob("*.xml") if folder.is_dir() else []:
        try:
            suites = ET.parse(xml).getroot()
        except ET.ParseError:
            continue
        for s in [suites] if suites.tag == "testsuite" else suites.iter("testsuite"):
            names = {tc.get("classname", "") for tc in s.iter("testcase")}
            stem = test_file[:-3].replace("/", ".")
            if any(n == stem or n.endswith(stem.split(".")[-1]) for n in names):
                t, f, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
                return {"passed": t - f - e - sk, "failed": f, "errors": e, "skipped": sk}
    return None


def _test_plan(root: Path, g, base_label: str) -> str:
    files = _test_files(root, g)
    lines = (
        [
            "CPU, as CI runs them (`nox -s test`: one pytest process per file, the patched "
            f"tree on vLLM {base_label}, torch CPU; GPU cases skip with their reason):",
            "",
            "```",
        ]
        + [f"python -m pytest {f}" for f in files]
        + ["```"]
    )
    runs: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for name, data in _results(root, base_label):
        hit = [f for f in data.get("test_files", {}) if f in files]
        if data["kind"] == "tests" and hit:
            cmds = data.get("commands") or (
                [data["command"]] if data.get("command") else [f"python -m pytest {f}" for f in hit]
            )
            runs.setdefault((data["machine"]["name"], tuple(cmds)), []).append(name)
    gpu = [
        f"{machine} ({', '.join(names)}):\n\n```\n" + "\n".join(cmds) + "\n```"
        for (machine, cmds), names in runs.items()
    ]
    if gpu:
        lines += [
            "",
            "On GPUs (no Turing or Volta GPU is available: sm_75 code runs on an H200 "
            "through compute_75 PTX; the no-P2P path on two H200 with "
            "`NCCL_P2P_DISABLE=1`):",
            "",
            "\n\n".join(gpu),
        ]
    lines += ["", "`pre-commit run --from-ref <base> --to-ref HEAD` on the changed files."]
    return "\n".join(lines)


def _test_results(root: Path, g, base_label: str | None = None) -> str:
    files = _test_files(root, g)
    rows = []
    for f in files:
        cpu = _junit(root, f)
        if cpu:
            rows.append(
                [
                    f"`{f}`",
                    "CPU (CI)",
                    str(cpu["passed"]),
                    str(cpu["failed"] + cpu["errors"]),
                    str(cpu["skipped"]),
                    "`.work/test-results` (nox -s test)",
                ]
            )
        for name, data in _results(root, base_label):
            c = data.get("test_files", {}).get(f)
            if data["kind"] == "tests" and c:
                commit = (data["series"].get("commit") or "?")[:12]
                rows.append(
                    [
                        f"`{f}`",
                        data["machine"]["name"],
                        str(c["passed"]),
                        str(c["failed"] + c["errors"]),
                        str(c["skipped"]),
                        f"`{name}` (series {commit}, {data['date']})",
                    ]
                )
    if not rows:
        return "No test results recorded for these files yet."
    return table(
        ["test file", "machine", "passed", "failed or errors", "skipped", "evidence"], rows
    )


def _numbers(x: object) -> list[float]:
    if isinstance(x, int | float) and not isinstance(x, bool):
        return [x]
    items = x.values() if isinstance(x, dict) else x if isinstance(x, list) else []
    return [n for i in items for n in _numbers(i)]


def _ab(root: Path, g) -> str:
    if not g.ab or not (root / g.ab).is_file():
        return ""
    data = json.loads((root / g.ab).read_text())
    s = data.get("summary", {})
    arms = s.get("arms", {})
    ref = arms.get("reference", {}).get("prefill_total_mean_s")
    rows = []
    for name, a in arms.items():
        peak_v = max(_numbers(a.get("peak_memory_mib")), default="")
        change = s.get("prefill_change_pct", {}).get(name)
        hidden = s.get("penalty_hidden_pct", {}).get(name)
        rows.append(
            [
                name,
                claims.fmt(a.get("prefill_total_mean_s"), "s"),
                "" if change is None else claims.fmt(change, "%"),
                "" if hidden is None else claims.fmt(hidden, "%"),
                claims.fmt(peak_v, "MiB") if peak_v != "" else "",
            ]
        )
    if "p2p_on_prefill_total_mean_s" in s:
        rows.append(
            [
                "P2P on, reference (ceiling)",
                claims.fmt(s["p2p_on_prefill_total_mean_s"], "s"),
                claims.fmt((s["p2p_on_prefill_total_mean_s"] / ref - 1) * 100, "%") if ref else "",
                "",
                "",
            ]
        )
    order = ", ".join(data.get("order", []))
    m = data["machine"]
    return (
        f"A/B ({m['label']}; `{g.ab}`, series {str(data['series'].get('commit'))[:12]}). "
        f"Prefill of all five prompts, mean of the boots; boot order: {order} "
        "(`warm:` boots are uncounted). Noise floor between the two reference boots: "
        f"{claims.fmt(s.get('noise_floor_pct'), '%')}.\n\n"
        + table(
            [
                "arm",
                "prefill, all five",
                "vs reference",
                "no-P2P penalty hidden",
                "peak memory per GPU (highest boot)",
            ],
            rows,
        )
    )


def _routes(root: Path, pattern: str) -> str:
    """In how many boots of the results files a route line matched ``pattern``."""
    seen = []
    for name, data in _results(root):
        boots = [b for b in data.get("boots", []) if isinstance(b, dict) and "route_lines" in b]
        if boots:
            hit = sum(any(re.search(pattern, line) for line in b["route_lines"]) for b in boots)
            if hit:
                seen.append(f"{hit} of {len(boots)} boots of `{name}` ({data['machine']['name']})")
    return "logged: " + ("; ".join(seen) if seen else f"no boot logged /{pattern}/")


def _coverage(g, coverage: str | None, root: Path | None = None) -> str:
    if not g.paths:
        return ""
    rows = [
        [
            r.get("path", ""),
            r.get("format", ""),
            r.get("conditions", ""),
            r.get("expected", ""),
            "; ".join(
                [f"{k}: {r[k]}" for k in ("source", "static", "executed", "measured") if r.get(k)]
                + ([_routes(root, r["route"])] if r.get("route") and root else [])
            ),
            r.get("unverified", ""),
        ]
        for r in g.paths
    ]
    text = "Path coverage:\n\n" + table(
        [
            "path",
            "format",
            "key conditions",
            "expected selection / fallback",
            "evidence (source / static / executed / measured)",
            "unverified scope",
        ],
        rows,
    )
    return text + ("\n\n" + coverage if coverage else "")


def _contract(root: Path, g, checked: list[claims.Checked]) -> str:
    c = g.contract
    if not c:
        return ""
    lines = ["Benchmark contract:", ""]
    for key, label in (
        ("defaults", "Default / opt-in"),
        ("switches", "Switches"),
        ("entry", "Entry"),
        ("overlays", "Overlays and native libraries"),
    ):
        if c.get(key):
            lines.append(f"- {label}: {c[key]}")
    commits = sorted({f"`{x.claim.file}`: series {x.commit[:12]}" for x in checked if x.commit})
    if commits:
        lines.append("- Commits measured: " + "; ".join(commits))
    if c.get("commands"):
        lines += ["- Commands:", "", "```"] + list(c["commands"]) + ["```"]
    return "\n".join(lines)


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
    base_label: str,
    coverage: str | None = None,
    base: str | None = None,
) -> str:
    hand = hand_text(root, g.text)
    blocks = {
        "overview": hand.get("overview", ""),
        "details": hand.get("details", ""),
        "stack": _stack(g, b, built, stacks, base_label),
        "duplicates": dup
        or (
            "**Not a duplicate:** not checked in this run (no `--others` folder of open PRs given)."
        ),
        "claims": _claims(checked),
        "test_plan": _test_plan(root, g, base_label),
        "test_results": _test_results(root, g, base_label),
        "ab": _ab(root, g),
        "coverage": _coverage(
            g,
            coverage
            if coverage is not None
            else (line_coverage(root, tree, b.lower or base, b.head) if b.head and base else None),
            root,
        ),
        "contract": _contract(root, g, checked),
    }
    return fill(template, blocks)
