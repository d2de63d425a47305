"""The NPU twin's rules (`pyruntime.npu_twin.device`), one check per rule.

Each group of rules runs as one twin subprocess (`conftest.TwinRunner`): its script checks
every rule of the group under the rule's name and prints rule -> "ok" or what it raised;
the groups this session selected start together, the first time a test needs one, and each
test below reads its rule's outcome. A rule's line in `RULES` says which real rule it
mirrors (torch, torch_npu 2.10.0.post4, CANN's runtime; sources in the docstring of
`pyruntime.npu_twin.device`).
"""

from __future__ import annotations

import dataclasses

import pytest

from pyruntime.npu_twin import tensor_layer

pytest.importorskip("triton", reason="the twin's AI Core runs our Triton kernels")

# ---- scripts ---------------------------------------------------------------------------------
COMMON = """
import gc
from pyruntime.npu_twin import device as twin
from pyruntime.npu_twin.npu_module import NotInTwinError
CV = twin.CaptureViolation
POISON = [twin.POISON]


def raw(t):
    # the distinct bytes of a device tensor (read after the work that matters ran)
    return t.cpu().contiguous().view(torch.uint8).unique().tolist()


def values(t):
    return t.cpu().tolist()
"""

MEMORY = COMMON + """
x = torch.arange(3.0).to("npu")
def resized_out_has_its_shape():
    ranged = torch.arange(3, dtype=torch.float32, device="npu")  # arange.out into empty(0)
    added = torch.add(torch.ones(3, device="npu"), 1, out=torch.empty(0, device="npu"))
    torch.npu.synchronize()
    eq((tuple(ranged.shape), tuple(added.shape)), ((3,), (3,)))
    eq((values(ranged), values(added)), ([0.0, 1.0, 2.0], [2.0] * 3))


check("op_resizing_its_out_argument_gives_its_shape", resized_out_has_its_shape)
check("numpy_raises_torch_typeerror", lambda: expect(
    TypeError, "can't convert npu:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
    "tensor to host memory first.", x.numpy))
check("cpu_works_outside_capture", lambda: eq(x.cpu().tolist(), [0.0, 1.0, 2.0]))
check("tolist_works_outside_capture", lambda: eq(x.tolist(), [0.0, 1.0, 2.0]))
check("item_works_outside_capture", lambda: eq(x[2].item(), 2.0))

host = torch.ones(3)
other, event = torch.npu.Stream(), torch.npu.Event()
event.record(other)
torch.npu.synchronize()
READ = "a device-to-host copy"
H2D = "a host-to-device copy (it would freeze a host address in the graph) while a graph is " \\
      "capturing"
with capture() as (g, s):
    check("cpu_refused_in_capture", lambda: expect(CV, READ, x.cpu))
    check("tolist_refused_in_capture", lambda: expect(CV, READ, x.tolist))
    check("item_refused_in_capture", lambda: expect(CV, READ, x[0].item))
    check("synchronize_refused_in_capture", lambda: expect(
        CV, "torch.npu.synchronize() while a graph is capturing", torch.npu.synchronize))
    check("stream_synchronize_refused_in_capture", lambda: expect(
        CV, "Stream.synchronize() while a graph is capturing", other.synchronize))
    check("stream_query_refused_in_capture", lambda: expect(
        CV, "Stream.query() while a graph is capturing", other.query))
    check("event_query_refused_in_capture", lambda: expect(
        CV, "Event.query() while a graph is capturing", event.query))
    check("event_synchronize_refused_in_capture", lambda: expect(
        CV, "Event.synchronize() while a graph is capturing", event.synchronize))
    check("copy_from_host_refused_in_capture", lambda: expect(CV, H2D, lambda: x.copy_(host)))
    check("to_npu_refused_in_capture", lambda: expect(CV, H2D, lambda: host.to("npu")))

# capture records and does not run; replay re-runs on the same storages
base = torch.ones(4, device="npu")
u = torch.full((4,), 2.0, device="npu")
torch.npu.synchronize()
fill_value = 7
with capture() as (g, s):
    z = torch.zeros(4, device="npu")
    base.fill_(fill_value)
    y = base + 1
    w = u * 10
fill_value = 100
torch.npu.synchronize()
check("capture_does_not_run_zeros", lambda: eq(raw(z), POISON))
check("capture_does_not_run_fill", lambda: eq(values(base), [1.0] * 4))
check("capture_does_not_run_add", lambda: eq(raw(y), POISON))
g.replay()
torch.npu.synchronize()
check("replay_runs_captured_zeros", lambda: eq(values(z), [0.0] * 4))
check("replay_runs_captured_fill", lambda: eq(values(base), [7.0] * 4))
check("replay_runs_captured_add", lambda: eq(values(y), [8.0] * 4))
base.copy_(torch.full((4,), 3.0))
u.copy_(torch.full((4,), 5.0))
y.zero_()
torch.npu.synchronize()
g.replay()
torch.npu.synchronize()
check("every_replay_reruns_captured_fill", lambda: eq((values(base), values(y)),
                                                      ([7.0] * 4, [8.0] * 4)))
check("replay_reads_current_device_memory", lambda: eq(values(w), [50.0] * 4))
check("python_scalar_frozen_at_capture", lambda: eq(values(base), [7.0] * 4))


def cpu_scalar_tensor_frozen_at_capture():
    t = torch.tensor(5.0)
    q = torch.zeros(2, device="npu")
    torch.npu.synchronize()
    with capture() as (graph, _):
        q.fill_(t)
    t.fill_(9.0)
    graph.replay()
    torch.npu.synchronize()
    eq(values(q), [5.0, 5.0])


def cpu_scalar_tensor_read_at_issue():
    t = torch.tensor(5.0)
    q = torch.zeros(2, device="npu")
    q.fill_(t)
    r = q + t
    t.fill_(9.0)
    torch.npu.synchronize()
    eq((values(q), values(r)), ([5.0, 5.0], [10.0, 10.0]))


check("cpu_scalar_tensor_frozen_at_capture", cpu_scalar_tensor_frozen_at_capture)
check("cpu_scalar_tensor_read_at_issue", cpu_scalar_tensor_read_at_issue)


# work is asynchronous
def ops_queue_until_sync():
    a = torch.zeros(3, device="npu")
    torch.npu.synchronize()
    stream = torch.npu.current_stream()
    a.add_(1)
    done = stream.record_event()
    eq((stream.query(), done.query(), twin.inner(a).tolist()), (False, False, [0.0] * 3))
    torch.npu.synchronize()
    eq((stream.query(), done.query(), twin.inner(a).tolist()), (True, True, [1.0] * 3))


check("ops_queue_until_sync", ops_queue_until_sync)
d = torch.empty(4, device="npu")
torch.npu.synchronize()


def rewritten():
    src = torch.arange(4.0)
    d.copy_(src, non_blocking=True)
    src.add_(1)
    expect(twin.PageableCopyRace, "ran after its pageable source was rewritten",
           torch.npu.synchronize)


def freed():
    src = torch.arange(4.0)
    d.copy_(src, non_blocking=True)
    del src
    gc.collect()
    expect(twin.PageableCopyRace, "ran after its pageable source tensor was freed",
           torch.npu.synchronize)


def to_rewritten():
    src = torch.arange(4.0)
    out = src.to("npu", non_blocking=True)
    src.mul_(2)
    expect(twin.PageableCopyRace, "source was rewritten", torch.npu.synchronize)
    del out


def blocking_then_rewritten():
    src = torch.arange(4.0)
    d.copy_(src, non_blocking=False)
    src.add_(1)
    del src
    gc.collect()
    torch.npu.synchronize()
    eq(values(d), [0.0, 1.0, 2.0, 3.0])


def non_blocking_untouched():
    src = torch.arange(4.0) * 3
    d.copy_(src, non_blocking=True)
    torch.npu.synchronize()
    eq(values(d), [0.0, 3.0, 6.0, 9.0])


check("non_blocking_copy_of_rewritten_pageable_races", rewritten)
check("non_blocking_copy_of_freed_pageable_races", freed)
check("non_blocking_to_npu_of_rewritten_pageable_races", to_rewritten)
check("blocking_copy_of_pageable_is_safe", blocking_then_rewritten)
check("non_blocking_copy_of_untouched_pageable_is_fine", non_blocking_untouched)


def pinned_freed():
    src = (torch.arange(4.0) * 5).pin_memory()
    eq((src.is_pinned(), torch.arange(2.0).is_pinned()), (True, False))
    d.copy_(src, non_blocking=True)
    del src
    gc.collect()
    torch.npu.synchronize()
    eq(values(d), [0.0, 5.0, 10.0, 15.0])


def pinned_rewritten():
    src = torch.arange(4.0).pin_memory()
    out = src.to("npu", non_blocking=True)
    src.add_(1)
    expect(twin.PageableCopyRace, "ran after its pinned source was rewritten",
           torch.npu.synchronize)
    del out


def weak_ref_aliases():
    import torch_npu

    owner = torch.arange(3.0).to("npu")
    alias = torch_npu._C._weak_ref_tensor(owner)
    owner.add_(1)
    eq(values(alias), [1.0, 2.0, 3.0])
    expect(TypeError, "expects an npu tensor", lambda: torch_npu._C._weak_ref_tensor(host))


def torch_npu_has_a_spec():
    import importlib.util

    eq(importlib.util.find_spec("torch_npu").name, "torch_npu")


check("pinned_source_outlives_its_queued_copy", pinned_freed)
check("non_blocking_copy_of_rewritten_pinned_races", pinned_rewritten)
check("weak_ref_tensor_aliases_device_memory", weak_ref_aliases)
check("torch_npu_is_found_by_find_spec", torch_npu_has_a_spec)
"""

