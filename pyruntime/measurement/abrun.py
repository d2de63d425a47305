"""Run ``StaticAttention`` in both modes on the same steps: the measuring loop of
``bench`` and ``profile``.

Steps are interleaved (AB BA AB..., or ABC CBA with three modes: the order flips every
step so no mode always runs first) and every mode sees identical inputs at each step.
Host time per step is measured warm and with the device held (`run_interleaved`). Times come from an injected
clock (:class:`~pyruntime.profiler.clock.Clock`); host phases from
:mod:`pyruntime.profiler.instrument` when asked; device tasks from the backend's task
records when it keeps them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from ..profiler.clock import Clock, PerfClock
from ..profiler.data import DeviceTask, HostStep, Run
from ..profiler.instrument import PhaseRecorder, instrument
from .serving import (
    DEFAULT_FLOOR_METHOD,
    FLOOR_METHODS,
    FLOOR_MODE,
    METHODS,
    EngineWork,
    FloorStep,
    make_before_replay,
    warm_up_host,
)
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
    #: > 0: absorbed MLA (`StaticMLAAttention`, one latent kv head) with this latent width,
    #: num_q_heads its heads and head_dim = kv_lora_rank + qk_rope_head_dim
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0

    @property
    def max_blocks_per_req(self) -> int:
        """Block-table columns."""
        return -(-self.max_kv // self.block_size)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (for JSON)."""
        return asdict(self)


def make_attention(
    backend: Any, mode: str, geom: Geometry, layers: int, batch: int, max_tokens: int,
    seed: int = 0, *, floor_sync: bool = True,
) -> Any:
    """A captured ``StaticAttention`` of run mode `mode` (a `VARIANTS` key) with random
    queries and KV caches; for `FLOOR_MODE`, a `FloorStep` (with the pre-replay synchronize
    when ``floor_sync``)."""
    import torch

    from ..attention import StaticAttention

    if mode == FLOOR_MODE:  # the floor of the device modes (serving.FloorStep)
        return FloorStep(backend, max_batch=batch, max_blocks_per_req=geom.max_blocks_per_req,
                         sync=floor_sync)
    attn_mode, placement = VARIANTS[mode]
    if geom.kv_lora_rank > 0:
        return _make_mla_attention(backend, attn_mode, placement, geom, layers, batch,
                                   max_tokens, seed)
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


def _make_mla_attention(backend: Any, mode: str, placement: str | None, geom: Geometry,
                        layers: int, batch: int, max_tokens: int, seed: int) -> Any:
    """`make_attention` for an MLA geometry: a captured ``StaticMLAAttention``, softmax scale
    ``1 / sqrt(head_dim)``."""
    import torch

    from ..mla_attention import StaticMLAAttention

    attn = StaticMLAAttention(
        backend, num_layers=layers, num_heads=geom.num_q_heads,
        kv_lora_rank=geom.kv_lora_rank, qk_rope_head_dim=geom.qk_rope_head_dim,
        block_size=geom.block_size, num_blocks=geom.num_blocks, max_batch=batch,
        max_tokens=max_tokens, max_blocks_per_req=geom.max_blocks_per_req, mode=mode,
        placement=placement, dtype=getattr(torch, geom.dtype),
        softmax_scale=geom.head_dim ** -0.5, num_cores=geom.num_cores,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for tensors in zip(attn.queries, attn.kv_caches):
        for t in (*tensors[0], *tensors[1]):
            t.copy_(torch.randn(t.shape, generator=gen))
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


@dataclass(frozen=True)
class RunSpec:
    """One captured attention of an interleaved run: `key` names its `Run`, `mode` is a
    `VARIANTS` key."""

    key: str
    mode: str
    layers: int
    #: how its steps are measured, `pyruntime.measurement.serving.METHODS`
    method: str = "old"
    #: the floor's (`FLOOR_MODE` under ``symmetric`` only): what its measured step follows,
    #: `pyruntime.measurement.serving.FLOOR_METHODS`
    floor_method: str = DEFAULT_FLOOR_METHOD


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
    warm_host: bool = True,
    method: str = "old",
    engine: dict[str, EngineWork] | None = None,
    lanes_info: dict | None = None,
) -> list[Run]:
    """Measure ``steps`` interleaved steps of each mode (after ``warmup`` unmeasured ones).

    Args:
        phases: split each step's host time into phases (adds a little host overhead:
            use for ``profile``, not for ``bench``).
        device_tasks: keep the backend's device task records per step (needs
            ``warm_host=False``: a warm pair's records hold two steps).
        backend_factory: makes one backend per mode (default ``backends.get("cpu")``).
        on_step: called after each step (both modes), for progress.
        warm_host: measure each step warm, as `run_interleaved` describes (the one
            definition of host time per step that ``bench`` and ``selfcheck`` report).
        method, engine, lanes_info: see `run_interleaved`.

    Returns:
        One :class:`Run` per mode, in ``modes`` order, counters averaged per step run.
    """
    specs = [RunSpec(m, m, point.layers, method) for m in modes]
    workload = {"name": point.name, **asdict(point), "geometry": geom.as_dict()}
    return run_interleaved(specs, point.batch, point.source, geom, workload, steps=steps,
                           warmup=warmup, seed=seed, clock=clock, phases=phases,
                           device_tasks=device_tasks, backend_factory=backend_factory,
                           on_step=on_step, warm_host=warm_host, method=method,
                           engine=engine, lanes_info=lanes_info)  # fmt: skip


