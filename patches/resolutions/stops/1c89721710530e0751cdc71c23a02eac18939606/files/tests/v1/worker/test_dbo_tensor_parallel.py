# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Dual batch overlap for a dense tensor-parallel model without data
parallelism: when a step is split into micro-batches, which collectives move
to DBO's comm stream, and what a failing micro-batch does to them.

The CPU tests run the micro-batch threads for real with stand-in streams; the
GPU tests need one GPU (the comm stream path, bit for bit) or two (TP=2
greedy outputs with and without DBO)."""

import threading
from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

import vllm.distributed.parallel_state as parallel_state
import vllm.v1.worker.gpu.ubatch_utils as gpu_ubatch_utils
import vllm.v1.worker.ubatching as ubatching
from vllm.config import ParallelConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.config.vllm import VllmConfig, enable_allreduce_rms_fusion
from vllm.distributed.parallel_state import GroupCoordinator
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.dp_utils import dispatch_cg_and_sync_dp
from vllm.v1.worker.gpu.ubatch_utils import UBatchRunner, UBatchState
from vllm.v1.worker.ubatch_utils import UBatchSlice


def _parallel(**kwargs) -> SimpleNamespace:
    """What the micro-batching decisions read of a ParallelConfig."""
    fields = dict(
        enable_dbo=True,
        ubatch_size=0,
        data_parallel_size=1,
        tensor_parallel_size=2,
        is_moe_model=False,
        dbo_decode_token_threshold=32,
        dbo_prefill_token_threshold=512,
    )
    fields.update(kwargs)
    config = SimpleNamespace(**fields)
    config.use_ubatching = config.enable_dbo or config.ubatch_size > 1
    config.num_ubatches = 2 if config.enable_dbo else config.ubatch_size
    config.use_tp_ubatching = ParallelConfig.__dict__["use_tp_ubatching"].fget(config)
    return config


# ---------------------------------------------------------------------------
# When micro-batching engages
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({}, True),
        ({"enable_dbo": False}, False),
        ({"tensor_parallel_size": 1}, False),
        ({"data_parallel_size": 2}, False),  # DBO as before: the all-to-all
        ({"is_moe_model": True}, False),
        ({"is_moe_model": None}, False),  # not known to be dense
        ({"enable_dbo": False, "ubatch_size": 3}, True),
    ],
)
def test_use_tp_ubatching(kwargs, expected):
    assert _parallel(**kwargs).use_tp_ubatching is expected


def _dispatch(num_tokens, parallel_config, *, allow_ubatching=True, **kwargs):
    desc, sync = dispatch_cg_and_sync_dp(
        None,
        num_reqs=4,
        num_tokens=num_tokens,
        uniform_token_count=None,
        dp_size=1,
        dp_rank=0,
        need_eager=True,
        parallel_config=parallel_config,
        allow_ubatching=allow_ubatching,
        **kwargs,
    )
    assert sync is None  # no DP handshake
    return desc


def test_tp_batch_splits_at_dbo_prefill_threshold():
    config = _parallel()
    assert _dispatch(511, config).num_ubatches == 1
    desc = _dispatch(512, config)
    assert desc.num_ubatches == 2
    assert desc.cg_mode == CUDAGraphMode.NONE
    assert desc.num_tokens == 512
    config = _parallel(dbo_prefill_token_threshold=4096)
    assert _dispatch(4095, config).num_ubatches == 1
    assert _dispatch(4096, config).num_ubatches == 2


def test_tp_uniform_decode_uses_dbo_decode_threshold():
    config = _parallel()
    assert _dispatch(31, config, uniform_decode=True).num_ubatches == 1
    assert _dispatch(32, config, uniform_decode=True).num_ubatches == 2


def test_tp_batch_not_split_without_a_runner():
    # The model runner allows it only with a micro-batch runner (and never
    # for the memory profile, which skips attention).
    assert _dispatch(8192, _parallel(), allow_ubatching=False).num_ubatches == 1


class _GraphManager:
    """Stands in for CudaGraphManager.dispatch: FULL up to 256 tokens,
    PIECEWISE up to 1024, no graph above."""

    def dispatch(self, num_reqs, num_tokens, uniform_token_count, **kwargs):
        assert kwargs.get("num_ubatches", 1) == 1
        mode = (
            CUDAGraphMode.FULL
            if num_tokens <= 256
            else CUDAGraphMode.PIECEWISE
            if num_tokens <= 1024
            else CUDAGraphMode.NONE
        )
        return BatchExecutionDescriptor(
            cg_mode=mode, num_tokens=num_tokens, num_reqs=num_reqs
        )


@pytest.mark.parametrize(
    "num_tokens, uniform_decode, expected",
    [(64, True, 1), (600, False, 1), (2048, False, 2)],
)
def test_tp_batch_with_a_cuda_graph_stays_whole(num_tokens, uniform_decode, expected):
    """Inside a graph the collectives stay on the capture stream, so a batch
    that has a graph keeps it rather than running as micro-batches."""
    desc, _ = dispatch_cg_and_sync_dp(
        _GraphManager(),
        num_reqs=4,
        num_tokens=num_tokens,
        uniform_token_count=None,
        dp_size=1,
        dp_rank=0,
        parallel_config=_parallel(),
        allow_ubatching=True,
        uniform_decode=uniform_decode,
    )
    assert desc.num_ubatches == expected


def test_runner_built_for_dense_tp_only(monkeypatch):
    built = []

    def stand_in_runner(*args):
        built.append(args)
        return "runner"

    monkeypatch.setattr(gpu_ubatch_utils, "UBatchRunner", stand_in_runner)

    def build(**kwargs):
        vllm_config = SimpleNamespace(parallel_config=_parallel(**kwargs))
        return gpu_ubatch_utils.maybe_build_ubatch_runner(
            vllm_config, torch.device("cpu"), None, [], None, 8
        )

    assert build() == "runner"
    assert build(data_parallel_size=2) == "runner"  # DBO as before
    assert build(tensor_parallel_size=1) is None
    assert build(is_moe_model=True) is None  # no DP: no all-to-all handshake
    assert build(enable_dbo=False) is None
    assert len(built) == 2


def _config_stand_in(fuse_allreduce_rms=False, **kwargs):
    return SimpleNamespace(
        parallel_config=_parallel(
            pipeline_parallel_size=1,
            decode_context_parallel_size=1,
            prefill_context_parallel_size=1,
            **kwargs,
        ),
        lora_config=None,
        speculative_config=None,
        model_config=None,
        compilation_config=SimpleNamespace(
            cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
            pass_config=SimpleNamespace(fuse_allreduce_rms=fuse_allreduce_rms),
        ),
        is_mm_encoder_only=False,
    )


def test_fused_allreduce_rms_rejected_and_off_by_default():
    """The fused all-reduce + RMSNorm would keep its collective on the compute
    stream, beside the micro-batches' collectives on the comm stream."""

    def unsupported(**kwargs):
        return VllmConfig._get_dbo_unsupported_features(_config_stand_in(**kwargs))

    assert unsupported() == []
    assert unsupported(fuse_allreduce_rms=True) == [
        "dual batch overlap of tensor-parallel collectives with fuse_allreduce_rms"
    ]
    # With DP (DBO as before) the fusion is not DBO's concern.
    assert unsupported(fuse_allreduce_rms=True, data_parallel_size=2) == []
    assert enable_allreduce_rms_fusion(_config_stand_in()) is False


