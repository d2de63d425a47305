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
    "current_device",
    "current_stream",
    "device",
    "device_count",
    "graph",
    "set_device",
    "synchronize",
]


#: torch_npu ``SocVersion`` of the Ascend 910B3 (``NpuVariables.h``: Ascend910B1 = 220, ...)
SOC_VERSION = 223


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


def _index(device: Any, *, optional: bool = True) -> int:
    """torch_npu's ``_get_device_index(device, optional=True)`` (``torch_npu/npu/utils.py``):
    an int as it is, ``"npu:k"`` / ``torch.device("npu", k)`` -> k, ``None`` / ``"npu"`` ->
    the current device; a non-npu device raises ValueError."""
    if isinstance(device, (Stream, Event)):
        raise TypeError(f"expected a device, got {type(device).__name__}")
    if isinstance(device, _DeviceContext):
        return device.idx
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if device is None:
        return _dev().current_device()
    device = torch.device(device) if isinstance(device, str) else device
    if not isinstance(device, torch.device):
        raise ValueError(f"Expected a npu device, but got: {device!r}")
    if device.type != "npu":
        raise ValueError(f"Expected a npu device, but got: {device}")
    return _dev().current_device() if device.index is None else device.index


class Stream:
    """``torch.npu.Stream(device=None, priority=0)``."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        _dev().check_alive()
        index = _dev().checked(_index(device))
        self.state = _dev().new_stream(f"stream{priority}", index)
        self.device = torch.device("npu", index)
        self.priority = priority

    @classmethod
    def _wrap(cls, state: twin.StreamState) -> Stream:
        obj = cls.__new__(cls)
        obj.state, obj.device, obj.priority = state, torch.device("npu", state.device), 0
        return obj

    @property
    def device_index(self) -> int:
        return self.state.device

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
        """``NPUEvent::record``: the event takes the device of the first stream that records
        it; a later stream of another device is refused (NPUEvent.h:16-20)."""
        target = (stream or current_stream()).state
        if self.state.device is not None and self.state.device != target.device:
            raise RuntimeError(f"Event device {self.state.device} does not match recording "
                               f"stream's device {target.device}.")
        _dev().record_event(self.state, target)
        self.state.device = target.device

    @property
    def device(self) -> torch.device | None:
        index = self.state.device
        return None if index is None else torch.device("npu", index)

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
        return (self.state.device or 0, id(self))


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
    return Stream._wrap(_dev().current_stream(_dev().checked(_index(device))))


def default_stream(device: Any = None) -> Stream:
    """The default stream of `device` (default: the current one; torch_npu ``utils.py``:
    ``_npu_getDefaultStream``)."""
    _lazy_init()
    return Stream._wrap(_dev().default_streams[_dev().checked(_index(device))])


@contextlib.contextmanager
def stream_context(stream: Stream | None):
    """torch_npu's ``StreamContext`` (``torch_npu/npu/utils.py``): remembers the current
    stream of the current device and of the stream's device, makes `stream` current (which
    also makes its device current, `set_stream`) and restores both on exit."""
    if stream is None:
        yield
        return
    dev = _dev()
    source = dev.current_stream()
    target = dev.current_stream(stream.state.device)
    set_stream(stream)
    try:
        yield
    finally:
        if source.device != stream.state.device:
            set_stream(Stream._wrap(target))
        set_stream(Stream._wrap(source))


def stream(stream: Stream | None):
    """``with torch.npu.stream(s):`` makes `s` the current stream."""
    return stream_context(stream)


def set_stream(stream: Stream | None) -> None:
    """``torch_npu._C._npu_setStream``: the stream becomes the current stream of its device,
    and its device the current device (as torch's ``_cuda_setStream``, which it copies)."""
    if stream is None:
        return
    dev = _dev()
    if dev.current_device() != stream.state.device:
        dev.set_current_device(stream.state.device)
    dev.set_current_stream(stream.state)


def synchronize(device: Any = None) -> None:
    """Every stream of `device` (default: the current one), ``aclrtSynchronizeDevice``
    (torch_npu ``utils.py``: ``_npu_synchronize``)."""
    _dev().synchronize(index=_dev().checked(_index(device)))


def get_soc_version() -> int:
    """torch_npu ``npu/_backends.py``: the runtime's SoC version, an int of torch_npu's
    ``SocVersion`` enum (``torch_npu/csrc/core/npu/NpuVariables.h``: Ascend910B1 = 220, so
    Ascend910B3 = 223, the SoC the twin reports; vLLM-Ascend maps 220..225 to its A2 build,
    ``vllm_ascend/utils.py`` / ``device/device_config.py``)."""
    _lazy_init()
    return SOC_VERSION


def set_device(device: Any) -> None:
    """``torch.npu.set_device``: a negative index is a no-op; an index the twin has not is
    CANN's invalid device id (107001)."""
    index = _index(device)
    if index >= 0:
        _dev().set_current_device(index)


def current_device() -> int:
    return _dev().current_device()


def device_count() -> int:
    """``$AICPU_TILING_TWIN_DEVICES`` (default 2)."""
    return _dev().count


class _DeviceContext:
    """``torch.npu.device(d)``: makes `d` current inside, restores the previous device on
    exit (a negative index or None is a no-op), as ``torch_npu/npu/utils.py``'s ``device``."""

    def __init__(self, device: Any) -> None:
        self.idx = _index(device) if device is not None else -1
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx < 0:
            return
        self.prev_idx = _dev().current_device()
        if self.prev_idx != self.idx:
            _dev().set_current_device(self.idx)

    def __exit__(self, *exc: object) -> bool:
        if self.idx >= 0 and self.prev_idx >= 0 and self.prev_idx != _dev().current_device():
            _dev().set_current_device(self.prev_idx)
        return False


device = _DeviceContext


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return _dev().context


def get_device_name(device: Any = None) -> str:
    return twin.DEVICE_NAME


def get_device_properties(device: Any = None) -> _DeviceProperties:
    _dev().checked(_index(device))
    return _DeviceProperties(name=twin.DEVICE_NAME, total_memory=_dev().memory.total,
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
    """Gives the cached, unallocated bytes back (`pyruntime.npu_twin.memory`)."""
    _dev().refuse_in_capture("torch.npu.empty_cache()")
    _dev().memory.empty_cache()


def memory_stats(device: Any = None) -> dict[str, int]:
    """torch_npu ``memory.py``: the caching allocator's statistics, flat keys
    (``allocated_bytes.all.peak`` is what vLLM's profiling reads), live."""
    return _dev().memory.stats()


def memory_allocated(device: Any = None) -> int:
    return _dev().memory.allocated


def max_memory_allocated(device: Any = None) -> int:
    return _dev().memory.peak_allocated


def memory_reserved(device: Any = None) -> int:
    return _dev().memory.reserved


def max_memory_reserved(device: Any = None) -> int:
    return _dev().memory.peak_reserved


def reset_peak_memory_stats(device: Any = None) -> None:
    _dev().memory.reset_peak()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """torch_npu ``__init__.py``: ``(free, total)`` bytes of the device: the device size
    (``AICPU_TILING_TWIN_DEVICE_MEMORY``) less what the caching allocator reserved."""
    _lazy_init()
    memory = _dev().memory
    return memory.free_bytes(), memory.total


def _lazy_init() -> None:
    """torch_npu's ``_lazy_init`` starts the runtime but sets no device (lazy set-device)."""
    _dev().check_alive()


def _is_in_bad_fork() -> bool:
    return _dev().in_bad_fork


def manual_seed(seed: int) -> None:
    """torch_npu ``npu/random.py``: seeds the current device's default generator, and only
    it (``torch.manual_seed`` calls ``torch.npu.manual_seed_all``: calling back would
    recurse)."""
    _dev().generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """torch_npu ``npu/random.py``: seeds every device's default generator."""
    _dev().generator.manual_seed(int(seed))


def initial_seed() -> int:
    """torch_npu ``npu/random.py``: the current device's generator's seed."""
    _lazy_init()
    return _dev().generator.initial_seed()


class _NpuConfig:
    """``torch.npu.config`` (torch_npu ``npu_config.py`` ``_npuConfig``): setting
    ``allow_internal_format`` sets torch_npu's ``ALLOW_INTERNAL_FORMAT`` option (vLLM-Ascend's
    ``model_runner_v1.py`` sets it True at import); other names are ignored and nothing
    is readable back, as there."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "allow_internal_format":
            OPTIONS["ALLOW_INTERNAL_FORMAT"] = "enable" if value else "disable"


#: torch_npu options set through the twin (``_npu_setOption``)
OPTIONS: dict[str, str] = {}
config = _NpuConfig()


def install_accelerator() -> None:
    """``torch.accelerator`` as on torch_npu: ``synchronize`` reaches the device guard's
    ``synchronizeDevice`` (``libtorch_npu.so`` exports ``c10_npu::impl::NPUGuardImpl::
    synchronizeDevice``), which waits for every stream of the device; torch's Python
    PrivateUse1 guard cannot implement it ("Backend doesn't support synchronizing all
    streams on device"), so the module function is routed here. The device index and count
    already reach the twin through torch's Python backend. The memory queries
    (``memory_stats``, ``memory_allocated``, ``get_memory_info``, ``empty_cache``, ...) keep
    raising as on torch_npu 2.10, whose allocator is not a c10 ``DeviceAllocator`` (no such
    symbol in ``libtorch_npu.so``): vLLM-Ascend routes the ones it needs to ``torch.npu.*``
    itself (``vllm_ascend/patch/platform/patch_torch_accelerator.py``)."""

    def synchronize(device: Any = None) -> None:
        """``torch.accelerator.synchronize(device=None)``: every stream of the device."""
        _dev().synchronize("torch.accelerator.synchronize()")

    torch.accelerator.synchronize = synchronize


class _MemoryModule(types.ModuleType):
    """``torch.npu.memory`` (torch_npu ``npu/memory.py``): the allocator queries above; its
    other names (``NPUPluggableAllocator``, ``MemPool``, ``use_mem_pool``,
    ``memory_snapshot``: vLLM-Ascend's sleep mode and RFork loader, paths the twin does not
    run) are placeholders that raise `NotInTwinError` when called."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{self.__name__}.{name}")


memory = _MemoryModule("torch.npu.memory")
for _name in ("empty_cache", "memory_stats", "memory_allocated", "max_memory_allocated",
              "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats"):
    setattr(memory, _name, globals()[_name])
del _name


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return placeholder(f"torch.npu.{name}")
