"""Host update: the vLLM-Ascend FULL_DECODE_ONLY baseline, reproduced call for call.

Capture, per layer: ``ext.wait(s); ext.reset(s); graph_task_group_begin(s)``; attention
and combine launched with a capture-time host tiling; ``graph_task_group_end(s)``.
Each step: block table copied, ``current_stream().synchronize()``, ``graph.replay()``;
then for EVERY layer on the update stream: ``graph_task_update_begin``, the host tiling
(what FIA computes at each launch), attention and combine re-issued with the host tiling
and host length lists passed by value, ``graph_task_update_end``, ``ext.record``. The
graph's layer waits on its external event until its update lands.
"""

from __future__ import annotations

import time

import numpy as np

from pyruntime.backends import Backend
from pyruntime.backends.handles import GraphState
from pyruntime.kernels import step as kernels
from pyruntime.tiling import TilingError

from .buffers import StaticBuffers, StepInputs


class HostUpdatePath:
    """The host-update graph of one bucket (see the module docstring)."""

    def __init__(self, backend: Backend, buffers: StaticBuffers, *, causal: bool) -> None:
        self.backend, self.buffers, self.causal = backend, buffers, causal
        self.stream = backend.stream("attention")
        self.update_stream = backend.stream("update")
        self.graph = backend.graph()
        self.events = [backend.external_event() for _ in buffers.queries]
        self.groups: list = []
        self._last_error: TilingError | None = None

    def capture(self) -> None:
        be, main = self.backend, self.stream
        cu, kv = np.zeros(1, np.int32), np.zeros(0, np.int32)  # capture-time metadata
        epoch = np.zeros(1, np.int32)
        capture_tiling = be.plan_on_host(self.buffers.params, cu, kv, causal=self.causal,
                                         epoch=0)
        with be.capture(self.graph, main):
            for layer, event in enumerate(self.events):
                event.wait(main)
                event.reset(main)
                be.graph_task_group_begin(main)
                kernels.launch_layer(be, self.buffers, layer, stream=main,
                                     tiling_in=capture_tiling.buffer, cu_seqlens_q=cu,
                                     seqlens_kv=kv, step_epoch=epoch, causal=self.causal)
                self.groups.append(be.graph_task_group_end(main))

    def step(self, inputs: StepInputs) -> float:
        """Copy, sync, replay, then update every layer; return the host CPU seconds spent."""
        start = time.thread_time()
        be, upd = self.backend, self.update_stream
        be.copy_h2d(self.buffers.block_table, inputs.block_table, stream=self.stream)
        self.stream.synchronize()  # vllm-ascend's pre-replay sync (idle here: cheap)
        self.graph.replay(self.stream)
        cu, kv = inputs.cu_seqlens_q, inputs.seqlens_kv
        epoch = np.array([inputs.epoch], np.int32)
        for layer, event in enumerate(self.events):
            be.graph_task_update_begin(upd, self.groups[layer])
            host_tiling = be.plan_on_host(self.buffers.params, cu, kv, causal=self.causal,
                                          epoch=inputs.epoch)
            kernels.launch_layer(be, self.buffers, layer, stream=upd,
                                 tiling_in=host_tiling.buffer, cu_seqlens_q=cu,
                                 seqlens_kv=kv, step_epoch=epoch, causal=self.causal)
            be.graph_task_update_end(upd)
            event.record(upd)
        elapsed = time.thread_time() - start
        self._last_error = host_tiling.error  # every layer planned the same lengths
        return elapsed

    def wait(self) -> None:
        self.stream.synchronize()
        self.update_stream.synchronize()

    def close(self) -> None:
        """Reset the graph (its task groups become invalid) and give back this path's
        streams. Call after `wait()`; the path is unusable after."""
        if self.graph.state is GraphState.CAPTURED:
            self.graph.reset()
        self.groups.clear()
        for stream in (self.stream, self.update_stream):
            self.backend.release_stream(stream)

    def error(self) -> TilingError | None:
        """The typed error of the last step's host tiling, if any."""
        return self._last_error