# ---------------------------------------------------------------------------
# Which collectives move to the comm stream
# ---------------------------------------------------------------------------


@pytest.fixture
def cpu_streams(monkeypatch):
    """Stream switches and events are no-ops on CPU; the current stream is
    kept per thread so that the tests can see where each call ran, and the
    tensors kept for the compute stream are listed in `kept`."""
    tls = threading.local()
    compute, comm = "compute", "comm"
    kept: list = []

    def current():
        return getattr(tls, "stream", compute)

    monkeypatch.setattr(ubatching, "current_stream", current)
    monkeypatch.setattr(gpu_ubatch_utils, "current_stream", current)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: setattr(tls, "stream", s))
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda device: None)
    for name in (
        "_signal_comm_done",
        "_signal_compute_done",
        "_wait_comm_done",
        "_wait_compute_done",
    ):
        monkeypatch.setattr(ubatching.UBatchContext, name, lambda self: None)
    monkeypatch.setattr(
        ubatching.UBatchContext,
        "keep_for_compute",
        lambda self, tensor: kept.append((tensor, current())),
    )
    return SimpleNamespace(compute=compute, comm=comm, current=current, kept=kept)


class _Communicator:
    """Records each collective: which micro-batch, on which stream."""

    def __init__(self, streams, events, fail=None):
        self.streams, self.events, self.fail = streams, events, fail

    def _record(self, op, x):
        ubatch = ubatching.dbo_current_ubatch_id()
        self.events.append((op, ubatch, self.streams.current()))
        if self.fail == (op, ubatch):
            raise RuntimeError("collective failed")
        return x

    def all_reduce(self, x):
        return self._record("all_reduce", x)

    def all_gather(self, x, dim):
        return self._record("all_gather", x)

    def reduce_scatter(self, x, dim):
        return self._record("reduce_scatter", x)

    def all_gatherv(self, x, dim, sizes):
        return self._record("all_gatherv", x)


