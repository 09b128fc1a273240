"""Claims of a pull request: figures read from results files, never typed.

A claim is (file, JSON path, label, unit, machine): ``file`` is a results
file (``results/*.json``, schema ``vllm-series-results/1``, see
results/README.md), ``path`` where the figure is in it. A claim is good when
the file and the path exist, its unit is the figure's, its machine is the
file's, and the file's series is not older than the pull request's files:
every file the pull request changes has, at the pull request's head or at
the series head, the blob the run recorded (``series.files``), or the group
names it with the reason it does not matter for that file
(``changed_since``); which files changed is :func:`serieskit.results.changed_since`,
the rule the docs' figures follow too. ``external`` files (the seed's
figures) have no series tree and are labelled as theirs.

A figure from another base than the pull request's (a run on an older
release, or the original fork's measurement) is evidence only when the claim
says so in words: ``prior`` ("measured on vLLM 0.26.0 with the earlier
version of this change ..."), which must name that base's version; the
body prints it beside the figure. Without it such a claim fails, and
``prior`` on a run of the pull request's own base is refused (a change since
such a run is named in ``changed_since`` or re-run).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from serieskit import results
from serieskit.results import HEADER, SCHEMA  # noqa: F401 - one definition, results.py

_TOKEN = re.compile(r"""\.?([A-Za-z0-9_+\-]+)|\[(\d+)\]|\[(['"])(.*?)\3\]""")


def parse_path(path: str) -> list[str | int]:
    """``figures['a.b'].value`` -> ["figures", "a.b", "value"]; ``rows[2]`` -> index 2."""
    parts: list[str | int] = []
    pos = 0
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m or m.end() == pos:
            raise ValueError(f"cannot read the JSON path {path!r} at {path[pos:]!r}")
        name, index, _, quoted = m.groups()
        parts.append(int(index) if index is not None else (quoted if quoted is not None else name))
        pos = m.end()
    return parts


def resolve(data: object, path: str) -> object:
    """The value at ``path``; KeyError naming the first missing part."""
    node = data
    done: list[str] = []
    for part in parse_path(path):
        try:
            node = node[part]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            where = ".".join(done) or "the top level"
            raise KeyError(f"{part!r} is not in {where}") from None
        done.append(str(part))
    return node


def load(root: Path, file: str) -> dict:
    path = root / file
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{file} is not a {SCHEMA} results file (results/README.md)")
    missing = [k for k in HEADER if k not in data]
    if missing:
        raise ValueError(f"{file} lacks {', '.join(missing)}")
    return data


REQUIRED = ("file", "path", "label", "unit", "machine")
OPTIONAL = ("prior", "headline", "how", "vs", "vs_label")


@dataclass(frozen=True)
class Claim:
    file: str
    path: str
    label: str
    unit: str
    machine: str
    prior: str | None = None  # words: the other base (and version) it was measured on
    headline: bool = False  # one of the figures the body leads with
    how: str = ""  # how it was measured, in words (or a command in the vLLM tree)
    vs: str | None = None  # JSON path, in the same file, of the figure it is compared with
    vs_label: str = ""

    @classmethod
    def from_manifest(cls, entry: dict) -> Claim:
        missing = [k for k in REQUIRED if k not in entry]
        if missing:
            raise ValueError(f"claim {entry!r} lacks {', '.join(missing)}")
        unknown = sorted(set(entry) - set(REQUIRED) - set(OPTIONAL))
        if unknown:
            raise ValueError(f"claim {entry['label']!r} has unknown keys {', '.join(unknown)}")
        if entry.get("vs") and not entry.get("vs_label"):
            raise ValueError(f"claim {entry['label']!r}: vs needs vs_label")
        return cls(**{k: entry[k] for k in REQUIRED + OPTIONAL if k in entry})


@dataclass
class Checked:
    claim: Claim
    value: object = None
    label: str = ""  # the file's machine label, e.g. "H200 figure ..."
    kind: str = ""
    commit: str | None = None
    machine: dict = field(default_factory=dict)  # the file's machine block
    base: str = ""  # the file's series.base, e.g. "vllm==0.33.0"
    date: str = ""
    vs_value: object = None
    other_base: bool = False  # measured on another base than the pull request's
    problems: list[str] = field(default_factory=list)
    accepted: dict[str, str] = field(default_factory=dict)  # changed files named with a reason

    @property
    def ok(self) -> bool:
        return not self.problems


def version_of(base: str) -> str | None:
    """``vllm==0.26.0`` -> ``0.26.0``; None for a base that is no release."""
    m = re.fullmatch(r"(?:vllm==)?(\d+\.\d+[\w.+-]*)", base.strip())
    return m.group(1) if m else None


def check(
    root: Path,
    claim: Claim,
    head_blobs: dict[str, set[str | None]],
    changed_since: dict[str, dict[str, str]] | None = None,
    base_label: str | None = None,
) -> Checked:
    """Check one claim against the blobs of the PR's files now: the run's
    blob of each must be the PR head's or the series head's (a file other
    groups also change is the series' version in a run of the whole series).
    A run on another base than ``base_label`` (the pull request's release)
    needs the claim's ``prior`` words instead."""
    out = Checked(claim)
    if not (root / claim.file).is_file():
        out.problems.append(f"{claim.file} does not exist")
        return out
    try:
        data = load(root, claim.file)
    except (ValueError, json.JSONDecodeError) as e:
        out.problems.append(str(e))
        return out
    out.kind = data["kind"]
    machine = data["machine"]
    out.machine = machine
    out.label = machine.get("label", machine.get("name", ""))
    out.commit = data["series"].get("commit")
    out.base = str(data["series"].get("base") or "")
    out.date = str(data.get("date") or "")
    for path in [claim.path] + ([claim.vs] if claim.vs else []):
        try:
            value = resolve(data, path)
        except (KeyError, ValueError) as e:
            out.problems.append(f"{claim.file}: the path {path} is missing ({e.args[0]})")
            return out
        if isinstance(value, dict) and "value" in value:
            unit = value.get("unit")
            if unit != claim.unit:
                has = "the figure has no unit" if unit is None else f"unit {unit!r}"
                out.problems.append(f"{claim.file} {path}: {has}, the claim says {claim.unit!r}")
            value = value["value"]
        if path == claim.path:
            out.value = value
        else:
            out.vs_value = value
    if (name := machine.get("name")) != claim.machine:
        has = "the file names no machine" if name is None else f"machine {name!r}"
        out.problems.append(f"{claim.file}: {has}, the claim says {claim.machine!r}")
    ours = version_of(base_label or "")
    out.other_base = data["kind"] == "external" or (
        ours is not None and version_of(out.base) != ours
    )
    if out.other_base:
        out.problems += _prior_problems(claim, out.base, ours)
        return out
    if claim.prior:
        out.problems.append(
            f"{claim.file} ran on vLLM {ours}, the base of this pull request: prior labels "
            "a figure from another base only (name a file changed since the run in "
            "[pr.changed_since] with the reason the figure holds, or re-run it)"
        )
    recorded = data["series"].get("files") or {}
    accepted = (changed_since or {}).get(claim.file, {})
    for change in results.changed_since(recorded, head_blobs):
        if change.path in accepted:
            out.accepted[change.path] = accepted[change.path]
            continue
        ran_on = f"recorded {change.then[:12]}" if change.then else "recorded: no blob for it"
        at_head = f"head {change.now[:12]}" if change.now else "at the head: no file"
        out.problems.append(
            f"stale: {claim.file} ran on a series where {change.path} {change.what} "
            f"({ran_on}, {at_head})"
        )
    return out


def _prior_problems(claim: Claim, ran_on: str, ours: str | None) -> list[str]:
    """A figure from another base: the claim's ``prior`` words say so, naming
    the version it ran on (a release's, not a fork's)."""
    where = f"vLLM {version_of(ran_on)}" if version_of(ran_on) else ran_on or "another base"
    if not (claim.prior or "").strip():
        return [
            f"{claim.file} ran on {where}, not on vLLM {ours}: re-run it on {ours}, or label "
            'the figure as prior evidence in words (prior = "measured on ... with ...")'
        ]
    version = version_of(ran_on)
    if version and version not in (claim.prior or ""):
        return [f"{claim.file}: prior {claim.prior!r} does not name the base it ran on ({version})"]
    return []


def fmt(value: object, unit: str) -> str:
    """A figure as text: 3 significant decimals at most, thousands separated."""
    if value is None:
        return "(missing)"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{value} {unit}".strip()
    if isinstance(value, int) or float(value).is_integer():
        text = f"{int(value):,}"
    elif abs(value) >= 100:
        text = f"{value:,.1f}"
    elif abs(value) >= 1:
        text = f"{value:.2f}".rstrip("0").rstrip(".")
    else:
        text = f"{value:.3g}"
    if unit == "fraction":
        return f"{value * 100:.1f} %"
    return f"{text} {unit}" if unit not in ("%",) else f"{text} %"
