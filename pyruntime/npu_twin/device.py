"""The twin's device: memory, streams, events, graphs and the rules that torch_npu and CANN
enforce on them, on the host.

Where each rule comes from (the sources are the torch_npu 2.10.0.post4 wheel, read as a zip;
CANN's runtime, hicann/runtime; both read for the pre-flight review summarised in
docs/npu-twin.md):

* Device memory is not host memory. ``Tensor.numpy()`` on an ``npu`` tensor raises the
  TypeError torch raises for any non-CPU tensor; ``.cpu()``, ``.tolist()`` and ``.item()`` are
  synchronous device-to-host copies (torch_npu ``copy_between_host_and_device``): they wait
  for the stream and are refused while any graph captures (capture mode ``global``, the
  default of ``NPUGraph.capture_begin``, ``torch_npu/npu/graphs.py``).
* Work is asynchronous. Every device operation is queued on the current stream and runs
  later, in stream order, when the host synchronises (``torch.npu.synchronize``,
  ``Stream.synchronize``, ``Event.synchronize``, a device-to-host read). So a
  ``non_blocking=True`` host-to-device copy from pageable memory reads the host memory when
  it runs, not when it was issued (torch_npu queues ``aclrtMemcpyAsync`` with the raw host
  pointer and does not check that it is pinned); the twin flags such a copy whose source was
  freed or rewritten before it ran (`PageableCopyRace`).
* Capture (``aclmdlRICaptureBegin`` under ``NPUGraph.capture_begin``) records every device
  operation issued on the capturing stream, ours and plain torch ops alike, and runs none of
  them: memory allocated during a capture holds garbage until a replay runs the captured
  ``zero_``/``fill_``. Replay re-runs every recorded task in order on the same storages, with
  the host values (scalars, lists, argument blocks) frozen at capture. Inside a capture: no
  synchronize, no stream or event query, no host read of device memory, no host-to-device
  copy (it would freeze a host address); the default stream cannot capture; a stream that
  waits on an event recorded in the capture joins it, and must be joined back (an event
  recorded on it last and waited on by the origin stream) before ``capture_end``
  (``docs/zh/dev_guide/04-02_cross_stream_capture.md`` of hicann/runtime); a normal event
  recorded outside the capture cannot be waited on inside it (``ExternalEvent`` exists for
  that, ``torch_npu/npu/streams.py``).
* ``NPUGraph.reset()`` on a capturing graph does not end the capture: the stream keeps
  capturing (``NPUGraph::reset`` in Ascend/pytorch calls no ``capture_end``).
* Task groups (``graph_task_group_begin/end``) hold AI Core tasks; an AI-CPU task cannot
  join one (no task update for them, docs/design.md section 7). ``graph_task_update_begin/end``
  run on a stream that is not capturing and must re-issue exactly the group's tasks; the
  update lands when the update stream reaches it.
* ``TASK_QUEUE_ENABLE=2`` makes ``capture_begin`` refuse (the text is in the wheel's
  ``libtorch_npu.so``). The device context is created lazily: by ``set_device`` or by the
  first allocation (torch_npu ``NpuSysCtrl::Initialize`` with lazy set-device).
* A device kernel handed a host pointer (a CPU tensor) faults: Triton-Ascend's launcher
  takes ``data_ptr()`` with no device check (``backends/ascend/driver.py``), so the AI Core
  would read a host address; the twin raises `HostPointerError` instead of faulting.
* Several devices (``$AICPU_TILING_TWIN_DEVICES``, default 2). Each thread has a current
  device (``torch.npu.set_device``, torch_npu ``c10_npu::SetDevice`` -> ``aclrtSetDevice``,
  which sets the calling thread's context); an index outside the count is CANN's
  ``ACL_ERROR_RT_INVALID_DEVICEID`` (107001, hicann/runtime
  ``include/external/acl/error_codes/rt_error_codes.h:22``). Streams, graphs, events (from
  their first record) and memory belong to one device. A plain torch op runs on the current
  stream of its tensors' device (torch_npu's generated kernels take a device guard from
  them); tensors of two devices in one op raise torch's same-device error. A raw runtime call
  on a stream outside the calling thread's current context is refused with
  ``ACL_ERROR_RT_STREAM_CONTEXT`` (107003, ``rt_error_codes.h:24``): every stream call
  checks ``stm->Context_() != CurrentContext()`` (``src/runtime/api/impl/api_impl.cc``:
  ``EventRecord`` :2153, ``StreamWaitEvent`` :1610, kernel launches :624-690; the macro
  ``COND_RETURN_AND_MSG_INVALID_CONTEXT_STREAM_WITH_FUNC_DESC``,
  ``src/runtime/core/inc/common/error_message_manage.hpp:337``, message EE1010). torch_npu's
  ``Event`` takes its device from the first stream that records it, and a later record on
  another device's stream raises "Event device j does not match recording stream's device
  k." (``torch_npu/csrc/core/npu/NPUEvent.h:16-20``; the text is in ``libtorch_npu.so``);
  a wait from another device's stream is allowed (``NPUEvent::block`` guards to the stream's
  device and the runtime waits remotely, ``src/runtime/core/src/event/event.cc:731-738``).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import os
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

#: the byte that fills fresh device memory (garbage until a kernel writes it)
POISON = 0xA5
TASK_QUEUE_REFUSAL = "Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture"
DEVICE_NAME = "Ascend910B3 (npu-twin)"
#: what ``get_device_properties`` reports: the 910B3's 20 AI Cores (cube) and 40 vector cores
AI_CORES, VECTOR_CORES = 20, 40


class TwinError(RuntimeError):
    """Something the real torch_npu / CANN would refuse or fault on. Never raised directly."""


class CaptureViolation(TwinError):
    """An operation a graph capture forbids (sync, query, host read, host copy, ...)."""


class DeviceLostError(TwinError):
    """The device is lost (fault ``device-lost``): every later operation fails."""


class HostPointerError(TwinError):
    """A host (CPU) tensor handed to a device kernel."""


class PageableCopyRace(TwinError):
    """A ``non_blocking`` copy from pageable host memory whose source changed before it ran."""


class DeviceHang(TwinError):
    """The host waits for work that can never run (a stream waits on an event never
    recorded): on hardware a hang, here an error that names the waiting stream."""


class NoContextError(TwinError):
    """A runtime call that needs a device context before any exists (CANN 107002)."""


class AclError(TwinError):
    """An ACL call failed; ``code`` is the ACL error code (``rt_error_codes.h``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (ACL error {code})")
        self.code = code


#: how many NPUs the twin has (``torch.npu.device_count()``)
DEVICES_ENV = "AICPU_TILING_TWIN_DEVICES"
DEFAULT_DEVICES = 2
#: hicann/runtime include/external/acl/error_codes/rt_error_codes.h:22,24
ACL_ERROR_RT_INVALID_DEVICEID = 107001
ACL_ERROR_RT_STREAM_CONTEXT = 107003


def device_count_from_env() -> int:
    """``$AICPU_TILING_TWIN_DEVICES`` (default 2): a whole number from 1 to 64.

    Raises:
        ValueError: anything else (the variable's value is named).
    """
    given = os.environ.get(DEVICES_ENV, "").strip()
    if not given:
        return DEFAULT_DEVICES
    if not given.isdigit() or not 1 <= int(given) <= 64:
        raise ValueError(f"{DEVICES_ENV} must be a whole number from 1 to 64, got {given!r}")
    return int(given)


# ---- device work -----------------------------------------------------------------------------
@dataclasses.dataclass
class Work:
    """One queued device operation. ``kind``: op (a plain torch op), copy, aicore, aicpu,
    record, wait, ext_record, ext_wait, ext_reset, update, replay (a graph, expanded into its
    tasks when the stream reaches it)."""

    kind: str
    label: str
    run: Callable[[], None] | None = None
    event: Any = None
    token: int | None = None
    #: the device memory the work writes (inner tensors): what fault ``stale-aicpu-read``
    #: keeps the previous contents of when an AI Core task writes it
    writes: tuple = ()


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """One device task that ran while the twin's profiler recorded: ``kind`` and ``label`` of
    its `Work`, the stream it ran on and its start and end in ns on the host's wall clock
    (``time.time_ns``, the clock torch_npu's profiler converts device times to)."""

    kind: str
    label: str
    stream: str
    stream_id: int
    device: int
    start_ns: int
    end_ns: int


class StreamState:
    _ids = itertools.count()

    def __init__(self, name: str, *, default: bool = False, device: int = 0) -> None:
        self.id = next(self._ids)
        self.name, self.default, self.device = name, default, device
        self.queue: collections.deque[Work] = collections.deque()
        self.capture: GraphState | None = None
        self.open_group: list[int] | None = None
        self.updating: tuple[GroupHandle, list[Work]] | None = None

    def __repr__(self) -> str:
        return f"<npu-twin stream {self.name}#{self.id} on npu:{self.device}>"


class EventState:
    """A normal event: a wait blocks until the record issued before it has run."""

    def __init__(self, *, external: bool, timing: bool = False) -> None:
        self.external, self.timing = external, timing
        self.tokens = itertools.count(1)
        self.last_token: int | None = None  # the newest record issued
        self.done: int = 0  # the newest record that ran
        self.flag = False  # ExternalEvent: set by record, cleared by reset
        self.captured_in: GraphState | None = None
        self.snapshot: dict[int, int] = {}  # in a capture: what a wait on it is ordered after
        #: torch_npu's NPUEvent takes its device from the first stream that records it
        self.device: int | None = None


@dataclasses.dataclass
class GroupHandle:
    graph: GraphState
    nodes: list[int]
    generation: int


class GraphState:
    """One ``NPUGraph``: empty -> capturing -> captured; reset makes it empty again."""

    def __init__(self) -> None:
        self.status = "empty"
        #: the device of the stream it was captured on (replays run there)
        self.device: int | None = None
        self.nodes: list[Work] = []
        self.origin: StreamState | None = None
        self.side: dict[int, StreamState] = {}
        #: per stream: how many tasks it captured, and how far into each stream (itself
        #: included) its next task is ordered after; capture_end needs the origin ordered
        #: after every task of every stream that joined, directly or through another one
        self.seq: dict[int, int] = collections.Counter()
        self.frontier: dict[int, dict[int, int]] = collections.defaultdict(dict)
        self.generation = 0

    def ordered_after(self, stream_id: int, snapshot: dict[int, int]) -> None:
        mine = self.frontier[stream_id]
        for other, position in snapshot.items():
            mine[other] = max(mine.get(other, 0), position)

    def streams(self) -> list[StreamState]:
        return [s for s in (self.origin, *self.side.values()) if s is not None]


#: torch_npu 2.10.0.post4 ``torch_npu/npu/__init__.py`` ``_lazy_init`` in a bad fork
BAD_FORK = ("Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, "
            "you must use the 'spawn' start method")


# ---- the device ------------------------------------------------------------------------------
class Device:
    """The twin's runtime in this process: ``count`` devices (``npu:0`` ..), each with its
    default stream and context, one queue runner for all of them."""

    def __init__(self, *, fault: str | None, state_dir: Path, count: int | None = None) -> None:
        self.fault = fault
        self.state_dir = state_dir
        self.count = device_count_from_env() if count is None else count
        #: the devices whose context exists (set_device or a first allocation made it)
        self.contexts: set[int] = set()
        self.default_streams = [StreamState("default", default=True, device=index)
                                for index in range(self.count)]
        self.streams: list[StreamState] = list(self.default_streams)
        #: torch_npu's bad-fork state: a multiprocessing fork child of a process that had
        #: initialised the device (set by `pyruntime.npu_twin.processes`); every call raises
        self.in_bad_fork = False
        self._local = threading.local()
        self.aicore_body = os.environ.get("AICPU_TILING_TWIN_AICORE", "triton")
        if self.aicore_body not in ("triton", "reference"):
            raise ValueError(f"AICPU_TILING_TWIN_AICORE must be triton or reference, got "
                             f"{self.aicore_body!r}")
        self.stats = collections.Counter()
        self._executor = None  # the device thread, started at the first synchronisation
        self._device_thread: threading.Thread | None = None
        #: the last status the reference body would have raised (the device kernel only
        #: writes it to its status buffer); the count is in stats["aicore_status_errors"]
        self.last_aicore_status: str | None = None
        from .memory import DeviceMemory, total_from_env

        #: live allocated / reserved bytes against the device size (`pyruntime.npu_twin.memory`)
        self.memory = DeviceMemory(total_from_env())
        #: the device's default random generator (torch_npu ``default_generators[i]``, seeded
        #: by ``torch.npu.manual_seed``): random ops on npu tensors draw from it, not from the
        #: host's, when they run
        self.generator = torch.Generator()
        #: fault stale-aicpu-read: storage -> its bytes before the last AI Core write
        self.before_aicore_write: dict[int, torch.Tensor] = {}
        #: while the twin's ``torch_npu.profiler`` records (`pyruntime.npu_twin.profiler`):
        #: one `TaskRecord` per device task that ran, in run order; None otherwise
        self.task_records: list[TaskRecord] | None = None

    # ---- context, loss ---------------------------------------------------------------------
    @property
    def lost_marker(self) -> Path:
        return self.state_dir / "device-lost"

    def lost_reason(self) -> str | None:
        try:
            return self.lost_marker.read_text()
        except OSError:
            return None

    def lose(self, reason: str) -> DeviceLostError:
        self.lost_marker.parent.mkdir(parents=True, exist_ok=True)
        self.lost_marker.write_text(reason)
        return DeviceLostError(reason)

    def check_alive(self) -> None:
        if self.in_bad_fork:  # torch_npu/npu/__init__.py: _lazy_init, before any runtime call
            raise RuntimeError(BAD_FORK)
        reason = self.lost_reason()
        if reason is not None:
            raise DeviceLostError(f"the NPU is lost ({reason}); every later call fails "
                                  "(on hardware: error 507018, then 207001 on each call)")

    @property
    def context(self) -> bool:
        """Whether the current device's context exists."""
        return self.current_device() in self.contexts

    def ensure_context(self, index: int | None = None) -> None:
        """Create the context of device `index` (default: the current one), as torch_npu's
        lazy set-device does at the first allocation."""
        self.check_alive()
        self.contexts.add(self.current_device() if index is None else self.checked(index))

    def require_context(self, what: str) -> None:
        if not self.context:
            raise NoContextError(f"{what}: no device context on this thread (CANN 107002): "
                                 "call torch.npu.set_device() or allocate an npu tensor first")

    # ---- devices -----------------------------------------------------------------------------
    def checked(self, index: int) -> int:
        """`index` if the twin has that device, else CANN's invalid device id."""
        if not isinstance(index, int) or not 0 <= index < self.count:
            raise AclError(ACL_ERROR_RT_INVALID_DEVICEID,
                           f"aclrtSetDevice({index}): invalid device id: the twin has "
                           f"{self.count} NPUs (${DEVICES_ENV})")
        return index

    def current_device(self) -> int:
        """The calling thread's current device (0 until it sets one)."""
        return getattr(self._local, "device", 0)

    def set_current_device(self, index: int) -> None:
        """``aclrtSetDevice``: the calling thread's current device and context."""
        self.check_alive()
        self.checked(index)
        self._local.device = index
        self.contexts.add(index)

    def check_stream_context(self, stream: StreamState, call: str) -> None:
        """A raw runtime call on `stream` from this thread: the stream must belong to the
        current context (hicann/runtime api_impl.cc, every stream call:
        ``stm->Context_() != curCtx`` -> RT_ERROR_STREAM_CONTEXT, ACL 107003, EE1010)."""
        current = self.current_device()
        if stream.device != current:
            raise AclError(ACL_ERROR_RT_STREAM_CONTEXT,
                           f"{call}: {stream} does not belong to the current context (npu:"
                           f"{current}): EE1010 \"{call} execution failed because stream does "
                           "not belong to the current context\" (ACL_ERROR_RT_STREAM_CONTEXT)")

    # ---- streams -----------------------------------------------------------------------------
    @property
    def default_stream(self) -> StreamState:
        """The current device's default stream."""
        return self.default_streams[self.current_device()]

    def current_stream(self, index: int | None = None) -> StreamState:
        """The calling thread's current stream of device `index` (default: current)."""
        index = self.current_device() if index is None else self.checked(index)
        streams = getattr(self._local, "streams", None) or {}
        return streams.get(index) or self.default_streams[index]

    def set_current_stream(self, stream: StreamState) -> None:
        """The current stream of `stream`'s device (the current device is not changed)."""
        if not hasattr(self._local, "streams"):
            self._local.streams = {}
        self._local.streams[stream.device] = stream

    def new_stream(self, name: str, index: int | None = None) -> StreamState:
        """A stream on device `index` (default: the current one)."""
        index = self.current_device() if index is None else self.checked(index)
        stream = StreamState(name, device=index)
        self.streams.append(stream)
        return stream

    # ---- queueing ----------------------------------------------------------------------------
    def enqueue(self, work: Work, stream: StreamState | None = None) -> None:
        """Queue `work` on `stream` (the current one by default): recorded into the graph
        when the stream captures, collected when it updates a task group."""
        self.check_alive()
        stream = stream or self.current_stream()
        self.stats[work.kind] += 1
        if stream.updating is not None:
            if work.kind not in ("aicore", "op"):
                raise CaptureViolation(f"{work.label}: only kernel launches may be re-issued "
                                       "between graph_task_update_begin and _end")
            stream.updating[1].append(work)
            return
        graph = stream.capture
        if graph is not None:
            self._record(graph, stream, work)
            return
        stream.queue.append(work)

    def enqueue_aicore(self, label: str, run: Callable[[], None], *, index: int,
                       writes: tuple = (), kind: str = "aicore") -> None:
        """Queue an op's device task on the calling thread's current stream of device `index`
        (recorded into the graph when that stream captures), as torch_npu queues an op on the
        current stream of its tensors' device (a device guard from them).

        Args:
            label: the op's name (task records, errors).
            run: the task's body, run when the stream reaches it (every replay, if captured):
                reads and writes device memory (inner tensors) only.
            index: the device of the op's tensors.
            writes: the device memory `run` writes (twin tensors or their inner tensors):
                what fault ``stale-aicpu-read`` keeps the previous contents of.
            kind: ``aicore``, a kernel (a torch_npu or custom op), or ``op``, an aten op
                (`stats` counts them apart).
        """
        # map, not a generator: no Python call per task when nothing is written (the bench
        # counts a host step's Python calls)
        self.enqueue(Work(kind, label, run, writes=tuple(map(inner, writes))),
                     self.current_stream(index))

    def _record(self, graph: GraphState, stream: StreamState, work: Work) -> None:
        if graph.status != "capturing":
            raise CaptureViolation(f"{work.label} issued on {stream}, which is still capturing "
                                   "for a graph that was reset without capture_end: every "
                                   "operation on it is lost")
        if stream.open_group is not None:
            if work.kind == "aicpu":
                raise CaptureViolation(f"{work.label}: an AI-CPU task cannot join a task group "
                                       "(CANN updates AI Core tasks only)")
            if work.kind in ("record", "wait", "ext_record", "ext_wait", "ext_reset"):
                raise CaptureViolation(f"{work.label} inside a task group: a group holds the "
                                       "kernel tasks an update re-issues, not event tasks (an "
                                       "AI-CPU launch forks through events)")
            stream.open_group.append(len(graph.nodes))
        if work.kind != "record":
            graph.seq[stream.id] += 1
        graph.nodes.append(work)

    def refuse_in_capture(self, what: str) -> None:
        # a stream stays capturing after a reset without capture_end, so streams decide (a
        # plain loop, not any() over a generator: a host step's Python calls, which the bench
        # counts, must not grow with the streams this process has made)
        capturing = False
        for stream in self.streams:
            if stream.capture is not None:
                capturing = True
                break
        if capturing:
            raise CaptureViolation(f"{what} while a graph is capturing (capture mode global "
                                   "refuses it in every thread); do it before capture_begin "
                                   "or after capture_end")

    # ---- running ---------------------------------------------------------------------------
    def _runnable(self, work: Work) -> bool:
        if work.kind == "wait":
            return work.token is None or work.event.done >= work.token
        if work.kind == "ext_wait":
            return work.event.flag
        return True

    def _execute(self, work: Work, stream: StreamState | None = None) -> None:
        records = self.task_records
        if records is None or work.run is None:
            return self._run_work(work)
        start = time.time_ns()  # CANN's profiler reports task times on the host's wall clock
        try:
            self._run_work(work)
        finally:
            records.append(TaskRecord(work.kind, work.label, stream.name if stream else "",
                                      stream.id if stream else -1, stream.device if stream else 0,
                                      start, time.time_ns()))

    def _run_work(self, work: Work) -> None:
        kind, event = work.kind, work.event
        if kind == "record":
            event.done = max(event.done, work.token)
        elif kind == "ext_record":
            event.flag = True
        elif kind == "ext_reset":
            event.flag = False
        elif work.run is not None:
            if kind == "aicore" and self.fault == "device-lost":
                raise self.lose(f"twin fault device-lost: the AI Core faulted running "
                                f"{work.label}")
            if self.fault == "stale-aicpu-read" and work.writes:
                self._keep_before_write(work)
            work.run()

    def _keep_before_write(self, work: Work) -> None:
        """Fault stale-aicpu-read: an AI Core task (a plain op or our kernel) keeps what it
        overwrites for the AI-CPU to read instead (`aicpu_reads`); a DMA copy (H2D) does
        not count as an AI Core write and clears it."""
        for tensor in work.writes:
            storage = tensor.untyped_storage()
            if work.kind in ("op", "aicore"):
                kept = torch.empty(storage.nbytes(), dtype=torch.uint8)
                kept.untyped_storage().copy_(storage)
                self.before_aicore_write[storage.data_ptr()] = kept
            else:
                self.before_aicore_write.pop(storage.data_ptr(), None)

    def aicpu_reads(self, tensor: torch.Tensor) -> torch.Tensor:
        """What an AI-CPU task reads of `tensor` (device memory, an inner tensor): the memory
        itself, or under fault stale-aicpu-read its contents before the last AI Core task
        that wrote it (a view of the same shape, dtype and offset over the kept bytes)."""
        kept = self.before_aicore_write.get(tensor.untyped_storage().data_ptr()) \
            if self.fault == "stale-aicpu-read" else None
        if kept is None:
            return tensor
        return torch.empty(0, dtype=tensor.dtype).set_(
            kept.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())

    def run_until(self, done: Callable[[], bool], waiting_for: str) -> None:
        """Run queued work, stream by stream in turn, until `done()`; `DeviceHang` when no
        stream can make progress first. The work runs on the device's own thread while the
        host thread waits, so the host's CPU time (``time.thread_time``) counts only the
        host's own work, as on an NPU."""
        if threading.current_thread() is self._device_thread:
            return self._run_until(done, waiting_for)
        if self._executor is None:
            import concurrent.futures

            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="npu-twin-device",
                initializer=lambda: setattr(self, "_device_thread", threading.current_thread()))
        return self._executor.submit(self._run_until, done, waiting_for).result()

    def _run_until(self, done: Callable[[], bool], waiting_for: str) -> None:
        while not done():
            progressed = False
            for stream in self.streams:
                while stream.queue and self._runnable(stream.queue[0]):
                    work = stream.queue.popleft()
                    progressed = True
                    if work.kind == "replay":  # the graph's tasks take its place, in order
                        stream.queue.extendleft(reversed(self._replayed(work.event)))
                        continue
                    self._execute(work, stream)
                    if done():
                        return
            if not progressed:
                blocked = [f"{s} at {s.queue[0].label}" for s in self.streams if s.queue]
                raise DeviceHang(f"waiting for {waiting_for}, but no stream can run: "
                                 f"{'; '.join(blocked)} (an event that is never recorded)")

    # Host waits are counted in `stats` by what made the host wait (the bench's and the hook's
    # per-step invariants read them): ``synchronizes`` (torch.npu.synchronize(),
    # Stream.synchronize(), Event.synchronize()), ``copies_h2d_blocking`` (``copy_`` to the
    # device without non_blocking) and ``copies_d2h`` (``.cpu()``, ``.item()``, ...): torch_npu's
    # ``copy_between_host_and_device`` (torch_npu/csrc/aten/common/CopyKernel.cpp, Ascend/pytorch;
    # its log line "non_blocking copy without StreamSynchronize." is in the 2.10.0.post4
    # wheel's libtorch_npu.so) calls AclrtSynchronizeStreamWithTimeout on the current stream
    # and then a synchronous aclrtMemcpy unless non_blocking is set, in either direction; with
    # non_blocking it queues the copy and records an event on the pinned host block instead.
    def synchronize_stream(self, stream: StreamState, what: str,
                           counted_as: str = "synchronizes") -> None:
        self.check_alive()
        self.refuse_in_capture(what)
        self.stats[counted_as] += 1
        self.run_until(lambda: not stream.queue, f"{stream} to drain")

    def synchronize(self, what: str = "torch.npu.synchronize()", index: int | None = None) -> None:
        """``aclrtSynchronizeDevice``: every stream of device `index` (default: current)."""
        self.check_alive()
        self.refuse_in_capture(what)
        self.stats["synchronizes"] += 1
        index = self.current_device() if index is None else self.checked(index)
        mine = [s for s in self.streams if s.device == index]
        self.run_until(lambda: all(not s.queue for s in mine),
                       f"every stream of npu:{index} to drain")

    # ---- events ------------------------------------------------------------------------------
    def record_event(self, event: EventState, stream: StreamState) -> None:
        if event.external:
            self.enqueue(Work("ext_record", "ExternalEvent.record", event=event), stream)
            return
        token = next(event.tokens)
        event.last_token = token
        graph = stream.capture
        event.captured_in = graph
        self.enqueue(Work("record", "Event.record", event=event, token=token), stream)
        if graph is not None:
            event.snapshot = {**graph.frontier[stream.id], stream.id: graph.seq[stream.id]}

    def wait_event(self, event: EventState, stream: StreamState) -> None:
        if event.external:
            self.enqueue(Work("ext_wait", "ExternalEvent.wait", event=event), stream)
            return
        graph = event.captured_in
        if event.timing and (stream.capture is not None or (
                graph is not None and graph.status == "capturing")):
            raise CaptureViolation("an Event created with enable_timing=True cannot be waited "
                                   "on in a capture (only ACL_EVENT_SYNC events can)")
        if graph is not None and graph.status == "capturing":
            if stream.capture is None:  # a fork: the stream joins the capture
                if stream.default:
                    raise CaptureViolation("the default stream cannot join a capture")
                stream.capture = graph
                graph.side[stream.id] = stream
            elif stream.capture is not graph:
                raise CaptureViolation(f"{stream} waits on an event of another capturing graph")
            graph.ordered_after(stream.id, event.snapshot)
        elif stream.capture is not None and event.last_token is not None:
            raise CaptureViolation(f"{stream} captures and waits on an Event recorded outside "
                                   "the capture: use torch.npu.ExternalEvent for that")
        self.enqueue(Work("wait", "Event.wait", event=event, token=event.last_token), stream)

    def synchronize_event(self, event: EventState) -> None:
        self.check_alive()
        self.refuse_in_capture("Event.synchronize()")
        self.stats["synchronizes"] += 1
        if event.external or event.last_token is None:
            return
        token = event.last_token
        self.run_until(lambda: event.done >= token, "an event")

    # ---- graphs ------------------------------------------------------------------------------
    def capture_begin(self, graph: GraphState) -> None:
        self.check_alive()
        if self.fault == "capture-refused" or os.environ.get("TASK_QUEUE_ENABLE") == "2":
            raise RuntimeError(TASK_QUEUE_REFUSAL)
        stream = self.current_stream()
        if stream.default:
            raise CaptureViolation("capture_begin on the default stream: CANN refuses to "
                                   "capture it; capture under torch.npu.stream(side_stream)")
        if stream.capture is not None:
            raise CaptureViolation(f"capture_begin: {stream} is already capturing (a capture "
                                   "that was never ended)")
        if graph.status != "empty":
            raise CaptureViolation(f"capture_begin on a graph that is {graph.status}")
        graph.status, graph.origin, graph.device = "capturing", stream, stream.device
        stream.capture = graph

    def capture_end(self, graph: GraphState) -> None:
        stream = self.current_stream(graph.device)
        if graph.status != "capturing" or stream is not graph.origin:
            raise CaptureViolation("capture_end: this graph is not capturing on the current "
                                   "stream")
        problem = None
        if any(s.open_group is not None for s in graph.streams()):
            problem = "a task group was begun and never ended"
        joined = graph.frontier[graph.origin.id]
        for side in graph.side.values():
            if joined.get(side.id, 0) < graph.seq[side.id]:
                problem = (f"{side} joined the capture and was not joined back (record an "
                           "event on it after its last task and wait on it from the capture "
                           "stream, directly or through another joined stream)")
        for s in graph.streams():
            s.capture, s.open_group = None, None
        if problem:
            graph.status, graph.nodes = "empty", []
            raise CaptureViolation(f"capture_end: {problem}")
        graph.status = "captured"

    def replay(self, graph: GraphState) -> None:
        self.check_alive()
        if graph.status != "captured":
            raise CaptureViolation(f"replay of a graph that is {graph.status}")
        # NPUGraph::replay runs on the current stream of the capture stream's device (a
        # device guard on it, as CUDAGraph::replay; torch_npu/csrc/core/npu/NPUGraph.h:116)
        stream = self.current_stream(graph.device)
        if stream.capture is not None:
            raise CaptureViolation("replay on a capturing stream")
        # one launch for the host (aclmdlRIExecuteAsync); the device expands it into the
        # graph's tasks when the stream reaches it
        self.enqueue(Work("replay", "graph replay", event=graph), stream)
        self.stats["replays"] += 1

    def _replayed(self, graph: GraphState) -> list[Work]:
        if graph.status != "captured":
            raise CaptureViolation("a queued replay's graph was reset before it ran")
        works = []
        for index, node in enumerate(graph.nodes):
            if node.kind in ("record", "wait"):
                continue  # edges inside the graph: replay runs its nodes in capture order
            if node.kind == "aicpu" and self.fault == "no-aicpu-replay":
                continue
            works.append(Work(node.kind, f"replay {node.label}", self._node_body(graph, index),
                              event=node.event, writes=node.writes))
        return works

    @staticmethod
    def _node_body(graph: GraphState, index: int) -> Callable[[], None]:
        generation = graph.generation

        def run() -> None:
            if graph.generation != generation:
                raise CaptureViolation("a replayed task's graph was reset before it ran")
            body = graph.nodes[index].run
            if body is not None:
                body()
        return run

    def reset(self, graph: GraphState) -> None:
        graph.generation += 1
        if graph.status == "capturing":
            # NPUGraph::reset calls no capture_end: the streams stay capturing, into nothing
            graph.status = "reset-while-capturing"
            graph.nodes = []
            return
        graph.status, graph.nodes = "empty", []
        graph.side, graph.origin, graph.device = {}, None, None
        graph.seq, graph.frontier = collections.Counter(), collections.defaultdict(dict)

    # ---- task groups -------------------------------------------------------------------------
    def group_begin(self, stream: StreamState) -> None:
        if stream.capture is None:
            raise CaptureViolation(f"graph_task_group_begin: {stream} is not capturing")
        if stream.open_group is not None:
            raise CaptureViolation("graph_task_group_begin: a task group is already open")
        stream.open_group = []

    def group_end(self, stream: StreamState) -> GroupHandle:
        if stream.open_group is None:
            raise CaptureViolation(f"graph_task_group_end: no task group is open on {stream}")
        nodes, stream.open_group = stream.open_group, None
        if not nodes:
            raise CaptureViolation("graph_task_group_end: the group holds no task")
        graph = stream.capture
        return GroupHandle(graph, nodes, graph.generation)

    def update_begin(self, stream: StreamState, handle: GroupHandle) -> None:
        if stream.capture is not None:
            raise CaptureViolation("graph_task_update_begin on a capturing stream")
        if stream.updating is not None:
            raise CaptureViolation("graph_task_update_begin: the stream is already updating")
        if not isinstance(handle, GroupHandle) or handle.graph.generation != handle.generation \
                or handle.graph.status != "captured":
            raise CaptureViolation("graph_task_update_begin: the handle's graph was reset or "
                                   "is not captured")
        stream.updating = (handle, [])

    def update_end(self, stream: StreamState) -> None:
        if stream.updating is None:
            raise CaptureViolation("graph_task_update_end: the stream is not updating")
        (handle, works), stream.updating = stream.updating, None
        want = [handle.graph.nodes[i].label for i in handle.nodes]
        got = [w.label for w in works]
        if want != got:
            raise CaptureViolation(f"graph_task_update_end: the group holds {want}, the update "
                                   f"issued {got}")

        def apply() -> None:
            for index, work in zip(handle.nodes, works):
                handle.graph.nodes[index].run = work.run
        self.enqueue(Work("update", "task update", apply), stream)
        self.stats["task_updates"] += 1


