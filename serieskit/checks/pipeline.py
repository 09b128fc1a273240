"""The CI pipeline: ci/pipeline.toml's stages run in order, each timed against its budget.

``nox -s ci`` (what ``.ci/run`` calls) hands this module its way to run a
command and to install a set of requirements; this module says which stage
runs, how long each took against its budget, and writes the durations to
``.work/ci/timings.json`` for the figures that quote them. A stage over its
budget is a warning; over ``fail_factor`` times its budget it fails CI, as
does a failing command (the summary is printed either way).
"""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from serieskit.errors import ToolkitError
from serieskit.state import WORK

PIPELINE = "ci/pipeline.toml"
TIMINGS = "ci/timings.json"  # under .work/
POSARGS = "{posargs}"


@dataclass(frozen=True)
class Stage:
    name: str
    about: str
    budget_s: float
    install: str | None
    run: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Pipeline:
    stages: tuple[Stage, ...]
    fail_factor: float


@dataclass
class Timing:
    stage: Stage
    seconds: float
    ok: bool  # its commands all passed

    @property
    def over(self) -> bool:
        return self.seconds > self.stage.budget_s


def load(root: Path, installs: Iterable[str]) -> Pipeline:
    """ci/pipeline.toml, checked: each stage has a name, an about line, a
    positive budget and something to do, with installs the session knows."""
    path = root / PIPELINE
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ToolkitError(f"{PIPELINE} is missing: it lists CI's stages") from None
    except tomllib.TOMLDecodeError as e:
        raise ToolkitError(f"{PIPELINE} is malformed: {e}") from None
    known = sorted(installs)
    stages = []
    for i, entry in enumerate(data.get("stage", []), 1):
        stages.append(_stage(entry, i, known))
    if not stages:
        raise ToolkitError(f"{PIPELINE} has no [[stage]]")
    names = [s.name for s in stages]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ToolkitError(f"{PIPELINE} names stage {twice[0]!r} twice")
    factor = data.get("budgets", {}).get("fail_factor", 3.0)
    if not isinstance(factor, int | float) or factor < 1:
        raise ToolkitError(f"{PIPELINE}: budgets.fail_factor is not a number of at least 1")
    return Pipeline(tuple(stages), float(factor))


def _stage(entry: dict, i: int, known: list[str]) -> Stage:
    where = f"{PIPELINE}: stage {i} ({entry.get('name', 'no name')})"
    for key, kind in (("name", str), ("about", str), ("budget_s", int | float)):
        if not isinstance(entry.get(key), kind):
            raise ToolkitError(f"{where} lacks {key}")
    if entry["budget_s"] <= 0:
        raise ToolkitError(f"{where}: budget_s is not positive")
    install, run = entry.get("install"), entry.get("run", [])
    if install is not None and install not in known:
        raise ToolkitError(
            f"{where} installs {install!r}, which the ci session does not know "
            f"(it knows {', '.join(known)})"
        )
    if not isinstance(run, list) or not all(
        isinstance(cmd, list) and cmd and all(isinstance(a, str) for a in cmd) for cmd in run
    ):
        raise ToolkitError(f"{where}: run is not a list of commands (lists of strings)")
    if install is None and not run:
        raise ToolkitError(f"{where} does nothing: give it install or run")
    return Stage(
        entry["name"],
        entry["about"],
        float(entry["budget_s"]),
        install,
        tuple(tuple(cmd) for cmd in run),
    )


def duration(seconds: float) -> str:
    """``41 s``, ``2 min 23 s``."""
    s = round(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s"


def run(
    root: Path,
    pipeline: Pipeline,
    *,
    command: Callable[..., object],
    install: Callable[[str], object],
    posargs: list[str],
    log: Callable[[str], object] = print,
    clock: Callable[[], float] = time.monotonic,
) -> list[Timing]:
    """Each stage in order: its install, then its commands (``command`` and
    ``install`` raise on failure, which stops the pipeline after the
    summary). Fails when a stage took more than ``fail_factor`` times its
    budget."""
    timings: list[Timing] = []
    n = len(pipeline.stages)
    try:
        for i, stage in enumerate(pipeline.stages, 1):
            budget = duration(stage.budget_s)
            log(f"ci: stage {i}/{n}, {stage.name} (budget {budget}): {stage.about}")
            start, ok = clock(), False
            try:
                if stage.install:
                    install(stage.install)
                for cmd in stage.run:
                    command(*_expand(cmd, posargs))
                ok = True
            finally:
                timing = Timing(stage, clock() - start, ok)
                timings.append(timing)
                log(_line(timing, pipeline.fail_factor))
    finally:
        _summary(root, timings, pipeline, log)
    slow = [t for t in timings if t.seconds > t.stage.budget_s * pipeline.fail_factor]
    if slow:
        raise ToolkitError(
            "ci: "
            + "; ".join(
                f"{t.stage.name} took {duration(t.seconds)}, over {pipeline.fail_factor:g} times "
                f"its budget of {duration(t.stage.budget_s)}"
                for t in slow
            )
            + f" ({PIPELINE})"
        )
    return timings


def _expand(cmd: tuple[str, ...], posargs: list[str]) -> list[str]:
    out: list[str] = []
    for arg in cmd:
        out += posargs if arg == POSARGS else [arg]
    return out


def _line(t: Timing, factor: float) -> str:
    took = f"ci: {t.stage.name} {'took' if t.ok else 'failed after'} {duration(t.seconds)}"
    if t.seconds > t.stage.budget_s * factor:
        return f"{took}, over {factor:g} times its budget of {duration(t.stage.budget_s)}"
    if t.over:
        return f"{took}, over its budget of {duration(t.stage.budget_s)} (warning)"
    return f"{took} (budget {duration(t.stage.budget_s)})"


def _summary(root: Path, timings: list[Timing], pipeline: Pipeline, log) -> None:
    """Every stage's duration, the ones that did not run included, and the
    timings file."""
    if not timings:
        return
    done = {t.stage.name: t for t in timings}
    width = max(len(s.name) for s in pipeline.stages)
    log("ci: stage durations (budgets: ci/pipeline.toml)")
    for s in pipeline.stages:
        t = done.get(s.name)
        if t is None:
            what = "not run"
        else:
            what = duration(t.seconds) + ("" if t.ok else ", failed") + (", over" if t.over else "")
        log(f"  {s.name:<{width}}  {what:<22} budget {duration(s.budget_s)}")
    total = sum(t.seconds for t in timings)
    log(f"  {'total':<{width}}  {duration(total)}")
    dest = root / WORK / TIMINGS
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(
        json.dumps(
            {
                "pipeline": PIPELINE,
                "complete": len(timings) == len(pipeline.stages) and all(t.ok for t in timings),
                "total_s": round(total, 1),
                "stages": [
                    {
                        "name": t.stage.name,
                        "seconds": round(t.seconds, 1),
                        "budget_s": t.stage.budget_s,
                        "ok": t.ok,
                    }
                    for t in timings
                ],
            },
            indent=2,
        )
        + "\n"
    )
    log(f"ci: durations written to {dest}")
