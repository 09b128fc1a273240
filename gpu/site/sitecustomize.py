"""The GPU machine's stand-in for one import vLLM 0.34.0 makes at every boot,
and the loading of the series' module in every process.

0.34.0's kernel warmup imports MiniMax M3's warmup on every CUDA boot, and
with it the CuTe DSL (``cutlass``, the 92 MB wheel nvidia-cutlass-dsl-libs-cu13),
which the GPU image lacks and which no call of at most 64 MiB can carry.
Where ``cutlass`` is absent, that one warmup module is replaced by a no-op:
no model the evidence runs is MiniMax M3. gpu/evidence.sh puts this folder on
PYTHONPATH, so every process of a run (engine cores, spawned tests) gets it.

The overlay's module of the series' ops (vllm/_sm7x_C_stable_libtorch, built
on the machine) is imported right after vLLM's core module by the overlay's
loader (overlays/vllm_sm7x_loader.py, beside vllm/ in the assembled tree), as
a source build registers them with _C_stable_libtorch: the tests use the ops
without vLLM's engine, which would call the loader as a general plugin.
"""

import importlib.util
import sys
import types

if importlib.util.find_spec("cutlass") is None:
    _name = "vllm.model_executor.warmup.minimax_m3_msa_warmup"
    _stand_in = types.ModuleType(_name)
    _stand_in.__doc__ = "No-op: the CuTe DSL is not installed on this machine."
    _stand_in.minimax_m3_msa_warmup = lambda worker: None  # type: ignore[attr-defined]
    sys.modules[_name] = _stand_in

if importlib.util.find_spec("vllm_sm7x_loader") is not None:
    import vllm_sm7x_loader

    vllm_sm7x_loader.install_import_hook()
