"""Worker extension for the A/B harness: weights at a trained model's scale.

vLLM's dummy loader fills every weight, norms included, with uniform +-1e-3:
fine for timing, but the logits come out so close that any rounding
difference flips a greedy choice, so greedy outputs compared between arms
would say nothing. After loading, ``reinit_weights`` refills each parameter
in place (norms 1, the rest normal with std 0.02) from a generator seeded by
the parameter's name: the same model in every boot and arm. Loaded through
``worker_extension_cls``, so the workers import this module (PYTHONPATH).
"""

from __future__ import annotations

import zlib

import torch


class ReinitWeights:
    @torch.no_grad()
    def reinit_weights(self, std: float = 0.02) -> dict:
        """Refill in place; returns what it did, for the boot's record."""
        model = self.model_runner.model  # type: ignore[attr-defined]
        names = []
        for name, param in model.named_parameters():
            if not torch.is_floating_point(param):
                continue
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                gen = torch.Generator(device=param.device)
                gen.manual_seed(zlib.crc32(name.encode()))
                param.normal_(0.0, std, generator=gen)
            names.append(name)
        torch.accelerator.synchronize()
        lm_head = dict(model.named_parameters()).get("lm_head.weight")
        return {"parameters": len(names), "first": names[:3],
                "lm_head_std": None if lm_head is None else float(lm_head.float().std())}
