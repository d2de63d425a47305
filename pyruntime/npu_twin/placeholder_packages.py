"""Python packages an Ascend host has besides torch_npu, which vLLM-Ascend imports at module top
on the paths the engine starts, as placeholders: each module of the allow-list `PACKAGES`
exists while the twin is active, and every name in it raises `NotInTwinError` when called.

Which and why (vLLM-Ascend 0.23.0.post1 and 0.30.0rc2, read from the releases' trees):

* ``acl`` (pyACL, CANN's Python binding, installed with the CANN toolkit):
  ``vllm_ascend/device_allocator/camem.py:27`` ``from acl.rt import memcpy`` (both releases),
  imported by ``worker/worker.py`` at module top; ``memcpy`` is called only by the sleep-mode
  allocator (``CaMemAllocator``, ``enable_sleep_mode``), which no engine run here enables.
* ``fla_npu`` (flash-linear-attention-npu, the external package that replaced vLLM-Ascend's
  bundled KDA operators: 0.30 release notes, PRs 17664 and 17727): ``ops/gdn.py:23``
  ``from fla_npu.ops.ascendc import causal_conv1d_fn, causal_conv1d_update,
  recurrent_gated_delta_rule`` (0.30.0rc2), imported at module top on the worker's import
  path; called only by GDN / KDA / Mamba layers (Qwen3-Next, Kimi), no model of the engine check.

vLLM-Ascend's own unit tests stand in for the same two packages the same way
(``tests/ut/conftest.py``: ``acl``, ``acl.rt``, ``fla_npu``, ``fla_npu.ops``,
``fla_npu.ops.ascendc``). A module outside the allow-list is not found (``ImportError``, as on a
host without it); an installed package of the same name wins (the finder is the last one).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

from .npu_module import placeholder

#: every module the twin stands in for, parents included
PACKAGES = ("acl", "acl.rt", "fla_npu", "fla_npu.ops", "fla_npu.ops.ascendc")


class PlaceholderModule(types.ModuleType):
    """A module whose every public name is a placeholder raising `NotInTwinError` when called
    (``pyruntime.npu_twin.npu_module.placeholder``)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{self.__name__}.{name}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return PlaceholderModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__file__ = __file__


class _Finder(importlib.abc.MetaPathFinder):
    """Finds exactly the modules of `PACKAGES`, after every other finder."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in PACKAGES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), origin="npu-twin",
                                              is_package=True)


_finder = _Finder()


def install() -> None:
    """Make the modules of `PACKAGES` importable (idempotent)."""
    if _finder not in sys.meta_path:
        sys.meta_path.append(_finder)
