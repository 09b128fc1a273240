"""Worker extension for the A/B harness (``worker_extension_cls``): what the
boot asks each worker through ``collective_rpc``. The workers import this
module from the harness's folder (PYTHONPATH).

- ``weight_scale``: the loaded weights' scale, to record that the written
  checkpoint (std 0.02, norms 1) is what runs;
- ``reset_peak_memory`` / ``memory_stats``: the startup profile's figures
  (activation peak, non-torch memory, KV cache, weights) beside the runtime
  activation peak over the measured prompts;
- ``profile_start`` / ``profile_stop``: device time per kernel over one
  prompt (torch.profiler, CUDA activity), for the ideal-overlap bound.
"""

from __future__ import annotations

import torch

MIB = 2**20


class HarnessWorker:
    @torch.no_grad()
    def weight_scale(self) -> dict:
        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        lm_head = params.get("lm_head.weight")
        norms = [p for n, p in params.items() if n.endswith("norm.weight")]
        return {"parameters": len(params),
                "lm_head_std": None if lm_head is None else float(lm_head.float().std()),
                "norm_mean": (float(torch.stack([p.float().mean() for p in norms]).mean())
                              if norms else None)}

    def reset_peak_memory(self) -> int:
        torch.accelerator.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._e2e_base = torch.cuda.memory_allocated()
        return self._e2e_base

    def memory_stats(self) -> dict:
        """MiB: the startup profile's (vLLM's Worker attributes) and the
        activation peak over allocations since reset_peak_memory."""
        torch.accelerator.synchronize()
        runtime = (torch.cuda.max_memory_allocated() - getattr(self, "_e2e_base", 0)) / MIB

        def mib(name: str, obj: object = self) -> float | None:
            value = getattr(obj, name, None)
            return None if value is None else float(value) / MIB

        profile = mib("peak_activation_memory")
        return {"profile_activation_peak_mib": profile,
                "profile_non_torch_mib": mib("non_torch_memory"),
                "kv_cache_mib": mib("available_kv_cache_memory_bytes"),
                "weights_mib": mib("model_memory_usage", self.model_runner),  # type: ignore[attr-defined]
                "runtime_activation_peak_mib": runtime,
                "runtime_peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB,
                "covered_by_profile": None if profile is None else runtime <= profile}

    def profile_start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        torch.accelerator.synchronize()
        self._e2e_prof = profile(activities=[ProfilerActivity.CUDA])
        self._e2e_prof.__enter__()

    def profile_stop(self, top: int = 400) -> list[dict]:
        """[{name, us, count}]: device time per kernel name, largest first."""
        torch.accelerator.synchronize()
        prof = self._e2e_prof
        prof.__exit__(None, None, None)
        rows = []
        for e in prof.key_averages():
            us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if us:
                rows.append({"name": e.key[:240], "us": float(us), "count": int(e.count)})
        return sorted(rows, key=lambda r: -r["us"])[:top]
