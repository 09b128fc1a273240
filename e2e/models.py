"""Local model configs for the A/B harness: dummy weights, nothing downloaded.

``seed`` is shaped like the seed's per-rank work where it matters: hidden
5120, head dim 256, 24 query / 4 KV heads (12 / 2 per rank at TP=2), the
Qwen3 architecture (transformers' Llama config refuses hidden 5120 with 24
heads). ``small`` keeps those shapes with few layers, for quick checks.
"""

from __future__ import annotations

import json
from pathlib import Path

SEED = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
    "intermediate_size": 17408, "num_attention_heads": 24, "num_key_value_heads": 4,
    "head_dim": 256, "vocab_size": 32000, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "float16",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}
LAYERS = {"seed": 16, "small": 4}


def write(name: str, layers: int | None, root: Path) -> Path:
    cfg = dict(SEED, num_hidden_layers=layers or LAYERS[name])
    d = root / f"{name}-{cfg['num_hidden_layers']}l"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return d


def prompt(length: int, seed: int) -> list[int]:
    """Fixed pseudo-random token ids: the same prompt in every boot and arm."""
    return [((i + 131 * seed) * 7919) % 31000 + 3 for i in range(length)]


# (name, length) of the prefill prompts: four of about 29k tokens, one of 100k.
PREFILL = [("29k-a", 29167), ("29k-b", 29201), ("29k-c", 29243), ("29k-d", 29188),
           ("100k", 100000)]
# (name, length) of the greedy prompts: short ones, and two long enough that
# their 2048-token chunks are prefill batches an overlap arm splits.
GREEDY = [("g18", 18), ("g52", 52), ("g3000", 3000), ("g5000", 5000)]
