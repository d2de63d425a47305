"""An independent float64 absorbed-MLA attention, one request at a time (numpy)."""

from __future__ import annotations

import numpy as np
import torch

from .reference import _f64


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
