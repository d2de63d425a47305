"""StaticAttention with a sliding window, in every mode, on both AI Core consumers.

Each run steps a trace-driven loop (decode, speculative decode, chunked prefill, padded
buckets with zero-length slots) on 4 cores, so some units are split and merged by the
combine, and checks every output against the float64 reference with the window (the driver
passes ``attn.sliding_window``). Contexts grow well past the windows, so each run also checks
that the answer without the window is far away at the steps where the window cuts a context:
a consumer ignoring the window would fail. Today's tiling knows no window (every unit gets all
its blocks), so split units leave pieces with no block in the window: the combine must merge
their empty partials.
"""

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
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module")
def trace():
    return load_trace(limit=2000)


def _run(attn, batcher, steps, *, sinks=False):
    """Run the loop; returns (stats, steps with split units, steps where the window cuts a
    context, how far the unwindowed answer is at the nearest such step)."""
    scale, window = attn.params.head_dim ** -0.5, attn.sliding_window
    seen = {"splits": 0, "cut": 0, "far": float("inf")}

    def on_step(i, batch, outputs):
        plan = tiling.plan(attn.params, batch.cu_seqlens_q, batch.seqlens_kv,
                           causal=attn.causal)
        seen["splits"] += bool(plan.combine_records())
        if not (batch.seqlens_kv > window).any():
            return
        seen["cut"] += 1
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            full = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                       batch.cu_seqlens_q, batch.seqlens_kv, scale=scale,
                                       sinks=attn.sinks[layer] if sinks else None)
            seen["far"] = min(seen["far"], relative_error(out, full))

    if sinks:
        for layer, sink in enumerate(attn.sinks):
            sink.copy_(2.0 + 0.3 * torch.arange(sink.numel(), dtype=torch.float32) + layer)
    stats = run_decode_loop(attn, batcher, steps=steps, on_step=on_step)
    return stats, seen


def _check(stats, seen, steps, dtype, *, trace_mix=True):
    assert stats.steps == steps
    if trace_mix:
        assert stats.padded_steps > 0 and stats.zero_length_slots > 0
        assert stats.prefill_steps > 0
    assert stats.spec_steps > 0
    assert seen["splits"] > 0, "no step split a unit: the combine path was not exercised"
    assert seen["cut"] >= steps // 2, seen
    assert stats.max_rel_err <= TOL[dtype], stats.max_rel_err
    # wherever the window cuts a context, ignoring it misses by several tolerances
    assert seen["far"] > max(0.02, 3 * TOL[dtype]), seen


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_c_consumer_matches_the_window_reference(trace, mode, placement, dtype):
    """W = 13 (block 8: the window spans two or three blocks)."""
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, dtype=dtype, sliding_window=13, **extra)
    assert attn.sliding_window == 13
    stats, seen = _run(attn, make_batcher(trace, **TRACE_MIX), 30)
    attn.backend.close()
    _check(stats, seen, 30, dtype)


@pytest.mark.parametrize("window", [3, 8, 1000])
def test_windows_below_at_and_past_a_block(trace, window):
    """A window smaller than a block (3), equal to one (8), and past every context (1000: the
    unwindowed answer, exactly)."""
    attn = make_attention("device_tiling", sliding_window=window)
    if window < 1000:
        stats, seen = _run(attn, make_batcher(trace, **TRACE_MIX), 20)
        _check(stats, seen, 20, torch.float32)
    else:
        stats = run_decode_loop(attn, make_batcher(trace, **TRACE_MIX), steps=20)
        assert stats.steps == 20 and stats.max_rel_err <= TOL[torch.float32]
    attn.backend.close()


@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_window_with_sinks_and_the_soft_cap(trace, mode, placement):
    """gpt-oss's windowed layers: sinks and a window (W = 5), with a soft cap of 50 too."""
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, sinks=True, sliding_window=5, logits_soft_cap=50.0, **extra)
    stats, seen = _run(attn, make_batcher(trace, **TRACE_MIX), 20, sinks=True)
    attn.backend.close()
    _check(stats, seen, 20, torch.float32)


@pytest.mark.skipif(triton_launch.available() is not None,
                    reason=str(triton_launch.available()))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode, placement", MODES, ids=MODE_IDS)
def test_triton_consumer_matches_the_window_reference(mode, placement, dtype):
    """The same with the AI Core tasks run by the Triton kernels (interpreted), W = 5."""
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=120.0, aicore="triton")
    extra = {"placement": placement} if placement else {}
    attn = make_attention(mode, dtype=dtype, num_layers=1, backend=backend, sliding_window=5,
                          **extra)
    requests = synthetic_requests("uniform", 5, max_context=20, max_generated=6, seed=0)
    stats, seen = _run(attn, make_batcher(requests, spec_tokens=2, prefill_chunk=8), 6)
    backend.close()
    _check(stats, seen, 6, dtype, trace_mix=False)


def test_no_window_by_default_and_zero_is_refused_naming_the_convention():
    """None (the default) is no window; 0 is refused: FlashInfer's window_left = 0 and
    FlashAttention's window_size = (0, 0) are a one-key window, which is 1 here."""
    attn = make_attention("device_tiling", num_layers=1)
    assert attn.sliding_window is None and attn.params.sliding_window is None
    attn.backend.close()
    for mode in ("device_tiling", "host_update"):
        backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
        with pytest.raises(AttentionInputError, match="sliding_window=0 is refused") as info:
            StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode=mode,
                            dtype=torch.float32, sliding_window=0, **SHAPES)
        assert "None is no window" in str(info.value)
        assert "FlashInfer window_left + 1" in str(info.value)
        assert "FlashAttention window_size left + 1" in str(info.value)
        assert backend._buffers == {}
        backend.close()


@pytest.mark.parametrize("bad", [-1, True, 2.5, "8", torch.tensor(8)], ids=repr)
def test_window_must_be_a_positive_int(bad):
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    with pytest.raises(AttentionInputError, match="sliding_window"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="device_tiling",
                        dtype=torch.float32, sliding_window=bad, **SHAPES)
    assert backend._buffers == {}
    backend.close()


@pytest.mark.parametrize("mode", ["device_tiling", "host_update"])
def test_window_needs_causal_attention(mode):
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    with pytest.raises(AttentionInputError, match="causal"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode=mode,
                        dtype=torch.float32, causal=False, sliding_window=8, **SHAPES)
    assert backend._buffers == {}
    backend.close()


def test_host_update_on_a_fia_backend_refuses_a_window(monkeypatch):
    """FIA's pre_tokens and sparse_mode have no effect for one-token queries (torch_npu's
    documentation), so decode rows would see their whole context: refused before any
    allocation."""
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    monkeypatch.setattr(backend, "host_update_attention", "fia")
    with pytest.raises(AttentionInputError, match="FIA"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="host_update",
                        dtype=torch.float32, sliding_window=8, **SHAPES)
    assert backend._buffers == {}
    backend.close()
