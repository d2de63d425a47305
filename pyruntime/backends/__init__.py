"""Backends: where device buffers live and tasks run.

``get("cpu")`` returns the CPU backend (an executable model of ACL graph that runs
anywhere); ``get("npu")`` returns the NPU backend (a thin mapping onto torch_npu, which it
imports on first use). Both implement `base.Backend`; one backend per module.

Example::

    import torch
    from pyruntime import backends
    from pyruntime.backends import Kernel

    be = backends.get("cpu")
    x = be.alloc([4], torch.float32)
    add_one = Kernel("add_one", "aicore", lambda core, x: x[core].add_(1))
    g = be.graph()
    with be.capture(g, be.stream()):
        be.launch(add_one, {"x": x}, num_cores=4, stream=g.stream)
    g.replay(); g.replay(); be.synchronize()   # x == [2, 2, 2, 2]
"""

from __future__ import annotations

from .base import Backend, Counters
from .errors import (
    BackendError,
    CaptureError,
    DeviceBufferError,
    DeviceTaskError,
    EventError,
    LaunchError,
    TaskUpdateError,
)
from .handles import AICORE, AICPU, Event, ExternalEvent, Graph, Kernel, Stream, Task, TaskGroup

__all__ = ["AICORE", "AICPU", "Backend", "BackendError", "CaptureError", "Counters",
           "DeviceBufferError", "DeviceTaskError", "Event", "EventError", "ExternalEvent",
           "Graph", "Kernel", "LaunchError", "Stream", "Task", "TaskGroup", "TaskUpdateError",
           "backend_class", "get", "names"]

_FACTORIES = {"cpu": ("pyruntime.backends.cpu", "CpuBackend"),
              "npu": ("pyruntime.backends.npu", "NpuBackend")}


def names() -> tuple[str, ...]:
    """The backend names `get` accepts."""
    return tuple(_FACTORIES)


def backend_class(name: str) -> type[Backend]:
    """The class `get(name)` makes (imports its module, starts nothing).

    Raises:
        ValueError: unknown name.
    """
    import importlib

    try:
        module, cls = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {names()}") from None
    return getattr(importlib.import_module(module), cls)


def get(name: str, **options) -> Backend:
    """A new backend by name (``"cpu"`` or ``"npu"``); `options` go to its constructor.

    Raises:
        ValueError: unknown name.
        BackendError: the backend cannot start here (e.g. torch_npu is not installed).
    """
    return backend_class(name)(**options)
