"""StaticAttention's lifetime: close(), the with block, and what garbage collection frees.

Every mode: host_update, and device_tiling with placements graph and pre-replay. The CPU
backend runs each stream on a worker thread and, for the graph placement, one more
graph-owned worker for the captured AI-CPU side stream; those workers held captured
closures (the KV caches among their buffers) past the end of an instance.
"""

import gc
import threading
import weakref

import pytest
import torch

from pyruntime import backends
from pyruntime.attention import AttentionClosedError, AttentionStateError, StaticAttention
from pyruntime.backends import BackendError, CaptureError

from .attention_helpers import NUM_BLOCKS, SHAPES, make_attention

MODES = [("host_update", {}), ("device_tiling", {"placement": "graph"}),
         ("device_tiling", {"placement": "pre-replay"})]
IDS = ["host_update", "graph", "pre-replay"]
BLOCK_TABLE = torch.arange(SHAPES["max_batch"] * SHAPES["max_blocks_per_req"],
                           dtype=torch.int32).reshape(SHAPES["max_batch"], -1)
CU_SEQLENS_Q = torch.tensor([0, 1, 3], dtype=torch.int32)
SEQLENS_KV = torch.tensor([5, 20], dtype=torch.int32)


def _backend():
    # two core lanes: the pool's threads exist too, so the owned case must join them
    return backends.get("cpu", num_threads=2, wait_timeout_s=10.0)


def _stepped(mode, extra, backend, **options):
    attn = make_attention(mode, backend=backend, **extra, **options)
    attn.step(BLOCK_TABLE, CU_SEQLENS_Q, SEQLENS_KV)  # the workers have run captured closures
    attn.check()
    return attn


def _cache_refs(attn):
    return [weakref.ref(t) for pair in attn.kv_caches for t in pair]


def _threads_since(before):
    return sorted(t.name for t in set(threading.enumerate()) - before)


@pytest.mark.parametrize("owned", [False, True], ids=["borrowed", "owned"])
@pytest.mark.parametrize(("mode", "extra"), MODES, ids=IDS)
def test_dropped_attention_frees_its_kv_caches(mode, extra, owned):
    backend = _backend()
    attn = _stepped(mode, extra, backend, owns_backend=owned)
    refs = _cache_refs(attn)
    del attn
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)
    backend.close()


@pytest.mark.parametrize(("mode", "extra"), MODES, ids=IDS)
def test_close_frees_the_kv_caches_while_the_object_lives(mode, extra, cpu):
    attn = _stepped(mode, extra, cpu)
    refs = _cache_refs(attn)
    attn.close()
    gc.collect()
    assert attn.closed and all(r() is None for r in refs)
    assert not cpu._buffers  # every buffer given back to the backend's registry


@pytest.mark.parametrize(("mode", "extra"), MODES, ids=IDS)
def test_close_with_an_owned_backend_restores_the_thread_count(mode, extra):
    before, count = set(threading.enumerate()), threading.active_count()
    attn = _stepped(mode, extra, _backend(), owns_backend=True)
    assert threading.active_count() > count  # streams and core lanes are threads here
    attn.close()
    assert threading.active_count() == count, _threads_since(before)
    with pytest.raises(BackendError, match="closed"):
        attn.backend.stream()  # the owned backend was closed with it


@pytest.mark.parametrize(("mode", "extra"), MODES, ids=IDS)
def test_close_on_a_borrowed_backend_gives_back_the_attentions_threads(mode, extra, cpu):
    # The backend's own threads (core lanes, started on first use) are the caller's: start
    # them first, so the count measures what each attention takes and gives back.
    _stepped(mode, extra, cpu).close()
    before, count = set(threading.enumerate()), threading.active_count()
    for _ in range(3):  # a long-lived backend serving attention after attention
        attn = _stepped(mode, extra, cpu)
        assert threading.active_count() > count
        attn.close()
        assert threading.active_count() == count, _threads_since(before)
    with make_attention(mode, backend=cpu, **extra) as attn:  # the backend still works
        outs = attn.step(BLOCK_TABLE, CU_SEQLENS_Q, SEQLENS_KV)
        assert outs[0][:3].abs().sum() > 0 and outs[0][3:].abs().sum() == 0
    assert threading.active_count() == count, _threads_since(before)


