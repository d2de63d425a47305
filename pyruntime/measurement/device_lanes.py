"""Device lanes on the NPU backend: the measured steps run under torch_npu's own profiler,
whose parsed output (`pyruntime.profiler.ascend_files`) becomes each step's `DeviceTask`
records, on the host's ``perf_counter`` clock.

Our use of the API (torch_npu 2.10.0.post4 ``torch_npu/profiler/profiler.py`` and the Ascend
PyTorch Profiler user guide, Ascend/pytorch
``docs/en/ascend_pytorch_profiler/ascend_pytorch_profiler_user_guide.md``, "Profile and Parse
Performance Data (torch_npu.profiler.profile)", example 2): ``profile(activities=[CPU, NPU],
on_trace_ready=tensorboard_trace_handler(dir), experimental_config=_ExperimentalConfig(
export_type=Text, profiler_level=Level0, aic_metrics=AiCoreNone))``, ``start()`` before the
first measured step and ``stop()`` after the last (no schedule: every step between them is
recorded; at ``stop()`` the handler parses synchronously, ``async_mode=False``). Level0 with
no AI Core metrics is the least the profiler collects that still writes kernel_details.csv.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from ..profiler.ascend_files import ClockAnchor, StepWindow, attribute, read_output
from ..profiler.data import DeviceTask


class TorchNpuLanes:
    """Record the device's tasks with ``torch_npu.profiler`` and attribute them to steps.

    Example::

        lanes = TorchNpuLanes()
        lanes.start()
        ...; lanes.window("host_update", 0, t_start, t_end)   # per measured step
        tasks, info = lanes.stop()   # {"host_update": [DeviceTask, ...]}, what was read

    Args:
        keep_dir: leave torch_npu's output folder here (default: a temporary folder,
            removed after parsing).
    """

    def __init__(self, keep_dir: str | Path | None = None) -> None:
        self.keep_dir = Path(keep_dir) if keep_dir is not None else None
        self.windows: list[StepWindow] = []
        self._dir: Path | None = None
        self._prof = None
        self._anchor: ClockAnchor | None = None

    def start(self) -> None:
        """Start torch_npu's profiler (imports torch_npu: the NPU backend already did)."""
        import torch_npu

        profiler = torch_npu.profiler
        self._dir = self.keep_dir or Path(tempfile.mkdtemp(prefix="aicpu-tiling-npu-prof-"))
        self._dir.mkdir(parents=True, exist_ok=True)
        config = profiler._ExperimentalConfig(export_type=profiler.ExportType.Text,
                                              profiler_level=profiler.ProfilerLevel.Level0,
                                              aic_metrics=profiler.AiCMetrics.AiCoreNone)
        self._prof = profiler.profile(
            activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.NPU],
            on_trace_ready=profiler.tensorboard_trace_handler(str(self._dir)),
            experimental_config=config)
        # both clocks read back to back: the profiler's times are wall-clock us
        self._anchor = ClockAnchor(time.time_ns(), time.perf_counter())
        self._prof.start()

    def window(self, key: str, step: int, start: float, end: float) -> None:
        """Step `step` of run `key` ran from `start` to `end` (perf_counter seconds), its
        device work included (the caller waited for it)."""
        self.windows.append(StepWindow(key, step, start, end))

    def stop(self) -> tuple[dict[str, list[DeviceTask]], dict]:
        """Stop the profiler (it parses), read its files, attribute the tasks.

        Returns:
            ``({run key: tasks}, info)``; info: the files read, kernel rows, rows outside every
            step, op_statistic's counts per (op type, core type).

        Raises:
            pyruntime.profiler.ascend_files.AscendProfileError: no or malformed output.
        """
        assert self._prof is not None and self._dir is not None and self._anchor is not None
        self._prof.stop()
        try:
            output = read_output(self._dir)
            tasks, outside = attribute(output.kernels, self.windows, self._anchor)
        finally:
            if self.keep_dir is None:
                shutil.rmtree(self._dir, ignore_errors=True)
        info = {"source": "torch_npu.profiler: ASCEND_PROFILER_OUTPUT/kernel_details.csv, "
                          "op_statistic.csv",
                "folder": str(output.folder) if self.keep_dir is not None else None,
                "kernel_rows": len(output.kernels), "rows_outside_steps": outside,
                "op_statistic": {f"{t} ({c})": n for (t, c), n in output.op_counts.items()}}
        return tasks, info
