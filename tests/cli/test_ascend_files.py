"""The reader of torch_npu's profiler output (`pyruntime.profiler.ascend_files`) on a profile
folder built from the documentation (tests/fixtures/ascend_profiler/README.md cites it), and
the per-step device figures made from its tasks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pyruntime.profiler import processors as proc
from pyruntime.profiler.ascend_files import (
    AscendProfileError,
    ClockAnchor,
    KernelRow,
    StepWindow,
    attribute,
    find_output,
    read_kernel_details,
    read_op_statistic,
    read_output,
)
from pyruntime.profiler.data import Run

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ascend_profiler"
T0_US = 1688000000000000.0
#: the wall clock at perf_counter 100.0 s: T0 (a profile whose steps start at perf 100 s)
ANCHOR = ClockAnchor(int(T0_US * 1000), 100.0)


def test_the_documented_folder_is_found_and_read():
    out = read_output(FIXTURE)
    assert out.folder.name == "ASCEND_PROFILER_OUTPUT"
    assert out.folder.parent.name.endswith("_ascend_pt")
    rows = out.kernels
    assert [r.core for r in rows] == ["AI_CORE", "AI_CORE", "AI_CPU", "MIX_AIV", "MIX_AIV",
                                      "AI_VECTOR_CORE", "AI_VECTOR_CORE"]
    assert [r.kind for r in rows] == ["aicore"] * 2 + ["aicpu"] + ["aicore"] * 4
    # the trailing tab of op_summary's times is not part of the number
    assert rows[2] == KernelRow("aicpu_tiling_kernel", "aicpu_tiling_kernel", "AI_CPU",
                                T0_US + 3100, 40.0, "2")
    assert rows[-1].step_id is None  # a kernel outside every marked step: empty Step Id


def test_op_statistic_counts_agree_with_the_kernel_rows():
    out = read_output(FIXTURE)
    per_type: dict = {}
    for r in out.kernels:
        per_type[(r.op_type, r.core)] = per_type.get((r.op_type, r.core), 0) + 1
    assert out.op_counts == per_type


def test_attribution_puts_each_task_in_its_step_on_the_host_clock():
    rows = read_output(FIXTURE).kernels
    windows = [StepWindow("host_update", 0, 100.0, 100.002),
               StepWindow("device_tiling", 0, 100.003, 100.005)]
    tasks, outside = attribute(rows, windows, ANCHOR)
    assert outside == 1  # the ZerosLike at 6000 us
    hu, dt = tasks["host_update"], tasks["device_tiling"]
    assert [t.name for t in hu] == ["attention layer 0", "attention layer 1"]
    assert [t.name for t in dt] == ["aicpu_tiling_kernel", "attention layer 0",
                                    "attention layer 1", "_attention_combine_kernel"]
    assert dt[0].start == pytest.approx(100.0031, abs=1e-9)
    assert dt[0].seconds == pytest.approx(40e-6, abs=1e-9)
    assert {t.lane for t in dt} == {"AI_CPU", "MIX_AIV", "AI_VECTOR_CORE"}
    stats = proc.device_step_stats(Run("device_tiling", {}, device_tasks=dt))
    assert stats["aicpu_task"]["p50"] == pytest.approx(40.0, abs=1e-3)
    assert stats["idle_tiling_to_attention"]["p50"] == pytest.approx(20.0, abs=1e-3)
    assert stats["device_step"]["p50"] == pytest.approx(520.0, abs=1e-3)  # 3100 -> 3620
    assert stats["attention_layer"]["count"] == 2
    groups = proc.device_summary(Run("device_tiling", {}, device_tasks=dt))
    assert list(groups) == ["aicpu tiling", "attention layer 0", "attention layer 1",
                            "combine"]
    hu_stats = proc.device_step_stats(Run("host_update", {}, device_tasks=hu))
    assert "aicpu_task" not in hu_stats and "idle_tiling_to_attention" not in hu_stats


def test_a_task_before_every_step_or_between_steps_is_outside():
    rows = [KernelRow("x_attention", "x", "AI_CORE", T0_US - 10, 1.0),
            KernelRow("x_attention", "x", "AI_CORE", T0_US + 2500, 1.0)]
    tasks, outside = attribute(rows, [StepWindow("a", 0, 100.0, 100.002),
                                      StepWindow("a", 1, 100.003, 100.004)], ANCHOR)
    assert outside == 2 and tasks == {"a": []}


def test_the_mla_decode_kernel_is_an_attention_layer_and_mla_prolog_is_not():
    """The hook's MLA layers run `pyruntime.kernels.triton_mla`'s ``mla_decode_kernel`` (its
    name does not say attention); vLLM-Ascend's ``MlaProlog`` (``npu_mla_prolog``) is the
    projection before attention, and the combine stays the combine."""
    rows = [KernelRow("aicpu_tiling_kernel", "aicpu_tiling_kernel", "AI_CPU", T0_US + 100, 1.0),
            KernelRow("MlaProlog", "MlaProlog", "AI_CORE", T0_US + 200, 1.0),
            KernelRow("mla_decode_kernel", "mla_decode_kernel", "AI_CORE", T0_US + 300, 1.0),
            KernelRow("attention_combine_kernel", "attention_combine_kernel", "AI_CORE",
                      T0_US + 400, 1.0),
            KernelRow("mla_decode_kernel", "mla_decode_kernel", "AI_CORE", T0_US + 500, 1.0)]
    tasks, outside = attribute(rows, [StepWindow("a", 0, 100.0, 100.002)], ANCHOR)
    assert outside == 0
    assert [t.name for t in tasks["a"]] == ["aicpu_tiling_kernel", "MlaProlog",
                                            "attention layer 0", "attention_combine_kernel",
                                            "attention layer 1"]


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "prof")
    return next((tmp_path / "prof").glob("*_ascend_pt/ASCEND_PROFILER_OUTPUT"))


def test_a_missing_documented_column_is_named(tmp_path):
    out = _copy(tmp_path)
    path = out / "kernel_details.csv"
    path.write_text(path.read_text().replace("Accelerator Core", "Core", 1))
    with pytest.raises(AscendProfileError, match="missing column.*Accelerator Core"):
        read_kernel_details(path)


def test_a_time_that_is_not_a_number_names_the_line(tmp_path):
    out = _copy(tmp_path)
    path = out / "kernel_details.csv"
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace("1688000000003100.000", "N/A")
    path.write_text("".join(lines))
    with pytest.raises(AscendProfileError, match=r"line 4: Start Time\(us\) is not a number"):
        read_kernel_details(path)


def test_a_count_that_is_not_whole_is_refused(tmp_path):
    out = _copy(tmp_path)
    path = out / "op_statistic.csv"
    path.write_text(path.read_text().replace(",AI_CPU,1,", ",AI_CPU,1.5,", 1))
    with pytest.raises(AscendProfileError, match="Count is not a whole number"):
        read_op_statistic(path)


def test_no_profile_or_two_profiles_are_refused(tmp_path):
    with pytest.raises(AscendProfileError, match="no \\*_ascend_pt"):
        find_output(tmp_path)
    _copy(tmp_path)
    shutil.copytree(tmp_path / "prof" / "localhost.localdomain_139247_20230628101435_ascend_pt",
                    tmp_path / "prof" / "other_1_20230628101436_ascend_pt")
    with pytest.raises(AscendProfileError, match="2 profiles"):
        find_output(tmp_path / "prof")


def test_a_profile_without_kernel_details_says_what_to_check(tmp_path):
    out = _copy(tmp_path)
    (out / "kernel_details.csv").unlink()
    with pytest.raises(AscendProfileError, match="ProfilerActivity.NPU"):
        read_output(tmp_path / "prof")
