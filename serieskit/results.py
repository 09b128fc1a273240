"""Results files: the header every one starts with, made here for every writer.

The schema is ``vllm-series-results/1`` (results/README.md); the writers are
the GPU machine's (bench/, e2e/, gpu/run_tests.py) and the toolkit's (runner).
Its readers (the pull requests' claims, the docs' figures) ask
:func:`changed_since` which files changed since a run, from the blobs the
run recorded (``series.files``): one rule for both.

Only the standard library and the toolkit's modules that need no more
(``errors``, ``git``, ``state``) at import time: the GPU machine runs the
writers from a copy of this repository, with torch but without the
toolkit's own requirements. torch and nvidia-smi are asked where present.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from serieskit import files, git
from serieskit.state import WORK, State

SCHEMA = "vllm-series-results/1"
KINDS = ("tests", "bench", "e2e", "static", "external", "ci", "sitting", "timing")
HEADER = ("schema", "kind", "date", "machine", "series", "figures")
MACHINE_KEYS = ("name", "gpu", "gpus", "driver", "torch", "label")
SERIES_KEYS = ("base", "commit", "tree", "files")
# What the overlay packer stamps into the GPU machine's tree (serieskit.build.overlay).
STAMPS = {
    "commit": "SERIES_COMMIT",
    "tree": "SERIES_TREE",
    "base": "BASE_VERSION",
    "files": "SERIES_FILES",
}
TURING_OR_VOLTA = ((7, 0), (7, 2), (7, 5))
_DATE = re.compile(r"^\d{4}-\d\d-\d\d(T\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?)?$")


def now() -> str:
    """UTC, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def figure(value: object, unit: str, label: str, source: str) -> dict:
    """One headline figure; ``source`` is where in the file the value is."""
    return {"value": value, "unit": unit, "label": label, "from": source}


# --- the machine ---------------------------------------------------------------


def p2p_from_env() -> str:
    return "off (NCCL_P2P_DISABLE=1)" if os.environ.get("NCCL_P2P_DISABLE") == "1" else "on"


def label(
    gpu: str | None,
    gpus: int,
    p2p: str | None = None,
    capability: tuple[int, int] | None = None,
    detail: str | None = None,
) -> str:
    """How a figure of this machine is named in text."""
    if not gpu:
        return "CPU run (no GPU)"
    short = gpu.removeprefix("NVIDIA ").removeprefix("Tesla ")
    where = ", ".join(
        x
        for x in (
            f"{gpus} x {short}" if gpus > 1 else short,
            "P2P off" if p2p and p2p.startswith("off") else None,
            detail,
        )
        if x
    )
    if capability in TURING_OR_VOLTA:
        return f"Turing / Volta figure ({where})"
    return f"{short} figure ({where}): not a Turing figure"


def machine_block(
    gpus: list[str],
    driver: str | None,
    torch_version: str | None,
    cuda: str | None,
    p2p: str | None = None,
    kind: str | None = None,
    capability: tuple[int, int] | None = None,
    detail: str | None = None,
) -> dict:
    """The ``machine`` header from what a run recorded (pure: no probing)."""
    gpu = gpus[0] if gpus else None
    n = len(gpus)
    out = {
        "name": (f"{n} x {gpu}" if n > 1 else gpu) if gpu else "CPU",
        "kind": kind or os.environ.get("SERIES_MACHINE_KIND"),
        "gpu": gpu,
        "gpus": n,
        "driver": driver,
        "torch": torch_version,
        "cuda": cuda,
    }
    if n > 1 and p2p:
        out["p2p"] = p2p
    out["label"] = label(gpu, n, p2p if n > 1 else None, capability, detail)
    return out


def probe() -> dict:
    """GPUs, capability, torch and CUDA of this machine (torch where
    importable), and the driver (nvidia-smi where installed)."""
    info: dict = {"gpus": [], "torch": None, "cuda": None, "capability": None, "driver": None}
    try:
        import torch

        info["torch"], info["cuda"] = torch.__version__, torch.version.cuda
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["capability"] = tuple(torch.cuda.get_device_capability(0))
    except ImportError:
        pass
    try:
        smi = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            .stdout.strip()
            .splitlines()
        )
    except (OSError, subprocess.TimeoutExpired):
        smi = []
    if smi:
        info["driver"] = smi[0].split(",")[-1].strip() or None
        info["gpus"] = info["gpus"] or [line.split(",")[0].strip() for line in smi]
    return info


def machine(p2p: str | None = None, detail: str | None = None) -> dict:
    """The ``machine`` header of this machine; ``p2p`` defaults to the
    environment's NCCL_P2P_DISABLE (it matters with two GPUs or more)."""
    info = probe()
    return machine_block(
        info["gpus"],
        info["driver"],
        info["torch"],
        info["cuda"],
        p2p or p2p_from_env(),
        capability=info["capability"],
        detail=detail,
    )


