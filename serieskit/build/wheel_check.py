"""The check ``serieskit wheel --verify`` runs inside the fresh virtual environment.

That is the environment it installed the wheel into, run with that
environment's Python in isolated mode: only the standard library, vLLM and
its requirements.

    python -I wheel_check.py EXPECTED_VERSION ENVIRONMENT MODULE

Checks that vLLM is imported from ENVIRONMENT, that its version (package
metadata and ``vllm.__version__``) is the wheel's, that ``vllm/_series.json``
names the same version, and that the series' ops register on this machine:
every op of ``csrc/sm7x`` in ``torch.ops._C`` where the wheel has their
module (``vllm/MODULE``), none where it has not, through the toolkit's
loader that the wheel declares as a vLLM general plugin (called here as vLLM
calls it, ``load_general_plugins``); the host all-reduce's fake checks
(``vllm._custom_ops``) accepting what the kernel takes and refusing a
misaligned input under FakeTensorMode; and
``torch.ops.vllm.nvfp4_marlin_prefill_dequant_apply``. Prints one JSON line; a failed
check exits with status 1 and its reason.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path

# The ops of csrc/sm7x (their bindings: host_reduce_ops.cpp,
# paged_prefill_attention_sm75_ops.cpp).
OPS = [
    "host_reduce_probe",
    "host_reduce_probe_copy_engine",
    "host_reduce_segment_bytes",
    "host_reduce_open",
    "host_reduce_close",
    "host_reduce_error",
    "host_reduce_kernel",
    "host_reduce_copy_engine",
    "paged_prefill_attention_sm75_probe",
    "paged_prefill_attention_sm75_scratch_numel",
    "paged_prefill_attention_sm75",
]


def fail(reason: str) -> None:
    print(reason, file=sys.stderr)
    raise SystemExit(1)


def main(expected: str, prefix: Path, module: str) -> dict:
    import vllm

    where = Path(vllm.__file__).resolve().parent
    if prefix.resolve() not in where.parents:
        fail(f"vllm was imported from {where}, not from the new environment {prefix}")
    versions = {
        "metadata": importlib.metadata.version("vllm"),
        "vllm.__version__": vllm.__version__,
        "_series.json": json.loads((where / "_series.json").read_text())["version"],
    }
    wrong = {k: v for k, v in versions.items() if v != expected}
    if wrong:
        fail(f"versions other than the wheel's {expected}: {wrong}")

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    loaded = (where / f"{module}.abi3.so").exists()
    plugins = [
        e.value
        for e in importlib.metadata.entry_points(group="vllm.general_plugins")
        if e.value.startswith("vllm_sm7x_loader:")
    ]
    if plugins != (["vllm_sm7x_loader:register"] if loaded else []):
        fail(f"the loader's entry point {plugins} does not match the module (present: {loaded})")
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from vllm import _custom_ops as ops

    namespace = torch.ops._C
    registered = [name for name in OPS if hasattr(namespace, name)]
    if registered != (OPS if loaded else []):
        fail(f"ops of csrc/sm7x registered: {registered}, the wheel's module present: {loaded}")
    with FakeTensorMode():
        inp = torch.empty(64, dtype=torch.float16, device="cuda")
        out = torch.empty_like(inp)
        ops._host_reduce_check_pair(inp, out)
        try:
            ops._host_reduce_check_pair(inp[1:], out[1:])
        except RuntimeError as e:
            if "aligned" not in str(e):
                fail(
                    f"the host all-reduce's fake refused a misaligned input for another reason: {e}"
                )
        else:
            fail("the host all-reduce's fake took a misaligned input")

    import vllm.model_executor.kernels.linear.nvfp4.marlin  # noqa: F401

    if not hasattr(torch.ops.vllm, "nvfp4_marlin_prefill_dequant_apply"):
        fail("torch.ops.vllm.nvfp4_marlin_prefill_dequant_apply is not registered")
    return {
        "vllm": str(where),
        "versions": versions,
        "extension_loaded": loaded,
        "ops": registered,
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])))
