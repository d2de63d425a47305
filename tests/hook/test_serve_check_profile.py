"""``serve-check --profile DIR`` without an engine (issue 32, item 4): the child's side (engine
steps and task updates on the host clock, torch_npu's kernel_details.csv attributed to the
steps: `engine_check.profiled_run`) on the documented profiler fixture
(tests/fixtures/ascend_profiler/README.md), the parent's side (`engine_check.write_profiles`:
per run and side by side, the trace and tables ``profile --trace`` writes), the report's
``profile`` field, and the command line's refusals before any work. The engine run itself is
tests/hook/test_engine_check.py::test_serve_check_profile_on_the_twin (``-m engine``)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import pytest

from pyruntime.cli import main, serve_check
from pyruntime.hook.dryrun import engine_check
from pyruntime.hook.dryrun.engine_check import EngineRun, HostTimeline
from pyruntime.profiler.ascend_files import ClockAnchor, StepWindow, attribute, read_output
from tests.perfetto_json import import_problems

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ascend_profiler"
#: the fixture's times are microseconds after T0 on the wall clock; perf_counter 100 s is T0
ANCHOR = ClockAnchor(1688000000000000 * 1000, 100.0)
US = 1e-6
#: the fixture's step 1 (two FIA layers, 100-760 us) is the unhooked run's engine step, with
#: two task updates before the kernels; its step 2 (AI-CPU tiling, two attention kernels, the
#: combine, 3100-3620 us) the hooked run's, with none
STEPS = {False: (100.0 + 50 * US, 100.0 + 800 * US), True: (100.0 + 3000 * US,
                                                           100.0 + 3700 * US)}
UPDATES = {False: [(100.0 + 60 * US, 100.0 + 70 * US), (100.0 + 80 * US, 100.0 + 95 * US)],
           True: []}


def profiled_engine_run(hooked: bool) -> EngineRun:
    """An `EngineRun` whose profile is what the child makes of the fixture for its step."""
    mode = engine_check.PROFILE_RUNS[hooked][1]
    host = HostTimeline(steps=[STEPS[hooked]], updates=list(UPDATES[hooked]))
    windows = [StepWindow(mode, 0, *STEPS[hooked])]
    tasks, outside = attribute(read_output(FIXTURE).kernels, windows, ANCHOR)
    run = engine_check.profiled_run(mode, {"name": "qwen3 serve-check"}, host, tasks[mode])
    return EngineRun(hooked=hooked, backend="npu-twin",
                     profile={"run": asdict(run), "lanes": {"rows_outside_steps": outside}})


def test_the_child_makes_one_host_step_per_engine_step_with_its_updates_and_kernels():
    without = engine_check.profiled_run(
        "without_hook", {}, HostTimeline([STEPS[False]], UPDATES[False]),
        attribute(read_output(FIXTURE).kernels,
                  [StepWindow("k", 0, *STEPS[False])], ANCHOR)[0]["k"])
    (step,) = without.steps
    assert [name for name, _, _ in step.spans] == ["task_updates", "task_updates"]
    assert step.phases["task_updates"] == pytest.approx(25 * US)
    assert step.phases["other"] == pytest.approx(750 * US - 25 * US)
    assert [t.name for t in without.device_tasks] == ["attention layer 0", "attention layer 1"]
    assert without.counters == {"graph_task_updates": 2.0}


def test_the_profile_folder_holds_both_runs_and_the_side_by_side_trace(tmp_path):
    without, with_ = profiled_engine_run(False), profiled_engine_run(True)
    profile = engine_check.write_profiles(tmp_path, "qwen3", without, with_)
    assert profile["dir"] == str(tmp_path)
    for folder in ("", "without/", "with/"):
        for name in ("trace.json", "tables.txt", "profile.json"):
            assert f"{folder}{name}" in profile["files"]
            assert (tmp_path / folder / name).is_file()

    trace = json.loads((tmp_path / "trace.json").read_text())
    assert import_problems(trace) == []  # Perfetto's JSON importer keeps every event
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {1: "without_hook: qwen3 serve-check (emulated, NPU twin)",
                         2: "with_hook: qwen3 serve-check (emulated, NPU twin)"}
    slices = Counter((processes[e["pid"]].split(":")[0], names[(e["pid"], e["tid"])], e["name"])
                     for e in trace["traceEvents"] if e["ph"] == "X")
    assert slices == Counter({
        ("without_hook", "host", "step 0"): 1, ("without_hook", "host", "task_updates"): 2,
        ("without_hook", "device: AI_CORE", "attention layer 0"): 1,
        ("without_hook", "device: AI_CORE", "attention layer 1"): 1,
        ("with_hook", "host", "step 0"): 1,
        ("with_hook", "device: AI_CPU", "aicpu_tiling_kernel"): 1,
        ("with_hook", "device: MIX_AIV", "attention layer 0"): 1,
        ("with_hook", "device: MIX_AIV", "attention layer 1"): 1,
        ("with_hook", "device: AI_VECTOR_CORE", "_attention_combine_kernel"): 1})
    # side by side: each run starts at 0 though they ran 2.95 ms apart on the host clock
    first = {pid: min(e["ts"] for e in trace["traceEvents"]
                      if e["ph"] == "X" and e["pid"] == pid) for pid in processes}
    assert first == {1: 0.0, 2: 0.0}
    assert trace["otherData"]["generator"] == "aicpu-tiling serve-check --profile"
    assert trace["otherData"]["backend"] == "npu-twin"
    assert trace["otherData"]["times"].startswith("emulated")

    # the per-run trace keeps that run's own lanes only
    alone = json.loads((tmp_path / "with" / "trace.json").read_text())
    assert {e["args"]["name"] for e in alone["traceEvents"] if e["name"] == "process_name"} \
        == {"with_hook: qwen3 serve-check (emulated, NPU twin)"}

    report = json.loads((tmp_path / "profile.json").read_text())
    assert report["backend"] == "npu-twin" and report["times_emulated"] is True
    per_step = {r["mode"]: r["device_per_step"] for r in report["runs"]}
    assert "aicpu_task" not in per_step["without_hook"]
    # the fixture's AI-CPU task lasts 40 us; the first attention kernel starts 20 us after it
    assert per_step["with_hook"]["aicpu_task"]["p50"] == pytest.approx(40.0)
    assert per_step["with_hook"]["idle_tiling_to_attention"]["p50"] == pytest.approx(20.0)
    assert per_step["with_hook"]["attention_layer"]["count"] == 2

    tables = " ".join((tmp_path / "tables.txt").read_text().split())  # titles wrap
    for title in ("without_hook: host time per step (us; emulated, NPU twin)",
                  "with_hook: device per step (us; emulated, NPU twin)",
                  "AI-CPU tiling task", "idle: tiling -> first attention"):
        assert title in tables


def test_the_report_says_where_the_profile_is_or_null():
    from tests.hook.test_serve_check import engine_run

    plain = engine_check.build_report("qwen3", 1, False, None, engine_run(False),
                                      engine_run(True), None)
    assert plain["profile"] is None
    files = {"dir": "/p", "files": ["trace.json"]}
    report = engine_check.build_report("qwen3", 1, False, None, engine_run(False),
                                       engine_run(True), None, None, files)
    assert report["profile"] == files and report["verdict"] == "pass"
    assert "profile: /p (1 files" in serve_check.render(report)


def test_a_run_without_its_profile_is_a_typed_error(tmp_path):
    with pytest.raises(engine_check.EngineCheckError, match="hooked engine run came back "
                                                            "without its profile"):
        engine_check.write_profiles(tmp_path, "qwen3", profiled_engine_run(False),
                                    EngineRun(hooked=True, backend="npu-twin"))


def test_a_non_empty_profile_folder_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    (tmp_path / "keep.txt").write_text("mine")
    (tmp_path / "trace.json").write_text("old")
    monkeypatch.setattr(engine_check, "check",
                        lambda *a, **k: pytest.fail("the engine started"))
    assert main(["serve-check", "--tiny", "qwen3", "--profile", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--profile {tmp_path}: the folder is not empty" in err and "--force" in err
    assert (tmp_path / "trace.json").read_text() == "old"
    assert main(["serve-check", "--tiny", "qwen3", "--profile",
                 str(tmp_path / "keep.txt")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["serve-check", "--tiny", "qwen3", "--profile",
                 str(tmp_path / "no" / "such")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_force_clears_only_what_serve_check_wrote(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    (tmp_path / "trace.json").write_text("old")
    (tmp_path / "without" / "torch_npu").mkdir(parents=True)
    serve_check.check_profile_dir(tmp_path, force=True)  # accepted, changes nothing
    assert (tmp_path / "without" / "torch_npu").is_dir()
    serve_check.clear_profile_entries(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]
