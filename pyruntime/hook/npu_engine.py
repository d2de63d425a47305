"""The vLLM tiling engine on the NPU backend: what the vLLM-Ascend hook captures into.

`vllm_tiling_engine(backend)` makes it on a `pyruntime.backends.npu.NpuBackend` (the hook's
`engine_loader` calls it); it lives with the hook it serves, above the backends it runs on.

Per graph key (a vLLM-Ascend graph and its token bucket) the engine owns static device
buffers: the tiling, the live batch and the split-KV partials; one step epoch on the device
serves every key. Per layer it
enqueues our attention and combine ops reading that tiling. A graph whose layers have
several sliding windows (gpt-oss: none and 128) has one tiling per distinct window, all
planned by the same task from the key's length buffers and epoch, and each layer reads its
window's. The tiling task (``torch.ops.aicpu_tiling.plan_tiling``, or ``plan_tilings`` for
several tilings in one launch: the torch_npu extension's AI-CPU launch, which forks to its own
flag-0 stream and joins back with sync events) runs:

* placement ``graph``: captured once per key, in the graph, before the key's first layer;
* placement ``pre-replay``: not captured; `before_replay` launches it once per step on the
  current stream, just before the graph replays (the extension orders it by events).

The step epoch is advanced on the device, never written by the host, by ops captured once
per graph before its first device layer, so that every replay advances it:

* ``graph``: an in-place add on the shared epoch, then the key's tiling task, which echoes
  the advanced epoch into its header;
* ``pre-replay``: the tiling tasks `before_replay` launches echo a second buffer, the *plan
  epoch*; the graph's first ops publish it as the step epoch (a device copy) and advance it.
  A key replayed without a tiling task since its graph's last replay, or a replay that
  `before_replay` did not precede, then has a header one advance behind the step epoch.

Attention compares the header's epoch with the step epoch, so a tiling not planned for this
replay (a captured AI-CPU task that a replay did not re-run; a key replayed without its
pre-replay task) is refused: zeros, never a wrong answer. So our path adds no host-to-device
copy, no host wait and no device op per step, whatever the number of captured graphs:
`before_replay` does nothing under ``graph`` and launches only the replayed keys' tiling
tasks under ``pre-replay`` (until issue 30 it made one blocking epoch copy per captured key
per step, each of which synchronised the stream: torch_npu's ``copy_`` without
``non_blocking``; until 2026-12-06 it launched the epoch's advance under ``pre-replay`` as
one more AI Core op per step).
`errors()` reads the tiling headers and the epoch back on demand (device-to-host copies,
for diagnosis only: nothing reads them per step).

The AI-CPU task reads only what the host wrote and the device advanced: the length buffers
the model runner fills (host-to-device copies), the batch constant the hook made outside the
capture and the shared epoch. Padded slots (vLLM-Ascend's uniform padding and FIA dummy
request, kv_len 0 in the device buffer) are trailing padding under tiling ABI v4, so no
AI Core op computes anything the AI-CPU task reads. Never run on an NPU.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from pyruntime import tiling
from pyruntime.backends import BackendError
from pyruntime.kernels import (
    kv_quant,
    mla_step,  # noqa: F401 - hands the MLA ops their bodies
)
from pyruntime.kernels import step as kernels

from .engine import AttentionCapture


def vllm_tiling_engine(backend: Any, placement: str | None = None) -> NpuTilingEngine:
    """The engine the vLLM-Ascend hook captures into on the NPU `backend`, for `placement`
    (default: the one ``aicpu-tiling selfcheck`` saved, or ``$AICPU_TILING_PLACEMENT``).

    Raises:
        BackendError: no placement chosen yet, our kernels not built or not loadable, or
        no NPU attention kernel; the message is the reason the hook logs.
    """
    from pyruntime import placement as placements
    from pyruntime.backends import npu_kernels

    if placement is None:
        placement, where = placements.load()
        if placement is None:
            raise BackendError(where)
    backend.load_kernels()
    reason = npu_kernels.attention_reason()
    if reason is not None:
        raise npu_kernels.KernelsUnavailableError(reason)
    return NpuTilingEngine(placement, num_cores=backend.ai_core_count())


@dataclass
class _KeyBuffers:
    params: tiling.TilingParams  # the first window's (``windows[0]``)
    capture: AttentionCapture  # the key's first layer: its length buffers are the key's
    tiling: torch.Tensor  # the first window's
    epoch: torch.Tensor  # the step epoch the key's layers compare their tiling's with
    partial_out: torch.Tensor
    partial_lse: torch.Tensor
    #: sliding window (None: none) -> (its params, its tiling buffer), one per distinct
    #: window of the graph's layers, planned together by the key's one tiling task
    tilings: dict = field(default_factory=dict)
    #: the epoch the key's tiling task echoes: `epoch` under ``graph``, the engine's plan
    #: epoch under ``pre-replay`` (None: `epoch`)
    plan_epoch: torch.Tensor | None = None

    def echoed_epoch(self) -> torch.Tensor:
        """The buffer whose value the key's tiling task writes into its header."""
        return self.epoch if self.plan_epoch is None else self.plan_epoch


