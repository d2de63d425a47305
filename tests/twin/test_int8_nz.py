"""The NPU twin runs our AI Core attention op on int8 caches in vLLM-Ascend's NZ layout.

vLLM-Ascend 0.30 hands its C8 caches as ``[num_blocks, num_kv_heads, head_dim // 32,
block_size, 32]`` device tensors (`pyruntime.kernels.kv_quant`); ``paged_attention`` takes them
with no new argument, the rank telling the layout. On the twin, with both AI Core bodies (the
Triton kernels, interpreted, and the C reference as an AI Core task), the op on device NZ caches
must give the output it gives on the ND copies (bit for bit: the same fp32 rows are
dequantised), close to float64, and bad 5-D caches must raise the op's typed errors.
"""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the twin's AI Core runs our Triton kernels")

SCRIPT = """
import numpy as np
from pyruntime import tiling
from pyruntime.kernels import custom_ops, kv_quant, step
from pyruntime.kernels import reference_attention as ra
from pyruntime.workload.reference import reference_attention, relative_error

ops = custom_ops.ops()
P = tiling.TilingParams(num_q_heads=4, num_kv_heads=2, head_dim=64, block_size=16,
                        max_batch=2, max_tokens=4, max_blocks_per_req=4, num_cores=5)
gen = torch.Generator().manual_seed(0)
scales = (torch.rand(2, 64, generator=gen) * 0.04 + 0.04, torch.randn(2, 64, generator=gen) * 5,
          torch.rand(2, 64, generator=gen) * 0.04 + 0.04, torch.randn(2, 64, generator=gen) * 5)
k_nd = kv_quant.quantize(torch.randn(8, 16, 2, 64, generator=gen), scales[0], scales[1])
v_nd = kv_quant.quantize(torch.randn(8, 16, 2, 64, generator=gen), scales[2], scales[3])
q = torch.randn(4, 4, 64, generator=gen).to(torch.bfloat16)
q[2:] = 0
cu, kv = np.array([0, 1, 2], np.int32), np.array([40, 20], np.int32)   # 40 tokens: 3 blocks
bt = torch.tensor([[3, 5, 1, 0], [7, 2, 0, 0]], dtype=torch.int32)
plan = tiling.plan(P, cu, kv)
want = reference_attention(q, k_nd, v_nd, bt.numpy(), cu, kv, scale=0.125, kv_scales=scales)


def run(k, v, kv_scales=scales):
    npu = lambda t: t.to("npu")
    words = npu(torch.from_numpy(plan.buffer).view(torch.uint8))
    epoch = npu(torch.tensor([plan.epoch], dtype=torch.int32))
    cu_d, kv_d = npu(torch.from_numpy(cu)), npu(torch.from_numpy(kv))
    out = torch.zeros(4, 4, 64, dtype=torch.bfloat16, device="npu")
    po, pl = (npu(t) for t in ra.partial_buffers(P))
    k_s, k_o, v_s, v_o = (None,) * 4 if kv_scales is None else (npu(t) for t in kv_scales)
    ops.paged_attention(npu(q), npu(k), npu(v), npu(bt), cu_d, kv_d, epoch, words, out, po, pl,
                        step.params_list(P), 0.125, True, k_scale=k_s, k_offset=k_o,
                        v_scale=v_s, v_offset=v_o)
    ops.attention_combine(cu_d, epoch, words, out, po, pl, step.params_list(P))
    torch.npu.synchronize()
    return out.cpu()


nd = run(k_nd, v_nd)
nz = run(kv_quant.to_nz(k_nd), kv_quant.to_nz(v_nd))
check("nz_equals_nd", lambda: eq(torch.equal(nz, nd), True))
check("nz_close_to_float64", lambda: eq(relative_error(nz, want) < 2e-2, True))
check("nz_not_zero", lambda: eq(bool(nz.abs().sum() > 0), True))
k5 = kv_quant.to_nz(k_nd)
check("nz_non_int8_refused", lambda: expect(ValueError, "only int8 caches",
                                            lambda: run(k5.to(torch.bfloat16),
                                                        k5.to(torch.bfloat16), None)))
check("mixed_layouts_refused", lambda: expect(ValueError, "same layout",
                                              lambda: run(k5, v_nd)))
"""


@pytest.mark.parametrize("body", ["triton", "reference"])
def test_paged_attention_on_device_nz_caches(run_twin, body):
    proc = run_twin(SCRIPT, env={"AICPU_TILING_TWIN_AICORE": body}, timeout=300)
    rules = run_twin.rules(proc)
    assert rules and all(outcome == "ok" for outcome in rules.values()), rules
