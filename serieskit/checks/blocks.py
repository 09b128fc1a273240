"""The text of each figures block of the docs, made from the results files.

One function per block name (:data:`BLOCKS`); each returns markdown and
names, for every figure, the results file it was read from and that file's
machine label ("H200 figure ...: not a Turing figure", "the seed's Turing
figure ..."). Which run a block shows is found, not named: the newest file
that holds the figures, preferring the pin's base (:class:`Evidence`).
"""

from __future__ import annotations

from collections.abc import Callable

from serieskit import results
from serieskit.checks import benchmarks
from serieskit.checks.benchmarks import missing
from serieskit.checks.evidence import (
    CI_TIMINGS,
    Evidence,
    Patch,
    Run,
    counts,
    duration,
    fmt,
    table,
    version,
)

# The series table's headline figures per patch (its Patch-Name) beside the
# counts of its test files: (figure key, words with {} for the value). One
# GPU: the newest run on the pin. Two GPUs: the newest run on two or more
# GPUs, any base, and the test files whose two-GPU cases matter.
ONE_GPU: dict[str, list[tuple[str, tuple[str, ...]]]] = {
    "turing-prefill-attention": [
        (
            "head dim 256, 2048 after 153,600 in {} ({} of the mma.sync ceiling), TRITON_ATTN {}",
            (
                "hd256.q2048_ctx153600.auto_split_ms",
                "hd256.q2048_ctx153600.auto_split_fraction_of_ceiling",
                "hd256.q2048_ctx153600.triton_attn_ms",
            ),
        ),
        (
            "time to first token through the engine (head dim 128, capability reported as "
            "7.5): 32,768 tokens {} against TRITON_ATTN's {}, 8,192 tokens {} against {}",
            ("ttft_turing_32k", "ttft_triton_32k", "ttft_turing_8k", "ttft_triton_8k"),
        ),
    ],
    "turing-prefill-split-kv": [
        (
            "head dim 256, 2048 after 153,600: {} without split, {} with the automatic split",
            ("hd256.q2048_ctx153600.no_split_ms", "hd256.q2048_ctx153600.auto_split_ms"),
        )
    ],
    "turing-prefill-head-dims": [
        (
            "2048 after 153,600 at head dims 64 / 128: {} / {} of the mma.sync ceiling",
            (
                "hd64.q2048_ctx153600.auto_split_fraction_of_ceiling",
                "hd128.q2048_ctx153600.auto_split_fraction_of_ceiling",
            ),
        )
    ],
    "nvfp4-sm7x-dequant": [
        (
            "dequantization at {} of the copy bandwidth (Marlin's layout)",
            ("17408x5120.marlin.default_tile.fraction_of_copy_bandwidth",),
        ),
        (
            "M = 2048: {} against Marlin's {}",
            ("17408x5120.m2048.dequant_cublas_ms", "17408x5120.m2048.marlin_ms"),
        ),
    ],
}
TWO_GPUS: dict[str, tuple[list[str], list[tuple[str, tuple[str, ...]]]]] = {
    "host-reduce-kernel": (
        ["tests/distributed/test_host_reduce.py"],
        [
            (
                "256 KiB in {} (NCCL {})",
                ("allreduce_262144B.kernel_mode_ms", "allreduce_262144B.nccl_ms"),
            )
        ],
    ),
    "tp-prefill-overlap": (
        ["tests/v1/worker/test_dbo_tensor_parallel.py"],
        [
            (
                "A/B prefill {} ({} with the copy engine)",
                ("overlap.prefill_change_pct", "overlap+copy-engine.prefill_change_pct"),
            )
        ],
    ),
    "host-reduce-copy-engine": (
        ["tests/distributed/test_host_reduce.py"],
        [
            (
                "20 MiB in {} (NCCL {})",
                ("allreduce_20971520B.copy_engine_mode_ms", "allreduce_20971520B.nccl_ms"),
            ),
            ("A/B prefill {}", ("copy-engine.prefill_change_pct",)),
        ],
    ),
    "nvfp4-sm7x-dequant": (["tests/kernels/quantization/test_nvfp4_dequant_fp16.py"], []),
}
SMOKE = "gpu/smoke.py"
MAIN_STAGES = ("apply", "test requirements", "build", "series tests")  # nox -s apply build test


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _part(run: Run, words: str, keys: tuple[str, ...]) -> str:
    values = []
    for key in keys:
        f = run.figure(key) or {}
        values.append(fmt(f.get("value"), str(f.get("unit", "")), signed="change" in key))
    return words.format(*values)


