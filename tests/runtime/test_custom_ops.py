"""The launches as torch custom ops: registered, correct on CPU, traceable with fakes."""

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from pyruntime import tiling
from pyruntime.kernels import custom_ops
from pyruntime.kernels import step as kernels
from pyruntime.workload.reference import reference_attention, relative_error

P = tiling.TilingParams(num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=8, max_batch=4,
                        max_tokens=8, max_blocks_per_req=4, num_cores=3)


def _args():
    gen = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 1, 4, 4, 0], dtype=torch.int32)  # 3 live, one zero-length
    kv = torch.tensor([20, 9, 0, 0], dtype=torch.int32)
    slots = (P.max_partial_slots, P.q_tile, P.group, P.head_dim)
    return {
        "query": torch.randn(8, 4, 16, generator=gen),
        "key_cache": torch.randn(16, 8, 2, 16, generator=gen),
        "value_cache": torch.randn(16, 8, 2, 16, generator=gen),
        "block_table": torch.arange(16, dtype=torch.int32).flip(0).reshape(4, 4).contiguous(),
        "cu_seqlens_q": cu, "seqlens_kv": kv, "step_epoch": torch.tensor([5], dtype=torch.int32),
        "tiling_in": torch.zeros(P.tiling_bytes, dtype=torch.uint8),
        "out": torch.full((8, 4, 16), 7.0),
        "partial_out": torch.zeros(slots), "partial_lse": torch.zeros(slots[:3]),
        "params": kernels.params_list(P), "scale": 0.25, "causal": True,
    }


def _run_layer(ops, a, planned_epoch):
    ops.plan_tiling(a["cu_seqlens_q"], a["seqlens_kv"], torch.tensor([3], dtype=torch.int32),
                    torch.tensor([planned_epoch], dtype=torch.int32), a["tiling_in"],
                    a["params"], True)
    ops.paged_attention(**a)
    ops.attention_combine(a["cu_seqlens_q"], a["step_epoch"], a["tiling_in"], a["out"],
                          a["partial_out"], a["partial_lse"], a["params"])


def test_ops_compute_one_layer_like_the_reference():
    ops, a = custom_ops.ops(), _args()
    _run_layer(ops, a, planned_epoch=5)
    assert tiling.Tiling(P, a["tiling_in"].numpy(), None, None, True).epoch == 5
    want = reference_attention(a["query"], a["key_cache"], a["value_cache"],
                               a["block_table"].numpy(), a["cu_seqlens_q"][:4].numpy(),
                               a["seqlens_kv"][:3].numpy(), scale=0.25)
    assert relative_error(a["out"], want) <= 1e-5
    assert torch.count_nonzero(a["out"][4:]) == 0  # padding rows zeroed


def test_a_tiling_of_another_epoch_is_refused_and_zeroes_the_output():
    ops, a = custom_ops.ops(), _args()
    _run_layer(ops, a, planned_epoch=4)  # the step carries epoch 5: the tiling is stale
    assert torch.count_nonzero(a["out"]) == 0
    assert kernels.is_stale(a["tiling_in"], a["step_epoch"])


def test_fake_implementations_trace_without_running():
    ops, a = custom_ops.ops(), _args()
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                for k, v in a.items()}
        ops.paged_attention(**fake)  # would fail on an unplanned (all-zero) tiling if run
        ops.plan_tiling(fake["cu_seqlens_q"], fake["seqlens_kv"], fake["cu_seqlens_q"][:1],
                        fake["step_epoch"], fake["tiling_in"], a["params"], True)


def test_kernels_name_the_ops_they_map_to():
    assert kernels.TILING.kind == "aicpu" and kernels.ATTENTION.kind == "aicore"
    ops = custom_ops.ops()
    for name in ("plan_tiling", "paged_attention", "attention_combine"):
        assert hasattr(ops, name)