# --- the series ----------------------------------------------------------------


def unrecorded(note: str) -> dict:
    return {
        "base": None,
        "commit": None,
        "tree": None,
        "files": {},
        "files_from": None,
        "note": note,
    }


def stamps_folder(paths: list[str] | None = None) -> Path | None:
    """The first PYTHONPATH / sys.path folder with the packer's stamps
    (``/tmp/vllm-run/src`` on the GPU machine)."""
    if paths is None:
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path
    for p in paths:
        if p and (Path(p) / STAMPS["commit"]).is_file():
            return Path(p)
    return None


def series_from_stamps(folder: Path) -> dict:
    """The ``series`` header from the stamps of an assembled tree."""

    def read(key: str) -> str | None:
        f = folder / STAMPS[key]
        text = f.read_text().strip() if f.is_file() else ""
        return None if text in ("", "?") else text

    files = json.loads(read("files") or "{}")
    base = read("base")
    return {
        "base": f"vllm=={base}" if base else None,
        "commit": read("commit"),
        "tree": read("tree"),
        "files": files,
        "files_from": (
            f"{STAMPS['files']} packed with the tree (nox -s overlay -- --gpu)" if files else None
        ),
    }


def series_block(tree: Path, base_commit: str, commit: str, base_version: str) -> dict:
    """The ``series`` header of a run of ``commit`` in the work tree: its tree and
    the blob of every file the series changes (for the GPU machine's writers)."""
    changed = git.git(tree, "diff", "--name-only", base_commit, commit).split()
    listing = git.git(tree, "ls-tree", "-r", commit, "--", *changed) if changed else ""
    files = {line.split("\t", 1)[1]: line.split()[2] for line in listing.splitlines()}
    return {
        "base": f"vllm=={base_version}",
        "commit": commit,
        "tree": git.git(tree, "rev-parse", f"{commit}^{{tree}}").strip(),
        "files": dict(sorted(files.items())),
        "files_from": f"git ls-tree of {commit[:12]} in the work tree",
    }


def series_from_work_tree(root: Path) -> dict:
    """The ``series`` header of the toolkit's applied tree at its HEAD."""
    state = State.load(root)
    tree = root / WORK / "vllm"
    head = git.rev(tree, "HEAD") if (tree / ".git").exists() else None
    if not (state.base and head):
        return unrecorded(f"no applied series in {tree}")
    return series_block(tree, state.base, head, state.base_label or "?")


def current_series(root: Path | None = None) -> dict:
    """Stamps where the writer runs on an assembled tree, else ``root``'s
    work tree, else a block that says it was not recorded."""
    if folder := stamps_folder():
        return series_from_stamps(folder)
    if root is not None and (root / "serieskit").is_dir():
        return series_from_work_tree(root)
    return unrecorded("no stamps on PYTHONPATH and no work tree")


@dataclass(frozen=True)
class Change:
    """A file whose blob now is not the one a run recorded."""

    path: str
    then: str | None  # the run's blob; None: the series that ran did not change the file
    now: str | None  # its blob now; None: no such file now

    @property
    def what(self) -> str:
        if self.then is None:
            return "was not changed by the series that ran"
        return "was removed since" if self.now is None else "changed since the run"


def changed_since(
    recorded: Mapping[str, str], now: Mapping[str, Collection[str | None]]
) -> list[Change]:
    """The files of ``now`` whose blob the run did not record, by path.

    ``recorded`` is a run's ``series.files`` (path -> blob of every file the
    series changed, as run); ``now`` maps each file to ask about to the
    blobs it may have now (a pull request's head and the series head; None
    where the file does not exist there). A file that the run's series did
    not change and that exists nowhere now is no change."""
    out = []
    for path, blobs in sorted(now.items()):
        then = recorded.get(path)
        if then in blobs:
            continue
        out.append(Change(path, then, sorted(b or "" for b in blobs)[-1] or None))
    return out


# --- torch: the base's pin against the torch that ran -------------------------------

_TORCH_REQ = re.compile(r"^torch\s*==\s*([0-9][^\s;,]*)")


