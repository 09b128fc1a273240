# SPDX-License-Identifier: Apache-2.0
"""GPU timing for the benchmarks: CUDA events around CUDA-graph replays of a
call (launch overhead out) or around the calls themselves, median of many
after warm-up. torch is imported when a timing runs, so that the modules
using these stay importable without it (their documents and figures)."""

from __future__ import annotations

import functools
import statistics


def _summary(times: list[float], reps: int) -> dict:
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "reps": reps,
    }


def capture_graph(fn, calls: int = 3, replays: int = 3):
    """``fn`` warmed up (``calls`` calls on the capturing stream), captured
    once in a CUDA graph, and that graph replayed ``replays`` times."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def elapsed_ms(run) -> float:
    """One call of ``run`` between two CUDA events: its GPU time in ms."""
    import torch

    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    e0.record()
    run()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1)


def time_graph(fn, reps: int, warmup: int = 3) -> dict:
    """``fn`` captured in a CUDA graph after warm-up and replayed ``reps``
    times, each replay timed."""
    graph = capture_graph(fn, warmup, warmup)
    return _summary([elapsed_ms(graph.replay) for _ in range(reps)], reps)


def in_rounds(timers: list, reps: int, rounds: int) -> list[list[float]]:
    """Samples of each of ``timers`` (calls that time one run, in ms), taken
    in ``rounds`` rounds that each take ``reps / rounds`` (rounded up) of
    every timer in turn: a drift of the GPU's clocks over the run falls on
    each alike, where timing them one after the other puts it between them."""
    per = max(1, -(-reps // max(1, rounds)))
    samples: list[list[float]] = [[] for _ in timers]
    for _ in range(max(1, rounds)):
        for timer, out in zip(timers, samples, strict=True):
            out.extend(timer() for _ in range(per))
    return samples


def time_interleaved(fns: list, reps: int, rounds: int = 4, warmup: int = 3) -> list[dict]:
    """Each of ``fns`` captured in a CUDA graph after warm-up and replayed in
    rounds (:func:`in_rounds`), or, where its capture fails, called between
    CUDA events in its turn; each summary says which (``timing``)."""
    timers, how = [], []
    for fn in fns:
        try:
            timers.append(functools.partial(elapsed_ms, capture_graph(fn, warmup, warmup).replay))
            how.append("graph, interleaved")
        except RuntimeError as e:
            for _ in range(warmup):
                fn()
            timers.append(functools.partial(elapsed_ms, fn))
            how.append(f"events, interleaved (graph capture failed: {e})")
    samples = in_rounds(timers, reps, rounds)
    return [
        {**_summary(t, len(t)), "timing": h, "rounds": rounds}
        for t, h in zip(samples, how, strict=True)
    ]


def time_events(fn, reps: int, warmup: int, flush=None) -> dict:
    """``fn`` called ``reps`` times after warm-up, each call timed; ``flush``
    (a large tensor) is zeroed before each to evict the inputs from L2."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()
        times.append(elapsed_ms(fn))
    return _summary(times, reps)
