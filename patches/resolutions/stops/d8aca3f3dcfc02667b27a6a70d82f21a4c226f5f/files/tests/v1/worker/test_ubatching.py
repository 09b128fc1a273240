# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Failure handling of the DBO micro-batch contexts (vllm/v1/worker/ubatching.py)
as the model runner's UBatchRunner runs them: real threads, on CPU, with
stand-in streams."""

import threading
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import vllm.v1.worker.gpu.ubatch_utils as ubatch_utils
import vllm.v1.worker.ubatching as ubatching
from vllm.v1.worker.gpu.ubatch_utils import UBatchRunner, UBatchState
from vllm.v1.worker.ubatch_utils import UBatchSlice
from vllm.v1.worker.ubatching import dbo_current_ubatch_id, dbo_yield


class _Boom(Exception):
    pass


@pytest.fixture
def cpu_streams(monkeypatch):
    """The contexts switch streams and record events; on CPU both are no-ops
    and the current stream is kept per thread."""
    tls = threading.local()
    compute, comm = object(), object()

    monkeypatch.setattr(
        ubatching, "current_stream", lambda: getattr(tls, "stream", compute)
    )
    monkeypatch.setattr(
        ubatch_utils, "current_stream", lambda: getattr(tls, "stream", compute)
    )
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: setattr(tls, "stream", s))
    # The runners make the worker's device current in each new thread.
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda device: None)
    for name in (
        "_signal_comm_done",
        "_signal_compute_done",
        "_wait_comm_done",
        "_wait_compute_done",
    ):
        monkeypatch.setattr(ubatching.UBatchContext, name, lambda self: None)
    return SimpleNamespace(compute=compute, comm=comm)


def _stand_in_forward_contexts() -> list[Any]:
    """The contexts only install these; stand-ins do."""
    return [SimpleNamespace(id=0), SimpleNamespace(id=1)]


def _model(reached, fail_ubatch=None, fail_at=None, layers=20):
    def model(input_ids, positions, intermediate_tensors, inputs_embeds):
        ubatch = dbo_current_ubatch_id()
        for layer in range(layers):
            reached[ubatch] = layer
            if ubatch == fail_ubatch and layer == fail_at:
                raise _Boom(f"micro-batch {ubatch} failed at layer {layer}")
            dbo_yield()
        return input_ids + 1

    return model


def _runner(streams) -> UBatchRunner:
    """The V2 runner's execution half (begin_capturable_run / run), without
    the attention-side state that only prepare() reads."""
    runner = UBatchRunner.__new__(UBatchRunner)
    runner.num_ubatches = 2
    runner.device = torch.device("cpu")
    runner.comm_stream = streams.comm
    runner.capture_stream = streams.compute
    runner.ready_barrier = threading.Barrier(3)
    runner.sm_control = nullcontext()
    runner._pending_finish = None
    return runner


def _v2_model(reached, fail_ubatch=None, fail_at=None, layers=20):
    inner = _model(reached, fail_ubatch, fail_at, layers)

    def model(input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        return inner(input_ids, positions, intermediate_tensors, inputs_embeds)

    return model


def _run_v2(runner, model, timeout):
    """UBatchRunner.run in a helper thread: a hang fails the test instead of
    hanging it."""
    state = UBatchState(
        slices=[
            UBatchSlice(slice(0, 1), slice(0, 2)),
            UBatchSlice(slice(1, 2), slice(2, 4)),
        ],
        forward_contexts=_stand_in_forward_contexts(),
    )
    inputs = {
        "input_ids": torch.tensor([0.0, 0.0, 1.0, 1.0]),
        "positions": torch.arange(4),
        "inputs_embeds": None,
        "intermediate_tensors": None,
    }
    outcome: dict = {}

    def target():
        try:
            outcome["result"] = runner.run(model, inputs, state)
        except BaseException as e:
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), (
        f"UBatchRunner.run did not return within {timeout} s after a micro-batch failed"
    )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def test_v2_runner_runs_to_the_end(cpu_streams):
    reached = [None, None]
    out = _run_v2(_runner(cpu_streams), _v2_model(reached), 10)
    assert out.tolist() == [1.0, 1.0, 2.0, 2.0]
    assert reached == [19, 19]


@pytest.mark.parametrize("fail_ubatch", [0, 1])
@pytest.mark.parametrize("fail_at", [0, 3])
def test_v2_runner_failing_ubatch_stops_the_other(cpu_streams, fail_ubatch, fail_at):
    """A micro-batch that failed while the other was parked at a yield left it
    (and the step) waiting forever. Now the other stops at its next yield and
    the failure is reported as the runner reports it, naming the micro-batch,
    with the cause (not the abort it caused) as its __cause__."""
    runner = _runner(cpu_streams)
    reached = [None, None]
    model = _v2_model(reached, fail_ubatch, fail_at)
    with pytest.raises(RuntimeError, match=f"Microbatch {fail_ubatch} of 2") as info:
        _run_v2(runner, model, 10)
    assert isinstance(info.value.__cause__, _Boom)
    assert not isinstance(info.value.__cause__, ubatching.UBatchAbortedError)
    other = 1 - fail_ubatch
    assert reached[other] is None or reached[other] <= fail_at + 1
    assert not ubatching.dbo_enabled()
    assert runner._pending_finish is None

    # The runner's barrier still works for the next step.
    out = _run_v2(runner, _v2_model([None, None]), 10)
    assert out.tolist() == [1.0, 1.0, 2.0, 2.0]


def test_v2_runner_thread_failing_before_the_barrier(cpu_streams, monkeypatch):
    """A thread that fails before it is parked (here: selecting the device)
    breaks the barrier instead of leaving the caller waiting there."""
    runner = _runner(cpu_streams)
    calls = []

    def set_device_index(device):
        calls.append(device)
        if len(calls) == 1:
            raise _Boom("no device")

    monkeypatch.setattr(torch.accelerator, "set_device_index", set_device_index)
    with pytest.raises(RuntimeError, match="Microbatch") as info:
        _run_v2(runner, _v2_model([None, None]), 10)
    assert isinstance(info.value.__cause__, _Boom)
    assert not runner.ready_barrier.broken

    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda device: None)
    out = _run_v2(runner, _v2_model([None, None]), 10)
    assert out.tolist() == [1.0, 1.0, 2.0, 2.0]
