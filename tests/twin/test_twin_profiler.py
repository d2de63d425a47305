"""torch_npu's profiler on the twin (issue 32): its API against the torch_npu 2.10.0.post4
wheel's Python sources, our use of it (`pyruntime.measurement.device_lanes`) against the
same, the files it writes, and ``profile`` / ``bench`` / the parse end to end on
``--backend npu-twin`` (each in its own process: the twin activates once per process)."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyruntime.npu_twin import profiler as twin_profiler
from pyruntime.npu_twin import tensor_layer
from tests.perfetto_json import import_problems
from tests.wheels import TORCH_NPU_WHEEL, read_wheel_file

REPO = Path(__file__).resolve().parents[2]


def _wheel_source(path: str) -> ast.Module:
    return ast.parse(read_wheel_file(TORCH_NPU_WHEEL, path).decode())


def _function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    scope: list = tree.body
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        node = next(n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef))
                    and n.name == part)
        if i == len(parts) - 1:
            return node
        scope = node.body
    raise AssertionError(qualname)


def _params(fn: ast.FunctionDef) -> list[str]:
    args = fn.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
            if a.arg != "self"]


def _ours(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


@pytest.mark.parametrize(("wheel_file", "qualname", "ours"), [
    ("torch_npu/profiler/profiler.py", "profile.__init__", twin_profiler.profile.__init__),
    ("torch_npu/profiler/profiler.py", "tensorboard_trace_handler",
     twin_profiler.tensorboard_trace_handler),
    ("torch_npu/profiler/experimental_config.py", "_ExperimentalConfig.__init__",
     twin_profiler._ExperimentalConfig.__init__),
])
def test_the_twins_signatures_are_the_wheels(wheel_file, qualname, ours):
    assert _ours(ours) == _params(_function(_wheel_source(wheel_file), qualname))


def _constants() -> dict[str, str]:
    tree = _wheel_source("torch_npu/profiler/analysis/prof_common_func/_constant.py")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Constant")
    return {t.id: n.value.value for n in cls.body if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}


def _class_attributes(wheel_file: str, cls: str) -> dict[str, str]:
    """``{name: Constant attribute}`` of a wheel class whose attributes are ``Constant.X``."""
    tree = _wheel_source(wheel_file)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    constants = _constants()
    return {t.id: constants[n.value.attr] for n in node.body if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Attribute) for t in n.targets}


def test_the_twins_config_values_are_the_wheels():
    config = "torch_npu/profiler/experimental_config.py"
    for cls in ("ProfilerLevel", "AiCMetrics", "ExportType"):
        wheel = _class_attributes(config, cls)
        ours = {k: v for k, v in vars(getattr(twin_profiler, cls)).items()
                if not k.startswith("_")}
        assert ours and all(wheel[k] == v for k, v in ours.items()), cls
    assert twin_profiler.OUTPUT_DIR == _constants()["OUTPUT_DIR"]


def test_the_wheel_exports_every_name_the_twin_module_has():
    tree = _wheel_source("torch_npu/profiler/__init__.py")
    exported = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
    module = twin_profiler.build()
    assert {n for n in vars(module) if not n.startswith("__")} <= set(exported)


def test_our_use_of_the_profiler_is_the_wheels_api():
    """Every keyword `TorchNpuLanes` passes exists in the wheel's signatures, and every
    ``profiler.X.Y`` constant it names is a class attribute there."""
    source = ast.parse((REPO / "pyruntime/measurement/device_lanes.py").read_text())
    wheel = {"profile": _params(_function(_wheel_source("torch_npu/profiler/profiler.py"),
                                          "profile.__init__")),
             "tensorboard_trace_handler": _params(_function(
                 _wheel_source("torch_npu/profiler/profiler.py"), "tensorboard_trace_handler")),
             "_ExperimentalConfig": _params(_function(
                 _wheel_source("torch_npu/profiler/experimental_config.py"),
                 "_ExperimentalConfig.__init__"))}
    calls = [n for n in ast.walk(source) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr in wheel]
    assert {c.func.attr for c in calls} == set(wheel)
    for call in calls:
        assert {k.arg for k in call.keywords} <= set(wheel[call.func.attr]), call.func.attr
    config = "torch_npu/profiler/experimental_config.py"
    named = {(n.value.attr, n.attr) for n in ast.walk(source) if isinstance(n, ast.Attribute)
             and isinstance(n.value, ast.Attribute)
             and n.value.attr in ("ProfilerLevel", "AiCMetrics", "ExportType")}
    assert named
    for cls, attr in named:
        assert attr in _class_attributes(config, cls), (cls, attr)


def _twin_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), AICPU_TILING_TWIN_STATE=str(tmp_path / "twin"))
    env.pop("AICPU_TILING_TWIN_AICORE", None)
    return env


def test_the_twins_profiler_writes_the_documented_files(tmp_path):
    script = f"""
from pyruntime import npu_twin
npu_twin.activate()
import torch, torch_npu
from pyruntime.npu_twin.npu_module import NotInTwinError
p = torch_npu.profiler
x = torch.zeros(4, device="npu")
torch.npu.synchronize()
x.add_(1)   # queued before the profile: runs inside it only if nothing synchronizes first
torch.npu.synchronize()
prof = p.profile(activities=[p.ProfilerActivity.CPU, p.ProfilerActivity.NPU],
                 on_trace_ready=p.tensorboard_trace_handler({str(tmp_path / 'out')!r}))
prof.start()
x.mul_(2)
torch.npu.synchronize()
prof.stop()
x.add_(1)
torch.npu.synchronize()
for bad in (lambda: p.profile(schedule=lambda step: None),
            lambda: p._ExperimentalConfig(export_type="db")):
    try:
        bad()
    except NotInTwinError:
        print("refused")
