"""C8 layers (vLLM-Ascend's int8 KV cache) on the device path: what the patch set reads.

vLLM-Ascend runs a C8 layer (``--kv-cache-dtype int8`` with a C8 quantization recipe) through
``AscendC8AttentionBackendImpl``, a subclass of ``AscendAttentionBackendImpl`` that
``AscendC8KVCacheAttentionMethod.create_weights`` swaps in (``layer.impl.__class__ = ...``;
vllm-ascend 0.23.0 to 0.30.0rc2, ``vllm_ascend/attention/attention_v1.py`` and
``quantization/methods/kv_c8.py`` / ``kv_cache/kv_c8.py``). Its decode capture calls the base
class's ``full_graph_fia(query, key, value, attn_metadata, output, layer)``, which the patch set
already replaces, so a C8 layer reaches our capture with its ``layer``. What differs from a
plain layer, in every release 0.23.0-0.30.0rc2 (tests/hook/test_c8_conformance.py reads them):

* The caches are int8 and their memory is in the NZ layout: vLLM-Ascend allocates
  ``[num_blocks, block_size, num_kv_heads, head_size]`` int8 tensors but writes and reads them
  through ``_nz_5d_view``, ``cache.view(-1, num_kv_heads, head_size // 32, block_size, 32)``
  (``npu_scatter_pa_kv_cache`` writes, FIA reads them). Our kernels take that 5-D view as it is
  (`pyruntime.kernels.kv_quant`: a 5-D int8 cache is NZ), so the cache is read in place.
* The scales: ``_prepare_c8_scales`` shards the layer's ``k_cache_scale`` / ``v_cache_scale``
  (parameters of the model dtype) to ``layer._c8_k_scale`` / ``_c8_v_scale``, shape
  ``[1, num_kv_heads, head_size]`` (or ``[1]`` for a per-tensor scale), on the device.
* The dequantisation of the paged NZ caches is scale only. ``_quantize_kv_to_int8`` stores
  ``clamp(round(x / scale + offset))``, but FIA gets ``key_antiquant_scale`` /
  ``value_antiquant_scale`` and no offset (``full_graph_fia``, ``_forward_c8_decode``), and the
  paged dense fallback multiplies by the scale alone (``_dequant_paged_kv_to_dense``:
  "Scale-only dequant for NZ (symmetric)"; only the prefill path's contiguous int8 K/V
  subtracts the offset). So the device path hands our kernels zero offsets, and a value x
  means ``x * scale``, as on vLLM-Ascend's decode path; a layer whose offsets are not zero is
  logged once (vLLM-Ascend's decode ignores them as well).

Our kernels read fp32 ``[num_kv_heads, head_size]`` scales and offsets. They are made once per
layer from the layer's own (widened, broadcast for a per-tensor scale) in the first eager
forward after ``_prepare_c8_scales`` ran (vLLM's warm-up runs before capture). A layer first
seen inside a capture gets copies made inside it, one set per graph: a captured copy only
runs when its own graph replays, so a set captured in one graph would stay unwritten for the
others (the dry run caught that); each graph's copies run at each of its replays (correct, a
few microseconds more). Like vLLM-Ascend's own ``_c8_*`` tensors, none is remade if the
weights are reloaded.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("pyruntime.hook")

#: The implementation class of C8 layers, in ``vllm_ascend.attention.attention_v1``.
C8_IMPL = "AscendC8AttentionBackendImpl"
#: Its ``forward`` (the patch set wraps it to make the fp32 scales after an eager call).
FORWARD_PARAMS = ("self", "layer", "query", "key", "value", "kv_cache", "attn_metadata",
                  "output", "output_scale", "output_block_scale")
#: ``_nz_5d_view(self, cache, block_size)``: the 5-D NZ view of a cache (read, not patched).
NZ_VIEW_PARAMS = ("self", "cache", "block_size")
#: The last dim of the NZ view (``NZ_FMT_LAST_DIM`` in ``_nz_5d_view``).
NZ_LAST_DIM = 32
#: ``layer.<name>`` tensors ``_prepare_c8_scales`` sets, read by the patch set.
LAYER_SCALES = ("_c8_k_scale", "_c8_k_offset", "_c8_v_scale", "_c8_v_offset")
#: ``impl.kv_cache_dtype`` of a C8 layer: the string vLLM passes (0.23-0.28) or the torch
#: dtype 0.29+ resolves it to.
C8_KV_DTYPES = ("int8", "torch.int8")
#: The attribute of the vLLM layer holding our fp32 ``(k_scale, k_offset, v_scale, v_offset)``
#: made outside any graph (every graph reads them).
KV_SCALES_ATTR = "_aicpu_tiling_kv_scales"
#: ... and the one holding, per graph key, those made inside that graph's capture.
KV_SCALES_BY_GRAPH_ATTR = "_aicpu_tiling_kv_scales_by_graph"


def c8_class(module: Any) -> type | None:
    """``AscendC8AttentionBackendImpl`` of ``attention_v1``, or None where it is absent."""
    return getattr(module, C8_IMPL, None)


def c8_reason(impl: Any, layer: Any, applies_kv_int8: bool) -> str | None:
    """Why this C8 layer keeps vLLM-Ascend's path, or None when our kernels read its caches.

    Raises:
        AttributeError: the implementation lacks an attribute ``__init__`` sets (the caller
            turns it into a reason).
    """
    import torch

    if not applies_kv_int8:
        return ("int8 KV cache (C8): the tiling engine does not read int8 caches (no "
                "applies_kv_int8), so the layer keeps vLLM-Ascend's path")
    if str(impl.kv_cache_dtype) not in C8_KV_DTYPES:
        return f"C8 layer with kv_cache_dtype={impl.kv_cache_dtype!r} (int8 expected)"
    if impl.head_size % NZ_LAST_DIM:
        return f"C8 layer with head_size {impl.head_size}: the NZ layout needs a multiple of 32"
    if impl.sliding_window or impl.sinks is not None:
        return "C8 with a sliding window or attention sinks is not supported"
    if layer is None:
        return "C8 layer captured without its layer (full_graph_fia got layer=None)"
    from pyruntime.kernels import kv_quant

    caches = (impl.key_cache, impl.value_cache)
    if not all(isinstance(c, torch.Tensor) and c.dtype == torch.int8 and c.dim() == 4
               for c in caches):
        return ("C8 caches that are not 4-D int8 tensors (as vLLM-Ascend allocates them) are "
                "not supported")
    try:
        # 0.30.0rc2 hands C8 layers page-strided views (K and V pages side by side), which
        # our kernels read in place at their page strides (kv_quant.page_strides)
        kv_quant.page_strides(*caches)
    except kv_quant.CacheStrideError as error:
        return f"C8 caches our kernels cannot read in place: {error}"
    missing = [name for name in LAYER_SCALES if not isinstance(getattr(layer, name, None),
                                                              torch.Tensor)]
    if missing:
        return f"C8 scales not prepared (layer lacks {', '.join(missing)})"
    per_channel = impl.num_kv_heads * impl.head_size
    for name in LAYER_SCALES:
        t = getattr(layer, name)
        if t.numel() not in (1, per_channel) or not t.is_floating_point():
            return (f"C8 {name} of shape {list(t.shape)} and dtype {t.dtype}: our kernels read "
                    f"one float per channel ({per_channel}) or one per tensor")
        if t.device != impl.key_cache.device:
            return f"C8 {name} is on {t.device}, the cache on {impl.key_cache.device}"
    return None


def nz_caches(impl: Any) -> tuple[Any, Any, int]:
    """The layer's caches as vLLM-Ascend reads them, ``(key, value, block_size)``: the 5-D NZ
    views ``[num_blocks, num_kv_heads, head_size // 32, block_size, 32]`` of its own tensors
    (``full_graph_fia``'s C8 branch: ``_, block_size, _, _ = self.key_cache.shape``)."""
    block_size = int(impl.key_cache.shape[1])
    return (impl._nz_5d_view(impl.key_cache, block_size),
            impl._nz_5d_view(impl.value_cache, block_size), block_size)


def kv_scales(impl: Any, layer: Any, graph_key: Any = None) -> tuple:
    """The fp32 ``(k_scale, k_offset, v_scale, v_offset)`` our kernels read for this layer,
    each contiguous ``[num_kv_heads, head_size]`` on the cache's device: the layer's scales
    widened (a per-tensor scale broadcast) and zero offsets (vLLM-Ascend's dequantisation is
    scale only; see the module docstring). Kept on the layer: the set made outside any graph
    when there is one (``graph_key`` None makes it), else the set of graph ``graph_key``, made
    in its capture (see the module docstring)."""
    made = getattr(layer, KV_SCALES_ATTR, None)
    if made is not None:
        return made
    if graph_key is None:
        made = _make_kv_scales(impl, layer)
        setattr(layer, KV_SCALES_ATTR, made)
        return made
    per_graph = getattr(layer, KV_SCALES_BY_GRAPH_ATTR, None)
    if per_graph is None:
        per_graph = {}
        setattr(layer, KV_SCALES_BY_GRAPH_ATTR, per_graph)
    if graph_key not in per_graph:
        per_graph[graph_key] = _make_kv_scales(impl, layer)
    return per_graph[graph_key]


def _make_kv_scales(impl: Any, layer: Any) -> tuple:
    import torch

    shape = (impl.num_kv_heads, impl.head_size)

    def widened(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty(shape, dtype=torch.float32, device=t.device)
        out.copy_(t.reshape(()) if t.numel() == 1 else t.reshape(shape))  # widens, broadcasts
        return out

    zero = torch.zeros(shape, dtype=torch.float32, device=layer._c8_k_scale.device)
    return widened(layer._c8_k_scale), zero, widened(layer._c8_v_scale), zero


def prepare_eager(impl: Any, layer: Any, noted: set) -> None:
    """After an eager (not capturing) forward of a C8 layer: make its fp32 scales now, outside
    any graph, and log once when its offsets are not zero (which vLLM-Ascend's dequantisation,
    and so ours, ignores)."""
    import torch

    if (getattr(layer, KV_SCALES_ATTR, None) is not None
            or not getattr(layer, "_c8_scales_prepared", False)
            or c8_reason(impl, layer, True) is not None):
        return
    kv_scales(impl, layer)
    name = getattr(layer, "layer_name", None) or f"<layer@{id(layer):#x}>"
    offsets = (layer._c8_k_offset, layer._c8_v_offset)
    if name not in noted and any(bool(torch.any(t != 0)) for t in offsets):
        noted.add(name)
        log.info("aicpu-tiling: C8 layer %s has non-zero KV offsets, which vLLM-Ascend's "
                 "dequantisation (FIA antiquant, scale only) ignores; the device path ignores "
                 "them too, so both paths compute the same", name)
