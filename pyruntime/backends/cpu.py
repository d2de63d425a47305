"""The CPU backend: an executable model of ACL graph semantics that runs anywhere.

- Each stream is a `Worker` thread running its tasks in order, asynchronously to the host.
- Events order streams (counter per event); external events block a waiter until some
  stream records them, and refuse a second record before a reset.
- Capture records launches as graph nodes instead of running them. A stream that waits
  on an event recorded in the capture joins it (a fork); at replay its nodes run on a
  graph-owned worker, ordered against the replay stream by the captured events, and
  enqueued there once the replay stream reaches the graph (`CpuBackend._replay`).
  Replay is one host call and one queue submit whatever the graph size, like
  ``aclmdlRIExecuteAsync``.
- Task-group updates replace the group's tasks when the update stream reaches the
  update (asynchronously); a second stream may not update a group while an update of it
  is still in flight.
- AI-CPU tasks run their body once; AI Core tasks run their body for every core index,
  spread over a small thread pool (the C kernels release the GIL, so cores really run in
  parallel). With ``aicore="triton"`` an AI Core kernel that has a Triton body runs it
  instead, once per task: one interpreted launch of the whole grid, the code an NPU runs
  (slow: for tests).
- ``hold_device()`` keeps the streams from starting work while the host measures its
  own (`DeviceGate`): they share the host's cores, which an NPU never does.
- ``replay_aicpu=False`` models what one CANN design note says can happen (docs/design.md
  section 7): a captured AI-CPU task runs with the graph's first replay and is never re-run
  by later replays, so whatever it wrote stays frozen. AI-CPU tasks launched outside a
  capture are unaffected.

Device buffers are CPU torch tensors.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import threading
import time
from collections.abc import Callable

import torch

from .base import Backend
from .cpu_worker import COMPUTE_KINDS, DeviceGate, Timings, Worker
from .errors import BackendError, EventError, TaskUpdateError
from .handles import AICPU, Event, Graph, Stream, Task, TaskGroup


class _Slot:
    """A captured task; a task update swaps `task`."""

    __slots__ = ("task",)

    def __init__(self, task: Task) -> None:
        self.task = task


class _EventState:
    def __init__(self, external: bool) -> None:
        self.external = external
        self.pending = 0   # records enqueued by the host (plain events)
        self.done = 0      # records executed by the device (plain events)
        self.recorded = False  # external events


class _GraphState:
    def __init__(self) -> None:
        self.nodes: dict[int, list[tuple[str, str, Callable[[int], None]]]] = {}
        self.event_node: dict[int, int] = {}
        self.node_done: dict[int, int] = {}
        self.side_workers: dict[int, Worker] = {}
        self.replays = 0
        self.group_start: dict[int, int] = {}


class _GroupState:
    def __init__(self, slots: list[_Slot]) -> None:
        self.slots = slots
        self.inflight = 0
        self.stream_id: int | None = None


class CpuBackend(Backend):
    """The CPU backend. ``get("cpu")`` returns one.

    Args:
        num_threads: AI Core pool size (default: CPU count, at most 8).
        wait_timeout_s: how long a device-side wait may block before the task fails with
            `EventError` (an external event never recorded would otherwise hang forever).
        replay_aicpu: True (default): every replay re-runs the graph's captured AI-CPU
            tasks. False: they run on the first replay only and later replays skip them
            (the case the ``pre-replay`` tiling placement exists for).
        aicore: which body runs AI Core kernels: ``"c"`` (``Kernel.cpu_impl``, per core) or
            ``"triton"`` (``Kernel.triton_impl`` under Triton's interpreter, one launch per
            task; kernels without a Triton body keep their CPU body).

    Raises:
        ValueError: an unknown ``aicore``.
        BackendError: ``aicore="triton"`` without ``triton`` installed, or with triton
            already imported in compiled mode (set ``TRITON_INTERPRET=1`` first).
    """

    name = "cpu"
    default_num_cores = 8
    AICORE_BODIES = ("c", "triton")

    def __init__(self, *, num_threads: int | None = None, wait_timeout_s: float = 60.0,
                 replay_aicpu: bool = True, aicore: str = "c"):
        if aicore not in self.AICORE_BODIES:
            raise ValueError(f"aicore must be one of {self.AICORE_BODIES}, got {aicore!r}")
        if aicore == "triton":
            from pyruntime.kernels import triton_launch

            try:  # import the kernels now, interpreted, so a wrong set-up fails here
                triton_launch.kernels(interpret=True)
            except triton_launch.TritonUnavailableError as exc:
                raise BackendError(f"aicore='triton' needs Triton's interpreter: {exc}") from exc
        super().__init__()
        self.aicore = aicore
        self.replay_aicpu = bool(replay_aicpu)
        self.num_threads = num_threads or min(os.cpu_count() or 1, 8)
        self.wait_timeout_s = wait_timeout_s
        self.timings = Timings()
        self.gate = DeviceGate()
        self._cond = threading.Condition()
        self._closed = False
        self._workers: list[Worker] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(self.num_threads, "cpu-aicore")
        self._node_ids = itertools.count(1)

    def close(self) -> None:
        """Stop the worker threads and the core pool and join them; unusable after.

        Idempotent. Streams run what was enqueued first; a device-side wait still blocked
        fails at once with `EventError` instead of after `wait_timeout_s`.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # wake device-side waits so their workers can end
        for worker in self._workers:
            worker.close(self.wait_timeout_s)
        self._workers.clear()
        # wait=True: the lanes are C kernel bodies that never block, and joined threads are
        # what lets a caller count them gone (threading.active_count())
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ---- buffers ----------------------------------------------------------------------------
    def _alloc(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype)

    def _copy_h2d(self, stream, dst, src):
        stream.native.submit("copy", "copy_h2d", lambda: dst.copy_(src))

    # ---- streams and events -----------------------------------------------------------------
    def _new_stream(self, name):
        if self._closed:
            raise BackendError("the cpu backend was closed; make a new one with get('cpu')")
        worker = Worker(f"{name}-{len(self._workers)}", self.timings, self.gate)
        self._workers.append(worker)
        return worker

    def _default_stream(self):
        return self._new_stream("default")

    def _new_event(self, *, external):
        return _EventState(external)

    def _synchronize(self):
        for worker in list(self._workers):
            worker.synchronize()

    def _stream_synchronize(self, stream):
        stream.native.synchronize()

    def _wait_for(self, ready: Callable[[], bool], what: str) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: ready() or self._closed,
                                       timeout=self.wait_timeout_s):
                raise EventError(f"{what} did not happen within {self.wait_timeout_s} s")
            if not ready():
                raise EventError(f"{what} did not happen before the backend was closed")

    def _notify(self, change: Callable[[], None]) -> None:
        with self._cond:
            change()
            self._cond.notify_all()

    def _ext_record(self, state: _EventState) -> None:
        with self._cond:
            if state.recorded:
                raise EventError("ExternalEvent recorded again before it was reset")
            state.recorded = True
            self._cond.notify_all()

    def _ext_reset(self, state: _EventState) -> None:
        self._notify(lambda: setattr(state, "recorded", False))

    def _event_record(self, event: Event, stream: Stream) -> None:
        state = event.native
        if stream.capturing is not None:
            graph = stream.capturing.native
            if state.external:
                self._add_node(stream, "event", "external record",
                               lambda r: self._ext_record(state))
                return
            node = next(self._node_ids)
            graph.event_node[event.id] = node
            graph.node_done[node] = 0

            def done(r: int, node: int = node) -> None:
                self._notify(lambda: graph.node_done.__setitem__(node, r))

            self._add_node(stream, "event", "record", done)
            return
        if state.external:
            stream.native.submit("event", "external record", lambda: self._ext_record(state))
            return
        state.pending += 1
        target = state.pending

        def record() -> None:
            self._notify(lambda: setattr(state, "done", max(state.done, target)))

        stream.native.submit("event", "record", record)

    def _event_wait(self, event: Event, stream: Stream) -> None:
        state = event.native
        if state.external:
            def wait(*_: int) -> None:
                self._wait_for(lambda: state.recorded, "ExternalEvent record")

            if stream.capturing is not None:
                self._add_node(stream, "event", "external wait", wait)
            else:
                stream.native.submit("event", "external wait", wait)
            return
        if stream.capturing is not None:
            graph = stream.capturing.native
            node = graph.event_node[event.id]
            self._add_node(stream, "event", "wait", lambda r: self._wait_for(
                lambda: graph.node_done[node] >= r, "captured event record"))
            return
        target = state.pending
        if target:
            stream.native.submit("event", "wait", lambda: self._wait_for(
                lambda: state.done >= target, "event record"))

    def _event_reset(self, event: Event, stream: Stream) -> None:
        state = event.native
        if stream.capturing is not None:
            self._add_node(stream, "event", "external reset", lambda r: self._ext_reset(state))
        else:
            stream.native.submit("event", "external reset", lambda: self._ext_reset(state))

    def _event_synchronize(self, event: Event) -> None:
        state = event.native
        with self.gate.host_blocked():
            if state.external:
                self._wait_for(lambda: state.recorded, "ExternalEvent record")
            else:
                target = state.pending
                self._wait_for(lambda: state.done >= target, "event record")

    def hold_device(self):
        """See `Backend.hold_device`: here the streams' threads start no work while held
        (`DeviceGate`), except while the host blocks in a synchronize."""
        return self.gate.hold()

    # ---- graphs -----------------------------------------------------------------------------
    def _new_graph(self):
        return _GraphState()

    def _add_node(self, stream: Stream, kind: str, name: str, fn: Callable[[int], None]):
        stream.capturing.native.nodes.setdefault(stream.id, []).append((kind, name, fn))

    def _capture_begin(self, graph: Graph, stream: Stream) -> None:
        graph.native.nodes[stream.id] = []

    def _capture_end(self, graph: Graph) -> None:
        state = graph.native
        for sid, side in graph.side_streams.items():
            state.side_workers[sid] = self._new_stream(f"graph{graph.id}-{side.name}")

    def _release_graph(self, graph: Graph) -> None:
        for worker in graph.native.side_workers.values():
            worker.close(self.wait_timeout_s)
            if worker in self._workers:  # a closed backend has already joined and dropped it
                self._workers.remove(worker)
        graph.native.side_workers.clear()

    def _release_stream(self, stream: Stream) -> None:
        worker = stream.native
        worker.close(self.wait_timeout_s)
        if worker in self._workers:  # idempotent
            self._workers.remove(worker)

    def _replay(self, graph: Graph, stream: Stream) -> None:
        """One submit on `stream`; the graph's side-stream nodes are enqueued by the device
        when `stream` reaches the graph, not by this host call.

        Why: ``aclmdlRIExecuteAsync(modelRI, stream)`` runs the model as work of `stream`
        (hicann/runtime ``docs/api_docs/aclmdlRIExecuteAsync.md``), so none of its tasks,
        those of its forked streams included, starts before the tasks enqueued on `stream`
        before it; a captured ``aclrtStreamWaitEvent`` then blocks its stream until the
        event's record (``docs/api_docs/aclrtStreamWaitEvent.md``), and a wait timeout
        (``aclrtSetOpWaitTimeout``, none by default: ``docs/api_docs/aclrtSetOpWaitTimeout.md``)
        counts from there. Submitting the side nodes at the host call started their waits
        while the replay stream still ran earlier work (a previous replay's whole attention:
        measured up to 1.7 s under load), and `wait_timeout_s` counted that backlog: the
        ``captured event record did not happen`` EventError. It also cost the host one
        queue submit per side stream, which a replay, one host call, does not.
        """
        state = graph.native
        state.replays += 1
        r = state.replays
        main = stream.native
        name = f"graph{graph.id}"
        nodes = state.nodes[graph.stream.id]

        def run() -> None:  # on the replay stream's worker, in stream order
            for sid, worker in state.side_workers.items():
                worker.submit("graph", name, lambda n=state.nodes[sid], w=worker:
                              self._run_nodes(n, r, w, main))
            self._run_nodes(nodes, r, main, main)

        main.submit("graph", name, run)

    def _run_nodes(self, nodes, r: int, where: Worker, report: Worker) -> None:
        failed = False
        for kind, name, fn in nodes:
            if failed and kind in COMPUTE_KINDS:
                continue
            if kind == AICPU and r > 1 and not self.replay_aicpu:
                continue  # frozen: this backend models AI-CPU tasks that replay does not re-run
            start = time.perf_counter()
            try:
                fn(r)
            except BaseException as exc:  # noqa: BLE001 - reported at synchronize
                report.fail(name, exc)
                failed = True
            if kind in COMPUTE_KINDS:
                self.timings.add(kind, name, where.name, start, time.perf_counter())

    # ---- task groups --------------------------------------------------------------------------
    def _group_begin(self, stream: Stream) -> None:
        nodes = stream.capturing.native.nodes.setdefault(stream.id, [])
        stream.capturing.native.group_start[stream.id] = len(nodes)

    def _group_end(self, stream: Stream) -> _GroupState:
        state = stream.capturing.native
        start = state.group_start.pop(stream.id)
        slots = [fn.slot for kind, _, fn in state.nodes[stream.id][start:]
                 if kind in ("aicpu", "aicore")]
        return _GroupState(slots)

    def _update_begin(self, stream: Stream, group: TaskGroup) -> None:
        native = group.native
        if native.inflight and native.stream_id != stream.id:
            raise TaskUpdateError("graph_task_update_begin: an update of this group from "
                                  "another stream has not landed yet; concurrent updates "
                                  "of one group are not allowed")

    def _update_end(self, stream: Stream, group: TaskGroup, tasks: list[Task]) -> None:
        native = group.native
        native.inflight += 1
        native.stream_id = stream.id

        def land() -> None:
            for slot, task in zip(native.slots, tasks, strict=True):
                slot.task = task
            native.inflight -= 1

        stream.native.submit("update", "task update", land)

    # ---- launches -------------------------------------------------------------------------------
    def _launch(self, stream: Stream, task: Task) -> None:
        if stream.updating is not None:
            return  # the base keeps the task; _update_end lands it
        kind = task.kernel.kind
        if stream.capturing is not None:
            slot = _Slot(task)

            def run(r: int) -> None:
                self._execute(slot.task)

            run.slot = slot
            self._add_node(stream, kind, task.kernel.name, run)
            return
        stream.native.submit(kind, task.kernel.name, lambda: self._execute(task))

    def _execute(self, task: Task) -> None:
        body, args = task.kernel.cpu_impl, task.args
        if task.kernel.kind == AICPU:
            body(**args)
            return
        if self.aicore == "triton" and task.kernel.triton_impl is not None:
            task.kernel.triton_impl(**args)   # the whole grid in one launch
            return
        n, lanes = task.num_cores, min(task.num_cores, self.num_threads)
        if lanes <= 1:
            for core in range(n):
                body(core, **args)
            return

        def lane(first: int) -> None:
            for core in range(first, n, lanes):
                body(core, **args)

        for future in [self._pool.submit(lane, k) for k in range(lanes)]:
            future.result()
