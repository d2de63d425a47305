"""A whole `StaticAttention` step per mode with the AI Core tasks run by the Triton kernels.

``backends.get("cpu", aicore="triton")`` runs the attention and combine tasks with the Triton
bodies under the interpreter (the code an NPU runs); the outputs must match the C path, step
by step, on a short trace-driven loop that covers padding, zero-length slots, spec decode and
chunked prefill.
"""

import pytest
import torch

from pyruntime import backends
from pyruntime.kernels import triton_launch
from pyruntime.workload.driver import run_decode_loop
from pyruntime.workload.synthetic import synthetic_requests

from .attention_helpers import make_attention, make_batcher

pytestmark = pytest.mark.skipif(triton_launch.available() is not None,
                                reason=str(triton_launch.available()))

STEPS = 5


def _loop(mode, aicore, dtype):
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=120.0, aicore=aicore)
    attn = make_attention(mode, dtype=dtype, num_layers=1, backend=backend)
    requests = synthetic_requests("uniform", 5, max_context=20, max_generated=6, seed=0)
    outputs = []
    stats = run_decode_loop(attn, make_batcher(requests, spec_tokens=2, prefill_chunk=8),
                            steps=STEPS,
                            on_step=lambda i, batch, outs: outputs.append(outs[0].clone()))
    backend.close()
    return stats, outputs


#: (mode, dtype, max |triton - C| allowed, max relative error against float64 allowed)
RUNS = [("device_tiling", torch.float32, 1e-6, 1e-5), ("host_update", torch.float32, 1e-6, 1e-5),
        ("device_tiling", torch.bfloat16, 2e-2, 2e-2)]


@pytest.mark.parametrize("mode, dtype, atol, rel_err", RUNS, ids=lambda v: str(v))
def test_triton_step_matches_the_c_path(mode, dtype, atol, rel_err, monkeypatch):
    stats_c, outs_c = _loop(mode, "c", dtype)
    launches = []
    for name in ("launch_attention", "launch_combine"):
        real = getattr(triton_launch, name)
        monkeypatch.setattr(triton_launch, name,
                            lambda *a, _real=real, _name=name, **k: launches.append(_name)
                            or _real(*a, **k))
    stats_t, outs_t = _loop(mode, "triton", dtype)
    # one launch of each grid per layer and step: the Triton bodies ran, not the C ones
    assert launches.count("launch_attention") == launches.count("launch_combine") == STEPS
    assert stats_t.steps == stats_c.steps == STEPS
    assert stats_t.max_rel_err <= rel_err
    assert stats_t.padded_steps > 0 and stats_t.zero_length_slots > 0
    assert stats_t.spec_steps > 0 and stats_t.prefill_steps > 0
    for got, want in zip(outs_t, outs_c, strict=True):
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=atol)


def test_triton_backend_option_is_checked():
    with pytest.raises(ValueError, match="aicore"):
        backends.get("cpu", aicore="cuda")


def test_stale_tiling_through_the_triton_bodies_is_zero_and_not_a_kernel_error():
    """The CPU backend's Triton bodies accept the kernels' E_STALE (check() reports it)."""
    from pyruntime import tiling
    from pyruntime.kernels import step

    params = tiling.TilingParams(num_q_heads=4, num_kv_heads=2, head_dim=16, block_size=8,
                                 max_batch=4, max_tokens=8, max_blocks_per_req=4, num_cores=3)
    cu = torch.tensor([0, 1, 4, 4, 0], dtype=torch.int32)
    kv = torch.tensor([20, 9, 0, 0], dtype=torch.int32)
    plan = tiling.plan(params, cu[:4].numpy(), kv[:3].numpy(), epoch=4)
    gen = torch.Generator().manual_seed(0)
    slots = (params.max_partial_slots, params.q_tile, params.group, params.head_dim)
    args = {"query": torch.randn(8, 4, 16, generator=gen),
            "key_cache": torch.randn(16, 8, 2, 16, generator=gen),
            "value_cache": torch.randn(16, 8, 2, 16, generator=gen),
            "block_table": torch.arange(16, dtype=torch.int32).reshape(4, 4),
            "cu_seqlens_q": cu, "seqlens_kv": kv, "tiling_in": plan.buffer,
            "out": torch.full((8, 4, 16), 7.0), "partial_out": torch.zeros(slots),
            "partial_lse": torch.zeros(slots[:3]), "params": step.params_list(params),
            "scale": 0.25, "causal": True}
    for epoch, expect_zero in ((5, True), (4, False)):
        args["out"].fill_(7.0)
        step_epoch = torch.tensor([epoch], dtype=torch.int32)
        step.attention_triton(**args, step_epoch=step_epoch)
        combine = {k: args[k] for k in ("cu_seqlens_q", "tiling_in", "out", "partial_out",
                                        "partial_lse", "params")}
        step.combine_triton(**combine, step_epoch=step_epoch)
        assert (torch.count_nonzero(args["out"]) == 0) == expect_zero
