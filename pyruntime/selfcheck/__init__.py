"""``aicpu-tiling selfcheck``: turn an hour on an Ascend machine into a verdict.

Checks, in order (each passes, fails or skips with the reason):

* ``kernels``: our kernels are there (the cffi tiling kernel; on an NPU also the torch_npu
  extension and the AI-CPU binary, built with ``--build`` when missing).
* ``tiling_kernel``: the tiling task run on the backend writes exactly the host build's
  bytes (and the Python oracle's) on trace batches and invalid inputs; on the CPU backend
  also the AArch64 build in the emulator, when ziglang and unicorn are installed.
* ``aicpu_replay``: a captured tiling task replayed 8 times with a new step epoch each
  time: the epoch it echoes counts the replays it ran in; all -> placement ``graph``, at
  most the first -> ``pre-replay``. On the CPU backend it runs with ``replay_aicpu`` True
  and False and must tell them apart.
* ``attention_correctness``: our attention on that placement against a float64 reference
  on trace batches (decode, spec decode, chunked prefill, padded buckets), fp32 and bf16.
* ``attention_fia``: the same against torch_npu's FIA run eagerly (NPU only).
* ``attention_triton``: the Triton AI Core kernels (interpreted on CPU, compiled on NPU).
* ``host_time``: host and step time per step, host_update against device tiling, L = 20
  and 61.

The verdict is ``pass`` when no check failed. On the NPU backend the placement found is
saved for the vLLM-Ascend hook (`pyruntime.placement`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .attention_checks import attention_correctness, attention_fia, attention_triton, host_time
from .context import Context
from .device_checks import aicpu_replay, tiling_kernel
from .environment import environment
from .kernels_check import kernels
from .report import SCHEMA, SCHEMA_VERSION, CheckResult, Report, failed

__all__ = ["CHECKS", "SCHEMA", "SCHEMA_VERSION", "CheckResult", "Context", "Report", "run"]

#: (name, function) in run order; later checks use what earlier ones found
CHECKS: tuple[tuple[str, Callable[[Context], CheckResult]], ...] = (
    ("kernels", kernels),
    ("tiling_kernel", tiling_kernel),
    ("aicpu_replay", aicpu_replay),
    ("attention_correctness", attention_correctness),
    ("attention_fia", attention_fia),
    ("attention_triton", attention_triton),
    ("host_time", host_time),
)


def run(ctx: Context, *, on_check: Callable[[str], None] | None = None,
        environment_info: dict | None = None) -> Report:
    """Run every check on `ctx`; a check that raises is a ``fail`` naming the exception.

    Args:
        on_check: called with each check's name before it runs (progress).
    """
    results = []
    for name, check in CHECKS:
        if on_check is not None:
            on_check(name)
        start = time.perf_counter()
        try:
            result = check(ctx)
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            result = failed(name, f"the check raised {type(exc).__name__}: {exc}")
        result.seconds = time.perf_counter() - start
        results.append(result)
    env = environment_info if environment_info is not None else environment(ctx.backend, ctx.npu)
    return Report(ctx.backend, ctx.placement, env, results)
