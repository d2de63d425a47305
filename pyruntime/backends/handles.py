"""Handles a backend hands out: tasks, streams, events, graphs, task groups.

`Kernel` (and its kinds `AICPU`, `AICORE`) is `pyruntime.kernels.kernel`'s, re-exported here
and by `pyruntime.backends`: the kernels are made below the backends that launch them.

They mirror the torch_npu objects (`torch.npu.Stream`, `torch.npu.Event`,
`torch.npu.ExternalEvent`, `torch.npu.NPUGraph`, the handle returned by
`torch.npu.graph_task_group_end`) so the NPU backend maps one to one. Each handle keeps
the backend-specific object in `.native`, and forwards every operation to its backend,
whose base class validates it first (see `base.Backend`).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from typing import TYPE_CHECKING, Any

from pyruntime.kernels.kernel import AICORE, AICPU, Kernel

if TYPE_CHECKING:
    from .base import Backend

__all__ = ["AICORE", "AICPU", "Event", "ExternalEvent", "Graph", "GraphState", "Kernel",
           "Stream", "Task", "TaskGroup"]

_ids = itertools.count(1)


@dataclasses.dataclass
class Task:
    """One launch: a kernel, its arguments and its core count.

    `args` maps argument names to device buffers (torch tensors from `Backend.alloc`),
    by-value numpy arrays (copied at launch, like kernel arguments packed into a task) or
    Python scalars.
    """

    kernel: Kernel
    args: dict[str, Any]
    num_cores: int
    #: `Backend.launch_task`: the backend's free count when its buffers were last checked
    #: live (-1: never); a prepared task re-checks them only after a free
    checked_at: int = dataclasses.field(default=-1, compare=False, repr=False)

    @property
    def signature(self) -> tuple[str, str]:
        """(kind, kernel name): what a task update must match."""
        return (self.kernel.kind, self.kernel.name)


class Stream:
    """A device stream: tasks run in order, asynchronously to the host.

    Mirrors ``torch.npu.Stream``: `synchronize()`, `wait_event(event)`,
    `record_event(event=None)`.
    """

    def __init__(self, backend: Backend, native: Any, name: str) -> None:
        self.backend = backend
        self.native = native
        self.name = name
        self.id = next(_ids)
        self.capturing: Graph | None = None
        self.open_group: list[Task] | None = None
        self.updating: TaskGroup | None = None
        self.pending_update: list[Task] = []

    def synchronize(self) -> None:
        """Block the host until every task enqueued on this stream has run."""
        self.backend.stream_synchronize(self)

    def wait_event(self, event: Event) -> None:
        """Make later tasks on this stream wait for `event`."""
        event.wait(self)

    def record_event(self, event: Event | None = None) -> Event:
        """Record `event` (a new one if None) on this stream and return it."""
        event = event if event is not None else self.backend.event()
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<Stream {self.name} #{self.id}>"


class Event:
    """A stream event (``torch.npu.Event``): waiting on a never-recorded event is a no-op."""

    external = False

    def __init__(self, backend: Backend, native: Any) -> None:
        self.backend = backend
        self.native = native
        self.id = next(_ids)
        self.captured_in: Graph | None = None

    def record(self, stream: Stream | None = None) -> None:
        """Record on `stream` (the current stream if None)."""
        self.backend.event_record(self, stream)

    def wait(self, stream: Stream | None = None) -> None:
        """Make `stream` (the current stream if None) wait for the latest record."""
        self.backend.event_wait(self, stream)

    def synchronize(self) -> None:
        """Block the host until the latest record has happened on the device."""
        self.backend.event_synchronize(self)


class ExternalEvent(Event):
    """An external event (``torch.npu.ExternalEvent``).

    Unlike `Event`, a wait may be enqueued (or captured) before the record: it blocks
    until some stream records the event. After a record the event must be reset (on a
    stream, usually right after the wait) before it may be recorded again.
    """

    external = True

    def reset(self, stream: Stream | None = None) -> None:
        """Enqueue a reset on `stream` so the event may be recorded again."""
        self.backend.event_reset(self, stream)


class GraphState(enum.Enum):
    EMPTY = "empty"
    CAPTURING = "capturing"
    CAPTURED = "captured"


class Graph:
    """A captured task graph (``torch.npu.NPUGraph``).

    State machine: EMPTY --capture_begin--> CAPTURING --capture_end--> CAPTURED;
    `replay()` needs CAPTURED; `reset()` returns to EMPTY. Any other move raises
    `CaptureError`.
    """

    def __init__(self, backend: Backend, native: Any) -> None:
        self.backend = backend
        self.native = native
        self.id = next(_ids)
        self.state = GraphState.EMPTY
        self.stream: Stream | None = None
        self.task_count = 0
        self.buffers: dict[int, str] = {}
        self.buffers_checked_at = -1  # the backend's free count when replay last checked them
        self.side_streams: dict[int, Stream] = {}
        self.last_side_record: dict[int, Event | None] = {}
        self.joined_events: set[int] = set()
        self.groups: list[TaskGroup] = []

    def capture_begin(self, stream: Stream | None = None) -> None:
        """Start recording launches made on `stream` instead of running them."""
        self.backend.capture_begin(self, stream)

    def capture_end(self) -> None:
        """Stop recording; the graph becomes replayable."""
        self.backend.capture_end(self)

    def replay(self, stream: Stream | None = None) -> None:
        """Re-issue every captured task, in order, on `stream` (asynchronously)."""
        self.backend.replay(self, stream)

    def reset(self) -> None:
        """Drop the captured tasks; task-group handles of this graph become invalid."""
        self.backend.graph_reset(self)


class TaskGroup:
    """The handle `graph_task_group_end` returns: a group of captured tasks to update."""

    def __init__(self, graph: Graph, tasks: list[Task], native: Any) -> None:
        self.graph = graph
        self.signatures = [t.signature for t in tasks]
        self.native = native
        self.valid = True
        self.updater: Stream | None = None
