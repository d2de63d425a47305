"""The int8 KV cache: what it means, and the one check of its arguments, for every consumer.

With ``kv_cache_dtype="int8"`` (vLLM's name; vLLM-Ascend's "C8") the K and V caches hold int8
values with a per-channel (per kv head and dim) fp32 scale and offset for each of K and V,
``kv_scales = (k_scale, k_offset, v_scale, v_offset)``, each ``[num_kv_heads, head_dim]``.
A stored value x of kv head h, dim d means::

    (x - offset[h, d]) * scale[h, d]

That is vLLM-Ascend's convention (vllm-ascend 0.30.0rc2 ``vllm_ascend/attention/attention_v1.py``:
``_quantize_kv_to_int8`` stores ``clamp(round(x / scale + offset), -128, 127)``, and
``_forward_c8_fused_infer_attention`` dequantises a contiguous int8 K as ``(key - offset) *
scale``). Its paged NZ paths use the scale alone: the FIA calls pass ``key_antiquant_scale`` /
``value_antiquant_scale`` only, and ``_dequant_paged_kv_to_dense`` says "Scale-only dequant for
NZ (symmetric)"; a zero offset is that case, and the hook hands zero offsets for C8 layers
(`pyruntime.hook.vllm_ascend_c8`). The consumers dequantise in fp32 and accumulate in fp32;
query and output keep their dtype (fp32, fp16 or bf16).

:func:`quantize` writes values into an int8 cache by that rule (tests and callers that fill
``StaticAttention``'s caches); :func:`dequantize` is the float64 meaning of a cache.

Two layouts of an int8 cache, told apart by its rank (both caches of a layer alike):

- ND (4-D) ``[num_blocks, block_size, num_kv_heads, head_dim]``, as the fp/bf16 caches;
- NZ (5-D) ``[num_blocks, num_kv_heads, head_dim // 32, block_size, 32]``: vLLM-Ascend's C8
  cache (vllm-ascend 0.30.0rc2 ``vllm_ascend/attention/attention_v1.py``,
  ``AscendC8AttentionBackendImpl._nz_5d_view``, written by ``torch_npu.npu_scatter_pa_kv_cache``).
  Token t of block b, kv head h, dim d is element
  ``(((b * H + h) * (D / 32) + d / 32) * block_size + t) * 32 + d % 32``. Only for int8 caches
  and ``head_dim % 32 == 0``.

:func:`to_nz` / :func:`from_nz` convert (pure permute and reshape); :func:`cache_layout` is
the one shape check every consumer makes, and :func:`page_strides` the one layout check.

A cache of either layout and dtype may be a view whose blocks lie apart (its page, dim 0,
stride larger than a block's elements), the rest of each block dense: vLLM 0.30 resolves the
``LBNHC`` KV cache layout and vLLM-Ascend 0.30.0rc2 hands each full-attention layer K and V
caches that are views of one allocation, the K and V pages of a block side by side
(``vllm_ascend/worker/model_runner_v1.py:5720-5744``, ``torch.as_strided`` with strides
``(hidden, 2 * hidden, ...)`` over ``(2, num_blocks, block_size, H, D)``, and the same in
``worker/v2/attn_utils.py:687-719``): each cache's page stride is ``2 * block_size * H * D``,
V starting ``block_size * H * D`` elements after K. C8's NZ view of such a cache
(``_nz_5d_view``, a ``.view`` that keeps dim 0's stride) is strided the same way. Every
consumer reads the caches in place with their page strides, never a copy.
"""

from __future__ import annotations

import torch

#: The values of ``kv_cache_dtype``: "auto" (the caches have the query's dtype) and "int8".
KV_CACHE_DTYPES = ("auto", "int8")

#: The cache layouts (:func:`cache_layout`): ND, 4-D, and vLLM-Ascend's NZ, 5-D (int8 only).
ND, NZ = "nd", "nz"
#: Values of one NZ part: dims ``32 k .. 32 k + 31`` of a head, ``block_size`` tokens apart.
NZ_WIDTH = 32


