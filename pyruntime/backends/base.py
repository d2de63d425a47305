"""The backend contract: the base class validates and counts; a backend implements hooks.

Public operations (all validated here, then forwarded to a ``_hook``):

- device buffers: `alloc(shape, dtype)`, `free(buf)`; host-to-device `copy_h2d(dst, src)`;
- streams and events: `stream()`, `current_stream()`, `event()`, `external_event()`,
  `synchronize()`;
- graphs: `graph()`, `capture(graph, stream)` (a context manager), `replay` via the
  graph handle; task groups `graph_task_group_begin/end(stream)` and updates
  `graph_task_update_begin(stream, group)` / `graph_task_update_end(stream)`;
- launches: `launch(kernel, args, num_cores=..., stream=...)` for AI-CPU and AI Core;
- `plan_on_host(...)`: the host tiling call of the host-update path, counted.

A hook may raise a `BackendError` subclass, which passes through; any other exception
from a hook is wrapped in `BackendError` naming the operation and the backend.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .errors import (
    BackendError,
    CaptureError,
    DeviceBufferError,
    EventError,
    LaunchError,
    TaskUpdateError,
)
from .handles import (
    AICORE,
    AICPU,
    Event,
    ExternalEvent,
    Graph,
    GraphState,
    Kernel,
    Stream,
    Task,
    TaskGroup,
)

_NUMPY_TO_TORCH = {np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
                   np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
                   np.dtype(np.uint8): torch.uint8}


@dataclasses.dataclass
class Counters:
    """Host-side counts, for tests, the profiler and the bench's per-step invariants (reset
    with `reset()`).

    ``copies_h2d`` counts every host-to-device copy, ``copies_h2d_blocking`` those of them
    the host waits for (``copy_h2d(..., blocking=True)``: torch_npu's ``copy_`` without
    ``non_blocking``, which synchronises the current stream first). ``synchronizes`` counts
    every host wait the backend performs: `Backend.synchronize`, `Stream.synchronize`,
    `Event.synchronize`, and a backend's own waits inside its hooks (the NPU backend's wait
    for a staging block's previous copy). ``event_records`` / ``event_waits`` count event
    records and waits enqueued on a stream (external events included).
    """

    launches_aicpu: int = 0
    launches_aicore: int = 0
    task_updates: int = 0
    host_tiling_calls: int = 0
    replays: int = 0
    copies_h2d: int = 0
    copies_h2d_blocking: int = 0
    synchronizes: int = 0
    event_records: int = 0
    event_waits: int = 0

    def reset(self) -> None:
        for field in dataclasses.fields(self):
            setattr(self, field.name, 0)

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def _wrapped(op: str):
    """Wrap non-backend exceptions raised by a hook into a BackendError naming `op`."""

    def decorate(method):
        @functools.wraps(method)
        def call(self, *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except BackendError:
                raise
            except Exception as exc:
                raise BackendError(f"{op} failed on the {self.name} backend: "
                                   f"{type(exc).__name__}: {exc}") from exc
        return call
    return decorate


class Backend(abc.ABC):
    """Base of every backend. Subclasses implement the ``_hook`` methods only."""

    name = "abstract"
    #: the core count an attention kernel is captured with unless told otherwise
    default_num_cores = 8
    #: what the host_update baseline runs per layer: ``"emulated"`` (a host tiling plus our
    #: attention with the tiling and lengths by value, the CPU model of FIA) or ``"fia"``
    #: (torch_npu's FIA with host length lists, as vLLM-Ascend calls it)
    host_update_attention = "emulated"

    def __init__(self) -> None:
        self.counters = Counters()
        self._buffers: dict[int, tuple[int, ...]] = {}
        self._frees = 0  # bumped by every free: replay re-checks its buffers only after one
        self._capturing: dict[int, Graph] = {}
        self._default: Stream | None = None

    # ---- buffers and copies -------------------------------------------------------------
    @_wrapped("alloc")
    def alloc(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Allocate a zero-filled device buffer of `shape` and `dtype`."""
        shape = tuple(int(n) for n in shape)
        if any(n < 0 for n in shape) or not isinstance(dtype, torch.dtype):
            raise DeviceBufferError(f"alloc needs non-negative sizes and a torch dtype, "
                                    f"got shape {shape} and dtype {dtype!r}")
        buf = self._alloc(shape, dtype)
        self._buffers[self._storage(buf)] = shape
        return buf

    def free(self, buf: torch.Tensor) -> None:
        """Free a buffer; a captured graph that uses it can no longer be replayed."""
        key = self._storage(buf)
        if key not in self._buffers:
            raise DeviceBufferError("free: this tensor is not a live buffer of the "
                                    f"{self.name} backend (freed twice?)")
        del self._buffers[key]
        self._frees += 1
        self._free(buf)

    def is_live(self, buf: torch.Tensor) -> bool:
        return self._storage(buf) in self._buffers

    @_wrapped("copy_h2d")
    def copy_h2d(self, dst: torch.Tensor, src: np.ndarray | torch.Tensor, *,
                 stream: Stream | None = None, blocking: bool = False) -> None:
        """Copy host `src` into device buffer `dst` on `stream`, asynchronously.

        `src` is staged at the call, so the caller may reuse it at once. Shapes and dtypes
        must match exactly. Not allowed while `stream` is capturing: a captured copy
        would freeze the host address; copy into static buffers before the replay.
        With ``blocking=True`` the host then waits for `stream` to drain, the copy
        included: what torch_npu's ``dst.copy_(src)`` without ``non_blocking`` costs
        (``copy_between_host_and_device``, see `Counters`); counted in
        ``copies_h2d_blocking``.
        """
        stream = self._resolve(stream)
        if stream.capturing is not None:
            raise CaptureError(f"copy_h2d on {stream} while it captures a graph: copy "
                               "into static buffers before replay instead")
        self._check_buffer("dst", dst)
        if isinstance(src, np.ndarray):
            src_dtype = _NUMPY_TO_TORCH.get(src.dtype)
            src = torch.from_numpy(np.array(src, copy=True, order="C"))
        else:
            src_dtype = src.dtype
            src = src.detach().clone()
        if tuple(src.shape) != tuple(dst.shape) or src_dtype != dst.dtype:
            raise DeviceBufferError(f"copy_h2d: source {tuple(src.shape)} {src_dtype} does "
                                    f"not match destination {tuple(dst.shape)} {dst.dtype}")
        self.counters.copies_h2d += 1
        self._copy_h2d(stream, dst, src)
        if blocking:
            self.counters.copies_h2d_blocking += 1
            self._stream_synchronize(stream)

    # ---- streams and events -------------------------------------------------------------
    def stream(self, name: str = "stream") -> Stream:
        """A new stream."""
        return Stream(self, self._new_stream(name), name)

    def current_stream(self) -> Stream:
        """The default stream (``torch.npu.current_stream()``)."""
        if self._default is None:
            self._default = Stream(self, self._default_stream(), "default")
        return self._default

    def event(self) -> Event:
        return Event(self, self._new_event(external=False))

    def external_event(self) -> ExternalEvent:
        return ExternalEvent(self, self._new_event(external=True))

    def synchronize(self) -> None:
        """Block until every stream of this backend is idle."""
        if self._capturing:
            raise CaptureError("synchronize() while a graph is capturing")
        self.counters.synchronizes += 1
        self._synchronize()

    def hold_device(self) -> contextlib.AbstractContextManager[None]:
        """``with backend.hold_device():`` the device starts no work while the host does
        the work being measured; host-side synchronizes inside still wait for the device.

        Where the device does not run on the host's CPU (an NPU) this is a no-op: the
        base returns a null context. The CPU backend, whose streams are threads on the
        host's cores, holds them (see `CpuBackend.hold_device`), so that host time measured
        inside is the host's own work and not the emulated device's interference.
        """
        return contextlib.nullcontext()

    def release_stream(self, stream: Stream) -> None:
        """Give back a stream made by `stream()` once its work is done (on the CPU backend,
        its worker thread ends after running what was enqueued); it must not be used again.
        Idempotent. The owner of the stream calls it (e.g. `StaticAttention.close`).

        Raises:
            CaptureError: the stream is capturing or updating.
        """
        stream = self._resolve(stream)
        if stream.capturing is not None or stream.updating is not None:
            raise CaptureError(f"release_stream: {stream} is capturing or updating")
        self._release_stream(stream)

    def close(self) -> None:
        """Release the backend's own threads and resources; unusable after. Idempotent.

        The base holds none; a backend that does overrides this.
        """

    def stream_synchronize(self, stream: Stream) -> None:
        if stream.capturing is not None:
            raise CaptureError(f"synchronize of {stream} while it captures a graph")
        self.counters.synchronizes += 1
        self._stream_synchronize(stream)

    def event_record(self, event: Event, stream: Stream | None) -> None:
        stream = self._resolve(stream)
        graph = stream.capturing
        event.captured_in = graph
        if graph is not None and stream is not graph.stream:
            graph.last_side_record[stream.id] = event
        self.counters.event_records += 1
        self._event_record(event, stream)

    def event_wait(self, event: Event, stream: Stream | None) -> None:
        stream = self._resolve(stream)
        graph = event.captured_in
        if not event.external and graph is not None and graph.state is GraphState.CAPTURING:
            if stream.capturing is None:  # the stream joins the capture (a fork)
                self._join_capture(graph, stream)
            elif stream.capturing is not graph:
                raise CaptureError(f"{stream} waits on an event of another capturing graph")
            if stream is graph.stream:
                graph.joined_events.add(event.id)
        elif stream.capturing is not None and not event.external:
            raise CaptureError(f"{stream} is capturing and waits on an event recorded "
                               "outside the capture: use an ExternalEvent for that")
        self._note_side_task(stream)
        self.counters.event_waits += 1
        self._event_wait(event, stream)

    def event_reset(self, event: Event, stream: Stream | None) -> None:
        if not event.external:
            raise EventError("only an ExternalEvent can be reset")
        stream = self._resolve(stream)
        self._note_side_task(stream)
        self._event_reset(event, stream)

    def event_synchronize(self, event: Event) -> None:
        if event.captured_in is not None:
            raise CaptureError("event.synchronize() on an event recorded during a capture")
        self.counters.synchronizes += 1
        self._event_synchronize(event)

    # ---- graphs -------------------------------------------------------------------------
    def graph(self) -> Graph:
        """A new, empty graph (``torch.npu.NPUGraph()``)."""
        return Graph(self, self._new_graph())

    @contextlib.contextmanager
    def capture(self, graph: Graph, stream: Stream | None = None) -> Iterator[Graph]:
        """``with backend.capture(g, s):`` like ``torch.npu.graph(g, stream=s)``."""
        graph.capture_begin(stream)
        try:
            yield graph
        except BaseException:
            self._abort_capture(graph)
            raise
        graph.capture_end()

    def capture_begin(self, graph: Graph, stream: Stream | None) -> None:
        stream = self._resolve(stream)
        if graph.state is not GraphState.EMPTY:
            raise CaptureError(f"capture_begin on a graph that is {graph.state.value}; "
                               "expected an empty graph (call reset() first)")
        if stream.capturing is not None or stream.updating is not None:
            raise CaptureError(f"capture_begin: {stream} is already capturing or updating")
        graph.state, graph.stream = GraphState.CAPTURING, stream
        stream.capturing = graph
        self._capturing[graph.id] = graph
        self._capture_begin(graph, stream)

    def capture_end(self, graph: Graph) -> None:
        if graph.state is not GraphState.CAPTURING:
            raise CaptureError(f"capture_end on a graph that is {graph.state.value}; "
                               "expected capturing")
        streams = [graph.stream, *graph.side_streams.values()]
        problem = None
        if any(s.open_group is not None for s in streams):
            problem = "a task group was begun but not ended"
        elif graph.task_count == 0:
            problem = "captured nothing: no task was launched between begin and end"
        else:
            for side in graph.side_streams.values():
                last = graph.last_side_record.get(side.id)
                if last is None or last.id not in graph.joined_events:
                    problem = (f"{side} joined the capture but was not joined back: record "
                               "an event on it last and wait on it from the capture stream")
        if problem:
            self._abort_capture(graph)
            raise CaptureError(f"capture_end: {problem}")
        self._leave_capture(graph)
        graph.state = GraphState.CAPTURED
        self._capture_end(graph)

    def replay(self, graph: Graph, stream: Stream | None) -> None:
        stream = self._resolve(stream)
        if graph.state is not GraphState.CAPTURED:
            raise CaptureError(f"replay of a graph that is {graph.state.value}; "
                               "expected captured")
        if stream.capturing is not None:
            raise CaptureError(f"replay on {stream} while it captures a graph")
        # O(buffers) = O(layers) per check, which a real replay never pays: check only when
        # some buffer was freed since this graph's last replay, so the emulated replay's
        # host cost stays one call whatever the graph size, like aclmdlRIExecuteAsync
        if graph.buffers_checked_at != self._frees:
            for key, arg in graph.buffers.items():
                if key not in self._buffers:
                    raise CaptureError(f"replay: buffer {arg!r} used by the graph was freed "
                                       "after capture; capture again with live buffers")
            graph.buffers_checked_at = self._frees
        self.counters.replays += 1
        self._replay(graph, stream)

    def graph_reset(self, graph: Graph) -> None:
        if graph.state is GraphState.CAPTURING:
            raise CaptureError("reset() of a graph that is capturing; end the capture first")
        for group in graph.groups:
            group.valid = False
        self._release_graph(graph)
        graph.__init__(self, self._new_graph())

    # ---- task groups and updates ----------------------------------------------------------
    def graph_task_group_begin(self, stream: Stream) -> None:
        """Start a task group on capturing `stream`; its launches become one group."""
        if stream.capturing is None:
            raise CaptureError(f"graph_task_group_begin: {stream} is not capturing")
        if stream.open_group is not None:
            raise CaptureError("graph_task_group_begin: a task group is already open")
        stream.open_group = []
        self._group_begin(stream)

    def graph_task_group_end(self, stream: Stream) -> TaskGroup:
        """End the open task group and return its handle."""
        tasks = stream.open_group
        if tasks is None:
            raise CaptureError(f"graph_task_group_end: no task group is open on {stream}")
        if not tasks:
            raise CaptureError("graph_task_group_end: the task group holds no task")
        stream.open_group = None
        group = TaskGroup(stream.capturing, tasks, self._group_end(stream))
        stream.capturing.groups.append(group)
        return group

    def graph_task_update_begin(self, stream: Stream, group: TaskGroup) -> None:
        """Start re-issuing `group`'s tasks on `stream` (which must not be capturing)."""
        if stream.capturing is not None:
            raise TaskUpdateError(f"graph_task_update_begin: update stream {stream} is "
                                  "capturing; CANN requires a non-capturing update stream")
        if not group.valid or group.graph.state is not GraphState.CAPTURED:
            raise TaskUpdateError("graph_task_update_begin: the group's graph was reset "
                                  "or is not captured")
        if stream.updating is not None:
            raise TaskUpdateError(f"graph_task_update_begin: {stream} is already updating "
                                  "a group; call graph_task_update_end first")
        if group.updater is not None:
            raise TaskUpdateError(f"graph_task_update_begin: the group is being updated "
                                  f"from {group.updater}; concurrent updates of one group "
                                  "are not allowed")
        self._update_begin(stream, group)
        stream.updating, stream.pending_update = group, []
        group.updater = stream

    def graph_task_update_end(self, stream: Stream) -> None:
        """Finish the update; it lands asynchronously, in `stream` order."""
        group = stream.updating
        if group is None:
            raise TaskUpdateError(f"graph_task_update_end: {stream} is not updating")
        tasks = stream.pending_update
        stream.updating, stream.pending_update, group.updater = None, [], None
        got = [t.signature for t in tasks]
        if got != group.signatures:
            raise TaskUpdateError(f"graph_task_update_end: the group holds "
                                  f"{len(group.signatures)} task(s) {group.signatures}, the "
                                  f"update issued {len(got)} task(s) {got}")
        self.counters.task_updates += 1
        self._update_end(stream, group, tasks)

    # ---- launches -----------------------------------------------------------------------
    @_wrapped("launch")
    def launch(self, kernel: Kernel, args: Mapping[str, Any], *, num_cores: int = 1,
               stream: Stream | None = None) -> None:
        """Launch `kernel` with `args` on `stream` (captured or recorded as an update
        when the stream is capturing or updating).

        Args:
            kernel: the kernel; AI-CPU kernels run as one task (`num_cores` must be 1).
            args: name -> live device buffer, numpy array (passed by value) or scalar.
            num_cores: AI Core cores the task spreads over (block dim).
        """
        # inline, not through `_freeze`: host_update launches twice per layer per step, and
        # its host work per layer is the baseline the device path is measured against
        stream = self._resolve(stream)
        if kernel.kind == AICPU and num_cores != 1:
            raise LaunchError(f"AI-CPU kernel {kernel.name!r} runs as one task, "
                             f"got num_cores={num_cores}")
        if kernel.kind == AICORE and num_cores < 1:
            raise LaunchError(f"AI Core kernel {kernel.name!r} needs num_cores >= 1")
        frozen = {}
        for key, value in args.items():
            if isinstance(value, torch.Tensor):
                self._check_buffer(key, value)
            elif isinstance(value, np.ndarray):
                value = np.array(value, copy=True)
            frozen[key] = value
        task = Task(kernel, frozen, int(num_cores))
        if kernel.kind == AICPU:
            self.counters.launches_aicpu += 1
        else:
            self.counters.launches_aicore += 1
        if stream.updating is not None:
            stream.pending_update.append(task)
        elif stream.capturing is not None:
            graph = stream.capturing
            graph.task_count += 1
            for key, value in frozen.items():
                if isinstance(value, torch.Tensor):
                    graph.buffers[self._storage(value)] = key
            if stream.open_group is not None:
                stream.open_group.append(task)
            self._note_side_task(stream)
        self._launch(stream, task)

    @_wrapped("make_task")
    def make_task(self, kernel: Kernel, args: Mapping[str, Any], *,
                  num_cores: int = 1) -> Task:
        """A launch checked and frozen once, for `launch_task` to issue every step: what
        `launch` does at each call (buffers checked live, by-value numpy arrays copied),
        done here once. A path that launches the same task every step (the pre-replay
        tiling task) saves that host work per step.

        Raises:
            LaunchError: a bad core count; DeviceBufferError: a buffer that is not live.
        """
        task = self._freeze(kernel, args, num_cores)
        task.checked_at = self._frees
        return task

    @_wrapped("launch")
    def launch_task(self, task: Task, *, stream: Stream | None = None) -> None:
        """`launch` of a `make_task` task: the same launch, counters and errors. Its buffers
        are checked live again only if some buffer was freed since the last check (as
        `replay` does), so a freed argument still raises `DeviceBufferError`; on a capturing
        or updating stream it is a plain `launch` of the task's kernel and arguments."""
        stream = self._resolve(stream)
        if stream.capturing is not None or stream.updating is not None:
            self.launch(task.kernel, task.args, num_cores=task.num_cores, stream=stream)
            return
        if task.checked_at != self._frees:
            for key, value in task.args.items():
                if isinstance(value, torch.Tensor):
                    self._check_buffer(key, value)
            task.checked_at = self._frees
        if task.kernel.kind == AICPU:
            self.counters.launches_aicpu += 1
        else:
            self.counters.launches_aicore += 1
        self._launch(stream, task)

    def _freeze(self, kernel: Kernel, args: Mapping[str, Any], num_cores: int) -> Task:
        """Check a launch and freeze its arguments (`launch`)."""
        if kernel.kind == AICPU and num_cores != 1:
            raise LaunchError(f"AI-CPU kernel {kernel.name!r} runs as one task, "
                             f"got num_cores={num_cores}")
        if kernel.kind == AICORE and num_cores < 1:
            raise LaunchError(f"AI Core kernel {kernel.name!r} needs num_cores >= 1")
        frozen = {}
        for key, value in args.items():
            if isinstance(value, torch.Tensor):
                self._check_buffer(key, value)
            elif isinstance(value, np.ndarray):
                value = np.array(value, copy=True)
            frozen[key] = value
        return Task(kernel, frozen, int(num_cores))

    def prepare_kernels(self) -> None:
        """Load what our device kernels need (once), before a capture launches them: loading
        the AI-CPU binary copies it to the device synchronously, which no capture allows.
        Nothing to do on the CPU backend."""

    def note_host_tiling(self) -> None:
        """Count a tiling computed on the host inside an op (FIA plans at every launch)."""
        self.counters.host_tiling_calls += 1

    def plan_on_host(self, params: Any, cu_seqlens_q: Any, seqlens_kv: Any, *,
                     causal: bool = True, epoch: int = 0) -> Any:
        """Compute a tiling on the host (what FIA does at every launch); counted."""
        from pyruntime import tiling

        self.counters.host_tiling_calls += 1
        return tiling.plan(params, cu_seqlens_q, seqlens_kv, causal=causal, epoch=epoch)

    # ---- internals ------------------------------------------------------------------------
    @staticmethod
    def _storage(buf: torch.Tensor) -> int:
        return buf.untyped_storage().data_ptr()

    def _check_buffer(self, name: str, buf: torch.Tensor) -> None:
        if self._storage(buf) not in self._buffers:
            raise DeviceBufferError(f"argument {name!r} is not a live device buffer of the "
                                    f"{self.name} backend; allocate it with backend.alloc")

    def _resolve(self, stream: Stream | None) -> Stream:
        if stream is None:
            return self.current_stream()
        if stream.backend is not self:
            raise BackendError(f"{stream} belongs to another backend")
        return stream

    def _join_capture(self, graph: Graph, stream: Stream) -> None:
        if stream.updating is not None:
            raise CaptureError(f"{stream} is updating and cannot join a capture")
        stream.capturing = graph
        graph.side_streams[stream.id] = stream
        self._join_hook(graph, stream)

    def _note_side_task(self, stream: Stream) -> None:
        graph = stream.capturing
        if graph is not None and stream is not graph.stream:
            graph.last_side_record[stream.id] = None

    def _leave_capture(self, graph: Graph) -> None:
        for s in [graph.stream, *graph.side_streams.values()]:
            s.capturing, s.open_group = None, None
        self._capturing.pop(graph.id, None)

    def _abort_capture(self, graph: Graph) -> None:
        if graph.state is GraphState.CAPTURING:
            self._leave_capture(graph)
            self._end_native_capture(graph)
            self._release_graph(graph)
            graph.__init__(self, self._new_graph())

    # ---- hooks ------------------------------------------------------------------------------
    @abc.abstractmethod
    def _alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor: ...
    def _free(self, buf: torch.Tensor) -> None:
        pass
    @abc.abstractmethod
    def _copy_h2d(self, stream: Stream, dst: torch.Tensor, src: torch.Tensor) -> None: ...
    @abc.abstractmethod
    def _new_stream(self, name: str) -> Any: ...
    @abc.abstractmethod
    def _default_stream(self) -> Any: ...
    @abc.abstractmethod
    def _new_event(self, *, external: bool) -> Any: ...
    @abc.abstractmethod
    def _synchronize(self) -> None: ...
    @abc.abstractmethod
    def _stream_synchronize(self, stream: Stream) -> None: ...
    @abc.abstractmethod
    def _event_record(self, event: Event, stream: Stream) -> None: ...
    @abc.abstractmethod
    def _event_wait(self, event: Event, stream: Stream) -> None: ...
    @abc.abstractmethod
    def _event_reset(self, event: Event, stream: Stream) -> None: ...
    @abc.abstractmethod
    def _event_synchronize(self, event: Event) -> None: ...
    @abc.abstractmethod
    def _new_graph(self) -> Any: ...
    @abc.abstractmethod
    def _capture_begin(self, graph: Graph, stream: Stream) -> None: ...
    def _join_hook(self, graph: Graph, stream: Stream) -> None:
        pass
    @abc.abstractmethod
    def _capture_end(self, graph: Graph) -> None: ...
    def _end_native_capture(self, graph: Graph) -> None:
        """Abort path: end the device's capture (before the graph is released)."""
    def _release_graph(self, graph: Graph) -> None:
        pass
    def _release_stream(self, stream: Stream) -> None:
        pass
    @abc.abstractmethod
    def _replay(self, graph: Graph, stream: Stream) -> None: ...
    @abc.abstractmethod
    def _group_begin(self, stream: Stream) -> None: ...
    @abc.abstractmethod
    def _group_end(self, stream: Stream) -> Any: ...
    @abc.abstractmethod
    def _update_begin(self, stream: Stream, group: TaskGroup) -> None: ...
    @abc.abstractmethod
    def _update_end(self, stream: Stream, group: TaskGroup, tasks: list[Task]) -> None: ...
    @abc.abstractmethod
    def _launch(self, stream: Stream, task: Task) -> None: ...
