"""The CI pipeline: ci/pipeline.toml's stages run in order, each timed against its budget.

``nox -s ci`` (what ``.ci/run`` calls) hands this module its way to run a
command and to install a set of requirements; this module says which stage
runs, how long each took against its budget, and writes the durations to
``.work/ci/timings.json`` for the figures that quote them (the README's):
every stage of the pipeline in its order, with the same keys on every run
(a stage that did not run has ``seconds`` null), the machine's cores and
load, and the README's main command as the sum of the stages it consists
of (``[main_command]``). A stage over its budget is a warning; over
``fail_factor`` times its budget it fails CI, as does a failing command
(the summary is printed either way).

A stage may name its ``scratch``: paths it writes that no later stage
reads (the wheel it checked, the lint's checkout, the tests' bytecode).
Once the stage has passed, each one that was not there when the run began
(so never a user's, nor what an earlier command left) is removed, in one log
line with its size, so that a clean machine holds what CI needs and no more.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from serieskit import git
from serieskit.errors import ToolkitError
from serieskit.state import WORK

PIPELINE = "ci/pipeline.toml"
TIMINGS = "ci/timings.json"  # under .work/
TIMINGS_SCHEMA = 2  # raised when a key of timings.json changes meaning
POSARGS = "{posargs}"


@dataclass(frozen=True)
class Stage:
    name: str
    about: str
    budget_s: float
    install: str | None
    run: tuple[tuple[str, ...], ...]
    scratch: tuple[str, ...] = ()  # removed once the stage passed, when this run made them


@dataclass(frozen=True)
class MainCommand:
    """The README's main command and the stages of the pipeline it consists of."""

    command: str
    stages: tuple[str, ...]


@dataclass(frozen=True)
class Pipeline:
    stages: tuple[Stage, ...]
    fail_factor: float
    main: MainCommand | None = None


@dataclass
class Timing:
    stage: Stage
    seconds: float
    ok: bool  # its commands all passed
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)  # load average at its end

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
    return Pipeline(tuple(stages), float(factor), _main_command(data, names))


def _main_command(data: dict, names: list[str]) -> MainCommand | None:
    main = data.get("main_command")
    if main is None:
        return None
    command, stages = main.get("command"), main.get("stages")
    if not isinstance(command, str) or not (
        isinstance(stages, list) and stages and all(isinstance(n, str) for n in stages)
    ):
        raise ToolkitError(f"{PIPELINE}: [main_command] needs command and a list of stages")
    if unknown := [n for n in stages if n not in names]:
        raise ToolkitError(f"{PIPELINE}: [main_command] names no stage {unknown[0]!r}")
    return MainCommand(command, tuple(stages))


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
    scratch = entry.get("scratch", [])
    if not isinstance(scratch, list) or not all(_inside_work(p) for p in scratch):
        raise ToolkitError(f"{where}: scratch is not a list of paths under {WORK}/")
    return Stage(
        entry["name"],
        entry["about"],
        float(entry["budget_s"]),
        install,
        tuple(tuple(cmd) for cmd in run),
        tuple(scratch),
    )


def _inside_work(path: object) -> bool:
    """A relative path under .work/ (the toolkit's own folder), not .work itself."""
    if not isinstance(path, str):
        return False
    parts = Path(path).parts
    return len(parts) > 1 and parts[0] == WORK and ".." not in parts