def _with_all(ev: Evidence, keys: tuple[str, ...], gpus: int, pin_only: bool) -> Run | None:
    """The newest run holding every one of ``keys`` (a part's figures come from one run)."""
    run = ev.with_figure(keys[0], gpus=gpus, pin_only=pin_only)
    return run if run and all(run.figure(k) for k in keys) else None


def _sources(ev: Evidence, runs: list[Run], names: list[str]) -> str:
    """The results files of a cell, each with the files of the patches
    ``names`` that changed since it ran (files with the same words together)."""
    by = {r.name: r for r in runs}
    words: dict[str, list[str]] = {}
    for n in sorted(by):
        words.setdefault(ev.predates(by[n], names), []).append(f"`{n}`")
    parts = [", ".join(files) + (f": {w}" if w else "") for w, files in words.items()]
    return "(" + "; ".join(parts) + ")" if parts else ""


def _one_gpu(ev: Evidence, p: Patch, used: list[Run]) -> str:
    parts, runs = [], []
    for test in p.tests:
        run = ev.with_tests(test, gpus=1, pin_only=True)
        if run:
            runs.append(run)
            parts.append(f"`{_short(test)}` {counts(run.tests(test) or {})}")
        elif ev.with_tests(test) is None:
            parts.append(f"`{_short(test)}` (CPU, in CI)")
        else:
            parts.append(f"`{_short(test)}`: not run on one GPU")
    for words, keys in ONE_GPU.get(p.name, []):
        run = _with_all(ev, keys, gpus=1, pin_only=True)
        if run:
            runs.append(run)
            parts.append(_part(run, words, keys))
    used += runs
    sources = _sources(ev, runs, [p.name])
    return "; ".join(parts) + (" " + sources if runs else "") if parts else "CPU (CI)"


def _two_gpus(ev: Evidence, p: Patch) -> str:
    if p.name not in TWO_GPUS:
        return "none needed"
    tests, figures = TWO_GPUS[p.name]
    parts, runs = [], []
    for test in tests:
        run = ev.with_tests(test, gpus=2)
        if run:
            runs.append(run)
            parts.append(f"`{_short(test)}` {counts(run.tests(test) or {})}")
        else:
            parts.append(f"`{_short(test)}` TP=2 cases: not run")
    for words, keys in figures:
        run = _with_all(ev, keys, gpus=2, pin_only=False)
        if run:
            runs.append(run)
            parts.append(_part(run, words, keys))
    bases = sorted({version(r.base) or "base not recorded" for r in runs})
    lead = (
        f"last run on {', '.join(bases)}: " if runs and any(r.base != ev.pin for r in runs) else ""
    )
    return lead + "; ".join(parts) + (" " + _sources(ev, runs, [p.name]) if runs else "")


def _gpu_words(runs: list[Run]) -> str:
    gpus = sorted({str(r.machine.get("gpu", "")).removeprefix("NVIDIA ") for r in runs})
    return ", ".join(gpus) or "GPU"


def series(ev: Evidence) -> str:
    """One row per patch: what ran on one GPU on the pin, and the two-GPU evidence."""
    used: list[Run] = []
    rows = [
        [f"`{p.number}`", p.subject, _one_gpu(ev, p, used), _two_gpus(ev, p)] for p in ev.patches
    ]
    gpu = _gpu_words(used)
    not_turing = used and all("not a Turing figure" in str(r.machine.get("label")) for r in used)
    torch = sorted({str(r.machine.get("torch")) for r in used if r.machine.get("torch")})
    head = [
        "patch",
        "what",
        f"one {gpu}, {version(ev.pin)}"
        + (f" ({gpu} figures, not Turing figures)" if not_turing else ""),
        "two GPUs (P2P off)",
    ]
    out = table(head, rows)
    smoke = ev.with_tests(SMOKE, gpus=1, pin_only=True)
    if smoke:
        c = smoke.tests(SMOKE) or {}
        ran = sum(int(c.get(k) or 0) for k in ("passed", "failed", "errors"))
        out += [
            "",
            f"The engine's smoke run (`{SMOKE}`: boot with torch.compile and CUDA graphs, greedy "
            f"generation): {int(c.get('passed') or 0)} of {ran} steps passed; {smoke.caption()}."
            + ev.predates_note(smoke, [p.name for p in ev.patches]),
        ]
    if torch:
        out += ["", f"The one-GPU runs used the GPU machine's torch ({', '.join(torch)})."]
    return "\n".join(out)