# ---- device tensors ------------------------------------------------------------------------
_device: Device | None = None


def device() -> Device:
    if _device is None:
        raise RuntimeError("the NPU twin is not active: call pyruntime.npu_twin.activate()")
    return _device


def install_device(dev: Device) -> None:
    global _device
    _device = dev


def _storage_elements(shape, stride) -> int:
    if any(n == 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * st for n, st in zip(shape, stride))


def device_memory(shape, stride, dtype: torch.dtype) -> torch.Tensor:
    """Fresh device memory for a tensor of `shape` / `stride` / `dtype`: a host tensor filled
    with `POISON` (garbage until a kernel writes it), accounted in the device's
    `DeviceMemory` until its storage is freed.

    It is a normal tensor even under ``torch.inference_mode``: device memory is not an
    autograd object, and the device thread (outside inference mode) writes it; the tensor
    the caller sees (the `NpuTensor` around it) is the inference tensor, as on torch_npu.

    Raises:
        torch.OutOfMemoryError: it does not fit in the device (`pyruntime.npu_twin.memory`).
    """
    import numpy as np

    shape, stride = tuple(shape), tuple(stride)
    nbytes = _storage_elements(shape, stride) * dtype.itemsize
    with _normal_tensors():
        if nbytes == 0:
            return torch.empty_strided(shape, stride, dtype=dtype)
        dev = device()
        size = dev.memory.allocate(nbytes)
        block = np.full(nbytes, POISON, dtype=np.uint8)
        # the storage holds the only reference to the block: its release frees the block
        weakref.finalize(block, dev.memory.release, size)
        return torch.from_numpy(block).view(dtype).as_strided(shape, stride)