def _size(path: Path) -> int:
    if path.is_file() or path.is_symlink():
        return path.lstat().st_size
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _remove(path: Path) -> None:
    """``path`` and, for a git worktree in it (the lint's checkouts), its
    registration in the repository it belongs to."""
    if path.is_dir() and not path.is_symlink():
        for tree in [path, *(p for p in path.iterdir() if p.is_dir())]:
            if (tree / ".git").is_file():
                common = git.run(tree, "rev-parse", "--git-common-dir")
                if common.returncode == 0:  # relative to the worktree in git before 2.31
                    repo = (tree / common.stdout.decode().strip()).resolve().parent
                    git.drop_worktree(repo, tree)
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_scratch(root: Path, stage: Stage, kept: set[str], log: Callable[[str], object]) -> None:
    """The stage's scratch that this run made (not in ``kept``: there at its
    start), removed, said in one line."""
    gone = []
    for rel in stage.scratch:
        path = root / rel
        if rel in kept or not (path.exists() or path.is_symlink()):
            continue
        size = _size(path)
        _remove(path)
        gone.append(f"{rel} ({size / 1e6:.0f} MB)")
    if gone:
        log(f"ci: removed this run's scratch after {stage.name}: {', '.join(gone)}")


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
    load: Callable[[], tuple[float, float, float]] = os.getloadavg,
) -> list[Timing]:
    """Each stage in order: its install, then its commands (``command`` and
    ``install`` raise on failure, which stops the pipeline after the
    summary), then its scratch removed (a failed stage's stays to look at).
    Fails when a stage took more than ``fail_factor`` times its budget.
    ``load`` is the machine's load average, written beside each stage's
    duration (other work on the machine stretches the figures)."""
    timings: list[Timing] = []
    started = datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat()
    load_at_start = load()
    kept = {p for s in pipeline.stages for p in s.scratch if (root / p).exists()}
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
                timing = Timing(stage, clock() - start, ok, load())
                timings.append(timing)
                log(_line(timing, pipeline.fail_factor))
            remove_scratch(root, stage, kept, log)
    finally:
        _summary(timings, pipeline, log)
        if timings:
            log(
                f"ci: load average {load_at_start[0]:.1f} at the start, "
                f"{timings[-1].load[0]:.1f} at the end, on {os.cpu_count()} cores "
                "(other work on the machine stretches these durations)"
            )
        dest = write_timings(root, timings, pipeline, started, load_at_start)
        log(f"ci: durations written to {dest}")
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


def _summary(timings: list[Timing], pipeline: Pipeline, log) -> None:
    """Every stage's duration, the ones that did not run included, and the
    main command's."""
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
    if pipeline.main and all(n in done for n in pipeline.main.stages):
        main = sum(done[n].seconds for n in pipeline.main.stages)
        log(f"  main command ({pipeline.main.command}): {duration(main)}")


def _git_head(root: Path) -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def timings_document(
    timings: list[Timing],
    pipeline: Pipeline,
    started: str,
    load_at_start: tuple[float, float, float],
    commit: str | None = None,
) -> dict:
    """What timings.json holds: every stage of the pipeline in order, with
    the same keys whether it ran or not, so that a reader can rely on them."""
    done = {t.stage.name: t for t in timings}
    stages = []
    for s in pipeline.stages:
        t = done.get(s.name)
        stages.append(
            {
                "name": s.name,
                "about": s.about,
                "budget_s": s.budget_s,
                "seconds": None if t is None else round(t.seconds, 1),
                "ok": None if t is None else t.ok,
                "status": "not run" if t is None else "passed" if t.ok else "failed",
                "over_budget": t is not None and t.over,
                "load_at_end": None if t is None else [round(x, 2) for x in t.load],
            }
        )
    main = None
    if pipeline.main:
        ran = all(s in done for s in pipeline.main.stages)
        main = {
            "command": pipeline.main.command,
            "stages": list(pipeline.main.stages),
            "seconds": (
                round(sum(done[n].seconds for n in pipeline.main.stages), 1) if ran else None
            ),
        }
    return {
        "timings_schema": TIMINGS_SCHEMA,
        "pipeline": PIPELINE,
        "commit": commit,
        "started": started,
        # Not "machine": results/ci_timings.json (figures --record-ci) puts
        # the results header's machine beside these keys.
        "ci_machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_at_start": [round(x, 2) for x in load_at_start],
        },
        "complete": len(timings) == len(pipeline.stages) and all(t.ok for t in timings),
        "fail_factor": pipeline.fail_factor,
        "total_s": round(sum(t.seconds for t in timings), 1),
        "budget_total_s": sum(s.budget_s for s in pipeline.stages),
        "main_command": main,
        "stages": stages,
    }


def write_timings(
    root: Path,
    timings: list[Timing],
    pipeline: Pipeline,
    started: str,
    load_at_start: tuple[float, float, float],
) -> Path:
    """.work/ci/timings.json, replaced whole (a reader never sees half a file)."""
    doc = timings_document(timings, pipeline, started, load_at_start, _git_head(root))
    dest = root / WORK / TIMINGS
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_suffix(".part")
    part.write_text(json.dumps(doc, indent=2) + "\n")
    part.replace(dest)
    return dest