"""
    out = subprocess.run([sys.executable, "-c", script], env=_twin_env(tmp_path), cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["refused", "refused"]
    from pyruntime.profiler.ascend_files import read_output

    profile = read_output(tmp_path / "out")
    # only the task that ran between start and stop: the multiply, named as the device queue
    # saw it (on plain tensors torch's structured in-place kernel issues mul.out into x)
    task, op_type = {"plain": ("aten.mul.out", "mul"),
                     "wrapper": ("aten.mul_.Tensor", "mul_")}[tensor_layer()]
    assert [(r.name, r.core) for r in profile.kernels] == [(task, "AI_VECTOR_CORE")]
    assert profile.op_counts == {(op_type, "AI_VECTOR_CORE"): 1}
    trace = json.loads((profile.folder / "trace_view.json").read_text())
    assert [e["args"]["Task Type"] for e in trace if e["ph"] == "X"] == ["AI_VECTOR_CORE"]


def _cli(tmp_path: Path, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyruntime.cli", *argv], env=_twin_env(tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          check=False)


def _check_trace(trace: dict) -> dict[int, dict]:
    """The Chrome trace's structure (Trace Event Format): metadata and complete events with
    numeric times; returns per process its name and lanes."""
    processes: dict[int, dict] = {}
    for e in trace["traceEvents"]:
        assert e["ph"] in ("M", "X") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        p = processes.setdefault(e["pid"], {"name": None, "lanes": {}, "slices": 0})
        if e["ph"] == "M":
            if e["name"] == "process_name":
                p["name"] = e["args"]["name"]
            else:
                assert e["name"] == "thread_name"
                p["lanes"][e["tid"]] = e["args"]["name"]
        else:
            assert isinstance(e["ts"], float | int) and e["ts"] >= 0
            assert isinstance(e["dur"], float | int) and e["dur"] >= 0
            assert e["tid"] in p["lanes"], "a slice on a lane with no name"
            p["slices"] += 1
    return processes


def test_profile_on_the_twin_has_both_paths_device_lanes_and_tables(tmp_path):
    out = _cli(tmp_path, "profile", "--backend", "npu-twin", "--quick", "--trace", "t.json",
               "--save", "s.json", "--json", "--no-progress")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["backend"] == "npu-twin" and report["times_emulated"] is True
    assert "emulated" in report["times"]
    lanes = report["meta"]["device_lanes"]
    assert lanes["rows_outside_steps"] == 0 and lanes["kernel_rows"] > 0
    runs = {r["mode"]: r for r in report["runs"]}
    layers, steps = 8, 4  # --quick
    hu, dt = runs["host_update"], runs["device_tiling"]
    # host_update: FIA per layer, no AI-CPU task; its per-layer task updates on the host lane
    assert sum(v["count"] for k, v in hu["device"].items() if k.startswith("attention")) \
        == layers * steps
    assert "aicpu tiling" not in hu["device"] and hu["host"]["task_updates"]["p50"] > 0
    # device tiling: one AI-CPU task, every layer's attention and combine, per step
    assert dt["device"]["aicpu tiling"]["count"] == steps
    assert dt["device"]["combine"]["count"] == layers * steps
    assert sum(v["count"] for k, v in dt["device"].items() if k.startswith("attention")) \
        == layers * steps
    assert "task_updates" not in dt["host"]
    assert set(dt["device_per_step"]) == {"device_step", "aicpu_task", "attention_layer",
                                          "idle_tiling_to_attention"}
    assert {"p50", "p90", "p99", "mean", "count"} <= set(dt["device_per_step"]["aicpu_task"])
    assert lanes["op_statistic"]["aicpu_tiling_kernel (AI_CPU)"] == steps

    trace = json.loads((tmp_path / "t.json").read_text())
    assert import_problems(trace) == []  # Perfetto's JSON importer keeps every event
    processes = _check_trace(trace)
    by_mode = {p["name"].split(":")[0]: p for p in processes.values()}
    assert set(by_mode) == {"host_update", "device_tiling"}
    assert all("(emulated, NPU twin)" in p["name"] for p in processes.values())
    assert set(by_mode["host_update"]["lanes"].values()) == {"host", "device: AI_CORE"}
    assert set(by_mode["device_tiling"]["lanes"].values()) == {"host", "device: AI_CPU",
                                                               "device: AI_CORE"}
    # the tables of the saved session: every title says the times are the twin's
    shown = _cli(tmp_path, "profile", "--load", "s.json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    titles = [line for line in shown.stdout.splitlines() if "(us;" in line]
    assert len(titles) == 6 and all("emulated, NPU twin" in t for t in titles)
    assert any("device per step" in t for t in titles)
    assert "idle: tiling -> first attention" in shown.stdout


def test_bench_on_the_twin_reports_its_counters_and_says_its_times_are_emulated(tmp_path):
    out = _cli(tmp_path, "bench", "--backend", "npu-twin", "--layers", "2", "--batch-sizes",
               "4", "--sources", "trace", "--steps", "2", "--warmup", "1", "--invariants",
               "--invariant-layers", "1,2", "--no-save", "--json", "--no-progress")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["config"]["backend"] == "npu-twin"
    assert result["config"]["times_emulated"] is True
    modes = result["points"][0]["modes"]
    # the counts judged on the twin: no task update or host tiling on the device path,
    # one per layer on host_update; the invariants hold
    assert modes["device_tiling"]["counters_per_step"]["task_updates"] == 0
    assert modes["device_tiling"]["counters_per_step"]["replays"] == 1
    assert modes["pre_replay"]["counters_per_step"]["launches_aicpu"] == 1
    assert modes["host_update"]["counters_per_step"]["task_updates"] == 2
    assert result["invariants_check"]["holds"] is True
