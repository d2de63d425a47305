"""CPU backend: streams run in order and asynchronously; events order streams."""

import threading

import numpy as np
import pytest
import torch

from pyruntime import backends
from pyruntime.backends import BackendError, DeviceBufferError, DeviceTaskError, Kernel, LaunchError


def gate_kernel(gate: threading.Event) -> Kernel:
    return Kernel("gate", "aicpu", lambda **_: gate.wait(5))


def append_kernel(log: list, tag: str) -> Kernel:
    return Kernel(f"append-{tag}", "aicpu", lambda **_: log.append(tag))


def test_get_names_and_unknown():
    assert set(backends.names()) == {"cpu", "npu"}
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        backends.get("tpu")


def test_npu_without_torch_npu_is_a_clear_error():
    with pytest.raises(BackendError, match="torch_npu"):
        backends.get("npu")


def test_stream_runs_asynchronously_and_in_order(cpu):
    gate, log = threading.Event(), []
    s = cpu.stream()
    cpu.launch(gate_kernel(gate), {}, stream=s)
    for tag in "abc":
        cpu.launch(append_kernel(log, tag), {}, stream=s)
    assert log == []  # the host got control back before the device ran anything
    gate.set()
    s.synchronize()
    assert log == ["a", "b", "c"]


def test_event_orders_two_streams(cpu):
    gate, log = threading.Event(), []
    a, b = cpu.stream("a"), cpu.stream("b")
    cpu.launch(gate_kernel(gate), {}, stream=a)
    cpu.launch(append_kernel(log, "a"), {}, stream=a)
    ev = a.record_event()
    b.wait_event(ev)
    cpu.launch(append_kernel(log, "b"), {}, stream=b)
    gate.set()
    b.synchronize()
    assert log == ["a", "b"]


def test_wait_on_never_recorded_plain_event_is_a_no_op(cpu):
    log = []
    s = cpu.stream()
    s.wait_event(cpu.event())
    cpu.launch(append_kernel(log, "x"), {}, stream=s)
    s.synchronize()
    assert log == ["x"]


def test_external_event_wait_before_record_blocks_until_recorded(cpu):
    log = []
    waiter, recorder = cpu.stream("w"), cpu.stream("r")
    ext = cpu.external_event()
    ext.wait(waiter)
    ext.reset(waiter)
    cpu.launch(append_kernel(log, "after-wait"), {}, stream=waiter)
    cpu.launch(append_kernel(log, "before-record"), {}, stream=recorder)
    ext.record(recorder)
    waiter.synchronize()
    assert log == ["before-record", "after-wait"]
    ext.record(recorder)  # reset ran, so it may be recorded again
    recorder.synchronize()


def test_external_event_recorded_twice_without_reset_fails_on_device(cpu):
    s = cpu.stream()
    ext = cpu.external_event()
    ext.record(s)
    ext.record(s)
    with pytest.raises(DeviceTaskError, match="recorded again before it was reset"):
        s.synchronize()
    s.synchronize()  # the error was reported once


def test_external_event_never_recorded_times_out_as_device_error():
    be = backends.get("cpu", wait_timeout_s=0.2)
    s = be.stream()
    be.external_event().wait(s)
    with pytest.raises(DeviceTaskError, match="did not happen"):
        s.synchronize()
    be.close()


def test_device_failure_is_reported_at_synchronize_and_skips_later_work(cpu):
    log = []

    def boom(**_):
        raise RuntimeError("bad core")

    s = cpu.stream()
    cpu.launch(Kernel("boom", "aicpu", boom), {}, stream=s)
    cpu.launch(append_kernel(log, "skipped"), {}, stream=s)
    with pytest.raises(DeviceTaskError, match="'boom' failed: RuntimeError: bad core"):
        s.synchronize()
    assert log == []


def test_copy_h2d_is_staged_and_ordered(cpu):
    dst = cpu.alloc([3], torch.int32)
    src = np.array([1, 2, 3], dtype=np.int32)
    s = cpu.stream()
    cpu.copy_h2d(dst, src, stream=s)
    src[:] = 9  # staged at the call: the copy still sees 1, 2, 3
    s.synchronize()
    assert dst.tolist() == [1, 2, 3]
    with pytest.raises(DeviceBufferError, match=r"source \(2,\) torch.int32 does not match"):
        cpu.copy_h2d(dst, src[:2], stream=s)
    with pytest.raises(DeviceBufferError, match="not a live device buffer"):
        cpu.copy_h2d(torch.zeros(3, dtype=torch.int32), src, stream=s)


