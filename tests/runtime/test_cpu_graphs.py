"""CPU backend: capture records, replay re-issues, task groups update per the CANN rules."""

import threading
import time

import pytest
import torch

from pyruntime.backends import CaptureError, DeviceTaskError, Kernel, TaskUpdateError

ADD = Kernel("add", "aicore", lambda core, x, value: x[core].add_(value))
SUB = Kernel("sub", "aicore", lambda core, x, value: x[core].sub_(value))
AICPU_ADD = Kernel("cpu_add", "aicpu", lambda x, value: x.add_(value))


def captured(cpu, body, stream=None):
    g = cpu.graph()
    stream = stream or cpu.stream("capture")
    with cpu.capture(g, stream):
        body(stream)
    return g, stream


def test_capture_records_and_replay_reissues(cpu):
    x = cpu.alloc([2], torch.float32)
    g, s = captured(cpu, lambda s: cpu.launch(ADD, {"x": x, "value": 1.0}, num_cores=2,
                                              stream=s))
    cpu.synchronize()
    assert x.tolist() == [0, 0]  # capture ran nothing
    for _ in range(3):
        g.replay(s)
    s.synchronize()
    assert x.tolist() == [3, 3]
    assert cpu.counters.replays == 3 and cpu.counters.launches_aicore == 1


def test_replay_cost_does_not_grow_with_graph_size(cpu):
    x = cpu.alloc([1], torch.float32)

    def body(s):
        for _ in range(50):
            cpu.launch(ADD, {"x": x, "value": 1.0}, num_cores=1, stream=s)

    g, s = captured(cpu, body)
    before = cpu.counters.snapshot()
    g.replay(s)
    s.synchronize()
    assert x.item() == 50
    after = cpu.counters.snapshot()
    assert after["launches_aicore"] == before["launches_aicore"]  # one host call, no launches


def test_state_machine_errors(cpu):
    x = cpu.alloc([1], torch.float32)
    g = cpu.graph()
    with pytest.raises(CaptureError, match="replay of a graph that is empty"):
        g.replay()
    s = cpu.stream()
    with pytest.raises(CaptureError, match="captured nothing"), cpu.capture(g, s):
        pass
    assert s.capturing is None  # the failed capture left the stream usable
    g.capture_begin(s)
    with pytest.raises(CaptureError, match="already capturing"):
        cpu.graph().capture_begin(s)
    with pytest.raises(CaptureError, match="copy_h2d .* while it captures"):
        cpu.copy_h2d(x, torch.zeros(1), stream=s)
    with pytest.raises(CaptureError, match="synchronize of .* while it captures"):
        s.synchronize()
    cpu.launch(ADD, {"x": x, "value": 1.0}, stream=s)
    g.capture_end()
    with pytest.raises(CaptureError, match="capture_begin on a graph that is captured"):
        g.capture_begin(s)
    with pytest.raises(CaptureError, match="capture_end on a graph that is captured"):
        g.capture_end()


def test_replay_after_a_buffer_was_freed_is_refused(cpu):
    x = cpu.alloc([1], torch.float32)
    g, s = captured(cpu, lambda s: cpu.launch(ADD, {"x": x, "value": 1.0}, stream=s))
    cpu.free(x)
    with pytest.raises(CaptureError, match="buffer 'x' used by the graph was freed"):
        g.replay(s)


def test_forked_stream_joins_the_capture_and_replays_in_order(cpu):
    x = cpu.alloc([1], torch.float32)
    main, side = cpu.stream("main"), cpu.stream("side")
    g = cpu.graph()
    with cpu.capture(g, main):
        side.wait_event(main.record_event())
        cpu.launch(AICPU_ADD, {"x": x, "value": 1.0}, stream=side)  # x = x + 1
        main.wait_event(side.record_event())
        cpu.launch(Kernel("double", "aicore", lambda c, x: x.mul_(2)), {"x": x}, stream=main)
    for _ in range(3):
        g.replay(main)
    main.synchronize()
    assert x.item() == (((0 + 1) * 2 + 1) * 2 + 1) * 2  # the side's +1 precedes each *2
    assert side.capturing is None


