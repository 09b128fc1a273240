"""Loads the series' native module into a released vLLM.

A released vLLM wheel's ``_C_stable_libtorch`` has no sm_70 / sm_75 kernels.
The toolkit's wheel and overlay add the series' ops (``csrc/sm7x``) as a
module of their own, ``vllm/_sm7x_C_stable_libtorch.abi3.so``: the same
sources that a source build of the patched tree compiles into
``_C_stable_libtorch``, registering the same ops into ``torch.ops._C``. vLLM
itself imports no such module; this file does, in two ways:

- ``register``, a vLLM general plugin (entry point ``sm7x_ops`` of the group
  ``vllm.general_plugins``, which the wheel's and the overlay's dist-info
  declare): vLLM calls it in every process (front end, engine core, workers)
  before a model runner or a communicator uses an op;
- ``install_import_hook`` (the GPU machine's ``gpu/site/sitecustomize.py``
  calls it): the module is imported right after ``vllm._C_stable_libtorch``,
  as in a source build, in processes that use the ops without vLLM's engine
  (tests, benchmarks), before ``vllm._custom_ops`` registers the ops' fakes.

This file is the toolkit's (``overlays/``), copied beside ``vllm/`` by
``nox -s overlay`` and ``nox -s wheel``; it is not part of the series.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

MODULE = "vllm._sm7x_C_stable_libtorch"
CORE = "vllm._C_stable_libtorch"
# An op of every build of the module: present, the ops are registered.
PROBE_OP = "host_reduce_probe"
ENTRY_POINT = "sm7x_ops = vllm_sm7x_loader:register"

logger = logging.getLogger(__name__)


def _import_module() -> None:
    import torch

    if hasattr(torch.ops._C, PROBE_OP):
        return  # built into _C_stable_libtorch (a source build), or loaded
    try:
        importlib.import_module(MODULE)
    except ImportError as e:
        logger.warning("%s not loaded, the series' ops are absent: %r", MODULE, e)


def register() -> None:
    """The general plugin: vLLM's kernels first, then the series' module."""
    from vllm.platforms import current_platform

    current_platform.import_kernels()
    _import_module()


class _AfterCore(importlib.abc.Loader):
    """``vllm._C_stable_libtorch``'s own loader, then the series' module."""

    def __init__(self, inner: importlib.abc.Loader):
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _import_module()


class _CoreFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != CORE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _AfterCore(spec.loader)  # type: ignore[arg-type]
        return spec


def install_import_hook() -> None:
    """Import the series' module whenever vLLM's core module is imported."""
    if not any(isinstance(f, _CoreFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CoreFinder())
