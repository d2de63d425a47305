"""The reference MLA decode attention (the AI Core role) on CPU torch tensors.

A thin, checked wrapper over ``aicpu_kernels/attention_mla_ref.h``: :func:`mla_core` runs what
one AI Core does with its range of a tiling planned for MLA geometry (one latent kv head,
``head_dim = kv_lora_rank + qk_rope_head_dim``), :func:`mla_finalize` merges split-KV pieces
and zeroes the padding rows. Running ``mla_core`` for every core and then ``mla_finalize``
computes one absorbed-MLA layer::

    import torch
    from pyruntime import tiling
    from pyruntime.kernels import reference_mla as rm

    L, R, H = 64, 16, 8                                    # kv_lora_rank, rope dim, heads
    params = tiling.TilingParams(num_q_heads=H, num_kv_heads=1, head_dim=L + R,
                                 block_size=16, max_batch=2, max_tokens=4,
                                 max_blocks_per_req=4, num_cores=3)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)        # decode + a 2-token MTP request
    kv = torch.tensor([40, 20], dtype=torch.int32)
    plan = tiling.plan(params, cu.numpy(), kv.numpy())
    q_nope, q_pe = torch.randn(4, H, L).bfloat16(), torch.randn(4, H, R).bfloat16()
    kv_c, k_pe = torch.randn(8, 16, 1, L).bfloat16(), torch.randn(8, 16, 1, R).bfloat16()
    bt = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    out = torch.empty(4, H, L, dtype=torch.bfloat16)
    po, pl = rm.partial_buffers(params, L)
    for core in range(params.num_cores):
        rm.mla_core(params, L, plan, core, q_nope=q_nope, q_pe=q_pe, kv_c_cache=kv_c,
                    k_pe_cache=k_pe, block_table=bt, cu_seqlens_q=cu, seqlens_kv=kv, out=out,
                    partial_out=po, partial_lse=pl, scale=(L + R) ** -0.5)
    assert rm.mla_finalize(params, L, plan, cu_seqlens_q=cu, out=out, partial_out=po,
                           partial_lse=pl) == rm.OK        # row 3 is zero

Both return the C status (``OK``, the tiling's own status, ``E_TILING``, ``E_BLOCK_ID``), as
`pyruntime.kernels.reference_attention` does; misuse (type, dtype, shape, device, contiguity,
params that are not MLA params) raises ``TypeError`` / ``ValueError`` before any C code runs.
"""

from __future__ import annotations

import dataclasses

import torch

from pyruntime import tiling as _tiling
from pyruntime.kernels import kv_quant as _kv_quant
from pyruntime.kernels import reference_attention as _ra

# the GQA wrapper's argument checks and pointer casts: the same rules for the same C ABI
from pyruntime.kernels.reference_attention import _ptr, _tensor, _tiling_ptr

_ffi, _lib = _ra._ffi, _ra._lib

OK, E_ARGS, E_TILING, E_BLOCK_ID = _ra.OK, _ra.E_ARGS, _ra.E_TILING, _ra.E_BLOCK_ID
DTYPE_CODES = _ra.DTYPE_CODES
strerror = _ra.strerror


def check_params(params, kv_lora_rank: int) -> None:
    """Raise ValueError unless ``params`` plan MLA: one kv head, ``head_dim >= kv_lora_rank``."""
    if isinstance(kv_lora_rank, bool) or not isinstance(kv_lora_rank, int):
        raise TypeError(f"kv_lora_rank must be an int, got {type(kv_lora_rank).__name__}")
    if _lib.aicpu_mla_params_check(params._c_params(), kv_lora_rank) != OK:
        raise ValueError(f"not MLA tiling params: need num_kv_heads == 1 and 1 <= kv_lora_rank "
                         f"({kv_lora_rank}) <= head_dim ({params.head_dim})")


def latent_params(params, kv_lora_rank: int) -> _tiling.TilingParams:
    """``params`` with ``head_dim = kv_lora_rank``: the geometry of the MLA output, partials and
    combine (a tiling planned with ``params`` is one for these too: the buffer does not depend
    on head_dim)."""
    return dataclasses.replace(params, head_dim=int(kv_lora_rank))


