"""The dry run's KV caches, allocated the way the release's model runner allocates them.

vLLM-Ascend 0.23.0.post1 (and every release before 0.30.0rc1) gives each attention layer two
separate int8 allocations (``_allocate_kv_cache_tensors``, from 4249), viewed as
``get_kv_cache_shape(...)[1:]`` with ``.view`` (4592-4644): contiguous K and V
(``vllm_ascend/worker/model_runner_v1.py`` of 0.23.0.post1).

vLLM-Ascend 0.30.0rc1 and rc2 give a layer whose spec is exactly ``FullAttentionSpec`` ONE
allocation of ``num_blocks * page_size_bytes`` raw int8 bytes and view it, since
``AscendAttentionBackend.get_kv_cache_shape`` is ``(2, num_blocks, block_size, H, D)``, with
``torch.as_strided`` to that shape and strides ``(hidden, 2 * hidden, H * D, D, 1)``: K =
``[0]`` and V = ``[1]``, the K and V pages of a block side by side, each view's page stride
``2 * hidden`` and V at storage offset ``hidden`` (``hidden = block_size * H * D``).
0.30.0rc2's ``vllm_ascend/worker/model_runner_v1.py``:

* which layers (``_allocate_kv_cache_tensors``, 5008-5016, `page_strided`): ``type(spec) is
  FullAttentionSpec``, not a hidden-state cache, a backend that is not sparse, and not
  ``requires_contiguous_pa_kv_cache(layer, vllm_config, spec)``
  (``vllm_ascend/attention/utils.py:215-227``: a plain ``AscendAttentionBackendImpl`` without
  a window, in FULL_DECODE_ONLY with a ``pa_shape_list``), when the runner has no DCP, sparse,
  compress, sparse KV offload or xlite graph (the dry run has none of them);
* the allocation (5158-5189): ``torch.zeros(num_blocks * page_size_bytes, dtype=torch.int8)``;
* the view (``_reshape_kv_cache_tensors``, 5718-5744): ``raw.view(spec.dtype)`` then
  ``torch.as_strided`` as above.

Every other layer (a sliding window: vLLM gives it a ``SlidingWindowSpec``, as the hybrid KV
cache manager is on for vLLM-Ascend, ``platform.py`` ``support_hybrid_kv_cache``; MLA:
``AscendMLAAttentionSpec``) keeps two allocations (5297-5322) viewed with ``.view`` (5816-5866):
contiguous, as on 0.23. A C8 layer is ``FullAttentionSpec`` with dtype int8
(``quantization/methods/kv_cache/kv_c8.py:120-130`` sets ``kv_cache_torch_dtype`` and swaps
the impl class, so ``requires_contiguous_pa_kv_cache`` is False): page-strided; vLLM-Ascend's
``_nz_5d_view`` (``attention/attention_v1.py:1441-1444``, a ``.view``) keeps that stride.

What is taken from the release itself, not mirrored: the cache shape
(``backend.get_kv_cache_shape``), the page size (``spec.page_size_bytes``), the backend's
``is_sparse`` and the contiguity rule (``requires_contiguous_pa_kv_cache``, called). A release
strides its caches exactly when it defines ``requires_contiguous_pa_kv_cache`` (0.30.0rc1 and
rc2 of 0.23.0-0.30.0rc2, `tests/hook/test_release_conformance.py` checks it on every
release's source).
"""

from __future__ import annotations

import importlib
import math
import types
from typing import Any

#: where a release keeps the contiguity rule of its page-strided layout (0.30.0rc1+)
UTILS = "vllm_ascend.attention.utils"
CONTIGUITY_RULE = "requires_contiguous_pa_kv_cache"


def page_strided(spec: Any, impl: Any, backend: Any, vllm_config: Any) -> bool:
    """Whether the release's model runner gives a layer (its KV cache `spec`, its attention
    `impl`, its `backend` class) one allocation with its K and V pages side by side: the
    runner's ``strided_attention_cache_layers`` test (module docstring), with the release's
    own ``requires_contiguous_pa_kv_cache``; False on a release without it."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    rule = getattr(importlib.import_module(UTILS), CONTIGUITY_RULE, None)
    if rule is None:
        return False
    # the runner passes the attention layer (vLLM's Attention), whose ``impl`` the rule reads
    layer = types.SimpleNamespace(impl=impl)
    return (type(spec) is FullAttentionSpec and not backend.is_sparse()
            and not rule(layer, vllm_config, spec))


def allocate(spec: Any, backend: Any, num_blocks: int, device: Any, *,
             strided: bool) -> tuple[Any, Any]:
    """``(key_cache, value_cache)`` of one layer, zeros of ``spec.dtype``, each of shape
    ``backend.get_kv_cache_shape(num_blocks, block_size, H, D)[1:]`` (``[num_blocks,
    block_size, H, D]``): views of one int8 allocation with the pages side by side
    (`strided`: 0.30's full-attention layers) or two contiguous allocations (module
    docstring)."""
    import torch

    shape = backend.get_kv_cache_shape(num_blocks, spec.block_size, spec.num_kv_heads,
                                       spec.head_size)
    if len(shape) != 5 or shape[0] != 2:
        raise ValueError(f"{backend.__name__}.get_kv_cache_shape gave {shape}: the dry run "
                         "allocates the (2, num_blocks, block_size, H, D) layout only")
    if not strided:  # model_runner_v1.py: raw int8 per K and V, .view(dtype).view(k_shape)
        size = math.prod(shape[1:]) * torch.empty((), dtype=spec.dtype).element_size()
        return tuple(torch.zeros(size, dtype=torch.int8, device=device)
                     .view(spec.dtype).view(shape[1:]) for _ in range(2))
    raw = torch.zeros(num_blocks * spec.page_size_bytes, dtype=torch.int8, device=device)
    typed = raw.view(spec.dtype)
    if typed.numel() != math.prod(shape):  # the runner falls back to separate views then
        raise ValueError(f"page_size_bytes {spec.page_size_bytes} does not hold a block of "
                         f"{shape[2:]} for K and V")
    hidden = math.prod(shape[2:])
    dense = [math.prod(shape[dim + 1:]) for dim in range(len(shape))]
    both = torch.as_strided(typed, size=shape, stride=(hidden, 2 * hidden, *dense[2:]),
                            storage_offset=typed.storage_offset())
    return both[0], both[1]


def describe(key_cache: Any, value_cache: Any) -> dict:
    """What the report says of a layer's caches: the key's shape and strides (elements),
    whether K and V share one allocation, V's storage offset from K's there (None for two
    allocations), whether both are contiguous."""
    shared = key_cache.untyped_storage().data_ptr() == value_cache.untyped_storage().data_ptr()
    return {"shape": list(key_cache.shape), "stride": list(key_cache.stride()),
            "one_allocation": shared,
            "value_offset": (value_cache.storage_offset() - key_cache.storage_offset()
                             if shared else None),
            "contiguous": key_cache.is_contiguous() and value_cache.is_contiguous()}