STREAMS = COMMON + """
Stream, Event, NPUGraph = torch.npu.Stream, torch.npu.Event, torch.npu.NPUGraph
x = torch.zeros(1, device="npu")
torch.npu.synchronize()


def reset_x():
    x.zero_()
    torch.npu.synchronize()


check("capture_begin_on_default_stream_refused", lambda: expect(
    CV, "capture_begin on the default stream", NPUGraph().capture_begin))

refused = NPUGraph()


def not_joined_back():
    a, b = Stream(), Stream()
    with torch.npu.stream(a):
        refused.capture_begin()
        b.wait_event(a.record_event())
        with torch.npu.stream(b):
            x.add_(1)
        expect(CV, "joined the capture and was not joined back", refused.capture_end)
    eq(torch.npu.is_current_stream_capturing(), False)
    torch.npu.synchronize()  # nothing captures any more


def joined_directly():
    reset_x()
    g, a, b = NPUGraph(), Stream(), Stream()
    with torch.npu.stream(a):
        g.capture_begin()
        b.wait_event(a.record_event())
        with torch.npu.stream(b):
            x.add_(1)
        a.wait_event(b.record_event())
        g.capture_end()
    g.replay()
    torch.npu.synchronize()
    eq(values(x), [1.0])


def joined_transitively():
    reset_x()
    g, a, b, c = NPUGraph(), Stream(), Stream(), Stream()
    with torch.npu.stream(a):
        g.capture_begin()
        b.wait_event(a.record_event())      # A forks B
        with torch.npu.stream(b):
            x.add_(1)
        c.wait_event(b.record_event())      # B forks C
        with torch.npu.stream(c):
            x.mul_(3)
        b.wait_event(c.record_event())      # C joins B
        a.wait_event(b.record_event())      # B joins A
        g.capture_end()
    g.replay()
    torch.npu.synchronize()
    eq(values(x), [3.0])


def joined_through_stream_too_early():
    g, a, b, c = NPUGraph(), Stream(), Stream(), Stream()
    with torch.npu.stream(a):
        g.capture_begin()
        b.wait_event(a.record_event())
        c.wait_event(b.record_event())
        with torch.npu.stream(c):
            x.add_(1)
        a.wait_event(b.record_event())      # B joins A before C joined B
        b.wait_event(c.record_event())
        expect(CV, "was not joined back", g.capture_end)


check("fork_not_joined_back_refused_at_capture_end", not_joined_back)
check("replay_after_refused_capture_refused", lambda: expect(
    CV, "replay of a graph that is empty", refused.replay))
check("fork_joined_back_directly_accepted", joined_directly)
check("fork_joined_back_transitively_accepted", joined_transitively)
check("join_through_stream_joined_too_early_refused", joined_through_stream_too_early)

before = Event()
before.record(Stream())
torch.npu.synchronize()
with capture() as (g, s):
    check("wait_on_event_recorded_before_capture_refused", lambda: expect(
        CV, "waits on an Event recorded outside the capture: use torch.npu.ExternalEvent",
        lambda: s.wait_event(before)))
    timing = Event(enable_timing=True)
    timing.record(s)
    check("wait_on_timing_event_in_capture_refused", lambda: expect(
        CV, "enable_timing=True cannot be waited on in a capture",
        lambda: Stream().wait_event(timing)))


def external_event():
    reset_x()
    ext, s, r, g = torch.npu.ExternalEvent(), Stream(), Stream(), NPUGraph()
    with torch.npu.stream(s):
        g.capture_begin()
        ext.wait(s)            # before any record of it: allowed
        ext.reset(s)
        x.add_(1)
        g.capture_end()
    probe = torch.zeros(1, device="npu")
    torch.npu.synchronize()
    return ext, s, r, g, probe


ext, s, r, g, probe = None, None, None, None, None


def waitable_before_record():
    global ext, s, r, g, probe
    ext, s, r, g, probe = external_event()


def blocks_until_recorded():
    with torch.npu.stream(s):
        g.replay()
    with torch.npu.stream(r):
        probe.fill_(5)
    r.synchronize()  # the device runs what it can: r, not s behind the event
    eq((values(probe), values(x), s.query()), ([5.0], [0.0], False))
    ext.record(r)
    torch.npu.synchronize()
    eq((values(x), s.query()), ([1.0], True))


def reset_clears():
    with torch.npu.stream(s):
        g.replay()     # the replay's captured reset cleared the record of the last step
    with torch.npu.stream(r):
        probe.fill_(6)
    r.synchronize()
    eq((values(probe), values(x), s.query()), ([6.0], [1.0], False))
    ext.record(r)
    torch.npu.synchronize()
    eq(values(x), [2.0])


check("external_event_waitable_in_capture_before_record", waitable_before_record)
check("external_event_blocks_replayed_work_until_recorded", blocks_until_recorded)
check("external_event_reset_clears_it", reset_clears)


def hang():
    never, q = torch.npu.ExternalEvent(), Stream()
    never.wait(q)
    with torch.npu.stream(q):
        x.add_(1)
    exc = expect(twin.DeviceHang, "no stream can run", torch.npu.synchronize)
    assert repr(q.state) in str(exc) and "ExternalEvent.wait" in str(exc), str(exc)
    never.record(Stream())
    torch.npu.synchronize()


check("wait_on_never_recorded_external_event_hangs_synchronize", hang)

# graph state machine
check("replay_of_uncaptured_graph_refused", lambda: expect(
    CV, "replay of a graph that is empty", NPUGraph().replay))


def replay_after_reset():
    with capture() as (graph, _):
        x.add_(1)
    graph.reset()
    expect(CV, "replay of a graph that is empty", graph.replay)


check("replay_after_reset_refused", replay_after_reset)

# last: a reset during capture leaves the stream capturing for good
gr, sr = NPUGraph(), Stream()
with torch.npu.stream(sr):
    gr.capture_begin()
    x.add_(1)
    gr.reset()
    check("reset_does_not_end_capture", lambda: (
        eq(torch.npu.is_current_stream_capturing(), True),
        expect(CV, "for a graph that was reset without capture_end", lambda: x.add_(1))))
    check("capture_begin_after_reset_while_capturing_refused", lambda: expect(
        CV, "is already capturing", gr.capture_begin))
    check("synchronize_still_refused_after_reset_while_capturing", lambda: expect(
        CV, "while a graph is capturing", torch.npu.synchronize))
"""

