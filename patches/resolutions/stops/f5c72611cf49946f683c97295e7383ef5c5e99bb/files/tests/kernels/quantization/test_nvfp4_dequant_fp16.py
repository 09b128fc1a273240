# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""NVFP4 weight-only linear, Marlin or fp16 dequantization + cuBLAS by batch
size (DequantFp16NvFp4LinearKernel): selection and route.

On the CPU, with the platform mocked per compute capability: the kernel is
selected on SM75 once kernel_config.nvfp4_dequant_min_tokens opts in (also
for weight-only checkpoints; Marlin stays the default there), elsewhere only
through --linear-backend dequant_fp16 or the scheme's own entry of
linear_backend_per_quant, and never without Marlin FP4 (below SM75); the op
sends batches below kernel_config.nvfp4_dequant_min_tokens to Marlin and the
others to the dequantization, also inside a graph compiled once for a
dynamic batch size.

On one GPU: the same under torch.compile (inductor) with the real kernels:
decode stays on Marlin after a prefill-sized warm-up. On two GPUs: greedy
decoding at TP=2 of an NVFP4 checkpoint the test writes (random weights,
nothing downloaded), with the dequantization route against Marlin alone.
"""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import vllm.config
from vllm.config import KernelConfig
from vllm.model_executor.kernels import linear as linear_kernels
from vllm.model_executor.kernels.linear import (
    DequantFp16NvFp4LinearKernel,
    MarlinNvFp4LinearKernel,
    NvFp4LinearLayerConfig,
    init_nvfp4_linear_kernel,
)
from vllm.model_executor.kernels.linear.nvfp4 import dequant_fp16
from vllm.model_executor.layers.quantization.utils import marlin_utils_fp4
from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum


def _cuda_platform(capability: tuple[int, int]) -> Platform:
    class FakeCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*capability)

    return FakeCuda()


@pytest.fixture
def platform(monkeypatch):
    """Set the (mocked CUDA) capability and the kernel config seen by the
    selection; returns the setter."""

    def set_platform(capability, **kernel_config):
        fake = _cuda_platform(capability)
        for module in (dequant_fp16, marlin_utils_fp4, linear_kernels):
            monkeypatch.setattr(module, "current_platform", fake)
        config = SimpleNamespace(kernel_config=KernelConfig(**kernel_config))
        monkeypatch.setattr(
            vllm.config, "get_current_vllm_config_or_none", lambda: config
        )

    return set_platform


OPT_IN = {"nvfp4_dequant_min_tokens": 128}


@pytest.mark.parametrize(
    "capability, backend, kernel_config, expected",
    [
        # Turing: Marlin unless the route is opted in.
        ((7, 5), "auto", {}, MarlinNvFp4LinearKernel),
        ((7, 5), "auto", OPT_IN, DequantFp16NvFp4LinearKernel),
        ((8, 0), "auto", OPT_IN, MarlinNvFp4LinearKernel),
        ((9, 0), "auto", OPT_IN, MarlinNvFp4LinearKernel),
        ((9, 0), "dequant_fp16", OPT_IN, DequantFp16NvFp4LinearKernel),
        ((7, 5), "dequant_fp16", {}, DequantFp16NvFp4LinearKernel),
        ((7, 5), "marlin", OPT_IN, MarlinNvFp4LinearKernel),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_selection_per_capability(
    platform, capability, backend, kernel_config, expected
):
    platform(capability, linear_backend=backend, **kernel_config)
    assert type(init_nvfp4_linear_kernel()) is expected
    # Weight-only checkpoints (CT W4A16, ModelOpt W4A16_NVFP4) take the same
    # (on SM90 "auto" prefers Humming for them, where it is built).
    if capability != (9, 0) or backend != "auto":
        assert type(init_nvfp4_linear_kernel(use_a16=True)) is expected


@pytest.mark.parametrize("quant", ["nvfp4_w4a4", "nvfp4_w4a16"])
def test_selection_by_a_per_scheme_override(platform, quant):
    platform((9, 0), linear_backend_per_quant={quant: "dequant_fp16"}, **OPT_IN)
    kernel = init_nvfp4_linear_kernel(use_a16=quant == "nvfp4_w4a16")
    assert type(kernel) is DequantFp16NvFp4LinearKernel


@pytest.mark.parametrize("capability", [(8, 0), (9, 0)])
def test_a_per_scheme_override_selects_for_that_scheme_only(platform, capability):
    """Naming the backend for weight-only NVFP4 layers must not select it
    for the W4A4 layers of the same model (those keep "auto")."""
    platform(capability, linear_backend_per_quant={"nvfp4_w4a16": "dequant_fp16"})
    assert type(init_nvfp4_linear_kernel()) is MarlinNvFp4LinearKernel
    assert not DequantFp16NvFp4LinearKernel.selected_by_default()


@pytest.mark.parametrize(
    "capability, kernel_config, selected",
    [
        ((7, 0), OPT_IN, False),
        ((7, 5), {}, False),
        ((7, 5), OPT_IN, True),
        ((8, 6), OPT_IN, False),
        ((9, 0), OPT_IN, False),
    ],
)
def test_selected_by_default(platform, capability, kernel_config, selected):
    platform(capability, **kernel_config)
    assert DequantFp16NvFp4LinearKernel.selected_by_default() is selected
    # Weight-only checkpoints (CT W4A16, ModelOpt W4A16_NVFP4) alike.
    if selected:
        kernel = init_nvfp4_linear_kernel(use_a16=True)
        assert type(kernel) is DequantFp16NvFp4LinearKernel


@pytest.mark.parametrize("capability", [(6, 1), (7, 0)])
def test_not_supported_without_marlin(platform, capability):
    platform(capability, linear_backend="dequant_fp16", **OPT_IN)
    supported, reason = DequantFp16NvFp4LinearKernel.is_supported()
    assert not supported and reason is not None and "Marlin" in reason
    with pytest.raises(ValueError, match="needs Marlin FP4"):
        init_nvfp4_linear_kernel()


def test_config_field():
    # Opt-in on Turing: Marlin serves every batch by default.
    assert KernelConfig().nvfp4_dequant_min_tokens == 0
    with pytest.raises(ValueError):
        KernelConfig(nvfp4_dequant_min_tokens=-1)
    # Compiled graphs pass it to the op as a constant: a compile factor.
    assert (
        KernelConfig().compile_factors()
        != KernelConfig(nvfp4_dequant_min_tokens=512).compile_factors()
    )


# --- the route inside the op (stand-in kernels) ----------------------------

# The op is registered for the platform's dispatch key (CUDA on a GPU
# machine, CPU elsewhere): its inputs live there.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def routes(monkeypatch):
    """Replace Marlin's GEMM, Marlin's weight preparation and the Triton
    dequantization by recorders; returns the list of routes taken."""
    taken = []

    def marlin_gemm(input, size_n, **kwargs):
        taken.append("marlin")
        return input.new_zeros(*input.shape[:-1], size_n)

    def dequantize(weight, weight_scale, global_scale, size_n, size_k):
        taken.append("dequant")
        return torch.zeros(size_n, size_k, device=weight.device)

    def prepare(layer):
        layer.weight_global_scale = torch.nn.Parameter(
            layer.weight_global_scale.data * 128, requires_grad=False
        )

    monkeypatch.setattr(dequant_fp16, "apply_fp4_marlin_linear", marlin_gemm)
    monkeypatch.setattr(dequant_fp16, "dequantize_weight", dequantize)
    monkeypatch.setattr(dequant_fp16, "prepare_fp4_layer_for_marlin", prepare)
    return taken


def _layer(n=128, k=256, dtype=torch.float16):
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(
        torch.zeros(n, k // 2, dtype=torch.uint8, device=DEVICE), requires_grad=False
    )
    layer.weight_scale = torch.nn.Parameter(
        torch.zeros(n, k // 16, dtype=torch.uint8, device=DEVICE).view(
            torch.float8_e4m3fn
        ),
        requires_grad=False,
    )
    layer.weight_global_scale = torch.nn.Parameter(
        torch.tensor(0.5, device=DEVICE), requires_grad=False
    )
    layer.output_size_per_partition = n
    layer.input_size_per_partition = k
    layer.params_dtype = dtype
    layer.bias = None
    return layer


def _prepared(platform, capability, dtype=torch.float16, **kernel_config):
    platform(capability, **kernel_config)
    kernel = DequantFp16NvFp4LinearKernel(NvFp4LinearLayerConfig())
    layer = _layer(dtype=dtype)
    kernel.process_weights_after_loading(layer)
    return kernel, layer


TOKENS = (1, 8, 127, 128, 2048)


@pytest.mark.parametrize(
    "capability, kernel_config, dtype, expected",
    [
        ((7, 5), OPT_IN, torch.float16, ["marlin"] * 3 + ["dequant"] * 2),
        (
            (9, 0),
            {"linear_backend": "dequant_fp16", **OPT_IN},
            torch.float16,
            ["marlin"] * 3 + ["dequant"] * 2,
        ),
        (
            (7, 5),
            {"nvfp4_dequant_min_tokens": 8},
            torch.float16,
            ["marlin"] + ["dequant"] * 4,
        ),
        ((7, 5), {"nvfp4_dequant_min_tokens": 0}, torch.float16, ["marlin"] * 5),
        ((7, 5), OPT_IN, torch.bfloat16, ["marlin"] * 5),
    ],
    ids=[
        "sm75",
        "sm90-named",
        "sm75-min8",
        "sm75-off",
        "sm75-bf16",
    ],
)
def test_route_per_capability(
    platform, routes, capability, kernel_config, dtype, expected
):
    kernel, layer = _prepared(platform, capability, dtype, **kernel_config)
    for m in TOKENS:
        out = kernel.apply_weights(layer, torch.zeros(m, 256, device=DEVICE))
        assert out.shape == (m, 128)
    assert routes == expected


def test_checkpoint_global_scale_kept(platform, routes):
    # Marlin rescales its global scale; the dequantization keeps the
    # checkpoint's.
    _, layer = _prepared(platform, (7, 5))
    assert layer.weight_global_scale.item() == 64.0
    assert layer.nvfp4_global_scale.item() == 0.5


def test_compiled_graph_keeps_the_route(platform, routes):
    """One graph compiled for a dynamic batch size serves both routes: the
    branch runs inside the op at every call."""
    kernel, layer = _prepared(platform, (7, 5), **OPT_IN)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fn = torch.compile(
        lambda x: kernel.apply_weights(layer, x) * 2,
        backend=backend,
        dynamic=True,
        fullgraph=True,
    )
    for m in (2048, 4, 300, 8):
        assert fn(torch.zeros(m, 256, device=DEVICE)).shape == (m, 128)
    assert routes == ["dequant", "marlin", "dequant", "marlin"]
    assert len(graphs) == 1


@pytest.mark.parametrize("m", [8, 512])
def test_op_contract(platform, routes, m):
    """The op's schema, fake implementation and dispatch (opcheck), on both
    routes, with the stand-in kernels."""
    kernel, layer = _prepared(platform, (7, 5), **OPT_IN)
    args = (
        torch.zeros(m, 256, device=DEVICE),
        layer.weight,
        layer.weight_scale.view(torch.uint8),
        layer.nvfp4_global_scale,
        layer.weight_global_scale,
        None,
        None,
        128,
        256,
        kernel.min_tokens,
    )
    torch.library.opcheck(torch.ops.vllm.nvfp4_dequant_fp16_linear.default, args)


# --- GPU --------------------------------------------------------------------


def _marlin_gpu_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() < (7, 5):
        return "needs compute capability 7.5 or higher (Marlin FP4)"
    return None


@pytest.mark.skipif(
    _marlin_gpu_skip_reason() is not None, reason=str(_marlin_gpu_skip_reason())
)
def test_gpu_compiled_decode_stays_on_marlin(monkeypatch):
    """torch.compile (inductor, dynamic batch size) warmed up on a prefill
    batch: decode batches afterwards run Marlin, prefill batches the
    dequantization, and each gives the bits of the uncompiled op."""
    config = SimpleNamespace(
        kernel_config=KernelConfig(
            linear_backend="dequant_fp16", nvfp4_dequant_min_tokens=64
        )
    )
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: config)
    n, k = 5120, 8704
    gen = torch.Generator().manual_seed(0)
    weight = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0x30, 0x48, (n, k // 16), dtype=torch.uint8, generator=gen)
    layer = _layer(n, k)
    layer.weight.data = weight.cuda()
    layer.weight_scale.data = scales.cuda().view(torch.float8_e4m3fn)
    layer.weight_global_scale.data = torch.tensor(0.01, device="cuda")
    kernel = DequantFp16NvFp4LinearKernel(NvFp4LinearLayerConfig())
    kernel.process_weights_after_loading(layer)
    assert kernel.min_tokens == 64

    taken = []

    def recording(name, fn):
        def run(*args, **kwargs):
            taken.append(name)
            return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(
        dequant_fp16,
        "apply_fp4_marlin_linear",
        recording("marlin", dequant_fp16.apply_fp4_marlin_linear),
    )
    monkeypatch.setattr(
        dequant_fp16,
        "dequantize_weight",
        recording("dequant", dequant_fp16.dequantize_weight),
    )

    def forward(x):
        return kernel.apply_weights(layer, x)

    compiled = torch.compile(forward, dynamic=True, fullgraph=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for m in (1024, 1, 8, 63, 64, 2048):
        x = torch.randn(m, k, generator=gen, device="cuda", dtype=torch.float16)
        out = compiled(x)
        ref = forward(x)
        assert torch.equal(out, ref), m
        route = "dequant" if m >= 64 else "marlin"
        assert taken[-2:] == [route, route], (m, taken)


@pytest.mark.skipif(
    _marlin_gpu_skip_reason() is not None, reason=str(_marlin_gpu_skip_reason())
)
@pytest.mark.parametrize("m", [4, 256])
def test_gpu_op_contract(monkeypatch, m):
    """The op under opcheck with the real kernels: Marlin (4 tokens) and the
    dequantization (256 tokens), with a bias."""
    config = SimpleNamespace(
        kernel_config=KernelConfig(
            linear_backend="dequant_fp16", nvfp4_dequant_min_tokens=64
        )
    )
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: config)
    n, k = 256, 512
    gen = torch.Generator().manual_seed(m)
    layer = _layer(n, k)
    layer.weight.data = torch.randint(
        0, 256, (n, k // 2), dtype=torch.uint8, generator=gen
    ).cuda()
    layer.weight_scale.data = (
        torch.randint(0x30, 0x48, (n, k // 16), dtype=torch.uint8, generator=gen)
        .cuda()
        .view(torch.float8_e4m3fn)
    )
    layer.weight_global_scale.data = torch.tensor(0.01, device="cuda")
    layer.bias = torch.nn.Parameter(
        torch.randn(n, generator=gen).half().cuda(), requires_grad=False
    )
    kernel = DequantFp16NvFp4LinearKernel(NvFp4LinearLayerConfig())
    kernel.process_weights_after_loading(layer)
    x = torch.randn(m, k, generator=gen).half().cuda()
    args = (
        x,
        layer.weight,
        layer.weight_scale.view(torch.uint8),
        layer.nvfp4_global_scale,
        layer.weight_global_scale,
        layer.bias,
        layer.nvfp4_dequant_bias,
        n,
        k,
        kernel.min_tokens,
    )
    torch.library.opcheck(torch.ops.vllm.nvfp4_dequant_fp16_linear.default, args)
    # Both routes apply the same bias: against F.linear on the dequantized
    # weight, Marlin within its rounding, the dequantization exactly.
    w = dequant_fp16.dequantize_weight(
        layer.weight, layer.weight_scale, layer.nvfp4_global_scale, n, k
    )
    out = torch.ops.vllm.nvfp4_dequant_fp16_linear(*args)
    ref = torch.nn.functional.linear(x, w, args[6])
    if m >= 64:
        assert torch.equal(out, ref)
    else:
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def _write_nvfp4_qwen3(path, seed=0):
    """A small Qwen3 checkpoint in ModelOpt's NVFP4 format (config.json
    quantization_config, quant_algo NVFP4): every linear of the decoder
    layers as random FP4 codes with e4m3 block scales in [1, 2) and a global
    scale that gives the weights a trained model's spread (std about 0.02);
    embeddings, norms and lm_head in fp16."""
    from safetensors.torch import save_file

    hidden, inter, vocab, layers = 1024, 2816, 4096, 4
    heads, kv_heads, head_dim = 8, 2, 128  # 4 / 1 per rank at TP=2
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
        "quantization_config": {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "group_size": 16,
            "ignore": ["lm_head"],
        },
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        "model.embed_tokens.weight": (
            torch.randn(vocab, hidden, generator=gen) * 0.02
        ).half(),
        "model.norm.weight": torch.ones(hidden, dtype=torch.float16),
        "lm_head.weight": (torch.randn(vocab, hidden, generator=gen) * 0.02).half(),
    }
    # e2m1 codes drawn uniformly have an rms of about 2.93; scales in [1, 2)
    # average about 1.45.
    global_scale = torch.tensor(0.02 / (2.93 * 1.45), dtype=torch.float32)
    linears = {
        "self_attn.q_proj": (heads * head_dim, hidden),
        "self_attn.k_proj": (kv_heads * head_dim, hidden),
        "self_attn.v_proj": (kv_heads * head_dim, hidden),
        "self_attn.o_proj": (hidden, heads * head_dim),
        "mlp.gate_proj": (inter, hidden),
        "mlp.up_proj": (inter, hidden),
        "mlp.down_proj": (hidden, inter),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = torch.ones(hidden, dtype=torch.float16)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(
            hidden, dtype=torch.float16
        )
        tensors[p + "self_attn.q_norm.weight"] = torch.ones(
            head_dim, dtype=torch.float16
        )
        tensors[p + "self_attn.k_norm.weight"] = torch.ones(
            head_dim, dtype=torch.float16
        )
        for name, (n, k) in linears.items():
            tensors[p + name + ".weight"] = torch.randint(
                0, 256, (n, k // 2), dtype=torch.uint8, generator=gen
            )
            scale_bytes = torch.randint(
                0x38, 0x40, (n, k // 16), dtype=torch.uint8, generator=gen
            )
            tensors[p + name + ".weight_scale"] = scale_bytes.view(torch.float8_e4m3fn)
            tensors[p + name + ".weight_scale_2"] = global_scale.clone()
            tensors[p + name + ".input_scale"] = torch.tensor(1.0)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"))
    return vocab


def check_greedy_agrees(reference, other, tolerance=0.05):
    """Greedy runs of the same prompts: each step's chosen token has the same
    log-probability in both (within `tolerance`) until they part, and they
    may only part where the reference's best two tokens are that close.
    Each run is a list of (token ids, [{token: logprob} per step])."""
    for (ids_a, lps_a), (ids_b, lps_b) in zip(reference, other, strict=True):
        assert len(ids_a) == len(ids_b)
        for step, (a, b) in enumerate(zip(ids_a, ids_b)):
            if a != b:
                best = sorted(lps_a[step].values(), reverse=True)
                assert len(best) > 1 and best[0] - best[1] < tolerance, (
                    f"step {step}: {a} vs {b}, not a near tie in the reference "
                    f"(top-2 log-probabilities {best[:2]})"
                )
                break
            assert abs(lps_a[step][a] - lps_b[step][b]) < tolerance, (
                f"step {step}: log-probability of {a}: "
                f"{lps_a[step][a]} vs {lps_b[step][b]}"
            )


def test_check_greedy_agrees():
    same = [([5, 6], [{5: -0.1, 7: -3.0}, {6: -0.2, 8: -2.0}])]
    check_greedy_agrees(same, same)
    tie = [([5, 6], [{5: -0.1, 7: -3.0}, {6: -0.70, 8: -0.71}])]
    check_greedy_agrees(tie, [([5, 8], [{5: -0.1}, {8: -0.70}])])
    with pytest.raises(AssertionError, match="not a near tie"):
        check_greedy_agrees(same, [([5, 8], [{5: -0.1}, {8: -0.5}])])
    with pytest.raises(AssertionError, match="log-probability of 5"):
        check_greedy_agrees(same, [([5, 6], [{5: -0.9}, {6: -0.2}])])


def _ids_and_logprobs(output) -> tuple[list[int], list[dict[int, float]]]:
    completion = output.outputs[0]
    assert completion.logprobs is not None
    return (
        list(completion.token_ids),
        [{t: lp.logprob for t, lp in step.items()} for step in completion.logprobs],
    )


@pytest.mark.skipif(
    torch.accelerator.device_count() < 2, reason="needs two CUDA GPUs (TP=2)"
)
@pytest.mark.parametrize("enforce_eager", [True, False], ids=["eager", "compiled"])
def test_gpu_tp2_greedy_dequant_against_marlin(
    monkeypatch, tmp_path, capfd, enforce_eager
):
    """Greedy decoding at TP=2, fp16, of the NVFP4 checkpoint written here:
    --linear-backend marlin against dequant_fp16 with a threshold of 64
    tokens, so that the prompts' prefill dequantizes and decode runs Marlin.
    Token ids identical, or log-probabilities agreeing until a near tie."""
    from vllm import LLM, SamplingParams
    from vllm.distributed import cleanup_dist_env_and_memory

    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    vocab = _write_nvfp4_qwen3(tmp_path / "model")
    rng = np.random.default_rng(0)
    prompts = [
        {"prompt_token_ids": rng.integers(3, vocab, size=n).tolist()}
        for n in (700, 300, 1500)
    ]
    params = SamplingParams(
        temperature=0.0, max_tokens=32, ignore_eos=True, detokenize=False, logprobs=2
    )
    runs, logs = {}, {}
    for backend in ("marlin", "dequant_fp16"):
        llm = LLM(
            model=str(tmp_path / "model"),
            skip_tokenizer_init=True,
            tensor_parallel_size=2,
            dtype="float16",
            enforce_eager=enforce_eager,
            max_num_batched_tokens=2048,
            max_model_len=4096,
            gpu_memory_utilization=0.3,
            # The pair the kernel is for has no peer access (the custom
            # all-reduce reaches the peer through CUDA IPC).
            disable_custom_all_reduce=True,
            kernel_config={
                "linear_backend": backend,
                "nvfp4_dequant_min_tokens": 64,
            },
        )
        runs[backend] = [_ids_and_logprobs(o) for o in llm.generate(prompts, params)]
        del llm
        cleanup_dist_env_and_memory()
        log = capfd.readouterr()
        logs[backend] = log.out + log.err
    assert "Using DequantFp16NvFp4LinearKernel" in logs["dequant_fp16"]
    assert "NVFP4 dequant_fp16: a batch of" in logs["dequant_fp16"]
    assert "NVFP4 dequant_fp16" not in logs["marlin"]
    assert all(len(ids) == 32 for ids, _ in runs["marlin"])
    ids = {b: [r[0] for r in run] for b, run in runs.items()}
    with capfd.disabled():
        print(f"greedy ids identical: {ids['marlin'] == ids['dequant_fp16']}")
    if ids["marlin"] != ids["dequant_fp16"]:
        check_greedy_agrees(runs["marlin"], runs["dequant_fp16"])
