"""An independent float64 attention, one request at a time (numpy), for checking outputs."""

from __future__ import annotations

import numpy as np
import torch

from pyruntime.kernels import kv_quant as _kv_quant
from pyruntime.kernels import sliding_window as _sliding_window


def _f64(t: torch.Tensor) -> np.ndarray:
    # via float32: exact for every storage dtype, and far faster than bf16 -> float64; a
    # device tensor is read back first (.numpy() refuses device memory, as on torch_npu)
    return t.detach().float().cpu().numpy().astype(np.float64)


def reference_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        block_table: np.ndarray, cu_seqlens_q: np.ndarray,
                        seqlens_kv: np.ndarray, *, scale: float, causal: bool = True,
                        band: tuple[int, int] | None = None,
                        logits_soft_cap: float | None = None,
                        sinks: torch.Tensor | np.ndarray | None = None,
                        sliding_window: int | None = None,
                        kv_scales: tuple[torch.Tensor, ...] | None = None) -> np.ndarray:
    """float64 ``[max_tokens, num_q_heads, head_dim]``; rows of no request are zero.

    Args:
        query: ``[max_tokens, Hq, D]``; key_cache, value_cache: ``[blocks, bs, Hkv, D]``,
            or (int8 caches, with ``kv_scales``) vLLM-Ascend's NZ layout ``[blocks, Hkv,
            D // 32, bs, 32]`` (`kv_quant.from_nz` reads it back to ND first).
        block_table: int ``[max_batch, max_blocks_per_req]``; cu_seqlens_q int
            ``[batch + 1]``; seqlens_kv int ``[batch]``.
        band: ``(before, after)``: the query at kv position p sees only the keys
            p - before .. p + after (FIA's sparse_mode 4 with pre_tokens, next_tokens). With
            ``before = W`` that is W + 1 keys, vLLM-Ascend's host path for a window W; the
            model's window is ``sliding_window``.
        logits_soft_cap: None (off) or C > 0: every score ``s = scale * q . k`` becomes
            ``C * tanh(s / C)`` before the mask and the softmax (vLLM's definition; float64
            throughout, C taken as given).
        sinks: None (off) or ``[Hq]`` attention-sink logits (gpt-oss): query head h's softmax
            denominator gains ``exp(sinks[h] - m)``, m the row's max over its scores and the
            sink, and the sink adds no value: ``p_j = exp(s_j - m) / (exp(sinks[h] - m) +
            sum_k exp(s_k - m))`` (vLLM's ``sinks``; the soft cap, when on, caps the scores and
            not the sink).
        sliding_window: None (off), or W >= 1 with ``causal`` (0 is refused): the query at kv
            position p sees only the keys j with ``p - W < j <= p`` (W keys; Hugging Face's
            masks, vLLM's FlashAttention window ``(W - 1, 0)``). Block-table entries of blocks
            that no row's window reaches are not read (they may be stale, as when a serving
            engine frees them).
        kv_scales: None (the caches hold values) or ``(k_scale, k_offset, v_scale, v_offset)``,
            each ``[Hkv, D]``: the caches are int8 and a stored x means
            ``(x - offset) * scale`` per kv head and dim (vLLM-Ascend's C8;
            `pyruntime.kernels.kv_quant`), computed in float64.

    Raises:
        ValueError: ``sliding_window`` with ``causal=False``, 0, negative or not an int; 5-D
            (NZ) caches without ``kv_scales``.
    """
    window = _sliding_window.check(sliding_window, causal=causal)
    # a float64 host reference: device tensors come to the host once, before any indexing
    query, key_cache, value_cache = (t.detach().cpu() for t in (query, key_cache, value_cache))
    if key_cache.dim() == 5 or value_cache.dim() == 5:   # NZ: the values in ND order
        if kv_scales is None:
            raise ValueError("5-D (NZ) caches are int8 only: pass kv_scales")
        key_cache, value_cache = _kv_quant.from_nz(key_cache), _kv_quant.from_nz(value_cache)
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    group = query.shape[1] // num_kv_heads
    out = np.zeros(tuple(query.shape), dtype=np.float64)
    if sinks is not None:
        sink = (_f64(sinks) if isinstance(sinks, torch.Tensor) else np.asarray(sinks, np.float64))
        sink = sink.reshape(-1, 1, 1)  # [Hq, 1, 1] against s [Hq, q_len, kv_len]
    for r in range(len(seqlens_kv)):
        q0, q1, kv_len = int(cu_seqlens_q[r]), int(cu_seqlens_q[r + 1]), int(seqlens_kv[r])
        q_len = q1 - q0
        if q_len == 0:
            continue
        # the first block any row sees (0 without a window): kv positions start at base
        first = _sliding_window.first_block(kv_len, q_len, 0, window, int(block_size))
        base = first * int(block_size)
        blocks = torch.from_numpy(
            np.ascontiguousarray(block_table[r, first : -(-kv_len // block_size)]))
        k = _f64(key_cache[blocks]).reshape(-1, num_kv_heads, head_dim)[: kv_len - base]
        v = _f64(value_cache[blocks]).reshape(-1, num_kv_heads, head_dim)[: kv_len - base]
        if kv_scales is not None:
            k_scale, k_offset, v_scale, v_offset = (_f64(t)[None] for t in kv_scales)
            k = (k - k_offset) * k_scale
            v = (v - v_offset) * v_scale
        k = np.repeat(k, group, axis=1)  # [kv_len, Hq, D]
        v = np.repeat(v, group, axis=1)
        s = np.einsum("qhd,khd->hqk", _f64(query[q0:q1]), k) * scale
        if logits_soft_cap is not None:
            s = logits_soft_cap * np.tanh(s / logits_soft_cap)
        pos = np.arange(base, kv_len)[None, :]
        at = (kv_len - q_len + np.arange(q_len))[:, None]
        if causal:
            s = np.where((pos <= at)[None], s, -np.inf)
        if window is not None:
            s = np.where((pos > at - window)[None], s, -np.inf)
        if band is not None:
            s = np.where(((pos >= at - band[0]) & (pos <= at + band[1]))[None], s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        if sinks is not None:
            m = np.maximum(m, sink)
        p = np.exp(s - m)
        den = p.sum(axis=-1, keepdims=True)
        if sinks is not None:
            den = den + np.exp(sink - m)
        p /= den
        out[q0:q1] = np.einsum("hqk,khd->qhd", p, v)
    return out


def relative_error(got: torch.Tensor, want: np.ndarray) -> float:
    """max |got - want| / max |want| (0 when both are zero)."""
    err = float(np.abs(_f64(got) - want).max(initial=0.0))
    scale = float(np.abs(want).max(initial=0.0))
    return err / scale if scale else err
