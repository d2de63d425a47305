"""The ``torch_npu`` module on the twin: ``torch_npu.npu`` (the twin's ``torch.npu``),
``torch_npu._C._npu_getCurrentRawStream`` (Triton-Ascend's stream query), FIA, and a
placeholder for every other name (vLLM-Ascend imports many at module top level): it exists
and raises `NotInTwinError` when called, never accepting anything."""

from __future__ import annotations

import sys
import types

from . import device as twin
from . import fia, npu_module
from .npu_module import placeholder

VERSION = "2.10.0.post4+npu-twin"


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{self.__name__}.{name}")


def build() -> types.ModuleType:
    """The stand-in module (not yet in ``sys.modules``)."""
    module = _PlaceholderModule("torch_npu")
    module.__version__ = VERSION
    module.__file__ = __file__
    module.npu = npu_module
    c = _PlaceholderModule("torch_npu._C")

    def current_raw_stream(device: int = 0) -> int:
        return twin.device().current_stream().id

    c._npu_getCurrentRawStream = current_raw_stream
    module._C = c
    op = fia.register()
    module.npu_fused_infer_attention_score = op
    return module


def install() -> types.ModuleType:
    module = build()
    sys.modules["torch_npu"] = module
    sys.modules["torch_npu._C"] = module._C
    sys.modules["torch_npu.npu"] = npu_module
    return module
