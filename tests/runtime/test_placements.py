"""The tiling producer's two placements, with and without replay re-running AI-CPU tasks.

``graph`` relies on graph replay re-running the captured AI-CPU task; when the backend is
told it does not (``replay_aicpu=False``), every step after the first must fail loudly
(StaleTilingError, zero outputs), never return a wrong answer. ``pre-replay`` launches the
task outside the graph every step and stays correct either way.
"""

import numpy as np
import pytest
import torch

from pyruntime import backends, tiling
from pyruntime.attention import StaticAttention
from pyruntime.workload.driver import run_decode_loop
from pyruntime.workload.reference import reference_attention, relative_error
from pyruntime.workload.trace import load_trace

from .attention_helpers import NUM_BLOCKS, SHAPES, make_attention, make_batcher

TRACE_MIX = {"spec_tokens": 2, "prefill_chunk": 8, "length_scale": 0.1, "step_s": 0.05}


def _backend(replay_aicpu):
    return backends.get("cpu", num_threads=1, wait_timeout_s=10.0, replay_aicpu=replay_aicpu)


@pytest.fixture(scope="module")
def trace():
    return load_trace(limit=600)


@pytest.mark.parametrize("replay_aicpu", [True, False])
def test_pre_replay_matches_the_float64_reference(trace, replay_aicpu):
    attn = make_attention("device_tiling", placement="pre-replay",
                          backend=_backend(replay_aicpu))
    stats = run_decode_loop(attn, make_batcher(trace, **TRACE_MIX), steps=300)
    assert stats.steps == 300 and stats.max_rel_err <= 1e-5
    assert stats.padded_steps > 0 and stats.spec_steps > 0 and stats.prefill_steps > 0
    attn.backend.close()


def test_graph_placement_matches_the_reference_when_replay_reruns_aicpu(trace):
    attn = make_attention("device_tiling", placement="graph", backend=_backend(True))
    stats = run_decode_loop(attn, make_batcher(trace, **TRACE_MIX), steps=100)
    assert stats.max_rel_err <= 1e-5
    attn.backend.close()


def test_graph_placement_fails_loudly_when_replay_skips_aicpu(trace):
    attn = make_attention("device_tiling", placement="graph", backend=_backend(False))
    batcher = make_batcher(trace, **TRACE_MIX)
    scale = SHAPES["head_dim"] ** -0.5
    stale = 0
    for i, batch in zip(range(40), batcher):
        for q in attn.queries:
            q.normal_()
        outs = attn.step(batch.block_table, batch.cu_seqlens_q, batch.seqlens_kv)
        try:
            attn.check()
        except tiling.StaleTilingError as exc:
            stale += 1
            assert exc.step_epoch == i + 1 and exc.tiling_epoch == 1  # frozen at step 1
            assert "pre-replay" in str(exc) and "did not run" in str(exc)
            assert all(not out.any() for out in outs)  # zeros, never a wrong answer
            continue
        assert i == 0, "a step after the first was not detected as stale"
        k, v = attn.kv_caches[0]
        want = reference_attention(attn.queries[0], k, v, batch.block_table,
                                   batch.cu_seqlens_q, batch.seqlens_kv, scale=scale)
        assert relative_error(outs[0], want) <= 1e-5
    assert stale == 39
    attn.backend.close()


def test_stale_error_is_a_typed_tiling_error():
    assert issubclass(tiling.StaleTilingError, tiling.TilingError)
    assert not issubclass(tiling.StaleTilingError, tiling.TilingInputError)


@pytest.mark.parametrize("num_layers", [1, 4])
def test_pre_replay_step_is_one_aicpu_launch_and_no_update(num_layers):
    attn = make_attention("device_tiling", placement="pre-replay", num_layers=num_layers)
    bt = torch.arange(8 * 16, dtype=torch.int32).reshape(8, 16)
    cu, kv = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32)
    attn.step(bt, cu, kv)
    before = attn.backend.counters.snapshot()
    for _ in range(10):
        attn.step(bt, cu, kv)
        attn.check()
    after = attn.backend.counters.snapshot()
    assert {k: after[k] - before[k] for k in after} == {
        "launches_aicpu": 10, "launches_aicore": 0, "task_updates": 0,
        "host_tiling_calls": 0, "replays": 10, "copies_h2d": 20, "copies_h2d_blocking": 0,
        # per step: the fork and join events of the launch; the waits of step() and check()
        "event_records": 20, "event_waits": 20, "synchronizes": 20}
    assert attn.backend.timings.by_kind["aicpu"].count == 11
    attn.backend.close()


def test_pre_replay_reports_bad_lengths_like_graph():
    attn = make_attention("device_tiling", placement="pre-replay")
    bt = torch.arange(8 * 16, dtype=torch.int32).reshape(8, 16)
    outs = attn.step(bt, torch.tensor([0, 1, 3, 4], dtype=torch.int32),
                     torch.tensor([9, 1, 1], dtype=torch.int32))
    with pytest.raises(tiling.KvShortError):
        attn.check()
    assert all(not out.any() for out in outs)
    attn.backend.close()


def _construct(**kw):
    backend = backends.get("cpu", num_threads=1)
    try:
        return StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS,
                               dtype=torch.float32, **SHAPES, **kw)
    finally:
        backend.close()


def test_placement_values_are_checked():
    with pytest.raises(ValueError, match=r"placement must be one of \['graph', 'pre-replay'\]"):
        _construct(mode="device_tiling", placement="eager")
    with pytest.raises(ValueError, match="applies to mode='device_tiling' only"):
        _construct(mode="host_update", placement="graph")
    assert _construct(mode="device_tiling").placement == "graph"
    assert _construct(mode="host_update").placement is None


def test_replay_aicpu_false_leaves_uncaptured_aicpu_tasks_alone():
    be = _backend(False)
    hits = np.zeros(1)
    k = backends.Kernel("count", "aicpu", lambda: hits.__setitem__(0, hits[0] + 1))
    s = be.stream()
    for _ in range(3):
        be.launch(k, {}, stream=s)
    s.synchronize()
    g = be.graph()
    with be.capture(g, s):
        be.launch(k, {}, stream=s)
    for _ in range(3):
        g.replay(s)
    s.synchronize()
    assert hits[0] == 3 + 1  # eager launches all ran; the captured one ran on replay 1 only
    be.close()
