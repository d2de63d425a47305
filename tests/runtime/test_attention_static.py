"""device_tiling does no per-layer host work; host_update does one update per layer."""

import pytest
import torch

from pyruntime.workload.synthetic import synthetic_requests

from .attention_helpers import make_attention, make_batcher


def _run(attn, steps):
    batcher = make_batcher(synthetic_requests("uniform", 40, max_context=90, seed=1))
    attn.step(*_next(batcher))  # first step outside the counted window
    before = attn.backend.counters.snapshot()
    for _ in range(steps):
        attn.step(*_next(batcher))
        attn.check()
    after = attn.backend.counters.snapshot()
    return {k: after[k] - before[k] for k in after}


def _next(batcher):
    b = batcher.next_step()
    return b.block_table, b.cu_seqlens_q, b.seqlens_kv


@pytest.mark.parametrize("num_layers", [1, 4])
def test_device_tiling_step_is_copies_and_one_replay(num_layers):
    attn = make_attention("device_tiling", num_layers=num_layers)
    delta = _run(attn, steps=10)
    assert delta == {"launches_aicpu": 0, "launches_aicore": 0, "task_updates": 0,
                     "host_tiling_calls": 0, "replays": 10, "copies_h2d": 20,
                     "copies_h2d_blocking": 0, "event_records": 0, "event_waits": 0,
                     "synchronizes": 20}  # step()'s wait and check()'s, per step
    aicpu = attn.backend.timings.by_kind["aicpu"].count
    assert aicpu == 11  # one AI-CPU tiling task per step, not per layer
    attn.backend.close()


@pytest.mark.parametrize("num_layers", [1, 4])
def test_host_update_updates_every_layer_every_step(num_layers):
    attn = make_attention("host_update", num_layers=num_layers)
    delta = _run(attn, steps=10)
    assert delta["task_updates"] == 10 * num_layers
    assert delta["host_tiling_calls"] == 10 * num_layers
    assert delta["launches_aicore"] == 10 * num_layers * 2  # attention + combine
    assert delta["replays"] == 10
    attn.backend.close()


def test_last_step_host_seconds_is_reported():
    attn = make_attention("device_tiling", num_layers=1)
    assert attn.last_step_host_seconds != attn.last_step_host_seconds  # NaN before a step
    attn.step(torch.zeros(8, 16, dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
              torch.zeros(0, dtype=torch.int32))
    assert 0 < attn.last_step_host_seconds < 1
    attn.backend.close()
