"""Read the files torch_npu's profiler writes (``ASCEND_PROFILER_OUTPUT/``) into device tasks.

The files and fields as the Ascend PyTorch Profiler documentation describes them:

* Layout (``tensorboard_trace_handler(dir_name)``): ``{dir_name}/{worker_name}_{timestamp}
  _ascend_pt/ASCEND_PROFILER_OUTPUT/`` holding ``kernel_details.csv``, ``op_statistic.csv``
  and ``trace_view.json`` (Ascend docs, "Ascend PyTorch Profiler接口采集数据 / 采集数据目录说明":
  https://www.hiascend.com/doc_center/source/zh/canncommercial/80RC2/devaids/auxiliarydevtool/atlasprofiling_16_0040.html;
  torch_npu 2.10.0.post4 ``profiler/_profiler_path_creator.py`` builds the folder name,
  ``analysis/prof_common_func/_constant.py`` ``OUTPUT_DIR``).
* ``kernel_details.csv`` ("kernel_details.csv", Ascend docs "Timeline and Summary Data":
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/profiling/atlasprofiling_16_1149.html
  and the 6.3.RC2 field table at .../canncommercial/63RC2/devtools/auxiliarydevtool/atlasprofiling_16_0272.html):
  one row per operator executed on the NPU, controlled by ``ProfilerActivity.NPU``. Fields
  read here: ``Name`` (operator name), ``Type`` (operator type), ``Accelerator Core`` (the
  core type: AI_CORE, AI_VECTOR_CORE, AI_CPU, MIX_AIC, MIX_AIV; op_summary's ``Task Type``,
  https://www.hiascend.com/document/detail/en/canncommercial/850/devaids/profiling/atlasprofiling_16_0067.html),
  ``Start Time(us)``, ``Duration(us)``, and ``Step Id`` when a schedule marks steps (absent
  otherwise). The wheel's header list is ``OP_SUMMARY_KERNEL_BASE_HEADERS`` in
  ``analysis/prof_common_func/_csv_headers.py``. Times are microseconds on the host's wall
  clock: the analysis converts device time with ``collectionTimeBegin`` minus
  ``clockMonotonicRaw`` (``analysis/prof_parse/_cann_file_parser.py`` ``get_localtime_diff``)
  and writes them as strings that may end in a tab (``convert_ns2us_str``'s ``tail``).
* ``op_statistic.csv`` ("AI Core和AI CPU算子调用次数及耗时数据"): ``OP Type``, ``Core Type``,
  ``Count``, ``Total Time(us)``, ... (``analysis/prof_bean/_op_statistic_bean.py``).

`read_output` returns the kernel rows and the per-type counts; `attribute` turns rows into
our `DeviceTask` records, per step, on the host's ``perf_counter`` clock.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .data import DeviceTask

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
KERNEL_DETAILS = "kernel_details.csv"
OP_STATISTIC = "op_statistic.csv"
#: kernel_details.csv columns this reader needs
KERNEL_FIELDS = ("Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)")
OP_STATISTIC_FIELDS = ("OP Type", "Core Type", "Count")
#: ``Accelerator Core`` -> our task kind (`pyruntime.backends.handles`: aicpu, aicore)
KIND_OF_CORE = {"AI_CPU": "aicpu", "AI_CORE": "aicore", "AI_VECTOR_CORE": "aicore",
                "MIX_AIC": "aicore", "MIX_AIV": "aicore"}


class AscendProfileError(ValueError):
    """A profiler output folder or file that is missing, or not as torch_npu documents it
    (the message names the file, the row and the field)."""


@dataclass(frozen=True)
class KernelRow:
    """One ``kernel_details.csv`` row: times in microseconds on the host's wall clock."""

    name: str
    op_type: str
    core: str
    start_us: float
    duration_us: float
    step_id: str | None = None

    @property
    def kind(self) -> str:
        """``aicpu``, ``aicore``, or the core type lower-cased for anything else."""
        return KIND_OF_CORE.get(self.core, self.core.lower())


@dataclass(frozen=True)
class ProfilerOutput:
    """What `read_output` found: the folder, its kernel rows and op_statistic's counts."""

    folder: Path
    kernels: list[KernelRow]
    op_counts: dict[tuple[str, str], int]


def find_output(root: str | Path) -> Path:
    """The ``ASCEND_PROFILER_OUTPUT`` folder under `root` (the handler's ``dir_name``).

    Raises:
        AscendProfileError: none, or more than one (a folder holds one profile per run).
    """
    root = Path(root)
    found = sorted(p for p in root.glob(f"*_ascend_pt/{OUTPUT_DIR}") if p.is_dir())
    if not found:
        raise AscendProfileError(f"no *_ascend_pt/{OUTPUT_DIR} under {root}: the torch_npu "
                                 "profiler wrote no parsed output (analyse_flag off, or it failed)")
    if len(found) > 1:
        raise AscendProfileError(f"{len(found)} profiles under {root}; expected one: "
                                 + ", ".join(str(p.parent.name) for p in found))
    return found[0]


