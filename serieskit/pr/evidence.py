"""The evidence of a pull request in words a reviewer reads without this repository.

Every figure is a claim read from a results file (:mod:`.claims`); here it is
printed with its machine, the vLLM release it ran on and how it was measured,
in words: a GPU that is not Turing or Volta is named so ("correctness and
relative speed on the H200, not Turing speed"), a figure from another base
carries its claim's ``prior`` words, and a figure measured before the last
change of the pull request's files says so. No results file, toolkit command
or toolkit path is named: the reviewer has only the vLLM tree.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from serieskit.checks.runner import RAN
from serieskit.pr import claims
from serieskit.pr.markdown import table
from serieskit.state import WORK

COUNT = {1: "one", 2: "two", 3: "three", 4: "four", 8: "eight"}
TURING = re.compile(r"Quadro RTX|RTX [68]000|\bT4\b|RTX 20[5-8]0|TITAN RTX", re.I)
VOLTA = re.compile(r"V100|TITAN V\b", re.I)
TIME = {"ms": 1.0, "s": 1.0, "us": 1.0}


def release(base: str) -> str:
    """``vllm==0.33.0`` -> ``vLLM 0.33.0``."""
    version = claims.version_of(base or "")
    return f"vLLM {version}" if version else (base or "an unrecorded base")


class Said:
    """The qualifiers a body has said: each is said once, where it first
    applies; later mentions of the same machine or prior run leave it out."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def once(self, text: str) -> bool:
        """Whether ``text`` is said here (the first time)."""
        new = text not in self.seen
        self.seen.add(text)
        return new


def machine_words(m: dict, said: Said | None = None) -> str:
    """The machine of a results file in words, with what its figures are
    (that qualifier once per body where ``said`` is given)."""
    gpu, n = str(m.get("gpu") or ""), int(m.get("gpus") or 1)
    name = re.fullmatch(r"(?:(\d+) x )?(.+)", str(m.get("name") or ""))
    if "gpu" not in m and name and "CPU" not in name.group(2):
        gpu, n = name.group(2), int(name.group(1) or 1)  # a file that names only its machine
    if not gpu:
        return "a machine without a GPU (compile output, nothing ran)"
    short = gpu.removeprefix("NVIDIA ")
    text = f"{COUNT.get(n, str(n))} {gpu}"
    p2p = str(m.get("p2p") or "")
    if "NCCL_P2P_DISABLE" in p2p:
        text += " with P2P disabled (`NCCL_P2P_DISABLE=1`)"
    elif p2p.startswith("none"):
        text += " on PCIe without peer access"
    if TURING.search(gpu):
        return text + ", Turing"
    if VOLTA.search(gpu):
        return text + ", Volta"
    if "compute_75 PTX" in str(m.get("label", "")):
        text += " running the sm_75 code through compute_75 PTX"
        what = f"correctness and relative speed on the {short}, not Turing speed"
    else:
        what = f"{short} results, not Turing or Volta ones"
    return f"{text}: {what}" if said is None or said.once(what) else text


def prior_words(prior: str, said: Said | None = None) -> str:
    """A claim's ``prior`` words, their closing parenthesis (what the earlier
    version lacked) once per body where ``said`` is given."""
    m = re.fullmatch(r"(.+?) (\(.+\))", prior)
    if m and said is not None and not said.once(m.group(2)):
        return m.group(1)
    return prior


def software(m: dict, base: str) -> str:
    torch = str(m.get("torch") or "").split("+")[0]
    return release(base) + (f", torch {torch}" if torch else "")


def measured_on(c: claims.Checked, said: Said | None = None) -> str:
    """Where and when a claim's figure was measured, in words."""
    parts = [machine_words(c.machine, said)]
    if c.other_base:
        parts.append(prior_words(c.claim.prior or "", said))
    else:
        parts.append(software(c.machine, c.base))
        if any(p.startswith("stale:") for p in c.problems):
            parts.append("an earlier revision of this change (to be re-run on this one)")
    parts.append(c.date[:10])
    return "; ".join(p for p in parts if p)


def _compare(c: claims.Checked) -> str:
    if c.vs_value is None:
        return ""
    text = f"; {c.claim.vs_label}: **{claims.fmt(c.vs_value, c.claim.unit)}**"
    a, b = c.value, c.vs_value
    if c.claim.unit in TIME and isinstance(a, int | float) and isinstance(b, int | float) and a > 0:
        text += f" ({b / a:.1f}x faster)" if a < b else f" ({a / b:.2f}x the time)"
    return text