TILING = """
from pyruntime import tiling
from pyruntime.kernels import step
PARAMS = tiling.TilingParams(num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                             max_batch=2, max_tokens=4, max_blocks_per_req=4, num_cores=3)


def i32(values):
    return torch.tensor(values, dtype=torch.int32).to("npu")


cu, kv, batch, epoch = i32([0, 1, 2]), i32([40, 20]), i32([2]), i32([1])
tiling_out = torch.empty(PARAMS.tiling_bytes, dtype=torch.uint8, device="npu")


def plan():
    torch.ops.aicpu_tiling.plan_tiling(cu, kv, batch, epoch, tiling_out,
                                       step.params_list(PARAMS), True)


def header_epoch():
    torch.npu.synchronize()
    return int(tiling_out.cpu().view(torch.int32)[tiling.HDR_EPOCH])


def replayed_epochs():
    # eager at epoch 1, then captured; replays at epochs 2 and 3: the header's epochs
    plan()
    first = header_epoch()
    with capture() as (graph, _):
        plan()
    seen = [first]
    for e in (2, 3):
        epoch.copy_(torch.tensor([e], dtype=torch.int32))
        graph.replay()
        seen.append(header_epoch())
    return seen
"""

GROUPS = COMMON + TILING + """
from pyruntime.backends import npu_kernels
npu_kernels.load()
Stream, NPUGraph = torch.npu.Stream, torch.npu.NPUGraph
begin, end = torch.npu.graph_task_group_begin, torch.npu.graph_task_group_end
update_begin, update_end = torch.npu.graph_task_update_begin, torch.npu.graph_task_update_end
x = torch.arange(4, dtype=torch.float32).to("npu")
y = torch.zeros(4, device="npu")
torch.npu.synchronize()
X = [0.0, 1.0, 2.0, 3.0]


def plus(k):
    return [v + k for v in X]


check("group_begin_on_non_capturing_stream_refused", lambda: expect(
    CV, "graph_task_group_begin: <npu-twin stream", lambda: begin(Stream())))


def empty_group():
    with capture() as (_, s):
        begin(s)
        expect(CV, "graph_task_group_end: the group holds no task", lambda: end(s))


check("empty_task_group_refused_at_end", empty_group)

# vLLM-Ascend's handshake: the replay waits on an ExternalEvent the update stream records
ext, s, upd, g = torch.npu.ExternalEvent(), Stream(), Stream(), NPUGraph()
with torch.npu.stream(s):
    g.capture_begin()
    ext.wait(s)
    ext.reset(s)
    begin(s)
    torch.add(x, 1, out=y)
    handle = end(s)
    check("update_begin_on_capturing_stream_refused", lambda: expect(
        CV, "graph_task_update_begin on a capturing stream", lambda: update_begin(s, handle)))
    g.capture_end()


def reissue(*ops):
    update_begin(upd, handle)
    with torch.npu.stream(upd):
        for op in ops:
            op()


check("update_with_more_tasks_refused", lambda: (
    reissue(lambda: torch.add(x, 2, out=y), lambda: torch.add(x, 3, out=y)),
    expect(CV, "graph_task_update_end: the group holds ['aten.add.out'], the update issued "
               "['aten.add.out', 'aten.add.out']", lambda: update_end(upd))))
check("update_with_other_kind_of_task_refused", lambda: (
    reissue(lambda: torch.mul(x, 2, out=y)),
    expect(CV, "the group holds ['aten.add.out'], the update issued ['aten.mul.out']",
           lambda: update_end(upd))))
check("update_may_reissue_kernels_only", lambda: (
    reissue(),
    expect(CV, "only kernel launches may be re-issued",
           lambda: torch.npu.ExternalEvent().record(upd)),
    expect(CV, "the update issued []", lambda: update_end(upd))))


def handshake_update():
    with torch.npu.stream(s):
        g.replay()
    reissue(lambda: torch.add(x, 5, out=y))
    update_end(upd)
    ext.record(upd)
    torch.npu.synchronize()
    eq(values(y), plus(5))


check("task_update_changes_what_replay_computes", handshake_update)


def lands_when_update_stream_runs():
    y2 = torch.zeros(4, device="npu")
    s2, g2, gate = Stream(), NPUGraph(), torch.npu.ExternalEvent()
    with torch.npu.stream(s2):
        g2.capture_begin()
        begin(s2)
        torch.add(x, 1, out=y2)
        h2 = end(s2)
        g2.capture_end()
    gate.wait(upd)               # the update stream is held back
    update_begin(upd, h2)
    with torch.npu.stream(upd):
        torch.add(x, 7, out=y2)
    update_end(upd)
    try:
        with torch.npu.stream(s2):
            g2.replay()
        s2.synchronize()
        eq(values(y2), plus(1))  # update issued, not landed
    finally:
        gate.record(Stream())
    upd.synchronize()
    with torch.npu.stream(s2):
        g2.replay()
    s2.synchronize()
    eq(values(y2), plus(7))


check("task_update_lands_when_update_stream_runs", lands_when_update_stream_runs)


def update_of_reset_graph():
    with capture() as (graph, st):
        begin(st)
        x.add_(0)
        h3 = end(st)
    graph.reset()
    expect(CV, "the handle's graph was reset or is not captured", lambda: update_begin(upd, h3))


check("update_of_reset_graph_refused", update_of_reset_graph)


def aicpu_in_group():
    with capture() as (_, st):
        begin(st)
        try:
            expect(CV, "an AI-CPU task cannot join a task group", plan)
        finally:
            if st.state.open_group is not None:
                st.state.open_group = None  # close it whatever it holds


check("aicpu_task_cannot_join_task_group", aicpu_in_group)
check("captured_aicpu_task_reruns_at_replay", lambda: eq(replayed_epochs(), [1, 2, 3]))
"""

