"""``aicpu-tiling selfcheck``: JSON schema, exit codes, a forced failure, the rendered table."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyruntime import selfcheck, tiling
from pyruntime.profiler.renderers import render_text
from pyruntime.profiler.renderers.selfcheck_table import selfcheck_tables
from pyruntime.selfcheck.report import CheckResult, Report

REQUIRED = {"tiling_kernel", "aicpu_replay", "attention_correctness", "mla_correctness",
            "attention_triton", "host_time"}


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    """One quick CPU self-check for the whole module (it takes tens of seconds)."""
    from pyruntime.cli import main

    out = tmp_path_factory.mktemp("selfcheck") / "report.json"
    # host_time judges exact per-step counts, not times: no need to run alone (issue 30)
    code = main(["selfcheck", "--backend", "cpu", "--quick", "--json", "-o", str(out)])
    return code, json.loads(out.read_text())


def test_cpu_selfcheck_passes_with_the_schema(cpu_report, capsys):
    code, data = cpu_report
    assert code == 0 and data["verdict"] == "pass"
    assert (data["schema"], data["version"], data["backend"]) == (
        "aicpu-tiling/selfcheck", 1, "cpu")
    assert data["placement"] == "graph"  # the CPU backend re-runs captured AI-CPU tasks
    names = [c["name"] for c in data["checks"]]
    assert REQUIRED <= set(names) and len(names) == len(set(names))
    for check in data["checks"]:
        assert {"name", "status", "detail"} <= set(check)
        assert check["status"] in ("pass", "fail", "skip") and check["detail"]
    by_name = {c["name"]: c for c in data["checks"]}
    assert by_name["attention_fia"]["status"] == "skip"
    assert "needs an Ascend NPU" in by_name["attention_fia"]["detail"]
    # the replay probe told the two emulations apart
    replay = by_name["aicpu_replay"]
    assert replay["placement_found"] == {"True": "graph", "False": "pre-replay"}
    assert replay["ran"]["True"] == replay["replays"] and replay["ran"]["False"] <= 1
    # the replay host cost and the per-layer update cost, for the NPU projection: measured on
    # the backend that ran, marked emulated unless it is an NPU
    cost = replay["replay_host"]
    assert (cost["backend"], cost["emulated"], cost["replays_timed"]) == ("cpu", True, 7)
    assert cost["replay_host_us"] > 0 and "replay host cost" in replay["detail"]
    # host_time is judged by the per-step invariants: the device path's calls at L = 1 and 4
    # are the same, host_update's grow per layer (its task update and host tiling, its three
    # lib calls); times and the flatness figure are reported, not judged
    host = by_name["host_time"]
    assert host["invariants_problems"] == []
    # counted and timed over the whole serving step, as bench does (its headline method),
    # not StaticAttention.step alone: every mode's two input copies and vLLM-Ascend's
    # pre-replay synchronize; the device path with the hook engine's work for K keys
    for mode in ("host_update", "device_tiling"):
        row = host["invariants"][mode]["4"]
        assert (row["copies_h2d"], row["synchronizes"]) == (2, 1), (mode, row)
    assert (host["method"], host["graph_keys"]) == ("symmetric", 35)
    assert host["engine_per_step"]["h2d_copies"] == 0
    device = host["invariants"]["device_tiling"]
    assert device["1"] == device["4"] and device["4"]["task_updates"] == 0
    per_layer = host["host_update_per_layer"]
    assert (per_layer["task_updates"], per_layer["lib_calls"]) == (1, 3)
    assert host["ratio_host_update_over_device"] > 0
    update = host["update_per_layer"]
    assert (update["backend"], update["emulated"], update["layers"]) == ("cpu", True, 61)
    assert update["update_per_layer_us"] > 0 and "(cpu, emulated)" in host["detail"]
    flatness = host["flatness"]
    assert flatness["judged"] is False
    assert flatness["value"] == pytest.approx(flatness["host_us_L61"] / flatness["host_us_L1"])
    assert set(by_name["attention_correctness"]["coverage_steps"]) == {
        "padded", "spec_decode", "chunked_prefill"}
    assert data["environment"]["device"]["soc"] is None
    assert by_name["mla_correctness"]["status"] == "pass"  # registered, after the GQA check
    assert names.index("mla_correctness") == names.index("attention_correctness") + 1


def test_cpu_selfcheck_json_on_stdout(cli, monkeypatch):
    monkeypatch.setattr(selfcheck, "CHECKS", selfcheck.CHECKS[:3])
    code, out, _ = cli("selfcheck", "--json")
    data = json.loads(out)
    assert code == 0 and [c["name"] for c in data["checks"]] == [
        "kernels", "tiling_kernel", "aicpu_replay"]


def test_a_wrong_tiling_gives_a_fail_verdict_and_exit_1(cli, monkeypatch):
    real_plan = tiling.plan

    def corrupted(*args, **kwargs):  # the host build now disagrees with the device
        t = real_plan(*args, **kwargs)
        t.buffer[-1] ^= np.uint8(1)
        return t

    monkeypatch.setattr(selfcheck, "CHECKS", selfcheck.CHECKS[:2])
    monkeypatch.setattr(tiling, "plan", corrupted)
    code, out, _ = cli("selfcheck", "--json")
    data = json.loads(out)
    assert code == 1 and data["verdict"] == "fail"
    bad = data["checks"][1]
    assert bad["name"] == "tiling_kernel" and bad["status"] == "fail"
    assert "differs from the host build" in bad["detail"]


def test_a_check_that_raises_is_a_fail_naming_it(cli, monkeypatch):
    def broken(ctx):
        raise RuntimeError("boom")

    monkeypatch.setattr(selfcheck, "CHECKS", (("kernels", selfcheck.CHECKS[0][1]),
                                              ("broken", broken)))
    code, out, _ = cli("selfcheck", "--no-progress")
    assert code == 1 and "the check raised RuntimeError: boom" in out
    assert "verdict: fail" in out


def test_npu_backend_without_torch_npu_is_a_one_line_error(cli):
    pytest.importorskip("pyruntime.tiling")
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    code, _, err = cli("selfcheck", "--backend", "npu")
    assert code == 2 and "torch_npu" in err and len(err.strip().splitlines()) == 1


def test_verdict_rules():
    def report(*statuses):
        return Report("cpu", None, {}, [CheckResult(f"c{i}", s, "d")
                                        for i, s in enumerate(statuses)])

    assert report("pass", "skip").verdict == "pass"
    assert report("pass", "fail", "skip").verdict == "fail"
    assert report("skip", "skip").verdict == "fail"  # nothing checked is not a pass
    with pytest.raises(ValueError, match="status must be one of"):
        CheckResult("x", "maybe", "d")


def test_rendered_report_fits_80_columns(cpu_report):
    _, data = cpu_report
    text = render_text(selfcheck_tables(data))
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "verdict: pass; placement: graph" in text


def test_rendered_report_golden(golden):
    checks = [CheckResult("tiling_kernel", "pass", "7 cases byte-identical to the host build"),
              CheckResult("aicpu_replay", "pass", "the task echoed the epoch at 1/8 replays: "
                                                  "graph replay does not re-run it, so "
                                                  "placement pre-replay"),
              CheckResult("attention_fia", "skip", "FIA needs an Ascend NPU"),
              CheckResult("host_time", "fail", "device tiling L61/L20 = 1.90")]
    env = {"python": "3.11.7", "torch": "2.13.0", "torch_npu": "2.10.0.post4", "triton": None,
           "cann": {"home": "/usr/local/Ascend", "version": "9.0.0"},
           "device": {"soc": "Ascend910B3", "ai_cores": 20, "aicpu_cores": None}}
    data = Report("npu", "pre-replay", env, checks).as_dict()
    golden("selfcheck.txt", render_text(selfcheck_tables(data)))


def test_a_detail_with_brackets_is_printed_intact():
    """A skip's install hint names the extra in brackets; the table prints it as written."""
    hint = "triton is not installed; pip install 'aicpu-tiling[test]'"
    data = Report("cpu", None, {"python": "3.11"}, [CheckResult("attention_triton", "skip",
                                                                hint)]).as_dict()
    text = " ".join(render_text(selfcheck_tables(data), width=200).split())
    assert "pip install 'aicpu-tiling[test]'" in text
