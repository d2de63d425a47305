"""Exact per-step invariants (issue 30): what one warm host step of each mode calls, counted.

The device modes' rows are the same at every layer count; host_update's grow by a whole
amount per layer (the positive control); a per-layer call slipped into the device path is
flagged. Two layer counts here (the bench counts at five), small shapes: seconds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyruntime.measurement import invariants as inv
from pyruntime.measurement.abrun import Geometry

LAYERS = (1, 3)
GEOMETRY = Geometry(max_kv=256)


def _measure(modes=("host_update", "device_tiling", "pre_replay")) -> dict:
    return inv.measure(GEOMETRY, layers=LAYERS, modes=modes, batch=8, warmup=1)


@pytest.fixture(scope="module")
def table() -> dict:
    return _measure()


def test_device_modes_are_the_same_at_every_layer_count(table):
    assert inv.judge(table) == []
    for mode in inv.DEVICE_MODES:
        low, high = (table[mode][str(n)] for n in LAYERS)
        assert low == high and low["python_calls"] > 0 and low["c_calls"] > 0
    graph, pre = table["device_tiling"]["1"], table["pre_replay"]["1"]
    # a step of the graph placement: two input copies and one replay, nothing waited for
    assert (graph["copies_h2d"], graph["replays"], graph["launches_aicpu"]) == (2, 1, 0)
    assert graph["synchronizes"] == graph["copies_h2d_blocking"] == 0
    assert graph["event_records"] == graph["event_waits"] == graph["lib_calls"] == 0
    # pre-replay adds its AI-CPU launch, ordered by one fork and one join event
    assert (pre["launches_aicpu"], pre["event_records"], pre["event_waits"]) == (1, 2, 2)
    assert pre["synchronizes"] == pre["copies_h2d_blocking"] == 0


def test_host_update_grows_by_its_per_layer_work(table):
    """The positive control: the counting sees host_update's work per layer."""
    per_layer = inv.per_layer_amount(table["host_update"])
    # per layer: one task update, one host tiling (3 calls into lib: params check, bytes,
    # plan), attention and combine re-issued, the layer's external event recorded
    assert per_layer["task_updates"] == per_layer["host_tiling_calls"] == 1
    assert per_layer["lib_calls"] == 3 and per_layer["launches_aicore"] == 2
    assert per_layer["event_records"] == 1
    assert per_layer["python_calls"] > 50 and per_layer["c_calls"] > 50
    assert per_layer["replays"] == per_layer["copies_h2d"] == per_layer["synchronizes"] == 0
    row = table["host_update"]["1"]
    assert row["synchronizes"] == 1  # vLLM-Ascend's synchronize before its replay


def test_one_added_call_per_layer_on_the_device_path_is_flagged(monkeypatch):
    """A device path that does one more Python call per layer per step (here a no-op over
    the layers' queries) breaks the invariant, and judge says which mode and by how much."""
    from pyruntime.graph_attention import device_tiling

    def per_layer_noop(_query) -> None:
        return None

    step = device_tiling.DeviceTilingPath.step

    def step_with_work_per_layer(self, inputs, *rest):
        for query in self.buffers.queries:
            per_layer_noop(query)
        return step(self, inputs, *rest)

    monkeypatch.setattr(device_tiling.DeviceTilingPath, "step", step_with_work_per_layer)
    found = _measure(modes=("device_tiling",))
    problems = inv.judge(found)
    assert len(problems) == 1 and problems[0].startswith("device_tiling: host work per step "
                                                         "grows with the layer count")
    low, high = (found["device_tiling"][str(n)] for n in LAYERS)
    # the wrapper is one call more per step; the no-op one more per layer
    assert high["python_calls"] - low["python_calls"] == LAYERS[1] - LAYERS[0]