NO_AICPU_REPLAY = COMMON + TILING + """
from pyruntime.backends import npu_kernels
npu_kernels.load()
check("no_aicpu_replay_fault_skips_captured_aicpu_task",
      lambda: eq(replayed_epochs(), [1, 1, 1]))


def ops_still_replay():
    a = torch.zeros(2, device="npu")
    torch.npu.synchronize()
    with capture() as (graph, _):
        a.add_(1)
    graph.replay()
    graph.replay()
    torch.npu.synchronize()
    eq(values(a), [2.0, 2.0])


check("no_aicpu_replay_fault_still_replays_other_tasks", ops_still_replay)
"""

COMBINE = """
from pyruntime import tiling
from pyruntime.kernels import reference_attention, triton_launch
PARAMS = tiling.TilingParams(num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                             max_batch=2, max_tokens=4, max_blocks_per_req=4, num_cores=3)


def combine_args():
    # a planned tiling and the combine's buffers, all on the npu
    plan = torch.from_numpy(tiling.plan(PARAMS, [0, 1, 3], [40, 20]).buffer).to("npu")
    po, pl = reference_attention.partial_buffers(PARAMS)
    return dict(tiling_in=plan, step_epoch=torch.zeros(1, dtype=torch.int32).to("npu"),
                cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32).to("npu"),
                out=torch.zeros(4, 8, 32).to("npu"), partial_out=po.to("npu"),
                partial_lse=pl.to("npu"))
"""

