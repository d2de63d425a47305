"""Triton-Ascend's launch path on the twin.

On an NPU, ``kernel[grid](...)`` of a ``@triton.jit`` function compiles it with Triton-Ascend
and its launcher enqueues the binary on ``torch_npu._C._npu_getCurrentRawStream``, the
capture stream inside a capture, taking each tensor's ``data_ptr()`` with no device check
(``triton/backends/ascend/driver.py`` of the 3.2.0 wheel). The twin installs the same
seam: ``JITFunction.run`` with ``npu`` tensors queues one AI Core task on the current stream
(captured like any other) that runs the kernel's Python source under Triton's interpreter on
the tensors' device memory; a CPU tensor among the arguments is a host pointer handed to
the AI Core (`HostPointerError`). Product code keeps calling the compiled path: nothing in
it knows about the twin.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from . import device as twin

_installed = False
_lock = threading.Lock()


def _interpreted(fn, grid, args, kwargs) -> None:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from pyruntime.kernels import triton_launch

    # nested @triton.jit helpers (ours and triton.language's own, e.g. tl.cdiv) were built
    # compiled in this process; inside the interpreted kernel each runs interpreted too
    with triton_launch._INTERPRETER_LOCK, _lock:
        original = JITFunction.__call__
        JITFunction.__call__ = lambda self, *a, **k: InterpretedFunction(self.fn)(*a, **k)
        try:
            InterpretedFunction(fn)[grid](*args, **kwargs)
        finally:
            JITFunction.__call__ = original


def _launch(jit_fn, args: tuple, kwargs: dict, grid: Any) -> None:
    dev = twin.device()
    dev.check_alive()
    tensors = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
    for t in tensors:
        if not twin.is_npu_tensor(t):
            raise twin.HostPointerError(
                f"triton kernel {jit_fn.__name__}: argument on {t.device} (shape "
                f"{tuple(t.shape)}): Triton-Ascend passes its data_ptr() to the AI Core "
                "unchecked, a host address (AI Core exception on hardware)")
        if twin.index_of(t) != dev.current_device():
            # the launcher takes driver.active.get_current_device()'s current stream and
            # context; another device's address is not mapped there
            raise twin.TwinError(
                f"triton kernel {jit_fn.__name__}: argument on npu:{twin.index_of(t)} launched "
                f"on npu:{dev.current_device()}, the current device (Triton-Ascend launches in "
                "the current device's context with the argument's data_ptr() unchecked)")
    inner_args = tuple(twin.inner(a) for a in args)
    inner_kwargs = {k: twin.inner(v) for k, v in kwargs.items()}
    if "UPCAST_DOT" in inner_kwargs:
        # Triton's interpreter computes a bf16 tl.dot inexactly; our kernels carry this
        # switch for the interpreter (pyruntime/kernels/triton_launch.py sets it on CPU
        # tensors); the compiled kernel on the NPU does not need it
        inner_kwargs["UPCAST_DOT"] = True
    grid = tuple(grid) if not callable(grid) else grid
    name = jit_fn.__name__

    def run() -> None:
        _interpreted(jit_fn.fn, grid, inner_args, inner_kwargs)

    dev.enqueue(twin.Work("aicore", f"triton {name}", run))


def install() -> None:
    """Route ``JITFunction.run`` with twin tensors through the twin (once per process)."""
    global _installed
    if _installed:
        return
    from triton.runtime.jit import JITFunction

    compiled_run = JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        if any(twin.is_npu_tensor(v) for v in (*args, *kwargs.values())):
            if warmup:
                return None
            _launch(self, args, kwargs, grid)
            return None
        return compiled_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction.run = run
    _installed = True
