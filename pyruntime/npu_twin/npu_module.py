"""``torch.npu`` on the twin: streams, events, graphs, task groups and device queries, with
the signatures of torch_npu 2.10.0.post4 (``torch_npu/npu/streams.py``, ``graphs.py``,
``utils.py``, ``__init__.py`` of the wheel) and the rules of `pyruntime.npu_twin.device`.

Names outside the twin's scope exist and raise `NotInTwinError` when called (never an
object that accepts anything).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import torch

from . import device as twin

__all__ = [
    "Event",
    "ExternalEvent",
    "NPUGraph",
    "Stream",
    "current_stream",
    "graph",
    "synchronize",
]


class NotInTwinError(NotImplementedError):
    """A torch_npu name that exists on the real stack but that the twin does not implement."""


def placeholder(qualname: str):
    def call(*args, **kwargs):
        raise NotInTwinError(f"{qualname} is not implemented by the NPU twin (only the names "
                             "aicpu-tiling uses are); add it to pyruntime/npu_twin with the "
                             "rules of the real one")
    call.__name__ = call.__qualname__ = qualname.rsplit(".", 1)[-1]
    return call


def _dev() -> twin.Device:
    return twin.device()


class Stream:
    """``torch.npu.Stream(device=None, priority=0)``."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        _dev().check_alive()
        self.state = _dev().new_stream(f"stream{priority}")
        self.device = torch.device("npu", 0)
        self.priority = priority

    @classmethod
    def _wrap(cls, state: twin.StreamState) -> Stream:
        obj = cls.__new__(cls)
        obj.state, obj.device, obj.priority = state, torch.device("npu", 0), 0
        return obj

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def query(self) -> bool:
        _dev().refuse_in_capture("Stream.query()")
        return not self.state.queue

    def synchronize(self) -> None:
        _dev().synchronize_stream(self.state, "Stream.synchronize()")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.state is self.state

    def __hash__(self) -> int:
        return hash(self.state.id)

    def __repr__(self) -> str:
        return f"<torch.npu.Stream (npu-twin) {self.state.name}#{self.state.id}>"


