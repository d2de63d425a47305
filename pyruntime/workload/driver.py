"""The decode loop: feed a `StaticAttention` step after step and check every output.

Example::

    attn = StaticAttention(backend, ..., mode="device_tiling", dtype=torch.float32)
    batcher = ContinuousBatcher(load_trace(limit=500), max_batch=8, ..., buckets=[2, 4, 8])
    stats = run_decode_loop(attn, batcher, steps=200)
    stats.max_rel_err, stats.host_seconds
"""

from __future__ import annotations

import dataclasses

import torch

from pyruntime.kernels import kv_quant

from .batching import ContinuousBatcher
from .reference import reference_attention, relative_error


@dataclasses.dataclass
class LoopStats:
    """What a decode loop saw.

    Attributes:
        steps: steps run; max_rel_err: worst relative error over every step and layer
        (NaN when not checked); host_seconds: `last_step_host_seconds` of each step;
        padded_steps / spec_steps / prefill_steps: steps with a padded bucket, with
        several query tokens for some request, with a prefill chunk.
    """

    steps: int = 0
    max_rel_err: float = float("nan")
    host_seconds: list[float] = dataclasses.field(default_factory=list)
    padded_steps: int = 0
    spec_steps: int = 0
    prefill_steps: int = 0
    zero_length_slots: int = 0


def randomize(attn, *, seed: int = 0) -> None:
    """Fill every layer's KV cache with N(0, 1) values (in place, storage dtype; int8 caches
    get them quantised with the layer's current ``attn.kv_scales``, vLLM-Ascend's rule)."""
    gen = torch.Generator().manual_seed(seed)
    kv_scales = getattr(attn, "kv_scales", None)
    for layer, (k, v) in enumerate(attn.kv_caches):
        # each with its own shape: MLA's pair is (kv_c [.., L], k_pe [.., R])
        k_values, v_values = (torch.randn(t.shape, generator=gen) for t in (k, v))
        if kv_scales is not None:
            k_scale, k_offset, v_scale, v_offset = (t.cpu() for t in kv_scales[layer])
            k_values = kv_quant.quantize(k_values, k_scale, k_offset)
            v_values = kv_quant.quantize(v_values, v_scale, v_offset)
        k.copy_(k_values)
        v.copy_(v_values)


def run_decode_loop(attn, batcher: ContinuousBatcher, *, steps: int, check: bool = True,
                    seed: int = 0, on_step=None, query_scale: float = 1.0) -> LoopStats:
    """Run up to `steps` steps (fewer if the requests run out).

    Each step fills every layer's query with fresh N(0, query_scale**2) values (a larger scale
    gives larger scores, e.g. for a logits soft cap to bend), steps `attn`, calls
    `attn.check()` and, when `check`, compares every layer's output with the float64
    per-request reference (`max_rel_err`), with the attention's `logits_soft_cap`,
    `sliding_window`, `sinks` and int8 `kv_scales` (read at each step: the caller may fill
    them) when it has them. `on_step(i, batch, outputs)` is called after each step when given.
    """
    gen = torch.Generator().manual_seed(seed)
    stats = LoopStats(max_rel_err=0.0 if check else float("nan"))
    scale = attn.params.head_dim ** -0.5
    soft_cap = getattr(attn, "logits_soft_cap", None)
    sinks = getattr(attn, "sinks", None)
    window = getattr(attn, "sliding_window", None)
    kv_scales = getattr(attn, "kv_scales", None)
    for i, batch in zip(range(steps), batcher):
        for q in attn.queries:
            q.copy_(query_scale * torch.randn(q.shape, generator=gen))
        outputs = attn.step(batch.block_table, batch.cu_seqlens_q, batch.seqlens_kv)
        attn.check()
        stats.steps += 1
        stats.host_seconds.append(attn.last_step_host_seconds)
        q_lens = batch.cu_seqlens_q[1:] - batch.cu_seqlens_q[:-1]
        stats.padded_steps += batch.bucket > batch.live
        stats.zero_length_slots += batch.bucket - batch.live
        stats.spec_steps += bool((q_lens[: batch.live] > 1).any()) and batch.prefills == 0
        stats.prefill_steps += batch.prefills > 0
        if check:
            for layer, out in enumerate(outputs):
                k, v = attn.kv_caches[layer]
                want = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                           batch.cu_seqlens_q, batch.seqlens_kv, scale=scale,
                                           causal=attn.causal, logits_soft_cap=soft_cap,
                                           sinks=None if sinks is None else sinks[layer],
                                           sliding_window=window,
                                           kv_scales=None if kv_scales is None
                                           else kv_scales[layer])
                stats.max_rel_err = max(stats.max_rel_err, relative_error(out, want))
        if on_step is not None:
            on_step(i, batch, outputs)
    return stats
