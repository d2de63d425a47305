"""Our attention against torch_npu's FIA, eagerly, on decode batches (NPU only).

Never run: this machine has no NPU. FIA (``torch_npu.npu_fused_infer_attention_score``)
is called the way vLLM-Ascend's decode path calls it (``input_layout="TND"``, paged KV
``[num_blocks, block_size, kv_heads * head_dim]``, ``actual_seq_lengths`` cumulative query
offsets ending at T, ``actual_seq_lengths_kv`` per request, ``sparse_mode=0``: one query
token per request, so no causal mask is needed). Our side is a `StaticAttention` replayed
on the same queries and caches, on the placement the self-check chose.
"""

from __future__ import annotations

import numpy as np
import torch

from pyruntime.attention import StaticAttention
from pyruntime.workload.driver import randomize

from .context import Context
from .report import CheckResult, failed, passed

SHAPES = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 128,
          "max_batch": 16, "max_tokens": 16, "max_blocks_per_req": 32}
NUM_BLOCKS = SHAPES["max_batch"] * SHAPES["max_blocks_per_req"]
TOLERANCE = 2e-2  # bf16 storage, different accumulation orders


def compare_with_fia(ctx: Context, name: str) -> CheckResult:
    import torch_npu

    be = ctx.make_backend()
    attn = StaticAttention(be, num_layers=1, num_blocks=NUM_BLOCKS, mode="device_tiling",
                           placement=ctx.placement, dtype=torch.bfloat16, **SHAPES)
    randomize(attn)
    attn.capture()
    rng = np.random.default_rng(0)
    p, worst = attn.params, 0.0
    for batch in (1, 4, 16):
        kv = rng.integers(1, p.max_blocks_per_req * p.block_size, batch).astype(np.int32)
        cu = np.arange(batch + 1, dtype=np.int32)
        table = np.arange(NUM_BLOCKS, dtype=np.int32).reshape(p.max_batch, -1)
        attn.queries[0].normal_()
        ours = attn.step(table, cu, kv)[0][:batch].float().cpu()
        attn.check()
        key, value = attn.kv_caches[0]
        flat = (NUM_BLOCKS, p.block_size, p.num_kv_heads * p.head_dim)
        fia, _ = torch_npu.npu_fused_infer_attention_score(
            attn.queries[0][:batch], key.view(flat), value.view(flat),
            block_table=torch.from_numpy(table[:batch]).to(key.device),
            actual_seq_lengths=cu[1:].tolist(), actual_seq_lengths_kv=kv.tolist(),
            num_heads=p.num_q_heads, num_key_value_heads=p.num_kv_heads,
            scale=p.head_dim ** -0.5, input_layout="TND", block_size=p.block_size,
            sparse_mode=0)
        fia = fia.float().cpu()
        worst = max(worst, float((ours - fia).abs().max() / fia.abs().max().clamp_min(1e-6)))
    data = {"batches": [1, 4, 16], "max_rel_err": worst, "tolerance": TOLERANCE}
    if worst > TOLERANCE:
        return failed(name, f"our attention differs from FIA: max rel err {worst:.1e}", **data)
    return passed(name, f"decode batches 1/4/16 (bf16, 32/8 heads): max rel err {worst:.1e} "
                        "against FIA run eagerly", **data)