def run_interleaved(
    specs: list[RunSpec],
    batch: int,
    source: str,
    geom: Geometry,
    workload: dict,
    *,
    steps: int,
    warmup: int,
    seed: int = 0,
    clock: Clock | None = None,
    phases: bool = False,
    device_tasks: bool = False,
    backend_factory: Callable[[], Any] | None = None,
    on_step: Callable[[], None] | None = None,
    warm_host: bool = True,
    method: str = "old",
    engine: dict[str, EngineWork] | None = None,
    lanes_info: dict | None = None,
) -> list[Run]:
    """Step every spec's attention on the same batches, interleaved (the order flips every
    step), each on a backend of its own.

    Host time per step (``HostStep.host_s``) is the CPU time of the host thread in the
    runtime's host part of a step (copies, launches, replay, updates; not the wait for
    results), with the device held (`Backend.hold_device`): on the CPU backend the emulated
    device, whose threads share the host's cores, runs only once the host part is done or
    while the host blocks in a synchronize (host_update's pre-replay one). With
    ``warm_host`` (the default) each measured step is the second of a pair: the first, on
    the previous batch of the source, is a real but unmeasured step whose host part runs
    just before, with the device held across both. The host is then warm, as in a serving
    loop where it has just prepared the step, whatever the previous device phase lasted: a
    host thread that slept through a long device phase (100 ms at L=61 here) pays a
    cold-start cost of its own (caches and predictors refilled: about 150 us on this
    project's shared 2-vCPU machine after any sleep over 10 ms), which would make host time
    grow with the layer count without any host work per layer. The device then runs both
    steps; ``step_s`` is the pair's wall time over two (host parts plus device work, per
    step) and the counters are averaged over every step run, pairs' first steps included.

    That is ``method="old"``. With ``method="symmetric"`` (`pyruntime.measurement.serving`)
    every step of every mode runs with its serving work before the replay (the input copies
    of every mode, vLLM-Ascend's pre-replay synchronize, the hook engine's work from
    ``engine[mode]`` in the device modes), and each measured step starts from the same host
    state in every mode: the warm pair's first step has run on the device before it (the
    host waits outside the measured step), then a host-only warm-up (`warm_up_host`), then
    the measured step with the device held; its synchronize finds the device idle.
    ``step_s`` is then the measured step's wall time, host part and device work.
    ``HostStep.blocked_s`` records, per step, how long the host was blocked inside the
    measured host part, and ``HostStep.preceded_by`` the run mode of the unmeasured step
    that ran just before it on the same backend: the mode itself, except for a floor spec
    with ``floor_method="lead"`` under ``symmetric``, whose measured step follows a
    `FloorLead` (``FLOOR_LEAD_MODE``); with ``floor_method="noop"`` it follows its own no-op
    step, as before 2026-12-03.

    With ``device_tasks``, a backend that keeps task records (the CPU backend's
    ``timings``) gives each step's tasks; on one that does not (the NPU backend, on a device
    or the twin) the measured steps run under torch_npu's profiler
    (`pyruntime.measurement.device_lanes.TorchNpuLanes`) and its kernel_details.csv gives
    them, each task in the step whose host window (start to end, device work waited for)
    holds its start; what was read goes into ``lanes_info`` when given.
    """
    from .. import backends

    if device_tasks and warm_host:
        raise ValueError("device_tasks needs warm_host=False (a warm pair runs two steps)")
    specs = [s if method == "old" else replace(s, method=method) for s in specs]
    for s in specs:
        if s.method not in METHODS:
            raise ValueError(f"unknown method {s.method!r}; choose from {', '.join(METHODS)}")
        if s.floor_method not in FLOOR_METHODS:
            raise ValueError(f"unknown floor method {s.floor_method!r}; choose from "
                             f"{', '.join(FLOOR_METHODS)}")
    symmetric_of = {s.key: s.method == "symmetric" for s in specs}
    clock = clock or PerfClock()
    factory = backend_factory or (lambda: backends.get("cpu"))
    src = ContinuousBatch(source, batch, seed=seed, max_kv=geom.max_kv)
    table = block_table(batch, geom)
    keys = [s.key for s in specs]
    runs = {s.key: Run(s.key, dict(workload)) for s in specs}
    bes = {s.key: factory() for s in specs}
    runs_per_step = 2 if warm_host else 1  # steps run per measured step (counters)
    lanes = None
    if device_tasks and any(_records(be) is None for be in bes.values()):
        from .device_lanes import TorchNpuLanes

        lanes = TorchNpuLanes()
    leads: dict[str, FloorLead] = {}  # the floor's previous step (symmetric), `FloorLead`
    try:
        for s in specs:
            if symmetric_of[s.key] and s.mode not in ("host_update", FLOOR_MODE) \
                    and s.mode not in (engine or {}):
                raise ValueError(f"method 'symmetric' needs the hook engine's work of mode "
                                 f"{s.mode!r} (engine)")
        attns = {
            s.key: make_attention(bes[s.key], s.mode, geom, s.layers, batch, src.max_tokens(),
                                  seed, floor_sync=symmetric_of[s.key])
            for s in specs
        }  # fmt: skip
        serving = {s.key: make_before_replay(s.method, attns[s.key], s.mode,
                                             (engine or {}).get(s.mode)) for s in specs}
        # the floor's unmeasured previous step: a device mode's, on the floor's own backend
        for s in specs:
            if s.mode == FLOOR_MODE and symmetric_of[s.key] and s.floor_method == "lead":
                leads[s.key] = _floor_lead(bes[s.key], s, geom, batch, src.max_tokens(), seed,
                                           engine or {})
        # the host-state marker: the run mode of the unmeasured step before each measured one
        preceded_by = {s.key: FLOOR_LEAD_MODE if s.key in leads else s.mode for s in specs}
        recorders = {k: PhaseRecorder(clock) for k in keys}
        for i in range(warmup + steps):
            if i == warmup:
                for k in keys:
                    bes[k].counters.reset()
                    rec = _records(bes[k])
                    if device_tasks and rec is not None:
                        rec.max_records = 1 << 20
                        rec.records = []
                if lanes is not None:
                    lanes.start()
            first = next(src) if warm_host else None
            step = next(src)
            order = keys if i % 2 == 0 else list(reversed(keys))
            for k in order:
                be, attn, recorder, before = bes[k], attns[k], recorders[k], serving[k]
                symmetric = symmetric_of[k]
                per_pair = 2 if warm_host and not symmetric else 1  # steps in one step_s
                recorder.reset()
                t_start = clock.now()
                if symmetric:
                    if first is not None and k in leads:
                        leads[k].step(table, first)
                    elif first is not None:  # the previous step, run on the device first
                        if before is not None:
                            before.stage(first.cu_seqlens_q, first.seqlens_kv)
                        attn.step(table, first.cu_seqlens_q, first.seqlens_kv, wait=False,
                                  before_replay=before)
                        attn.wait()
                    if before is not None:
                        before.stage(step.cu_seqlens_q, step.seqlens_kv)
                    warm_up_host()
                    t_start = clock.now()
                with be.hold_device():  # the device starts when the host blocks in wait()
                    if first is not None and not symmetric:
                        attn.step(table, first.cu_seqlens_q, first.seqlens_kv, wait=False)
                    t0 = clock.now()
                    with instrument(be, recorder) if phases else contextlib.nullcontext():
                        attn.step(table, step.cu_seqlens_q, step.seqlens_kv, wait=False,
                                  before_replay=before)
                        host_s = float(attn.last_step_host_seconds)
                        blocked_s = float(attn.last_step_blocked_seconds)
                        attn.wait()
                    t1 = clock.now()
                attn.check()
                if i < warmup:
                    continue
                booked = dict(recorder.phases)
                if phases:
                    booked["other"] = max(0.0, (t1 - t0) - sum(booked.values()))
                runs[k].steps.append(
                    HostStep(t0, (t1 - t_start) / per_pair, host_s, booked, list(recorder.spans),
                             blocked_s, preceded_by[k])
                )  # fmt: skip
                if lanes is not None:
                    lanes.window(k, i - warmup, t_start, t1)
                rec = _records(be)
                if device_tasks and rec is not None and rec.records:
                    runs[k].device_tasks += device_tasks_of_step(i - warmup, rec.records)
                    rec.records = []
            if on_step:
                on_step()
        if lanes is not None:
            by_key, info = lanes.stop()
            lanes = None
            for k in keys:
                runs[k].device_tasks += by_key.get(k, [])
            if lanes_info is not None:
                lanes_info.update(info)
        for k in keys:
            snap = bes[k].counters.snapshot()
            ran = steps * (1 if k in leads else runs_per_step)  # a lead's steps are not counted
            runs[k].counters = {c: v / max(ran, 1) for c, v in snap.items()}
    finally:
        if lanes is not None:  # a step failed while the profiler recorded: stop it
            try:
                lanes.stop()
            except Exception:  # noqa: BLE001, S110 - the step's error is the one to report
                pass
        for lead in leads.values():
            lead.close()
        for k in keys:
            close = getattr(bes[k], "close", None)
            if close:
                close()
    return [runs[k] for k in keys]


