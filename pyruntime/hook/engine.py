"""The device-tiling engine the vLLM-Ascend patch set captures into: what it is handed.

A patched attention layer hands its tensors to an engine as an :class:`AttentionCapture`
while the graph is being captured. The engine must, inside the active capture,

* enqueue the AI-CPU tiling task once per step per graph (the first layer of a graph
  key triggers it; later layers reuse its tiling buffer), reading ``query_start_loc``
  and ``seq_lens`` from device memory at replay time, and
* enqueue the attention for this layer reading that device tiling and writing ``output``.

Nothing it captures may need a host update per replay.

How it is found: `pyruntime.hook.engine_loader.load_engine` (the NPU engine itself is
`pyruntime.hook.npu_engine`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

#: Environment variable naming an engine factory as ``"package.module:callable"``.
ENGINE_ENV = "AICPU_TILING_ENGINE"

#: SoC name prefixes (``torch.npu.get_device_name()``) the tiling kernel is built for.
SUPPORTED_SOCS = ("Ascend910B", "Ascend910_93")


@dataclass(frozen=True)
class AttentionCapture:
    """One layer's attention, as the patched ``full_graph_fia`` sees it at capture.

    Shapes follow vLLM-Ascend's TND decode path: ``query`` ``[T, num_heads, head_size]``;
    ``key_cache``/``value_cache`` ``[num_blocks, block_size, num_kv_heads * head_size]``;
    ``block_table`` int32 ``[n, max_blocks_per_req]``; ``query_start_loc`` int32
    ``[n + 1]`` and ``seq_lens`` int32 ``[n]`` (the model runner's persistent device
    buffers, refilled in place before each replay; padded slots have kv_len 0, trailing
    padding under tiling ABI v4); ``batch`` int32 ``[1]`` holding ``n`` (written once,
    outside the capture); ``output`` ``[T, num_heads * head_size]`` or
    ``[T, num_heads, head_size]``. ``logits_soft_cap``: None (no cap) or the layer's C > 0
    (finite): every score ``s = scale * q . k`` must become ``C * tanh(s / C)`` before the
    softmax (`pyruntime.kernels.soft_cap`); the patch set sends a capped layer only to an
    engine whose ``applies_logits_soft_cap`` is True (see :class:`TilingEngine`).
    ``sinks``: None (no sinks) or the layer's own attention-sink tensor (gpt-oss's learnable
    sinks, vLLM-Ascend's ``impl.sinks``), float32 ``[num_heads]``, contiguous, on the query's
    device: query head h's softmax denominator gains ``exp(sinks[h] - m)`` and the sink adds no
    value (`pyruntime.workload.reference.reference_attention`). It is the tensor the model
    holds, not a copy: the kernels read it at every replay. The patch set sends a layer with
    sinks only to an engine whose ``applies_sinks`` is True.
    ``sliding_window``: None (none) or the layer's W >= 1: a query at kv position p sees the
    keys j with ``p - W < j <= p`` (W keys: the model's definition,
    `pyruntime.kernels.sliding_window`; vLLM-Ascend's FIA band keeps W + 1). ``graph_windows``:
    every distinct window (None for none) of the model's layers the hook has seen built, so
    that the tiling task captured with a graph's first layer plans one tiling per window the
    graph can hold. The patch set sends a windowed layer only to an engine whose
    ``applies_sliding_window`` is True.
    ``kv_scales``: None (the caches hold the query's dtype) or the int8 caches' fp32
    ``(k_scale, k_offset, v_scale, v_offset)``, each contiguous ``[num_kv_heads, head_size]``
    on the query's device: a stored x of kv head h, dim d means ``(x - offset[h, d]) *
    scale[h, d]`` (`pyruntime.kernels.kv_quant`). The caches are then int8, and vLLM-Ascend's
    C8 layers hand them in their NZ layout, ``[num_blocks, num_kv_heads, head_size // 32,
    block_size, 32]`` views of the layer's own tensors. The patch set sends such a layer only
    to an engine whose ``applies_kv_int8`` is True.
    """

    graph_key: Hashable
    layer_name: str | None
    query: Any
    key_cache: Any
    value_cache: Any
    block_table: Any
    query_start_loc: Any
    seq_lens: Any
    batch: Any
    output: Any
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    scale: float
    causal: bool
    logits_soft_cap: float | None = None
    sinks: Any = None
    sliding_window: int | None = None
    graph_windows: tuple = ()
    kv_scales: Any = None


@runtime_checkable
class TilingEngine(Protocol):
    """What the patch set needs from a backend: capture one layer's tiled attention."""

    name: str

    def capture_attention(self, capture: AttentionCapture) -> None:
        """Enqueue (tiling once per step and graph key, then) this layer's attention."""

    # Optional: ``applies_logits_soft_cap: bool`` (absent means False): True when
    # capture_attention passes ``capture.logits_soft_cap`` to its kernels. Layers with a soft
    # cap keep vLLM-Ascend's host path on an engine without it.
    #
    # Optional: ``applies_sinks: bool`` (absent means False): True when capture_attention
    # passes ``capture.sinks`` to its kernels. Layers with sinks keep vLLM-Ascend's host path
    # (FIA v2) on an engine without it.
    #
    # Optional: ``applies_sliding_window: bool`` (absent means False): True when
    # capture_attention passes ``capture.sliding_window`` to its kernels (and plans a tiling
    # per window of ``capture.graph_windows``). Windowed layers keep the host path otherwise.
    #
    # Optional: ``applies_kv_int8: bool`` (absent means False): True when capture_attention
    # reads int8 caches, 4-D ND or 5-D NZ, with ``capture.kv_scales``. C8 layers keep the host
    # path otherwise.
    #
    # Optional: ``before_replay(num_tokens: int | None) -> None``, called before every
    # replay of a graph that holds device-tiled layers (after ACLGraphWrapper's own
    # synchronize): a new step epoch; the tiling task itself under the pre-replay
    # placement. num_tokens is the graph's token bucket, None when unknown.
