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


@dataclass(frozen=True)
class Claim:
    file: str
    path: str
    label: str
    unit: str
    machine: str

    @classmethod
    def from_manifest(cls, entry: dict) -> Claim:
        missing = [k for k in ("file", "path", "label", "unit", "machine") if k not in entry]
        if missing:
            raise ValueError(f"claim {entry!r} lacks {', '.join(missing)}")
        return cls(entry["file"], entry["path"], entry["label"], entry["unit"], entry["machine"])


@dataclass
class Checked:
    claim: Claim
    value: object = None
    label: str = ""  # the file's machine label, e.g. "H200 figure ..."
    kind: str = ""
    commit: str | None = None
    problems: list[str] = field(default_factory=list)
    accepted: dict[str, str] = field(default_factory=dict)  # changed files named with a reason

    @property
    def ok(self) -> bool:
        return not self.problems


def check(
    root: Path,
    claim: Claim,
    head_blobs: dict[str, set[str | None]],
    changed_since: dict[str, dict[str, str]] | None = None,
) -> Checked:
    """Check one claim against the blobs of the PR's files now: the run's
    blob of each must be the PR head's or the series head's (a file other
    groups also change is the series' version in a run of the whole series)."""
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
    out.label = machine.get("label", machine.get("name", ""))
    out.commit = data["series"].get("commit")
    try:
        out.value = resolve(data, claim.path)
    except (KeyError, ValueError) as e:
        out.problems.append(f"{claim.file}: the path {claim.path} is missing ({e.args[0]})")
        return out
    if isinstance(out.value, dict) and "value" in out.value:
        unit = out.value.get("unit")
        if unit != claim.unit:
            has = "the figure has no unit" if unit is None else f"unit {unit!r}"
            out.problems.append(f"{claim.file} {claim.path}: {has}, the claim says {claim.unit!r}")
        out.value = out.value["value"]
    if (name := machine.get("name")) != claim.machine:
        has = "the file names no machine" if name is None else f"machine {name!r}"
        out.problems.append(f"{claim.file}: {has}, the claim says {claim.machine!r}")
    if data["kind"] == "external":
        return out
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
        text = f"{value:.2f}"
    else:
        text = f"{value:.3g}"
    if unit == "fraction":
        return f"{value * 100:.1f} %"
    return f"{text} {unit}" if unit not in ("%",) else f"{text} %"
