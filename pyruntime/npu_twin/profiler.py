"""``torch_npu.profiler`` on the twin: the names our code calls, with torch_npu 2.10.0.post4's
signatures, writing the files torch_npu's analysis writes, from the twin's task records.

What the real one does (torch_npu 2.10.0.post4 wheel, ``torch_npu/profiler/``):

* ``profile(*, activities=None, schedule=None, on_trace_ready=None, record_shapes=False,
  profile_memory=False, with_stack=False, with_flops=False, with_modules=False,
  experimental_config=None, custom_trace_id_callback=None, use_cuda=None)``
  (``profiler.py``); ``start()``/``stop()`` or a ``with`` block; at ``stop()`` the
  ``on_trace_ready`` handler runs (``_profiler_action_controller.py``).
* ``tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True,
  async_mode=False)`` (``profiler.py``): the profile goes to
  ``{dir_name}/{worker_name}_{%Y%m%d%H%M%S%f[:-3]}_ascend_pt`` with ``worker_name``
  ``{hostname}_{pid}`` by default (``_profiler_path_creator.py``), and the analysis writes
  ``ASCEND_PROFILER_OUTPUT/`` in it (``analysis/prof_common_func/_constant.py``
  ``OUTPUT_DIR``).
* ``ProfilerActivity`` (``CPU``, ``NPU``) comes from ``torch_npu._C._profiler``;
  ``_ExperimentalConfig(profiler_level=Level0, aic_metrics=..., l2_cache=False, msprof_tx=False,
  mstx=False, data_simplification=True, record_op_args=False, op_attr=False,
  gc_detect_threshold=None, export_type="text", host_sys=None, mstx_domain_include=None,
  mstx_domain_exclude=None, sys_io=False, sys_interconnection=False)``
  (``experimental_config.py``).

What the twin writes in ``ASCEND_PROFILER_OUTPUT/`` (the fields as the Ascend PyTorch Profiler
documentation gives them; `pyruntime.profiler.ascend_files` cites the pages and reads them):

* ``kernel_details.csv``: one row per kernel task that ran on the device (an AI-CPU task, an
  AI Core kernel, a plain torch op), headers ``Device_id, Name, Type, Accelerator Core, Start
  Time(us), Duration(us), Wait Time(us), Block Num`` (``analysis/prof_common_func/
  _csv_headers.py`` ``OP_SUMMARY_KERNEL_BASE_HEADERS``); times in us on the host's wall
  clock, as torch_npu converts the device's (``_cann_file_parser.py`` ``get_localtime_diff``:
  ``collectionTimeBegin`` minus ``clockMonotonicRaw``).
* ``op_statistic.csv``: per (``OP Type``, ``Core Type``) ``Count, Total Time(us), Min Time(us),
  Avg Time(us), Max Time(us), Ratio(%)`` (``prof_bean/_op_statistic_bean.py``).
* ``trace_view.json``: the device lanes only (process "Ascend Hardware", one thread per
  stream, ``args["Task Type"]``), on the same clock.

What it does not model: the host events of the CPU activity (the twin writes none), the
``schedule`` (not accepted: our code profiles every step it runs), the ``db`` export, AI Core
metrics, and how long tasks take on a device (the twin's times are the host's, running the
reference bodies: emulated, never device times).
"""

from __future__ import annotations

import csv
import enum
import json
import os
import socket
import types
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Self

from . import device as twin
from .npu_module import NotInTwinError

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
KERNEL_DETAILS = "kernel_details.csv"
OP_STATISTIC = "op_statistic.csv"
TRACE_VIEW = "trace_view.json"
KERNEL_HEADERS = ("Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)",
                  "Duration(us)", "Wait Time(us)", "Block Num")
OP_STATISTIC_HEADERS = ("OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)",
                        "Avg Time(us)", "Max Time(us)", "Ratio(%)")
#: the twin's work kinds that are kernel tasks, and the ``Accelerator Core`` (op_summary's
#: ``Task Type``: AI_CORE, AI_VECTOR_CORE, AI_CPU, ...) each is reported as. A plain torch op
#: stands for a torch_npu aclnn kernel; most of ours (copies, fills) are vector kernels.
#: Copies (DMA), event records and waits, task updates and replays are not kernels.
CORE_OF_KIND = {"aicpu": "AI_CPU", "aicore": "AI_CORE", "op": "AI_VECTOR_CORE"}
_REFERENCE_SUFFIX = " (C reference body)"


