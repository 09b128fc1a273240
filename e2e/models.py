"""Local models for the A/B harness, written here: nothing is downloaded.

``seed`` is shaped like the seed's per-rank work where it matters: hidden
5120, head dim 256, 24 query / 4 KV heads (12 / 2 per rank at TP=2), the
Qwen3 architecture (transformers' Llama config refuses hidden 5120 with 24
heads). ``small`` keeps those shapes with few layers, for quick checks.

The weights are written as a safetensors checkpoint at a trained model's
scale: every norm 1, every other tensor normal with std 0.02, each from a
generator seeded by its name (the same model in every boot and arm). vLLM's
dummy loader fills uniform +-1e-3, which makes the logits so flat that any
rounding flips a greedy choice and the greedy comparison says nothing.

    python3 e2e/models.py --write seed [--layers N]   # once per machine (~12 GB)
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from pathlib import Path

ROOT = Path("/tmp/e2e-models")
TRAINED_STD = 0.02
SEED = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "vocab_size": 32000,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "torch_dtype": "float16",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# Head dim 128 (a Qwen3-8B layer: 32 query / 8 KV heads), for the time to first
# token through the engine (bench/prefill_ttft.py).
HD128 = dict(
    SEED,
    hidden_size=4096,
    intermediate_size=12288,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
)
BASES = {"seed": SEED, "small": SEED, "hd128": HD128}
LAYERS = {"seed": 16, "small": 4, "hd128": 8}
CHUNK = 2048  # the harness's max_num_batched_tokens


def config(name: str, layers: int | None, base: dict | None = None) -> dict:
    return dict(base or BASES[name], num_hidden_layers=layers or LAYERS[name])


def folder(name: str, layers: int | None, root: Path = ROOT) -> Path:
    return root / f"{name}-{config(name, layers)['num_hidden_layers']}l"


def write(name: str, layers: int | None, root: Path = ROOT) -> Path:
    """The model's folder with its config.json (the weights: write_weights)."""
    cfg = config(name, layers)
    d = folder(name, layers, root)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return d


def shapes(cfg: dict) -> dict[str, dict[str, tuple[int, ...]]]:
    """Shard file -> tensor name -> shape, in the Hugging Face Qwen3 layout
    (one shard per layer, one for the rest)."""
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd, nq, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = {
        "rest.safetensors": {
            "model.embed_tokens.weight": (vocab, h),
            "model.norm.weight": (h,),
            "lm_head.weight": (vocab, h),
        }
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[f"layer-{i:03d}.safetensors"] = {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (nq * hd, h),
            p + "self_attn.k_proj.weight": (nkv * hd, h),
            p + "self_attn.v_proj.weight": (nkv * hd, h),
            p + "self_attn.o_proj.weight": (h, nq * hd),
            p + "self_attn.q_norm.weight": (hd,),
            p + "self_attn.k_norm.weight": (hd,),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    return out


def is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def spec(cfg: dict, std: float) -> dict:
    """What the written weights are; a folder whose record differs is rewritten."""
    return {
        "std": std,
        "norms": 1.0,
        "dtype": "float16",
        "seeded_by": "crc32 of the name",
        "config": cfg,
    }


def tensor(name: str, shape: tuple[int, ...], std: float, device: str):
    import torch

    if is_norm(name):
        return torch.ones(shape, dtype=torch.float16)
    gen = torch.Generator(device=device)
    gen.manual_seed(zlib.crc32(name.encode()))
    t = torch.empty(shape, dtype=torch.float32, device=device)
    return t.normal_(0.0, std, generator=gen).to(torch.float16).cpu()


def write_weights(d: Path, std: float = TRAINED_STD, device: str | None = None, log=print) -> dict:
    """Write the checkpoint of ``d``'s config.json once; return its record
    (weights.json: what was written, the std measured on lm_head)."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((d / "config.json").read_text())
    marker = d / "weights.json"
    want = spec(cfg, std)
    if marker.is_file() and json.loads(marker.read_text()).get("spec") == want:
        return json.loads(marker.read_text())
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    start = time.perf_counter()
    weight_map, total, lm_std = {}, 0, None
    for shard, tensors in shapes(cfg).items():
        data = {n: tensor(n, s, std, device) for n, s in tensors.items()}
        save_file(data, str(d / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(data, shard))
        total += sum(t.numel() * t.element_size() for t in data.values())
        if shard == "rest.safetensors":
            lm_std = float(data["lm_head.weight"].float().std())
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    record = {
        "spec": want,
        "bytes": total,
        "lm_head_std": lm_std,
        "seconds": time.perf_counter() - start,
    }
    marker.write_text(json.dumps(record, indent=2, sort_keys=True))
    log(
        f"weights: {d} ({total / 2**30:.1f} GiB, {record['seconds']:.0f} s, "
        f"lm_head std {lm_std:.4f})"
    )
    return record


def prompt(length: int, seed: int) -> list[int]:
    """Fixed pseudo-random token ids: the same prompt in every boot and arm."""
    return [((i + 131 * seed) * 7919) % 31000 + 3 for i in range(length)]


def chunks(length: int) -> int:
    return -(-length // CHUNK)


# (name, length) of the prefill prompts: four of about 29k tokens, one of 100k.
PREFILL = [("29k-a", 29167), ("29k-b", 29201), ("29k-c", 29243), ("29k-d", 29188), ("100k", 100000)]
# (name, length) of the greedy prompts: short ones, and two long enough that
# their 2048-token chunks are prefill batches an overlap arm splits.
GREEDY = [("g18", 18), ("g52", 52), ("g3000", 3000), ("g5000", 5000)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--write", required=True, choices=sorted(LAYERS))
    p.add_argument("--layers", type=int)
    p.add_argument("--root", type=Path, default=ROOT)
    a = p.parse_args()
    record = write_weights(write(a.write, a.layers, a.root))
    print("WEIGHTS " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
