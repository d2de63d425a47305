"""StaticAttention with attention sinks (gpt-oss), in every mode, on both AI Core consumers.

Each run fills ``attn.sinks`` in place after the capture (so the graph must read the tensors
at replay, not bake them in), changes them half-way, and steps a trace-driven loop (decode,
speculative decode, chunked prefill, padded buckets with zero-length slots) on 4 cores, so
some units are split and merged by the combine. Every output is checked against the float64
reference with each sink counted once; the sinks (about 4) are large against the rows'
summed weights, so each run also checks that, at every step, the answers with the sinks left
out or counted twice are several tolerances away: a consumer doing either would fail.
"""

import math

import pytest
import torch

from pyruntime import backends, tiling
from pyruntime.attention import AttentionInputError, StaticAttention
from pyruntime.kernels import triton_launch
from pyruntime.workload.driver import run_decode_loop
from pyruntime.workload.reference import reference_attention, relative_error
from pyruntime.workload.synthetic import synthetic_requests
from pyruntime.workload.trace import load_trace

from .attention_helpers import NUM_BLOCKS, SHAPES, make_attention, make_batcher

MODES = [("device_tiling", "graph"), ("device_tiling", "pre-replay"), ("host_update", None)]
MODE_IDS = ["graph", "pre-replay", "host_update"]
TRACE_MIX = {"spec_tokens": 2, "prefill_chunk": 8, "length_scale": 0.1, "step_s": 0.05}
#: max relative error against float64: fp32 accumulation, then one rounding of the output
#: (and, on the Triton path, of P) to the storage dtype
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def trace():
    return load_trace(limit=2000)


def _fill(attn, step: int) -> None:
    """Sinks around 4, different per layer and head, and different after step 0 and half-way."""
    for layer, sink in enumerate(attn.sinks):
        heads = torch.arange(sink.numel(), dtype=torch.float32)
        sink.copy_(3.5 + 0.3 * heads + 0.2 * layer + (0.5 if step else 0.0))


def _run(attn, batcher, steps, *, soft_cap=None):
    """Run the loop (sinks refilled half-way); returns (stats, split steps, how far the
    no-sink and twice-counted-sink answers are, worst over steps and layers)."""
    scale, far, splits = attn.params.head_dim ** -0.5, [math.inf, math.inf], [0]

    def on_step(i, batch, outputs):
        plan = tiling.plan(attn.params, batch.cu_seqlens_q, batch.seqlens_kv,
                           causal=attn.causal)
        splits[0] += bool(plan.combine_records())
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            args = (attn.queries[layer], k, v, batch.block_table, batch.cu_seqlens_q,
                    batch.seqlens_kv)
            for j, sinks in enumerate((None, attn.sinks[layer] + math.log(2.0))):
                want = reference_attention(*args, scale=scale, causal=attn.causal,
                                           logits_soft_cap=soft_cap, sinks=sinks)
                far[j] = min(far[j], relative_error(out, want)) if want.any() else far[j]
        if i == steps // 2 - 1:
            _fill(attn, 1)  # the next replay must read the new values

    _fill(attn, 0)
    stats = run_decode_loop(attn, batcher, steps=steps, on_step=on_step,
                            query_scale=4.0 if soft_cap else 1.0)
    return stats, splits[0], far


def _check(stats, steps, splits, far, dtype):
    assert stats.steps == steps
    assert stats.padded_steps > 0 and stats.zero_length_slots > 0
    assert stats.spec_steps > 0 and stats.prefill_steps > 0
    assert splits > 0, "no step split a unit: the combine's sink was not exercised"
    assert stats.max_rel_err <= TOL[dtype], stats.max_rel_err
    # at every step, leaving the sinks out or counting them twice misses by several tolerances
    assert min(far) > max(0.02, 3 * TOL[dtype]), far


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_c_consumer_matches_the_sinks_reference(trace, mode, placement, dtype):
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, dtype=dtype, sinks=True, **extra)
    assert len(attn.sinks) == 2 and all(s.dtype == torch.float32 and s.shape == (4,)
                                        for s in attn.sinks)
    stats, splits, far = _run(attn, make_batcher(trace, **TRACE_MIX), 40)
    attn.backend.close()
    _check(stats, 40, splits, far, dtype)


@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_sinks_with_the_soft_cap(trace, mode, placement):
    """The cap bends the scores (C = 2, queries x4), never the sink."""
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, sinks=True, logits_soft_cap=2.0, **extra)
    stats, splits, far = _run(attn, make_batcher(trace, **TRACE_MIX), 20, soft_cap=2.0)
    attn.backend.close()
    _check(stats, 20, splits, far, torch.float32)


@pytest.mark.skipif(triton_launch.available() is not None,
                    reason=str(triton_launch.available()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_triton_consumer_matches_the_sinks_reference(mode, placement, dtype):
    """The same with the AI Core tasks run by the Triton kernels (interpreted)."""
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=120.0, aicore="triton")
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, dtype=dtype, num_layers=1, backend=backend, sinks=True,
                          **extra)
    requests = synthetic_requests("uniform", 5, max_context=20, max_generated=6, seed=0)
    stats, splits, far = _run(attn, make_batcher(requests, spec_tokens=2, prefill_chunk=8), 6)
    backend.close()
    _check(stats, 6, splits, far, dtype)


def test_no_sinks_by_default():
    """sinks=False (the default): ``attn.sinks`` is None and nothing is allocated for it."""
    attn = make_attention("device_tiling", num_layers=1)
    assert attn.sinks is None
    attn.backend.close()


@pytest.mark.parametrize("bad", [1, 0, None, "yes", torch.zeros(4)], ids=repr)
def test_sinks_must_be_a_bool(bad):
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    with pytest.raises(AttentionInputError, match="sinks"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="device_tiling",
                        dtype=torch.float32, sinks=bad, **SHAPES)
    assert backend._buffers == {}
    backend.close()


def test_host_update_on_a_fia_backend_refuses_sinks(monkeypatch):
    """The FIA call of the NPU backend's host path has no sink argument: refused before any
    allocation."""
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    monkeypatch.setattr(backend, "host_update_attention", "fia")
    with pytest.raises(AttentionInputError, match="FIA"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="host_update",
                        dtype=torch.float32, sinks=True, **SHAPES)
    assert backend._buffers == {}
    backend.close()