class ProfilerActivity(enum.Enum):
    """``torch_npu._C._profiler.ProfilerActivity``: CPU (framework side), NPU (CANN and
    the device)."""

    CPU = 0
    NPU = 1


def supported_activities() -> set[ProfilerActivity]:
    """Both activities (the real one asks the C side; an NPU build answers both)."""
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


class ProfilerLevel:
    Level0, Level1, Level2, Level_none = "Level0", "Level1", "Level2", "Level_none"


class AiCMetrics:
    AiCoreNone = "ACL_AICORE_NONE"
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"


class ExportType:
    Text, Db = "text", "db"


class _ExperimentalConfig:
    """``torch_npu.profiler._ExperimentalConfig`` with the real keywords; the twin models the
    default text export at Level0 without AI Core metrics, and refuses what it does not."""

    def __init__(self, profiler_level: str = ProfilerLevel.Level0,
                 aic_metrics: str = AiCMetrics.AiCoreNone, l2_cache: bool = False,
                 msprof_tx: bool = False, mstx: bool = False, data_simplification: bool = True,
                 record_op_args: bool = False, op_attr: bool = False,
                 gc_detect_threshold: float | None = None, export_type: str | list = "text",
                 host_sys: list | None = None, mstx_domain_include: list | None = None,
                 mstx_domain_exclude: list | None = None, sys_io: bool = False,
                 sys_interconnection: bool = False) -> None:
        types_ = export_type if isinstance(export_type, list) else [export_type]
        if any(t != ExportType.Text for t in types_):
            raise NotInTwinError("torch_npu.profiler._ExperimentalConfig(export_type=db): the "
                                 "twin writes the text export only")
        if aic_metrics != AiCMetrics.AiCoreNone or l2_cache or host_sys or sys_io \
                or sys_interconnection or mstx or msprof_tx or record_op_args:
            raise NotInTwinError("torch_npu.profiler._ExperimentalConfig: the twin collects no "
                                 "AI Core metrics, L2 cache, mstx, host or system data")
        self.profiler_level = profiler_level
        self.data_simplification = data_simplification


def tensorboard_trace_handler(dir_name: str | None = None, worker_name: str | None = None,
                              analyse_flag: bool = True,
                              async_mode: bool = False) -> Callable[[profile], None]:
    """The handler that writes the profile under `dir_name` (default: the current folder)
    as ``{worker_name}_{timestamp}_ascend_pt/ASCEND_PROFILER_OUTPUT/``."""
    if async_mode:
        raise NotInTwinError("tensorboard_trace_handler(async_mode=True): the twin parses "
                             "synchronously")
    root = Path(dir_name) if dir_name else Path.cwd()
    worker = worker_name or f"{socket.gethostname()}_{os.getpid()}"

    def handler_fn(prof: profile) -> None:
        if not analyse_flag:
            return
        stamp = datetime.now(tz=timezone.utc).astimezone().strftime("%Y%m%d%H%M%S%f")[:-3]
        write_output(root / f"{worker}_{stamp}_ascend_pt" / OUTPUT_DIR, prof.task_records)

    return handler_fn


