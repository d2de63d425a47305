"""StaticAttention with the int8 KV cache (kv_cache_dtype="int8"), in every mode, both consumers.

Each run fills ``attn.kv_scales`` in place after the capture with per-channel scales and
nonzero offsets, quantises K and V into the int8 caches by vLLM-Ascend's rule, steps a
trace-driven loop (decode, speculative decode, chunked prefill, padded buckets with
zero-length slots) on 4 cores, changes the scales half-way (so the graph must read them at
replay), and checks every output against the float64 reference of the dequantised caches.
At every step the answers that ignore the offsets or the scales are several tolerances away.
"""

import math

import pytest
import torch

from pyruntime import backends, tiling
from pyruntime.attention import AttentionInputError, StaticAttention
from pyruntime.kernels import triton_launch
from pyruntime.workload.driver import randomize, run_decode_loop
from pyruntime.workload.reference import reference_attention, relative_error
from pyruntime.workload.synthetic import synthetic_requests
from pyruntime.workload.trace import load_trace

from .attention_helpers import NUM_BLOCKS, SHAPES, make_attention, make_batcher

MODES = [("device_tiling", "graph"), ("device_tiling", "pre-replay"), ("host_update", None)]
MODE_IDS = ["graph", "pre-replay", "host_update"]
TRACE_MIX = {"spec_tokens": 2, "prefill_chunk": 8, "length_scale": 0.1, "step_s": 0.05}
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def trace():
    return load_trace(limit=2000)


def _fill(attn, version: int) -> None:
    """Scales in [0.04, 0.08] and offsets of about 15 steps per channel, then K and V
    quantised with them (an offset's worth is as large as the values)."""
    gen = torch.Generator().manual_seed(100 + version)
    for k_scale, k_offset, v_scale, v_offset in attn.kv_scales:
        for scale, offset in ((k_scale, k_offset), (v_scale, v_offset)):
            scale.copy_(torch.rand(scale.shape, generator=gen) * 0.04 + 0.04)
            offset.copy_(torch.randn(offset.shape, generator=gen) * 15.0)
    randomize(attn, seed=version)


def _run(attn, batcher, steps):
    """Run the loop (scales and caches refilled half-way); returns (stats, split steps, the
    distances of the no-offset and no-scale answers, smallest over steps and layers)."""
    scale, far, splits = attn.params.head_dim ** -0.5, [math.inf, math.inf], [0]

    def on_step(i, batch, outputs):
        plan = tiling.plan(attn.params, batch.cu_seqlens_q, batch.seqlens_kv,
                           causal=attn.causal)
        splits[0] += bool(plan.combine_records())
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            k_scale, k_offset, v_scale, v_offset = attn.kv_scales[layer]
            one = torch.ones_like(k_scale)
            wrong = ((k_scale, 0 * k_offset, v_scale, 0 * v_offset),
                     (one, k_offset, one, v_offset))
            for j, kv_scales in enumerate(wrong):
                want = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                           batch.cu_seqlens_q, batch.seqlens_kv, scale=scale,
                                           causal=attn.causal, kv_scales=kv_scales)
                far[j] = min(far[j], relative_error(out, want)) if want.any() else far[j]
        if i == steps // 2 - 1:
            _fill(attn, 1)  # the next replay must read the new scales

    _fill(attn, 0)
    stats = run_decode_loop(attn, batcher, steps=steps, on_step=on_step)
    return stats, splits[0], far


def _check(stats, steps, splits, far, dtype):
    assert stats.steps == steps
    assert stats.padded_steps > 0 and stats.zero_length_slots > 0
    assert stats.spec_steps > 0 and stats.prefill_steps > 0
    assert splits > 0, "no step split a unit"
    assert stats.max_rel_err <= TOL[dtype], stats.max_rel_err
    assert min(far) > max(0.05, 3 * TOL[dtype]), far


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_c_consumer_matches_the_int8_reference(trace, mode, placement, dtype):
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, dtype=dtype, kv_cache_dtype="int8", **extra)
    assert all(k.dtype == torch.int8 and v.dtype == torch.int8 for k, v in attn.kv_caches)
    assert len(attn.kv_scales) == 2 and all(
        t.dtype == torch.float32 and t.shape == (2, 16) for s in attn.kv_scales for t in s)
    stats, splits, far = _run(attn, make_batcher(trace, **TRACE_MIX), 30)
    attn.backend.close()
    _check(stats, 30, splits, far, dtype)


@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_int8_with_window_sinks_and_soft_cap(trace, mode, placement):
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, kv_cache_dtype="int8", sliding_window=11, sinks=True,
                          logits_soft_cap=20.0, **extra)
    for layer, sink in enumerate(attn.sinks):
        sink.copy_(1.0 + 0.2 * torch.arange(sink.numel()) + layer)
    stats, splits, far = _run(attn, make_batcher(trace, **TRACE_MIX), 30)
    attn.backend.close()
    _check(stats, 30, splits, far, torch.float32)


@pytest.mark.skipif(triton_launch.available() is not None,
                    reason=str(triton_launch.available()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_triton_consumer_matches_the_int8_reference(mode, placement, dtype):
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=120.0, aicore="triton")
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, dtype=dtype, num_layers=1, backend=backend,
                          kv_cache_dtype="int8", **extra)
    requests = synthetic_requests("uniform", 5, max_context=20, max_generated=6, seed=0)
    stats, splits, far = _run(attn, make_batcher(requests, spec_tokens=2, prefill_chunk=8), 6)
    backend.close()
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]   # + K, V, P rounded to bf16
    assert stats.max_rel_err <= tol and splits > 0 and min(far) > 3 * tol, (stats, far)


def test_auto_is_the_default_and_has_no_scales():
    attn = make_attention("device_tiling", num_layers=1)
    assert attn.kv_cache_dtype == "auto" and attn.kv_scales is None
    assert attn.kv_caches[0][0].dtype == torch.float32
    attn.backend.close()


@pytest.mark.parametrize("bad", ["fp8", "fp8_e4m3", "float16", None, 8], ids=repr)
def test_unsupported_kv_cache_dtypes_raise_before_allocating(bad):
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    with pytest.raises(AttentionInputError, match="kv_cache_dtype"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="device_tiling",
                        dtype=torch.float32, kv_cache_dtype=bad, **SHAPES)
    assert backend._buffers == {}
    backend.close()


def test_host_update_on_a_fia_backend_refuses_int8(monkeypatch):
    """Our FIA call (TND layout, no antiquant arguments) cannot read the int8 caches."""
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    monkeypatch.setattr(backend, "host_update_attention", "fia")
    with pytest.raises(AttentionInputError, match="FIA"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="host_update",
                        dtype=torch.float32, kv_cache_dtype="int8", **SHAPES)
    assert backend._buffers == {}
    backend.close()