def _group(communicator) -> GroupCoordinator:
    group = GroupCoordinator.__new__(GroupCoordinator)
    group.device_communicator = communicator
    return group


def _runner(streams, overlap: bool) -> UBatchRunner:
    """The V2 runner's execution half, as tests/v1/worker/test_ubatching.py
    builds it."""
    runner = UBatchRunner.__new__(UBatchRunner)
    runner.num_ubatches = 2
    runner.device = torch.device("cpu")
    runner.comm_stream = streams.comm
    runner.capture_stream = streams.compute
    runner.ready_barrier = threading.Barrier(3)
    runner.sm_control = nullcontext()
    runner._pending_finish = None
    runner.overlap_device_collectives = overlap
    return runner


def _layered_model(group, streams, events, layers=3):
    """Per layer: compute, an all-reduce, compute, an all-gather and a
    reduce-scatter (as sequence parallelism issues them)."""

    def model(input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        ubatch = ubatching.dbo_current_ubatch_id()
        x = input_ids
        for _ in range(layers):
            events.append(("compute", ubatch, streams.current()))
            x = group._all_reduce_out_place(x + 1)
            x = group._all_gather_out_place(x, 0)
            x = group._reduce_scatter_out_place(x, 0)
        return x

    return model


def _run(runner, model):
    state = UBatchState(
        slices=[
            UBatchSlice(slice(0, 1), slice(0, 2)),
            UBatchSlice(slice(1, 2), slice(2, 4)),
        ],
        forward_contexts=[SimpleNamespace(id=0), SimpleNamespace(id=1)],  # type: ignore[list-item]
    )
    inputs = {
        "input_ids": torch.tensor([0.0, 0.0, 1.0, 1.0]),
        "positions": torch.arange(4),
        "inputs_embeds": None,
        "intermediate_tensors": None,
    }
    return runner.run(model, inputs, state)


def test_tp_collectives_on_comm_stream_interleaved(cpu_streams):
    events: list = []
    group = _group(_Communicator(cpu_streams, events))
    out = _run(
        _runner(cpu_streams, overlap=True), _layered_model(group, cpu_streams, events)
    )
    assert out.tolist() == [3.0, 3.0, 4.0, 4.0]

    collectives = [e for e in events if e[0] != "compute"]
    assert len(collectives) == 2 * 3 * 3
    # Every collective on the comm stream, every compute on the compute one.
    assert {stream for op, _, stream in collectives} == {cpu_streams.comm}
    assert {s for op, _, s in events if op == "compute"} == {cpu_streams.compute}
    # Each collective hands the GPU to the other micro-batch first, so the
    # micro-batches alternate: the same order on every rank.
    assert [ubatch for _, ubatch, _ in collectives] == [0, 1] * 9
    # Micro-batch 1's first layer is enqueued before micro-batch 0's first
    # all-reduce: that compute is what the all-reduce overlaps.
    assert events[:3] == [
        ("compute", 0, cpu_streams.compute),
        ("compute", 1, cpu_streams.compute),
        ("all_reduce", 0, cpu_streams.comm),
    ]
    # Every output made on the comm stream is recorded on the compute stream,
    # once back there, before the caller reads it.
    assert len(cpu_streams.kept) == len(collectives)
    assert {stream for _, stream in cpu_streams.kept} == {cpu_streams.compute}
    assert parallel_state._dbo_collective is None
    assert not ubatching.dbo_enabled()


def test_collectives_stay_put_with_data_parallelism(cpu_streams):
    """DBO with DP overlaps its all-to-all; its TP collectives stay on the
    compute stream and yield nowhere, as before."""
    events: list = []
    group = _group(_Communicator(cpu_streams, events))
    out = _run(
        _runner(cpu_streams, overlap=False), _layered_model(group, cpu_streams, events)
    )
    assert out.tolist() == [3.0, 3.0, 4.0, 4.0]
    assert {stream for _, _, stream in events} == {cpu_streams.compute}
    # Without a yield, micro-batch 0 runs to its end before micro-batch 1.
    assert [ubatch for _, ubatch, _ in events] == [0] * 12 + [1] * 12


def test_no_region_outside_micro_batches(cpu_streams):
    events: list = []
    group = _group(_Communicator(cpu_streams, events))
    assert parallel_state._dbo_collective is None
    group._all_reduce_out_place(torch.ones(2))
    with ubatching.dbo_overlap_device_collectives():
        # Installed, but not in a micro-batch thread: runs where it is.
        group._all_reduce_out_place(torch.ones(2))
    assert events == [("all_reduce", 0, "compute")] * 2
    assert cpu_streams.kept == []  # nothing crossed streams
    assert parallel_state._dbo_collective is None


def test_other_collectives_and_comm_regions_unchanged(cpu_streams):
    """all_gatherv (the DP/EP dispatch) is not moved, and a collective issued
    from a comm region that is already on the comm stream (the naive DP/EP
    dispatch and combine) does not hand off a second time."""
    events: list = []
    group = _group(_Communicator(cpu_streams, events))

    def model(input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        group.all_gatherv(input_ids, 0)
        ubatching.dbo_yield_and_switch_from_compute_to_comm()
        group._all_reduce_out_place(input_ids)
        ubatching.dbo_switch_to_compute_sync()
        return input_ids

    _run(_runner(cpu_streams, overlap=True), model)
    assert sorted(events) == [
        ("all_gatherv", 0, "compute"),
        ("all_gatherv", 1, "compute"),
        ("all_reduce", 0, "comm"),
        ("all_reduce", 1, "comm"),
    ]


@pytest.mark.parametrize("fail_ubatch", [0, 1])
def test_failing_collective_stops_the_other(cpu_streams, fail_ubatch):
    """A micro-batch whose collective fails stops the other at its next
    handoff; the step raises instead of hanging, and the collectives run
    where they are again afterwards."""
    events: list = []
    comm = _Communicator(cpu_streams, events, fail=("all_gather", fail_ubatch))
    runner = _runner(cpu_streams, overlap=True)
    model = _layered_model(_group(comm), cpu_streams, events)
    outcome: dict = {}

    def target():
        try:
            _run(runner, model)
        except BaseException as e:  # noqa: BLE001
            outcome["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the step hung after a failed collective"
    error = outcome["error"]
    assert isinstance(error, RuntimeError)
    assert f"Microbatch {fail_ubatch} of 2" in str(error)
    assert str(error.__cause__) == "collective failed"
    # The other micro-batch issued no collective after the failed one.
    failed_at = events.index(("all_gather", fail_ubatch, "comm"))
    assert all(e[0] == "compute" for e in events[failed_at + 1 :])
    assert parallel_state._dbo_collective is None
    assert not ubatching.dbo_enabled()


# ---------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------


@pytest.fixture
def one_rank_nccl_group():
    import torch.distributed as dist

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    created = False
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl",
            store=dist.HashStore(),
            rank=0,
            world_size=1,
            device_id=torch.device("cuda", 0),
        )
        created = True
    yield dist.group.WORLD
    if created and dist.is_initialized():
        dist.destroy_process_group()


class _NcclCommunicator:
    def __init__(self, group):
        self.group = group

    def all_reduce(self, x):
        import torch.distributed as dist

        out = x.clone()
        dist.all_reduce(out, group=self.group)
        return out


class _StandInLayer(nn.Module):
    """A dense TP layer's MLP without attention: column-parallel up,
    row-parallel down with its all-reduce, residual and RMSNorm. With `delay`,
    the stream that reads the all-reduce's output first spins that many
    cycles: the comm stream then runs ahead of the reads, as it does when
    another process holds the GPU."""

    def __init__(self, hidden, inter, group, delay=0):
        super().__init__()
        self.up = nn.Linear(hidden, inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)
        self.norm = nn.RMSNorm(hidden, eps=1e-6)
        self.group = group
        self.delay = delay

    def forward(self, x):
        y = self.down(torch.nn.functional.gelu(self.up(x)))
        reduced = self.group._all_reduce_out_place(y)
        if self.delay:
            torch.cuda._sleep(self.delay)
        return self.norm(x + reduced)


@torch.inference_mode()
def test_gpu_micro_batches_bit_identical(one_rank_nccl_group):
    """On one GPU: two micro-batches whose all-reduces (a one-rank NCCL group)
    run on DBO's comm stream give the bits of the same two halves run one
    after the other, and the whole batch's where its GEMMs round alike, also
    when the compute stream lags behind the comm stream (the caching
    allocator must not hand an all-reduce's output to the other micro-batch's
    before it is read). Prints the peak memory of the whole batch and of the
    micro-batches."""
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    torch.accelerator.set_device_index(0)
    group = _group(_NcclCommunicator(one_rank_nccl_group))
    layers = nn.Sequential(
        *(_StandInLayer(2048, 8192, group, delay=2_000_000) for _ in range(8))
    )
    model_ = layers.to(device).half()

    def model(input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        return model_(input_ids)

    x = torch.randn(8192, 2048, device=device, dtype=torch.float16)
    split = x.shape[0] // 2

    torch.accelerator.synchronize()
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    whole = model_(x)
    torch.accelerator.synchronize()
    whole_peak = torch.accelerator.max_memory_allocated() - base
    sequential = torch.cat([model_(x[:split]), model_(x[split:])])

    runner = UBatchRunner.__new__(UBatchRunner)
    runner.num_ubatches = 2
    runner.device = device
    runner.comm_stream = torch.cuda.Stream(device)
    runner.capture_stream = torch.cuda.current_stream()
    runner.ready_barrier = threading.Barrier(3)
    runner.sm_control = nullcontext()
    runner._pending_finish = None
    runner.overlap_device_collectives = True
    state = UBatchState(
        slices=[
            UBatchSlice(slice(0, 1), slice(0, split)),
            UBatchSlice(slice(1, 2), slice(split, x.shape[0])),
        ],
        forward_contexts=[None, None],  # type: ignore[list-item]
    )
    inputs = {"input_ids": x, "positions": torch.arange(x.shape[0], device=device)}
    torch.accelerator.synchronize()
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    micro = runner.run(model, inputs, state)
    torch.accelerator.synchronize()
    micro_peak = torch.accelerator.max_memory_allocated() - base
    print(
        f"peak above inputs: whole batch {whole_peak / 2**20:.1f} MiB, "
        f"micro-batches {micro_peak / 2**20:.1f} MiB"
    )
    assert torch.equal(micro, sequential)
    if torch.equal(sequential, whole):
        assert torch.equal(micro, whole)
    else:
        # GEMMs that round differently for M and M / 2: the split changes the
        # bits here, not the overlap.
        torch.testing.assert_close(micro, whole, atol=2e-2, rtol=2e-2)


def _write_random_qwen3(path, seed=0):
    """A small Qwen3 checkpoint with random weights at the scale of a trained
    model (std 0.02, norms 1), so that a different greedy token is a real
    difference rather than a near tie."""
    import json

    from safetensors.torch import save_file

    hidden, inter, vocab, layers = 1024, 2816, 4096, 4
    heads, kv_heads, head_dim = 8, 2, 128
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "torch_dtype": "float16",
        "tie_word_embeddings": False,
    }
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (hidden,)
        shapes[p + "post_attention_layernorm.weight"] = (hidden,)
        shapes[p + "self_attn.q_proj.weight"] = (heads * head_dim, hidden)
        shapes[p + "self_attn.k_proj.weight"] = (kv_heads * head_dim, hidden)
        shapes[p + "self_attn.v_proj.weight"] = (kv_heads * head_dim, hidden)
        shapes[p + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
        shapes[p + "self_attn.q_norm.weight"] = (head_dim,)
        shapes[p + "self_attn.k_norm.weight"] = (head_dim,)
        shapes[p + "mlp.gate_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.up_proj.weight"] = (inter, hidden)
        shapes[p + "mlp.down_proj.weight"] = (hidden, inter)
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        name: torch.ones(shape, dtype=torch.float16)
        if name.endswith("norm.weight")
        else (torch.randn(shape, generator=gen) * 0.02).half()
        for name, shape in shapes.items()
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    return vocab


requires_two_gpus = pytest.mark.skipif(
    torch.accelerator.device_count() < 2, reason="needs two GPUs (TP=2)"
)


@requires_two_gpus
def test_gpu_tp2_greedy_identical_with_dbo_eager(tmp_path):
    _tp2_greedy_with_and_without_dbo(tmp_path, enforce_eager=True)


@requires_two_gpus
def test_gpu_tp2_greedy_identical_with_dbo_compiled(tmp_path):
    """The prefill chunks run the compiled graph from the micro-batch threads;
    decode runs whole, in CUDA graphs. The fused all-reduce + RMSNorm, off by
    default with DBO here, is off in both runs so that they compute alike."""
    _tp2_greedy_with_and_without_dbo(
        tmp_path,
        enforce_eager=False,
        compilation_config={"pass_config": {"fuse_allreduce_rms": False}},
    )


def _tp2_greedy_with_and_without_dbo(tmp_path, enforce_eager, **kwargs):
    """Greedy outputs at TP=2 with and without --enable-dbo on a small
    random-weight Qwen3 written here: prompts of about 2.5k tokens in
    2048-token chunks, so that the prefill chunks run as two micro-batches
    with a request cut between them. Run it with NCCL_P2P_DISABLE=1 for the
    path without peer access."""
    from vllm import LLM, SamplingParams
    from vllm.distributed import cleanup_dist_env_and_memory

    vocab = _write_random_qwen3(tmp_path / "model")
    rng = np.random.default_rng(0)
    prompts = [
        {"prompt_token_ids": rng.integers(3, vocab, size=n).tolist()}
        for n in (2500, 2600, 700)
    ]
    params = SamplingParams(
        temperature=0.0, max_tokens=32, ignore_eos=True, detokenize=False
    )
    outputs = {}
    for enable_dbo in (False, True):
        llm = LLM(
            model=str(tmp_path / "model"),
            skip_tokenizer_init=True,
            tensor_parallel_size=2,
            enforce_eager=enforce_eager,
            enable_dbo=enable_dbo,
            max_num_batched_tokens=2048,
            max_model_len=4096,
            gpu_memory_utilization=0.3,
            disable_custom_all_reduce=True,
            **kwargs,
        )
        assert llm.llm_engine.vllm_config.parallel_config.use_tp_ubatching is (
            enable_dbo
        )
        outputs[enable_dbo] = [
            list(o.outputs[0].token_ids) for o in llm.generate(prompts, params)
        ]
        del llm
        cleanup_dist_env_and_memory()
    assert all(len(o) == 32 for o in outputs[False])
    assert outputs[False] == outputs[True]
