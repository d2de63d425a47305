"""Profiler data, processors and renderers on synthetic data, timed by a fake clock."""

from __future__ import annotations

import json

import pytest

from pyruntime.profiler import processors as proc
from pyruntime.profiler.clock import FakeClock
from pyruntime.profiler.data import DeviceTask, HostStep, Run, Session, SessionError
from pyruntime.profiler.instrument import PhaseRecorder, instrument
from pyruntime.profiler.renderers.chrome_trace import chrome_trace, write_chrome_trace


def synthetic_session(layers: int = 3, steps: int = 5) -> Session:
    """Two runs with fixed numbers: host_update pays per-layer updates, device_tiling not."""
    runs = []
    t = 100.0
    for mode, per_layer in (("host_update", 60e-6), ("device_tiling", 0.0)):
        run = Run(mode, {"name": "L3-b4-trace", "layers": layers})
        for i in range(steps):
            host = 20e-6 + per_layer * layers + i * 1e-6
            phases = {"input_copies": 10e-6, "replay_launch": 10e-6 + i * 1e-6}
            if per_layer:
                phases["task_updates"] = per_layer * layers * 0.75
                phases["host_tiling"] = per_layer * layers * 0.25
            spans = [("input_copies", t, t + 10e-6), ("replay_launch", t + 10e-6, t + 20e-6)]
            run.steps.append(HostStep(t, host + 200e-6, host, phases, spans))
            tasks = [DeviceTask(i, "aicpu", "tiling", "stream-0", t + 20e-6, t + 25e-6)]
            for layer in range(layers):
                s = t + 30e-6 + layer * 50e-6
                tasks.append(DeviceTask(i, "aicore", f"attention layer {layer}", "stream-0",
                                        s, s + 40e-6))  # fmt: skip
            tasks.append(DeviceTask(i, "aicore", "combine", "stream-0", s + 40e-6, s + 45e-6))
            run.device_tasks += tasks
            t += 1e-3
        run.counters = {"task_updates": float(layers if per_layer else 0), "replays": 1.0}
        runs.append(run)
    return Session(runs, {"command": "test"})


def test_phase_recorder_books_exclusive_time_with_a_fake_clock():
    clock = FakeClock()
    rec = PhaseRecorder(clock)
    rec.enter("task_updates")
    clock.advance(3e-6)
    with rec.phase("host_tiling"):
        clock.advance(5e-6)
    clock.advance(2e-6)
    rec.exit()
    with rec.phase("replay_launch"):
        clock.advance(1e-6)
    assert rec.phases == pytest.approx({"task_updates": 5e-6, "host_tiling": 5e-6,
                                        "replay_launch": 1e-6})  # fmt: skip
    assert [s[0] for s in rec.spans] == ["task_updates", "replay_launch"]


