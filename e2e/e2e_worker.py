"""Worker extension for the A/B harness (``worker_extension_cls``): what the
boot asks each worker through ``collective_rpc``. The workers import this
module from the harness's folder (PYTHONPATH).

- ``weight_scale``: the loaded weights' scale, to record that the written
  checkpoint (std 0.02, norms 1) is what runs;
- ``reset_peak_memory`` / ``memory_stats``: the startup profile's figures
  (activation peak without the CUDA graph estimate, that estimate, all
  memory in use, KV cache, weights) beside the runtime activation peak over
  the measured prompts;
- ``profile_start`` / ``profile_stop``: device time per kernel over one
  prompt (torch.profiler, CUDA activity), for the ideal-overlap bound.
"""

from __future__ import annotations

try:  # the GPU machine's; profile_memory() needs none of it
    import torch
except ImportError:
    torch = None

MIB = 2**20


def profile_memory(worker: object, graphs_applied: bool) -> dict:
    """MiB of vLLM 0.33.0's startup memory profile, from the Worker's
    attributes: its ``peak_activation_memory`` is the profile's transient
    peak (torch's peak over what stayed allocated) plus the CUDA graph
    estimate where it applied one (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
    on by default); the activation peak here is without the graphs, the
    figure the measured prompts' activation peak compares with. 0.26.0's
    ``non_torch_memory`` is gone; ``total_consumed`` (everything the
    profile found in use) stands beside it."""

    def mib(name: str) -> float | None:
        value = getattr(worker, name, None)
        return None if value is None else float(value) / MIB

    peak, graphs = mib("peak_activation_memory"), mib("cudagraph_memory_estimate")
    applied = graphs if graphs_applied and graphs is not None else 0.0
    return {
        "profile_activation_peak_mib": None if peak is None else peak - applied,
        "profile_cudagraph_estimate_mib": graphs,
        "profile_cudagraph_estimate_applied": graphs_applied,
        "profile_total_consumed_mib": mib("total_consumed"),
        "kv_cache_mib": mib("available_kv_cache_memory_bytes"),
    }


class HarnessWorker:
    def weight_scale(self) -> dict:
        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        lm_head = params.get("lm_head.weight")
        norms = [p for n, p in params.items() if n.endswith("norm.weight")]
        with torch.no_grad():
            return {
                "parameters": len(params),
                "lm_head_std": None if lm_head is None else float(lm_head.float().std()),
                "norm_mean": (
                    float(torch.stack([p.float().mean() for p in norms]).mean()) if norms else None
                ),
            }

    def reset_peak_memory(self) -> int:
        torch.accelerator.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._e2e_base = torch.cuda.memory_allocated()
        return self._e2e_base

    def memory_stats(self) -> dict:
        """MiB: the startup profile's (profile_memory) and the activation
        peak over allocations since reset_peak_memory."""
        import vllm.envs as envs

        torch.accelerator.synchronize()
        runtime = (torch.cuda.max_memory_allocated() - getattr(self, "_e2e_base", 0)) / MIB
        out = profile_memory(self, envs.VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS)
        weights = getattr(self.model_runner, "model_memory_usage", None)  # type: ignore[attr-defined]
        profile = out["profile_activation_peak_mib"]
        return {
            **out,
            "weights_mib": None if weights is None else float(weights) / MIB,
            "runtime_activation_peak_mib": runtime,
            "runtime_peak_allocated_mib": torch.cuda.max_memory_allocated() / MIB,
            "covered_by_profile": None if profile is None else runtime <= profile,
        }

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
