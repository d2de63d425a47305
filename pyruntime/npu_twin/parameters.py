"""``torch.nn.Parameter`` of an npu tensor on the twin: a parameter of the caller's class.

On an NPU an npu tensor is a plain ``torch.Tensor`` (``type(data) is torch.Tensor``), so
torch's ``Parameter.__new__`` (``torch/nn/parameter.py``) takes its standard path,
``torch.Tensor._make_subclass(cls, data, requires_grad)``: the result is an instance of
``cls``, and Python then runs ``cls.__init__``. vLLM's weight parameters rely on it
(``vllm/model_executor/parameter.py``: ``BasevLLMParameter.__new__`` calls
``Parameter.__new__(cls, data=data, requires_grad=False)`` and its ``__init__`` stores the
``weight_loader`` that ``load_weights`` reads).

On the twin's default, plain tensor layer (`pyruntime.npu_twin.plain_tensors`) that path is
torch's own and nothing here applies. The wrapper layer's npu tensor
(``AICPU_TILING_TWIN_TENSORS=wrapper``) is a wrapper subclass (`pyruntime.npu_twin.device.NpuTensor`), which
takes torch's "custom tensor" path instead: it returns ``data.detach()`` itself, an
``NpuTensor``, so the class is lost, ``__init__`` never runs and vLLM's weight loading stops
(``'NpuTensor' object has no attribute 'weight_loader'``: the engine probe, step 17). While the
twin is active, `parameter_new` gives such a parameter the class it has on hardware: a class
derived from both ``cls`` and ``NpuTensor`` (one per ``cls``, cached), over the same device
memory, with ``requires_grad`` as asked. Every other ``data`` takes torch's own path unchanged.
"""

from __future__ import annotations

import torch

from . import device as twin

_torch_parameter_new = torch.nn.Parameter.__new__
#: Parameter class -> its npu class (cls, NpuTensor)
_npu_classes: dict[type, type] = {}


def npu_parameter_class(cls: type) -> type:
    """The class of an npu parameter of class `cls` (a ``torch.nn.Parameter`` subclass):
    ``cls`` itself when it already derives from ``NpuTensor``, else a subclass of both."""
    if issubclass(cls, twin.NpuTensor):
        return cls
    found = _npu_classes.get(cls)
    if found is None:
        found = type(cls.__name__, (cls, twin.NpuTensor),
                     {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
        _npu_classes[cls] = found
    return found


def parameter_new(cls, data=None, requires_grad=True):
    """``torch.nn.Parameter.__new__`` with the standard path's result for an npu tensor:
    an instance of `cls` (through `npu_parameter_class`) over `data`'s device memory, with
    ``requires_grad`` set; any other `data` goes to torch's own ``__new__``."""
    if not isinstance(data, twin.NpuTensor):
        return _torch_parameter_new(cls, data, requires_grad)
    npu_cls = npu_parameter_class(cls)
    inner = twin.inner(data)
    out = torch.Tensor._make_wrapper_subclass(
        npu_cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
        dtype=inner.dtype, device=data.device, requires_grad=requires_grad)
    out._inner = inner
    out._index = data._index
    return out


def install() -> None:
    """Route ``torch.nn.Parameter.__new__`` through `parameter_new` (idempotent)."""
    torch.nn.Parameter.__new__ = parameter_new