def _rows(path: Path, required: Sequence[str]) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            fields = [h.strip() for h in reader.fieldnames or []]
            missing = [h for h in required if h not in fields]
            if missing:
                raise AscendProfileError(f"{path}: missing column(s) {', '.join(missing)} "
                                         f"(found {', '.join(fields) or 'none'})")
            return [{k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
                    for row in reader]
    except OSError as exc:
        raise AscendProfileError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _number(path: Path, line: int, field: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise AscendProfileError(f"{path} line {line}: {field} is not a number: "
                                 f"{text!r:.40}") from None
    if math.isnan(value) or value < 0:
        raise AscendProfileError(f"{path} line {line}: {field} must be >= 0, got {text!r}")
    return value


def read_kernel_details(path: str | Path) -> list[KernelRow]:
    """The rows of a ``kernel_details.csv``, in file order.

    Raises:
        AscendProfileError: unreadable, a documented column missing, a time not a number.
    """
    path = Path(path)
    out = []
    for line, row in enumerate(_rows(path, KERNEL_FIELDS), start=2):
        step = row.get("Step Id") or None
        out.append(KernelRow(row["Name"], row["Type"], row["Accelerator Core"],
                             _number(path, line, "Start Time(us)", row["Start Time(us)"]),
                             _number(path, line, "Duration(us)", row["Duration(us)"]), step))
    return out


def read_op_statistic(path: str | Path) -> dict[tuple[str, str], int]:
    """``{(OP Type, Core Type): Count}`` of an ``op_statistic.csv``.

    Raises:
        AscendProfileError: unreadable, a documented column missing, a count not a whole number.
    """
    path = Path(path)
    out: dict[tuple[str, str], int] = {}
    for line, row in enumerate(_rows(path, OP_STATISTIC_FIELDS), start=2):
        count = _number(path, line, "Count", row["Count"])
        if count != int(count):
            raise AscendProfileError(f"{path} line {line}: Count is not a whole number")
        key = (row["OP Type"], row["Core Type"])
        out[key] = out.get(key, 0) + int(count)
    return out


def read_output(root: str | Path) -> ProfilerOutput:
    """Find and read one profile: kernel_details.csv (required), op_statistic.csv (when the
    profile has one: a run without kernels writes none).

    Raises:
        AscendProfileError: see `find_output`, `read_kernel_details`, `read_op_statistic`.
    """
    folder = find_output(root)
    kernels_path = folder / KERNEL_DETAILS
    if not kernels_path.is_file():
        raise AscendProfileError(f"{folder} has no {KERNEL_DETAILS}: was "
                                 "ProfilerActivity.NPU among the activities?")
    stats_path = folder / OP_STATISTIC
    counts = read_op_statistic(stats_path) if stats_path.is_file() else {}
    return ProfilerOutput(folder, read_kernel_details(kernels_path), counts)


@dataclass(frozen=True)
class StepWindow:
    """A measured step on the host clock (``perf_counter`` seconds): device tasks that start
    inside ``[start, end]`` belong to it."""

    key: str
    step: int
    start: float
    end: float


@dataclass(frozen=True)
class ClockAnchor:
    """One reading of both clocks at the same moment: the profiler's wall clock
    (``time.time_ns``) and the host's ``perf_counter`` (seconds)."""

    wall_ns: int
    perf_s: float

    def to_perf(self, wall_us: float) -> float:
        """A profiler time (us, wall clock) on the perf_counter scale (seconds)."""
        # in us: epoch times near 1.7e15 us keep sub-ns steps in a float, 1.7e18 ns do not
        return self.perf_s + (wall_us - self.wall_ns / 1000) * 1e-6


#: kernel-name parts (lower case) of attention kernels whose name does not say "attention":
#: our MLA decode (`pyruntime.kernels.triton_mla`'s ``mla_decode_kernel``, multi-head latent
#: attention, which the hook's MLA layers run in place of vLLM-Ascend's FIA). Not a bare "mla":
#: vLLM-Ascend's ``npu_mla_prolog`` (``MlaProlog``) is the projection before attention
ATTENTION_NAME_PARTS = ("attention", "mla_decode")


def is_attention_kernel(name: str) -> bool:
    """Whether a kernel named `name` computes attention (and is not the combine step):
    a name with one of `ATTENTION_NAME_PARTS` and without "combine"."""
    lowered = name.lower()
    return "combine" not in lowered and any(part in lowered for part in ATTENTION_NAME_PARTS)


def attribute(rows: Iterable[KernelRow], windows: Sequence[StepWindow], anchor: ClockAnchor,
              ) -> tuple[dict[str, list[DeviceTask]], int]:
    """Each kernel row as a `DeviceTask` of the step window its start falls in.

    Tasks are named as `pyruntime.measurement.abrun.device_tasks_of_step` names the CPU
    backend's: the n-th attention kernel of a step (an AI Core task whose name says
    attention, or MLA decode, and not combine: `is_attention_kernel`) is ``attention layer
    n``; the lane is the core type.

    Returns:
        ``({window key: tasks in start order}, rows outside every window)``.
    """
    ordered = sorted(windows, key=lambda w: w.start)
    out: dict[str, list[DeviceTask]] = {w.key: [] for w in ordered}
    layer: dict[tuple[str, int], int] = {}
    outside = 0
    i = 0
    for row in sorted(rows, key=lambda r: r.start_us):
        start = anchor.to_perf(row.start_us)
        while i < len(ordered) and ordered[i].end < start:
            i += 1
        if i == len(ordered) or start < ordered[i].start:
            outside += 1
            continue
        w = ordered[i]
        name = row.name
        if row.kind == "aicore" and is_attention_kernel(name):
            n = layer.get((w.key, w.step), 0)
            layer[(w.key, w.step)] = n + 1
            name = f"attention layer {n}"
        out[w.key].append(DeviceTask(w.step, row.kind, name, row.core, start,
                                     start + row.duration_us * 1e-6))
    return out, outside