HOST = COMMON + TILING + COMBINE + """
import torch_npu
x = torch.arange(3.0).to("npu")
# the wrapper layer refuses it in its dispatch; on plain tensors torch's TensorIterator (the
# structured kernels' meta step, before any npu kernel) raises its own same-device error
HOST_TENSOR_REFUSED = (twin.HostPointerError, "a host tensor of shape (3,) among npu tensors") \
    if twin._plain_host_alias is None else \
    (RuntimeError, "Expected all tensors to be on the same device, but found at least two "
                   "devices, npu:0 and cpu!")
check("aten_op_with_cpu_tensor_raises_host_pointer", lambda: expect(
    *HOST_TENSOR_REFUSED, lambda: x + torch.ones(3)))
check("aten_op_with_cpu_scalar_tensor_allowed",
      lambda: eq(values(x + torch.tensor(2.0)), [2.0, 3.0, 4.0]))


def custom_op_unloaded():
    from pyruntime.kernels import custom_ops

    custom_ops.ops()  # the schema (and CPU body) only: the extension is not loaded
    expect(twin.TwinError, "aicpu_tiling::plan_tiling has no NPU (PrivateUse1) kernel: the "
                           "extension that registers it is not loaded", plan)


check("custom_op_without_npu_kernel_raises", custom_op_unloaded)
from pyruntime.backends import npu_kernels
npu_kernels.load()


def plan_after_load():
    plan()
    eq(header_epoch(), 1)


check("custom_op_runs_once_extension_loaded", plan_after_load)
args = combine_args()


def combine_with(name):
    bad = dict(args)
    bad[name] = bad[name].cpu()
    expect(twin.HostPointerError, "triton kernel attention_combine_kernel: argument on cpu",
           lambda: triton_launch.launch_combine(PARAMS, **bad))


check("triton_launch_with_cpu_step_epoch_raises_host_pointer",
      lambda: combine_with("step_epoch"))
check("triton_launch_with_cpu_partial_lse_raises_host_pointer",
      lambda: combine_with("partial_lse"))
check("triton_launch_on_npu_tensors_runs", lambda: eq(
    values(triton_launch.launch_combine(PARAMS, **args)), [0, 0, 0]))


def mla_with_host(name):
    # the MLA custom op (what the hook's MLA capture launches) with one host tensor: the
    # Triton MLA kernel's launch is refused as the GQA one is
    from pyruntime.kernels import reference_mla
    from pyruntime.mla_attention import mla_tiling_params

    lora, rope = 32, 16
    p = mla_tiling_params(num_heads=4, kv_lora_rank=lora, qk_rope_head_dim=rope, block_size=16,
                          max_batch=2, max_tokens=4, max_blocks_per_req=4, num_cores=3)
    po, pl = reference_mla.partial_buffers(p, lora)
    npu = dict(
        q_nope=torch.zeros(4, 4, lora), q_pe=torch.zeros(4, 4, rope),
        kv_c_cache=torch.zeros(8, 16, 1, lora), k_pe_cache=torch.zeros(8, 16, 1, rope),
        block_table=torch.zeros(2, 4, dtype=torch.int32),
        cu_seqlens_q=torch.tensor([0, 1, 3], dtype=torch.int32),
        seqlens_kv=torch.tensor([40, 20], dtype=torch.int32),
        step_epoch=torch.zeros(1, dtype=torch.int32),
        tiling_in=torch.from_numpy(tiling.plan(p, [0, 1, 3], [40, 20]).buffer),
        out=torch.zeros(4, 4, lora), partial_out=po, partial_lse=pl)
    npu = {k: (v if k == name else v.to("npu")) for k, v in npu.items()}
    # The Triton body's launch names the kernel; the C reference body that may stand in for
    # it (AICPU_TILING_TWIN_AICORE=reference, set by the selfcheck runs) names the op.
    exc = expect(twin.HostPointerError, "",
                 lambda: torch.ops.aicpu_tiling.mla_attention(
                     **npu, params=kernels_step.params_list(p), kv_lora_rank=lora, scale=0.1,
                     causal=True))
    assert ("mla_decode_kernel: argument on cpu" in str(exc)
            or "mla_attention.default: a host tensor handed to an AI Core kernel" in str(exc)), exc


from pyruntime.kernels import step as kernels_step  # noqa: E402

check("mla_custom_op_with_cpu_cache_raises_host_pointer",
      lambda: mla_with_host("k_pe_cache"))

# torch_npu placeholders
check("unknown_torch_npu_name_raises_not_in_twin", lambda: expect(
    NotInTwinError, "torch_npu.npu_made_up_op is not implemented by the NPU twin",
    lambda: torch_npu.npu_made_up_op(1, key=2)))
check("unknown_torch_npu_c_name_raises_not_in_twin", lambda: expect(
    NotInTwinError, "torch_npu._C._made_up is not implemented by the NPU twin",
    lambda: torch_npu._C._made_up()))
check("unknown_torch_npu_npu_name_raises_not_in_twin", lambda: expect(
    NotInTwinError, "torch.npu.some_unknown is not implemented by the NPU twin",
    lambda: torch.npu.some_unknown()))
check("not_in_twin_is_not_implemented_error", lambda: eq(
    issubclass(NotInTwinError, NotImplementedError), True))


def dunders():
    for module in (torch_npu, torch_npu._C, torch.npu):
        for name in ("__wrapped__", "__made_up__"):
            expect(AttributeError, name, lambda: getattr(module, name))
            eq(hasattr(module, name), False)


check("dunder_lookups_raise_attribute_error", dunders)

# this process runs with TASK_QUEUE_ENABLE=2
REFUSAL = "Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture"


def task_queue_refusal():
    with torch.npu.stream(torch.npu.Stream()):
        expect(RuntimeError, REFUSAL, torch.npu.NPUGraph().capture_begin)
        eq(torch.npu.is_current_stream_capturing(), False)
    torch.npu.synchronize()


check("task_queue_enable_2_refuses_capture_begin", task_queue_refusal)
"""

CAPTURE_REFUSED = COMMON + """
def refused():
    with torch.npu.stream(torch.npu.Stream()):
        expect(RuntimeError, "Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture",
               torch.npu.NPUGraph().capture_begin)
        eq(torch.npu.is_current_stream_capturing(), False)


def eager_still_runs():
    a = torch.ones(2, device="npu") * 3
    eq(values(a), [3.0, 3.0])


check("capture_refused_fault_refuses_capture_begin", refused)
check("capture_refused_fault_leaves_eager_work", eager_still_runs)
"""

