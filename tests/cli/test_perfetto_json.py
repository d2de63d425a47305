"""The traces we write keep every event under Perfetto's JSON importer (tests/perfetto_json.py,
whose rules are read from google/perfetto's trace processor), and the check itself catches
each thing that importer drops."""

from __future__ import annotations

import json

from pyruntime.profiler.renderers.chrome_trace import write_chrome_trace
from tests.cli.test_profiler import synthetic_session
from tests.perfetto_json import import_problems


def _x(name, ts, dur, tid=0, pid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}


def test_nested_and_disjoint_slices_import_whole():
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "host"}},
        _x("step", 0, 10), _x("inner", 2, 3), _x("inner2", 5, 5), _x("next", 10, 1),
        _x("other lane overlaps freely", 8, 10, tid=1)]}
    assert import_problems(trace) == []


def test_each_dropped_event_is_reported():
    trace = {"traceEvents": [
        _x("parent", 0, 10), _x("escapes its parent", 5, 10),
        {"ph": "X", "name": "no dur", "ts": 0, "pid": 1, "tid": 0},
        {"ph": 7, "name": "numeric phase"},
        _x("negative tid", 0, 1, tid=-1),
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {}}]}
    problems = import_problems(trace)
    assert any("'escapes its parent'" in p and "(us)" in p for p in problems)
    assert any("'no dur'" in p for p in problems)
    assert any("'numeric phase'" in p for p in problems)
    assert any("tid -1" in p for p in problems)
    assert any("without args.name" in p for p in problems)
    assert len(problems) == 6  # the overlap in us and in ns, and the four others
    assert import_problems({}) == ["no traceEvents list"]


def test_an_overlap_made_by_whole_nanoseconds_is_reported():
    # nested in float microseconds ([0.0009, 1.0018) holds [0.5, 1.0015)); as whole
    # nanoseconds the parent is [0, 1000) and the child [500, 1001)
    trace = {"traceEvents": [_x("parent", 0.0009, 1.0009), _x("child", 0.5, 0.5015)]}
    problems = import_problems(trace)
    assert [p.split(":")[0] for p in problems] == ["lane (1, 0) (ns)"]


def test_the_profile_trace_imports_whole(tmp_path):
    path = write_chrome_trace(synthetic_session(), tmp_path / "t.json")
    trace = json.loads(path.read_text())
    assert sum(e["ph"] == "X" for e in trace["traceEvents"]) > 10
    assert import_problems(trace) == []