def _value(c: claims.Checked) -> str:
    return claims.fmt(c.value, c.claim.unit)


def claims_block(checked: list[claims.Checked], hand: str = "", said: Said | None = None) -> str:
    """The headline figures first, as sentences; the others in a table; the
    files changed since a run with the reason the figure holds. A figure
    from the same run as the one before it says so instead of its machine."""
    parts = [hand] if hand else []
    heads = [c for c in checked if c.claim.headline]
    before = ""
    if heads:
        bullets = []
        for c in heads:
            where, how = measured_on(c), c.claim.how.rstrip(".")
            bullets.append(
                f"- {c.claim.label}: **{_value(c)}**{_compare(c)}."
                + (f" {how[:1].upper()}{how[1:]}." if how else "")
                + (" The same run." if where == before else f" On {measured_on(c, said)}.")
            )
            before = where
        parts.append("\n".join(bullets))
    rest = [c for c in checked if not c.claim.headline]
    if rest:
        rows = []
        for c in rest:
            where, vs = measured_on(c), ""
            if c.claim.vs:
                vs = f" ({c.claim.vs_label}: {claims.fmt(c.vs_value, c.claim.unit)})"
            same = "the same run as above" if where == before else measured_on(c, said)
            rows.append([c.claim.label, _value(c) + vs, same, c.claim.how])
            before = where
        parts.append(
            ("More figures:\n\n" if heads else "")
            + table(["figure", "value", "measured on", "how"], rows)
        )
    notes = sorted({f"`{p}`: {why}" for c in checked for p, why in c.accepted.items()})
    if notes:
        parts.append(
            "<details>\n<summary>Files of this pull request changed since a measurement, "
            "and why that cannot move its figures</summary>\n\n"
            + "\n".join(f"- {n}" for n in notes)
            + "\n\n</details>"
        )
    return "\n\n".join(parts)


# --- tests -------------------------------------------------------------------


def results_files(root: Path, base_label: str | None = None) -> list[tuple[str, dict]]:
    """The results files; with ``base_label``, only the runs on that release."""
    out = []
    for f in sorted((root / "results").glob("*.json")):
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError:
            continue
        if data.get("schema") != claims.SCHEMA:
            continue
        ran_on = claims.version_of(str((data.get("series") or {}).get("base") or ""))
        if base_label and ran_on != claims.version_of(base_label):
            continue
        out.append((f"results/{f.name}", data))
    return out


def junit(root: Path, test_file: str) -> tuple[dict[str, int], dict] | None:
    """CPU counts of one test file from the CPU test run's JUnit XML, if
    present, with the ``series`` block of the tree that run tested."""
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
                try:
                    ran = json.loads((folder / RAN).read_text())
                except (OSError, json.JSONDecodeError):
                    ran = {}  # a run before the series was recorded: of no known revision
                counts = {"passed": t - f - e - sk, "failed": f, "errors": e, "skipped": sk}
                return counts, ran
    return None


def revision(data: dict, blobs: dict[str, set[str | None]]) -> tuple[int, str]:
    """(files of the pull request changed since the run, the words for it)."""
    recorded = (data.get("series") or {}).get("files") or {}
    changed = [p for p, b in blobs.items() if recorded.get(p) not in b]
    if not changed:
        return 0, "this revision"
    return len(changed), (
        f"an earlier revision of this change ({len(changed)} of its {len(blobs)} files "
        "changed since)"
    )