def _normal_tensors():
    """Outside ``torch.inference_mode`` for the tensors made inside (a no-op when off)."""
    return torch.inference_mode(False) if torch.is_inference_mode_enabled() \
        else contextlib.nullcontext()


class NpuTensor(torch.Tensor):
    """A tensor on a twin device (``npu:<index>``): a wrapper around the CPU tensor that is
    its device memory. Every aten op on it passes `__torch_dispatch__`, which queues it on
    the current stream of its device (or records it into the capturing graph)."""

    _inner: torch.Tensor
    _index: int

    @staticmethod
    def __new__(cls, inner: torch.Tensor, index: int = 0):
        out = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, device=torch.device("npu", index), requires_grad=False)
        out._inner = inner
        out._index = index
        return out

    def __repr__(self) -> str:
        return (f"NpuTensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"device='npu:{self._index}')")

    # host access: what torch does for a non-CPU tensor
    def numpy(self, *args, **kwargs):
        raise TypeError(f"can't convert npu:{self._index} device type tensor to numpy. Use "
                        "Tensor.cpu() to copy the tensor to host memory first.")

    def __array__(self, *args, **kwargs):
        return self.numpy()

    def tolist(self):
        return self.cpu().tolist()

    def data_ptr(self) -> int:
        return self._inner.data_ptr()

    def untyped_storage(self):
        return self._inner.untyped_storage()

    def is_pinned(self, *args) -> bool:
        return False

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