#: the device mode whose step the floor's measured step follows (`FloorLead`)
FLOOR_LEAD_MODE = "device_tiling"


class FloorLead:
    """The unmeasured step before the floor's measured step under the symmetric method: a
    device mode's whole step (host part with its serving work, then its device phase, waited
    for), on the floor's backend, its counters left out of the floor's.

    Why: every measured step must start from the same host state. A device mode's measured
    step follows its own previous step's device phase: on the CPU backend, milliseconds in
    which the host thread sleeps and the emulated device's threads run on the host's cores.
    After that, the same host calls cost 2-4x what they cost after the floor's own previous
    step, whose device phase is a no-op (measured 2026-12-03: the floor's first input copy
    10 us after a floor step, 39 us after a graph step at L = 4, 45 us after a 10 ms sleep;
    `warm_up_host` does not undo it, since it warms numpy and torch, not the step's own code
    and data). Without the lead the floor was measured warm against cold device modes.

    Args:
        attn: a captured `StaticAttention` of `FLOOR_LEAD_MODE` on the floor's backend.
        before: its serving work (`pyruntime.measurement.serving.ServingStep`), or None.
    """

    def __init__(self, attn: Any, before: Any) -> None:
        self.attn, self.before = attn, before

    def step(self, table: np.ndarray, lengths: Any) -> None:
        """One whole step on `lengths` (a `ContinuousBatch` step), waited for; the
        backend's counters are put back as they were."""
        counters = self.attn.backend.counters
        saved = counters.snapshot()
        if self.before is not None:
            self.before.stage(lengths.cu_seqlens_q, lengths.seqlens_kv)
        self.attn.step(table, lengths.cu_seqlens_q, lengths.seqlens_kv, wait=False,
                       before_replay=self.before)
        self.attn.wait()
        self.attn.check()
        for name, value in saved.items():
            setattr(counters, name, value)

    def close(self) -> None:
        self.attn.close()