def _changed_patches(ev: Evidence, run: Run) -> str:
    """Which patches have files that changed since ``run``, in words."""
    if run.doc.get("kind") == "external":
        return "- (not a run of this series)"
    if run.files is None:
        return "not recorded"
    changed = [p.name for p in ev.patches if ev.outdated(run, [p.name])]
    if not changed:
        return "none"
    return "every patch" if len(changed) == len(ev.patches) else ev.numbers(changed)


def runs(ev: Evidence) -> str:
    """Every results file: what kind, which machine (its label), which base,
    when, and the patches whose files changed since it ran."""
    rows = [
        [
            f"`{r.name}`",
            str(r.doc.get("kind")),
            str(r.machine.get("label") or r.machine.get("name")),
            version(r.base) or "-",
            str(r.machine.get("torch") or "-"),
            r.day,
            _changed_patches(ev, r),
        ]
        for r in sorted(ev.runs, key=lambda r: (r.base == ev.pin, r.date, r.name), reverse=True)
    ]
    head = ["results file", "kind", "machine", "base", "torch", "date", "patches changed since"]
    return "\n".join(table(head, rows))


def _against_head(ev: Evidence, run: Run, test_file: str) -> str:
    """Whether a run of ``test_file`` ran on the current version of the files
    of the patches that list it."""
    if not test_file.startswith("tests/"):
        # The toolkit's own harness (gpu/smoke.py): it runs the whole series.
        names = [p.name for p in ev.patches]
    elif not (names := ev.covering(test_file)):
        return "a test file the series no longer has"
    return ev.predates(run, names) or "the current version"


def _test_name(ev: Evidence, test_file: str) -> str:
    """A test file as the table names it: in code format while a patch lists
    it, in plain text once the series no longer has it (a name in code format
    must be one the trees have: serieskit/checks/names.py)."""
    gone = test_file.startswith("tests/") and not ev.covering(test_file)
    return test_file if gone else f"`{test_file}`"


def gpu_tests(ev: Evidence) -> str:
    """Per GPU run of the series' test files: the outcome of each file."""
    rows = []
    tests = [r for r in ev.gpu_runs() if r.doc.get("kind") == "tests"]
    for r in sorted(tests, key=lambda r: (r.base == ev.pin, r.date, r.name), reverse=True):
        for test, c in sorted((r.doc.get("test_files") or {}).items()):
            rows.append(
                [
                    _test_name(ev, test),
                    counts(c),
                    str(r.machine.get("name")),
                    version(r.base) or "-",
                    r.day,
                    f"`{r.name}`",
                    _against_head(ev, r, test),
                ]
            )
    head = ["test file", "outcome", "machine", "base", "date", "results file", "its patches' files"]
    return "\n".join(table(head, rows))


def _serve_run(ev: Evidence) -> Run | None:
    found = sorted(ev.find("**/serve*.json"), key=lambda r: (r.date, r.path))
    return found[-1] if found else None


def serve_status(ev: Evidence) -> str:
    """One sentence: how far the last serve run on the GPU machine got."""
    run = _serve_run(ev)
    return serve(ev).split("\n", 1)[0] if run else missing("a run of gpu/serve.sh")


