"""Run ``StaticAttention`` in both modes on the same steps: the measuring loop of
``bench`` and ``profile``.

Steps are interleaved (AB BA AB..., or ABC CBA with three modes: the order flips every
step so no mode always runs first) and every mode sees identical inputs at each step. Times come from an injected
clock (:class:`~pyruntime.profiler.clock.Clock`); host phases from
:mod:`pyruntime.profiler.instrument` when asked; device tasks from the backend's task
records when it keeps them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..profiler.clock import Clock, PerfClock
from ..profiler.data import DeviceTask, HostStep, Run
from ..profiler.instrument import PhaseRecorder, instrument
from .sources import ContinuousBatch

MODES = ("host_update", "device_tiling")
#: what ``bench`` compares: the A/B pair plus device tiling with its other placement
BENCH_MODES = (*MODES, "pre_replay")
#: run mode -> (StaticAttention mode, placement)
VARIANTS = {
    "host_update": ("host_update", None),
    "device_tiling": ("device_tiling", "graph"),
    "pre_replay": ("device_tiling", "pre-replay"),
}
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Geometry:
    """The attention shapes of a run. Defaults are small so the CPU backend is quick.

    GQA with one kv head per rank (8 query heads on it) and a small head_dim: host time
    depends on the unit count (batch x kv heads) and the layer count, not on head_dim or
    query heads, while the CPU backend's emulated attention time grows with both. KV blocks
    alias a small cache (``num_blocks``) because the benchmark reads KV, never checks it.
    """

    num_q_heads: int = 8
    num_kv_heads: int = 1
    head_dim: int = 16
    block_size: int = 128
    num_cores: int = 24
    dtype: str = "float32"
    max_kv: int = 4096
    num_blocks: int = 64

    @property
    def max_blocks_per_req(self) -> int:
        """Block-table columns."""
        return -(-self.max_kv // self.block_size)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for JSON)."""
        return asdict(self)


def make_attention(
    backend: Any, mode: str, geom: Geometry, layers: int, batch: int, max_tokens: int, seed: int = 0
) -> Any:
    """A captured ``StaticAttention`` of run mode `mode` (a `VARIANTS` key) with random
    queries and KV caches."""
    import torch

    from ..attention import StaticAttention

    attn_mode, placement = VARIANTS[mode]
    attn = StaticAttention(
        backend, num_layers=layers, num_q_heads=geom.num_q_heads,
        num_kv_heads=geom.num_kv_heads, head_dim=geom.head_dim, block_size=geom.block_size,
        num_blocks=geom.num_blocks, max_batch=batch, max_tokens=max_tokens,
        max_blocks_per_req=geom.max_blocks_per_req, mode=attn_mode, placement=placement,
        dtype=getattr(torch, geom.dtype), num_cores=geom.num_cores,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for q, (k, v) in zip(attn.queries, attn.kv_caches):
        q.copy_(torch.randn(q.shape, generator=gen))
        k.copy_(torch.randn(k.shape, generator=gen))
        v.copy_(torch.randn(v.shape, generator=gen))
    attn.capture()
    return attn


def block_table(batch: int, geom: Geometry) -> np.ndarray:
    """int32 ``[batch, max_blocks_per_req]`` spreading requests over the aliased cache."""
    cols = geom.max_blocks_per_req
    return (
        (np.arange(batch * cols, dtype=np.int64) % geom.num_blocks)
        .astype(np.int32)
        .reshape(batch, cols)
    )


@dataclass
class Point:
    """One grid point: layers, batch and length source."""

    layers: int
    batch: int
    source: str

    @property
    def name(self) -> str:
        """``L61-b64-trace``."""
        return f"L{self.layers}-b{self.batch}-{self.source}"


def _records(backend: Any) -> Any:
    timings = getattr(backend, "timings", None)
    return timings if timings is not None and hasattr(timings, "records") else None


def device_tasks_of_step(step: int, records: list[tuple]) -> list[DeviceTask]:
    """One step's backend task records as DeviceTasks, in start order.

    The attention kernel has one name for every layer; layers run in order on the stream,
    so the n-th attention task of a step is layer n (the combine that follows keeps its
    own name).
    """
    out, layer = [], 0
    for kind, name, where, start, end in sorted(records, key=lambda r: r[3]):
        if kind == "aicore" and "attention" in name and "combine" not in name:
            name = f"attention layer {layer}"
            layer += 1
        out.append(DeviceTask(step, kind, name, where, start, end))
    return out


def run_point(
    point: Point,
    geom: Geometry,
    *,
    steps: int,
    warmup: int,
    seed: int = 0,
    modes: tuple[str, ...] = MODES,
    clock: Clock | None = None,
    phases: bool = False,
    device_tasks: bool = False,
    backend_factory: Callable[[], Any] | None = None,
    on_step: Callable[[], None] | None = None,
) -> list[Run]:
    """Measure ``steps`` interleaved steps of each mode (after ``warmup`` unmeasured ones).

    Args:
        phases: split each step's host time into phases (adds a little host overhead:
            use for ``profile``, not for ``bench``).
        device_tasks: keep the backend's device task records per step.
        backend_factory: makes one backend per mode (default ``backends.get("cpu")``).
        on_step: called after each step (both modes), for progress.

    Returns:
        One :class:`Run` per mode, in ``modes`` order, counters averaged per measured step.
    """
    from .. import backends

    clock = clock or PerfClock()
    factory = backend_factory or (lambda: backends.get("cpu"))
    src = ContinuousBatch(point.source, point.batch, seed=seed, max_kv=geom.max_kv)
    table = block_table(point.batch, geom)
    workload = {"name": point.name, **asdict(point), "geometry": geom.as_dict()}
    runs = {m: Run(m, dict(workload)) for m in modes}
    bes = {m: factory() for m in modes}
    attns = {
        m: make_attention(bes[m], m, geom, point.layers, point.batch, src.max_tokens(), seed)
        for m in modes
    }
    recorders = {m: PhaseRecorder(clock) for m in modes}
    try:
        for i in range(warmup + steps):
            if i == warmup:
                for m in modes:
                    bes[m].counters.reset()
                    rec = _records(bes[m])
                    if device_tasks and rec is not None:
                        rec.max_records = 1 << 20
                        rec.records = []
            step = next(src)
            order = modes if i % 2 == 0 else tuple(reversed(modes))
            for m in order:
                recorder = recorders[m]
                recorder.reset()
                if phases:
                    with instrument(bes[m], recorder):
                        t0 = clock.now()
                        attns[m].step(table, step.cu_seqlens_q, step.seqlens_kv)
                        t1 = clock.now()
                else:
                    t0 = clock.now()
                    attns[m].step(table, step.cu_seqlens_q, step.seqlens_kv)
                    t1 = clock.now()
                attns[m].check()
                if i < warmup:
                    continue
                booked = dict(recorder.phases)
                if phases:
                    booked["other"] = max(0.0, (t1 - t0) - sum(booked.values()))
                runs[m].steps.append(
                    HostStep(t0, t1 - t0, float(attns[m].last_step_host_seconds), booked,
                             list(recorder.spans))
                )  # fmt: skip
                rec = _records(bes[m])
                if device_tasks and rec is not None and rec.records:
                    runs[m].device_tasks += device_tasks_of_step(i - warmup, rec.records)
                    rec.records = []
            if on_step:
                on_step()
        for m in modes:
            snap = bes[m].counters.snapshot()
            runs[m].counters = {k: v / max(steps, 1) for k, v in snap.items()}
    finally:
        for m in modes:
            close = getattr(bes[m], "close", None)
            if close:
                close()
    return [runs[m] for m in modes]