def test_one_added_device_operation_per_layer_is_flagged(monkeypatch):
    """The same with a backend operation: one event record per layer per step."""
    from pyruntime.graph_attention import device_tiling

    step = device_tiling.DeviceTilingPath.step

    def step_with_records(self, inputs, *rest):
        for _ in self.buffers.queries:
            self.stream.record_event(self._spare)
        return step(self, inputs, *rest)

    init = device_tiling.DeviceTilingPath.__init__

    def init_with_spare(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._spare = self.backend.event()

    monkeypatch.setattr(device_tiling.DeviceTilingPath, "__init__", init_with_spare)
    monkeypatch.setattr(device_tiling.DeviceTilingPath, "step", step_with_records)
    found = _measure(modes=("device_tiling",))
    (problem,) = inv.judge(found)
    assert "'event_records': 2" in problem  # L=3 against L=1


def _engine() -> dict:
    from pyruntime.hook.engine_step import engine_step_work
    from pyruntime.measurement.serving import EngineWork

    out = {}
    for mode, placement in (("device_tiling", "graph"), ("pre_replay", "pre-replay")):
        c = engine_step_work(placement, 4)
        out[mode] = EngineWork(4, c.h2d_copies, c.blocking_copies, c.tiling_launches,
                               c.device_ops)
    return out


def _measure_serving(modes=("host_update", "device_tiling", "pre_replay")) -> dict:
    return inv.measure(GEOMETRY, layers=LAYERS, modes=modes, batch=8, warmup=1,
                       method="symmetric", engine=_engine())


def test_symmetric_rows_count_the_whole_serving_step(table):
    """Under the symmetric method the rows are the bench's whole measured serving step: every
    mode's input copies and vLLM-Ascend's pre-replay synchronize, and the hook engine's
    per-step work in the device modes (under pre-replay the tiling task's launch)."""
    served = _measure_serving()
    assert inv.judge(served) == []
    for mode in inv.DEVICE_MODES:
        low, high = (served[mode][str(n)] for n in LAYERS)
        assert low == high
        assert low["synchronizes"] == 1 and low["copies_h2d"] == 2
        assert low["copies_h2d_blocking"] == 0  # the engine adds no blocking copy
        assert low["python_calls"] > table[mode]["1"]["python_calls"]
    # the engine adds no device op per step (the replay advances the epoch) and, under
    # pre-replay, the tiling task alone
    assert served["pre_replay"]["1"]["launches_aicore"] == 0
    assert served["pre_replay"]["1"]["launches_aicpu"] == 1
    assert served["device_tiling"]["1"]["launches_aicore"] == 0
    hu = served["host_update"]["1"]
    assert (hu["copies_h2d"], hu["synchronizes"]) == (2, 1)  # lengths copied too, as theirs
    per_layer = inv.per_layer_amount(served["host_update"])
    assert per_layer == inv.per_layer_amount(table["host_update"])  # the same per-layer work


def test_per_layer_work_in_the_serving_step_is_flagged(monkeypatch):
    """The count covers the serving step: one engine operation per layer there (one no-op
    AI Core launch per layer) breaks the device modes' invariant."""
    from pyruntime.measurement import serving

    call = serving.ServingStep.__call__

    def with_work_per_layer(self):
        for _ in self.buffers.queries:
            self.backend.launch(serving._NO_OP_TASK, {}, num_cores=1, stream=self.path.stream)
        return call(self)

    monkeypatch.setattr(serving.ServingStep, "__call__", with_work_per_layer)
    found = _measure_serving(modes=("device_tiling",))
    (problem,) = inv.judge(found)
    assert problem.startswith("device_tiling: host work per step grows")
    assert "'launches_aicore': 2" in problem  # L=3 against L=1


def test_symmetric_counting_needs_the_engine_work():
    with pytest.raises(ValueError, match="engine"):
        inv.measure(GEOMETRY, layers=(1,), modes=("device_tiling",), batch=8,
                    method="symmetric")


def _rows(per_layer: dict, base: dict, layers=(1, 8, 16)) -> dict:
    return {str(n): {k: base[k] + (n - 1) * per_layer[k] for k in base} for n in layers}


BASE = {"python_calls": 100, "c_calls": 90, "lib_calls": 3, "task_updates": 1,
        "host_tiling_calls": 1}


def test_judge_accepts_an_exact_line_and_rejects_what_is_off_it():
    good = _rows({"python_calls": 95, "c_calls": 119, "lib_calls": 3, "task_updates": 1,
                  "host_tiling_calls": 1}, BASE)
    assert inv.judge({"host_update": good}) == []
    off = json.loads(json.dumps(good))
    off["8"]["python_calls"] += 1  # one call that is not per layer, at one L only
    (problem,) = inv.judge({"host_update": off})
    assert problem == "host_update: L=8 is off the per-layer line by {'python_calls': 1}"
    uneven = json.loads(json.dumps(good))
    uneven["16"]["c_calls"] += 1  # the ends no longer span a whole amount per layer
    assert "not a whole number" in inv.judge({"host_update": uneven})[0]


def test_judge_flags_a_positive_control_that_does_not_grow():
    flat = _rows({"python_calls": 0, "c_calls": 0, "lib_calls": 3, "task_updates": 0,
                  "host_tiling_calls": 0}, BASE)
    (problem,) = inv.judge({"host_update": flat})
    assert "the counting cannot see per-layer work" in problem


def test_linear_fit_matches_the_textbook_interval():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    xs = [float(x) for x in np.repeat([1, 8, 16, 32, 61], 6)]
    ys = [20.0 + 0.05 * x + float(rng.normal(0, 2)) for x in xs]
    fit = inv.linear_fit(xs, ys)
    want = stats.linregress(xs, ys)
    t = stats.t.ppf(0.975, len(xs) - 2)
    assert fit["slope"] == pytest.approx(want.slope)
    assert fit["intercept"] == pytest.approx(want.intercept)
    assert fit["ci"] == pytest.approx([want.slope - t * want.stderr,
                                       want.slope + t * want.stderr], rel=1e-9)
    assert inv.linear_fit([1.0, 1.0], [2.0, 3.0])["slope"] is None  # no spread in L


def test_host_time_fit_reports_slope_interval_and_ratio():
    host = {"host_update": {1: [100.0, 102.0], 61: [6100.0, 6110.0]},
            "device_tiling": {1: [20.0, 21.0], 61: [20.0, 22.0]}}
    fit = inv.host_time_fit(host)
    assert fit["modes"]["host_update"]["slope_us_per_layer"] == pytest.approx(100.1, rel=1e-3)
    assert fit["modes"]["device_tiling"]["median_us"] == [20.5, 21.0]
    assert fit["ratio"]["device_tiling"] == pytest.approx(6105.0 / 21.0)
    assert "pre_replay" not in fit["ratio"]  # not measured


def test_counters_count_blocking_copies_synchronizes_and_events():
    from pyruntime import backends

    be = backends.get("cpu")
    try:
        s = be.stream("s")
        buf = be.alloc((4,), __import__("torch").int32)
        be.copy_h2d(buf, np.arange(4, dtype=np.int32), stream=s)
        be.copy_h2d(buf, np.arange(4, dtype=np.int32), stream=s, blocking=True)
        event = s.record_event()
        be.stream("t").wait_event(event)
        s.synchronize()
        event.synchronize()
        be.synchronize()
        c = be.counters.snapshot()
        assert (c["copies_h2d"], c["copies_h2d_blocking"]) == (2, 1)
        assert (c["event_records"], c["event_waits"], c["synchronizes"]) == (1, 1, 3)
        assert buf.tolist() == [0, 1, 2, 3]
    finally:
        be.close()
