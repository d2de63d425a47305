"""Host update: the vLLM-Ascend FULL_DECODE_ONLY baseline, reproduced call for call.

Capture, per layer: ``ext.wait(s); ext.reset(s); graph_task_group_begin(s)``; attention
and combine launched with a capture-time host tiling; ``graph_task_group_end(s)``.
Each step: block table copied, ``current_stream().synchronize()``, ``graph.replay()``;
then for EVERY layer on the update stream: ``graph_task_update_begin``, the host tiling
(what FIA computes at each launch), attention and combine re-issued with the host tiling
and host length lists passed by value, ``graph_task_update_end``, ``ext.record``. The
graph's layer waits on its external event until its update lands.

The layer's kernels depend on the backend (`Backend.host_update_attention`): on an NPU the
real baseline, torch_npu's FIA (``npu_fused_infer_attention_score.out``) with host length
lists, one task per layer, which plans its tiling on the host inside the op; on the CPU
backend its model, a host tiling and our attention and combine with the tiling and lengths
passed by value. Never pass host arrays to an NPU kernel: Triton-Ascend hands their host
addresses to the AI Core.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

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
        self.fia = backend.host_update_attention == "fia"
        if self.fia:  # FIA's own buffers, made before any capture
            p = buffers.params
            self.softmax_lse = backend.alloc((p.max_tokens, p.num_q_heads, 1), torch.float32)
            self.atten_mask = backend.alloc((kernels.FIA_MASK_SIZE,) * 2, torch.uint8)
            causal_mask = np.triu(np.ones((kernels.FIA_MASK_SIZE,) * 2, np.uint8), 1)
            backend.copy_h2d(self.atten_mask, causal_mask, stream=self.stream)

    def _launch_layer(self, layer: int, stream, cu: np.ndarray, kv: np.ndarray, epoch: int):
        """One layer's tasks with host lengths; returns the host tiling (emulated path)."""
        be, b = self.backend, self.buffers
        if self.fia:
            key_cache, value_cache = b.kv_caches[layer]
            be.note_host_tiling()
            be.launch(kernels.FIA_HOST_LISTS, {
                "query": b.queries[layer], "key_cache": key_cache, "value_cache": value_cache,
                "block_table": b.block_table, "out": b.outputs[layer],
                "softmax_lse": self.softmax_lse, "atten_mask": self.atten_mask,
                "cu_seqlens_q": cu, "seqlens_kv": kv,
                "params": kernels.params_list(b.params), "scale": b.scale,
                "causal": self.causal}, num_cores=b.params.num_cores, stream=stream)
            return None
        host_tiling = be.plan_on_host(b.params, cu, kv, causal=self.causal, epoch=epoch)
        kernels.launch_layer(be, b, layer, stream=stream, tiling_in=host_tiling.buffer,
                             cu_seqlens_q=cu, seqlens_kv=kv,
                             step_epoch=np.array([epoch], np.int32), causal=self.causal)
        return host_tiling

    def capture(self) -> None:
        be, main = self.backend, self.stream
        cu, kv = np.zeros(1, np.int32), np.zeros(0, np.int32)  # capture-time metadata
        with be.capture(self.graph, main):
            for layer, event in enumerate(self.events):
                event.wait(main)
                event.reset(main)
                be.graph_task_group_begin(main)
                self._launch_layer(layer, main, cu, kv, 0)
                self.groups.append(be.graph_task_group_end(main))

    def step(self, inputs: StepInputs, before_replay: Callable[[], None] | None = None) -> float:
        """Copy, call `before_replay` (if given), sync, replay, then update every layer;
        return the host CPU seconds spent, `before_replay` included."""
        start = time.thread_time()
        be, upd = self.backend, self.update_stream
        be.copy_h2d(self.buffers.block_table, inputs.block_table, stream=self.stream)
        if before_replay is not None:
            before_replay()
        self.stream.synchronize()  # vllm-ascend's pre-replay sync (idle here: cheap)
        self.graph.replay(self.stream)
        cu, kv = inputs.cu_seqlens_q, inputs.seqlens_kv
        host_tiling = None
        for layer, event in enumerate(self.events):
            be.graph_task_update_begin(upd, self.groups[layer])
            host_tiling = self._launch_layer(layer, upd, cu, kv, inputs.epoch)
            be.graph_task_update_end(upd)
            event.record(upd)
        elapsed = time.thread_time() - start
        # every layer planned the same lengths; FIA reports bad lengths by raising
        self._last_error = host_tiling.error if host_tiling is not None else None
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
        if self.fia:  # FIA's own buffers (the layers' are StaticBuffers')
            for buf in (self.softmax_lse, self.atten_mask):
                self.backend.free(buf)
        for stream in (self.stream, self.update_stream):
            self.backend.release_stream(stream)

    def error(self) -> TilingError | None:
        """The typed error of the last step's host tiling, if any."""
        return self._last_error
