"""The AI Core MLA decode kernel in Triton, driven by the device tiling (one source, two places).

``mla_decode_kernel`` is what each AI Core does with its range of a tiling planned for MLA
geometry (``aicpu_kernels/attention_mla_ref.h``): one latent kv head, ``num_q_heads`` = the
rank's heads, ``head_dim = kv_lora_rank + qk_rope_head_dim``. It computes what the C reference
``aicpu_mla_core`` does (same row order ``[token in tile][head]``, same partial layout
``[slot][token in tile][head][kv_lora_rank]``, same natural-log LSE with ``-inf`` for a piece
that sees no position and ``+inf`` for a poisoned piece), so the two are interchangeable. The
combine is not here: it is ``triton_attention.attention_combine_kernel`` launched with
``HEAD_DIM = kv_lora_rank`` (the MLA partials are the GQA partials of that width), see
`pyruntime.kernels.triton_mla_launch`.

The same source runs under Triton's interpreter on CPU tensors and compiles with Triton-Ascend
(``tools/ascend_compile.py --mla``); never import it directly to launch (see
`triton_launch.kernels`). Its walk of the tiling is ``triton_attention._walk_core``, the GQA
kernel's, with `_mla_segment` as the segment; it follows every constraint listed there
(fixed grid of ``num_cores`` programs, structured control flow only, ``tl.dot`` tiles powers of
two >= 16, range checks before every address, ``UPCAST_DOT`` for bf16 under the interpreter).
What is particular to MLA:

- Scores are two ``tl.dot`` products summed, ``q_nope . kv_c`` over ``BLOCK_L`` and
  ``q_pe . k_pe`` over ``BLOCK_R``, read from the two caches vLLM-Ascend keeps (no
  concatenated copy); the value tile is the ``kv_c`` tile already loaded for the scores, so
  each cache row is read once per row block.
- Tiles for the 576-wide rows: the accumulator is ``BLOCK_M x BLOCK_L`` fp32 (16 x 512 = 32 KiB
  at DeepSeek-V3's kv_lora_rank) and a kv tile ``BLOCK_N x (BLOCK_L + BLOCK_R)`` in the storage
  dtype; ``triton_mla_launch.block_shapes`` keeps ``BLOCK_M`` at 16 and ``BLOCK_N`` at 32 for
  a 512-wide latent, so the UB plan stays inside the A2's 192 KB (the planned bytes are in
  docs/mla.md, from ``tools/ascend_compile.py --mla``). A unit of more than ``BLOCK_M`` rows
  (more heads, or MTP tokens) runs its row blocks one after the other, each reading the unit's
  kv again.
"""

from __future__ import annotations

import triton
import triton.language as tl

# attention_combine_kernel is re-exported: it is the MLA combine too (at HEAD_DIM =
# kv_lora_rank), so tools/ascend_compile.py --mla finds both kernels in this module (its inner
# run, outside the package, puts triton_attention in sys.modules under this package's name)
from .triton_attention import _walk_core, attention_combine_kernel

__all__ = ["attention_combine_kernel", "mla_decode_kernel"]


