"""Run in a vLLM environment's Python with the NPU twin active (``AICPU_TILING_TWIN=1``, this
checkout and the release's ``vllm-ascend`` tree on ``PYTHONPATH``): what vLLM decided about
Triton, the device properties vLLM-Ascend reads, and vLLM-Ascend's own Triton kernels of the
dense decode path launched on twin npu tensors. Prints one line ``PROBE <json>`` with the
inputs and outputs (as lists); tests/twin/test_triton_ascend.py checks them against its
reference formulas.

Usage: ``python vllm_ascend_triton_probe.py <release>``.
"""

from __future__ import annotations

import json
import sys

import torch


def _list(t: torch.Tensor) -> list:
    return t.cpu().float().tolist()


def triton_facts() -> dict:
    import triton
    from vllm.triton_utils import HAS_TRITON

    facts = {"HAS_TRITON": HAS_TRITON, "torch_npu_module": torch.npu.__name__}
    if HAS_TRITON:
        from triton.backends import backends

        driver = triton.runtime.driver.active
        facts.update(
            active_backends=sorted(name for name, b in backends.items() if b.driver.is_active()),
            driver=type(driver).__name__,
            target=[driver.get_current_target().backend, driver.get_current_target().arch],
            properties=driver.utils.get_device_properties(torch.npu.current_device()))
        from vllm_ascend.ops.triton import triton_utils

        triton_utils.init_device_properties_triton()
        facts["vectorcore_num"] = triton_utils.get_vectorcore_num()
        facts["aicore_num"] = triton_utils.get_aicore_num()
        facts["extension_ops"] = {name: getattr(triton_utils, name).__module__
                                  for name in ("insert_slice", "extract_slice", "get_element")}
    return facts


def slot_mapping() -> dict:
    """``_compute_slot_mapping_kernel`` launched as vLLM-Ascend 0.30.0rc2's
    ``BlockTable.compute_slot_mapping`` launches it (``worker/block_table.py``, no DCP)."""
    from vllm.utils.math_utils import cdiv
    from vllm.v1.attention.backends.utils import PAD_SLOT_ID
    from vllm_ascend.ops.triton.compute_slot_mapping import (
        _compute_slot_mapping_kernel,
        _next_power_of_2,
    )

    block_size, max_reqs, max_blocks, max_tokens = 16, 4, 8, 64
    generator = torch.Generator().manual_seed(28)
    block_table = torch.randperm(max_reqs * max_blocks, generator=generator).to(torch.int32)
    block_table = block_table.view(max_reqs, max_blocks)
    # a decode, a 5-token chunk across a block boundary (30..34), a first token
    positions = torch.tensor([17, 30, 31, 32, 33, 34, 0], dtype=torch.int64)
    query_start_loc = torch.tensor([0, 1, 6, 7], dtype=torch.int32)
    num_reqs, num_tokens = 3, positions.numel()
    slots = torch.full((max_tokens,), 12345, dtype=torch.int32, device="npu")
    tile = 1024
    _compute_slot_mapping_kernel[(num_reqs + 1,)](
        num_tokens, max_tokens, query_start_loc.npu(), positions.npu(), block_table.npu(),
        block_table.stride(0), block_size, slots,
        KV_CACHE_BLOCK_SIZE=block_size, BLOCKS_PER_KV_BLOCK=1, TOTAL_CP_WORLD_SIZE=1,
        TOTAL_CP_RANK=0, CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=PAD_SLOT_ID,
        TILE_BLOCK_SIZE=tile,
        BLOCK_TABLE_WINDOW_SIZE=_next_power_of_2(cdiv(tile, block_size) + 1),
        IS_CIRCULAR=False)
    return {"block_size": block_size, "block_table": block_table.tolist(),
            "positions": positions.tolist(), "query_start_loc": query_start_loc.tolist(),
            "pad": PAD_SLOT_ID, "slot_mapping": slots.cpu().tolist()}


def _qwen3_like_inputs(tokens: int, q_heads: int, kv_heads: int, head_dim: int):
    generator = torch.Generator().manual_seed(6)
    max_positions = 64
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.arange(max_positions).float()[:, None] * inv_freq[None, :]
    cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1).to(torch.bfloat16)
    positions = torch.randint(0, max_positions, (tokens,), generator=generator)
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim, generator=generator)
    return cos_sin_cache, positions, qkv.to(torch.bfloat16)


def rope() -> dict:
    """``rope_forward_triton`` (``ops/triton/rope.py``): what ``rope_forward_oot``
    (``ops/rotary_embedding.py``) calls for every attention layer when ``HAS_TRITON``."""
    from vllm_ascend.ops.triton.rope import rope_forward_triton

    tokens, q_heads, kv_heads, head_dim = 5, 4, 2, 64
    cos_sin_cache, positions, qkv = _qwen3_like_inputs(tokens, q_heads, kv_heads, head_dim)
    q = qkv[:, :q_heads * head_dim].reshape(tokens, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim:(q_heads + kv_heads) * head_dim].reshape(
        tokens, kv_heads, head_dim)
    q_out, k_out = rope_forward_triton(q.npu(), k.npu(), cos_sin_cache=cos_sin_cache.npu(),
                                       positions=positions.npu(), rope_dim=head_dim,
                                       is_neox_style=True)
    return {"q": _list(q), "k": _list(k), "cos_sin_cache": _list(cos_sin_cache),
            "positions": positions.tolist(), "q_out": _list(q_out), "k_out": _list(k_out)}


def qkv_rmsnorm_rope() -> dict:
    """``split_qkv_rmsnorm_rope_impl`` (``ops/triton/linearnorm/split_qkv_rmsnorm_rope.py``,
    the ``vllm.qkv_rmsnorm_rope`` op of the QK-norm + RoPE fusion pass for Qwen3): the kernel
    that calls ``insert_slice``, ``extract_slice`` and ``get_element``."""
    from vllm_ascend.ops.triton.linearnorm.split_qkv_rmsnorm_rope import (
        split_qkv_rmsnorm_rope_impl,
    )

    tokens, q_heads, kv_heads, head_dim, eps = 5, 4, 2, 64, 1e-6
    cos_sin_cache, positions, qkv = _qwen3_like_inputs(tokens, q_heads, kv_heads, head_dim)
    generator = torch.Generator().manual_seed(7)
    q_weight = (1 + 0.1 * torch.randn(head_dim, generator=generator)).to(torch.bfloat16)
    k_weight = (1 + 0.1 * torch.randn(head_dim, generator=generator)).to(torch.bfloat16)
    q, k, v = split_qkv_rmsnorm_rope_impl(
        qkv.npu(), cos_sin_cache.npu(), positions.npu(), q_weight.npu(), k_weight.npu(),
        q_heads * head_dim, kv_heads * head_dim, head_dim, eps)
    return {"qkv": _list(qkv), "cos_sin_cache": _list(cos_sin_cache),
            "positions": positions.tolist(), "q_weight": _list(q_weight),
            "k_weight": _list(k_weight), "heads": [q_heads, kv_heads, head_dim], "eps": eps,
            "q": _list(q), "k": _list(k), "v": _list(v)}


def main(release: str) -> None:
    out = {"release": release, "triton": triton_facts()}
    if out["triton"]["HAS_TRITON"]:
        kernels = {"rope": rope, "qkv_rmsnorm_rope": qkv_rmsnorm_rope}
        if release == "0.30.0rc2":
            kernels = {"slot_mapping": slot_mapping, **kernels}
        for name, fn in kernels.items():
            out[name] = fn()
    print("PROBE " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
