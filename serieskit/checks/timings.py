"""The timing blocks of the docs: how long the commands and CI take, and their disk.

From CI's own record of a run (``results/ci_timings.json``) and the commands
timed by ``ci/time-command.sh`` (``results/timing_*.json``); the blocks are
named in :data:`serieskit.checks.blocks.BLOCKS`.
"""

from __future__ import annotations

from serieskit.checks.evidence import CI_TIMINGS, Evidence, Run, duration, table, version

MAIN_STAGES = ("apply", "test requirements", "build", "series tests")  # nox -s apply build test


def _ci(ev: Evidence) -> Run | None:
    return next((r for r in ev.runs if r.name == CI_TIMINGS), None)


NOT_MEASURED = (
    "not yet measured: no `results/{}` (a copy of a complete CI run's "
    "`.work/ci/timings.json`, made by `python3 -m serieskit figures --record-ci`)"
)


def ci_timings(ev: Evidence) -> str:
    """Each CI stage's duration against its budget, from a real run's timings."""
    run = _ci(ev)
    if run is None:
        return "CI's stage durations are " + NOT_MEASURED.format(CI_TIMINGS) + "."
    stages = [s for s in run.doc.get("stages") or [] if isinstance(s, dict)]
    rows = [
        [
            str(s.get("name")),
            duration(float(s.get("seconds") or 0)),
            duration(float(s.get("budget_s") or 0)),
        ]
        for s in stages
    ]
    total = duration(float(run.doc.get("total_s") or 0))
    return "\n".join(
        table(["stage (ci/pipeline.toml)", "took", "budget"], rows)
        + ["", f"`nox -s ci` in all: {total}{_load(run)}; {run.caption()}."]
    )


def _load(run: Run) -> str:
    """``, load average 1.2 to 2.3 on 2 cores`` from the run's timings (the
    1-minute figure at the start and at each stage's end), or nothing for a
    run that did not record it: other work on the machine stretches the
    durations, so a figure says how busy it was."""
    machine = run.doc.get("ci_machine")
    if not isinstance(machine, dict):
        return ""
    loads = [
        float(x[0])
        for x in [machine.get("load_at_start")]
        + [s.get("load_at_end") for s in run.doc.get("stages") or [] if isinstance(s, dict)]
        if isinstance(x, list) and x
    ]
    if not loads:
        return ""
    return f", load average {min(loads):.1f} to {max(loads):.1f} on {machine.get('cores')} cores"


def _main_stages(run: Run) -> tuple[str, ...]:
    """The stages that make up the main command: as the run's pipeline named
    them (ci/pipeline.toml's [main_command], in timings.json), else the
    default."""
    main = run.doc.get("main_command")
    stages = main.get("stages") if isinstance(main, dict) else None
    if isinstance(stages, list) and stages and all(isinstance(n, str) for n in stages):
        return tuple(stages)
    return MAIN_STAGES


def _main_command(run: Run) -> str:
    took = {
        s.get("name"): float(s.get("seconds") or 0)
        for s in run.doc.get("stages") or []
        if isinstance(s, dict)
    }
    return duration(sum(took.get(s, 0.0) for s in _main_stages(run)))


def _gb(size: object) -> str:
    return f"{float(size) / 1e9:.1f} GB" if isinstance(size, int | float) else "not recorded"


def _bytes(size: object) -> str:
    """A place's size: GB from 0.1 GB, MB below, "none" for an empty one
    (counted, and nothing there)."""
    if not isinstance(size, int | float) or size >= 1e8:
        return _gb(size)
    return "none" if size == 0 else f"{size / 1e6:.0f} MB" if size >= 1e6 else "under 1 MB"


def _places(run: Run) -> str:
    """Each place's bytes after the run, and their sum."""
    disk = run.doc.get("disk") or {}
    words = ", ".join(f"`{k}` {_bytes(v)}" for k, v in disk.items())
    if len(disk) > 1:
        words += f": {_gb(sum(v for v in disk.values() if isinstance(v, int | float)))} in all"
    return words