class Event:
    """``torch.npu.Event(enable_timing=False, blocking=False, interprocess=False)``: an
    ``ACL_EVENT_SYNC`` event unless timing is enabled."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.state = twin.EventState(external=False, timing=enable_timing)

    def record(self, stream: Stream | None = None) -> None:
        _dev().record_event(self.state, (stream or current_stream()).state)

    def wait(self, stream: Stream | None = None) -> None:
        _dev().wait_event(self.state, (stream or current_stream()).state)

    def query(self) -> bool:
        _dev().refuse_in_capture("Event.query()")
        return self.state.last_token is None or self.state.done >= self.state.last_token

    def synchronize(self) -> None:
        _dev().synchronize_event(self.state)

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.state.timing and end_event.state.timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        return 0.0


class ExternalEvent:
    """``torch.npu.ExternalEvent()``: may be waited on before it is recorded; `reset` clears
    it (vLLM-Ascend's task-update handshake)."""

    def __init__(self) -> None:
        self.state = twin.EventState(external=True)

    def record(self, stream: Stream | None = None) -> None:
        _dev().record_event(self.state, (stream or current_stream()).state)

    def wait(self, stream: Stream | None = None) -> None:
        _dev().wait_event(self.state, (stream or current_stream()).state)

    def reset(self, stream: Stream | None = None) -> None:
        _dev().enqueue(twin.Work("ext_reset", "ExternalEvent.reset", event=self.state),
                       (stream or current_stream()).state)


class NPUGraph:
    """``torch.npu.NPUGraph()``: ``capture_begin(pool=None, capture_error_mode="global")``
    on the current stream, ``capture_end()``, ``replay()``, ``reset()``, ``pool()``."""

    def __init__(self) -> None:
        self.state = twin.GraphState()

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise RuntimeError(f"unknown capture_error_mode {capture_error_mode!r}")
        _dev().capture_begin(self.state)

    def capture_end(self) -> None:
        _dev().capture_end(self.state)

    def replay(self) -> None:
        _dev().replay(self.state)

    def reset(self) -> None:
        _dev().reset(self.state)

    def pool(self) -> tuple[int, int]:
        return (0, id(self))


class graph:
    """``torch.npu.graph(npu_graph, pool=None, stream=None, ...)``: synchronises, enters the
    stream, begins; on exit ends the capture (also after an exception, as torch_npu does)
    and leaves the stream."""

    default_capture_stream: Stream | None = None

    def __init__(self, npu_graph: NPUGraph, pool: Any = None, stream: Stream | None = None,
                 auto_dispatch_capture: bool = False, capture_error_mode: str = "global"):
        if type(self).default_capture_stream is None:
            type(self).default_capture_stream = Stream()
        self.npu_graph, self.mode = npu_graph, capture_error_mode
        self.stream_ctx = stream_context(stream or type(self).default_capture_stream)

    def __enter__(self) -> None:
        synchronize()
        self.stream_ctx.__enter__()
        self.npu_graph.capture_begin(capture_error_mode=self.mode)

    def __exit__(self, *exc: object) -> None:
        try:
            self.npu_graph.capture_end()
        finally:
            self.stream_ctx.__exit__(*exc)


class _DeviceProperties(types.SimpleNamespace):
    pass


def current_stream(device: Any = None) -> Stream:
    return Stream._wrap(_dev().current_stream())


@contextlib.contextmanager
def stream_context(stream: Stream | None):
    if stream is None:
        yield
        return
    dev = _dev()
    previous = dev.current_stream()
    dev.set_current_stream(stream.state)
    try:
        yield
    finally:
        dev.set_current_stream(previous)


def stream(stream: Stream | None):
    """``with torch.npu.stream(s):`` makes `s` the current stream."""
    return stream_context(stream)


def set_stream(stream: Stream) -> None:
    _dev().set_current_stream(stream.state)


def synchronize(device: Any = None) -> None:
    _dev().synchronize()


def set_device(device: Any) -> None:
    index = device.index if isinstance(device, torch.device) else (
        int(str(device).split(":")[-1]) if isinstance(device, str) else int(device))
    if index not in (0, -1):
        raise RuntimeError(f"Invalid device id {index} (the twin has one NPU)")
    _dev().ensure_context()


def current_device() -> int:
    return 0


def device_count() -> int:
    return 1


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _dev().context


def get_device_name(device: Any = None) -> str:
    return twin.DEVICE_NAME


def get_device_properties(device: Any = None) -> _DeviceProperties:
    return _DeviceProperties(name=twin.DEVICE_NAME, total_memory=64 * 2**30,
                             cube_core_num=twin.AI_CORES, vector_core_num=twin.VECTOR_CORES)


def is_current_stream_capturing() -> bool:
    return _dev().current_stream().capture is not None


def graph_pool_handle() -> tuple[int, int]:
    return (0, 0)


def graph_task_group_begin(stream: Stream) -> None:
    _dev().group_begin(stream.state)


def graph_task_group_end(stream: Stream) -> twin.GroupHandle:
    return _dev().group_end(stream.state)


def graph_task_update_begin(stream: Stream, handle: twin.GroupHandle) -> None:
    _dev().update_begin(stream.state, handle)


def graph_task_update_end(stream: Stream) -> None:
    _dev().update_end(stream.state)


def empty_cache() -> None:
    _dev().refuse_in_capture("torch.npu.empty_cache()")


def _lazy_init() -> None:
    """torch_npu's ``_lazy_init`` starts the runtime but sets no device (lazy set-device)."""
    _dev().check_alive()


def _is_in_bad_fork() -> bool:
    return _dev().in_bad_fork


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    torch.manual_seed(seed)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return placeholder(f"torch.npu.{name}")
