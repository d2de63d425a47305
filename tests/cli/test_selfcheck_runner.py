"""``aicpu-tiling selfcheck`` as a runner: --checks, --twin-fault, the JSON on disk after every
check, checks in child processes (a crash, a timeout), the placement-saving rule, hints.

The child-process machinery is what ``--backend npu`` and ``npu-twin`` use; here it runs on
cpu through ``run(..., isolate=True)`` with the probe checks of `selfcheck_probes`.
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from pyruntime import selfcheck
from pyruntime.cli import build_parser
from pyruntime.cli import selfcheck as selfcheck_cli
from pyruntime.profiler.renderers import render_text
from pyruntime.profiler.renderers.selfcheck_table import selfcheck_tables
from pyruntime.selfcheck import child
from pyruntime.selfcheck.report import TASK_QUEUE_HINT, CheckResult, Report

from . import selfcheck_probes as probes

FAULTS = {"no-aicpu-replay": "captured AI-CPU tasks are not re-run at replay",
          "device-lost": "the device dies during the attention checks"}


def run_cli(*argv: str, table=None, isolate=None) -> int:
    """``aicpu-tiling selfcheck ARGV`` with an injected check table (not a CLI flag)."""
    args = build_parser().parse_args(["selfcheck", "--no-progress", *argv])
    args.argv = ["aicpu-tiling", "selfcheck", *argv]
    return selfcheck_cli.run(args, checks_table=table, isolate=isolate)


# ---- usage errors (exit 2) ------------------------------------------------------------------
def test_unknown_check_name_is_a_usage_error_listing_the_valid_names(cli):
    code, out, err = cli("selfcheck", "--checks", "tiling_kernel,aicpu_replay,nope")
    assert code == 2 and out == ""
    assert "unknown check nope" in err
    assert "kernels, tiling_kernel, aicpu_replay, stale_read, attention_correctness" in err


def test_twin_fault_without_the_twin_is_a_usage_error(cli):
    code, _, err = cli("selfcheck", "--backend", "cpu", "--twin-fault", "device-lost")
    assert code == 2 and "--twin-fault needs --backend npu-twin" in err


def test_unknown_twin_fault_is_a_usage_error(cli, monkeypatch):
    monkeypatch.setattr(selfcheck, "twin_faults", lambda: FAULTS)
    code, _, err = cli("selfcheck", "--backend", "npu-twin", "--twin-fault", "melted")
    assert code == 2 and "unknown fault melted" in err and "no-aicpu-replay" in err


def test_help_lists_every_twin_fault_with_its_description_and_the_defaults(monkeypatch, capsys):
    monkeypatch.setattr(selfcheck, "twin_faults", lambda: FAULTS)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["selfcheck", "--help"])
    squeeze = "".join  # argparse wraps lines, at hyphens too ("AI-" / "CPU")
    text = squeeze(capsys.readouterr().out.split())
    for name, what in FAULTS.items():
        assert squeeze(f"{name}: {what}".split()) in text
    assert "(default:600.0)" in text and "npu-twin" in text


def test_plan_keeps_the_standard_order_and_puts_kernels_first():
    assert selfcheck.plan(["aicpu_replay", "tiling_kernel"]) == [
        "kernels", "tiling_kernel", "aicpu_replay"]
    assert selfcheck.plan(None) == [name for name, _ in selfcheck.CHECKS]
    with pytest.raises(selfcheck.UnknownCheckError, match="unknown check x"):
        selfcheck.plan(["x"])


# ---- a partial run --------------------------------------------------------------------------
def test_partial_run_on_cpu_passes_with_exactly_those_checks(cli, tmp_path):
    out = tmp_path / "r.json"
    code, _, _ = cli("selfcheck", "--checks", "kernels,tiling_kernel", "--json", "-o", str(out))
    data = json.loads(out.read_text())
    assert code == 0 and data["verdict"] == "pass"
    assert [c["name"] for c in data["checks"]] == ["kernels", "tiling_kernel"]
    assert data["checks_planned"] == ["kernels", "tiling_kernel"]
    assert data["placement"] is None and data["placement_saved"] is False
    assert "TASK_QUEUE_ENABLE" in data["environment"]


# ---- the JSON on disk after every check -----------------------------------------------------
def test_the_file_names_the_running_check_and_holds_the_finished_ones(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    monkeypatch.setenv(probes.REPORT_ENV, str(out))
    table = [("first", probes.first), ("second", probes.second),
             ("snapshot_report", probes.snapshot_report)]
    assert run_cli("--json", "-o", str(out), table=table) == 0
    seen = json.loads(out.read_text())["checks"][2]["on_disk"]
    assert seen["verdict"] == "incomplete"
    assert seen["checks_planned"] == ["first", "second", "snapshot_report"]
    assert [(c["name"], c["status"]) for c in seen["checks"]] == [
        ("first", "pass"), ("second", "pass"), ("snapshot_report", "running")]


def test_a_run_that_dies_in_its_third_check_leaves_the_first_two_and_names_the_third(
        tmp_path, capsys):
    out = tmp_path / "r.json"
    table = [("first", probes.first), ("second", probes.second), ("exit_now", probes.exit_now),
             ("never", probes.second)]
    with pytest.raises(SystemExit):  # in process: the selfcheck itself ends here
        run_cli("-o", str(out), table=table, isolate=False)
    data = json.loads(out.read_text())
    assert data["verdict"] == "incomplete"
    assert [(c["name"], c["status"]) for c in data["checks"]] == [
        ("first", "pass"), ("second", "pass"), ("exit_now", "running")]
    assert "never" in data["checks_planned"]
    assert not list(tmp_path.glob(".*.tmp"))  # written through a rename, nothing left over


# ---- checks in child processes --------------------------------------------------------------
def test_a_child_that_dies_is_a_fail_naming_its_status_and_output_and_the_run_goes_on(
        tmp_path, capsys):
    out = tmp_path / "r.json"
    table = [("first", probes.first), ("crash", probes.crash), ("second", probes.second)]
    code = run_cli("--json", "-o", str(out), table=table, isolate=True)
    data = json.loads(out.read_text())
    assert code == 1 and data["verdict"] == "fail"
    first, crashed, second = data["checks"]
    assert first["status"] == "pass"
    assert crashed["status"] == "fail" and crashed["child_exit"] == 3
    assert "exited with status 3 without a result" in crashed["detail"]
    assert "probe: the device went away" in crashed["detail"]
    # what the first child found reached the third, in yet another process
    assert second["status"] == "pass" and second["seen_placement"] == "pre-replay"
    assert data["placement"] == "pre-replay"
    assert json.loads(capsys.readouterr().out)["checks"] == data["checks"]


def test_a_child_past_its_timeout_is_killed_and_reported_as_a_fail(tmp_path):
    ctx = selfcheck.make_context("cpu", quick=True)
    result, env = child.run_in_child("hang", probes.hang, ctx, timeout_s=3.0, workdir=tmp_path)
    assert result.status == "fail" and env is None
    assert result.detail.startswith("timed out after 3 s (--check-timeout)")
    assert "probe: waiting on the device" in result.detail
    assert result.data["timed_out"] is True and 3.0 <= result.seconds < 30


def test_a_nested_function_cannot_be_sent_to_a_child():
    def local(ctx):
        return None

    with pytest.raises(ValueError, match="module-level"):
        child.check_reference(local)


def test_child_activates_the_twin_before_anything_and_keeps_the_npu_code_path(
        tmp_path, monkeypatch):
    """In process, with a stand-in for `pyruntime.npu_twin`: the plumbing only (the real twin
    runs the same child in tests/twin/test_selfcheck_twin.py)."""
    import torch

    monkeypatch.delenv("AICPU_TILING_TWIN_AICORE", raising=False)  # the child sets it

    calls = []
    fake_npu = types.SimpleNamespace(
        get_device_name=lambda: "Ascend910B3-twin", current_device=lambda: 0,
        get_device_properties=lambda i: types.SimpleNamespace(cube_core_num=20,
                                                              vector_core_num=40))

    def activate(fault=None):
        calls.append(("activate", fault))
        monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
        monkeypatch.setattr(torch, "npu", fake_npu, raising=False)

    twin = types.ModuleType("pyruntime.npu_twin")
    twin.FAULTS, twin.activate = FAULTS, activate
    twin.AICORE_ENV = "AICPU_TILING_TWIN_AICORE"
    monkeypatch.setitem(sys.modules, "pyruntime.npu_twin", twin)
    import pyruntime  # `from pyruntime import npu_twin` reads the package attribute first

    monkeypatch.setattr(pyruntime, "npu_twin", twin, raising=False)
    request = {"check": "second", "function": child.check_reference(probes.second),
               "backend": "npu-twin", "twin_fault": "device-lost", "quick": True,
               "build": False, "carried": {"placement": "graph", "kernels_ready": False},
               "preload_kernels": False, "want_environment": True}
    (tmp_path / "req.json").write_text(json.dumps(request))
    assert child.main([str(tmp_path / "req.json"), str(tmp_path / "res.json")]) == 0
    outcome = json.loads((tmp_path / "res.json").read_text())
    assert calls == [("activate", "device-lost")]
    assert outcome["result"]["status"] == "pass"
    assert outcome["result"]["seen_backend"] == "npu"  # the bodies take the NPU path
    assert outcome["result"]["seen_placement"] == "graph"
    assert outcome["environment"]["device"] == {
        "soc": "Ascend910B3-twin", "ai_cores": 20, "vector_cores": 40, "aicpu_cores": None,
        "aicpu_reason": "torch_npu exposes no AI-CPU count (npu-smi info -t aicpu shows it)"}


# ---- the placement-saving rule --------------------------------------------------------------
def _report(backend: str, placement: str | None, **statuses: str) -> Report:
    return Report(backend, placement, {}, [CheckResult(n, s, "d") for n, s in statuses.items()])


@pytest.mark.parametrize(("backend", "placement", "statuses", "saved"), [
    ("npu", "graph", {"kernels": "pass", "tiling_kernel": "pass", "aicpu_replay": "pass"},
     "graph"),
    # later checks test attention on the placement, not the placement
    ("npu", "pre-replay", {"tiling_kernel": "pass", "aicpu_replay": "pass",
                           "host_time": "fail"}, "pre-replay"),
    ("npu", "graph", {"tiling_kernel": "fail", "aicpu_replay": "pass"}, None),
    ("npu", "graph", {"tiling_kernel": "pass", "aicpu_replay": "fail"}, None),
    ("npu", "graph", {"tiling_kernel": "skip", "aicpu_replay": "pass"}, None),
    ("npu", "graph", {"kernels": "pass", "aicpu_replay": "pass"}, None),  # tiling not run
    ("npu", None, {"tiling_kernel": "pass", "aicpu_replay": "pass"}, None),
    ("npu-twin", "graph", {"tiling_kernel": "pass", "aicpu_replay": "pass"}, None),
    ("cpu", "graph", {"tiling_kernel": "pass", "aicpu_replay": "pass"}, None),
])
def test_placement_is_saved_only_from_an_npu_when_both_placement_checks_passed(
        backend, placement, statuses, saved):
    value, why = selfcheck.placement_to_save(_report(backend, placement, **statuses))
    assert value == saved and why


# ---- TASK_QUEUE_ENABLE=2 --------------------------------------------------------------------
def test_a_refused_capture_gives_one_line_saying_what_to_set(monkeypatch):
    refusal = ("the replay probe could not run: Do not support TASK_QUEUE_ENABLE = 2 during "
               "NPU graph capture")
    checks = [CheckResult("aicpu_replay", "fail", refusal),
              CheckResult("attention_correctness", "fail", "raised: " + refusal)]
    data = Report("npu-twin", None, {"TASK_QUEUE_ENABLE": "2"}, checks).as_dict()
    assert data["hints"] == [TASK_QUEUE_HINT]
    text = render_text(selfcheck_tables(data))
    assert text.count("hint:") == 1 and "TASK_QUEUE_ENABLE=1 (or 0)" in " ".join(text.split())
    ok = Report("npu", None, {}, [CheckResult("aicpu_replay", "fail", "other")]).as_dict()
    assert ok["hints"] == []


def test_environment_reports_task_queue_enable(monkeypatch):
    from pyruntime.selfcheck.environment import environment

    monkeypatch.setenv("TASK_QUEUE_ENABLE", "2")
    assert environment("npu-twin")["TASK_QUEUE_ENABLE"] == "2"
    monkeypatch.delenv("TASK_QUEUE_ENABLE")
    env = environment("npu")
    assert env["TASK_QUEUE_ENABLE"] is None and "child processes" in env["device"]["reason"]


@pytest.mark.parametrize(("replay_status", "saved"), [("pass", True), ("fail", False)])
def test_the_cli_saves_the_placement_by_that_rule(tmp_path, monkeypatch, replay_status, saved):
    monkeypatch.setenv("AICPU_TILING_CACHE_DIR", str(tmp_path))
    report = _report("npu", "graph", kernels="pass", tiling_kernel="pass",
                     aicpu_replay=replay_status)
    data = {"environment": {"device": {"soc": "Ascend910B3"}}}
    args = build_parser().parse_args(["selfcheck", "--backend", "npu"])
    selfcheck_cli._save_placement(args, report, data)
    assert data["placement_saved"] is saved
    assert (tmp_path / "placement.json").is_file() is saved
