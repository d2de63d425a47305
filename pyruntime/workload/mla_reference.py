"""An independent float64 absorbed-MLA attention, one request at a time (numpy), and a
trace-driven step loop that checks a `StaticMLAAttention` against it."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .reference import _f64, relative_error


def reference_mla(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c_cache: torch.Tensor,
                  k_pe_cache: torch.Tensor, block_table: np.ndarray, cu_seqlens_q: np.ndarray,
                  seqlens_kv: np.ndarray, *, scale: float, causal: bool = True) -> np.ndarray:
    """float64 ``[max_tokens, H, L]``; rows of no request are zero.

    Absorbed MLA decode: query head h of token i of a request sees the kv positions
    ``[0, kv_len - q_len + i + 1)`` (causal) or ``[0, kv_len)``, with scores
    ``scale * (q_nope . kv_c_j + q_pe . k_pe_j)`` and values ``kv_c_j``.

    Args:
        q_nope: ``[max_tokens, H, L]``; q_pe: ``[max_tokens, H, R]``.
        kv_c_cache: ``[blocks, block_size, 1, L]``; k_pe_cache: ``[blocks, block_size, 1, R]``.
        block_table: int ``[max_batch, max_blocks_per_req]``; cu_seqlens_q int ``[batch + 1]``;
            seqlens_kv int ``[batch]``.
    """
    qn, qp = _f64(q_nope), _f64(q_pe)
    kvc, kpe = _f64(kv_c_cache), _f64(k_pe_cache)
    block_size = kvc.shape[1]
    out = np.zeros(qn.shape, dtype=np.float64)
    cu, kv = np.asarray(cu_seqlens_q), np.asarray(seqlens_kv)
    for r in range(kv.shape[0]):
        lo, hi, kv_len = int(cu[r]), int(cu[r + 1]), int(kv[r])
        if hi == lo or kv_len == 0:
            continue
        blocks = np.asarray(block_table)[r, : -(-kv_len // block_size)]
        c = kvc[blocks, :, 0].reshape(-1, kvc.shape[-1])[:kv_len]   # [kv, L]
        p = kpe[blocks, :, 0].reshape(-1, kpe.shape[-1])[:kv_len]   # [kv, R]
        s = np.einsum("thl,kl->thk", qn[lo:hi], c) + np.einsum("thr,kr->thk", qp[lo:hi], p)
        s *= scale
        if causal:
            sees = kv_len - (hi - lo) + 1 + np.arange(hi - lo)  # positions token i sees
            seen = np.arange(kv_len)[None, :] < sees[:, None]
            s = np.where(seen[:, None, :], s, -np.inf)
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        out[lo:hi] = np.einsum("thk,kl->thl", s / s.sum(axis=-1, keepdims=True), c)
    return out


@dataclasses.dataclass
class MLALoopStats:
    """What `run_mla_loop` saw: steps run, the worst relative error of any layer's output
    (max |out - ref| / max |ref|), and how many steps were padded (bucket > live batch), had
    speculative-decode requests (q_len > 1) or split a unit (the combine merged pieces)."""

    steps: int = 0
    max_rel_err: float = 0.0
    padded_steps: int = 0
    spec_steps: int = 0
    split_steps: int = 0
    host_seconds: list[float] = dataclasses.field(default_factory=list)


def run_mla_loop(attn, batcher, *, steps: int, seed: int = 0, check: bool = True,
                 on_step=None) -> MLALoopStats:
    """Run up to `steps` steps of `attn` (a captured `StaticMLAAttention`) on `batcher`'s
    batches: fresh N(0, 1) queries each step, `attn.check()`, and (with `check`) every layer's
    output against `reference_mla`. `on_step(i, batch, outputs)` is called after each step
    when given (as `pyruntime.workload.driver.run_decode_loop` does)."""
    from pyruntime import tiling  # the C tiling, only to count the steps with split units

    gen = torch.Generator().manual_seed(seed)
    stats = MLALoopStats()
    for i, batch in zip(range(steps), batcher):
        for q_nope, q_pe in attn.queries:
            q_nope.copy_(torch.randn(q_nope.shape, generator=gen))
            q_pe.copy_(torch.randn(q_pe.shape, generator=gen))
        outputs = attn.step(batch.block_table, batch.cu_seqlens_q, batch.seqlens_kv)
        attn.check()
        if on_step is not None:
            on_step(i, batch, outputs)
        stats.steps += 1
        stats.host_seconds.append(attn.last_step_host_seconds)
        q_lens = np.diff(batch.cu_seqlens_q)[: batch.live]
        stats.padded_steps += batch.bucket > batch.live
        stats.spec_steps += bool((q_lens > 1).any())
        plan = tiling.plan(attn.params, batch.cu_seqlens_q, batch.seqlens_kv)
        stats.split_steps += bool(plan.combine_records())
        if check:
            for layer, out in enumerate(outputs):
                want = reference_mla(*attn.queries[layer], *attn.kv_caches[layer],
                                     batch.block_table, batch.cu_seqlens_q, batch.seqlens_kv,
                                     scale=attn.softmax_scale)
                stats.max_rel_err = max(stats.max_rel_err, relative_error(out, want))
    return stats
