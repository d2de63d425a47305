"""What a device kernel is, and how one fails: the contract between `kernels` and `backends`.

A `Kernel` names one device kernel and gives it one body per place it runs (the CPU backend's
Python body, the NPU's torch op, a Triton body); a backend launches it (`pyruntime.backends`).
It lives here, below the backends, so the kernels of `step` and `mla_step` are made without
importing a backend; `pyruntime.backends` re-exports `Kernel`, `AICPU` and `AICORE`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

AICPU = "aicpu"
AICORE = "aicore"


class AttentionKernelError(RuntimeError):
    """The attention kernel reported a failure other than a bad tiling (e.g. a bad block id)."""


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A device kernel of one kind.

    Args:
        name: unique kernel name, used in errors, timings and update checks.
        kind: ``"aicpu"`` (one AI-CPU task) or ``"aicore"`` (spread over AI Core cores).
        cpu_impl: the CPU backend's body. AI-CPU: ``cpu_impl(**args)``. AI Core:
            ``cpu_impl(core, **args)``, called once per core index; it must do exactly the
            work of that core.
        npu_op: the torch op the NPU backend calls as ``npu_op(**args)`` (one launch that
            covers every core), or None where the kernel has no NPU build.
        triton_impl: the Triton body of an AI Core kernel, ``triton_impl(**args)``: one launch
            that runs the whole fixed grid (every core), the same source the NPU runs. The
            CPU backend runs it, interpreted, instead of ``cpu_impl`` when made with
            ``aicore="triton"``; None where the kernel has no Triton body.
    """

    name: str
    kind: str
    cpu_impl: Callable[..., Any]
    npu_op: Callable[..., Any] | None = None
    triton_impl: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in (AICPU, AICORE):
            raise ValueError(f"kernel {self.name!r}: kind must be 'aicpu' or 'aicore', "
                             f"got {self.kind!r}")
        if self.triton_impl is not None and self.kind != AICORE:
            raise ValueError(f"kernel {self.name!r}: only AI Core kernels have a Triton body")