# ---- the two tensor layers --------------------------------------------------------------------
# A twin tensor is either a plain ``torch.Tensor`` on the PrivateUse1 device ``npu`` (the
# default: `pyruntime.npu_twin.plain_tensors`) or an `NpuTensor` (the wrapper layer, chosen by
# ``AICPU_TILING_TWIN_TENSORS=wrapper``). The
# rules above and below see both through these functions: `is_npu_tensor`, `index_of`, `inner`
# (the host memory a device task reads and writes) and `new_device_tensor`. The plain layer
# sets `_plain_host_alias` when it activates.
_plain_host_alias: Callable[[torch.Tensor], torch.Tensor] | None = None


def is_npu_tensor(value: Any) -> bool:
    """Whether `value` is a twin device tensor, of either layer."""
    if isinstance(value, NpuTensor):
        return True
    return _plain_host_alias is not None and isinstance(value, torch.Tensor) \
        and value.device.type == "npu"


def refuse_host_tensors(op: str, *values: Any) -> None:
    """`HostPointerError` if any of an op's arguments is a host tensor (a pointer the AI Core
    cannot read); values that are not tensors (None, numbers, lists) pass."""
    # by device type, not by tensor class: both tensor layers say ``device.type == "npu"``
    for value in values:
        if isinstance(value, torch.Tensor) and value.device.type != "npu":
            raise HostPointerError(f"{op}: every tensor must be on the NPU")


