"""The check ``serieskit wheel --verify`` runs inside the fresh virtual environment.

That is the environment it installed the wheel into, run with that
environment's Python in isolated mode: only the standard library, vLLM and
its requirements.

    python -I wheel_check.py EXPECTED_VERSION ENVIRONMENT MODULE

Checks that vLLM is imported from ENVIRONMENT, that its version (package
metadata and ``vllm.__version__``) is the wheel's, that ``vllm/_series.json``
names the same version, and that the series' ops register on this machine:
every op of ``csrc/sm7x`` in ``torch.ops._C`` (by the wheel's module of them,
``vllm/MODULE``, imported as ``CudaPlatform.import_kernels`` imports it, where
the wheel has it; otherwise from their schemas with their
fake implementations), the host all-reduce's fake accepting what the kernel
takes and refusing a misaligned input under FakeTensorMode,
and ``torch.ops.vllm.nvfp4_marlin_prefill_dequant_apply``. Prints one JSON line; a failed
check exits with status 1 and its reason.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path


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

    # The platform imports the module on CUDA machines only; this one may
    # have no GPU, so the check imports it itself.
    loaded = (where / f"{module}.abi3.so").exists()
    if loaded:
        importlib.import_module(f"vllm.{module}")
    from vllm import _sm7x_ops

    unbuilt = [name for name in _sm7x_ops.SCHEMAS if not _sm7x_ops.has_op(name)]
    if loaded and unbuilt:
        fail(f"ops the wheel's module does not register: {unbuilt}")
    _sm7x_ops.define_schemas()  # the ops without kernels, where none is built
    namespace = torch.ops._C
    missing = [name for name in _sm7x_ops.SCHEMAS if not hasattr(namespace, name)]
    if missing:
        fail(f"ops of csrc/sm7x not registered: {missing}")
    with FakeTensorMode():
        inp = torch.empty(64, dtype=torch.float16, device="cuda")
        out = torch.empty_like(inp)
        namespace.host_reduce_kernel(0, inp, out)
        try:
            namespace.host_reduce_kernel(0, inp[1:], out[1:])
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
        "ops": sorted(_sm7x_ops.SCHEMAS),
        "torch": torch.__version__,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])))
