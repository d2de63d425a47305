"""Device tiling: one AI-CPU tiling task per step feeds every layer; no host work per layer.

The tiling producer has two placements (docs/design.md section 7):

``graph`` (`DeviceTilingPath`): the AI-CPU task is captured in the graph::

    capture stream:  record fork ─────────────┐            wait join ─> L x (attention, combine)
    AI-CPU stream:                 wait fork ─┴─> tiling ─> record join

  A step is two copies and one replay, whatever the layer count. It is right only if graph
  replay re-runs captured AI-CPU tasks, which no public CANN document promises.

``pre-replay`` (`PreReplayTilingPath`): the graph holds only the L layers; every step the
same AI-CPU kernel is launched once on its own stream, outside the graph, and an event
orders it before the replay::

    host:            copy lengths, copy block table,        replay ──────────────────┐
    stream:          ─> record fork ─┐            wait join ─> L x (attention, combine)
    AI-CPU stream:        wait fork ─┴─> tiling ─> record join

  A step is two copies, one AI-CPU launch and one replay: no per-layer update, no
  device-to-host copy, host cost flat in L.

(AI-CPU and AI Core tasks never share a stream; events order them.) In both, attention
checks the tiling's step epoch, so a tiling the task did not write for this step is never
used: outputs are zero and `error()` returns `StaleTilingError`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pyruntime.backends import Backend
from pyruntime.backends.handles import GraphState
from pyruntime.kernels import step as kernels
from pyruntime.tiling import StaleTilingError, TilingError

from .buffers import StaticBuffers, StepInputs

#: the tiling producer's placements, in the order a self-check prefers them
PLACEMENTS = ("graph", "pre-replay")


class DeviceTilingPath:
    """The device-tiling graph of one bucket, placement ``graph`` (see the module docstring)."""

    placement = "graph"

    def __init__(self, backend: Backend, buffers: StaticBuffers, *, causal: bool) -> None:
        self.backend, self.buffers, self.causal = backend, buffers, causal
        self.stream = backend.stream("attention")
        self.aicpu_stream = backend.stream("aicpu")
        self.graph = backend.graph()
        self._last_epoch: int | None = None
        self._tiling_args_of_bucket: dict | None = None
        self._tiling_task = None  # the tiling launch, checked and frozen once (make_task)

    def _tiling_args(self) -> dict:
        """The tiling task's arguments: the bucket's static buffers and constants, the same
        every step, so built once (`Backend.launch` copies what it keeps; the pre-replay
        placement launches once per step, and rebuilding them was host work per step)."""
        if self._tiling_args_of_bucket is None:
            b = self.buffers
            self._tiling_args_of_bucket = {
                "cu_seqlens_q": b.cu_seqlens_q, "seqlens_kv": b.seqlens_kv, "batch": b.batch,
                "step_epoch": b.step_epoch, "tiling_out": b.tiling,
                "params": kernels.params_list(b.params), "causal": self.causal}
        return self._tiling_args_of_bucket

    def _launch_tiling(self, fork=None, join=None) -> None:
        """Fork to the AI-CPU stream, launch the tiling task there, join back (new events
        unless `fork` and `join` are given).

        The pre-replay placement runs this every step, so its host work is kept to the
        backend calls themselves: the events are recorded and waited through the backend
        (what `Stream.record_event` and `Stream.wait_event` call), and the tiling launch is
        checked and frozen once (`Backend.make_task`, re-checked after any buffer free)."""
        be, main, side = self.backend, self.stream, self.aicpu_stream
        fork = fork if fork is not None else be.event()
        join = join if join is not None else be.event()
        be.event_record(fork, main)
        be.event_wait(fork, side)
        if self._tiling_task is None:
            self._tiling_task = be.make_task(kernels.TILING, self._tiling_args())
        be.launch_task(self._tiling_task, stream=side)
        be.event_record(join, side)
        be.event_wait(join, main)

    def _launch_layers(self) -> None:
        b = self.buffers
        for layer in range(len(b.queries)):
            kernels.launch_layer(self.backend, b, layer, stream=self.stream, tiling_in=b.tiling,
                                 cu_seqlens_q=b.cu_seqlens_q, seqlens_kv=b.seqlens_kv,
                                 step_epoch=b.step_epoch, causal=self.causal)

    def capture(self) -> None:
        self.backend.prepare_kernels()
        with self.backend.capture(self.graph, self.stream):
            self._launch_tiling()
            self._launch_layers()

    def _copy_inputs(self, inputs: StepInputs) -> None:
        be, b = self.backend, self.buffers
        be.copy_h2d(b.lengths, b.stage_lengths(inputs), stream=self.stream)
        be.copy_h2d(b.block_table, inputs.block_table, stream=self.stream)

    def step(self, inputs: StepInputs, before_replay: Callable[[], None] | None = None) -> float:
        """Copy the inputs, call `before_replay` (if given), replay; return the host CPU
        seconds spent (no device wait), `before_replay` included."""
        start = time.thread_time()
        self._copy_inputs(inputs)
        if before_replay is not None:
            before_replay()
        self.graph.replay(self.stream)
        self._last_epoch = inputs.epoch
        return time.thread_time() - start

    def wait(self) -> None:
        self.stream.synchronize()

    def close(self) -> None:
        """Reset the graph (the CPU backend's graph-owned side workers end with it) and give
        back this path's streams. Call after `wait()`; the path is unusable after."""
        if self.graph.state is GraphState.CAPTURED:
            self.graph.reset()
        for stream in (self.stream, self.aicpu_stream):
            self.backend.release_stream(stream)

    def error(self) -> TilingError | None:
        """The typed error of the last step's tiling (read back from the device buffer):
        `StaleTilingError` when the tiling was not planned for that step, else its status."""
        planned = kernels.tiling_status(self.buffers.params, self.buffers.tiling)
        if self._last_epoch is not None and planned.epoch != self._last_epoch:
            return StaleTilingError(planned.epoch, self._last_epoch)
        return planned.error


class PreReplayTilingPath(DeviceTilingPath):
    """Placement ``pre-replay``: the tiling task runs once per step before the replay."""

    placement = "pre-replay"

    def __init__(self, backend: Backend, buffers: StaticBuffers, *, causal: bool) -> None:
        super().__init__(backend, buffers, causal=causal)
        self._fork, self._join = backend.event(), backend.event()  # reused every step

    def capture(self) -> None:
        self.backend.prepare_kernels()
        with self.backend.capture(self.graph, self.stream):
            self._launch_layers()

    def step(self, inputs: StepInputs, before_replay: Callable[[], None] | None = None) -> float:
        """Copy the inputs, call `before_replay` (if given), launch the tiling (ordered by
        events), replay; host seconds."""
        start = time.thread_time()
        self._copy_inputs(inputs)
        if before_replay is not None:
            before_replay()
        self._launch_tiling(self._fork, self._join)
        self.graph.replay(self.stream)
        self._last_epoch = inputs.epoch
        return time.thread_time() - start


PATHS = {"graph": DeviceTilingPath, "pre-replay": PreReplayTilingPath}