def test_launch_validation(cpu):
    k = Kernel("k", "aicpu", lambda **_: None)
    with pytest.raises(LaunchError, match="runs as one task, got num_cores=2"):
        cpu.launch(k, {}, num_cores=2)
    with pytest.raises(DeviceBufferError, match="argument 'x' is not a live device buffer"):
        cpu.launch(k, {"x": torch.zeros(2)})
    buf = cpu.alloc([2], torch.float32)
    cpu.free(buf)
    with pytest.raises(DeviceBufferError, match="freed twice"):
        cpu.free(buf)
    with pytest.raises(ValueError, match="kind must be"):
        Kernel("bad", "gpu", lambda: None)


def test_aicore_task_runs_every_core_once_in_parallel(cpu):
    barrier = threading.Barrier(2, timeout=5)  # passes only if two cores run at once
    seen = cpu.alloc([8], torch.int32)

    def per_core(core, seen):
        if core < 2:
            barrier.wait()
        seen[core] += core + 1

    cpu.launch(Kernel("cores", "aicore", per_core), {"seen": seen}, num_cores=8)
    cpu.synchronize()
    assert seen.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert cpu.counters.launches_aicore == 1
    assert cpu.timings.by_kind["aicore"].count == 1


# ---- hold_device: the emulated device off the host's cores while the host measures ----------

def test_hold_device_starts_no_work_until_the_hold_ends(cpu):
    log = []
    s = cpu.stream()
    with cpu.hold_device():
        with cpu.hold_device():  # holds nest: only the outermost release lets work start
            cpu.launch(append_kernel(log, "a"), {}, stream=s)
        cpu.launch(append_kernel(log, "b"), {}, stream=s)
        threading.Event().wait(0.05)  # time enough for an unheld worker to have run both
        assert log == []
    s.synchronize()
    assert log == ["a", "b"]


def test_a_synchronize_inside_a_hold_lets_the_device_run(cpu):
    # host_update's step waits for the device inside its measured part: no deadlock
    log = []
    a, b = cpu.stream("a"), cpu.stream("b")
    with cpu.hold_device():
        cpu.launch(append_kernel(log, "a"), {}, stream=a)
        a.synchronize()
        assert log == ["a"]
        ev = a.record_event()
        b.wait_event(ev)
        cpu.launch(append_kernel(log, "b"), {}, stream=b)
        ev.synchronize()
        cpu.launch(append_kernel(log, "c"), {}, stream=a)  # held again after the waits
        threading.Event().wait(0.05)
        assert "c" not in log
    cpu.synchronize()
    assert log[0] == "a" and sorted(log[1:]) == ["b", "c"]


def test_the_base_backend_hold_is_a_no_op():
    from pyruntime.backends.base import Backend

    # an NPU's device does not run on the host's CPU: nothing to hold
    assert Backend.hold_device(object()).__class__.__name__ == "nullcontext"


def test_a_prepared_task_launches_like_launch_and_rechecks_after_a_free(cpu):
    """`make_task` checks and freezes a launch once; `launch_task` issues it with launch's
    counters and errors: a buffer freed since the check still refuses the launch."""
    add = Kernel("add1", "aicpu", lambda x, by: x.add_(float(by[0])))
    x, other = cpu.alloc([2], torch.float32), cpu.alloc([1], torch.float32)
    by = np.array([2.0])
    task = cpu.make_task(add, {"x": x, "by": by})
    by[0] = 100.0  # frozen at make_task, as launch freezes at the call
    s = cpu.stream()
    checks = []
    real = type(cpu)._check_buffer
    type(cpu)._check_buffer = lambda self, n, b: (checks.append(n), real(self, n, b))
    try:
        for _ in range(3):
            cpu.launch_task(task, stream=s)
        assert checks == []  # nothing freed since make_task: no per-launch check
        cpu.free(other)
        cpu.launch_task(task, stream=s)
        assert checks == ["x"]  # a free since: checked again, once
    finally:
        type(cpu)._check_buffer = real
    s.synchronize()
    assert x.tolist() == [8.0, 8.0] and cpu.counters.launches_aicpu == 4
    cpu.free(x)
    with pytest.raises(DeviceBufferError, match="argument 'x' is not a live device buffer"):
        cpu.launch_task(task, stream=s)
    with pytest.raises(LaunchError, match="runs as one task"):
        cpu.make_task(add, {"x": other}, num_cores=2)