def _peak(run: Run) -> str | None:
    """The largest sum the run's disk samples saw at once, with the places
    that held more then than afterwards (by 1 MB or more, the most first);
    None for a run not sampled."""
    peak = run.doc.get("disk_peak")
    if not (isinstance(peak, dict) and isinstance(peak.get("total"), int | float)):
        return None
    disk = run.doc.get("disk") or {}
    more = sorted(
        ((k, v) for k, v in (peak.get("places") or {}).items() if v - disk.get(k, 0) >= 1e6),
        key=lambda kv: disk.get(kv[0], 0) - kv[1],
    )
    then = ("; then " + ", ".join(f"`{k}` {_bytes(v)}" for k, v in more)) if more else ""
    return f"at most {_gb(peak['total'])} at once (sampled every {peak.get('every_s', 10)} s{then})"


def _loaded(ev: Evidence) -> list[str]:
    """Per command timed on a machine shared with other work
    (``ci/time-command.sh``, kind ``timing``): how long it took, as a range
    over the runs, with the load through them, and the disk of the last: the
    most at once and every place afterwards where it was sampled, else what
    it left."""
    by: dict[str, list[Run]] = {}
    for r in sorted((r for r in ev.runs if r.doc.get("kind") == "timing"), key=lambda r: r.date):
        by.setdefault(str(r.doc.get("command")), []).append(r)
    out = []
    for command, runs in by.items():
        took = sorted(float(r.doc.get("total_s") or 0) for r in runs)
        span = duration(took[0]) + (f" to {duration(took[-1])}" if len(took) > 1 else "")
        lows = [float((r.doc.get("load") or {}).get("min") or 0) for r in runs]
        highs = [float((r.doc.get("load") or {}).get("max") or 0) for r in runs]
        last = runs[-1]
        cores = last.doc.get("cores") or "several"
        peak = _peak(last)
        left = "" if peak else "; " + ("the last run's " if len(runs) > 1 else "")
        left += "" if peak else f"disk afterwards: {_places(last)}"
        short = command.replace("python3 -m ", "")
        starts = "; ".join(sorted({str(r.doc.get("from") or "state not recorded") for r in runs}))
        slow = [r for r in runs if str(r.doc.get("outcome", "passed")) != "passed"]
        if slow:
            many = f"{len(slow)} of them: " if len(runs) > 1 else ""
            starts += f"; {many}{slow[0].doc['outcome']}"
        text = (
            f"On {cores} cores shared with other work, load average {min(lows):.1f} to "
            f"{max(highs):.1f}: `{short}` took {span} "
            f"({'one run' if len(runs) == 1 else f'{len(runs)} runs'}, from {starts}"
            f"{left}); " + "; ".join(r.caption() for r in runs) + "."
        )
        if peak:
            text += (
                f" Its disk, in the run from {last.doc.get('from') or 'a state not recorded'}, "
                f"`results/{last.name}`: {peak}; afterwards {_places(last)}."
            )
        out.append(text)
    return out


def commands_timing(ev: Evidence) -> str:
    """The two commands' durations: from CI's own timing of a real run, then
    as a machine shared with other work takes them."""
    run = _ci(ev)
    if run is None:
        lead = "Their duration on a fresh machine is " + NOT_MEASURED.format(CI_TIMINGS) + "."
    else:
        total = duration(float(run.doc.get("total_s") or 0))
        lead = (
            f"Measured by CI itself: `nox -s ci` took {total}, and the stages that make up the "
            f"main job ({', '.join(_main_stages(run))}) {_main_command(run)}{_load(run)}; "
            f"{run.caption()}."
        )
    loaded = _loaded(ev) or [
        "How long they take on a loaded machine is not yet measured: no `results/timing_*.json` "
        "(`ci/time-command.sh`, then `python3 -m serieskit figures --record-timing DIR`)."
    ]
    return "\n\n".join([lead, *loaded])


COMMANDS = ("python3 -m nox -s apply build test", "python3 -m nox -s ci")
NOT_RUN = "not measured"


def _link(words: str, run: Run) -> str:
    """``words`` linked to the run's results file (from the repository root)."""
    return f"[{words}]({run.path})"


def _timed(ev: Evidence) -> dict[str, list[Run]]:
    """The runs of ``ci/time-command.sh`` (kind ``timing``) per command, oldest first."""
    by: dict[str, list[Run]] = {}
    for r in sorted((r for r in ev.runs if r.doc.get("kind") == "timing"), key=lambda r: r.date):
        by.setdefault(str(r.doc.get("command")), []).append(r)
    return by