def test_forked_stream_not_joined_back_is_an_error(cpu):
    x = cpu.alloc([1], torch.float32)
    main, side = cpu.stream("main"), cpu.stream("side")
    g = cpu.graph()
    with pytest.raises(CaptureError, match="was not joined back"), cpu.capture(g, main):
        side.wait_event(main.record_event())
        cpu.launch(AICPU_ADD, {"x": x, "value": 1.0}, stream=side)
        cpu.launch(ADD, {"x": x, "value": 1.0}, stream=main)
    assert side.capturing is None and main.capturing is None


def _group_graph(cpu, x, ext):
    """Capture like vllm-ascend: wait + reset the external event, then one task group."""
    handles = []

    def body(s):
        ext.wait(s)
        ext.reset(s)
        cpu.graph_task_group_begin(s)
        cpu.launch(ADD, {"x": x, "value": 1.0}, num_cores=2, stream=s)
        handles.append(cpu.graph_task_group_end(s))

    g, s = captured(cpu, body)
    return g, s, handles[0]


def test_task_update_lands_before_the_waiting_node_runs(cpu):
    x = cpu.alloc([2], torch.float32)
    ext = cpu.external_event()
    g, s, group = _group_graph(cpu, x, ext)
    upd = cpu.stream("update")
    for step, value in enumerate([10.0, 100.0]):
        g.replay(s)
        cpu.graph_task_update_begin(upd, group)
        cpu.launch(ADD, {"x": x, "value": value}, num_cores=2, stream=upd)
        cpu.graph_task_update_end(upd)
        ext.record(upd)
        s.synchronize()
        assert x.tolist() == [[10.0, 10.0], [110.0, 110.0]][step]
    assert cpu.counters.task_updates == 2


def test_task_update_completes_asynchronously_in_update_stream_order(cpu):
    x = cpu.alloc([2], torch.float32)
    _g, _s, group = _group_graph(cpu, x, cpu.external_event())
    gate = threading.Event()
    upd = cpu.stream("update")
    cpu.launch(Kernel("gate", "aicpu", lambda: gate.wait(5)), {}, stream=upd)
    cpu.graph_task_update_begin(upd, group)
    cpu.launch(ADD, {"x": x, "value": 5.0}, num_cores=2, stream=upd)
    cpu.graph_task_update_end(upd)  # returns at once; lands after the gate
    assert group.native.slots[0].task.args["value"] == 1.0
    gate.set()
    upd.synchronize()
    assert group.native.slots[0].task.args["value"] == 5.0


def test_task_update_rule_violations(cpu):
    x = cpu.alloc([2], torch.float32)
    g, _s, group = _group_graph(cpu, x, cpu.external_event())
    capturing = cpu.stream("capturing")
    other = cpu.graph()
    other.capture_begin(capturing)
    with pytest.raises(TaskUpdateError, match="is capturing; CANN requires"):
        cpu.graph_task_update_begin(capturing, group)
    cpu.launch(ADD, {"x": x, "value": 1.0}, stream=capturing)
    other.capture_end()

    a, b = cpu.stream("a"), cpu.stream("b")
    cpu.graph_task_update_begin(a, group)
    with pytest.raises(TaskUpdateError, match="concurrent updates of one group"):
        cpu.graph_task_update_begin(b, group)
    with pytest.raises(TaskUpdateError, match=r"holds 1 task\(s\) \[\('aicore', 'add'\)\], "
                                              r"the update issued 2 task\(s\)"):
        cpu.launch(ADD, {"x": x, "value": 1.0}, num_cores=2, stream=a)
        cpu.launch(ADD, {"x": x, "value": 1.0}, num_cores=2, stream=a)
        cpu.graph_task_update_end(a)
    cpu.graph_task_update_begin(a, group)
    cpu.launch(SUB, {"x": x, "value": 1.0}, num_cores=2, stream=a)
    with pytest.raises(TaskUpdateError, match=r"\('aicore', 'sub'\)"):
        cpu.graph_task_update_end(a)
    with pytest.raises(TaskUpdateError, match="is not updating"):
        cpu.graph_task_update_end(a)

    gate = threading.Event()
    cpu.launch(Kernel("gate", "aicpu", lambda: gate.wait(5)), {}, stream=a)
    cpu.graph_task_update_begin(a, group)
    cpu.launch(ADD, {"x": x, "value": 1.0}, num_cores=2, stream=a)
    cpu.graph_task_update_end(a)
    with pytest.raises(TaskUpdateError, match="has not landed yet"):
        cpu.graph_task_update_begin(b, group)  # a's update is still in flight
    gate.set()
    a.synchronize()
    cpu.graph_task_update_begin(b, group)  # landed: b may update now
    cpu.launch(ADD, {"x": x, "value": 1.0}, num_cores=2, stream=b)
    cpu.graph_task_update_end(b)

    g.reset()
    with pytest.raises(TaskUpdateError, match="graph was reset"):
        cpu.graph_task_update_begin(a, group)


