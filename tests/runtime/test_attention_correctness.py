"""Both modes match an independent float64 reference over trace-driven decode loops."""

import pytest
import torch

from pyruntime.workload.driver import run_decode_loop
from pyruntime.workload.synthetic import synthetic_requests
from pyruntime.workload.trace import load_trace

from .attention_helpers import make_attention, make_batcher

MODES = ("device_tiling", "host_update")
TRACE_MIX = {"spec_tokens": 2, "prefill_chunk": 8, "length_scale": 0.1, "step_s": 0.05}


@pytest.fixture(scope="module")
def trace():
    return load_trace(limit=2000)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype, steps, tolerance", [
    (torch.float32, 2000, 1e-5),  # at least 2,000 steps per mode
    (torch.bfloat16, 300, 1e-2),
    (torch.float16, 150, 1e-2),
])
def test_trace_driven_loop_matches_reference(trace, mode, dtype, steps, tolerance):
    attn = make_attention(mode, dtype=dtype)
    stats = run_decode_loop(attn, make_batcher(trace, **TRACE_MIX), steps=steps)
    assert stats.steps == steps
    assert stats.max_rel_err <= tolerance
    # the loop really covered padded buckets, zero-length slots, spec decode and prefill
    assert stats.padded_steps > 0 and stats.zero_length_slots > 0
    assert stats.spec_steps > 0 and stats.prefill_steps > 0
    attn.backend.close()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["uniform", "long_tail"])
def test_synthetic_lengths_match_reference(mode, kind):
    attn = make_attention(mode, num_layers=1)
    requests = synthetic_requests(kind, 200, max_context=100, max_generated=12)
    stats = run_decode_loop(attn, make_batcher(requests, spec_tokens=3), steps=80)
    assert stats.steps == 80 and stats.max_rel_err <= 1e-5
    attn.backend.close()


@pytest.mark.parametrize("mode", MODES)
def test_non_causal_matches_reference(mode):
    attn = make_attention(mode, num_layers=1, causal=False)
    requests = synthetic_requests("uniform", 200, max_context=60, max_generated=8, seed=3)
    stats = run_decode_loop(attn, make_batcher(requests, spec_tokens=2), steps=60)
    assert stats.steps == 60 and stats.max_rel_err <= 1e-5
    attn.backend.close()