class NpuTilingEngine:
    """`pyruntime.hook.engine.TilingEngine` on torch_npu, for one tiling placement.

    Args:
        placement: ``"graph"`` or ``"pre-replay"``.
        num_cores: AI Cores attention is captured with (the device's AI Core count).
        ops: the op namespace (``torch.ops.aicpu_tiling``; a stand-in in tests).
        launch: how a captured op is enqueued (default: call it, which torch_npu's capture
            records; tests pass a fixture's recorder).
    """

    #: our attention kernel applies a layer's logits soft cap (`AttentionCapture`)
    applies_logits_soft_cap = True
    #: our attention and combine kernels add a layer's attention sinks (`AttentionCapture`)
    applies_sinks = True
    #: our attention applies a layer's sliding window, the model's W keys, over a tiling
    #: planned for that window (`AttentionCapture`)
    applies_sliding_window = True
    #: our attention reads int8 caches with per-channel scales, ND or NZ (vLLM-Ascend's C8
    #: layers; `AttentionCapture.kv_scales`)
    applies_kv_int8 = True

    def __init__(self, placement: str, *, num_cores: int, ops: Any = None,
                 launch: Callable[[Callable[[], None]], None] | None = None):
        from pyruntime.placement import check

        self.placement = check(placement)
        self.name = f"npu-{placement}"
        self.num_cores = num_cores
        if ops is None:
            from pyruntime.kernels import custom_ops

            ops = custom_ops.ops()
        self.ops = ops
        self.launch = launch or (lambda fn: fn())
        self.keys: dict[Hashable, _KeyBuffers] = {}
        #: steps begun (`before_replay` calls): a host count for reports, never copied to
        #: the device (the device's epoch is `_device_epoch`, advanced there)
        self.epoch = 0
        #: int32 ``[1]`` on the device, shared by every key: allocated (never filled: it runs
        #: inside vLLM's capture) with the first key, then only ever advanced by the device
        self._device_epoch: torch.Tensor | None = None
        #: ``pre-replay``: int32 ``[1]``, what the tiling tasks echo, published as the step
        #: epoch and advanced by each replay (``graph``: None, the tasks echo `_device_epoch`)
        self._plan_epoch: torch.Tensor | None = None
        #: the vLLM-Ascend graph keys whose epoch ops are captured (one graph, one advance)
        self._opened_graphs: set[Hashable] = set()
        self.tiling_launches = 0
        self.epoch_advances = 0
        #: graph key -> kv_lora_rank of the MLA keys (`capture_mla`)
        self.mla_lora: dict[Hashable, int] = {}
        #: kernel variants (`_variant`, `_mla_variant`) launched eagerly by `warm_up` and
        #: `warm_up_mla`
        self.warmed: set = set()
        #: layers whose captured attention was its variant's first launch (not warmed up)
        self.cold_captures: list = []

    # ---- capture ----------------------------------------------------------------------------
    def _buffers(self, c: AttentionCapture) -> _KeyBuffers:
        device = c.query.device
        params = tiling.TilingParams(
            num_q_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_size,
            block_size=c.block_size, max_batch=int(c.seq_lens.numel()),
            max_tokens=int(c.query.shape[0]), max_blocks_per_req=int(c.block_table.shape[1]),
            num_cores=self.num_cores)
        # one tiling per distinct window the graph's layers have (ABI v5: a windowed tiling
        # costs and cuts only the blocks its rows see); all share the key's lengths and epoch
        windows = sorted({c.sliding_window, *c.graph_windows}, key=lambda w: w or 0)
        tilings = {w: replace(params, sliding_window=w) for w in windows}  # None: no window
        params = tilings[windows[0]]
        slots = max(1, max(t.max_partial_slots for t in tilings.values()))

        # Allocation only: this runs inside vLLM's capture, where a zeros()/fill_() would be
        # a captured task re-run at every replay (wiping the tiling under pre-replay,
        # resetting the epoch under graph). Every buffer is written before it is read: the
        # tiling by the tiling task, which echoes the epoch (whatever its first value: only
        # equality counts); until then the attention sees a header that fails validation
        # and writes zeros.
        def empty(shape, dtype):
            return torch.empty(shape, dtype=dtype, device=device)

        buffers = {w: (t, empty((t.tiling_bytes,), torch.uint8)) for w, t in tilings.items()}
        epoch = self._epoch_buffer(device)
        return _KeyBuffers(params, c, buffers[windows[0]][1], epoch,
                           empty((slots, params.q_tile, params.group, params.head_dim),
                                 torch.float32),
                           empty((slots, params.q_tile, params.group), torch.float32),
                           buffers, self._plan_epoch)

    def _epoch_buffer(self, device: torch.device) -> torch.Tensor:
        """The device epoch every key shares (allocated with the first key, with the plan
        epoch under ``pre-replay``)."""
        if self._device_epoch is None:
            self._device_epoch = torch.empty((1,), dtype=torch.int32, device=device)
            if self.placement == "pre-replay":
                self._plan_epoch = torch.empty((1,), dtype=torch.int32, device=device)
        return self._device_epoch

    def _advance_epoch(self) -> None:
        """Advance the shared epoch on the device (``graph``): one AI Core op, captured, no
        host copy; int32 wraps, only equality with a header counts."""
        self._device_epoch.add_(1)
        self.epoch_advances += 1

    def _publish_epoch(self) -> None:
        """``pre-replay``'s advance, captured: the plan epoch the step's tiling tasks echoed
        becomes the step epoch, then the plan epoch advances for the next step's tasks (two
        AI Core ops, on the device only)."""
        self._device_epoch.copy_(self._plan_epoch)
        self._plan_epoch.add_(1)
        self.epoch_advances += 1

    def _open_graph(self, graph_key: Hashable) -> None:
        """Capture the epoch's advance once per graph, before its first device layer (and,
        under ``graph``, before the first key's tiling task): a graph holding a GQA and an
        MLA key advances it once per replay, so both keys' tilings echo the same epoch."""
        if graph_key in self._opened_graphs:
            return
        self._opened_graphs.add(graph_key)
        self.launch(self._advance_epoch if self.placement == "graph" else self._publish_epoch)

    def _plan(self, key: _KeyBuffers, count: bool = True) -> None:
        c = key.capture
        lengths = {"cu_seqlens_q": c.query_start_loc, "seqlens_kv": c.seq_lens,
                   "batch": c.batch, "step_epoch": key.echoed_epoch(), "causal": c.causal}
        if len(key.tilings) <= 1:
            self.ops.plan_tiling(tiling_out=key.tiling, params=kernels.params_list(key.params),
                                 **lengths)
        else:  # every window's tiling in the one AI-CPU launch of the step
            planned = list(key.tilings.values())
            self.ops.plan_tilings(tiling_outs=[t for _, t in planned],
                                  params=[v for p, _ in planned for v in kernels.params_list(p)],
                                  **lengths)
        self.tiling_launches += count  # the steps' launches, not `warm_up`'s

    def capture_attention(self, capture: AttentionCapture) -> None:
        """Enqueue (the key's tiling task under ``graph``, then) this layer's attention."""
        c = capture
        key = self.keys.get(c.graph_key)
        if key is None:
            key = self.keys[c.graph_key] = self._buffers(c)
            # captured before the key's layers, re-run by every replay of its graph
            self._open_graph(c.graph_key)
            if self.placement == "graph":
                self.launch(lambda k=key: self._plan(k))
        elif (c.num_heads, c.num_kv_heads, c.head_size) != (
                key.params.num_q_heads, key.params.num_kv_heads, key.params.head_dim):
            raise BackendError(f"layer {c.layer_name}: head geometry differs from the first "
                               "layer of its graph; one tiling serves one geometry")
        if c.sliding_window not in key.tilings:
            # the tiling task plans the windows known when the key's first layer was captured
            # (graph: it is captured right then); a layer with another window cannot join
            raise BackendError(f"layer {c.layer_name}: sliding window {c.sliding_window} is "
                               "not among the windows this graph's tiling task plans "
                               f"({sorted(w or 0 for w in key.tilings)}; 0: none)")
        variant = _variant(c, key.tilings[c.sliding_window][0])
        if variant not in self.warmed:
            # its first launch is this captured one: Triton compiles it inside the capture
            self.cold_captures.append(c.layer_name)
        self.launch(self._attention(c, key))

    def warm_up(self, capture: AttentionCapture) -> bool:
        """Outside any capture: launch once, eagerly, the kernels `capture_attention` would
        capture for this layer (its tiling task, attention and combine: the same variant and
        geometry), on scratch buffers of that geometry, so that Triton compiles and loads them
        here and not inside vLLM's capture. The layer's own tensors are only read (the output
        goes to a scratch tensor). Called by the hook after vLLM's eager warm-up forward of
        each capture size; a variant already launched is not launched again.

        Returns:
            True when it launched (a variant not seen before).

        Raises:
            BackendError, TypeError, ValueError: what the launches raise (the hook then keeps
            the layer on vLLM-Ascend's path).
        """
        c = capture
        scratch = self._buffers(c)  # allocation is allowed here: no capture is open
        variant = _variant(c, scratch.tilings[c.sliding_window][0])
        return self._launch_eagerly(variant, scratch, c, self._attention, c.query.device)

    def _launch_eagerly(self, variant, scratch: _KeyBuffers, c, attention,
                        device: torch.device) -> bool:
        """`warm_up` and `warm_up_mla`'s launch: unless `variant` was launched before, plan
        `scratch`'s tiling and run `attention` (`_attention` or `_mla_attention`) over it at
        once, into a scratch output. The scratch key gets an epoch of its own: the keys'
        shared device epoch is only ever advanced (a reset could make an old header's epoch
        current again)."""
        if variant in self.warmed:
            return False
        scratch = replace(scratch, epoch=torch.zeros((1,), dtype=torch.int32, device=device),
                          plan_epoch=None)
        self._plan(scratch, count=False)
        attention(replace(c, output=torch.empty_like(c.output)), scratch)()
        self.warmed.add(variant)
        return True

    def _attention(self, c: AttentionCapture, key: _KeyBuffers) -> Callable[[], None]:
        """The launches of one layer's attention and combine over `key`'s tiling."""
        p, tiling_in = key.tilings[c.sliding_window]
        cache = (c.key_cache.shape[0], p.block_size, p.num_kv_heads, p.head_dim)
        # int8 caches with their scales: a 5-D (NZ, vLLM-Ascend's C8 view) cache goes to the
        # kernels as it is, which read its layout from its rank (pyruntime.kernels.kv_quant)
        kv_scales = kv_quant.scale_kwargs(c.kv_scales)
        if c.kv_scales is not None and c.key_cache.dim() == 5:
            key_cache, value_cache = c.key_cache, c.value_cache
        else:
            key_cache, value_cache = c.key_cache.view(cache), c.value_cache.view(cache)
        out = c.output.view(c.output.shape[0], p.num_q_heads, p.head_dim)
        common = {"cu_seqlens_q": c.query_start_loc, "step_epoch": key.epoch,
                  "tiling_in": tiling_in, "out": out, "partial_out": key.partial_out,
                  "partial_lse": key.partial_lse, "params": kernels.params_list(p)}

        # the layer's own sinks tensor to both kernels (the sink enters each row once: where a
        # whole unit normalises it, or in the combine for split rows); passed only when the
        # layer has sinks, so other layers launch with exactly the arguments they had before
        sinks = {} if c.sinks is None else {"sinks": c.sinks}
        # the window to the attention only (as StaticAttention's step), likewise only when set
        window = {} if c.sliding_window is None else {"sliding_window": c.sliding_window}

        def attention() -> None:
            self.ops.paged_attention(query=c.query, key_cache=key_cache,
                                     value_cache=value_cache,
                                     block_table=c.block_table, seqlens_kv=c.seq_lens,
                                     scale=c.scale, causal=c.causal,
                                     logits_soft_cap=c.logits_soft_cap, **sinks, **window,
                                     **kv_scales, **common)
            self.ops.attention_combine(**sinks, **common)

        return attention

    def _mla_buffers(self, c) -> _KeyBuffers:
        from pyruntime.mla_attention import mla_tiling_params

        params = mla_tiling_params(
            num_heads=c.num_heads, kv_lora_rank=c.kv_lora_rank,
            qk_rope_head_dim=c.qk_rope_head_dim, block_size=c.block_size,
            max_batch=int(c.seq_lens.numel()), max_tokens=int(c.q_nope.shape[0]),
            max_blocks_per_req=int(c.block_table.shape[1]), num_cores=self.num_cores)
        slots = max(1, params.max_partial_slots)

        def empty(shape, dtype):  # allocation only, as in _buffers
            return torch.empty(shape, dtype=dtype, device=c.q_nope.device)

        # the key's length buffers, as an AttentionCapture for _plan (always causal: decode)
        lengths = AttentionCapture(
            graph_key=c.graph_key, layer_name=c.layer_name, query=c.q_nope, key_cache=None,
            value_cache=None, block_table=c.block_table, query_start_loc=c.query_start_loc,
            seq_lens=c.seq_lens, batch=c.batch, output=c.output, num_heads=c.num_heads,
            num_kv_heads=1, head_size=params.head_dim, block_size=c.block_size, scale=c.scale,
            causal=True)
        tiling_buffer = empty((params.tiling_bytes,), torch.uint8)
        # its one tiling under `tilings` too, so that errors() reads MLA keys as GQA ones
        epoch = self._epoch_buffer(c.q_nope.device)
        return _KeyBuffers(params, lengths, tiling_buffer, epoch,
                           empty((slots, params.q_tile, params.group, c.kv_lora_rank),
                                 torch.float32),
                           empty((slots, params.q_tile, params.group), torch.float32),
                           {None: (params, tiling_buffer)}, self._plan_epoch)

    def capture_mla(self, capture) -> None:
        """Enqueue (the key's tiling task under ``graph``, then) one MLA layer's decode.

        ``capture``: a `pyruntime.hook.vllm_ascend_mla.MLACapture`. The key's tiling is
        planned as GQA with one kv head and ``head_dim = kv_lora_rank + qk_rope_head_dim``
        (`pyruntime.mla_attention.mla_tiling_params`), once per step, shared by the graph's MLA
        layers; the kernels read the layer's caches in place and write ``capture.output``.

        Raises:
            BackendError: the layer's geometry differs from its graph's first MLA layer (one
                tiling serves one geometry).
        """
        c = capture
        # the MLA layers of a graph key have a tiling of their own, beside any GQA layers' (a
        # graph mixing both gets two tiling tasks per step)
        mla_key = mla_graph_key(c.graph_key)
        key = self.keys.get(mla_key)
        geometry = (c.num_heads, 1, c.kv_lora_rank + c.qk_rope_head_dim)
        if key is None:
            key = self.keys[mla_key] = self._mla_buffers(c)
            self.mla_lora[mla_key] = c.kv_lora_rank
            # captured before the key's layers, re-run by every replay of its graph
            self._open_graph(c.graph_key)
            if self.placement == "graph":
                self.launch(lambda k=key: self._plan(k))
        elif (self.mla_lora.get(mla_key) != c.kv_lora_rank or geometry != (
                key.params.num_q_heads, key.params.num_kv_heads, key.params.head_dim)):
            raise BackendError(f"layer {c.layer_name}: MLA geometry differs from the first "
                               "layer of its graph; one tiling serves one geometry")
        if _mla_variant(c, key.params) not in self.warmed:
            # its first launch is this captured one: Triton compiles it inside the capture
            self.cold_captures.append(c.layer_name)
        self.launch(self._mla_attention(c, key))

    def warm_up_mla(self, capture) -> bool:
        """`warm_up` for one MLA layer: outside any capture, launch once, eagerly, what
        `capture_mla` would capture for it (the tiling task, ``mla_attention`` and
        ``mla_combine``: the same variant and geometry) on scratch tiling, partial and output
        buffers, so that Triton compiles them here and not inside vLLM's capture. The layer's
        query and caches are only read. Called by the hook after vLLM-Ascend's eager
        ``_forward_decode`` in vLLM's warm-up run of each capture size; a variant already
        launched is not launched again.

        Args:
            capture: a `pyruntime.hook.vllm_ascend_mla.MLACapture` (its ``graph_key`` unused).

        Returns:
            True when it launched (a variant not seen before).

        Raises:
            BackendError, TypeError, ValueError: what the launches raise (the hook then keeps
            the layer on vLLM-Ascend's path).
        """
        c = capture
        scratch = self._mla_buffers(c)  # allocation is allowed here: no capture is open
        return self._launch_eagerly(_mla_variant(c, scratch.params), scratch, c,
                                    self._mla_attention, c.q_nope.device)

    def _mla_attention(self, c, key: _KeyBuffers) -> Callable[[], None]:
        """The launches of one MLA layer's decode and combine over `key`'s tiling."""
        common = {"cu_seqlens_q": c.query_start_loc, "step_epoch": key.epoch,
                  "tiling_in": key.tiling, "out": c.output, "partial_out": key.partial_out,
                  "partial_lse": key.partial_lse, "params": kernels.params_list(key.params),
                  "kv_lora_rank": c.kv_lora_rank}

        def attention() -> None:
            self.ops.mla_attention(q_nope=c.q_nope, q_pe=c.q_pe, kv_c_cache=c.kv_c_cache,
                                   k_pe_cache=c.k_pe_cache, block_table=c.block_table,
                                   seqlens_kv=c.seq_lens, scale=c.scale, causal=True, **common)
            self.ops.mla_combine(**common)

        return attention

    # ---- every step -------------------------------------------------------------------------
    def before_replay(self, num_tokens: int | None = None) -> None:
        """Before a graph replays. Under ``graph`` nothing reaches the device (the replay
        advances the epoch and re-runs the tiling task); under ``pre-replay``: the tiling
        task of each key of `num_tokens` (every key when None), enqueued, echoing the plan
        epoch that the replay then publishes: no host-to-device copy, no host wait and no
        other device op, whatever the key count."""
        self.epoch = self.epoch % (2**31 - 1) + 1
        if self.placement != "pre-replay":
            return
        for graph_key, key in self.keys.items():
            if num_tokens is None or _tokens_of(graph_key) == num_tokens:
                self._plan(key)

    def device_epoch(self) -> int | None:
        """The shared epoch as the device holds it now (a device-to-host copy: diagnosis
        only); None before the first capture."""
        if self._device_epoch is None:
            return None
        return int(self._device_epoch.cpu()[0])

    def errors(self) -> dict[Hashable, tiling.TilingError]:
        """The tiling errors per key as of now, GQA and MLA keys alike (reads the epoch and
        every tiling header back): a key whose tiling was not planned for the last replay is
        stale (every key but those of the last replayed graph)."""
        found = {}
        current = self.device_epoch()
        for graph_key, key in self.keys.items():
            for params, buffer in key.tilings.values():  # the first error of the key
                planned = kernels.tiling_status(params, buffer.cpu())
                if planned.epoch != current:
                    found[graph_key] = tiling.StaleTilingError(planned.epoch, current)
                elif planned.error is not None:
                    found[graph_key] = planned.error
                if graph_key in found:
                    break
        return found


