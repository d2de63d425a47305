"""Checks of attention and host time: our attention on the chosen placement against a
float64 reference (and torch_npu's FIA on an NPU), the Triton AI Core kernels, and host
time per step, host_update against device tiling."""

from __future__ import annotations

import statistics

import torch

from pyruntime.attention import StaticAttention
from pyruntime.backends import BackendError
from pyruntime.tiling import TilingError
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.driver import randomize, run_decode_loop

from .context import Context
from .report import CheckResult, failed, passed, skipped

#: small shapes: the CPU backend emulates every AI Core in Python-driven C
SHAPES = {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 32, "block_size": 16,
          "max_batch": 8, "max_tokens": 32, "max_blocks_per_req": 16}
NUM_BLOCKS = SHAPES["max_batch"] * SHAPES["max_blocks_per_req"] + 8
#: the batcher's mix: spec decode (2 tokens), chunked prefill (8-token chunks), padded buckets
TRACE_MIX = {"spec_tokens": 2, "prefill_chunk": 8, "length_scale": 0.05, "step_s": 0.05}
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}



def _attention(backend, placement: str, dtype: torch.dtype, layers: int = 2) -> StaticAttention:
    attn = StaticAttention(backend, num_layers=layers, num_blocks=NUM_BLOCKS,
                           mode="device_tiling", placement=placement, dtype=dtype,
                           num_cores=4, **SHAPES)
    randomize(attn)
    attn.capture()
    return attn


def _batcher(ctx: Context) -> ContinuousBatcher:
    keys = ("max_batch", "max_tokens", "block_size", "max_blocks_per_req")
    return ContinuousBatcher(ctx.requests(), num_blocks=NUM_BLOCKS, buckets=(1, 2, 4, 8),
                             **{k: SHAPES[k] for k in keys}, **TRACE_MIX)


def attention_correctness(ctx: Context) -> CheckResult:
    """Our attention, on the chosen placement, against the float64 reference."""
    name = "attention_correctness"
    if ctx.placement is None:
        return skipped(name, "no placement was found (see aicpu_replay)")
    steps = 48  # cheap (about 1 s here) and enough to cover padded buckets
    results, worst = {}, 0.0
    coverage = {"padded": 0, "spec_decode": 0, "chunked_prefill": 0}
    try:
        for dtype, tolerance in TOLERANCE.items():
            be = ctx.make_backend()
            try:
                attn = _attention(be, ctx.placement, dtype)
                stats = run_decode_loop(attn, _batcher(ctx), steps=steps)
            finally:
                _close(be)
            results[str(dtype).removeprefix("torch.")] = stats.max_rel_err
            if stats.max_rel_err > tolerance:
                worst = max(worst, stats.max_rel_err)
            coverage["padded"] += stats.padded_steps
            coverage["spec_decode"] += stats.spec_steps
            coverage["chunked_prefill"] += stats.prefill_steps
    except (BackendError, TilingError) as exc:
        return failed(name, f"a step failed on placement {ctx.placement}: "
                            f"{type(exc).__name__}: {exc}")
    data = {"placement": ctx.placement, "steps_per_dtype": steps, "max_rel_err": results,
            "tolerance": {str(k).removeprefix("torch."): v for k, v in TOLERANCE.items()},
            "coverage_steps": coverage, "requests": ctx.requests_source}
    missing = [k for k, v in coverage.items() if v == 0]
    if missing:
        return failed(name, f"the trace batches never covered {', '.join(missing)}", **data)
    errs = ", ".join(f"{k} {v:.1e}" for k, v in results.items())
    if worst:
        return failed(name, f"max relative error over the tolerance: {errs}", **data)
    return passed(name, f"placement {ctx.placement}, {steps} steps x 2 layers per dtype "
                        f"(decode, spec decode, chunked prefill, padded buckets) against "
                        f"float64: max rel err {errs}", **data)


