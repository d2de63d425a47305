"""The NPU backend is a thin mapping: drive it with a recording stand-in for torch.npu.

The stand-in accepts only the attributes listed in `TORCH_NPU_API`, so a call the
backend makes outside that list fails here; a conformance test on a machine with the
real wheel checks the same list against torch_npu.
"""

import numpy as np
import pytest
import torch

from pyruntime.backends import Kernel
from pyruntime.backends.npu import TORCH_NPU_API, NpuBackend


class Recorder:
    """Stands in for torch.npu (and its objects): logs calls, refuses unlisted names."""

    def __init__(self, log, path="torch.npu"):
        self._log, self._path = log, path

    def __getattr__(self, name):
        path = f"{self._path}.{name}"
        if path not in TORCH_NPU_API:
            raise AttributeError(f"{path} is not in TORCH_NPU_API")
        return Recorder(self._log, path)

    def __call__(self, *args, **kwargs):
        self._log.append(self._path)
        return Recorder(self._log, self._path)  # an object of that "class"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class CpuAllocNpu(NpuBackend):
    def _alloc(self, shape, dtype):
        return torch.zeros(shape, dtype=dtype)

    @staticmethod
    def _pinned_empty(shape, dtype):  # pinning needs an accelerator in a CPU-only torch
        return torch.empty(shape, dtype=dtype)


@pytest.fixture
def npu_log():
    log = []
    return CpuAllocNpu(npu=Recorder(log)), log


def test_every_listed_attribute_is_under_torch_npu():
    assert all(name.startswith("torch.npu.") for name in TORCH_NPU_API)
    assert len(set(TORCH_NPU_API)) == len(TORCH_NPU_API)


def test_the_host_update_sequence_maps_one_to_one(npu_log):
    be, log = npu_log
    calls = []
    k = Kernel("attn", "aicore", lambda core, **_: None, npu_op=lambda **a: calls.append(a))
    x = be.alloc([2], torch.float32)
    s, upd = be.stream(), be.stream()
    ext = be.external_event()
    g = be.graph()
    with be.capture(g, s):
        ext.wait(s)
        ext.reset(s)
        be.graph_task_group_begin(s)
        be.launch(k, {"x": x, "lens": np.array([1, 2], np.int32)}, num_cores=24, stream=s)
        group = be.graph_task_group_end(s)
    g.replay(s)
    be.graph_task_update_begin(upd, group)
    be.launch(k, {"x": x, "lens": np.array([3, 4], np.int32)}, num_cores=24, stream=upd)
    be.graph_task_update_end(upd)
    ext.record(upd)
    s.synchronize()
    assert [c for c in log if c != "torch.npu.stream"] == [
        "torch.npu.Stream", "torch.npu.Stream", "torch.npu.ExternalEvent",
        "torch.npu.NPUGraph", "torch.npu.NPUGraph.capture_begin",
        "torch.npu.ExternalEvent.wait", "torch.npu.ExternalEvent.reset",
        "torch.npu.graph_task_group_begin", "torch.npu.graph_task_group_end",
        "torch.npu.NPUGraph.capture_end", "torch.npu.NPUGraph.replay",
        "torch.npu.graph_task_update_begin", "torch.npu.graph_task_update_end",
        "torch.npu.ExternalEvent.record", "torch.npu.Stream.synchronize"]
    assert [c["lens"].tolist() for c in calls] == [[1, 2], [3, 4]]
    assert all(isinstance(c["lens"], torch.Tensor) for c in calls)
    assert be.counters.task_updates == 1


def test_plain_events_and_streams(npu_log):
    be, log = npu_log
    a, b = be.stream(), be.stream()
    ev = a.record_event()
    b.wait_event(ev)
    ev.synchronize()
    be.copy_h2d(be.alloc([1], torch.int32), np.zeros(1, np.int32), stream=a)
    be.synchronize()
    # the copy: its staging block's event, waited on (nothing recorded yet), recorded after
    assert [c for c in log if c != "torch.npu.stream"][2:] == [
        "torch.npu.Event", "torch.npu.Event.record", "torch.npu.Stream.wait_event",
        "torch.npu.Event.synchronize", "torch.npu.Event", "torch.npu.Event.synchronize",
        "torch.npu.Event.record", "torch.npu.synchronize"]