def test_task_group_misuse(cpu):
    s = cpu.stream()
    with pytest.raises(CaptureError, match="is not capturing"):
        cpu.graph_task_group_begin(s)
    g = cpu.graph()
    g.capture_begin(s)
    with pytest.raises(CaptureError, match="no task group is open"):
        cpu.graph_task_group_end(s)
    cpu.graph_task_group_begin(s)
    with pytest.raises(CaptureError, match="holds no task"):
        cpu.graph_task_group_end(s)
    x = cpu.alloc([1], torch.float32)
    cpu.launch(ADD, {"x": x, "value": 1.0}, stream=s)
    with pytest.raises(CaptureError, match="begun but not ended"):
        g.capture_end()


def test_replay_without_the_update_never_runs_the_group(cpu):
    from pyruntime import backends

    be = backends.get("cpu", wait_timeout_s=0.2)
    x = be.alloc([2], torch.float32)
    g, s, _ = _group_graph(be, x, be.external_event())
    g.replay(s)
    with pytest.raises(DeviceTaskError, match="ExternalEvent record did not happen"):
        s.synchronize()
    assert x.tolist() == [0.0, 0.0]
    be.close()


def test_a_forked_graph_starts_when_its_stream_reaches_it():
    """The EventError at K = 35, L = 61 (docs/benchmarks.md): replay enqueued the graph's
    side-stream nodes at the host call, so the side stream's captured wait for the fork
    started while the replay stream still ran earlier work, and the device-side wait
    timeout counted that backlog ("captured event record did not happen"). In CANN the
    graph runs as work of its stream (aclmdlRIExecuteAsync): nothing of it, forked streams
    included, starts before the stream reaches it. Made deterministic by a replay stream
    busy for longer than the wait timeout before the replay."""
    from pyruntime import backends

    be = backends.get("cpu", wait_timeout_s=0.3)
    try:
        x = be.alloc([1], torch.float32)
        busy = Kernel("busy", "aicore", lambda core, x: time.sleep(0.8))
        g = be.graph()
        main, side = be.stream("main"), be.stream("aicpu")
        with be.capture(g, main):  # the device-tiling graph's shape: fork, AI-CPU, join
            side.wait_event(main.record_event())
            be.launch(AICPU_ADD, {"x": x, "value": 1.0}, stream=side)
            main.wait_event(side.record_event())
            be.launch(ADD, {"x": x, "value": 10.0}, num_cores=1, stream=main)
        be.launch(busy, {"x": x}, num_cores=1, stream=main)  # earlier work on the stream
        submits = []
        real = type(main.native).submit
        for worker in be._workers:  # the host call: one submit, on the replay stream
            worker.submit = lambda *a, w=worker: (submits.append(w.name), real(w, *a))
        g.replay(main)
        assert submits == [main.native.name]
        main.synchronize()  # raised DeviceTaskError (EventError) before the fix
        assert x.item() == 11.0
    finally:
        be.close()
