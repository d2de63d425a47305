"""Exact per-step invariants: what one warm host step of each mode does, counted, not timed.

Host time per step on a shared machine is noisy (a ratio of two medians of microseconds);
whether the host does work per layer is not a matter of noise. Per mode and layer count L,
after warm-up steps, one step's host part is counted (`count_step`):

* ``python_calls``: Python function calls made by the host thread (``sys.setprofile``
  ``call`` events around the step; the CPU backend's device threads are not profiled);
* ``c_calls``: calls of built-in (C) functions by the host thread (``c_call`` events), of
  which ``lib_calls`` are calls into our cffi ``lib`` (`pyruntime.tiling.is_lib_function`);
* the backend counters of that step (`pyruntime.backends.Counters`: copies, blocking copies,
  synchronizes, event records and waits, launches, replays, task updates, host tilings).

`judge` reads the rows: a device mode's row is identical at every L (no host work per
layer, whatever it costs), and host_update's row grows by exactly the same per-layer amount
between every pair of L (the positive control: if counting could not see per-layer work,
host_update, which does it, would not show it either). Times are reported beside, never
judged: `host_time_fit` gives the least-squares slope of host time over L with its 95%
interval.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import tiling
from .abrun import Geometry, block_table, make_attention
from .serving import EngineWork, ServingStep, make_before_replay
from .sources import ContinuousBatch

#: the layer counts the bench counts at (``bench --invariant-layers``)
INVARIANT_LAYERS = (1, 8, 16, 32, 61)
#: the modes whose host work per step must not depend on L
DEVICE_MODES = ("device_tiling", "pre_replay")
#: the mode that does host work per layer (the positive control)
PER_LAYER_MODE = "host_update"


_STDLIB = sysconfig.get_paths()["stdlib"]
_SITE = tuple({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})


@functools.lru_cache(maxsize=4096)
def _in_stdlib(filename: str) -> bool:
    """Whether a code object's file is Python's standard library (not site-packages)."""
    return filename.startswith(_STDLIB) and not filename.startswith(_SITE)


def _host_waits() -> frozenset:
    """The code of the backend's host waits (`Backend.synchronize`, `stream_synchronize`,
    `event_synchronize`)."""
    from ..backends import Backend

    return frozenset(f.__code__ for f in (Backend.synchronize, Backend.stream_synchronize,
                                          Backend.event_synchronize))


class CallCounter:
    """``with CallCounter() as calls:`` counts the host thread's Python and C calls inside.

    Two kinds of call count as one Python call, whatever runs inside: a host wait
    (`Backend.synchronize` and the like: what runs inside is the host waiting for the device,
    and how often a condition variable wakes up is timing, not work; the wait itself is in
    the backend's ``synchronizes``), and a call into Python's standard library (what runs
    inside is the library's, and for ``threading`` and ``concurrent.futures``, how the CPU
    backend and the NPU twin hand work to a device thread, timing too: ``Condition.notify``
    does more when that thread happens to be waiting already). A call per layer of either
    kind still counts once per layer. Only counts: no time is taken from the profiler.
    Restores the previous profile function.
    """

    def __init__(self) -> None:
        self.python_calls = self.c_calls = self.lib_calls = 0
        self._previous: Any = None
        self._waits = _host_waits()
        self._waiting: Any = None  # the frame of the host wait we are inside

    def _event(self, frame, event: str, arg) -> None:
        if self._waiting is not None:
            if event == "return" and frame is self._waiting:
                self._waiting = None
            return
        if event == "call":
            self.python_calls += 1
            if frame.f_code in self._waits or _in_stdlib(frame.f_code.co_filename):
                self._waiting = frame
        elif event == "c_call":
            self.c_calls += 1
            if tiling.is_lib_function(arg):
                self.lib_calls += 1

    def __enter__(self) -> CallCounter:  # noqa: PYI034 - py310: no typing.Self
        self._previous = sys.getprofile()
        sys.setprofile(self._event)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(self._previous)

    def counts(self) -> dict[str, int]:
        # the profiler sees its own exit: sys.setprofile is one C call, made inside
        return {"python_calls": self.python_calls, "c_calls": self.c_calls - 1,
                "lib_calls": self.lib_calls}


def count_step(attn: Any, table: Any, cu_seqlens_q: Any, seqlens_kv: Any,
               before_replay: ServingStep | None = None) -> dict[str, int]:
    """Count one step of `attn` (warm: call after warm-up steps): its host part under
    `CallCounter`, with the device held (`Backend.hold_device`), then the wait outside.

    With `before_replay` (the symmetric method's serving work, `ServingStep`) the counted
    step is the whole measured serving step, as the bench times it: the input copies,
    vLLM-Ascend's pre-replay synchronize and the hook engine's per-step work; its host
    staging runs before the count, as it runs before the bench's timed part.

    Returns:
        ``python_calls``, ``c_calls``, ``lib_calls`` and every backend counter of the step.
    """
    be = attn.backend
    if before_replay is not None:
        before_replay.stage(cu_seqlens_q, seqlens_kv)
    with be.hold_device():
        be.counters.reset()
        with CallCounter() as calls:
            attn.step(table, cu_seqlens_q, seqlens_kv, wait=False, before_replay=before_replay)
        counters = be.counters.snapshot()
        attn.wait()
    attn.check()
    return {**calls.counts(), **counters}


def measure(geom: Geometry, *, layers: Iterable[int] = INVARIANT_LAYERS,
            modes: Iterable[str] = (PER_LAYER_MODE, *DEVICE_MODES), batch: int = 64,
            source: str = "trace", warmup: int = 2, seed: int = 0,
            backend_factory: Callable[[], Any] | None = None,
            on_point: Callable[[], None] | None = None,
            method: str = "old", engine: Mapping[str, EngineWork] | None = None,
            ) -> dict[str, dict[str, dict[str, int]]]:
    """The invariants table: ``{mode: {str(L): row}}``, each row `count_step` of the step
    after `warmup` steps on a fresh captured attention (same batches for every mode and L:
    the source is re-seeded each time).

    Args:
        method: ``"old"`` counts `StaticAttention.step` alone; ``"symmetric"`` counts the
            whole serving step the bench measures under that method (`ServingStep`: every
            mode's input copies and pre-replay synchronize, the device modes' hook engine
            work from `engine`), warm-up steps included.
        engine: the hook engine's per-step work per device mode (needed with symmetric).

    Raises:
        SourceError, ValueError, BackendError: as `run_point` does; ValueError for a
            symmetric count of a device mode without its engine work.
    """
    from .. import backends

    if method == "symmetric":
        missing = [m for m in modes if m in DEVICE_MODES and m not in (engine or {})]
        if missing:
            raise ValueError(f"method 'symmetric' needs the hook engine's work of {missing} "
                             "(engine)")
    factory = backend_factory or (lambda: backends.get("cpu"))
    out: dict[str, dict[str, dict[str, int]]] = {}
    modes, layers = list(modes), list(layers)
    # an unrecorded first point per mode: process-wide caches (`kernels.step.params_list`'s
    # lru_cache, which compares a new params object with __eq__ but finds its first one by
    # identity) are warm for every recorded point alike
    plan = [(m, min(layers), False) for m in modes] + [(m, n, True) for m in modes
                                                        for n in layers]
    for mode, n, recorded in plan:
        out.setdefault(mode, {})
        be = factory()
        attn = None
        try:
            src = ContinuousBatch(source, batch, seed=seed, max_kv=geom.max_kv)
            table = block_table(batch, geom)
            attn = make_attention(be, mode, geom, n, batch, src.max_tokens(), seed)
            before = make_before_replay(method, attn, mode, (engine or {}).get(mode))
            for _ in range(warmup):
                step = next(src)
                if before is not None:
                    before.stage(step.cu_seqlens_q, step.seqlens_kv)
                attn.step(table, step.cu_seqlens_q, step.seqlens_kv, before_replay=before)
            step = next(src)
            row = count_step(attn, table, step.cu_seqlens_q, step.seqlens_kv, before)
        finally:
            if attn is not None:
                attn.close()
            close = getattr(be, "close", None)
            if close is not None:
                close()
        if recorded:
            out[mode][str(n)] = row
            if on_point is not None:
                on_point()
    return out


def per_layer_amount(rows: Mapping[str, Mapping[str, int]]) -> dict[str, float] | None:
    """Per count, the amount one more layer adds, from the smallest and largest L; None
    with fewer than two layer counts."""
    ls = sorted(rows, key=int)
    if len(ls) < 2:
        return None
    lo, hi = ls[0], ls[-1]
    span = int(hi) - int(lo)
    return {k: (rows[hi][k] - rows[lo][k]) / span for k in rows[lo]}


def judge(invariants: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[str]:
    """Every way the table breaks the invariants, as sentences (empty: they hold).

    * a device mode: its row at every L equals its row at the smallest L;
    * host_update (the positive control): one more layer adds the same whole amount at every
      L (row(L) = row(L0) + (L - L0) * per_layer, per_layer an integer per count), and that
      amount is not zero (Python calls, task updates and host tilings all grow; not lib
      calls: on an NPU host_update runs FIA, which tiles inside the op, not through our lib).
    """
    problems = []
    for mode, rows in invariants.items():
        ls = sorted(rows, key=int)
        if not ls:
            continue
        base = rows[ls[0]]
        if mode in DEVICE_MODES:
            for n in ls[1:]:
                diff = {k: rows[n][k] - base[k] for k in base if rows[n][k] != base[k]}
                if diff:
                    problems.append(f"{mode}: host work per step grows with the layer count: "
                                    f"L={n} against L={ls[0]} differs by {diff}")
        elif mode == PER_LAYER_MODE:
            slope = per_layer_amount(rows)
            if slope is None:
                continue
            fractional = {k: v for k, v in slope.items() if v != int(v)}
            if fractional:
                problems.append(f"{mode}: per-layer amount not a whole number: {fractional}")
                continue
            for n in ls[1:-1]:
                want = {k: base[k] + (int(n) - int(ls[0])) * int(v) for k, v in slope.items()}
                diff = {k: rows[n][k] - want[k] for k in want if rows[n][k] != want[k]}
                if diff:
                    problems.append(f"{mode}: L={n} is off the per-layer line by {diff}")
            flat = [k for k in ("python_calls", "task_updates", "host_tiling_calls")
                    if slope[k] <= 0]
            if flat:
                problems.append(f"{mode}: the positive control does not grow per layer in "
                                f"{flat}: the counting cannot see per-layer work")
    return problems


def linear_fit(xs: list[float], ys: list[float], confidence: float = 0.95) -> dict:
    """Least squares ``y = intercept + slope * x`` with the slope's two-sided interval from
    Student's t (n - 2 degrees of freedom).

    Returns:
        ``slope``, ``intercept``, ``ci`` ([low, high], None with fewer than 3 points or no
        spread in x) and ``n``.
    """
    n = len(xs)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 2 or sxx == 0:
        return {"slope": None, "intercept": my, "ci": None, "n": n}
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    intercept = my - slope * mx
    ci = None
    if n > 2:
        rss = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
        se = math.sqrt(rss / (n - 2) / sxx)
        t = _t_quantile(0.5 + confidence / 2, n - 2)
        ci = [slope - t * se, slope + t * se]
    return {"slope": slope, "intercept": intercept, "ci": ci, "n": n}


def _t_quantile(p: float, df: int) -> float:
    """Student's t quantile by bisection on its CDF (regularised incomplete beta by
    continued fraction); exact enough for an interval's width."""
    def cdf(t: float) -> float:
        x = df / (df + t * t)
        tail = 0.5 * _betainc(df / 2, 0.5, x)
        return 1 - tail if t >= 0 else tail

    lo, hi = 0.0, 1000.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) (Numerical Recipes' continued fraction)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log(1 - x))
    if x > (a + 1) / (a + b + 2):
        return 1 - _betainc(b, a, 1 - x)
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > 1e-300 else 1e-300)
    f = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + num * d
            d = 1 / (d if abs(d) > 1e-300 else 1e-300)
            c = 1 + num / c if abs(1 + num / c) > 1e-300 else 1e-300
            f *= d * c
    return front * f / a