@triton.jit
def _mla_segment(q_nope, q_pe, kv_c_cache, k_pe_cache, value_cache, block_table, out,
                 partial_out, partial_lse, scale, soft_cap, sinks, sliding_window, k_scale,
                 k_offset, v_scale, v_offset, key_page_stride, value_page_stride, r, h, t, kb,
                 ke, slot, blocks_ok, q_start, q_len, kv_len, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                 KV_LORA_RANK: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 MAX_BLOCKS_PER_REQ: tl.constexpr, Q_TILE: tl.constexpr, CAUSAL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
                 BLOCK_R: tl.constexpr, UPCAST_DOT: tl.constexpr, USE_SOFT_CAP: tl.constexpr,
                 USE_SINKS: tl.constexpr, USE_WINDOW: tl.constexpr, KV_INT8: tl.constexpr,
                 KV_NZ: tl.constexpr):
    """The MLA segment of ``triton_attention._walk_core`` (its SEGMENT, whose parameters these
    are in MLA's terms: query = q_nope, query_rope = q_pe, key_cache = kv_c_cache,
    key_rope_cache = k_pe_cache). ``value_cache`` is None (the values are the kv_c tile the
    scores loaded), ``h`` is 0 (one kv head), and GQA's variants (soft cap, sinks, window,
    int8) are off and never read, as are the page strides (None): the MLA caches are
    contiguous on every release the hook takes (`kv_quant.MLA_CONTIGUOUS_WHY`; the launcher
    refuses others with `kv_quant.CacheStrideError`).
    Kv blocks [kb, ke) of unit (r, t): rows (token in tile, head) attend with the latent
    cache. A whole unit (slot < 0) writes its output rows; a piece writes slot ``slot``."""
    tok0 = t * Q_TILE
    ntok = tl.minimum(q_len - tok0, Q_TILE)
    rows = ntok * NUM_HEADS
    shift = kv_len - q_len
    offs_l = tl.arange(0, BLOCK_L)
    l_ok = offs_l < KV_LORA_RANK
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < ROPE_DIM
    bt_row = block_table + r * MAX_BLOCKS_PER_REQ
    for m0 in range(0, rows, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)            # row = token in tile * H + head
        row_ok = offs_m < rows
        tok = offs_m // NUM_HEADS
        q_row = (q_start + tok0 + tok).to(tl.int64) * NUM_HEADS + offs_m % NUM_HEADS
        qn = tl.load(q_nope + q_row[:, None] * KV_LORA_RANK + offs_l[None, :],
                     mask=row_ok[:, None] & l_ok[None, :], other=0.0)
        qp = tl.load(q_pe + q_row[:, None] * ROPE_DIM + offs_r[None, :],
                     mask=row_ok[:, None] & r_ok[None, :], other=0.0)
        if UPCAST_DOT:
            qn = qn.to(tl.float32)
            qp = qp.to(tl.float32)
        if CAUSAL:
            limit = tl.where(row_ok, shift + tok0 + tok + 1, 0)   # row sees [0, limit)
        else:
            limit = tl.where(row_ok, kv_len, 0)
        kv_hi = tl.minimum(tl.max(limit, axis=0), ke * BLOCK_SIZE)
        b_hi = tl.where(blocks_ok, tl.minimum(ke, tl.cdiv(kv_hi, BLOCK_SIZE)), kb)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_L], tl.float32)
        for b in range(kb, b_hi):
            block_id = tl.load(bt_row + b).to(tl.int64)
            for c0 in range(0, BLOCK_SIZE, BLOCK_N):
                offs_n = c0 + tl.arange(0, BLOCK_N)       # token in the cache block
                pos = b * BLOCK_SIZE + offs_n              # kv position in the request
                kv_ok = pos < kv_hi
                token = block_id * BLOCK_SIZE + offs_n     # cache row (one kv head)
                kc = tl.load(kv_c_cache + token[:, None] * KV_LORA_RANK + offs_l[None, :],
                             mask=kv_ok[:, None] & l_ok[None, :], other=0.0)
                kp = tl.load(k_pe_cache + token[:, None] * ROPE_DIM + offs_r[None, :],
                             mask=kv_ok[:, None] & r_ok[None, :], other=0.0)
                if UPCAST_DOT:
                    kc = kc.to(tl.float32)
                    kp = kp.to(tl.float32)
                s = (tl.dot(qn, tl.trans(kc)) + tl.dot(qp, tl.trans(kp))) * scale
                s = tl.where(pos[None, :] < limit[:, None], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing
                alpha = tl.exp(m_i - m_use)
                p = tl.exp(s - m_use[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                p = p.to(kv_c_cache.dtype.element_ty)     # P in the storage dtype, as GQA
                if UPCAST_DOT:
                    p = p.to(tl.float32)
                acc = acc * alpha[:, None] + tl.dot(p, kc)   # V: the kv_c tile of the scores
                m_i = m_new
        seen = l_i > 0.0                      # rows that saw no position stay 0, lse -inf
        l_safe = tl.where(seen, l_i, 1.0)
        o = acc * tl.where(seen, 1.0 / l_safe, 0.0)[:, None]
        store_mask = row_ok[:, None] & l_ok[None, :]
        if slot < 0:
            tl.store(out + q_row[:, None] * KV_LORA_RANK + offs_l[None, :],
                     o.to(out.dtype.element_ty), mask=store_mask)
        else:
            slot_row = (slot * Q_TILE * NUM_HEADS + offs_m).to(tl.int64)
            tl.store(partial_out + slot_row[:, None] * KV_LORA_RANK + offs_l[None, :], o,
                     mask=store_mask)
            lse = tl.where(seen, m_i + tl.log(l_safe), float("-inf"))
            lse = tl.where(blocks_ok, lse, float("inf"))   # poisoned: combine zeroes the unit
            tl.store(partial_lse + slot_row, lse, mask=row_ok)


@triton.jit
def mla_decode_kernel(
    tiling, step_epoch, q_nope, q_pe, kv_c_cache, k_pe_cache, block_table, cu_seqlens_q,
    seqlens_kv, out, partial_out, partial_lse, core_status, scale, num_blocks,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, MAX_BATCH: tl.constexpr, MAX_TOKENS: tl.constexpr,
    MAX_BLOCKS_PER_REQ: tl.constexpr, NUM_CORES: tl.constexpr, Q_TILE: tl.constexpr,
    MAX_SLOTS: tl.constexpr, CAUSAL: tl.constexpr,
    MAGIC: tl.constexpr, VERSION: tl.constexpr, OK: tl.constexpr, E_TILING: tl.constexpr,
    E_BLOCK_ID: tl.constexpr, E_STALE: tl.constexpr, HDR_EPOCH: tl.constexpr,
    HDR_MAGIC: tl.constexpr, HDR_VERSION: tl.constexpr,
    HDR_STATUS: tl.constexpr, HDR_BATCH: tl.constexpr, HDR_NUM_TOKENS: tl.constexpr,
    HDR_NUM_CORES: tl.constexpr, HDR_NUM_COMBINE: tl.constexpr, HDR_FLAGS: tl.constexpr,
    HEADER_WORDS: tl.constexpr, CORE_WORDS: tl.constexpr, CORE_BEGIN: tl.constexpr,
    CORE_END: tl.constexpr, CORE_FIRST_SLOT: tl.constexpr, CORE_LAST_SLOT: tl.constexpr,
    CORE_NUM_SEGMENTS: tl.constexpr, COMB_WORDS: tl.constexpr, COMB_REQUEST: tl.constexpr,
    COMB_KV_HEAD: tl.constexpr, COMB_Q_TILE: tl.constexpr, COMB_FIRST_SLOT: tl.constexpr,
    COMB_NUM_PIECES: tl.constexpr,
    KV_LORA_RANK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    """Program ``pid`` = AI Core ``pid``: ``triton_attention._walk_core`` with `_mla_segment`.

    Tensors as in ``attention_mla_ref.h`` (TENSORS); the tiling was planned with NUM_KV_HEADS
    = 1 and HEAD_DIM = KV_LORA_RANK + rope. ``core_status[pid]`` receives what
    ``triton_attention.paged_attention_kernel`` reports: OK, the tiling's own status, E_STALE,
    E_TILING or E_BLOCK_ID. The walk is that kernel's (kv head, request, query tile), with
    one kv head.
    """
    _walk_core(_mla_segment, tiling, step_epoch, cu_seqlens_q, seqlens_kv, block_table,
               core_status, num_blocks, query=q_nope, query_rope=q_pe, key_cache=kv_c_cache,
               key_rope_cache=k_pe_cache, value_cache=None, out=out, partial_out=partial_out,
               partial_lse=partial_lse, scale=scale, soft_cap=None, sinks=None,
               sliding_window=None, k_scale=None, k_offset=None, v_scale=None, v_offset=None,
               key_page_stride=None, value_page_stride=None, NUM_Q_HEADS=NUM_Q_HEADS, NUM_KV_HEADS=NUM_KV_HEADS, VALUE_DIM=KV_LORA_RANK,
               ROPE_DIM=HEAD_DIM - KV_LORA_RANK, BLOCK_SIZE=BLOCK_SIZE, MAX_BATCH=MAX_BATCH,
               MAX_TOKENS=MAX_TOKENS, MAX_BLOCKS_PER_REQ=MAX_BLOCKS_PER_REQ,
               NUM_CORES=NUM_CORES, Q_TILE=Q_TILE, MAX_SLOTS=MAX_SLOTS, CAUSAL=CAUSAL,
               MAGIC=MAGIC, VERSION=VERSION, OK=OK, E_TILING=E_TILING, E_BLOCK_ID=E_BLOCK_ID,
               E_STALE=E_STALE, HDR_EPOCH=HDR_EPOCH, HDR_MAGIC=HDR_MAGIC,
               HDR_VERSION=HDR_VERSION, HDR_STATUS=HDR_STATUS, HDR_BATCH=HDR_BATCH,
               HDR_NUM_CORES=HDR_NUM_CORES, HDR_FLAGS=HDR_FLAGS, HEADER_WORDS=HEADER_WORDS,
               CORE_WORDS=CORE_WORDS, CORE_BEGIN=CORE_BEGIN, CORE_END=CORE_END,
               CORE_FIRST_SLOT=CORE_FIRST_SLOT, CORE_LAST_SLOT=CORE_LAST_SLOT,
               CORE_NUM_SEGMENTS=CORE_NUM_SEGMENTS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
               BLOCK_V=BLOCK_L, BLOCK_R=BLOCK_R, UPCAST_DOT=UPCAST_DOT, USE_SOFT_CAP=False,
               USE_SINKS=False, USE_WINDOW=False, KV_INT8=False, KV_NZ=False)