@pytest.mark.parametrize(("mode", "extra"), MODES, ids=IDS)
def test_with_block_closes_and_any_later_use_raises_a_typed_error(mode, extra, cpu):
    with make_attention(mode, backend=cpu, **extra) as attn:
        attn.step(BLOCK_TABLE, CU_SEQLENS_Q, SEQLENS_KV)
    assert attn.closed
    uses = {"step": lambda: attn.step(BLOCK_TABLE, CU_SEQLENS_Q, SEQLENS_KV),
            "capture": attn.capture, "check": attn.check, "graph": lambda: attn.graph,
            "queries": lambda: attn.queries, "kv_caches": lambda: attn.kv_caches,
            "outputs": lambda: attn.outputs, "block_table": lambda: attn.block_table,
            "with": lambda: attn.__enter__()}
    for name, use in uses.items():
        with pytest.raises(AttentionClosedError, match="was closed") as info:
            use()
        assert isinstance(info.value, AttentionStateError), name
    attn.close()  # idempotent


def test_with_block_closes_on_an_exception_and_lets_it_through(cpu):
    count = threading.active_count()
    with pytest.raises(ZeroDivisionError):
        with StaticAttention(cpu, num_layers=1, num_blocks=NUM_BLOCKS, mode="device_tiling",
                             dtype=torch.float32, num_cores=4, **SHAPES) as attn:
            attn.capture()
            1 / 0  # noqa: B018
    assert attn.closed and threading.active_count() == count


def test_close_before_capture_releases_the_streams(cpu):
    cpu.current_stream()  # the default stream's worker exists before the count
    count = threading.active_count()
    attn = StaticAttention(cpu, num_layers=1, num_blocks=NUM_BLOCKS, mode="host_update",
                           dtype=torch.float32, num_cores=4, **SHAPES)
    assert threading.active_count() == count + 2  # attention and update streams
    attn.close()
    assert threading.active_count() == count


def test_a_failed_construction_closes_an_owned_backend():
    count = threading.active_count()
    backend = _backend()
    backend.current_stream()  # a thread of its own, which the failed construction must end
    assert threading.active_count() > count
    with pytest.raises(ValueError, match="dtype"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="host_update",
                        dtype=torch.int32, owns_backend=True, **SHAPES)
    assert threading.active_count() == count


def test_a_released_stream_refuses_work_and_a_capturing_one_cannot_be_released(cpu):
    stream = cpu.stream("s")
    cpu.release_stream(stream)
    cpu.release_stream(stream)  # idempotent
    with pytest.raises(BackendError, match="released"):
        stream.synchronize()
    graph, busy = cpu.graph(), cpu.stream("busy")
    graph.capture_begin(busy)
    with pytest.raises(CaptureError, match="capturing"):
        cpu.release_stream(busy)


@pytest.mark.parametrize(("mode", "extra"), MODES, ids=IDS)
def test_step_without_wait_runs_nothing_while_the_host_holds_the_device(mode, extra):
    # the bench's warm pair: two host parts back to back, the device held across both
    be = _backend()
    try:
        attn = make_attention(mode, backend=be, **extra)
        be.timings.records, be.timings.max_records = [], 1000
        with be.hold_device():
            attn.step(BLOCK_TABLE, CU_SEQLENS_Q, SEQLENS_KV, wait=False)
            attn.step(BLOCK_TABLE, CU_SEQLENS_Q, SEQLENS_KV, wait=False)
            ran = [r for r in be.timings.records if r[0] in ("aicore", "aicpu")]
            if mode == "device_tiling":  # host_update's pre-replay sync lets earlier work run
                assert ran == [], ran
        attn.wait()
        attn.check()
        kinds = [r[0] for r in be.timings.records]
        assert kinds.count("aicore") >= 2 * 2  # two steps of two layers' attention ran
        assert attn.outputs[0][:3].abs().sum() > 0 and not attn.outputs[0][3:].any()
        attn.close()
    finally:
        be.close()