def op_refused(op: str, message: str) -> RuntimeError:
    """The error an op raises for a call its documented rules refuse: a RuntimeError (what
    torch_npu's and the kernels' TORCH_CHECKs raise) whose message starts with the op."""
    return RuntimeError(f"{op}: {message}")


def index_of(value: torch.Tensor) -> int:
    """The device index of a twin tensor (`is_npu_tensor`)."""
    return value._index if isinstance(value, NpuTensor) else value.device.index


def inner(value: Any) -> Any:
    """The host tensor that is a twin tensor's device memory (same bytes, shape, strides and
    storage offset); anything else as it is."""
    if isinstance(value, NpuTensor):
        return value._inner
    if _plain_host_alias is not None and isinstance(value, torch.Tensor) \
            and value.device.type == "npu":
        return _plain_host_alias(value)
    return value


def new_device_tensor(shape, stride, dtype: torch.dtype, index: int) -> torch.Tensor:
    """A fresh twin tensor on ``npu:index`` (garbage until a task writes it), of the active
    layer; its memory is accounted on that device."""
    if _plain_host_alias is not None:
        return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype,
                                   device=torch.device("npu", index))
    return NpuTensor(device_memory(shape, stride, dtype), index)


def _is_host_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not is_npu_tensor(value) \
        and value.device.type == "cpu" and value.dim() > 0