def attention_fia(ctx: Context) -> CheckResult:
    """Our attention against torch_npu's FIA run eagerly (NPU only)."""
    name = "attention_fia"
    if ctx.backend != "npu":
        return skipped(name, "FIA (torch_npu.npu_fused_infer_attention_score) needs an Ascend "
                             "NPU; the CPU backend compares with the float64 reference only")
    if ctx.twin:  # the twin's FIA is a stand-in: comparing with it would prove nothing
        return skipped(name, "stock FIA numerics need a real NPU: the NPU twin's FIA "
                             "(torch_npu.npu_fused_infer_attention_score) is a stand-in, so "
                             "attention_correctness (float64 reference) is the check here")
    from .npu_fia import compare_with_fia

    return compare_with_fia(ctx, name)


def attention_triton(ctx: Context) -> CheckResult:
    """The Triton AI Core kernels: interpreted on CPU tensors, compiled on an NPU."""
    name = "attention_triton"
    if ctx.placement is None:
        return skipped(name, "no placement was found (see aicpu_replay)")
    try:
        from pyruntime.kernels import triton_launch
    except ImportError:
        return skipped(name, "this build has no Triton AI Core kernels "
                             "(pyruntime/kernels/triton_launch.py is missing)")
    reason = triton_launch.available()
    if reason is not None:
        return skipped(name, f"Triton is not usable here: {reason}")
    steps = 3 if ctx.quick else 6
    try:  # on an NPU the attention ops are the Triton kernels compiled by Triton-Ascend
        be = ctx.make_backend(aicore="triton") if ctx.backend == "cpu" else ctx.make_backend()
    except (TypeError, ValueError, BackendError) as exc:
        return skipped(name, f"the {ctx.backend} backend cannot run the Triton bodies: {exc}")
    try:
        attn = _attention(be, ctx.placement, torch.float32, layers=1)
        stats = run_decode_loop(attn, _batcher(ctx), steps=steps)
    except (BackendError, TilingError) as exc:
        return failed(name, f"a Triton step failed: {type(exc).__name__}: {exc}")
    finally:
        _close(be)
    where = "under Triton's interpreter on CPU" if ctx.backend == "cpu" else "compiled"
    data = {"steps": steps, "max_rel_err": stats.max_rel_err, "tolerance": 1e-4}
    if stats.max_rel_err > 1e-4:
        return failed(name, f"Triton attention {where}: max rel err {stats.max_rel_err:.1e} "
                            "against float64", **data)
    return passed(name, f"Triton attention and combine {where}, {steps} steps, placement "
                        f"{ctx.placement}: max rel err {stats.max_rel_err:.1e} against float64",
                  **data)


#: the layer counts selfcheck's host_time counts the per-step invariants at (the bench: five)
INVARIANT_CHECK_LAYERS = (1, 4)