def tests_block(
    root: Path,
    files: list[str],
    blobs: dict[str, set[str | None]],
    base_label: str,
    said: Said | None = None,
) -> tuple[str, str]:
    """The pull request's own test files, each once: (how to run them, per
    file the newest run on this base, this revision's first)."""
    if not files:
        return "", ""
    lines = [
        "Tests added or changed here (CPU in CI; their GPU cases skip with the reason "
        "where no suitable GPU is present):",
        "",
        "```",
        *[f"python -m pytest {f}" for f in files],
        "```",
    ]
    rows = []
    runs = [(n, d) for n, d in results_files(root, base_label) if d.get("kind") == "tests"]
    for f in files:
        if found := junit(root, f):
            cpu, tested = found
            rows.append(
                [
                    f"`{f}`",
                    f"CPU, {release(base_label)}",
                    str(cpu["passed"]),
                    str(cpu["failed"] + cpu["errors"]),
                    str(cpu["skipped"]),
                    revision({"series": tested}, blobs)[1],
                ]
            )
        hits = [(revision(d, blobs), d) for _, d in runs if f in d.get("test_files", {})]
        if not hits:
            continue
        newest = sorted(hits, key=lambda h: str(h[1].get("date", "")), reverse=True)
        (_, words), d = min(newest, key=lambda h: h[0][0])  # the newest of the least changed
        c = d["test_files"][f]
        ran = software(d["machine"], d["series"].get("base", ""))
        rows.append(
            [
                f"`{f}`",
                f"{machine_words(d['machine'], said)}; {ran}; {str(d.get('date', ''))[:10]}",
                str(c["passed"]),
                str(c["failed"] + c["errors"]),
                str(c["skipped"]),
                words,
            ]
        )
    head = ["test file", "where", "passed", "failed", "skipped", "code that ran"]
    return "\n".join(lines), (table(head, rows) if rows else "")


# --- end to end --------------------------------------------------------------


def _numbers(x: object) -> list[float]:
    if isinstance(x, int | float) and not isinstance(x, bool):
        return [x]
    items = x.values() if isinstance(x, dict) else x if isinstance(x, list) else []
    return [n for i in items for n in _numbers(i)]


def ab_block(
    root: Path, path: str | None, checked: list[claims.Checked], said: Said | None = None
) -> str:
    """The end-to-end A/B's arms, labelled with their machine and base (and
    the claims' ``prior`` words where it ran on another base)."""
    if not path or not (root / path).is_file():
        return ""
    data = json.loads((root / path).read_text())
    s = data.get("summary", {})
    arms = s.get("arms", {})
    ref = arms.get("reference", {}).get("prefill_total_mean_s")
    rows = []
    for name, a in arms.items():
        peak = max(_numbers(a.get("peak_memory_mib")), default=None)
        change = s.get("prefill_change_pct", {}).get(name)
        hidden = s.get("penalty_hidden_pct", {}).get(name)
        rows.append(
            [
                name,
                claims.fmt(a.get("prefill_total_mean_s"), "s"),
                "" if change is None else claims.fmt(change, "%"),
                "" if hidden is None else claims.fmt(hidden, "%"),
                "" if peak is None else claims.fmt(peak, "MiB"),
            ]
        )
    if "p2p_on_prefill_total_mean_s" in s:
        p2p = s["p2p_on_prefill_total_mean_s"]
        rows.append(
            [
                "P2P on, reference (ceiling)",
                claims.fmt(p2p, "s"),
                claims.fmt((p2p / ref - 1) * 100, "%") if ref else "",
                "",
                "",
            ]
        )
    of_file = [c for c in checked if c.claim.file == path]
    prior = next((c.claim.prior for c in of_file if c.other_base and c.claim.prior), None)
    when = (
        prior_words(prior, said)
        if prior
        else software(data["machine"], data["series"].get("base", ""))
    )
    order = ", ".join(data.get("order", []))
    machine = machine_words(data["machine"], said)
    return (
        f"End to end ({machine}; {when}; {str(data.get('date', ''))[:10]}): "
        f"prefill of every prompt, mean over the boots of each arm; boot order {order} "
        "(`warm:` boots are not counted). Noise floor between the two reference boots: "
        f"{claims.fmt(s.get('noise_floor_pct'), '%')}.\n\n"
        + table(
            [
                "arm",
                "prefill, all prompts",
                "vs reference",
                "no-P2P penalty hidden",
                "peak memory per GPU (highest boot)",
            ],
            rows,
        )
    )


def routes(root: Path, pattern: str, said: Said | None = None) -> str:
    """In how many server boots a route line matched ``pattern``."""
    seen = []
    for _, data in results_files(root):
        boots = [b for b in data.get("boots", []) if isinstance(b, dict) and "route_lines" in b]
        hit = sum(any(re.search(pattern, line) for line in b["route_lines"]) for b in boots)
        if hit:
            m = data["machine"]
            seen.append(
                f"{hit} of {len(boots)} server boots on {machine_words(m, said)} "
                f"({release(data['series'].get('base', ''))}, {str(data.get('date', ''))[:10]})"
            )
    return "route logged in " + ("; ".join(seen) if seen else "no server boot yet")