def pinned_torch(base_version: str, folders: list[Path] | None = None) -> str | None:
    """The torch release vLLM ``base_version`` pins: from the installed vLLM's
    metadata where it is that release (the GPU machine assembles the released
    wheel's dist-info beside the tree), else from ``requirements/cuda.txt`` of
    the stamped tree (or ``folders``); None where neither says."""
    from importlib import metadata

    try:
        dist = metadata.distribution("vllm")
        lines = (dist.requires or []) if dist.version == base_version else []
    except metadata.PackageNotFoundError:
        lines = []
    if folders is None:
        folders = [f for f in (stamps_folder(),) if f is not None]
    for f in folders:
        req = f / "requirements" / "cuda.txt"
        if req.is_file():
            lines += req.read_text().splitlines()
    for line in lines:
        if m := _TORCH_REQ.match(line.strip()):
            return m.group(1)
    return None


def torch_note(series: Mapping, machine: Mapping, pinned: str | None) -> str | None:
    """What a results file says of its torch: the base's pin against the torch
    that ran (the GPU machine's image has its own torch, not the pin's).
    None where the run recorded no base or no torch (a CPU-only writer)."""
    base = (series.get("base") or "").removeprefix("vllm==")
    ran = machine.get("torch")
    if not base or not ran:
        return None
    pin = f"pins torch {pinned}" if pinned else "has a torch pin this run could not read"
    where = "the GPU machine's" if machine.get("gpu") else "this machine's"
    return f"vLLM {base} {pin}; ran on {where} torch {ran}"


# --- the document ----------------------------------------------------------------

_LOOK_UP = object()


def document(
    kind: str,
    body: dict,
    *,
    machine: dict,
    series: dict,
    figures: dict,
    date: str | None = None,
    test_files: dict | None = None,
    torch_pin: str | None | object = _LOOK_UP,
) -> dict:
    """The header, then what the run wrote (a header key in ``body`` is kept
    as ``original_<key>``). The header's ``torch_note`` names the base's
    torch pin (``torch_pin``; by default looked up with :func:`pinned_torch`)
    beside the torch that ran."""
    head: dict[str, object] = {
        "schema": SCHEMA,
        "kind": kind,
        "date": date or now(),
        "machine": machine,
        "series": series,
        "figures": figures,
    }
    if test_files is not None:
        head["test_files"] = test_files
    base = (series.get("base") or "").removeprefix("vllm==")
    if base and machine.get("torch"):
        pin = pinned_torch(base) if torch_pin is _LOOK_UP else torch_pin
        head["torch_note"] = torch_note(series, machine, pin if isinstance(pin, str) else None)
    rest = {(f"original_{k}" if k in head else k): v for k, v in body.items()}
    return {**head, **rest}


def whole_sitting(doc: Mapping) -> bool:
    """A sitting's document that reached its `tests` call (``nox -s
    evidence``), not a step of one run again."""
    return any(isinstance(c, dict) and c.get("step") == "tests" for c in doc.get("calls") or [])


def write(path: Path, doc: dict) -> None:
    problems = validate(doc)
    if problems:
        raise ValueError(f"{path}: not a {SCHEMA} document: " + "; ".join(problems))
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write(path, json.dumps(doc, indent=2) + "\n")


def validate(data: object) -> list[str]:
    """What keeps ``data`` from being a results file of the schema."""
    if not isinstance(data, dict):
        return ["not a JSON object"]
    out = [f"lacks {k}" for k in HEADER if k not in data]
    if out:
        return out
    if data["schema"] != SCHEMA:
        out.append(f"schema {data['schema']!r}")
    if data["kind"] not in KINDS:
        out.append(f"kind {data['kind']!r} is none of {', '.join(KINDS)}")
    if not isinstance(data["date"], str) or not _DATE.match(data["date"]):
        out.append(f"date {data['date']!r} is not ISO 8601")
    m, s = data["machine"], data["series"]
    external = data["kind"] == "external"
    wanted = ("name", "label") if external else MACHINE_KEYS
    out += [f"machine lacks {k}" for k in wanted if not isinstance(m, dict) or k not in m]
    if isinstance(m, dict) and not (m.get("name") and m.get("label")):
        out.append("machine has no name or label")
    out += [f"series lacks {k}" for k in SERIES_KEYS if not isinstance(s, dict) or k not in s]
    if not external and isinstance(s, dict) and "files_from" not in s:
        out.append("series lacks files_from")
    figs = data["figures"]
    if not isinstance(figs, dict):
        out.append("figures is not an object")
    else:
        out += [
            f"figure {n!r} lacks {k}"
            for n, f in figs.items()
            for k in ("value", "unit", "label")
            if not isinstance(f, dict) or k not in f
        ]
    if data["kind"] == "tests":
        tf = data.get("test_files")
        if not isinstance(tf, dict) or not tf:
            out.append("kind tests without test_files")
        else:
            out += [
                f"test_files[{f!r}] lacks {k}"
                for f, c in tf.items()
                for k in ("passed", "failed", "skipped", "errors")
                if k not in c
            ]
    return out
