# SPDX-License-Identifier: Apache-2.0
"""GPU timing for the benchmarks: CUDA events around CUDA-graph replays of a
call (launch overhead out) or around the calls themselves, median of many
after warm-up. torch is imported when a timing runs, so that the modules
using these stay importable without it (their documents and figures)."""

from __future__ import annotations

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


def time_graph(fn, reps: int, warmup: int = 3) -> dict:
    """``fn`` captured in a CUDA graph after warm-up and replayed ``reps``
    times, each replay timed."""
    import torch

    graph = capture_graph(fn, warmup, warmup)
    times = []
    for _ in range(reps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return _summary(times, reps)


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
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return _summary(times, reps)