def host_time(ctx: Context) -> CheckResult:
    """Judged by the exact per-step invariants (`pyruntime.measurement.invariants`): the
    device path's calls and counters per host step are the same at L = 1 and 4, and
    host_update's grow by a whole amount per layer (the positive control); the device path
    makes no task update or host tiling and at most one AI-CPU launch per step. Reported
    beside, not judged: host and step time at L = 61 (host_update against the device path)
    and the flatness figure (the device path's host time at L = 61 over L = 1).

    Counted and timed as ``bench`` does (its headline method, `DEFAULT_METHOD`): the whole
    serving step, not `StaticAttention.step` alone: every mode's input copies and
    vLLM-Ascend's pre-replay synchronize, the device path's hook engine work for
    `DEFAULT_GRAPH_KEYS` captured graph keys (counted off `NpuTilingEngine`,
    `pyruntime.hook.engine_step`)."""
    name = "host_time"
    if ctx.placement is None:
        return skipped(name, "no placement was found (see aicpu_replay)")
    from pyruntime.measurement import invariants as inv
    from pyruntime.measurement.abrun import (
        FLATNESS_BATCH,
        FLATNESS_DEFINITION,
        FLATNESS_LAYERS,
        FLATNESS_SOURCE,
        FLATNESS_TARGET,
        Geometry,
        Point,
        measure_flatness,
        run_point,
    )
    from pyruntime.hook.engine_step import engine_step_work
    from pyruntime.measurement.serving import DEFAULT_GRAPH_KEYS, DEFAULT_METHOD, EngineWork
    from pyruntime.measurement.sources import SourceError

    from .device_checks import measured_on

    variant = "device_tiling" if ctx.placement == "graph" else "pre_replay"
    method, keys = DEFAULT_METHOD, DEFAULT_GRAPH_KEYS
    engine = {variant: EngineWork.from_counts(keys, engine_step_work(ctx.placement, keys))}
    low, high = FLATNESS_LAYERS
    steps, warmup = (12, 1) if ctx.quick else (20, 2)
    # short KV (<= 1024 tokens): host time hardly depends on it, the emulated attention does
    geometry = Geometry(max_kv=1024)
    try:
        counts = inv.measure(geometry, layers=INVARIANT_CHECK_LAYERS,
                             modes=(inv.PER_LAYER_MODE, variant), batch=FLATNESS_BATCH,
                             source=FLATNESS_SOURCE, warmup=max(warmup, 1),
                             backend_factory=ctx.make_backend, method=method, engine=engine)
        runs = run_point(Point(high, FLATNESS_BATCH, FLATNESS_SOURCE), geometry,
                         steps=max(3, steps // 4), warmup=warmup,
                         modes=("host_update", variant), backend_factory=ctx.make_backend,
                         method=method, engine=engine)
        flat_low, flat_high = measure_flatness(geometry, modes=(variant,), steps=steps,
                                               warmup=warmup, backend_factory=ctx.make_backend,
                                               method=method, engine=engine)[variant]
    except SourceError as exc:
        return skipped(name, f"could not load the workload: {exc}")
    except BackendError as exc:
        return failed(name, f"the workload failed on the {ctx.backend} backend: {exc}")

    def median_us(run, key: str = "host_s") -> float:
        return 1e6 * statistics.median(getattr(s, key) for s in run.steps)

    by_mode = {r.mode: r for r in runs}
    a61, b61 = median_us(by_mode["host_update"]), median_us(by_mode[variant])
    s61 = median_us(by_mode["host_update"], "step_s"), median_us(by_mode[variant], "step_s")
    b_low, b_high = median_us(flat_low), median_us(flat_high)
    flatness = b_high / b_low
    problems = inv.judge(counts)
    row = counts[variant][str(INVARIANT_CHECK_LAYERS[-1])]
    if row["task_updates"] or row["host_tiling_calls"] or row["launches_aicpu"] > 1:
        problems.append(f"{variant}: task updates, host tilings or more than one AI-CPU "
                        f"launch per step ({row})")
    per_layer = inv.per_layer_amount(counts[inv.PER_LAYER_MODE])
    data = {"placement": ctx.placement, "batch": FLATNESS_BATCH, "max_kv": geometry.max_kv,
            "method": method, "graph_keys": keys,
            "engine_per_step": engine[variant].as_dict(),
            "invariants": counts, "invariants_problems": problems,
            "host_update_per_layer": per_layer,
            "steps": {"a_b": len(by_mode[variant].steps), "flatness": steps},
            f"L{high}": {"host_update": {"host_us": a61, "step_us": s61[0],
                                         "counters_per_step": by_mode["host_update"].counters},
                         variant: {"host_us": b61, "step_us": s61[1],
                                   "counters_per_step": by_mode[variant].counters}},
            "ratio_host_update_over_device": a61 / b61,
            # host_update's update cost per layer on this backend, for the NPU projection
            # (bench projection --selfcheck): what it costs over the device path at L=high,
            # both paths' steps otherwise the same (copies, synchronize, replay)
            "update_per_layer": {"update_per_layer_us": (a61 - b61) / high,
                                 "layers": high, **measured_on(ctx)},
            "flatness": {"definition": FLATNESS_DEFINITION, "target": FLATNESS_TARGET,
                         f"host_us_L{low}": b_low, f"host_us_L{high}": b_high,
                         "value": flatness, "judged": False},
            "host_us_statistic": "median over the measured steps, measured warm with the "
                                 "device held (pyruntime.measurement.abrun.run_interleaved)",
            "criteria": (f"exact per-step invariants at L={INVARIANT_CHECK_LAYERS}: the device "
                         "path's Python, C and lib calls and backend counters the same at "
                         "every L; host_update's growing by a whole amount per layer; no task "
                         "update or host tiling and at most one AI-CPU launch per step on the "
                         "device path. Times and the flatness figure are reported, not judged"),
            "device_lanes": device_lanes(ctx, geometry, variant, warmup)}
    calls = counts[variant][str(INVARIANT_CHECK_LAYERS[-1])]
    text = (f"per host step at L={INVARIANT_CHECK_LAYERS}: device tiling ({ctx.placement}) "
            f"{calls['python_calls']} Python + {calls['c_calls']} C calls at every L, "
            f"host_update +{per_layer['python_calls']:g} Python + "
            f"{per_layer['c_calls']:g} C calls per layer; reported: host us/step L={high} "
            f"host_update {a61:.0f}, device tiling {b61:.1f} ({a61 / b61:.1f}x less); step us "
            f"{s61[0]:.0f} vs {s61[1]:.0f}; flatness L{high}/L{low} = {b_high:.1f}/{b_low:.1f} "
            f"us = {flatness:.2f}; update cost per layer {(a61 - b61) / high:.1f} us "
            f"({ctx.report_backend}{', emulated' if data['update_per_layer']['emulated'] else ''})")
    if problems:
        return failed(name, f"the per-step invariants do not hold: {'; '.join(problems)}. "
                            f"{text}", **data)
    return passed(name, text, **data)


#: the device lanes' run: L, batch and measured steps (small: on the twin each step runs the
#: reference attention of every layer)
LANES_LAYERS, LANES_BATCH, LANES_STEPS = INVARIANT_CHECK_LAYERS[-1], 8, 3


def device_lanes(ctx: Context, geometry, variant: str, warmup: int) -> dict | str:
    """What torch_npu's profiler saw of host_update and the device path (npu, npu-twin):
    per mode and step, the AI-CPU tiling tasks, attention kernels and combines it recorded,
    with the per-step device figures (`pyruntime.profiler.processors.device_step_stats`,
    us). Reported, not judged; on the twin the times are emulated and only the counts mean
    anything. A string saying why on cpu or when the profile could not be read."""
    if ctx.backend != "npu":
        return ("not measured on the cpu backend (its emulated lanes: aicpu-tiling profile "
                "--trace); on npu and npu-twin from torch_npu's profiler")
    from pyruntime.measurement.abrun import Point, run_point
    from pyruntime.profiler.ascend_files import AscendProfileError
    from pyruntime.profiler.processors import device_step_stats, task_group

    info: dict = {}
    try:
        runs = run_point(Point(LANES_LAYERS, LANES_BATCH, "trace"), geometry,
                         steps=LANES_STEPS, warmup=max(warmup, 1),
                         modes=("host_update", variant), device_tasks=True, warm_host=False,
                         backend_factory=ctx.make_backend, lanes_info=info)
    except AscendProfileError as exc:
        return f"not measured: torch_npu's profiler output could not be read: {exc}"
    out: dict = {"times": "emulated (NPU twin): only the counts mean anything" if ctx.twin
                 else "measured on the device by torch_npu's profiler",
                 "layers": LANES_LAYERS, "batch": LANES_BATCH, "steps": LANES_STEPS,
                 "profiler": info, "modes": {}}
    for run in runs:
        counts: dict[str, int] = {}
        for task in run.device_tasks:
            group = task_group(task)
            group = "attention" if group.startswith("attention layer") else group
            counts[group] = counts.get(group, 0) + 1
        steps = len({t.step for t in run.device_tasks}) or 1
        out["modes"][run.mode] = {"tasks_per_step": {g: round(n / steps, 3)
                                                     for g, n in counts.items()},
                                  "device_us": device_step_stats(run)}
    return out


def _close(be) -> None:
    close = getattr(be, "close", None)
    if close is not None:
        close()