LOST = COMMON + COMBINE + """
from pyruntime.kernels import triton_launch
a = torch.ones(3, device="npu")
check("plain_ops_run_before_first_ai_core_task", lambda: eq(values(a + 1), [2.0] * 3))
args = combine_args()
triton_launch.launch_combine(PARAMS, **args)  # issued fine: the fault strikes when it runs
check("first_ai_core_task_raises_device_lost", lambda: expect(
    twin.DeviceLostError, "the AI Core faulted running triton attention_combine_kernel",
    torch.npu.synchronize))
LOST = "every later call fails"
check("lost_then_allocation_raises", lambda: expect(
    twin.DeviceLostError, LOST, lambda: torch.zeros(1, device="npu")))
check("lost_then_op_raises", lambda: expect(twin.DeviceLostError, LOST, lambda: a + 1))
check("lost_then_synchronize_raises", lambda: expect(
    twin.DeviceLostError, LOST, torch.npu.synchronize))
check("lost_then_host_read_raises", lambda: expect(twin.DeviceLostError, LOST, a.cpu))
check("lost_then_copy_to_device_raises", lambda: expect(
    twin.DeviceLostError, LOST, lambda: a.copy_(torch.zeros(3))))
check("lost_then_stream_raises", lambda: expect(twin.DeviceLostError, LOST, torch.npu.Stream))
"""

LOST_AFTER = COMMON + """
check("new_process_with_lost_state_starts_lost", lambda: expect(
    twin.DeviceLostError, "(twin fault device-lost: the AI Core faulted running triton "
    "attention_combine_kernel); every later call fails", lambda: torch.zeros(1, device="npu")))
check("new_process_with_lost_state_set_device_raises", lambda: expect(
    twin.DeviceLostError, "every later call fails", lambda: torch.npu.set_device(0)))
"""


@dataclasses.dataclass(frozen=True)
class Group:
    script: str
    fault: str | None = None
    env: dict | None = None
    #: a second script run after the first in a new process sharing its state directory
    then: str | None = None


SCRIPTS = {
    "memory": Group(MEMORY),
    "streams": Group(STREAMS),
    "groups": Group(GROUPS),
    "no_aicpu_replay": Group(NO_AICPU_REPLAY, fault="no-aicpu-replay"),
    "host": Group(HOST, env={"TASK_QUEUE_ENABLE": "2"}),
    "capture_refused": Group(CAPTURE_REFUSED, fault="capture-refused"),
    "device_lost": Group(LOST, fault="device-lost", then=LOST_AFTER),
}

# ---- rules -----------------------------------------------------------------------------------
RESIZE_BUG = (
    "not modelled: an op that resizes its out= argument (torch.arange(3, device='npu'), "
    "torch.add(a, 1, out=torch.empty(0, device='npu'))) raises TwinError instead of resizing "
    "the wrapper, whose shape is fixed when it is made")