def _meta(value: Any) -> Any:
    if is_npu_tensor(value):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0:
        return value  # a host scalar tensor: allowed, frozen like a scalar
    return value


_METADATA_OPS = {"aten::detach", "aten::alias", "aten::lift_fresh", "aten::_unsafe_view"}
_aten = torch.ops.aten
_ALLOCATING_OPS = (_aten.empty_like.default, _aten.new_empty.default,
                   _aten.new_empty_strided.default)


def _device_of(func, args, kwargs) -> int:
    """The device an op runs on: its npu tensors' (torch's same-device rule), else the
    current one."""
    found = sorted({index_of(t) for t in pytree.tree_leaves((args, kwargs))
                    if is_npu_tensor(t)})
    if len(found) > 1:
        raise RuntimeError(f"{func}: Expected all tensors to be on the same device, but found "
                           f"at least two devices, npu:{found[0]} and npu:{found[1]}!")
    return found[0] if found else device().current_device()


#: the libraries whose NPU kernels our extension (libaicpu_tiling_npu.so) registers: their
#: composite bodies are CPU references that must not run on device memory
_EXTENSION_NAMESPACES = frozenset({"aicpu_tiling"})


def _dispatch(func, args, kwargs):
    dev = device()
    name = func._schema.name
    if func.namespace != "aten":
        # a custom op (ours): its PrivateUse1 kernel, as torch_npu dispatches it
        dev.check_alive()
        if dev.aicore_body == "reference" and str(func) in REFERENCE_BODIES:
            return _queue_reference_body(dev, func, args, kwargs)
        if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "PrivateUse1") \
                and func.namespace not in _EXTENSION_NAMESPACES \
                and torch._C._dispatch_has_kernel_for_dispatch_key(
                    func.name(), "CompositeExplicitAutograd"):
            # another library's Python custom op (torch.library.custom_op without device
            # types: its one kernel is CompositeExplicitAutograd, which torch's dispatcher
            # computes into every backend's entry, PrivateUse1 included), e.g. vLLM-Ascend
            # 0.30's _vllm_ascend_lora::lora_linear (lora/lora_ops.py): on an NPU its Python
            # body runs on the npu tensors, and so here, its ops dispatched as any others
            return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1),
                                   *args, **kwargs)
        if not torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "PrivateUse1"):
            # torch would fall back to the op's composite (CPU) body, on device memory
            raise TwinError(f"{func.name()} has no NPU (PrivateUse1) kernel: the extension "
                            "that registers it is not loaded (torch.ops.load_library of "
                            "libaicpu_tiling_npu.so)")
        return func.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1),
                               *args, **kwargs)
    if _decomposes(func):
        # a CompositeImplicitAutograd op with no NPU kernel runs its composite body on every
        # backend (torch's dispatcher: the alias key fills the backend's entry; torch_npu
        # registers none for these): normally at the Autograd key, before this point;
        # under torch.inference_mode (vLLM's execute_model) the Autograd keys are skipped
        # and it arrives here undecomposed. Queued as is it would run on the inner CPU
        # tensors: x.cpu() (aten::to.dtype_layout) gave an npu tensor, silently
        return func.decompose(*args, **kwargs)
    if func.is_view or name in _METADATA_OPS:
        index = _device_of(func, args, kwargs)
        out = func(*pytree.tree_map(inner, args), **pytree.tree_map(inner, kwargs))
        # a view of a normal tensor is a normal tensor under inference mode too (torch's
        # ADInplaceOrView still runs for it and shares the base's version counter, which
        # an inference tensor cannot take); a view of an inference tensor is one
        from_inference = any(isinstance(t, NpuTensor) and t.is_inference()
                             for t in pytree.tree_leaves(args))
        with contextlib.nullcontext() if from_inference else _normal_tensors():
            return pytree.tree_map(
                lambda t: NpuTensor(t, index) if isinstance(t, torch.Tensor) else t, out)
    target = _target_device(func, kwargs)
    if target == "meta":
        # to("meta") / empty_like(device="meta"): a meta tensor, metadata only; torch's
        # _to_copy allocates on the target and copy_ into a meta tensor reads no data
        # (aten/src/ATen/native/TensorConversions.cpp _to_copy, Copy.cpp copy_impl)
        return func(*pytree.tree_map(_meta, args), **kwargs)
    if target == "cpu" and func is _aten._to_copy.default:
        return _device_to_host(args[0], kwargs)
    if func is _aten._local_scalar_dense.default:
        return _device_to_host(args[0], {}).item()
    if func is _aten.copy_.default:
        return _copy(args[0], args[1], bool(args[2]) if len(args) > 2 else
                     bool(kwargs.get("non_blocking", False)))
    if func in (_aten.is_pinned.default,):
        return False
    if func in _SHAPE_FROM_VALUES_OPS:
        return _run_shape_from_values(dev, func, args, kwargs)
    if func in _ALLOCATING_OPS:  # memory only: no device work, garbage until written
        index = _device_of(func, args, kwargs)
        dev.ensure_context(index)
        meta = func(*pytree.tree_map(_meta, args), **pytree.tree_map(_meta, kwargs))
        return NpuTensor(device_memory(meta.shape, meta.stride(), meta.dtype), index)
    return _queue_op(dev, func, args, kwargs)


_DECOMPOSES: dict[Any, bool] = {}


def _decomposes(func) -> bool:
    """The op has a CompositeImplicitAutograd kernel and no NPU (PrivateUse1) one."""
    known = _DECOMPOSES.get(func)
    if known is None:
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        known = has(func.name(), "CompositeImplicitAutograd") and \
            not has(func.name(), "PrivateUse1")
        _DECOMPOSES[func] = known
    return known


def _target_device(func, kwargs) -> str | None:
    """The device type a conversion or allocating op names (``device=``), else None."""
    if func is not _aten._to_copy.default and func not in _ALLOCATING_OPS:
        return None
    target = kwargs.get("device")
    return None if target is None else torch.device(target).type


#: our AI Core ops whose CPU implementation (the C reference attention) may stand in for
#: the Triton body (``AICPU_TILING_TWIN_AICORE=reference``: minutes instead of hours for the
#: self-check's attention checks; the Triton bodies run under ``triton``)
REFERENCE_BODIES = ("aicpu_tiling.paged_attention.default",
                    "aicpu_tiling.attention_combine.default",
                    "aicpu_tiling.mla_attention.default",
                    "aicpu_tiling.mla_combine.default")