def partial_shapes(params, kv_lora_rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(partial_out, partial_lse) shapes: ``[slots, q_tile, H, L]``, ``[slots, q_tile, H]``."""
    return _ra.partial_shapes(latent_params(params, kv_lora_rank))


def partial_buffers(params, kv_lora_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Freshly allocated float32 (partial_out, partial_lse) for an MLA layer."""
    return _ra.partial_buffers(latent_params(params, kv_lora_rank))


def _check_batch(tiling_ptr, cu_seqlens_q: torch.Tensor, seqlens_kv: torch.Tensor | None):
    """The length arrays must cover the tiling's live batch (the C code reads that many)."""
    if tiling_ptr[_lib.AICPU_TILING_HDR_STATUS] != OK:
        return
    batch = int(tiling_ptr[_lib.AICPU_TILING_HDR_BATCH])
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < batch + 1:
        raise ValueError(f"cu_seqlens_q must be 1-D with at least {batch + 1} entries (the "
                         f"tiling's batch + 1), got shape {list(cu_seqlens_q.shape)}")
    if seqlens_kv is not None and (seqlens_kv.dim() != 1 or seqlens_kv.numel() < batch):
        raise ValueError(f"seqlens_kv must be 1-D with at least {batch} entries (the tiling's "
                         f"batch), got shape {list(seqlens_kv.shape)}")


def _partials(params, kv_lora_rank, partial_out, partial_lse):
    out_shape, lse_shape = partial_shapes(params, kv_lora_rank)
    if partial_out is not None:
        _tensor("partial_out", partial_out, torch.float32, out_shape)
    if partial_lse is not None:
        _tensor("partial_lse", partial_lse, torch.float32, lse_shape)
    return _ptr("float *", partial_out), _ptr("float *", partial_lse)


def mla_core(params, kv_lora_rank: int, tiling_buffer, core: int, *, q_nope: torch.Tensor,
             q_pe: torch.Tensor, kv_c_cache: torch.Tensor, k_pe_cache: torch.Tensor,
             block_table: torch.Tensor, cu_seqlens_q: torch.Tensor, seqlens_kv: torch.Tensor,
             out: torch.Tensor, partial_out: torch.Tensor | None,
             partial_lse: torch.Tensor | None, scale: float, causal: bool = True) -> int:
    """AI Core ``core``'s share of one MLA layer (``aicpu_mla_core``); returns the C status.

    Args:
        params: the `TilingParams` the tiling was planned with (``num_kv_heads == 1``,
            ``head_dim = kv_lora_rank + R``); kv_lora_rank: L.
        tiling_buffer: a `pyruntime.tiling.Tiling`, or its buffer (int32 / uint8 tensor or
            numpy array).
        q_nope: ``[max_tokens, H, L]``; q_pe: ``[max_tokens, H, R]`` (storage dtype: float32,
            float16 or bfloat16, the same for every tensor but the int32 ones).
        kv_c_cache: ``[num_blocks, block_size, 1, L]``; k_pe_cache: ``[num_blocks, block_size,
            1, R]``.
        block_table: int32 ``[max_batch, max_blocks_per_req]``; cu_seqlens_q, seqlens_kv: the
            int32 lengths the tiling was planned from.
        out: ``[max_tokens, H, L]``: whole units write their rows.
        partial_out, partial_lse: float32 ``[slots, q_tile, H, L]`` / ``[slots, q_tile, H]``
            (`partial_buffers`); None only when no core has a split.
        scale: the softmax scale; causal: the flag the tiling was planned with.

    Raises:
        TypeError, ValueError: misuse, before any C code runs.
    """
    check_params(params, kv_lora_rank)
    c_params = params._c_params()
    tiling_ptr = _tiling_ptr(params, c_params, tiling_buffer)
    heads, lora = int(params.num_q_heads), int(kv_lora_rank)
    rope = int(params.head_dim) - lora
    rows = int(params.max_tokens)
    _tensor("out", out, shape=(rows, heads, lora), dtypes=tuple(DTYPE_CODES))
    _tensor("q_nope", q_nope, out.dtype, (rows, heads, lora))
    _tensor("q_pe", q_pe, out.dtype, (rows, heads, rope))
    _tensor("kv_c_cache", kv_c_cache, out.dtype, contiguous=False)
    blocks = int(kv_c_cache.shape[0]) if kv_c_cache.dim() == 4 else -1
    cache = (blocks, int(params.block_size), 1)
    if kv_c_cache.dim() != 4 or tuple(kv_c_cache.shape[1:]) != (*cache[1:], lora):
        raise ValueError(f"kv_c_cache must have shape [num_blocks, {params.block_size}, 1, "
                         f"{lora}], got {list(kv_c_cache.shape)}")
    _tensor("k_pe_cache", k_pe_cache, out.dtype, (*cache, rope), contiguous=False)
    for name, t in (("kv_c_cache", kv_c_cache), ("k_pe_cache", k_pe_cache)):
        _kv_quant.contiguous_cache(name, t, _kv_quant.MLA_CONTIGUOUS_WHY)
    if blocks >= 2**31:
        raise ValueError("kv_c_cache has more than 2**31 - 1 blocks")
    _tensor("block_table", block_table, torch.int32,
            (int(params.max_batch), int(params.max_blocks_per_req)))
    _tensor("cu_seqlens_q", cu_seqlens_q, torch.int32)
    _tensor("seqlens_kv", seqlens_kv, torch.int32)
    if not 0 <= core < int(params.num_cores):
        raise ValueError(f"core must be in [0, {params.num_cores}), got {core}")
    po, pl = _partials(params, kv_lora_rank, partial_out, partial_lse)
    _check_batch(tiling_ptr, cu_seqlens_q, seqlens_kv)
    flags = _lib.AICPU_TILING_CAUSAL if causal else 0
    return int(_lib.aicpu_mla_core(
        c_params, lora, tiling_ptr, int(core), flags, DTYPE_CODES[out.dtype], float(scale),
        _ptr("const void *", q_nope), _ptr("const void *", q_pe),
        _ptr("const void *", kv_c_cache), _ptr("const void *", k_pe_cache), blocks,
        _ptr("const int32_t *", block_table), _ptr("const int32_t *", cu_seqlens_q),
        _ptr("const int32_t *", seqlens_kv), _ptr("void *", out), po, pl))


def mla_finalize(params, kv_lora_rank: int, tiling_buffer, *, cu_seqlens_q: torch.Tensor,
                 out: torch.Tensor, partial_out: torch.Tensor | None,
                 partial_lse: torch.Tensor | None) -> int:
    """The combine step of an MLA layer (``aicpu_mla_finalize``); returns the C status.

    Merges the pieces of every split unit into ``out`` (``[max_tokens, H, L]``) and zeroes the
    padding rows; every row when the tiling is not OK. Arguments as for :func:`mla_core`.

    Raises:
        TypeError, ValueError: misuse, before any C code runs.
    """
    check_params(params, kv_lora_rank)
    c_params = params._c_params()
    tiling_ptr = _tiling_ptr(params, c_params, tiling_buffer)
    shape = (int(params.max_tokens), int(params.num_q_heads), int(kv_lora_rank))
    _tensor("out", out, shape=shape, dtypes=tuple(DTYPE_CODES))
    _tensor("cu_seqlens_q", cu_seqlens_q, torch.int32)
    po, pl = _partials(params, kv_lora_rank, partial_out, partial_lse)
    _check_batch(tiling_ptr, cu_seqlens_q, None)
    return int(_lib.aicpu_mla_finalize(c_params, int(kv_lora_rank), tiling_ptr,
                                       DTYPE_CODES[out.dtype],
                                       _ptr("const int32_t *", cu_seqlens_q),
                                       _ptr("void *", out), po, pl))