def host_time_fit(host_us: Mapping[str, Mapping[int, list[float]]], *,
                  ratio_layers: int = 61) -> dict:
    """Host time per step against L per mode: every measured step is one point of a
    least-squares line (`linear_fit`, 95% interval of the slope), with the medians per L,
    and host_update's median over each device mode's at `ratio_layers` (when measured).

    Args:
        host_us: mode -> L -> host microseconds of each measured step.
    """
    out: dict[str, Any] = {"modes": {}, "ratio_layers": ratio_layers, "ratio": {}}
    for mode, by_l in host_us.items():
        xs = [float(n) for n, samples in by_l.items() for _ in samples]
        ys = [y for samples in by_l.values() for y in samples]
        fit = linear_fit(xs, ys)
        out["modes"][mode] = {
            "layers": sorted(by_l), "median_us": [statistics.median(by_l[n])
                                                  for n in sorted(by_l)],
            "slope_us_per_layer": fit["slope"], "slope_ci": fit["ci"],
            "intercept_us": fit["intercept"], "steps": fit["n"]}
    ref = host_us.get(PER_LAYER_MODE, {}).get(ratio_layers)
    for mode in DEVICE_MODES:
        other = host_us.get(mode, {}).get(ratio_layers)
        if ref and other:
            out["ratio"][mode] = statistics.median(ref) / statistics.median(other)
    return out
