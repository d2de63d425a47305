"""The NPU backend: a thin mapping of the backend contract onto torch_npu.

Every torch_npu attribute it touches is listed in `TORCH_NPU_API`, so a conformance test
can check them against a real wheel. torch_npu is imported on first use, not at import.
Kernels launch through their `npu_op` (a torch custom op with an NPU implementation).
The base class does all validation; the hooks below only translate.

Our NPU kernels: the tiling task's op is the torch_npu extension's PrivateUse1 kernel of
``aicpu_tiling::plan_tiling`` (`npu_kernels` finds, builds and loads it; it launches the
AI-CPU kernel with the fork/join of docs/design.md section 7 on whatever stream it is called
on, captured or eager); the attention and combine ops are the Triton AI Core kernels
(Triton-Ascend). Both placements use the same op: ``graph`` captures it, ``pre-replay``
calls it once per step before the replay (`pyruntime.graph_attention.device_tiling`).
The vLLM-Ascend hook's engine on this backend is `pyruntime.hook.npu_engine` (above the
backends: it implements the hook's engine contract).
Nothing in this module has run on an NPU.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch

from .base import Backend
from .errors import BackendError
from .handles import Event, Graph, Stream, Task, TaskGroup

#: every ``torch.npu`` attribute this module uses (``torch_npu`` registers them on import)
TORCH_NPU_API = (
    "torch.npu.NPUGraph",
    "torch.npu.NPUGraph.capture_begin",
    "torch.npu.NPUGraph.capture_end",
    "torch.npu.NPUGraph.replay",
    "torch.npu.NPUGraph.reset",
    "torch.npu.Stream",
    "torch.npu.Stream.synchronize",
    "torch.npu.Stream.wait_event",
    "torch.npu.Event",
    "torch.npu.Event.record",
    "torch.npu.Event.synchronize",
    "torch.npu.ExternalEvent",
    "torch.npu.ExternalEvent.record",
    "torch.npu.ExternalEvent.wait",
    "torch.npu.ExternalEvent.reset",
    "torch.npu.current_stream",
    "torch.npu.stream",
    "torch.npu.synchronize",
    "torch.npu.graph_task_group_begin",
    "torch.npu.graph_task_group_end",
    "torch.npu.graph_task_update_begin",
    "torch.npu.graph_task_update_end",
    "torch.npu.is_available",
    "torch.npu.get_device_name",
    "torch.npu.get_device_properties",
    "torch.npu.current_device",
)


def _load_npu() -> Any:
    try:
        importlib.import_module("torch_npu")
    except ImportError as exc:
        raise BackendError("the npu backend needs torch_npu (and CANN) installed; on a "
                           "machine without an Ascend NPU use the cpu backend, or the NPU "
                           "twin (pyruntime.npu_twin.activate())") from exc
    return torch.npu


class NpuBackend(Backend):
    """Maps the contract onto ``torch.npu``. Device buffers are ``npu`` tensors."""

    name = "npu"
    default_num_cores = 24
    host_update_attention = "fia"

    def __init__(self, *, device: int = 0, npu: Any = None) -> None:
        super().__init__()
        self.npu = npu if npu is not None else _load_npu()
        self.device = f"npu:{device}"
        self._capture_ctx: dict[int, Any] = {}
        #: per destination buffer: its pinned staging block and the event recorded behind the
        #: last copy from it (`_copy_h2d`)
        self._staging: dict[int, tuple[torch.Tensor, Any]] = {}

    # ---- our kernels and the vLLM engine ------------------------------------------------------
    def load_kernels(self) -> Any:
        """Load the tiling extension and the AI-CPU binary (once per process).

        Returns:
            `npu_kernels.KernelFiles`: the files loaded.

        Raises:
            npu_kernels.KernelsUnavailableError: not built or not loadable (says what to do).
        """
        from . import npu_kernels

        return npu_kernels.load()

    def prepare_kernels(self) -> None:
        """`load_kernels` (without it ``plan_tiling`` has no NPU kernel: its composite CPU
        body would run on device tensors)."""
        self.load_kernels()

    def ai_core_count(self) -> int:
        """AI Core (cube) count of the device, else `default_num_cores`."""
        try:
            props = self.npu.get_device_properties(self.npu.current_device())
            return int(getattr(props, "cube_core_num", 0)) or self.default_num_cores
        except Exception:  # noqa: BLE001 - an older torch_npu without the field
            return self.default_num_cores

    def _alloc(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def _copy_h2d(self, stream, dst, src):
        # Asynchronous, from a pinned staging block kept per destination, as vLLM-Ascend copies
        # its step inputs: the host does not wait for the stream's earlier work (a blocking
        # copy would wait for the previous step's replay at every step). torch_npu queues
        # aclrtMemcpyAsync with the raw host pointer and reads it when the stream gets there
        # (the twin checks it: `PageableCopyRace`), so the block is rewritten only once the
        # event recorded behind its previous copy has completed: normally long before, the
        # previous step's copy.
        key = self._storage(dst)
        staged = self._staging.get(key)
        if staged is None or staged[0].shape != src.shape or staged[0].dtype != src.dtype:
            if staged is not None:
                staged[1].synchronize()
            staged = (self._pinned_empty(src.shape, src.dtype), self.npu.Event())
            self._staging[key] = staged
        block, copied = staged
        # the previous copy from the block has run (a no-op the first time): a host wait, even
        # when the event completed long ago (aclrtSynchronizeEvent), so it is counted
        self.counters.synchronizes += 1
        copied.synchronize()
        block.copy_(src)
        with self.npu.stream(stream.native):
            dst.copy_(block, non_blocking=True)
            copied.record(stream.native)

    @staticmethod
    def _pinned_empty(shape, dtype) -> torch.Tensor:
        """A page-locked host tensor (torch_npu's CachingHostAllocator)."""
        return torch.empty(shape, dtype=dtype).pin_memory()

    def _free(self, buf):
        staged = self._staging.pop(self._storage(buf), None)
        if staged is not None:
            staged[1].synchronize()  # the copy into `buf` has run: its block may go

    def _new_stream(self, name):
        return self.npu.Stream()

    def _default_stream(self):
        return self.npu.current_stream()

    def _new_event(self, *, external):
        return self.npu.ExternalEvent() if external else self.npu.Event()

    def _synchronize(self):
        self.npu.synchronize()

    def _stream_synchronize(self, stream: Stream):
        stream.native.synchronize()

    def _event_record(self, event: Event, stream: Stream):
        event.native.record(stream.native)

    def _event_wait(self, event: Event, stream: Stream):
        if event.external:
            event.native.wait(stream.native)
        else:
            stream.native.wait_event(event.native)

    def _event_reset(self, event: Event, stream: Stream):
        event.native.reset(stream.native)

    def _event_synchronize(self, event: Event):
        event.native.synchronize()

    def _new_graph(self):
        return self.npu.NPUGraph()

    def _capture_begin(self, graph: Graph, stream: Stream):
        # torch.npu.graph(g, stream=s) is this pair under `with torch.npu.stream(s)`
        ctx = self.npu.stream(stream.native)
        ctx.__enter__()
        self._capture_ctx[graph.id] = ctx
        graph.native.capture_begin()

    def _capture_end(self, graph: Graph):
        try:
            graph.native.capture_end()
        finally:
            self._capture_ctx.pop(graph.id).__exit__(None, None, None)

    def _end_native_capture(self, graph: Graph):
        # NPUGraph.reset() does not end a capture: without capture_end the stream keeps
        # capturing and every later operation on it fails or is captured into nothing
        # (torch.npu.graph.__exit__ also calls capture_end on an exception)
        try:
            graph.native.capture_end()
        except Exception:  # noqa: BLE001, S110 - the capture is abandoned; its error is known
            pass
        finally:
            ctx = self._capture_ctx.pop(graph.id, None)
            if ctx is not None:
                ctx.__exit__(None, None, None)

    def _release_graph(self, graph: Graph):
        graph.native.reset()

    def _replay(self, graph: Graph, stream: Stream):
        with self.npu.stream(stream.native):
            graph.native.replay()

    def _group_begin(self, stream: Stream):
        self.npu.graph_task_group_begin(stream.native)

    def _group_end(self, stream: Stream):
        return self.npu.graph_task_group_end(stream.native)

    def _update_begin(self, stream: Stream, group: TaskGroup):
        self.npu.graph_task_update_begin(stream.native, group.native)

    def _update_end(self, stream: Stream, group: TaskGroup, tasks: list[Task]):
        self.npu.graph_task_update_end(stream.native)

    def _launch(self, stream: Stream, task: Task):
        op = task.kernel.npu_op
        if op is None:
            raise BackendError(f"kernel {task.kernel.name!r} has no NPU build (npu_op)")
        args = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                for k, v in task.args.items()}
        with self.npu.stream(stream.native):
            op(**args)
