"""Static (graph-captured) paged attention over L layers, in two modes.

``mode="device_tiling"``: an AI-CPU task plans the tiling from the lengths in device
memory and every layer reads it. ``placement="graph"`` (default) captures that task in
the graph, so a step is two copies and one replay; ``placement="pre-replay"`` launches it
once per step on its own stream, ordered before the replay by an event (for devices whose
graph replay does not re-run captured AI-CPU tasks).
``mode="host_update"``: the vLLM-Ascend baseline; after each replay the host re-plans
and updates every layer's task group.

Example (runs on the CPU backend)::

    import torch
    from pyruntime import backends
    from pyruntime.attention import StaticAttention

    attn = StaticAttention(backends.get("cpu"), num_layers=2, num_q_heads=4, num_kv_heads=2,
                           head_dim=16, block_size=8, num_blocks=16, max_batch=4,
                           max_tokens=8, max_blocks_per_req=4, mode="device_tiling",
                           dtype=torch.float32)
    for q, (k, v) in zip(attn.queries, attn.kv_caches):  # filled in place, as on a device
        q.normal_(); k.normal_(); v.normal_()
    attn.capture()
    block_table = torch.arange(16, dtype=torch.int32).reshape(4, 4)
    outs = attn.step(block_table,
                     cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32),  # 2 live requests
                     seqlens_kv=torch.tensor([5, 20], dtype=torch.int32))
    attn.check()                 # raises e.g. KvShortError naming the request if lengths were bad
    outs[0].shape                # torch.Size([8, 4, 16]); rows 3..7 are padding, zero
"""

from __future__ import annotations

import math
from typing import Any

import torch

from pyruntime.backends import Backend
from pyruntime.graph_attention.buffers import StaticBuffers
from pyruntime.graph_attention.device_tiling import PATHS as DEVICE_TILING_PATHS
from pyruntime.graph_attention.device_tiling import PLACEMENTS
from pyruntime.graph_attention.errors import (
    AttentionError,
    AttentionInputError,
    AttentionStateError,
    FrozenSizeError,
)
from pyruntime.graph_attention.host_update import HostUpdatePath
from pyruntime.tiling import TilingParams

__all__ = ["MODES", "PLACEMENTS", "AttentionError", "AttentionInputError", "AttentionStateError",
           "FrozenSizeError", "StaticAttention"]

MODES = ("device_tiling", "host_update")