def _queue_reference_body(dev: Device, func, args, kwargs) -> None:
    for value in pytree.tree_leaves((args, kwargs)):
        if _is_host_tensor(value):
            raise HostPointerError(f"{func}: a host tensor handed to an AI Core kernel")
    inner_args, inner_kwargs = pytree.tree_map(inner, args), pytree.tree_map(inner, kwargs)
    writes = tuple(inner(t) for t in _written_arguments(func, args, kwargs).values()
                   if is_npu_tensor(t))

    def run() -> None:
        from pyruntime.kernels.kernel import AttentionKernelError

        try:
            func(*inner_args, **inner_kwargs)
        except AttentionKernelError as exc:
            # the CPU body raises on a status the device kernel only writes to its status
            # buffer (the Triton body never raises): keep it as the task's status
            dev.stats["aicore_status_errors"] += 1
            dev.last_aicore_status = f"{func}: {exc}"
    dev.enqueue(Work("aicore", f"{func} (C reference body)", run, writes=writes),
                dev.current_stream(_device_of(func, args, kwargs)))


def _device_to_host(src: torch.Tensor, kwargs) -> torch.Tensor:
    dev = device()
    dev.refuse_in_capture("a device-to-host copy (.cpu(), .item(), .tolist(), .numpy())")
    dev.synchronize_stream(dev.current_stream(index_of(src)), "a device-to-host copy",
                           counted_as="copies_d2h")
    kwargs = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking")}
    return _aten._to_copy.default(inner(src), **kwargs)


#: data pointers of the host storages made by ``pin_memory()`` (page-locked on torch_npu)
_pinned: set[int] = set()


#: on plain tensors, whether a host data pointer is a block of the extension's pinned
#: allocator (torch's C++ pin_memory=True, e.g. a non_blocking ``.to("cpu")``); set by
#: `pyruntime.npu_twin.plain_tensors.activate`
_plain_is_pinned_ptr = None


def _is_pinned(tensor: torch.Tensor) -> bool:
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return False
    ptr = tensor.untyped_storage().data_ptr()
    return ptr in _pinned or (_plain_is_pinned_ptr is not None and _plain_is_pinned_ptr(ptr))


def install_pinned_memory() -> None:
    """``Tensor.pin_memory()`` / ``is_pinned()`` for host tensors, as torch_npu provides them
    (its ``CachingHostAllocator``, registered as the PrivateUse1 pinned-memory allocator,
    which torch's Python PrivateUse1 hooks cannot register): a page-locked copy. A
    ``non_blocking`` copy from it is ordered on the stream and the allocator keeps the block
    alive until the copy has run (it records an event on the block,
    ``torch_npu/csrc/core/npu/CachingHostAllocator.cpp``), so only a rewrite before the copy
    runs is a race."""
    original_pin, original_is_pinned = torch.Tensor.pin_memory, torch.Tensor.is_pinned

    def pin_memory(self, device=None):
        if self.device.type != "cpu":
            return original_pin(self, device) if device is not None else original_pin(self)
        if _is_pinned(self):
            return self
        pinned = self.detach().clone()
        storage = pinned.untyped_storage()
        _pinned.add(storage.data_ptr())
        weakref.finalize(pinned, _pinned.discard, storage.data_ptr())
        return pinned

    def is_pinned(self, device=None):
        if self.device.type == "cpu":
            return _is_pinned(self)
        return original_is_pinned(self) if device is None else original_is_pinned(self, device)

    torch.Tensor.pin_memory = pin_memory
    torch.Tensor.is_pinned = is_pinned
    _install_pinned_factories()


#: the factories vLLM and vLLM-Ascend call with ``pin_memory=True`` (CpuGpuBuffer,
#: async_tensor_h2d, the rejection sampler, the MLA metadata builder, model_runner_v1's
#: staging) and their relatives
PINNED_FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange", "empty_like",
                    "zeros_like", "ones_like", "full_like", "empty_strided", "rand", "randn",
                    "randint", "linspace")


def _install_pinned_factories() -> None:
    """``torch.zeros(..., pin_memory=True)`` and the other factories on the host: torch
    allocates through the accelerator's pinned-memory allocator (``PrivateUse1HooksInterface
    ::getPinnedMemoryAllocator``, torch_npu's ``CachingHostAllocator``), which torch's Python
    PrivateUse1 hooks cannot provide (torch raises NotImplementedError). The twin makes the
    tensor on the host, then pins it as ``Tensor.pin_memory()`` does. A factory for another
    device passes ``pin_memory`` through (torch refuses to pin non-CPU tensors itself)."""
    import functools

    from torch.utils import _device

    # ``with torch.device("npu"):`` matches factories by identity in this set: fill it with
    # torch's own functions before they are wrapped (the wrapper calls them)
    _device._device_constructors()
    for name in PINNED_FACTORIES:
        original = getattr(torch, name)

        def factory(*args, __original=original, pin_memory=False, **kwargs):
            target = kwargs.get("device")
            if not pin_memory or (target is not None and torch.device(target).type != "cpu"):
                if pin_memory:
                    kwargs["pin_memory"] = pin_memory
                return __original(*args, **kwargs)
            return __original(*args, **kwargs).pin_memory()

        setattr(torch, name, functools.wraps(original)(factory))


def _copy(dst: Any, src: Any, non_blocking: bool):
    dev = device()
    if dst.numel() == 0:
        # torch_npu's copy_ returns at once for an empty destination: no copy is queued,
        # nothing synchronises, no host memory is read (Ascend/pytorch
        # torch_npu/csrc/aten/ops/op_api/CopyKernelOpApi.cpp, NPUNativeOpApiFunctions::copy_)
        return dst
    if not is_npu_tensor(dst):  # device to host into an existing host tensor
        dst.copy_(_device_to_host(src, {}))
        return dst
    if is_npu_tensor(src):
        if index_of(src) != index_of(dst):
            raise TwinError(f"a copy from npu:{index_of(src)} to npu:{index_of(dst)}: copies "
                            "between devices are not modelled by the NPU twin")
        return _queue_op(dev, _aten.copy_.default, (dst, src, non_blocking), {})
    if not isinstance(src, torch.Tensor):
        raise TypeError(f"copy_ from {type(src).__name__}")
    dev.refuse_in_capture("a host-to-device copy (it would freeze a host address in the "
                          "graph)")
    target, stream = inner(dst), dev.current_stream(index_of(dst))
    if not non_blocking:
        source = src.detach()
        dev.enqueue(Work("copy", "H2D copy", lambda: target.copy_(source), writes=(target,)),
                    stream)
        dev.synchronize_stream(stream, "a blocking host-to-device copy",
                               counted_as="copies_h2d_blocking")
        return dst
    # asynchronous: the copy reads the host memory when it runs; a pinned block is kept
    # alive until then by the host allocator, a pageable tensor is not
    snapshot = src.detach().clone()
    pinned = _is_pinned(src)
    alive = (lambda kept=src: kept) if pinned else weakref.ref(src)
    kind = "pinned" if pinned else "pageable"
    where = "".join(traceback.format_stack(limit=8)[:-3][-3:]).rstrip()

    def run_async() -> None:
        source = alive()
        if source is None:
            raise PageableCopyRace("a non_blocking host-to-device copy ran after its pageable "
                                   f"source tensor was freed; issued at:\n{where}")
        if not torch.equal(source, snapshot):
            raise PageableCopyRace(f"a non_blocking host-to-device copy ran after its {kind} "
                                   f"source was rewritten; issued at:\n{where}")
        target.copy_(source)
    dev.enqueue(Work("copy", "H2D copy (non_blocking)", run_async, writes=(target,)), stream)
    return dst


