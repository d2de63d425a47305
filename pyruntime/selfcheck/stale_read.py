"""Does the AI-CPU tiling task see what an AI Core op wrote just before it?

vLLM-Ascend's custom AI-CPU route reads ``seq_lens`` that AI Core ops wrote earlier in the
step (pre-flight review 2, item 4): if the AI-CPU read device memory before the AI Core's
write reached it, the tiling would be planned from stale lengths, a silent wrong answer.
No twin can decide that; this check asks the device. Each iteration an AI Core op (an
in-place add on the stream) grows every request's length by one, as a decode step does, the
tiling task is launched right behind it on the same stream (forked to the AI-CPU stream
through an event, as always), and the tiling it wrote must be exactly the host build's plan
for the new lengths. Consecutive plans always differ (the lengths are in the tiling), so a
task that read the lengths from before the write fails at that iteration.
"""

from __future__ import annotations

import numpy as np
import torch

from pyruntime import tiling
from pyruntime.backends import BackendError

from .context import Context
from .device_checks import TilingTask, _close, probe_params
from .report import CheckResult, failed, passed, skipped

#: iterations of the check (``--quick``: `QUICK_ITERATIONS`)
ITERATIONS = 1000
QUICK_ITERATIONS = 25
#: the lengths before the first write: decode requests of mixed length, all of them still
#: within the probe's capacity (64 blocks of 128) after `ITERATIONS` more tokens
START_LENGTHS = (33, 700, 9, 128, 1, 4000, 250, 77)


def stale_read(ctx: Context) -> CheckResult:
    """The tiling task launched right after an AI Core op that wrote its lengths plans from
    the written lengths, `ITERATIONS` times in a row (fails at the first that does not)."""
    name = "stale_read"
    if ctx.backend != "npu":
        return skipped(name, "an NPU question (does the AI-CPU see an AI Core write made just "
                             "before it?); the CPU backend runs both on host memory")
    if not ctx.kernels_ready:
        return skipped(name, "our kernels are not available (see the kernels check)")
    iterations = QUICK_ITERATIONS if ctx.quick else ITERATIONS
    be = ctx.make_backend()
    try:
        params = probe_params(be.default_num_cores)
        task = TilingTask(be, params)
        start = np.array(START_LENGTHS, np.int32)
        cu = np.arange(start.size + 1, dtype=np.int32)
        task.stage(cu, start, epoch=1)  # a DMA copy: the lengths before the first AI Core write
        one = np.zeros(params.max_batch, np.int32)
        one[: start.size] = 1
        step = be.alloc((params.max_batch,), torch.int32)
        be.copy_h2d(step, one, stream=task.stream)
        for i in range(1, iterations + 1):
            with ctx.npu.stream(task.stream.native):
                task.kv.add_(step)  # the AI Core op: every length grows by one
            task.launch()
            got = task.read()
            lengths = start + i
            want = tiling.plan(params, cu, lengths, epoch=1).buffer
            if not np.array_equal(got, want):
                before = tiling.plan(params, cu, lengths - 1, epoch=1).buffer
                read = ("the lengths from before the AI Core's write"
                        if np.array_equal(got, before) else "neither the new nor the previous "
                        "lengths")
                return failed(name, f"iteration {i} of {iterations}: the tiling task planned "
                                    f"from {read}: the AI-CPU does not see an AI Core write "
                                    "made just before it on the stream; order them with an "
                                    "event the AI-CPU stream waits on after the write has "
                                    "completed", iterations=iterations, failed_at=i,
                              stale=bool(np.array_equal(got, before)))
    except BackendError as exc:
        return failed(name, f"the check could not run on the {ctx.backend} backend: {exc}")
    finally:
        _close(be)
    return passed(name, f"{iterations}/{iterations} tilings planned from the lengths an AI "
                        "Core op wrote just before the task", iterations=iterations)
