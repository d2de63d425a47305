"""The bench's symmetric method (issue 30, item 1): the hook engine's per-step work is read
off `NpuTilingEngine` and issued by the bench's device modes; the floor; the side-by-side
run of both methods."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyruntime import backends
from pyruntime.hook.engine_step import EngineStepError, engine_step_work
from pyruntime.hook.npu_engine import NpuTilingEngine
from pyruntime.measurement import serving
from pyruntime.measurement.abrun import Geometry, RunSpec, make_attention, run_interleaved
from pyruntime.measurement.serving import EngineWork, ServingStep

GEOM = Geometry(max_kv=512, num_blocks=8)


def _work(placement: str, keys: int) -> EngineWork:
    c = engine_step_work(placement, keys)
    return EngineWork(keys, c.h2d_copies, c.blocking_copies, c.tiling_launches, c.device_ops)


@pytest.mark.parametrize("keys", [1, 8])
def test_the_counts_are_what_the_engine_does_per_step(keys, monkeypatch):
    """Counted against the engine's own seams: its plan calls and its epoch advances (the
    engine copies nothing from the host per step since the device-advanced epoch)."""
    advances, plans = [], []
    real_advance, real_plan = NpuTilingEngine._advance_epoch, NpuTilingEngine._plan

    monkeypatch.setattr(NpuTilingEngine, "_advance_epoch",
                        lambda self: (advances.append(1), real_advance(self)))
    monkeypatch.setattr(NpuTilingEngine, "_plan",
                        lambda self, key, count=True: (plans.append(1),
                                                       real_plan(self, key, count)))
    for placement in ("graph", "pre-replay"):
        advances.clear(), plans.clear()
        counts = engine_step_work(placement, keys)
        # two before_replay calls ran (after the captures); the second is the one counted
        assert (counts.h2d_copies, counts.blocking_copies) == (0, 0)
        pre = placement == "pre-replay"
        assert counts.tiling_launches == len(plans) // 2 == pre
        # the epoch's advance is captured in the graphs under both placements
        assert counts.device_ops == len(advances) // 2 == 0


def test_a_change_to_before_replay_changes_the_counts_or_is_refused(monkeypatch):
    import torch

    real = NpuTilingEngine.before_replay

    def per_key_copies(self, num_tokens=None):  # the per-key epoch copy before issue 30
        self.epoch += 1
        host = torch.full((1,), self.epoch, dtype=torch.int32)
        for key in self.keys.values():
            key.epoch.copy_(host)

    monkeypatch.setattr(NpuTilingEngine, "before_replay", per_key_copies)
    counts = engine_step_work("graph", 8)
    assert (counts.h2d_copies, counts.blocking_copies) == (8, 8)

    def one_shared_copy(self, num_tokens=None):  # one non-blocking copy shared by every key
        self.epoch += 1
        host = torch.full((1,), self.epoch, dtype=torch.int32)
        next(iter(self.keys.values())).epoch.copy_(host, non_blocking=True)

    monkeypatch.setattr(NpuTilingEngine, "before_replay", one_shared_copy)
    counts = engine_step_work("graph", 8)
    assert (counts.h2d_copies, counts.blocking_copies) == (1, 0)

    def with_a_fill(self, num_tokens=None):  # device work the bench has no stand-in for
        real(self, num_tokens)
        next(iter(self.keys.values())).tiling.fill_(1)

    monkeypatch.setattr(NpuTilingEngine, "before_replay", with_a_fill)
    with pytest.raises(EngineStepError, match="fill_"):
        engine_step_work("graph", 2)

    def with_an_op(self, num_tokens=None):
        real(self, num_tokens)
        self.ops.bump_epoch()

    monkeypatch.setattr(NpuTilingEngine, "before_replay", with_an_op)
    with pytest.raises(EngineStepError, match="bump_epoch"):
        engine_step_work("graph", 2)


def test_graph_keys_below_one_are_refused():
    with pytest.raises(ValueError, match="graph_keys"):
        engine_step_work("graph", 0)


def test_default_k_is_vllms_default_capture_list():
    sizes = serving.vllm_default_capture_sizes()
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-2:] == [248, 256]
    assert serving.DEFAULT_GRAPH_KEYS == len(sizes) == 35
    assert len(serving.vllm_default_capture_sizes(max_num_seqs=256)) == 51  # up to 512


@pytest.mark.parametrize("mode,placement", [("device_tiling", "graph"),
                                            ("pre_replay", "pre-replay")])
def test_the_bench_device_step_issues_the_engines_work(mode, placement, monkeypatch):
    """Per step: the path's two copies plus the engine's copies; one synchronize (vLLM's)
    plus one per blocking copy; the engine's tiling launches (the pre-replay path's own
    launch is one of them)."""
    work = _work(placement, 5)
    be = backends.get("cpu")
    try:
        attn = make_attention(be, mode, GEOM, 2, 4, 8)
        before = ServingStep(attn, mode, work)
        syncs = []
        real = type(be).stream_synchronize
        monkeypatch.setattr(type(be), "stream_synchronize",
                            lambda self, s: (syncs.append(s), real(self, s)))
        table = np.zeros((4, GEOM.max_blocks_per_req), np.int32)
        cu, kv = np.arange(5, dtype=np.int32), np.full(4, 100, np.int32)
        be.counters.reset()
        attn.step(table, cu, kv, wait=False, before_replay=before)
        got, synced = be.counters.snapshot(), len(syncs)
        attn.wait()
        assert got["copies_h2d"] == 2 + work.h2d_copies
        assert synced == 1 + work.blocking_copies
        assert got["launches_aicpu"] == work.tiling_launches
        assert got["launches_aicore"] == work.device_ops  # the attention runs in the replay
        assert got["replays"] == 1
        attn.check()
        attn.close()
    finally:
        be.close()


def test_symmetric_host_update_copies_the_lengths_too():
    be = backends.get("cpu")
    try:
        attn = make_attention(be, "host_update", GEOM, 2, 4, 8)
        before = ServingStep(attn, "host_update", None)
        table = np.zeros((4, GEOM.max_blocks_per_req), np.int32)
        cu, kv = np.arange(5, dtype=np.int32), np.full(4, 100, np.int32)
        before.stage(cu, kv)
        be.counters.reset()
        attn.step(table, cu, kv, before_replay=before)
        assert be.counters.copies_h2d == 2  # the block table and the lengths, as device modes
        assert attn.block_table is not None and int(before.buffers.lengths[1]) == 4
        attn.close()
    finally:
        be.close()


def test_symmetric_needs_the_engine_work_of_each_device_mode():
    with pytest.raises(ValueError, match="engine"):
        run_interleaved([RunSpec("d", "device_tiling", 1, "symmetric")], 4, "uniform", GEOM,
                        {}, steps=1, warmup=0)


def test_both_methods_and_the_floor_in_one_run(cli, tmp_path):
    code, out, err = cli("bench", "--layers", "2", "--batch-sizes", "4", "--sources", "uniform",
                         "--steps", "2", "--warmup", "0", "--max-kv", "512",
                         "--method", "old,symmetric", "--graph-keys", "3", "--json",
                         "--no-save", "--no-progress", "--no-flatness")
    assert code == 0, err
    result = json.loads(out)
    assert result["method"]["methods"] == ["old", "symmetric"]
    engine = result["method"]["engine_per_step"]
    # the hook engine copies nothing per step; under pre-replay it launches the tiling task
    # (the replay advances the epoch)
    assert engine["device_tiling"] == {"graph_keys": 3, "h2d_copies": 0, "blocking_copies": 0,
                                       "tiling_launches": 0, "device_ops": 0}
    assert engine["pre_replay"] == {"graph_keys": 3, "h2d_copies": 0, "blocking_copies": 0,
                                    "tiling_launches": 1, "device_ops": 0}
    point = result["points"][0]
    assert set(point["methods"]) == {"old", "symmetric"} and point["method"] == "old"
    sym = point["methods"]["symmetric"]["modes"]
    assert sym["device_tiling"]["counters_per_step"]["copies_h2d"] == 2
    assert sym["pre_replay"]["counters_per_step"]["launches_aicore"] == 0  # no epoch op
    assert sym["pre_replay"]["counters_per_step"]["launches_aicpu"] == 1
    assert sym["host_update"]["counters_per_step"]["copies_h2d"] == 2
    assert point["methods"]["old"]["modes"]["host_update"]["counters_per_step"][
        "copies_h2d"] == 1
    floor = sym["floor"]["counters_per_step"]
    assert {k: floor[k] for k in ("launches_aicpu", "launches_aicore", "task_updates",
                                  "host_tiling_calls", "replays", "copies_h2d")} == {
        "launches_aicpu": 0.0, "launches_aicore": 0.0, "task_updates": 0.0,
        "host_tiling_calls": 0.0, "replays": 1.0, "copies_h2d": 2.0}
    assert set(result["floor_ratio"]) == {"device_tiling", "pre_replay"}
    assert all(v > 0 for v in result["floor_ratio"].values())
    assert {"median", "max"} <= set(sym["pre_replay"]["blocked_us"])


def test_an_unknown_method_is_a_usage_error(cli):
    code, _, err = cli("bench", "--method", "fast")
    assert code == 2 and "unknown method fast" in err




def test_the_floors_measured_step_follows_a_device_modes_step(monkeypatch):
    """Same host state (issue 30, item 3): under the symmetric method the floor's measured
    step follows a whole device_tiling step on the floor's backend (`FloorLead`), as each
    device mode's follows its own, and the floor's counters stay the floor's."""
    from pyruntime.measurement import abrun

    events = []
    real_lead, real_floor = abrun.FloorLead.step, serving.FloorStep.step
    monkeypatch.setattr(abrun.FloorLead, "step",
                        lambda self, *a: (events.append("lead"), real_lead(self, *a)))
    monkeypatch.setattr(serving.FloorStep, "step",
                        lambda self, *a, **k: (events.append("floor"),
                                               real_floor(self, *a, **k)))
    engine = {"device_tiling": _work("graph", 2)}
    runs = run_interleaved([RunSpec("d", "device_tiling", 2), RunSpec("f", "floor", 2)], 4,
                           "uniform", GEOM, {}, steps=3, warmup=1, method="symmetric",
                           engine=engine)
    assert events == ["lead", "floor"] * 4  # one lead before every floor step, warm-up too
    floor = runs[1].counters
    assert (floor["replays"], floor["copies_h2d"], floor["launches_aicpu"],
            floor["launches_aicore"], floor["task_updates"]) == (1.0, 2.0, 0.0, 0.0, 0.0)


