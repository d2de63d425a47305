"""Static (graph-captured) paged attention over L layers, in two modes.

``mode="device_tiling"``: an AI-CPU task plans the tiling from the lengths in device
memory and every layer reads it. ``placement="graph"`` (default) captures that task in
the graph, so a step is two copies and one replay; ``placement="pre-replay"`` launches it
once per step on its own stream, ordered before the replay by an event (for devices whose
graph replay does not re-run captured AI-CPU tasks).
``mode="host_update"``: the vLLM-Ascend baseline; after each replay the host re-plans
and updates every layer's task group.

``logits_soft_cap=C`` (Gemma 2) caps every score to ``C * tanh(s / C)`` before the softmax,
in every mode and placement, on both AI Core consumers (the C reference and the Triton
kernels); the tiling does not change (docs/attention-variants.md). ``sinks=True`` (gpt-oss)
gives every layer a float32 ``[num_q_heads]`` attention-sink tensor, ``attn.sinks[layer]``,
filled in place like the queries: each query head's softmax denominator gains
``exp(sink - m)``. ``sliding_window=W`` (Gemma 2/3, Mistral, gpt-oss) lets the query at
position p see only the keys ``p - W < j <= p``, in every mode, with sinks and the soft cap.
``kv_cache_dtype="int8"`` (vLLM-Ascend's C8) makes the KV caches int8 with per-layer,
per-channel scales and offsets, ``attn.kv_scales[layer] = (k_scale, k_offset, v_scale,
v_offset)``, filled in place: a stored x means ``(x - offset) * scale``.

Lifetime: `close()` (or leaving a ``with`` block) resets the graph, gives back the streams
and frees the buffers; ``owns_backend=True`` also closes the backend. A dropped instance
needs no `close()` for its buffers: garbage collection frees them.

Example (runs on the CPU backend)::

    import torch
    from pyruntime import backends
    from pyruntime.attention import StaticAttention

    attn = StaticAttention(backends.get("cpu"), num_layers=2, num_q_heads=4, num_kv_heads=2,
                           head_dim=16, block_size=8, num_blocks=16, max_batch=4,
                           max_tokens=8, max_blocks_per_req=4, mode="device_tiling",
                           dtype=torch.float32, owns_backend=True)
    for q, (k, v) in zip(attn.queries, attn.kv_caches):  # filled in place, as on a device
        q.normal_(); k.normal_(); v.normal_()
    attn.capture()
    block_table = torch.arange(16, dtype=torch.int32).reshape(4, 4)
    outs = attn.step(block_table,
                     cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32),  # 2 live requests
                     seqlens_kv=torch.tensor([5, 20], dtype=torch.int32))
    attn.check()                 # raises e.g. KvShortError naming the request if lengths were bad
    outs[0].shape                # torch.Size([8, 4, 16]); rows 3..7 are padding, zero
    attn.close()                 # releases what it made and the backend it owns; or use with
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pyruntime.backends import Backend, BackendError
from pyruntime.graph_attention.buffers import StaticBuffers
from pyruntime.graph_attention.device_tiling import PATHS as DEVICE_TILING_PATHS
from pyruntime.graph_attention.device_tiling import PLACEMENTS
from pyruntime.graph_attention.errors import (
    AttentionClosedError,
    AttentionError,
    AttentionInputError,
    AttentionStateError,
    FrozenSizeError,
)
from pyruntime.graph_attention.host_update import HostUpdatePath
from pyruntime.kernels import kv_quant as _kv_quant
from pyruntime.kernels import sliding_window as _sliding_window
from pyruntime.kernels import soft_cap
from pyruntime.tiling import TilingParams

__all__ = ["MODES", "PLACEMENTS", "AttentionClosedError", "AttentionError", "AttentionInputError",
           "AttentionStateError", "FrozenSizeError", "StaticAttention"]

MODES = ("device_tiling", "host_update")


def check_mode(mode: str, placement: str | None) -> str | None:
    """The placement a (mode, placement) pair runs with: ``"graph"`` by default for
    ``device_tiling``, None for ``host_update``. Raises ValueError for an unknown mode or
    placement, or a placement given with ``host_update`` (it has no tiling task)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if mode == "host_update" and placement is not None:
        raise ValueError(f"placement={placement!r} applies to mode='device_tiling' "
                         "only: host_update has no tiling task (drop the placement "
                         "argument)")
    if mode == "device_tiling":
        placement = "graph" if placement is None else placement
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {list(PLACEMENTS)}, got "
                             f"{placement!r}")
    return placement


