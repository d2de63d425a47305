"""The int8 KV cache: what it means, and the one check of its arguments, for every consumer.

With ``kv_cache_dtype="int8"`` (vLLM's name; vLLM-Ascend's "C8") the K and V caches hold int8
values with a per-channel (per kv head and dim) fp32 scale and offset for each of K and V,
``kv_scales = (k_scale, k_offset, v_scale, v_offset)``, each ``[num_kv_heads, head_dim]``.
A stored value x of kv head h, dim d means::

    (x - offset[h, d]) * scale[h, d]

That is vLLM-Ascend 0.30.0rc2's convention (``vllm_ascend/attention/attention_v1.py``:
``_quantize_kv_to_int8`` stores ``clamp(round(x / scale + offset), -128, 127)``, and the dense
fallback dequantises ``(key - offset) * scale``; its FIA path passes ``key_antiquant_scale``
only, the symmetric case, which a zero offset covers). The consumers dequantise in fp32 and
accumulate in fp32; query and output keep their dtype (fp32, fp16 or bf16).

:func:`quantize` writes values into an int8 cache by that rule (tests and callers that fill
``StaticAttention``'s caches); :func:`dequantize` is the float64 meaning of a cache.
"""

from __future__ import annotations

import torch

#: The values of ``kv_cache_dtype``: "auto" (the caches have the query's dtype) and "int8".
KV_CACHE_DTYPES = ("auto", "int8")


def check(value: object, *, error: type[Exception] = ValueError) -> str:
    """``value`` when it is ``"auto"`` or ``"int8"``.

    Raises:
        error (ValueError unless told otherwise): anything else (``"fp8"`` is not supported).
    """
    if not isinstance(value, str) or value not in KV_CACHE_DTYPES:
        raise error(f"kv_cache_dtype must be one of {list(KV_CACHE_DTYPES)}, got "
                    f"{type(value).__name__} {value!r}")
    return value


def check_scales(kv_scales, num_kv_heads: int, head_dim: int, *,
                 error: type[Exception] = ValueError, device: torch.device | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``kv_scales`` as a tuple of four contiguous float32 ``[num_kv_heads, head_dim]`` tensors
    ``(k_scale, k_offset, v_scale, v_offset)`` (on ``device`` when given).

    Raises:
        error: not a sequence of four tensors, or a wrong dtype, shape, device or layout.
    """
    names = ("k_scale", "k_offset", "v_scale", "v_offset")
    if not isinstance(kv_scales, (tuple, list)) or len(kv_scales) != 4:
        raise error("kv_scales must be a tuple (k_scale, k_offset, v_scale, v_offset) of "
                    f"float32 [{num_kv_heads}, {head_dim}] tensors, got {type(kv_scales).__name__}")
    for name, t in zip(names, kv_scales):
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
