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
from serieskit.checks import benchmarks, timings
from serieskit.checks.benchmarks import missing
from serieskit.checks.evidence import (
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
        ["tests/distributed/test_dbo_tensor_parallel.py"],
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
}
SMOKE = "gpu/smoke.py"


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
    bases = sorted({version(r.base, ev.pin) or "base not recorded" for r in runs})
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
            version(r.base, ev.pin) or "-",
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
                    version(r.base, ev.pin) or "-",
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


# The evidence docs/gpu-evidence.md lists as current or not: (words, the
# table of docs/evidence-runs.md that shows it, from benchmarks.PICK).
BENCHMARKS = [
    ("the Turing attention's benchmark", "attention"),
    ("the Turing attention's crossover", "crossover"),
    ("NVFP4's benchmark", "nvfp4"),
    ("the host all-reduce's benchmark", "host_reduce"),
    ("the end-to-end A/B", "e2e"),
    ("static evidence of the CUDA kernels", "static_kernels"),
    ("static evidence per head dim", "static_head_dims"),
    ("static evidence of the NVFP4 kernels", "static_nvfp4"),
]


def _on_head(ev: Evidence, run: Run, names: list[str]) -> str:
    """Whether ``run`` ran on the pin and the current version of the files
    of the patches ``names``, in words."""
    if run.base != ev.pin:
        return "no: an earlier base" if run.base else "no: its base is not recorded"
    words = ev.predates(run, names)
    return f"no: it {words}" if words else "yes"


def current(ev: Evidence) -> str:
    """Per kind of evidence, the results files the tables show (the newest
    that hold it, the pin's base preferred), and whether each ran on the
    series head: the pin, and the current version of the files it covers."""
    every = [p.name for p in ev.patches]
    picked: list[tuple[str, Run, list[str]]] = []
    for gpus, words in (
        (1, "the series' test files, one GPU"),
        (2, "the series' test files, two GPUs"),
    ):
        tests = sorted({t for p in ev.patches for t in p.tests})
        found = {r.path: r for t in tests if (r := ev.with_tests(t, gpus=gpus))}
        for test_run in sorted(found.values(), key=lambda r: r.name):
            ran = [t for t in test_run.doc.get("test_files") or {} if t in tests]
            picked.append((words, test_run, [n for t in ran for n in ev.covering(t)]))
    for words, whole in (
        ("the engine's smoke run", ev.with_tests(SMOKE, gpus=1)),
        ("the wheel served", _serve_run(ev)),
    ):
        if whole:
            picked.append((words, whole, every))
    for words, name in BENCHMARKS:
        if bench := benchmarks.PICK[name](ev):
            picked.append((words, bench, benchmarks.COVERS[name]))
    rows = [
        [
            words,
            f"`{run.name}`",
            str(run.machine.get("name") or "-"),
            version(run.base, ev.pin) or "-",
            run.day,
            _on_head(ev, run, list(dict.fromkeys(names)) or every),
        ]
        for words, run, names in picked
    ]
    head = ["evidence", "results file", "machine", "base", "date", "on the series head"]
    behind = list(dict.fromkeys(row[0] for row in rows if row[-1] != "yes"))
    still = (
        "To run again on the series head: " + "; ".join(behind) + "."
        if behind
        else "Every kind of evidence ran on the series head."
    )
    return "\n".join(table(head, rows) + ["", still])


BLOCKS: dict[str, Callable[[Evidence], str]] = {
    "series": series,
    "commands-timing": timings.commands_timing,
    "commands-table": timings.commands_table,
    "ci-timings": timings.ci_timings,
    "runs": runs,
    "current": current,
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