class StaticAttention:
    """Paged, causal (by default) GQA attention over `num_layers` layers, captured once.

    Ownership: the caller owns `backend` unless ``owns_backend=True``. The attention owns
    what it makes on the backend: its buffers (queries, KV caches, outputs, block table,
    lengths, tiling, partials), its graph and its streams (2 or 3 worker threads on the CPU
    backend). `close()` gives all of these back, so a long-lived backend can serve many
    attentions; with ``owns_backend=True`` it also closes the backend (the CPU backend's
    core pool and remaining threads). Dropping the attention without `close()` frees its
    buffers at garbage collection, but its streams stay on a borrowed backend until that
    backend is closed. Usable as a context manager: ``with StaticAttention(...) as attn:``
    closes on exit.

    Args:
        backend: from ``pyruntime.backends.get``.
        owns_backend: `close()` also closes `backend` (default False: the caller closes it,
            after every attention made on it; a failed construction closes it too).
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
        logits_soft_cap: None (the default: no cap, exactly today's kernels) or a positive,
            finite Python number C: every score ``s = scale * q . k`` (scale
            ``1 / sqrt(head_dim)``) becomes ``C * tanh(s / C)`` before the causal mask and the
            softmax, as vLLM's ``logits_soft_cap`` (Gemma 2's ``attn_logit_softcapping``, e.g.
            50.0). One value for every layer; the kernels compute with it in fp32, like the
            scores, whatever the storage dtype. Not with ``mode="host_update"`` on a backend
            whose host path is torch_npu's FIA (the NPU backend), which has no soft cap.
        sinks: False (the default: no sinks, exactly today's kernels) or True: attention sinks
            (gpt-oss, vLLM's ``sinks``). Every layer gets a float32 ``[num_q_heads]`` device
            tensor, ``sinks[layer]``, zero-filled, which the caller fills in place (``copy_``,
            like ``queries``) before a step; query head h's softmax becomes ``p_j = exp(s_j -
            m) / (exp(sink[h] - m) + sum_k exp(s_k - m))``, m the max of the scores and the
            sink (the sink adds no value; with a soft cap the cap applies to the scores, not
            the sink). The graph reads the tensors at every replay, in every mode. Not with
            ``mode="host_update"`` on a FIA backend (the NPU backend): the FIA prototype we
            call (``pyruntime/npu_twin/fia.py``) has no sink argument.
        sliding_window: None (the default: no window, exactly today's kernels) or an int
            W >= 1 (vLLM's ``sliding_window``): the query at kv position p sees only the keys
            j with ``p - W < j <= p``, its last W positions (Hugging Face's masks, vLLM's
            FlashAttention window ``(W - 1, 0)``). One value for every layer (build one
            attention per window). Causal only. The kernels read no KV block below a unit's
            window, and leave the block-table entries there unread (they may be stale). Works
            with ``sinks`` (gpt-oss's windowed layers) and ``logits_soft_cap``. Not with
            ``mode="host_update"`` on a FIA backend (the NPU backend): torch_npu documents
            FIA's ``pre_tokens`` and ``sparse_mode`` as having no effect when a request has
            one query token (decode), so that path cannot apply the window. 0 is refused: a
            peer's 0 is a one-key window, 1 here (ours is FlashInfer's ``window_left + 1``,
            FlashAttention's ``left + 1``; docs/attention-variants.md has the table).
        kv_cache_dtype: ``"auto"`` (the default: the caches have ``dtype``, exactly today's
            kernels) or ``"int8"`` (vLLM's name; vLLM-Ascend's C8): ``kv_caches`` are int8,
            still ND ``[num_blocks, block_size, num_kv_heads, head_dim]``, and every layer
            gets ``kv_scales[layer] = (k_scale, k_offset, v_scale, v_offset)``, float32
            ``[num_kv_heads, head_dim]`` device tensors (scales 1, offsets 0 until the caller
            fills them in place, like ``queries``). A stored K value x of kv head h, dim d
            means ``(x - k_offset[h, d]) * k_scale[h, d]`` (V likewise): vLLM-Ascend's
            convention, whose ``_quantize_kv_to_int8`` stores ``round(x / scale + offset)``
            (`pyruntime.kernels.kv_quant.quantize` does the same). The kernels dequantise in
            fp32 and accumulate in fp32; queries and outputs keep ``dtype``. Works with every
            other variant. Not with ``mode="host_update"`` on a FIA backend (the NPU
            backend): our FIA call passes no antiquant arguments, and torch_npu documents
            FIA's TND layout (the one we call) as not supporting antiquant (伪量化) and the
            per-channel key/value antiquant modes as unsupported for multi-token queries.

    Attributes:
        placement: the device-tiling placement (None for host_update).
        queries: list of `num_layers` static ``[max_tokens, num_q_heads, head_dim]`` tensors.
        kv_caches: list of `num_layers` ``(k, v)`` static
            ``[num_blocks, block_size, num_kv_heads, head_dim]`` tensors.
        outputs: list of `num_layers` static ``[max_tokens, num_q_heads, head_dim]`` tensors
            (what `step` returns).
        params: the `pyruntime.tiling.TilingParams` frozen at construction.
        logits_soft_cap: the soft cap as a float, or None.
        sinks: with ``sinks=True``, the list of per-layer float32 ``[num_q_heads]`` sink
            tensors (fill them in place); None with ``sinks=False``.
        sliding_window: the window W as an int, or None (no window).
        kv_cache_dtype: ``"auto"`` or ``"int8"``.
        kv_scales: with ``kv_cache_dtype="int8"``, the list of per-layer ``(k_scale, k_offset,
            v_scale, v_offset)`` float32 ``[num_kv_heads, head_dim]`` tensors (fill them in
            place); None with ``"auto"``.
        last_step_host_seconds: host time of the last step (copies, replay launch,
            updates), excluding the wait for device results: the CPU time of the calling
            thread (``time.thread_time``), i.e. host busy time. The step's host part runs
            inside `Backend.hold_device`, so on the CPU backend the emulated device, whose
            threads share the host's cores, does not run during it (it starts when the
            host part ends, or while the host blocks in a synchronize).
        last_step_blocked_seconds: wall time of the last step's host part minus
            `last_step_host_seconds`: how long the host thread was blocked (a synchronize,
            a blocking copy, descheduled) inside it.

    Raises:
        ValueError: unknown mode or placement, or a placement given with host_update;
        AttentionInputError: bad dtype or counts; a logits_soft_cap that is not None or a
            positive finite number (bool, NaN, infinity, zero, negative), or one given with
            host_update on a FIA backend (raised before anything is allocated); ``sinks`` that
            is not a bool, or True with host_update on a FIA backend (raised likewise); a
            sliding_window that is not None or an int >= 1, or given with ``causal=False`` or
            with host_update on a FIA backend (raised likewise); a kv_cache_dtype other than
            "auto" or "int8" ("fp8" included), or "int8" with host_update on a FIA backend
            (raised likewise);
        pyruntime.tiling.TilingParamsError: shapes out of the tiling kernel's range.
        AttentionClosedError: (from every method and buffer attribute) used after `close()`.
    """

    def __init__(self, backend: Backend, *, num_layers: int, num_q_heads: int,
                 num_kv_heads: int, head_dim: int, block_size: int, num_blocks: int,
                 max_batch: int, max_tokens: int, max_blocks_per_req: int, mode: str,
                 dtype: torch.dtype, causal: bool = True, num_cores: int | None = None,
                 q_tile: int | None = None, placement: str | None = None,
                 owns_backend: bool = False, logits_soft_cap: float | None = None,
                 sinks: bool = False, sliding_window: int | None = None,
                 kv_cache_dtype: str = "auto") -> None:
        with self._constructing(backend, owns_backend):
            placement = check_mode(mode, placement)
            self.logits_soft_cap = soft_cap.check(logits_soft_cap, error=AttentionInputError)
            if (self.logits_soft_cap is not None and mode == "host_update"
                    and backend.host_update_attention == "fia"):
                raise AttentionInputError(
                    f"logits_soft_cap={self.logits_soft_cap} with mode='host_update' on the "
                    f"{backend.name} backend: its host path is torch_npu's FIA, which has no "
                    "soft cap; use mode='device_tiling' (our kernels apply it)")
            if not isinstance(sinks, bool):
                raise AttentionInputError(f"sinks must be True or False, got "
                                          f"{type(sinks).__name__} {sinks!r}")
            if sinks and mode == "host_update" and backend.host_update_attention == "fia":
                raise AttentionInputError(
                    f"sinks=True with mode='host_update' on the {backend.name} backend: its "
                    "host path is torch_npu's FIA, and the FIA call we make has no sink "
                    "argument; use mode='device_tiling' (our kernels apply the sinks)")
            self.sliding_window = _sliding_window.check(sliding_window, causal=bool(causal),
                                                        error=AttentionInputError)
            if (self.sliding_window is not None and mode == "host_update"
                    and backend.host_update_attention == "fia"):
                # torch_npu 2.10.0.post4, _op_plugin_docs.py, npu_fused_infer_attention_score:
                # "pre_tokens ... Q_S为1时该参数无效" and "sparse_mode ... Q_S为1且不带rope输入时
                # 该参数无效" (no effect when Q_S is 1): the band (sparse_mode 4, pre_tokens
                # W - 1, next_tokens 0) would give W keys to multi-token queries, and decode rows
                # would silently see their whole context
                raise AttentionInputError(
                    f"sliding_window={self.sliding_window} with mode='host_update' on the "
                    f"{backend.name} backend: its host path is torch_npu's FIA, whose "
                    "pre_tokens and sparse_mode have no effect for one-token (decode) queries, "
                    "so it cannot apply the window; use mode='device_tiling' (our kernels "
                    "apply it)")
            self.kv_cache_dtype = _kv_quant.check(kv_cache_dtype, error=AttentionInputError)
            if (self.kv_cache_dtype == "int8" and mode == "host_update"
                    and backend.host_update_attention == "fia"):
                # torch_npu 2.10.0.post4, _op_plugin_docs.py, npu_fused_infer_attention_score:
                # input_layout TND "不支持...伪量化" (no antiquant in TND, the layout our call
                # uses), and key_antiquant_mode "Q_S大于等于2时仅支持传入值为1" (per-token
                # only for multi-token queries, where our scales are per channel).
                # vLLM-Ascend's own C8 FIA call (attention_v1.py _forward_c8_decode) takes the
                # NZ cache, BNSD and the scale only.
                raise AttentionInputError(
                    "kv_cache_dtype='int8' with mode='host_update' on the "
                    f"{backend.name} backend: its host path is torch_npu's FIA in the TND "
                    "layout, which torch_npu documents as not supporting antiquant (and "
                    "per-channel antiquant not at all for multi-token queries); use "
                    "mode='device_tiling' (our kernels dequantise the int8 caches)")
            self.mode, self.causal, self.placement = mode, causal, placement
            # The window is a tiling parameter (ABI v5): each unit's blocks, and so its cost and
            # its place in the work order, are only those its rows' windows touch.
            self.params = TilingParams(
                num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                block_size=block_size, max_batch=max_batch, max_tokens=max_tokens,
                max_blocks_per_req=max_blocks_per_req,
                num_cores=num_cores or backend.default_num_cores, q_tile=q_tile,
                sliding_window=self.sliding_window)
            self._start(StaticBuffers(backend, self.params, num_layers=num_layers,
                                      num_blocks=num_blocks, dtype=dtype,
                                      logits_soft_cap=self.logits_soft_cap, sinks=sinks,
                                      sliding_window=self.sliding_window,
                                      kv_cache_dtype=self.kv_cache_dtype))

    # The one construction path, StaticMLAAttention's too: `_constructing` around the checks
    # of the layer kind's own arguments, then `_start` with its buffers; the paths by mode.
    _HOST_UPDATE_PATH = HostUpdatePath
    _DEVICE_PATHS = DEVICE_TILING_PATHS

    @contextlib.contextmanager
    def _constructing(self, backend: Backend, owns_backend: bool) -> Iterator[None]:
        """Take `backend` (and its ownership) for the body, which checks the arguments, sets
        mode, causal and placement, and calls `_start`; if the body raises, give back what was
        made, and an owned backend (the caller never gets `self`)."""
        self.backend, self.owns_backend = backend, bool(owns_backend)
        self._closed = False
        self._buffers = self._path = None
        try:
            yield
        except BaseException:
            self.close()
            raise
        self._captured = False
        self._stepped = False
        self.last_step_host_seconds = math.nan
        self.last_step_blocked_seconds = math.nan

    def _start(self, buffers) -> None:
        """Own `buffers` and make the path of this mode and placement over them."""
        self._buffers = buffers
        path = (self._HOST_UPDATE_PATH if self.mode == "host_update"
                else self._DEVICE_PATHS[self.placement])
        self._path = path(self.backend, buffers, causal=self.causal)

    queries = property(lambda self: self._live()[0].queries)
    kv_caches = property(lambda self: self._live()[0].kv_caches)
    outputs = property(lambda self: self._live()[0].outputs)
    sinks = property(lambda self: self._live()[0].sinks,
                     doc="Per-layer float32 [num_q_heads] sink tensors (sinks=True), or None.")
    kv_scales = property(lambda self: getattr(self._live()[0], "kv_scales", None),
                         doc="Per-layer (k_scale, k_offset, v_scale, v_offset) float32 "
                             "[num_kv_heads, head_dim] tensors (kv_cache_dtype='int8'), or "
                             "None.")
    block_table = property(lambda self: self._live()[0].block_table,
                           doc="The static device block table the graph reads.")

    def _live(self):
        """(buffers, path), or AttentionClosedError after `close()`."""
        if self._closed:
            raise AttentionClosedError("this StaticAttention was closed (close() or the end of "
                                       "its with block); construct and capture a new one")
        return self._buffers, self._path

    @property
    def closed(self) -> bool:
        """Whether `close()` has run."""
        return self._closed

    def close(self) -> None:
        """Release the graph, the streams (worker threads on the CPU backend) and every
        buffer, KV caches included; with ``owns_backend=True`` close the backend too.

        Idempotent. Waits for work already enqueued; a device error of a step that already
        raised it is not raised again. Any later use raises `AttentionClosedError`.
        """
        if self._closed:
            return
        self._closed = True
        path, buffers = getattr(self, "_path", None), getattr(self, "_buffers", None)
        self._path = self._buffers = None  # dropped first: a failure below must not pin them
        try:
            if path is not None:
                try:
                    path.wait()
                except BackendError:
                    pass  # the step that failed raised this already; releasing must go on
                path.close()
        finally:
            try:
                if buffers is not None:
                    buffers.free()
            finally:
                if self.owns_backend:
                    self.backend.close()

    def __enter__(self) -> StaticAttention:
        self._live()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def capture(self) -> None:
        """Capture the graph of this bucket (once).

        Raises:
            AttentionStateError: already captured.
        """
        _, path = self._live()
        if self._captured:
            raise AttentionStateError("capture() was already called for this StaticAttention")
        path.capture()
        self._captured = True

    def step(self, block_table: Any, cu_seqlens_q: Any, seqlens_kv: Any, *,
             wait: bool = True,
             before_replay: Callable[[], None] | None = None) -> list[torch.Tensor]:
        """Run one step of every layer on the current queries and KV caches.

        Args:
            block_table: int32 ``[max_batch, max_blocks_per_req]`` (host tensor or array).
            cu_seqlens_q: int32 ``[live_batch + 1]`` query offsets; rows past the last are
                padding. Zero-length slots (q_len = kv_len = 0) are allowed.
            seqlens_kv: int32 ``[live_batch]`` KV lengths including this step's tokens.
            wait: wait for the device before returning (default). With False the step is
                only enqueued, as a serving loop does: the outputs are ready after `wait()`
                (steps enqueued back to back run in order; the inputs are staged at the
                call, so the caller may reuse its arrays at once).
            before_replay: host work a serving loop does between the input copies and the
                replay (vLLM-Ascend's pre-replay synchronize, a hook engine's per-step
                work): called once, inside the measured host part (`last_step_host_seconds`,
                `last_step_blocked_seconds`). The benchmark's symmetric method uses it.

        Returns:
            The `outputs` list: per layer ``[max_tokens, num_q_heads, head_dim]``, padding
            rows zero. Ready when this returns (``wait=True``). Bad lengths do not raise
            here: outputs are all zero and `check()` raises.

        Raises:
            AttentionStateError: before `capture()`.
            FrozenSizeError: a size beyond what the capture froze (names it).
            AttentionInputError: wrong type, dtype or rank.
        """
        buffers, path = self._live()
        if not self._captured:
            raise AttentionStateError("step() before capture(): call capture() once first")
        inputs = buffers.validate(block_table, cu_seqlens_q, seqlens_kv)
        with self.backend.hold_device():  # the device starts once the host part is done
            wall = time.perf_counter()
            self.last_step_host_seconds = path.step(inputs, before_replay)
            wall = time.perf_counter() - wall
        self.last_step_blocked_seconds = max(0.0, wall - self.last_step_host_seconds)
        self._stepped = True
        if wait:
            path.wait()
        return buffers.outputs

    def wait(self) -> None:
        """Block until every step enqueued so far has run on the device.

        Raises:
            pyruntime.backends.DeviceTaskError: a device task of those steps failed.
        """
        self._live()[1].wait()

    def check(self) -> None:
        """Raise the last step's tiling error, if any (after waiting for the device, so
        a step enqueued with ``wait=False`` is checked once it has run).

        Raises:
            pyruntime.tiling.TilingInputError subclass (QueryOverflowError, KvShortError, ...)
            naming the first offending request, its value and the limit.
        """
        _, path = self._live()
        if not self._stepped:
            return
        path.wait()
        error = path.error()
        if error is not None:
            raise error

    @property
    def graph(self):
        """The captured backend graph (for profiling and tests)."""
        return self._live()[1].graph