#: group -> rule -> the real rule it mirrors (a tuple with an xfail reason where the twin
#: does not model it)
RULES: dict[str, dict[str, str | tuple[str, str]]] = {
    "memory": {
        "numpy_raises_torch_typeerror":
            "torch: Tensor.numpy() on a non-CPU tensor raises TypeError (its exact text)",
        "op_resizing_its_out_argument_gives_its_shape": (
            "torch: an out= op resizes its output (torch.arange(n, device='npu') has n values)",
            RESIZE_BUG),
        "cpu_works_outside_capture": "torch_npu: .cpu() is a synchronous D2H copy",
        "tolist_works_outside_capture": "torch_npu: .tolist() is a synchronous D2H copy",
        "item_works_outside_capture": "torch_npu: .item() is a synchronous D2H copy",
        "cpu_refused_in_capture": "graphs.py capture mode global: no D2H copy (.cpu())",
        "tolist_refused_in_capture": "capture mode global: no D2H copy (.tolist())",
        "item_refused_in_capture": "capture mode global: no D2H copy (.item())",
        "synchronize_refused_in_capture": "capture: torch.npu.synchronize() is refused",
        "stream_synchronize_refused_in_capture":
            "capture: Stream.synchronize() is refused, on any stream",
        "stream_query_refused_in_capture": "capture: Stream.query() is refused",
        "event_query_refused_in_capture": "capture: Event.query() is refused",
        "event_synchronize_refused_in_capture": "capture: Event.synchronize() is refused",
        "copy_from_host_refused_in_capture":
            "capture: dev.copy_(cpu) would freeze a host address (aclrtMemcpyAsync)",
        "to_npu_refused_in_capture": "capture: cpu.to('npu') is a H2D copy, refused",
        "capture_does_not_run_zeros":
            "aclmdlRICaptureBegin records and runs nothing: torch.zeros stays garbage",
        "capture_does_not_run_fill": "capture records fill_ without running it",
        "capture_does_not_run_add": "capture records x + 1 without running it",
        "replay_runs_captured_zeros": "replay runs the captured zero_",
        "replay_runs_captured_fill": "replay runs the captured fill_",
        "replay_runs_captured_add": "replay runs the captured add",
        "every_replay_reruns_captured_fill": "every replay re-runs every recorded task",
        "replay_reads_current_device_memory": "replay runs on the same storages",
        "python_scalar_frozen_at_capture": "host scalars are frozen at capture",
        "cpu_scalar_tensor_frozen_at_capture":
            "a 0-dim CPU tensor argument is a host scalar, frozen at capture",
        "cpu_scalar_tensor_read_at_issue":
            "a 0-dim CPU tensor argument is read when the op is issued",
        "ops_queue_until_sync":
            "device work is queued on the stream and runs when the host synchronises",
        "non_blocking_copy_of_rewritten_pageable_races":
            "torch_npu queues aclrtMemcpyAsync from pageable memory: rewriting it races",
        "non_blocking_copy_of_freed_pageable_races":
            "the queued copy reads pageable memory that was freed: flagged",
        "non_blocking_to_npu_of_rewritten_pageable_races":
            "cpu.to('npu', non_blocking=True) is the same queued copy",
        "blocking_copy_of_pageable_is_safe":
            "a blocking H2D copy finishes before the host goes on",
        "non_blocking_copy_of_untouched_pageable_is_fine":
            "a queued copy whose source is left alone is correct",
        "pinned_source_outlives_its_queued_copy":
            "torch_npu's CachingHostAllocator records an event on a pinned block used by a "
            "queued copy and reuses it only after the copy ran",
        "non_blocking_copy_of_rewritten_pinned_races":
            "the queued copy reads the pinned block when it runs: rewriting it races",
        "weak_ref_tensor_aliases_device_memory":
            "torch_npu._C._weak_ref_tensor: the same device memory (vLLM-Ascend's weak refs)",
        "torch_npu_is_found_by_find_spec":
            "an installed torch_npu has a module spec (transformers and vLLM probe for it)",
    },
    "streams": {
        "capture_begin_on_default_stream_refused":
            "CANN: the default stream cannot capture (StreamFlagIsSupportCapture)",
        "fork_not_joined_back_refused_at_capture_end":
            "cross-stream capture (04-02_cross_stream_capture.md): every forked stream joins "
            "back before capture_end",
        "replay_after_refused_capture_refused": "a capture that failed leaves no graph",
        "fork_joined_back_directly_accepted": "a fork joined back by an event is accepted",
        "fork_joined_back_transitively_accepted":
            "a fork joined back through another joined stream is accepted",
        "join_through_stream_joined_too_early_refused":
            "a join recorded before the side stream's last task does not cover it",
        "wait_on_event_recorded_before_capture_refused":
            "a normal event recorded outside the capture cannot be waited on inside it",
        "wait_on_timing_event_in_capture_refused":
            "only ACL_EVENT_SYNC events can be waited on in a capture",
        "external_event_waitable_in_capture_before_record":
            "streams.py ExternalEvent: wait() may come before record()",
        "external_event_blocks_replayed_work_until_recorded":
            "an ExternalEvent wait in a graph blocks the replay until the record",
        "external_event_reset_clears_it": "ExternalEvent.reset() clears the flag",
        "wait_on_never_recorded_external_event_hangs_synchronize":
            "a wait on an event never recorded hangs (DeviceHang names the stream)",
        "replay_of_uncaptured_graph_refused": "replay needs a captured graph",
        "replay_after_reset_refused": "reset() drops the captured graph",
        "reset_does_not_end_capture": "NPUGraph::reset calls no capture_end",
        "capture_begin_after_reset_while_capturing_refused":
            "the stream is still capturing after a reset while capturing",
        "synchronize_still_refused_after_reset_while_capturing":
            "a capture left open keeps refusing synchronize",
    },
    "groups": {
        "group_begin_on_non_capturing_stream_refused":
            "graph_task_group_begin needs a capturing stream",
        "empty_task_group_refused_at_end": "a task group holds at least one task",
        "update_begin_on_capturing_stream_refused":
            "graph_task_update_begin runs on a stream that is not capturing",
        "update_with_more_tasks_refused": "an update re-issues exactly the group's tasks",
        "update_with_other_kind_of_task_refused": "an update re-issues the same kernels",
        "update_may_reissue_kernels_only": "only kernel launches between update begin/end",
        "task_update_changes_what_replay_computes":
            "vLLM-Ascend's handshake: replay, update, ExternalEvent.record; the layer "
            "computes with the updated arguments",
        "task_update_lands_when_update_stream_runs":
            "an update lands when the update stream reaches it",
        "update_of_reset_graph_refused": "a reset graph's group handles are dead",
        "aicpu_task_cannot_join_task_group":
            "task groups hold AI Core tasks only: plan_tiling in an open group is refused",
        "captured_aicpu_task_reruns_at_replay":
            "replay re-runs every recorded task, the AI-CPU tiling task too (epoch echoed)",
    },
    "no_aicpu_replay": {
        "no_aicpu_replay_fault_skips_captured_aicpu_task":
            "fault no-aicpu-replay: the captured tiling task never re-runs (epoch stays)",
        "no_aicpu_replay_fault_still_replays_other_tasks":
            "fault no-aicpu-replay: other captured tasks still replay",
    },
    "host": {
        "aten_op_with_cpu_tensor_raises_host_pointer":
            "torch: every tensor of an op on one device (no host pointer on the device)",
        "aten_op_with_cpu_scalar_tensor_allowed": "torch: a 0-dim CPU tensor is a scalar",
        "custom_op_without_npu_kernel_raises":
            "an op without its PrivateUse1 kernel would run its CPU body on device memory",
        "custom_op_runs_once_extension_loaded": "load_library registers the NPU kernel",
        "triton_launch_with_cpu_step_epoch_raises_host_pointer":
            "Triton-Ascend's launcher takes data_ptr() unchecked: a host address",
        "triton_launch_with_cpu_partial_lse_raises_host_pointer":
            "the same for any tensor argument",
        "triton_launch_on_npu_tensors_runs": "a launch on npu tensors runs",
        "mla_custom_op_with_cpu_cache_raises_host_pointer":
            "the same for the MLA Triton kernel behind the MLA custom op",
        "unknown_torch_npu_name_raises_not_in_twin":
            "names outside the twin are placeholders that raise when called",
        "unknown_torch_npu_c_name_raises_not_in_twin": "the same for torch_npu._C",
        "unknown_torch_npu_npu_name_raises_not_in_twin": "the same for torch.npu",
        "not_in_twin_is_not_implemented_error": "NotInTwinError is a NotImplementedError",
        "dunder_lookups_raise_attribute_error": "dunder lookups are not placeholders",
        "task_queue_enable_2_refuses_capture_begin":
            "libtorch_npu.so: TASK_QUEUE_ENABLE=2 refuses NPU graph capture",
    },
    "capture_refused": {
        "capture_refused_fault_refuses_capture_begin":
            "fault capture-refused: capture_begin raises torch_npu's text",
        "capture_refused_fault_leaves_eager_work": "eager work still runs",
    },
    "device_lost": {
        "plain_ops_run_before_first_ai_core_task": "the device works until the fault",
        "first_ai_core_task_raises_device_lost":
            "fault device-lost: the first AI Core task faults (507018)",
        "lost_then_allocation_raises": "a lost device fails every call (207001): alloc",
        "lost_then_op_raises": "... an op",
        "lost_then_synchronize_raises": "... synchronize",
        "lost_then_host_read_raises": "... a device-to-host read",
        "lost_then_copy_to_device_raises": "... a host-to-device copy",
        "lost_then_stream_raises": "... a new stream",
        "new_process_with_lost_state_starts_lost":
            "the device stays lost for later processes",
        "new_process_with_lost_state_set_device_raises": "... set_device included",
    },
}
#: rule -> its group (rule names are unique across groups)
RULE_GROUP = {rule: group for group, rules in RULES.items() for rule in rules}