def _variant(c: AttentionCapture, params: tiling.TilingParams) -> tuple:
    """What our Triton kernels are compiled for, for this layer: the tiling params (compile-time
    constants: `pyruntime.kernels.triton_launch.constants`, the window among them), the
    dtypes, the cache layout (rank) and the on/off switches (soft cap, sinks, window, int8),
    and the device."""
    return (str(c.query.device), params, c.query.dtype, c.key_cache.dtype, c.key_cache.dim(),
            c.output.dtype, bool(c.causal), c.logits_soft_cap is not None,
            None if c.sinks is None else c.sinks.dtype, c.sliding_window is not None,
            c.kv_scales is not None)


def _mla_variant(c: Any, params: tiling.TilingParams) -> tuple:
    """What our Triton MLA kernels are compiled for, for this MLA layer: the tiling params
    (compile-time constants, `pyruntime.mla_attention.mla_tiling_params`), the latent and rope
    widths, the query, cache and output dtypes, and the device."""
    return ("mla", str(c.q_nope.device), params, c.kv_lora_rank, c.qk_rope_head_dim,
            c.q_nope.dtype, c.kv_c_cache.dtype, c.output.dtype)


def mla_graph_key(graph_key: Hashable) -> Hashable:
    """The engine's key for the MLA layers of vLLM-Ascend graph key ``(graph, num_tokens,
    ...)``."""
    return (*graph_key, "mla") if isinstance(graph_key, tuple) else (graph_key, None, "mla")


def _tokens_of(graph_key: Hashable) -> int | None:
    """The token bucket of a key: ``(graph, num_tokens, ...)`` (the hook's keys, with the
    graph's batch descriptor third: `pyruntime.hook.vllm_ascend_patches.graph_key_of`) or
    its MLA key; None for any other key."""
    if isinstance(graph_key, tuple) and len(graph_key) >= 2 and isinstance(graph_key[1], int):
        return graph_key[1]
    return None