def serve(ev: Evidence) -> str:
    """The wheel built, installed and served on the GPU machine (gpu/serve.sh)."""
    run = _serve_run(ev)
    if run is None:
        return missing("a run of gpu/serve.sh")
    steps = [s for s in run.doc.get("steps") or [] if isinstance(s, dict)]
    failed = [s for s in steps if not s.get("ok")]
    rows = [
        [str(s.get("step")), "passed" if s.get("ok") else "failed", fmt(s.get("seconds"), "s")]
        for s in steps
    ]
    lead = f"{len(steps) - len(failed)} of the {len(steps)} steps that ran passed"
    if failed:
        error = str(failed[0].get("error") or "").strip().splitlines() or ["no error recorded"]
        step = failed[0].get("step")
        lead += f'; it stopped at "{step}" ({error[-1].strip()}), so nothing was served yet'
    lead += f"; {run.caption()}." + ev.predates_note(run, [p.name for p in ev.patches])
    return "\n".join([lead, ""] + table(["step", "outcome", "took"], rows))


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
        bases = sorted({version(r.base) or "base not recorded" for r in used})
        days = sorted({r.day for r in used if r.day}) or ["date not recorded"]
        foot = (
            ("CPU runs (no GPU)" if cpu else "; ".join(labels))
            + f" on {', '.join(bases)}, {days[0]}"
            + (f" to {days[-1]}" if len(days) > 1 else "")
            + (_load(ci).replace(", load average", "; CI's load average", 1) if ci else "")
            + ". Each run in full: [Measured figures](docs/measured.md)."
        )
    return "\n".join([*table(head, rows), "", foot])


def sitting(ev: Evidence) -> str:
    """The newest whole sitting of the GPU machine (``nox -s evidence``):
    each call's time, and the GPU time from the machine's start to the end
    of its last call against the time a sitting may take; then what ran
    again after it (a step of a sitting alone), by its purpose."""
    sittings = [r for r in ev.runs if r.doc.get("kind") == "sitting"]
    run = ev.newest(r for r in sittings if results.whole_sitting(r.doc)) or ev.newest(sittings)
    if run is None:
        return (
            "Not measured yet: no sitting has run (`nox -s evidence -- --collect` writes "
            "`results/sitting_*.json`)."
        )
    d = run.doc
    calls = [c for c in d.get("calls") or [] if isinstance(c, dict)]
    # The batch runs in the background, from the bench call to the tests call.
    numbers = iter(range(1, len(calls) + 1))
    rows = [
        [
            "beside" if c.get("step") == "batch" else str(next(numbers)),
            f"`gpu/evidence.sh {c.get('step')}{' ' + c['args'] if c.get('args') else ''}`",
            duration(float(c.get("seconds") or 0)),
            "passed" if c.get("rc") == 0 else f"exit {c.get('rc')}",
            ", ".join(
                f"{p.get('part')} {duration(float(p.get('seconds') or 0))}"
                + ("" if p.get("rc") == 0 else f" (exit {p.get('rc')})")
                for p in c.get("parts") or []
            )
            or "-",
        ]
        for c in calls
    ]
    total = float(d.get("machine_s") or 0)
    limit = float(d.get("limit_s") or 0)
    lead = (
        f"Measured: {duration(total)} of GPU time from the machine's start to the end of its "
        f"last call ({'within' if total <= limit else 'over'} the {duration(limit)} a sitting "
        "may take"
        + (
            f"; the device tool counted {duration(float(d['lease_held_s']))} held"
            if d.get("lease_held_s") is not None
            else ""
        )
        + ("" if d.get("one_machine", True) else "; the calls ran on more than one machine")
        + f"), of which {duration(float(d.get('start_s') or 0))} before the first command."
    )
    out = [lead, ""] + table(["call", "ran", "took", "outcome", "its parts"], rows)
    end = ev.predates_note(run, [p.name for p in ev.patches])
    again = [
        f"After it: {r.doc.get('purpose') or 'a part of a sitting'} (`results/{r.name}`)."
        for r in sorted(sittings, key=lambda r: (r.date, r.name))
        if (r.date, r.name) > (run.date, run.name) and not results.whole_sitting(r.doc)
    ]
    return "\n".join([*out, "", f"{run.caption()}.{end}", *(["", *again] if again else [])])


BLOCKS: dict[str, Callable[[Evidence], str]] = {
    "series": series,
    "commands-timing": commands_timing,
    "commands-table": commands_table,
    "ci-timings": ci_timings,
    "runs": runs,
    "gpu-tests": gpu_tests,
    "host-reduce": benchmarks.host_reduce,
    "attention": benchmarks.attention,
    "variants": benchmarks.variants,
    "crossover": benchmarks.crossover,
    "nvfp4": benchmarks.nvfp4,
    "static-kernels": benchmarks.static_kernels,
    "static-head-dims": benchmarks.static_head_dims,
    "static-nvfp4": benchmarks.static_nvfp4,
    "e2e": benchmarks.e2e,
    "seed": benchmarks.seed,
    "serve": serve,
    "serve-status": serve_status,
    "sitting": sitting,
}
