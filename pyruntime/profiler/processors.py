"""Pure statistics over profile data: no I/O, no clocks, seeded randomness only."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from .data import HOST_PHASES, DeviceTask, Run

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
DEFAULT_RESAMPLES = 1000


def median(samples: Sequence[float]) -> float:
    """The median; raises ValueError on no samples."""
    if len(samples) == 0:
        raise ValueError("median of no samples")
    return float(np.median(np.asarray(samples, dtype=float)))


def percentiles(
    samples: Sequence[float], qs: Sequence[float] = DEFAULT_PERCENTILES
) -> dict[str, float]:
    """``{"p50": ..., "p90": ..., "p99": ...}`` (linear interpolation)."""
    if len(samples) == 0:
        raise ValueError("percentiles of no samples")
    values = np.percentile(np.asarray(samples, dtype=float), qs)
    return {f"p{q:g}": float(v) for q, v in zip(qs, values)}


def bootstrap_ci(
    samples: Sequence[float],
    stat: Callable[[np.ndarray], np.ndarray] | None = None,
    *,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` (default the median) over ``samples``.

    ``stat`` receives a ``[resamples, n]`` array and returns ``[resamples]`` values.
    Deterministic for a given seed. A single sample gives a zero-width interval.
    """
    x = np.asarray(samples, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap of no samples")
    stat = stat or (lambda a: np.median(a, axis=1))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    values = stat(x[idx])
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    return float(lo), float(hi)


def ratio_of_medians(
    numer: Sequence[float],
    denom: Sequence[float],
    *,
    paired: bool = True,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, float | list[float]]:
    """``median(numer) / median(denom)`` with a bootstrap interval.

    Paired resampling (the same step indices for both) suits interleaved A/B runs, where
    step i of A and step i of B saw the same inputs; it needs equal lengths.
    """
    a = np.asarray(numer, dtype=float)
    b = np.asarray(denom, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("ratio of no samples")
    if paired and a.size != b.size:
        raise ValueError(f"paired samples differ in length ({a.size} vs {b.size})")
    rng = np.random.default_rng(seed)
    ia = rng.integers(0, a.size, size=(resamples, a.size))
    ib = ia if paired else rng.integers(0, b.size, size=(resamples, b.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.median(a[ia], axis=1) / np.median(b[ib], axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(ratios, [alpha, 1 - alpha])
    value = float(np.median(a) / np.median(b)) if np.median(b) else float("inf")
    return {"value": value, "ci": [float(lo), float(hi)]}


def summarize(
    samples: Sequence[float],
    *,
    scale: float = 1.0,
    seed: int = 0,
    resamples: int = DEFAULT_RESAMPLES,
) -> dict:
    """Median, 95% bootstrap CI of the median, percentiles and count, times ``scale``."""
    x = np.asarray(samples, dtype=float) * scale
    lo, hi = bootstrap_ci(x, seed=seed, resamples=resamples)
    return {"median": median(x), "ci": [lo, hi], **percentiles(x), "n": int(x.size)}


def host_breakdown(run: Run, *, scale: float = 1e6) -> dict[str, dict[str, float]]:
    """Per host phase (plus ``total`` and ``host``): percentiles and mean, in us.

    ``total`` is the end-to-end step time; ``host`` the runtime's own host time.
    Phases that never occurred are left out.
    """
    if not run.steps:
        return {}
    out: dict[str, dict[str, float]] = {}
    for phase in HOST_PHASES:
        values = [s.phases.get(phase, 0.0) * scale for s in run.steps]
        if any(s.phases.get(phase) is not None for s in run.steps) and any(values):
            out[phase] = {**percentiles(values), "mean": float(np.mean(values))}
    for name, values in (
        ("host", [s.host_s * scale for s in run.steps]),
        ("total", [s.step_s * scale for s in run.steps]),
    ):
        out[name] = {**percentiles(values), "mean": float(np.mean(values))}
    return out


_LAYER = re.compile(r"(?:layer|attn|attention)[^0-9]*(\d+)", re.IGNORECASE)


def task_group(task: DeviceTask) -> str:
    """The row a device task is summarised under.

    AI-CPU tasks are the tiling; AI Core tasks naming a layer number are that layer's
    attention; names with "combine" are the combine step; anything else keeps
    ``kind: name``.
    """
    name = task.name.lower()
    if "combine" in name:
        return "combine"
    if task.kind == "aicpu":
        return "aicpu tiling"
    m = _LAYER.search(task.name)
    if task.kind == "aicore" and m:
        return f"attention layer {int(m.group(1))}"
    return f"{task.kind}: {task.name}"


def _group_key(group: str) -> tuple:
    order = {"aicpu tiling": 0, "combine": 2}
    m = re.match(r"attention layer (\d+)$", group)
    if m:
        return (1, int(m.group(1)))
    return (order.get(group, 3), group)


def device_summary(run: Run, *, scale: float = 1e6) -> dict[str, dict[str, float]]:
    """Device task durations per group (see :func:`task_group`): percentiles, mean, count."""
    groups: dict[str, list[float]] = {}
    for t in run.device_tasks:
        groups.setdefault(task_group(t), []).append(t.seconds * scale)
    return {
        g: {**percentiles(v), "mean": float(np.mean(v)), "count": len(v)}
        for g, v in sorted(groups.items(), key=lambda kv: _group_key(kv[0]))
    }


def collapse_layers(summary: dict[str, dict[str, float]], keep: int = 3) -> dict[str, dict]:
    """Keep the first ``keep`` attention layers and fold the rest into one row of means."""
    layers = [k for k in summary if k.startswith("attention layer")]
    if len(layers) <= keep + 1:
        return dict(summary)
    rest = layers[keep:]
    folded = {
        key: float(np.mean([summary[k][key] for k in rest]))
        for key in summary[rest[0]] if key != "count"
    }  # fmt: skip
    folded["count"] = sum(summary[k]["count"] for k in rest)
    out = {}
    for k, v in summary.items():
        if k in rest:
            if k == rest[0]:
                out[f"attention layers {rest[0].split()[-1]}-{rest[-1].split()[-1]} (mean)"] = (
                    folded
                )
            continue
        out[k] = v
    return out


#: the per-step device figures of `device_step_stats`, in the order they are shown
DEVICE_STEP_FIGURES = ("device_step", "aicpu_task", "attention_layer", "idle_tiling_to_attention")


def device_step_stats(run: Run, *, scale: float = 1e6) -> dict[str, dict[str, float]]:
    """Per-step device figures of a run (us): percentiles, mean and count of each.

    * ``device_step``: the step's device time, first task start to last task end.
    * ``aicpu_task``: the AI-CPU tiling task's time, per step that ran one.
    * ``attention_layer``: each attention kernel's time (every layer of every step).
    * ``idle_tiling_to_attention``: from the end of the step's last AI-CPU task to the start
      of the first attention kernel after it: the device waiting between the tiling and
      the attention (per step with both; never below zero).

    Figures with no samples (no AI-CPU task on host_update) are left out.
    """
    by_step: dict[int, list[DeviceTask]] = {}
    for t in run.device_tasks:
        by_step.setdefault(t.step, []).append(t)
    samples: dict[str, list[float]] = {k: [] for k in DEVICE_STEP_FIGURES}
    for tasks in by_step.values():
        tasks = sorted(tasks, key=lambda t: t.start)
        samples["device_step"].append((max(t.end for t in tasks) - tasks[0].start) * scale)
        aicpu = [t for t in tasks if t.kind == "aicpu"]
        attention = [t for t in tasks if t.name.startswith("attention layer")]
        if aicpu:
            samples["aicpu_task"].append(sum(t.seconds for t in aicpu) * scale)
        samples["attention_layer"] += [t.seconds * scale for t in attention]
        if aicpu and attention:
            tiling_end = max(t.end for t in aicpu)
            after = [t.start for t in attention if t.start >= aicpu[0].start]
            if after:
                samples["idle_tiling_to_attention"].append(
                    max(0.0, min(after) - tiling_end) * scale)
    return {k: {**percentiles(v), "mean": float(np.mean(v)), "count": len(v)}
            for k, v in samples.items() if v}
