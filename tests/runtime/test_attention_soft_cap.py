"""StaticAttention with a logits soft cap, in every mode, on both AI Core consumers.

Each run steps a trace-driven loop (decode, speculative decode, chunked prefill, padded
buckets with zero-length slots) and checks every output against the float64 reference with
the same cap. Queries are scaled up (N(0, 16): scores of a few units) and the cap is small
(C = 2) or Gemma 2's (C = 50, queries x30: scores beyond it), so tanh really bends the scores:
each run also checks that the uncapped answer is far outside the tolerance, so a consumer
that ignored the cap would fail.
"""

import math

import pytest
import torch

from pyruntime import backends
from pyruntime.attention import AttentionInputError, StaticAttention
from pyruntime.kernels import triton_launch
from pyruntime.workload.driver import run_decode_loop
from pyruntime.workload.reference import reference_attention, relative_error
from pyruntime.workload.synthetic import synthetic_requests
from pyruntime.workload.trace import load_trace

from .attention_helpers import NUM_BLOCKS, SHAPES, make_attention, make_batcher

#: (mode, placement) for the three ways StaticAttention runs
MODES = [("device_tiling", "graph"), ("device_tiling", "pre-replay"), ("host_update", None)]
MODE_IDS = ["graph", "pre-replay", "host_update"]
TRACE_MIX = {"spec_tokens": 2, "prefill_chunk": 8, "length_scale": 0.1, "step_s": 0.05}
#: max relative error against the capped float64 reference: fp32 accumulation everywhere,
#: then one rounding of the output (and, on the Triton path, of P) to the storage dtype
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
#: (C, query scale)
CAPS = {"C2": (2.0, 4.0), "C50": (50.0, 30.0)}


@pytest.fixture(scope="module")
def trace():
    return load_trace(limit=2000)


def _run(attn, batcher, steps, query_scale):
    """Run the loop; returns (stats, worst relative error of the uncapped reference)."""
    scale, uncapped = attn.params.head_dim ** -0.5, [0.0]

    def without_cap(i, batch, outputs):
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            want = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                       batch.cu_seqlens_q, batch.seqlens_kv, scale=scale,
                                       causal=attn.causal)
            uncapped[0] = max(uncapped[0], relative_error(out, want))

    stats = run_decode_loop(attn, batcher, steps=steps, query_scale=query_scale,
                            on_step=without_cap)
    return stats, uncapped[0]


def _check_coverage(stats, steps):
    assert stats.steps == steps
    assert stats.padded_steps > 0 and stats.zero_length_slots > 0
    assert stats.spec_steps > 0 and stats.prefill_steps > 0


@pytest.mark.parametrize("cap", sorted(CAPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_c_consumer_matches_capped_reference(trace, mode, placement, dtype, cap):
    soft_cap, query_scale = CAPS[cap]
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, dtype=dtype, logits_soft_cap=soft_cap, **extra)
    assert attn.logits_soft_cap == soft_cap
    stats, uncapped = _run(attn, make_batcher(trace, **TRACE_MIX), 60, query_scale)
    attn.backend.close()
    _check_coverage(stats, 60)
    assert stats.max_rel_err <= TOL[dtype]
    assert uncapped > max(0.1, 10 * TOL[dtype]), uncapped  # the cap changed the answer


@pytest.mark.skipif(triton_launch.available() is not None,
                    reason=str(triton_launch.available()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_triton_consumer_matches_capped_reference(mode, placement, dtype):
    """The same steps with the AI Core tasks run by the Triton kernels (interpreted)."""
    soft_cap, query_scale = CAPS["C2"]
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=120.0, aicore="triton")
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, dtype=dtype, num_layers=1, backend=backend,
                          logits_soft_cap=soft_cap, **extra)
    requests = synthetic_requests("uniform", 5, max_context=20, max_generated=6, seed=0)
    stats, uncapped = _run(attn, make_batcher(requests, spec_tokens=2, prefill_chunk=8), 5,
                           query_scale)
    backend.close()
    _check_coverage(stats, 5)
    assert stats.max_rel_err <= TOL[dtype]
    assert uncapped > 0.1


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.nan, math.inf, -math.inf, True, "50"],
                         ids=repr)
@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_invalid_cap_raises_at_construction_and_allocates_nothing(mode, placement, bad):
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    before = dict(backend._buffers)
    extra = {"placement": placement} if placement else {}
    with pytest.raises(AttentionInputError, match="logits_soft_cap"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode=mode,
                        dtype=torch.float32, logits_soft_cap=bad, **SHAPES, **extra)
    assert backend._buffers == before
    backend.close()


def test_host_update_on_a_fia_backend_refuses_a_cap(monkeypatch):
    """FIA (the NPU backend's host path) has no soft cap: refused before any allocation."""
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    monkeypatch.setattr(backend, "host_update_attention", "fia")
    with pytest.raises(AttentionInputError, match="FIA"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="host_update",
                        dtype=torch.float32, logits_soft_cap=50.0, **SHAPES)
    assert backend._buffers == {}
    backend.close()


def test_default_is_no_cap():
    attn = make_attention("device_tiling", num_layers=1)
    assert attn.logits_soft_cap is None
    attn.backend.close()