class profile:  # torch_npu's name
    """``torch_npu.profiler.profile``: records the twin's device tasks between ``start()``
    and ``stop()``; ``on_trace_ready`` runs at ``stop()``."""

    def __init__(self, *, activities: Iterable[ProfilerActivity] | None = None,
                 schedule: Callable | None = None, on_trace_ready: Callable | None = None,
                 record_shapes: bool = False, profile_memory: bool = False,
                 with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False,
                 experimental_config: _ExperimentalConfig | None = None,
                 custom_trace_id_callback: Callable | None = None,
                 use_cuda: bool | None = None) -> None:
        if schedule is not None:
            raise NotInTwinError("torch_npu.profiler.profile(schedule=...): the twin records "
                                 "every step between start() and stop()")
        if record_shapes or profile_memory or with_stack or with_flops or with_modules:
            raise NotInTwinError("torch_npu.profiler.profile: the twin records no shapes, "
                                 "memory, stacks, flops or modules")
        self.activities = set(activities) if activities else supported_activities()
        for activity in self.activities:
            if not isinstance(activity, ProfilerActivity):
                raise TypeError(f"activities: {activity!r} is not a ProfilerActivity")
        self.on_trace_ready = on_trace_ready
        self.experimental_config = experimental_config
        self.task_records: list[twin.TaskRecord] = []
        self._recording = False

    def start(self) -> None:
        """Start recording the device's tasks (NPU activity)."""
        dev = twin.device()
        if dev.task_records is not None:
            raise RuntimeError("a torch_npu profiler is already recording in this process")
        self.task_records = []
        if ProfilerActivity.NPU in self.activities:
            dev.task_records = self.task_records
        self._recording = True

    def stop(self) -> None:
        """Stop; run ``on_trace_ready``. The device's queued work is not waited for (as on
        the device: the caller synchronizes before stopping to keep its last tasks)."""
        if not self._recording:
            return
        dev = twin.device()
        if dev.task_records is self.task_records:
            dev.task_records = None
        self._recording = False
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    def step(self) -> None:
        """Without a schedule a step changes nothing (torch_npu: the default schedule
        records every step)."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _name(record: twin.TaskRecord) -> str:
    """The kernel's name as torch_npu would show it: the op, not the twin's notes."""
    label = record.label.removeprefix("replay ").removesuffix(_REFERENCE_SUFFIX)
    return label.removeprefix("triton ")


def _us(ns: int) -> str:
    # torch_npu writes times as microsecond strings with three decimals (convert_ns2us_str)
    return f"{ns // 1000}.{ns % 1000:03d}"


def write_output(out: Path, records: list[twin.TaskRecord]) -> Path:
    """Write kernel_details.csv, op_statistic.csv and trace_view.json of `records` to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    kernels = [r for r in records if r.kind in CORE_OF_KIND]
    with (out / KERNEL_DETAILS).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(KERNEL_HEADERS)
        for r in kernels:
            name = _name(r)
            writer.writerow([r.device, name, name.split(".")[-2] if "." in name else name,
                             CORE_OF_KIND[r.kind], _us(r.start_ns), _us(r.end_ns - r.start_ns),
                             "0.000", 1])
    stats: dict[tuple[str, str], list[int]] = {}
    for r in kernels:
        name = _name(r)
        key = (name.split(".")[-2] if "." in name else name, CORE_OF_KIND[r.kind])
        stats.setdefault(key, []).append(r.end_ns - r.start_ns)
    total = sum(sum(v) for v in stats.values()) or 1
    with (out / OP_STATISTIC).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(OP_STATISTIC_HEADERS)
        for (op_type, core), durations in sorted(stats.items()):
            writer.writerow([op_type, core, len(durations), _us(sum(durations)),
                             _us(min(durations)), _us(sum(durations) // len(durations)),
                             _us(max(durations)), f"{100 * sum(durations) / total:.3f}"])
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
                                     "args": {"name": "Ascend Hardware"}}]
    threads: dict[int, str] = {}
    for r in kernels:
        if r.stream_id not in threads:
            threads[r.stream_id] = r.stream
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": r.stream_id,
                           "args": {"name": f"Stream {r.stream_id}"}})
        events.append({"ph": "X", "name": _name(r), "pid": 1, "tid": r.stream_id,
                       "ts": _us(r.start_ns), "dur": float(_us(r.end_ns - r.start_ns)),
                       "args": {"Task Type": CORE_OF_KIND[r.kind],
                                "Stream Id": r.stream_id}})
    (out / TRACE_VIEW).write_text(json.dumps(events) + "\n")
    return out


def build() -> types.ModuleType:
    """The ``torch_npu.profiler`` module of the twin."""
    module = types.ModuleType("torch_npu.profiler")
    for name in ("profile", "ProfilerActivity", "supported_activities",
                 "tensorboard_trace_handler", "_ExperimentalConfig", "ProfilerLevel",
                 "AiCMetrics", "ExportType"):
        setattr(module, name, globals()[name])
    return module