def test_the_tiling_tasks_arguments_are_built_once_per_bucket():
    """The pre-replay path launches its tiling task every step with the same static
    arguments: built once, not per step (host work the floor does not have)."""
    be = backends.get("cpu")
    try:
        attn = make_attention(be, "pre_replay", GEOM, 1, 4, 8)
        path = attn._live()[1]
        assert path._tiling_args() is path._tiling_args()
        attn.close()
    finally:
        be.close()


def test_engine_work_with_host_copies_is_refused_not_left_out():
    """The engine copies nothing per step (item 4), so the bench's stand-in for per-key epoch
    copies was removed (it ran on no path); an engine that copies again is refused."""
    be = backends.get("cpu")
    try:
        attn = make_attention(be, "device_tiling", GEOM, 1, 4, 8)
        for copies, blocking in ((8, 8), (1, 0)):
            with pytest.raises(ValueError, match="copies from the host per step"):
                ServingStep(attn, "device_tiling", EngineWork(8, copies, blocking, 0))
        assert ServingStep(attn, "device_tiling", EngineWork(8, 0, 0, 0)).extra_launches == 0
        attn.close()
    finally:
        be.close()


def test_both_floor_methods_side_by_side_in_one_run(cli):
    """``--floor-method lead,noop``: the floor measured after a device_tiling step (the
    device modes' host state, the headline) and after its own no-op step (the way before
    2026-12-03) in ONE run, each with its ratios. They measure the same work (counters) and
    differ in what preceded the measured step (the recorded marker), not by a timing."""
    code, out, err = cli("bench", "--layers", "2", "--batch-sizes", "4", "--sources", "uniform",
                         "--steps", "2", "--warmup", "0", "--max-kv", "512",
                         "--floor-method", "lead,noop", "--graph-keys", "2", "--json",
                         "--no-save", "--no-progress", "--no-flatness", "--no-invariants")
    assert code == 0, err
    result = json.loads(out)
    assert result["floor_method"]["headline"] == "lead"
    assert result["floor_method"]["methods"] == ["lead", "noop"]
    point = result["points"][0]
    modes = point["modes"]
    assert {"floor", "floor_noop"} <= set(modes)
    # what preceded each measured step: the lead floor a device_tiling step, as every device
    # mode its own; the noop floor its own no-op step
    assert modes["floor"]["preceded_by"] == ["device_tiling"]
    assert modes["floor_noop"]["preceded_by"] == ["floor"]
    assert modes["device_tiling"]["preceded_by"] == ["device_tiling"]
    assert modes["pre_replay"]["preceded_by"] == ["pre_replay"]
    # the same work per step: the lead's counters are left out of its floor's (host waits
    # differ: the noop floor's are averaged over both steps of its pair, the check's with them)
    work = ("copies_h2d", "copies_h2d_blocking", "replays", "launches_aicpu", "launches_aicore",
            "task_updates", "host_tiling_calls", "event_records", "event_waits")
    lead, noop = (modes[m]["counters_per_step"] for m in ("floor", "floor_noop"))
    assert {k: lead[k] for k in work} == {k: noop[k] for k in work}
    assert (lead["replays"], lead["copies_h2d"], lead["launches_aicore"]) == (1.0, 2.0, 0.0)
    ratios = point["floor_ratios"]
    assert set(ratios) == {"lead", "noop"}
    assert ratios["lead"]["mode"] == "floor" and ratios["noop"]["mode"] == "floor_noop"
    assert ratios["lead"]["device_tiling"] == point["floor_ratio"]["device_tiling"]
    assert all(ratios[fm][m]["value"] > 0 for fm in ratios for m in ("device_tiling",
                                                                      "pre_replay"))
    assert set(result["floor_ratios"]) == {"lead", "noop"}
    assert result["floor_ratio"] == {m: result["floor_ratios"]["lead"][m]
                                     for m in ("device_tiling", "pre_replay")}
    # the placements table leaves every floor out
    assert result["placements"] is None or not any(
        m.startswith("floor") for m in result["placements"]["host_us"])


def test_a_floor_method_without_symmetric_is_refused(cli):
    code, _, err = cli("bench", "--method", "old", "--floor-method", "noop", "--no-save")
    assert code != 0 and "--floor-method" in err
    code, _, err = cli("bench", "--floor-method", "slow")
    assert code == 2 and "unknown floor method slow" in err


def test_the_lead_floor_needs_the_lead_modes_engine_work():
    with pytest.raises(ValueError, match="floor method 'lead'"):
        run_interleaved([RunSpec("f", "floor", 1, floor_method="lead")], 4, "uniform", GEOM,
                        {}, steps=1, warmup=0, method="symmetric", engine={})