#: the tensor layer this run's twin subprocesses use (they inherit the variable; plain unless
#: ``AICPU_TILING_TWIN_TENSORS=wrapper``)
PLAIN_TENSORS = tensor_layer() == "plain"
#: rules the plain tensor layer models and the wrapper does not (a plain tensor is resized)
MODELLED_ON_PLAIN = {"op_resizing_its_out_argument_gives_its_shape"}


def _params(group: str) -> list:
    out = []
    for rule, mirrors in RULES[group].items():
        marks = ()
        if isinstance(mirrors, tuple) and not (PLAIN_TENSORS and rule in MODELLED_ON_PLAIN):
            marks = pytest.mark.xfail(strict=True, reason=mirrors[1])
        out.append(pytest.param(rule, marks=marks, id=rule))
    return out


def _run_group(runner, group: str) -> dict[str, str]:
    spec = SCRIPTS[group]
    state = runner.state_dir()
    found = runner.rules(runner(spec.script, fault=spec.fault, env=spec.env, state_dir=state))
    if spec.then is not None:
        after = runner.rules(runner(spec.then, env=spec.env, state_dir=state))
        if "<script>" in after:
            after["<script> (second process)"] = after.pop("<script>")
        found.update(after)
    return found


@pytest.fixture(scope="module")
def outcomes(request, run_twin):
    """group -> rule -> outcome; the groups this session selected all start at the first
    call, on the runner's pool, and each is awaited when a test asks for it."""
    futures = {}

    def get(group: str) -> dict[str, str]:
        if not futures:
            wanted = set()
            for item in request.session.items:
                params = getattr(item, "callspec", None)
                if item.module is request.module and params is not None:
                    rule_group = RULE_GROUP.get(params.params.get("rule"))
                    wanted.add(rule_group or params.params.get("group"))
            wanted = sorted((wanted - {None}) | {group})
            for name in [group] + [g for g in wanted if g != group]:
                futures[name] = run_twin.submit(_run_group, run_twin, name)
        if group not in futures:
            futures[group] = run_twin.submit(_run_group, run_twin, group)
        return futures[group].result()
    return get


def _check(outcomes, group: str, rule: str) -> None:
    found = outcomes(group)
    mirrors = RULES[group][rule]
    mirrors = mirrors[0] if isinstance(mirrors, tuple) else mirrors
    died = {k: v for k, v in found.items() if k.startswith("<script>")}
    assert found.get(rule) == "ok", (
        f"twin rule {rule!r} ({mirrors}) broke: {found.get(rule, 'not reported')}"
        + "".join(f"\n{k}: {v}" for k, v in died.items()))


@pytest.mark.parametrize("group", sorted(RULES))
def test_group_reports_exactly_its_rules(outcomes, group):
    """Every script checks exactly the rules listed for it, and exits cleanly."""
    found = outcomes(group)
    assert sorted(found) == sorted(RULES[group])


@pytest.mark.parametrize("rule", _params("memory"))
def test_memory_rules(outcomes, rule):
    """Device memory is not host memory; capture records and does not run, replay re-runs
    with host values frozen; work is asynchronous (torch_npu copy_between_host_and_device,
    graphs.py capture mode global, aclmdlRICaptureBegin, aclrtMemcpyAsync)."""
    _check(outcomes, "memory", rule)


@pytest.mark.parametrize("rule", _params("streams"))
def test_stream_and_event_rules(outcomes, rule):
    """Streams and events in capture, ExternalEvent, and the NPUGraph state machine
    (hicann/runtime 04-02_cross_stream_capture.md, torch_npu streams.py, NPUGraph::reset)."""
    _check(outcomes, "streams", rule)


@pytest.mark.parametrize("rule", _params("groups"))
def test_task_group_rules(outcomes, rule):
    """Task groups and task updates (graph_task_group_begin/end, graph_task_update_begin/end
    as vLLM-Ascend drives them) and the AI-CPU tiling task under capture (docs/design.md
    section 7)."""
    _check(outcomes, "groups", rule)


@pytest.mark.parametrize("rule", _params("no_aicpu_replay"))
def test_no_aicpu_replay_fault(outcomes, rule):
    """Fault no-aicpu-replay: the device the self-check must answer with pre-replay."""
    _check(outcomes, "no_aicpu_replay", rule)


@pytest.mark.parametrize("rule", _params("host"))
def test_host_pointer_and_placeholder_rules(outcomes, rule):
    """Host pointers handed to device kernels (Triton-Ascend driver.py, torch's same-device
    rule), custom ops without their extension, torch_npu placeholders, TASK_QUEUE_ENABLE=2
    (libtorch_npu.so's refusal)."""
    _check(outcomes, "host", rule)


@pytest.mark.parametrize("rule", _params("capture_refused"))
def test_capture_refused_fault(outcomes, rule):
    """Fault capture-refused: capture_begin refuses as under TASK_QUEUE_ENABLE=2."""
    _check(outcomes, "capture_refused", rule)


@pytest.mark.parametrize("rule", _params("device_lost"))
def test_device_lost_fault(outcomes, rule):
    """Fault device-lost: error 507018 at the first AI Core task, then 207001 on every call,
    in this process and in later ones sharing the twin's state directory."""
    _check(outcomes, "device_lost", rule)