class StaticAttention:
    """Paged, causal (by default) GQA attention over `num_layers` layers, captured once.

    Args:
        backend: from ``pyruntime.backends.get``.
        num_layers: attention layers (each has its own query, KV cache and output).
        num_q_heads, num_kv_heads, head_dim: head geometry (num_q_heads a multiple of
            num_kv_heads).
        block_size: KV tokens per cache block; num_blocks: blocks per cache.
        max_batch: requests of the capture bucket; max_tokens: query rows T.
        max_blocks_per_req: block-table columns (KV capacity = that x block_size).
        mode: ``"device_tiling"`` or ``"host_update"``.
        placement: where device tiling's AI-CPU task runs: ``"graph"`` (captured in the
            graph; the default) or ``"pre-replay"`` (launched once per step before the
            replay). Only for ``mode="device_tiling"``.
        dtype: storage dtype: torch.float32, torch.float16 or torch.bfloat16.
        causal: causal attention with a KV cache (query rows are the last q_len positions).
        num_cores: AI Cores the attention spreads over (default: the backend's).
        q_tile: query tokens per tiling unit (default: the tiling's).

    Attributes:
        placement: the device-tiling placement (None for host_update).
        queries: list of `num_layers` static ``[max_tokens, num_q_heads, head_dim]`` tensors.
        kv_caches: list of `num_layers` ``(k, v)`` static
            ``[num_blocks, block_size, num_kv_heads, head_dim]`` tensors.
        outputs: list of `num_layers` static ``[max_tokens, num_q_heads, head_dim]`` tensors
            (what `step` returns).
        params: the `pyruntime.tiling.TilingParams` frozen at construction.
        last_step_host_seconds: host time of the last step (copies, replay launch,
            updates), excluding the wait for device results: the CPU time of the calling
            thread (``time.thread_time``), i.e. host busy time, so that the CPU backend's
            emulated device threads running concurrently do not inflate it.

    Raises:
        ValueError: unknown mode or placement, or a placement given with host_update;
        AttentionInputError: bad dtype or counts;
        pyruntime.tiling.TilingParamsError: shapes out of the tiling kernel's range.
    """

    def __init__(self, backend: Backend, *, num_layers: int, num_q_heads: int,
                 num_kv_heads: int, head_dim: int, block_size: int, num_blocks: int,
                 max_batch: int, max_tokens: int, max_blocks_per_req: int, mode: str,
                 dtype: torch.dtype, causal: bool = True, num_cores: int | None = None,
                 q_tile: int | None = None, placement: str | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        if mode == "host_update" and placement is not None:
            raise ValueError(f"placement={placement!r} applies to mode='device_tiling' only: "
                             "host_update has no tiling task (drop the placement argument)")
        if mode == "device_tiling":
            placement = "graph" if placement is None else placement
            if placement not in PLACEMENTS:
                raise ValueError(f"placement must be one of {list(PLACEMENTS)}, got "
                                 f"{placement!r}")
        self.backend, self.mode, self.causal = backend, mode, causal
        self.placement = placement
        self.params = TilingParams(
            num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
            block_size=block_size, max_batch=max_batch, max_tokens=max_tokens,
            max_blocks_per_req=max_blocks_per_req,
            num_cores=num_cores or backend.default_num_cores, q_tile=q_tile)
        self._buffers = StaticBuffers(backend, self.params, num_layers=num_layers,
                                      num_blocks=num_blocks, dtype=dtype)
        path = HostUpdatePath if mode == "host_update" else DEVICE_TILING_PATHS[placement]
        self._path = path(backend, self._buffers, causal=causal)
        self._captured = False
        self._stepped = False
        self.last_step_host_seconds = math.nan

    queries = property(lambda self: self._buffers.queries)
    kv_caches = property(lambda self: self._buffers.kv_caches)
    outputs = property(lambda self: self._buffers.outputs)
    block_table = property(lambda self: self._buffers.block_table,
                           doc="The static device block table the graph reads.")

    def capture(self) -> None:
        """Capture the graph of this bucket (once).

        Raises:
            AttentionStateError: already captured.
        """
        if self._captured:
            raise AttentionStateError("capture() was already called for this StaticAttention")
        self._path.capture()
        self._captured = True

    def step(self, block_table: Any, cu_seqlens_q: Any, seqlens_kv: Any) -> list[torch.Tensor]:
        """Run one step of every layer on the current queries and KV caches.

        Args:
            block_table: int32 ``[max_batch, max_blocks_per_req]`` (host tensor or array).
            cu_seqlens_q: int32 ``[live_batch + 1]`` query offsets; rows past the last are
                padding. Zero-length slots (q_len = kv_len = 0) are allowed.
            seqlens_kv: int32 ``[live_batch]`` KV lengths including this step's tokens.

        Returns:
            The `outputs` list: per layer ``[max_tokens, num_q_heads, head_dim]``, padding
            rows zero. Ready when this returns. Bad lengths do not raise here: outputs are
            all zero and `check()` raises.

        Raises:
            AttentionStateError: before `capture()`.
            FrozenSizeError: a size beyond what the capture froze (names it).
            AttentionInputError: wrong type, dtype or rank.
        """
        if not self._captured:
            raise AttentionStateError("step() before capture(): call capture() once first")
        inputs = self._buffers.validate(block_table, cu_seqlens_q, seqlens_kv)
        self.last_step_host_seconds = self._path.step(inputs)
        self._stepped = True
        self._path.wait()
        return self._buffers.outputs

    def check(self) -> None:
        """Raise the last step's tiling error, if any.

        Raises:
            pyruntime.tiling.TilingInputError subclass (QueryOverflowError, KvShortError, ...)
            naming the first offending request, its value and the limit.
        """
        if not self._stepped:
            return
        error = self._path.error()
        if error is not None:
            raise error

    @property
    def graph(self):
        """The captured backend graph (for profiling and tests)."""
        return self._path.graph