def _floor_lead(backend: Any, spec: RunSpec, geom: Geometry, batch: int, max_tokens: int,
                seed: int, engine: dict[str, EngineWork]) -> FloorLead:
    """The floor's `FloorLead` at the spec's layer count.

    Raises:
        ValueError: no engine work for the lead mode, which the symmetric method needs to
            step it (the floor would otherwise follow its own step, silently).
    """
    if FLOOR_LEAD_MODE not in engine:
        raise ValueError(f"floor method 'lead' needs the hook engine's work of mode "
                         f"{FLOOR_LEAD_MODE!r} (engine); use floor method 'noop' without it")
    attn = make_attention(backend, FLOOR_LEAD_MODE, geom, spec.layers, batch, max_tokens, seed)
    return FloorLead(attn, make_before_replay("symmetric", attn, FLOOR_LEAD_MODE,
                                              engine[FLOOR_LEAD_MODE]))


#: the host-time flatness figure: the device path's host CPU time per step at
#: FLATNESS_LAYERS[1] over FLATNESS_LAYERS[0], batch FLATNESS_BATCH from the trace, measured
#: side by side (`measure_flatness`); bench, selfcheck and the README report this one figure
FLATNESS_LAYERS = (1, 61)
FLATNESS_BATCH = 64
FLATNESS_SOURCE = "trace"
#: the target: host work per step does not grow with the layer count (1.0 = flat)
FLATNESS_TARGET = 1.3
FLATNESS_DEFINITION = (
    f"host CPU time per step of the device path at L={FLATNESS_LAYERS[1]} over "
    f"L={FLATNESS_LAYERS[0]}, batch {FLATNESS_BATCH} from the {FLATNESS_SOURCE}, both layer "
    f"counts interleaved step by step in one run (medians); target <= {FLATNESS_TARGET}")