#: ops whose output shapes depend on their input values. torch_npu runs them synchronously:
#: op-plugin ``op_plugin/ops/opapi/UniqueConsecutiveKernelNpuOpApi.cpp`` launches
#: ``EXEC_NPU_CMD_SYNC(aclnnUniqueConsecutive, ...)`` (the stream synchronized before it
#: returns) and resizes its outputs to the shapes the kernel reports (``aclGetViewShape``).
#: vLLM's LoRA metadata calls it on device tensors (``vllm/lora/punica_wrapper/utils.py``
#: ``compute_meta``)
_SHAPE_FROM_VALUES_OPS = frozenset({_aten.unique_consecutive.default})


def _run_shape_from_values(dev: Device, func, args, kwargs):
    """Run `func` as torch_npu does (`_SHAPE_FROM_VALUES_OPS`): the current stream of its
    device synchronized (a host wait, counted as a synchronize; refused while a graph
    captures), the op on the device memory, its outputs new device memory of the shapes it
    produced."""
    for value in pytree.tree_leaves((args, kwargs)):
        if _is_host_tensor(value):
            raise HostPointerError(f"{func}: a host tensor of shape {tuple(value.shape)} among "
                                   "npu tensors (Expected all tensors to be on the same device)")
    index = _device_of(func, args, kwargs)
    dev.ensure_context(index)
    dev.synchronize_stream(dev.current_stream(index), f"{func} (a synchronous op: its output "
                           "shape comes from the values)")
    got = func(*pytree.tree_map(inner, args), **pytree.tree_map(inner, kwargs))

    def to_device(t):
        if not isinstance(t, torch.Tensor):
            return t
        out = new_device_tensor(t.shape, t.stride(), t.dtype, index)  # either tensor layer
        inner(out).copy_(t)
        return out

    return pytree.tree_map(to_device, got)


def _queue_op(dev: Device, func, args, kwargs):
    """Queue a plain aten op: outputs are allocated now (shapes from the meta kernel), filled
    when the op runs on its stream; an in-place or ``out=`` op returns its argument."""
    for value in pytree.tree_leaves((args, kwargs)):
        if _is_host_tensor(value):
            raise HostPointerError(f"{func}: a host tensor of shape {tuple(value.shape)} among "
                                   "npu tensors (Expected all tensors to be on the same device)")
    index = _device_of(func, args, kwargs)
    dev.ensure_context(index)
    meta_out = func(*pytree.tree_map(_meta, args), **pytree.tree_map(_meta, kwargs))
    single = not isinstance(meta_out, (tuple, list))
    metas = [meta_out] if single else list(meta_out)
    aliased = _written_arguments(func, args, kwargs)
    results, fresh = [], []  # fresh: (position, host buffer) of outputs the op allocates
    for position, (meta, ret) in enumerate(zip(metas, func._schema.returns)):
        alias = ret.alias_info
        target = next((aliased[s] for s in (alias.before_set if alias else ()) if s in aliased),
                      None)
        if target is not None or not isinstance(meta, torch.Tensor):
            results.append(target if target is not None else meta)
            continue
        out = new_device_tensor(meta.shape, meta.stride(), meta.dtype, index)
        fresh.append((position, inner(out)))
        results.append(out)
    for alias_set, target in aliased.items():
        meta_arg = _meta(target)
        for meta, ret in zip(metas, func._schema.returns):
            if ret.alias_info and alias_set in ret.alias_info.before_set and \
                    isinstance(meta, torch.Tensor) and meta.shape != meta_arg.shape:
                if _plain_host_alias is not None:
                    # torch's out= contract (at::native::resize_output) resizes the output
                    # when the op is called; a plain tensor can be resized (its storage grows
                    # at once, its contents are written when the op runs)
                    target.resize_(meta.shape)
                    continue
                raise TwinError(f"{func} resizes its out= argument from {tuple(meta_arg.shape)} "
                                f"to {tuple(meta.shape)}: not modelled by the NPU twin (allocate "
                                "the output at its size)")
    # host values are taken when the op is issued (a CPU scalar tensor included), and a
    # captured op keeps them: replay runs with what capture saw
    inner_args, inner_kwargs = pytree.tree_map(_issued, args), pytree.tree_map(_issued, kwargs)
    generator = _generator_argument(func)
    if generator is not None and inner_kwargs.get(generator) is None:
        inner_kwargs[generator] = dev.generator  # the device's, as torch_npu's random ops
    writes = tuple(inner(t) for t in aliased.values() if is_npu_tensor(t)) + \
        tuple(buf for _, buf in fresh)

    def run() -> None:
        got = func(*inner_args, **inner_kwargs)
        got = [got] if single else list(got)
        for position, buf in fresh:
            buf.copy_(got[position])

    dev.enqueue(Work("op", str(func), run, writes=writes), dev.current_stream(index))
    return results[0] if single else type(meta_out)(results)


_GENERATOR_ARGUMENT: dict[Any, str | None] = {}


def _generator_argument(func) -> str | None:
    """The name of the op's keyword-only ``Generator?`` argument (a random op), or None."""
    if func not in _GENERATOR_ARGUMENT:
        _GENERATOR_ARGUMENT[func] = next(
            (a.name for a in func._schema.arguments
             if a.kwarg_only and "Generator" in str(a.type)), None)
    return _GENERATOR_ARGUMENT[func]


def _issued(value: Any) -> Any:
    if is_npu_tensor(value):
        return inner(value)
    if isinstance(value, torch.Tensor):  # a 0-dim host tensor (others are refused)
        return value.detach().clone()
    return value


def _written_arguments(func, args, kwargs) -> dict[str, torch.Tensor]:
    """Alias set -> the argument an op writes (``Tensor(a!) self``, ``out``)."""
    found = {}
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = kwargs.get(arg.name, args[i] if i < len(args) else None)
            for alias_set in arg.alias_info.before_set:
                found[alias_set] = value
    return found


# ---- allocation (PrivateUse1 kernels of the factory ops) ------------------------------------
def empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None,
                        memory_format=None):
    index = _allocating(device)
    size = tuple(size)
    contiguous = [1] * len(size)
    for i in range(len(size) - 2, -1, -1):
        contiguous[i] = contiguous[i + 1] * max(size[i + 1], 1)
    return NpuTensor(device_memory(size, contiguous, dtype or torch.get_default_dtype()), index)


def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    index = _allocating(device)
    return NpuTensor(device_memory(size, stride, dtype or torch.get_default_dtype()), index)


def _allocating(where: Any = None) -> int:
    """The device an allocation lands on (``npu:k``, else the current device), whose context
    it creates (torch_npu sets the device lazily at the first allocation)."""
    dev = device()
    index = torch.device(where).index if where is not None else None
    index = dev.current_device() if index is None else dev.checked(index)
    dev.ensure_context(index)
    return index


def to_copy(src, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    """``cpu_tensor.to("npu")``: allocate on the device, then a host-to-device copy."""
    target = torch.device(device) if device is not None else torch.device("npu")
    if target.type == "cpu":
        return _device_to_host(src, {"dtype": dtype})
    host = src.to(dtype or src.dtype).contiguous()
    out = empty_strided(host.shape, host.stride(), dtype=host.dtype, device=target)
    _copy(out, host, non_blocking)
    return out


def register_factories(library: torch.library.Library) -> None:
    library.impl("empty.memory_format", empty_memory_format, "PrivateUse1")
    library.impl("empty_strided", empty_strided, "PrivateUse1")
    library.impl("_to_copy", to_copy, "PrivateUse1")