def _on_ci(run: Run | None, command: str) -> str:
    """CI's own figure for ``command``: the whole run, or the main job's stages."""
    if run is None:
        return NOT_RUN
    if command.endswith("-s ci"):
        return _link(duration(float(run.doc.get("total_s") or 0)), run)
    if command == COMMANDS[0]:
        return _link(_main_command(run), run) + " (its stages of `nox -s ci`)"
    return NOT_RUN


def _on_loaded(runs: list[Run]) -> str:
    """Each run's duration with the load through it, the shortest first."""
    if not runs:
        return NOT_RUN
    cells = []
    for r in sorted(runs, key=lambda r: float(r.doc.get("total_s") or 0)):
        load = r.doc.get("load") or {}
        cells.append(
            _link(duration(float(r.doc.get("total_s") or 0)), r)
            + f", load average {float(load.get('min') or 0):.1f} to "
            + f"{float(load.get('max') or 0):.1f}"
        )
    return "; ".join(cells)


def _disk_after(run: Run | None) -> str:
    """What the run left, summed; the places named where it counted only some
    (earlier runs: `.nox`, `.work` and the toolkit's cache)."""
    disk = (run.doc.get("disk") or {}) if run else {}
    if not (run and disk):
        return NOT_RUN
    total = _gb(sum(v for v in disk.values() if isinstance(v, int | float)))
    only = "" if "TMPDIR" in disk else " (" + ", ".join(f"`{k}`" for k in disk) + " only)"
    return _link(total, run) + only


def _disk_most(run: Run | None) -> str:
    peak = (run.doc.get("disk_peak") or {}) if run else {}
    if not (run and isinstance(peak.get("total"), int | float)):
        return NOT_RUN
    return _link(_gb(peak["total"]), run)


def commands_table(ev: Evidence) -> str:
    """The README's table of the two commands: CI's own timing, a loaded
    machine's (with its load average), and the disk of the last loaded run,
    each cell linked to its results file; "not measured" where no run
    measured it. docs/measured.md gives the same runs in full
    (:func:`commands_timing`)."""
    ci = _ci(ev)
    timed = _timed(ev)
    commands = list(COMMANDS) + [c for c in timed if c not in COMMANDS]
    cores = {str(r.doc.get("cores")) for rs in timed.values() for r in rs if r.doc.get("cores")}
    ci_cores = (ci.doc.get("ci_machine") or {}).get("cores") if ci else None
    rows = []
    for command in commands:
        runs = timed.get(command, [])
        last = runs[-1] if runs else None
        rows.append(
            [
                f"`{command.replace('python3 -m ', '')}`",
                _on_ci(ci, command),
                _on_loaded(runs),
                _disk_after(last),
                _disk_most(last),
            ]
        )
    head = [
        "command",
        f"CI's machine ({ci_cores or 'its'} cores, measured by CI)",
        f"{' or '.join(sorted(cores)) or 'a few'} cores shared with other work",
        "disk at the end",
        "disk at most",
    ]
    used = [r for r in [ci, *(r for rs in timed.values() for r in rs)] if r is not None]
    if not used:
        foot = (
            "Not measured yet: no `results/ci_timings.json` (`--record-ci`) and no "
            "`results/timing_*.json` (`--record-timing`)."
        )
    else:
        labels = sorted({str(r.machine.get("label") or r.machine.get("name")) for r in used})
        cpu = all(label.startswith("CPU run (no GPU") for label in labels)
        bases = sorted({version(r.base, ev.pin) or "base not recorded" for r in used})
        days = sorted({r.day for r in used if r.day}) or ["date not recorded"]
        foot = (
            ("CPU runs (no GPU)" if cpu else "; ".join(labels))
            + f" on {', '.join(bases)}, {days[0]}"
            + (f" to {days[-1]}" if len(days) > 1 else "")
            + (_load(ci).replace(", load average", "; CI's load average", 1) if ci else "")
            + ". Each run in full: [Measured figures](docs/measured.md)."
        )
    return "\n".join([*table(head, rows), "", foot])