def flatness_spec_key(mode: str, layers: int) -> str:
    """The run key of one (mode, layer count) of `measure_flatness`: ``pre_replay@L61``."""
    return f"{mode}@L{layers}"


def measure_flatness(
    geom: Geometry,
    *,
    modes: tuple[str, ...] = ("device_tiling", "pre_replay"),
    steps: int,
    warmup: int,
    seed: int = 0,
    backend_factory: Callable[[], Any] | None = None,
    on_step: Callable[[], None] | None = None,
    method: str = "old",
    engine: dict[str, EngineWork] | None = None,
) -> dict[str, list[Run]]:
    """The runs behind the flatness figure: per mode, ``[Run at L=1, Run at L=61]``.

    Both layer counts of every mode step side by side on the same batches (host time
    measured warm, `run_interleaved`), so the ratio does not carry the drift of a shared
    machine between two separate runs.
    """
    specs = [RunSpec(flatness_spec_key(m, n), m, n, method) for m in modes
             for n in FLATNESS_LAYERS]
    workload = {"name": "flatness", "batch": FLATNESS_BATCH, "source": FLATNESS_SOURCE,
                "layers": list(FLATNESS_LAYERS), "geometry": geom.as_dict()}
    runs = run_interleaved(specs, FLATNESS_BATCH, FLATNESS_SOURCE, geom, workload,
                           steps=steps, warmup=warmup, seed=seed, engine=engine,
                           backend_factory=backend_factory, on_step=on_step)  # fmt: skip
    by_key = {r.mode: r for r in runs}
    return {m: [by_key[flatness_spec_key(m, n)] for n in FLATNESS_LAYERS] for m in modes}