class FakeBackend:
    """Just the methods the instrumentation wraps; each advances the fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def copy_h2d(self, dst, src):
        self.clock.advance(2e-6)

    def plan_on_host(self, *a, **k):
        self.clock.advance(7e-6)

    def graph_task_update_begin(self, stream, group):
        self.clock.advance(1e-6)
        self.plan_on_host()  # nested: booked to host_tiling, not to the update

    def replay(self, graph, stream=None):
        self.clock.advance(4e-6)


def test_instrument_wraps_and_restores():
    clock = FakeClock()
    be = FakeBackend(clock)
    rec = PhaseRecorder(clock)
    with instrument(be, rec):
        be.copy_h2d(None, None)
        be.graph_task_update_begin(None, None)
        be.replay(None)
    assert rec.phases == pytest.approx({"input_copies": 2e-6, "task_updates": 1e-6,
                                        "host_tiling": 7e-6, "replay_launch": 4e-6})  # fmt: skip
    assert "copy_h2d" not in be.__dict__  # class methods back in charge


def test_statistics_are_deterministic_and_sane():
    xs = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert proc.median(xs) == 3.0
    assert proc.percentiles(xs)["p50"] == 3.0
    a = proc.bootstrap_ci(xs, seed=1)
    assert a == proc.bootstrap_ci(xs, seed=1)
    assert a[0] <= 3.0 <= a[1]
    assert proc.bootstrap_ci([5.0]) == (5.0, 5.0)
    r = proc.ratio_of_medians([10.0, 20.0, 30.0], [1.0, 2.0, 3.0])
    assert r["value"] == 10.0 and r["ci"] == [10.0, 10.0]
    with pytest.raises(ValueError):
        proc.ratio_of_medians([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        proc.median([])


def test_host_breakdown_and_device_summary():
    s = synthetic_session()
    hu = proc.host_breakdown(s.runs[0])
    assert set(hu) >= {"input_copies", "task_updates", "host_tiling", "host", "total"}
    dt = proc.host_breakdown(s.runs[1])
    assert "task_updates" not in dt
    dev = proc.device_summary(s.runs[0])
    assert list(dev)[:2] == ["aicpu tiling", "attention layer 0"]
    assert list(dev)[-1] == "combine"
    assert dev["attention layer 2"]["count"] == 5
    collapsed = proc.collapse_layers(proc.device_summary(synthetic_session(layers=8).runs[0]))
    assert "attention layers 3-7 (mean)" in collapsed


def test_session_round_trip(tmp_path):
    s = synthetic_session()
    path = s.save(tmp_path / "s.json")
    back = Session.load(path)
    assert back.runs[0].steps[2] == s.runs[0].steps[2]
    assert back.runs[1].device_tasks == s.runs[1].device_tasks
    assert back.runs[0].counters == s.runs[0].counters


@pytest.mark.parametrize("content, match", [
    ("not json", "not JSON"),
    ('{"schema": "other"}', "not an aicpu-tiling"),
    ('{"schema": "aicpu-tiling/profile", "version": 99, "runs": []}', "version 99"),
    ('{"schema": "aicpu-tiling/profile", "version": 1, "runs": [{}]}', "damaged"),
])  # fmt: skip
def test_session_load_errors(tmp_path, content, match):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(SessionError, match=match):
        Session.load(p)
    with pytest.raises(SessionError, match="cannot read"):
        Session.load(tmp_path / "missing.json")


def test_chrome_trace_has_host_and_device_lanes(tmp_path):
    path = write_chrome_trace(synthetic_session(), tmp_path / "t.json")
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M"}
    assert (1, "host_update: L3-b4-trace (emulated, CPU backend)") in names
    assert (2, "device_tiling: L3-b4-trace (emulated, CPU backend)") in names
    threads = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert threads == {"host", "device: stream-0"}
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in slices)
    assert min(e["ts"] for e in slices) == 0
    assert any(e["name"] == "attention layer 2" and e["tid"] == 1 for e in slices)
    assert any(e["name"] == "step 0" and e["tid"] == 0 for e in slices)
    assert chrome_trace(Session())["traceEvents"] == []


def test_device_tasks_numbered_by_layer_in_start_order():
    from pyruntime.measurement.abrun import device_tasks_of_step

    records = [
        ("aicore", "aicpu_tiling.attention", "s-0", 3.0, 4.0),
        ("aicpu", "aicpu_tiling.plan", "s-0", 0.0, 1.0),
        ("aicore", "aicpu_tiling.attention", "s-0", 1.0, 2.0),
        ("aicore", "aicpu_tiling.combine", "s-0", 2.0, 3.0),
    ]
    tasks = device_tasks_of_step(7, records)
    assert [t.name for t in tasks] == ["aicpu_tiling.plan", "attention layer 0",
                                       "aicpu_tiling.combine", "attention layer 1"]  # fmt: skip
    assert {proc.task_group(t) for t in tasks} == {"aicpu tiling", "attention layer 0",
                                                   "combine", "attention layer 1"}  # fmt: skip
    assert all(t.step == 7 for t in tasks)


def test_every_bench_and_profile_title_says_whose_times_they_are():
    """issue 32: a CPU-backend or twin figure says so in every table title (rendered, so a
    note that rich would read as markup is caught)."""
    from rich.table import Table

    from pyruntime.profiler.renderers import render_text
    from pyruntime.profiler.renderers.bench_tables import bench_table
    from pyruntime.profiler.renderers.profile_tables import profile_tables
    from pyruntime.profiler.report import profile_report

    from .test_golden import bench_result

    for backend, note in (("cpu", "emulated, CPU backend"), ("npu-twin", "emulated, NPU twin")):
        result = bench_result()
        result["config"]["backend"] = backend
        session = synthetic_session()
        session.meta["backend"] = backend
        for items in (bench_table(result), profile_tables(profile_report(session))):
            tables = [t for t in items if isinstance(t, Table)]
            assert tables
            for table in tables:
                lines = render_text([table], width=400).splitlines()
                # the title, wrapped to the table's width: every line above its top border
                title = " ".join(line.strip() for line in
                                 lines[:next(i for i, x in enumerate(lines) if x[:1] == "┏")])
                assert title.endswith(f"{note})"), title


def test_backend_npu_without_torch_npu_is_one_line_before_any_work(cli, tmp_path):
    """issue 32: --backend npu on a machine without torch_npu says so in one line, exit 2,
    and writes nothing; --load records nothing, so --backend with it is refused."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    for argv in (("profile", "--quick", "--backend", "npu", "--trace", str(tmp_path / "t.json")),
                 ("bench", "--backend", "npu", "--layers", "1", "--batch-sizes", "1",
                  "--steps", "2", "--no-save")):
        code, out, err = cli(*argv)
        assert code == 2 and "needs torch_npu" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.json").exists()
    code, _, err = cli("profile", "--load", str(tmp_path / "s.json"), "--backend", "cpu")
    assert code == 2 and "--backend" in err
