"""`NpuTilingEngine.capture_mla` on CPU: its ops are our custom ops' CPU implementations (the
C reference MLA) and its captured launches a recorded list replayed in order, so the engine's
own logic runs for real (one tiling per graph key and step, planned for MLA geometry, shared by
the key's MLA layers; a key of its own beside a GQA one); only the device is not."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from pyruntime.backends import BackendError
from pyruntime.hook.dryrun.mla import reference
from pyruntime.hook.npu_engine import NpuTilingEngine, mla_graph_key
from pyruntime.hook.vllm_ascend_mla import MLACapture

pytest.importorskip("pyruntime.tiling", reason="needs our tiling kernels (pyruntime.tiling)")

H, L, R, BS, NB, T, N, MB = 4, 32, 16, 16, 12, 6, 3, 4


def _layer(gen, key, **overrides):
    fields = {
        "graph_key": key, "layer_name": "l", "q_nope": torch.randn(T, H, L, generator=gen),
        "q_pe": torch.randn(T, H, R, generator=gen),
        "kv_c_cache": torch.randn(NB, BS, 1, L, generator=gen),
        "k_pe_cache": torch.randn(NB, BS, 1, R, generator=gen),
        "block_table": torch.zeros(N, MB, dtype=torch.int32),
        "query_start_loc": torch.zeros(N + 1, dtype=torch.int32),
        "seq_lens": torch.zeros(N, dtype=torch.int32),
        "batch": torch.tensor([N], dtype=torch.int32),
        "output": torch.full((T, H, L), float("nan")), "num_heads": H, "kv_lora_rank": L,
        "qk_rope_head_dim": R, "block_size": BS, "scale": (L + R) ** -0.5}
    fields.update(overrides)
    return MLACapture(**fields)


@pytest.mark.parametrize("where", ["graph", "pre-replay"])
def test_mla_layers_share_one_tiling_per_step_and_match_float64(where):
    gen = torch.Generator().manual_seed(0)
    recorded = []
    engine = NpuTilingEngine(where, num_cores=3, launch=recorded.append)
    key = (7, T)
    first = _layer(gen, key)
    shared = {k: getattr(first, k) for k in ("block_table", "query_start_loc", "seq_lens",
                                              "batch")}
    layers = [first, _layer(gen, key, **shared)]
    for layer in layers:
        engine.capture_mla(layer)
    assert list(engine.keys) == [mla_graph_key(key)]
    for q_lens, kv_lens in (([1, 2, 2], [40, 17, 33]), ([2, 2], [60, 3])):
        n = len(q_lens)
        first.query_start_loc.zero_()
        first.query_start_loc[1: n + 1] = torch.tensor(q_lens).cumsum(0)
        first.query_start_loc[n + 1:] = sum(q_lens)  # trailing padded slots: no tokens
        first.seq_lens.zero_()
        first.seq_lens[:n] = torch.tensor(kv_lens)
        table = torch.randperm(NB, generator=gen)[: N * MB].view(N, MB).int()
        first.block_table.copy_(table)
        engine.before_replay(T)
        for launch in recorded:  # the replay
            launch()
        rows = sum(q_lens)
        for layer in layers:
            want = reference(layer.q_nope, layer.q_pe, layer.kv_c_cache[:, :, 0],
                             layer.k_pe_cache[:, :, 0], table, q_lens, kv_lens, layer.scale)
            got = layer.output[:rows].double()
            assert (got - want).abs().max() < 1e-5
            assert layer.output[rows:].abs().max() == 0  # padding rows zero
    assert engine.errors() == {}
    assert engine.tiling_launches == 2  # one per step, for both layers


def test_an_mla_layer_of_another_geometry_in_the_same_graph_is_refused():
    gen = torch.Generator().manual_seed(1)
    engine = NpuTilingEngine("graph", num_cores=3, launch=lambda fn: None)
    engine.capture_mla(_layer(gen, (1, T)))
    with pytest.raises(BackendError, match="MLA geometry differs"):
        engine.capture_mla(_layer(gen, (1, T), num_heads=8, q_nope=torch.zeros(T, 8, L),
                                  q_pe=torch.zeros(T, 8, R)))
    engine.capture_mla(_layer(gen, (1, 2 * T)))  # another bucket: a key of its own
    assert set(engine.keys) == {mla_graph_key((1, T)), mla_graph_key((1, 2 * T))}


def test_errors_reports_an_mla_tiling_that_failed_and_one_that_is_stale():
    """Review 2 item 7: ``errors()`` reads the MLA keys' tilings too. A step whose kv length
    exceeds what the key's block table holds (MB * BS) fails the tiling: the error is reported
    under the MLA key; a step whose tiling task does not run is reported stale."""
    from pyruntime import tiling

    gen = torch.Generator().manual_seed(2)
    recorded = []
    engine = NpuTilingEngine("graph", num_cores=3, launch=recorded.append)
    layer = _layer(gen, (7, T))
    engine.capture_mla(layer)
    mla_key = mla_graph_key((7, T))
    layer.query_start_loc.copy_(torch.tensor([0, 1, 2, 3], dtype=torch.int32))
    layer.seq_lens.copy_(torch.tensor([5, MB * BS + 1, 9], dtype=torch.int32))
    engine.before_replay(T)
    for launch in recorded:
        try:
            launch()
        except BackendError:  # the CPU body checks the status the NPU one leaves in place
            pass
    errors = engine.errors()
    assert list(errors) == [mla_key]
    assert isinstance(errors[mla_key], tiling.TilingError)
    assert not isinstance(errors[mla_key], tiling.StaleTilingError)
    # a new step whose tiling task never ran: under ``graph`` the replay advances the shared
    # device epoch (the key's first captured launch) and then re-runs the tiling task; run
    # only the former
    assert recorded[0] == engine._advance_epoch
    engine.before_replay(T)
    recorded[0]()
    stale = engine.errors()
    assert list(stale) == [mla_key] and isinstance(stale[mla_key], tiling.StaleTilingError)


def test_warm_up_mla_launches_each_variant_once_eagerly_and_leaves_the_layer_alone():
    """`warm_up_mla` (the hook calls it after vLLM-Ascend's eager decode, before the capture):
    the tiling task, attention and combine run at once (not through `launch`, which records
    the capture), on scratch buffers: the layer's output is untouched, no key is made, no
    tiling launch is counted. A second call for the same variant launches nothing; a new
    bucket (other tiling params) is a new variant. The captured layer is then not a cold
    capture; one of a variant never warmed up is."""
    gen = torch.Generator().manual_seed(2)
    recorded = []
    engine = NpuTilingEngine("graph", num_cores=3, launch=recorded.append)
    calls = []
    ops = engine.ops

    class Counting:  # the engine's ops, each call named
        def __getattr__(self, name):
            def call(*args, **kwargs):
                calls.append(name)
                return getattr(ops, name)(*args, **kwargs)
            return call

    engine.ops = Counting()
    layer = _layer(gen, None)
    layer.query_start_loc[1:] = torch.tensor([1, 2, 2]).cumsum(0).int()
    layer.seq_lens[:] = torch.tensor([5, 9, 3]).int()
    before = layer.output.clone()
    assert engine.warm_up_mla(layer) is True
    assert calls == ["plan_tiling", "mla_attention", "mla_combine"]
    assert recorded == [] and engine.keys == {} and engine.tiling_launches == 0
    assert torch.equal(layer.output.isnan(), before.isnan())  # written to a scratch output
    assert engine.warm_up_mla(layer) is False and len(calls) == 3
    assert engine.warm_up_mla(_layer(gen, None, output=torch.zeros(2 * T, H, L),
                                     q_nope=torch.zeros(2 * T, H, L),
                                     q_pe=torch.zeros(2 * T, H, R))) is True
    engine.capture_mla(replace(layer, graph_key=(1, T), layer_name="warm"))
    engine.capture_mla(_layer(gen, (2, T), layer_name="cold", block_table=torch.zeros(
        N, 2 * MB, dtype=torch.int32)))  # wider table: other params, never warmed up
    assert engine.cold_captures == ["cold"]


def test_a_warm_up_after_a_capture_leaves_the_shared_epoch_where_the_replays_left_it():
    """The keys share one device epoch that only replays advance: a warm-up for a new variant
    (vLLM warms each capture size up just before capturing it, after earlier sizes were
    captured) plans its scratch tiling against an epoch of its own. Reset to 0, the shared
    epoch could later come back to a value an old, stale tiling header carries."""
    gen = torch.Generator().manual_seed(3)
    recorded = []
    engine = NpuTilingEngine("graph", num_cores=3, launch=recorded.append)
    layer = _layer(gen, (1, T))
    layer.query_start_loc[1:] = torch.tensor([1, 2, 2]).cumsum(0).int()
    layer.seq_lens[:] = torch.tensor([5, 9, 3]).int()
    engine.capture_mla(layer)
    for _ in range(3):  # three replays: each advances the epoch, then plans
        for launch in recorded:
            launch()
    epoch = engine.device_epoch()
    other = _layer(gen, None, output=torch.zeros(2 * T, H, L), q_nope=torch.zeros(2 * T, H, L),
                   q_pe=torch.zeros(2 * T, H, R), query_start_loc=layer.query_start_loc,
                   seq_lens=layer.seq_lens)
    assert engine.warm_up_mla(other) is True  # a new variant: it launched
    assert engine.device_epoch() == epoch
