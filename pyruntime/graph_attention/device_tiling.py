"""Device tiling: one AI-CPU tiling task per step feeds every layer; no host work per layer.

Captured once per bucket::

    capture stream:  record fork ─────────────┐            wait join ─> L x (attention, combine)
    AI-CPU stream:                 wait fork ─┴─> tiling ─> record join

(AI-CPU and AI Core tasks never share a stream; events order them.) A step copies the
packed lengths and the block table into the static buffers, then replays: two copies
and one replay, whatever the layer count.
"""

from __future__ import annotations

import time

from pyruntime.backends import Backend
from pyruntime.kernels import step as kernels
from pyruntime.tiling import StaleTilingError, TilingError

from .buffers import StaticBuffers, StepInputs


class DeviceTilingPath:
    """The device-tiling graph of one bucket (see the module docstring)."""

    def __init__(self, backend: Backend, buffers: StaticBuffers, *, causal: bool) -> None:
        self.backend, self.buffers, self.causal = backend, buffers, causal
        self.stream = backend.stream("attention")
        self.aicpu_stream = backend.stream("aicpu")
        self.graph = backend.graph()
        self._last_epoch: int | None = None

    def capture(self) -> None:
        be, b, main, side = self.backend, self.buffers, self.stream, self.aicpu_stream
        params = kernels.params_list(b.params)
        with be.capture(self.graph, main):
            side.wait_event(main.record_event())
            be.launch(kernels.TILING, {
                "cu_seqlens_q": b.cu_seqlens_q, "seqlens_kv": b.seqlens_kv, "batch": b.batch,
                "step_epoch": b.step_epoch, "tiling_out": b.tiling, "params": params,
                "causal": self.causal,
            }, stream=side)
            main.wait_event(side.record_event())
            for layer in range(len(b.queries)):
                kernels.launch_layer(be, b, layer, stream=main, tiling_in=b.tiling,
                                     cu_seqlens_q=b.cu_seqlens_q, seqlens_kv=b.seqlens_kv,
                                     step_epoch=b.step_epoch, causal=self.causal)

    def step(self, inputs: StepInputs) -> float:
        """Copy the inputs, replay; return the host CPU seconds spent (no device wait)."""
        start = time.thread_time()
        be, b = self.backend, self.buffers
        be.copy_h2d(b.lengths, b.stage_lengths(inputs), stream=self.stream)
        be.copy_h2d(b.block_table, inputs.block_table, stream=self.stream)
        self.graph.replay(self.stream)
        self._last_epoch = inputs.epoch
        return time.thread_time() - start

    def wait(self) -> None:
        self.stream.synchronize()

    def error(self) -> TilingError | None:
        """The typed error of the last step's tiling (read back from the device buffer):
        `StaleTilingError` when the tiling was not planned for that step, else its status."""
        planned = kernels.tiling_status(self.buffers.params, self.buffers.tiling)
        if self._last_epoch is not None and planned.epoch != self._last_epoch:
            return StaleTilingError(planned.epoch, self._last_epoch)
        return planned.error