def check(value: object, *, error: type[Exception] = ValueError) -> str:
    """``value`` when it is ``"auto"`` or ``"int8"``.

    Raises:
        error (ValueError unless told otherwise): anything else (``"fp8"`` is not supported).
    """
    if not isinstance(value, str) or value not in KV_CACHE_DTYPES:
        raise error(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, got "
                    f"{type(value).__name__} {value!r}")
    return value


#: The names of ``kv_scales``' four tensors, in order: the ops' keyword arguments and the C
#: struct's fields (``aicpu_attention_kv_int8``).
SCALE_NAMES = ("k_scale", "k_offset", "v_scale", "v_offset")


def scale_kwargs(kv_scales) -> dict:
    """``kv_scales`` as the ops' keyword arguments (``{"k_scale": ..., ...}``); ``{}`` for None
    (caches of the query's dtype: the ops then get no int8 argument at all)."""
    return {} if kv_scales is None else dict(zip(SCALE_NAMES, kv_scales, strict=True))


def check_scales(kv_scales, num_kv_heads: int, head_dim: int, *,
                 error: type[Exception] = ValueError, device: torch.device | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``kv_scales`` as a tuple of four contiguous float32 ``[num_kv_heads, head_dim]`` tensors
    ``(k_scale, k_offset, v_scale, v_offset)`` (on ``device`` when given).

    Raises:
        error: not a sequence of four tensors, or a wrong dtype, shape, device or layout.
    """
    if not isinstance(kv_scales, (tuple, list)) or len(kv_scales) != 4:
        raise error("kv_scales must be a tuple (k_scale, k_offset, v_scale, v_offset) of "
                    f"float32 [{num_kv_heads}, {head_dim}] tensors, got {type(kv_scales).__name__}")
    for name, t in zip(SCALE_NAMES, kv_scales):
        if not isinstance(t, torch.Tensor):
            raise error(f"kv_scales {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise error(f"kv_scales {name} must be float32, got {t.dtype}")
        if tuple(t.shape) != (num_kv_heads, head_dim):
            raise error(f"kv_scales {name} must have shape [{num_kv_heads}, {head_dim}], got "
                        f"{list(t.shape)}")
        if not t.is_contiguous():
            raise error(f"kv_scales {name} must be contiguous")
        if device is not None and t.device != device:
            raise error(f"kv_scales {name} must be on {device}, got {t.device}")
    return tuple(kv_scales)


def quantize(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """int8 ``clamp(round(x / scale + offset), -128, 127)`` of ``x [..., num_kv_heads,
    head_dim]`` (any float dtype), per channel, computed in float64 (vLLM-Ascend's
    ``_quantize_kv_to_int8``, which multiplies by ``1 / scale``; round half to even)."""
    q = torch.round(x.double() / scale.double() + offset.double())
    return q.clamp(-128, 127).to(torch.int8)


def dequantize(cache: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """float64 ``(cache - offset) * scale`` of an int8 cache ``[..., num_kv_heads, head_dim]``:
    the values the kernels attend to."""
    return (cache.double() - offset.double()) * scale.double()


def _nz_parts(head_dim: int) -> int:
    if head_dim % NZ_WIDTH:
        raise ValueError(f"the NZ layout needs head_dim % {NZ_WIDTH} == 0, got head_dim {head_dim}")
    return head_dim // NZ_WIDTH


def to_nz(cache_nd: torch.Tensor) -> torch.Tensor:
    """The NZ copy (contiguous) of an ND cache: ``[num_blocks, block_size, num_kv_heads,
    head_dim]`` -> ``[num_blocks, num_kv_heads, head_dim // 32, block_size, 32]``, same dtype
    and device (a permute and reshape; the values are not touched).

    Raises:
        ValueError: not 4-D, or head_dim % 32 != 0.
    """
    if not isinstance(cache_nd, torch.Tensor) or cache_nd.dim() != 4:
        raise ValueError("to_nz takes a 4-D ND cache [num_blocks, block_size, num_kv_heads, "
                         f"head_dim], got {_describe(cache_nd)}")
    nb, bs, h, d = cache_nd.shape
    parts = _nz_parts(int(d))
    return cache_nd.reshape(nb, bs, h, parts, NZ_WIDTH).permute(0, 2, 3, 1, 4).contiguous()


def from_nz(cache_nz: torch.Tensor) -> torch.Tensor:
    """The ND copy (contiguous) of an NZ cache: ``[num_blocks, num_kv_heads, head_dim // 32,
    block_size, 32]`` -> ``[num_blocks, block_size, num_kv_heads, head_dim]`` (the inverse of
    :func:`to_nz`).

    Raises:
        ValueError: not 5-D with a last dim of 32.
    """
    if not isinstance(cache_nz, torch.Tensor) or cache_nz.dim() != 5 or \
            cache_nz.shape[4] != NZ_WIDTH:
        raise ValueError("from_nz takes a 5-D NZ cache [num_blocks, num_kv_heads, head_dim // "
                         f"32, block_size, 32], got {_describe(cache_nz)}")
    nb, h, parts, bs, _ = cache_nz.shape
    return cache_nz.permute(0, 3, 1, 2, 4).reshape(nb, bs, h, parts * NZ_WIDTH).contiguous()


def _describe(t) -> str:
    return f"shape {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__


def cache_shape(layout: str, num_blocks: int, block_size: int, num_kv_heads: int,
                head_dim: int) -> tuple[int, ...]:
    """The shape of a cache in ``layout`` (:data:`ND` or :data:`NZ`)."""
    if layout == NZ:
        return (num_blocks, num_kv_heads, _nz_parts(head_dim), block_size, NZ_WIDTH)
    return (num_blocks, block_size, num_kv_heads, head_dim)


class CacheStrideError(ValueError):
    """A cache whose memory layout the kernels cannot read in place: anything but dense blocks
    (dims 1.. contiguous) at a page stride of at least one block's elements."""


def page_stride(name: str, cache: torch.Tensor) -> int:
    """Elements from the start of one cache block (dim 0) to the next, after checking that
    each block is dense: dims 1.. have the strides of a contiguous tensor of that shape. A
    contiguous cache gives ``prod(shape[1:])``; vLLM-Ascend 0.30's K and V views (see the
    module docstring) give twice that. A cache of one block has no page to step over: its
    block size is returned whatever dim 0's stride says.

    Raises:
        CacheStrideError: dims 1.. are not dense, or the page stride is below one block's
            elements (blocks would overlap); the message names the strides found.
    """
    shape, strides = tuple(cache.shape), tuple(cache.stride())
    block = 1
    dense = [0] * len(shape)
    for dim in range(len(shape) - 1, 0, -1):
        dense[dim] = block
        block *= int(shape[dim])
    inner_ok = all(strides[d] == dense[d] or shape[d] == 1 for d in range(1, len(shape)))
    if not inner_ok:
        raise CacheStrideError(
            f"{name} of shape {list(shape)} has strides {list(strides)}: only the page (block, "
            f"dim 0) stride may differ from a contiguous tensor's {[block] + dense[1:]}, the "
            "blocks themselves must be dense for the kernels to read them in place")
    if len(shape) == 0 or shape[0] <= 1:
        return block
    if strides[0] < block:
        raise CacheStrideError(
            f"{name} of shape {list(shape)} has page stride {strides[0]}, below one block's "
            f"{block} elements (its blocks would overlap; strides {list(strides)})")
    return int(strides[0])


#: Why the MLA caches (``kv_c``, ``k_pe``) must be contiguous: no release hands them strided.
#: vLLM-Ascend 0.30.0rc2 gives an MLA layer (``AscendMLAAttentionSpec``, not exactly
#: ``FullAttentionSpec``, so never among the strided layers of
#: ``worker/model_runner_v1.py:5008-5016``) its own K (nope) and V (rope) allocations, viewed
#: contiguously (``model_runner_v1.py:5855-5860``; the v2 runner keeps "its K and V components
#: in contiguous regions, as in MRv1", ``worker/v2/attn_utils.py:1647-1657``); 0.23.0.post1
#: views separate contiguous tensors (``model_runner_v1.py:4639-4644``).
MLA_CONTIGUOUS_WHY = ("vLLM-Ascend 0.23.0.post1 and 0.30.0rc2 allocate MLA caches contiguous, "
                      "so the MLA kernels take no page stride")


def contiguous_cache(name: str, cache: torch.Tensor, why: str) -> None:
    """Raise :class:`CacheStrideError` naming ``cache``'s strides unless it is contiguous."""
    if isinstance(cache, torch.Tensor) and not cache.is_contiguous():
        raise CacheStrideError(f"{name} of shape {list(cache.shape)} has strides "
                               f"{list(cache.stride())}, not a contiguous tensor's: {why}")


def page_strides(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int]:
    """``(key, value)`` page strides in elements (:func:`page_stride`), the kernels' block
    stride arguments (``attention_ref.h``: ``key_block_stride``, ``value_block_stride``)."""
    return page_stride("key_cache", key_cache), page_stride("value_cache", value_cache)


def cache_layout(key_cache: torch.Tensor, value_cache: torch.Tensor, *, block_size: int,
                 num_kv_heads: int, head_dim: int, int8: bool,
                 error: type[Exception] = ValueError) -> str:
    """:data:`ND` or :data:`NZ`: the layout of a layer's two caches, told by their rank, after
    checking their shapes (dtypes and devices are the caller's checks, the memory layout
    :func:`page_strides`').

    ND: both 4-D ``[num_blocks, block_size, num_kv_heads, head_dim]``. NZ: both 5-D
    ``[num_blocks, num_kv_heads, head_dim // 32, block_size, 32]``, only with ``int8`` (the
    caches are int8, kv_scales given) and head_dim % 32 == 0. num_blocks is dim 0 in both and
    the value cache must have the key cache's shape.

    Raises:
        error (ValueError unless told otherwise): any other rank or shape, a 5-D cache that is
            not int8, head_dim % 32 != 0 with 5-D caches, or one cache ND and the other NZ.
    """
    nz = (f"NZ [num_blocks, {num_kv_heads}, {head_dim // NZ_WIDTH}, {block_size}, {NZ_WIDTH}]"
          if head_dim % NZ_WIDTH == 0 else f"NZ (needs head_dim % {NZ_WIDTH} == 0)")
    rank = key_cache.dim()
    if rank not in (4, 5):
        raise error(f"key_cache must have shape [num_blocks, {block_size}, {num_kv_heads}, "
                    f"{head_dim}] (ND){f' or {nz}' if int8 else ''}, got "
                    f"{list(key_cache.shape)}")
    if rank == 5 and not int8:
        raise error(f"a 5-D key_cache is the NZ layout, which only int8 caches (kv_scales "
                    f"given) may have; key_cache must have shape [num_blocks, {block_size}, "
                    f"{num_kv_heads}, {head_dim}], got {list(key_cache.shape)}")
    if rank == 5 and head_dim % NZ_WIDTH:
        raise error(f"the NZ layout (5-D caches) needs head_dim % {NZ_WIDTH} == 0, got "
                    f"head_dim {head_dim}")
    layout = NZ if rank == 5 else ND
    want = cache_shape(layout, int(key_cache.shape[0]), block_size, num_kv_heads, head_dim)
    if tuple(key_cache.shape) != want:
        if layout == ND:  # the message the ND-only check gave
            raise error(f"key_cache must have shape [num_blocks, {block_size}, {num_kv_heads}, "
                        f"{head_dim}], got {list(key_cache.shape)}")
        raise error(f"key_cache must have shape {nz[3:]} (NZ), got {list(key_cache.shape)}")
    if value_cache.dim() != rank and value_cache.dim() in (4, 5):
        raise error(f"key_cache and value_cache must have the same layout: key_cache is "
                    f"{layout.upper()} ({rank}-D), value_cache is {value_cache.dim()}-D "
                    f"{list(value_cache.shape)}")
    if value_cache.shape != key_cache.shape:
        raise error(f"value_cache must have key_cache's shape {list(key_cache.shape)}, got "
                    f"{list(value_cache.shape)}")
    return layout
