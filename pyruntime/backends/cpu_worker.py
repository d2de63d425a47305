"""The CPU backend's stream engine: one worker thread per stream, a gate that can hold
them, plus task timings.

A `Worker` runs submitted items in order on its own thread, asynchronously to the host.
The first failure is kept and reported (as `DeviceTaskError`) by the next
`synchronize()`; after a failure the worker skips compute items but still runs event
items, so that other streams waiting on its events are not deadlocked. `close()` lets the
items already submitted run, then ends the thread and joins it.

A `DeviceGate` lets the host measure its own work: while the host holds it, workers start
no item (what was submitted waits in their queues), except while the host itself blocks
on the device (a synchronize), when it would be idle anyway.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterator

from .errors import BackendError, DeviceTaskError

#: item kinds that do work; the others ("event", "graph", "sync") only order streams
COMPUTE_KINDS = frozenset({"aicpu", "aicore", "copy", "update"})


@dataclasses.dataclass
class TaskTiming:
    """Aggregate device time of one task kind (seconds)."""

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0


class Timings:
    """Thread-safe per-kind aggregates, plus an optional bounded list of task records."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_kind: dict[str, TaskTiming] = {}
        self.records: list[tuple[str, str, str, float, float]] | None = None
        self.max_records = 0

    def add(self, kind: str, name: str, where: str, start: float, end: float) -> None:
        with self._lock:
            stat = self.by_kind.setdefault(kind, TaskTiming())
            stat.count += 1
            stat.total_s += end - start
            stat.max_s = max(stat.max_s, end - start)
            if self.records is not None and len(self.records) < self.max_records:
                self.records.append((kind, name, where, start, end))


class DeviceGate:
    """Keeps the emulated device off the host's cores while the host does measured work.

    On an NPU the device never takes the host's CPU. Here every stream is a thread on the
    same cores (two on the CI machine), so host time measured while the device runs counts
    the device's interference (GIL hand-offs, cache and core sharing), which grows with the
    work a step enqueues, that is with the layer count. While `hold()` is active, workers
    finish the item they are running and start no other; inside a hold, `host_blocked()`
    (every host-side synchronize) opens the gate for as long as the host waits, so a step
    that waits for the device inside its measured part (host_update's pre-replay
    synchronize) cannot deadlock. Holds nest (a counter).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holds = 0
        self._host_waits = 0

    def _open(self) -> bool:
        return self._holds == 0 or self._host_waits > 0

    def pass_through(self) -> None:
        """Called by a worker before each item: return at once unless held."""
        if self._holds == 0:  # unlocked read: a hold starts with the device idle anyway
            return
        with self._cond:
            self._cond.wait_for(self._open)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Workers start no new item until the outermost hold ends."""
        with self._cond:
            self._holds += 1
        try:
            yield
        finally:
            with self._cond:
                self._holds -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def host_blocked(self) -> Iterator[None]:
        """Open the gate while the host blocks on the device."""
        with self._cond:
            self._host_waits += 1
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._host_waits -= 1


class Worker:
    """An in-order executor on its own daemon thread (held by `gate` when given)."""

    def __init__(self, name: str, timings: Timings, gate: DeviceGate | None = None) -> None:
        self.name = name
        self.timings = timings
        self.gate = gate or DeviceGate()
        self.error: DeviceTaskError | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"cpu-stream-{name}",
                                        daemon=True)
        self._thread.start()

    def submit(self, kind: str, name: str, fn: Callable[[], None]) -> None:
        if self._closed:  # nothing would ever run it: a later synchronize would hang
            raise BackendError(f"stream {self.name} was released; its work cannot run")
        self._queue.put((kind, name, fn))

    def fail(self, name: str, exc: BaseException) -> None:
        """Keep the first failure for the next synchronize."""
        if self.error is None:
            self.error = exc if isinstance(exc, DeviceTaskError) else DeviceTaskError(name, exc)

    def synchronize(self) -> None:
        """Block until every item submitted so far has run; raise a kept failure."""
        done = threading.Event()
        self.submit("sync", "synchronize", done.set)
        with self.gate.host_blocked():
            done.wait()
        error, self.error = self.error, None
        if error is not None:
            raise error

    def close(self, timeout_s: float | None = None) -> bool:
        """Run what was submitted, then end the thread; idempotent.

        Joins the thread (at most `timeout_s` seconds; None: until it ends) unless called
        from that thread. Returns whether the thread has ended. Later `submit` calls raise
        `BackendError`.
        """
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, name, fn = item
            # Drop this frame's references before blocking on the next get(): the last item
            # run (a graph replay holds every captured task, their buffers included) would
            # otherwise stay reachable from this live thread and keep a dropped
            # StaticAttention's KV caches alive for as long as the stream exists.
            del item
            self.gate.pass_through()
            if self.error is not None and kind in COMPUTE_KINDS:
                del fn
                continue
            start = time.perf_counter()
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported at synchronize
                self.fail(name, exc)
            del fn
            if kind in COMPUTE_KINDS:
                self.timings.add(kind, name, self.name, start, time.perf_counter())
