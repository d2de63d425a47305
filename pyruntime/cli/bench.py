"""``aicpu-tiling bench``: interleaved A/B runs of ``host_update`` against ``device_tiling``.

For each grid point (layers, batch, length source) three runs are captured on the CPU
backend and stepped on identical inputs, interleaved: ``host_update``, ``device_tiling``
with its tiling task captured in the graph (placement ``graph``) and ``pre_replay``
(placement ``pre-replay``: the same task launched once per step before the replay).
Reports per-step host time and end-to-end step time as medians with bootstrap 95%
intervals, the host_update over each placement's ratio with a paired bootstrap interval,
per-step backend counters, host time by layer count, and the host-time flatness figure
(device path host time at L=61 over L=1, both measured side by side). Host time is the
host thread's CPU time in a step's host part, measured warm with the emulated device held
(see ``pyruntime.measurement.abrun.run_interleaved``). What judges "no host work per
layer" is exact: the per-step invariants (each mode's Python, C and cffi lib calls and
backend counters in one warm host step at L = 1, 8, 16, 32, 61; the device modes' must not
change with L, host_update's grow by its per-layer amount), reported with host time over L
and its least-squares slope (``pyruntime.measurement.invariants``). Writes JSON (schema in
docs/bench_schema.md) and, with the ``plot`` extra, a PNG.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..measurement import invariants as inv
from ..measurement.abrun import (
    BENCH_MODES,
    DTYPES,
    FLATNESS_BATCH,
    FLATNESS_DEFINITION,
    FLATNESS_LAYERS,
    FLATNESS_SOURCE,
    FLATNESS_TARGET,
    VARIANTS,
    Geometry,
    Point,
    RunSpec,
    measure_flatness,
    run_interleaved,
)
from ..measurement.invariants import INVARIANT_LAYERS
from ..measurement.serving import (
    DEFAULT_FLOOR_METHOD,
    DEFAULT_GRAPH_KEYS,
    DEFAULT_METHOD,
    FLOOR_METHODS,
    FLOOR_MODE,
    METHODS,
    EngineWork,
)
from ..measurement.sources import SOURCES, SourceError
from ..profiler import processors as proc
from ..profiler.renderers.bench_tables import bench_table
from . import _limits
from ._backend import TIMES, add_backend_arg, backend_factory, is_emulated
from ._common import (
    CliError,
    add_force_arg,
    add_output_args,
    check_outputs,
    comma_choices,
    emit_json,
    make_console,
    progress,
    write_json,
)
from .balance import _int_list

#: a measured step in which the host was blocked longer than this slept through device work
#: (the shortest device phase here, L = 1, lasts about 2 ms); counted per mode as slept_steps
SLEPT_S = 1e-3
METHOD_DEFINITIONS = {
    "old": "each mode's step is StaticAttention.step alone: host_update's holds vLLM-Ascend's "
           "pre-replay synchronize, which sleeps through the warm pair's first step; the device "
           "modes neither synchronize nor run the hook engine's work",
    "symmetric": "every mode's step holds the same input copies and vLLM-Ascend's pre-replay "
                 "synchronize, the device modes also the hook engine's per-step work for K "
                 "graph keys; every measured step starts with the device idle and the host "
                 "warm (pyruntime.measurement.serving)",
}
FLOOR_METHOD_DEFINITIONS = {
    "lead": "under symmetric, the floor's measured step follows a whole device_tiling step at "
            "the point's L on the floor's backend, waited for (FloorLead): the host state the "
            "device modes' measured steps start from (since 2026-12-03)",
    "noop": "under symmetric, the floor's measured step follows the floor's own previous step "
            "(one no-op task), waited for: the floor measured warm against cold device modes "
            "(the way before 2026-12-03)",
}
SCHEMA = "aicpu-tiling/bench"
SCHEMA_VERSION = 4
HEADLINE = Point(61, 64, "trace")
#: the default grid: the headline, its neighbours in layers and batch, two other sources
DEFAULT_POINTS = (
    HEADLINE,
    Point(1, 64, "trace"),
    Point(16, 64, "trace"),
    Point(61, 8, "trace"),
    Point(16, 16, "spec-decode"),
    Point(16, 16, "chunked-prefill"),
)
QUICK_POINTS = (HEADLINE, Point(4, 8, "spec-decode"))
DEFAULT_STEPS, DEFAULT_WARMUP = 30, 3
QUICK_STEPS, QUICK_WARMUP = 6, 1
#: ``--geometry deepseek-v3`` (issue 20): L = 61 MLA layers at one TP-8 rank of DeepSeek-V3
#: (16 heads, kv_lora_rank 512, rope 64; vLLM-Ascend's MLA block 128), batch 16, trace KV
#: lengths capped at 2048 (a full-length step takes minutes on the CPU backend), bf16. Its
#: emulated device work is about 10 s a step here, so it runs few steps.
DEEPSEEK_V3 = Geometry(num_q_heads=16, num_kv_heads=1, head_dim=576, block_size=128,
                       num_cores=24, dtype="bfloat16", max_kv=2048, num_blocks=64,
                       kv_lora_rank=512, qk_rope_head_dim=64)
DEEPSEEK_V3_POINTS = (Point(61, 16, "trace"),)
DEEPSEEK_V3_STEPS, DEEPSEEK_V3_WARMUP = 4, 1
DEEPSEEK_V3_QUICK_STEPS, DEEPSEEK_V3_QUICK_WARMUP = 2, 0
GEOMETRIES = ("gqa", "deepseek-v3")
#: the flatness figure is a ratio of two medians of a few microseconds each: fewer steps
#: than this leave its interval too wide to judge against the target (about 10 s here)
FLATNESS_MIN_STEPS = 20
#: where the JSON goes without -o
DEFAULT_OUTPUT = "aicpu-tiling-bench.json"
#: what --quick sets, so none of these flags is silently overridden by it
QUICK_SETS = ("--layers", "--batch-sizes", "--sources", "--steps", "--warmup")
#: the largest --invariant-layers: a model's layer count (DeepSeek-V3 has 61, the largest
#: dense models about 126); each counted point captures a graph of that many layers
INVARIANT_MAX_LAYERS = 128
#: the invariants' definition, as the JSON states it
INVARIANTS_DEFINITION = (
    "per mode and layer count, one warm host step after warm-up (under the symmetric method "
    "the whole measured serving step: input copies, the pre-replay synchronize and, in the "
    "device modes, the hook engine's per-step work): Python calls, C calls and "
    "cffi lib calls of the host thread (sys.setprofile; a host wait or a call into Python's "
    "standard library counts as one) and the backend counters of that step. Device modes: "
    "identical at every L. host_update (positive control): grows by the same whole amount "
    "per layer")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench`` (its ``balance`` and ``tiling`` subcommands hang off it)."""
    p = sub.add_parser(
        "bench",
        help="A/B: host_update vs device_tiling (and: bench balance, bench tiling)",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    grid = p.add_argument_group(
        "grid (default: the headline L=61, batch 64, trace, and "
        "neighbours; any of these makes the grid their product)"
    )
    grid.add_argument("--layers", type=_int_list, help="comma-separated layer counts")
    grid.add_argument("--batch-sizes", type=_int_list, help="comma-separated batch sizes")
    grid.add_argument("--sources", type=comma_choices(tuple(SOURCES), "source"),
                      help=f"length sources: {', '.join(SOURCES)}")
    p.add_argument("--steps", type=int, help=f"measured steps per mode (default {DEFAULT_STEPS}; "
                                              f"--quick {QUICK_STEPS})")
    p.add_argument("--warmup", type=int, help=f"unmeasured steps (default {DEFAULT_WARMUP}; "
                                               f"--quick {QUICK_WARMUP})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    p.add_argument("--quick", action="store_true",
                   help="two points (L=61 batch 64 trace, L=4 batch 8 spec-decode), "
                        f"{QUICK_STEPS} steps, and the flatness figure: under a minute on two "
                        f"cores; sets {', '.join(QUICK_SETS)}, so it cannot be combined with them")
    p.add_argument("--method", type=comma_choices(METHODS, "method"), default=[DEFAULT_METHOD],
                   help="how host time is measured: symmetric (default: every mode's step holds "
                        "what its host does in vLLM-Ascend, the hook engine's work included) "
                        "or old (the figures up to 2026-12-02); several, comma-separated, run "
                        "side by side in one run, the first is the headline")
    p.add_argument("--floor-method", type=comma_choices(FLOOR_METHODS, "floor method"),
                   default=[DEFAULT_FLOOR_METHOD],
                   help="what the floor's measured step follows under the symmetric method: "
                        "lead (default: a device_tiling step, the device modes' host state) or "
                        "noop (its own no-op step, the way before 2026-12-03); several, "
                        "comma-separated, run side by side in one run, the first is the "
                        "headline's floor_ratio")
    p.add_argument("--graph-keys", type=int, default=DEFAULT_GRAPH_KEYS, metavar="K",
                   help="captured graph keys the hook engine serves per step in the symmetric "
                        f"method (default {DEFAULT_GRAPH_KEYS}: vLLM's default capture sizes)")
    p.add_argument("--flatness", action=argparse.BooleanOptionalAction, default=None,
                   help=f"measure the host-time flatness figure (device path, L={FLATNESS_LAYERS[1]} "
                        f"over L={FLATNESS_LAYERS[0]}, side by side); default: with the default "
                        "or quick grid, not with a grid given by flags")
    p.add_argument("--invariants", action=argparse.BooleanOptionalAction, default=None,
                   help="count each mode's calls per host step at --invariant-layers and "
                        "judge them (exact, not timed), and fit host time over L there; "
                        "default: with the default or quick grid, not with a grid given by "
                        "flags")
    p.add_argument("--invariant-layers", type=_int_list, default=None,
                   help="layer counts of the invariants and the host-time fit (default "
                        f"{','.join(map(str, INVARIANT_LAYERS))})")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help=f"JSON file (default {DEFAULT_OUTPUT}); an existing file is refused "
                        "before the run unless --force")
    p.add_argument(
        "--png",
        default=None,
        help="PNG chart (default: beside the JSON when matplotlib is installed; refused like "
             "the JSON when it exists)",
    )
    p.add_argument("--no-save", action="store_true",
                   help="write no files (refused with -o or --png, which it would ignore)")
    add_force_arg(p)
    add_backend_arg(p)
    g = p.add_argument_group("geometry")
    g.add_argument("--geometry", choices=GEOMETRIES, default="gqa",
                   help="gqa (the flags below) or deepseek-v3: L=61 MLA layers, one TP-8 rank "
                        "(16 heads, 512 + 64), batch 16, kv <= 2048; the flags below "
                        "cannot be combined with it, and the default grid is that one point")
    d = Geometry()
    for flag, field, what in GEOMETRY_FLAGS:
        g.add_argument(flag, type=int, default=None, dest=field,
                       help=f"{what} (default {getattr(d, field)})")
    g.add_argument("--dtype", choices=DTYPES, default=None,
                   help=f"dtype of queries and caches (default {d.dtype})")
    add_output_args(p)
    p.set_defaults(run=run)
    return p


#: (flag, Geometry field, what it sets) of the GQA geometry flags
GEOMETRY_FLAGS = (
    ("--q-heads", "num_q_heads", "query heads"),
    ("--kv-heads", "num_kv_heads", "kv heads"),
    ("--head-dim", "head_dim", "elements per head"),
    ("--block-size", "block_size", "kv block size"),
    ("--cores", "num_cores", "AI Cores"),
    ("--max-kv", "max_kv", "kv length cap per request"),
)


def geometry(args: argparse.Namespace) -> Geometry:
    """The Geometry the flags describe (`DEEPSEEK_V3` with ``--geometry deepseek-v3``)."""
    if getattr(args, "geometry", "gqa") == "deepseek-v3":
        return DEEPSEEK_V3
    given = {field: getattr(args, field, None) for _, field, _ in GEOMETRY_FLAGS}
    given["dtype"] = getattr(args, "dtype", None)
    return Geometry(**{k: v for k, v in given.items() if v is not None})


def check_before_work(args: argparse.Namespace, points: list[Point], flatness: bool) -> None:
    """Every check that can fail before the run, so that none fails after it (issue 30):
    options that cannot take effect, output files, sizes against their limits and the
    memory the largest point needs. Imports no torch.

    Raises:
        CliError: one line saying what to change; nothing was run.
    """
    if args.quick:
        given = [flag for flag in QUICK_SETS
                 if getattr(args, flag.lstrip("-").replace("-", "_")) is not None]
        if given:
            raise CliError(f"--quick sets {', '.join(QUICK_SETS)}; it cannot be combined with "
                           f"{', '.join(given)} (drop --quick to choose them)")
    if getattr(args, "geometry", "gqa") == "deepseek-v3":
        given = [flag for flag, field, _ in GEOMETRY_FLAGS if getattr(args, field) is not None]
        given += ["--dtype"] if args.dtype is not None else []
        if given:
            raise CliError(f"--geometry deepseek-v3 sets the geometry; {', '.join(given)} "
                           "cannot be combined with it")
    if args.no_save:
        given = [flag for flag, value in (("-o", args.output), ("--png", args.png)) if value]
        if given:
            raise CliError(f"--no-save writes no files; {' and '.join(given)} would be ignored")
    geom = geometry(args)
    _limits.LAYERS.check("--layers", args.layers, implies=lambda layers: (
        f"{layers:,} layers would need about "
        f"{_limits.gib(len(BENCH_MODES) * layers * _limits.attention_bytes_per_layer(geom, HEADLINE.source, HEADLINE.batch))}"
        " for the three modes' attentions"))  # fmt: skip
    _limits.BATCH.check("--batch-sizes", args.batch_sizes)
    replace(_limits.STEPS, low=2).check("--steps", args.steps)  # a spread needs two
    _limits.WARMUP.check("--warmup", args.warmup)
    _limits.HEADS.check("--q-heads", args.num_q_heads)
    _limits.HEADS.check("--kv-heads", args.num_kv_heads)
    _limits.HEAD_DIM.check("--head-dim", args.head_dim)
    _limits.MAX_KV.check("--max-kv", args.max_kv)
    # every method's modes, and the floor lead's device_tiling attention under symmetric
    methods = list(dict.fromkeys(getattr(args, "method", [DEFAULT_METHOD])))
    floor_methods = getattr(args, "floor_method", [DEFAULT_FLOOR_METHOD])
    attentions = len(methods) * len(BENCH_MODES) + (
        "symmetric" in methods and "lead" in floor_methods)
    rows = [(f"point {p.name}", attentions, p.layers, p.source, p.batch) for p in points]
    if flatness:
        # one attention per device-path mode at each of the figure's layer counts
        rows.append(("the flatness figure", 2, sum(FLATNESS_LAYERS), FLATNESS_SOURCE,
                     FLATNESS_BATCH))
    _limits.check_memory(rows, geom)
    if not args.no_save:
        outputs = {"-o": args.output or DEFAULT_OUTPUT, "--png": args.png}
        if args.png is None:
            from ..profiler.renderers import plots

            if plots.available():  # the default chart beside the JSON
                outputs["--png (default)"] = str(Path(outputs["-o"]).with_suffix(".png"))
        check_outputs(outputs, force=args.force)


def grid(args: argparse.Namespace) -> list[Point]:
    """The points to run, from the flags."""
    mla = getattr(args, "geometry", "gqa") == "deepseek-v3"
    base = DEEPSEEK_V3_POINTS[0] if mla else HEADLINE   # what a flag not given keeps
    if mla and not (args.layers or args.batch_sizes or args.sources):
        return list(DEEPSEEK_V3_POINTS)
    if args.layers or args.batch_sizes or args.sources:
        return [
            Point(layers, batch, source)
            for source in (args.sources or [base.source])
            for layers in (args.layers or [base.layers])
            for batch in (args.batch_sizes or [base.batch])
        ]
    return list(QUICK_POINTS if args.quick else DEFAULT_POINTS)


def summarize_point(point: Point, runs: list, *, seed: int, resamples: int) -> dict:
    """Medians, intervals and ratios of one point's runs (``host_update`` first)."""

    def ratio(key: str, a, b) -> dict:
        return proc.ratio_of_medians([getattr(s, key) for s in a.steps],
                                     [getattr(s, key) for s in b.steps], seed=seed,
                                     resamples=resamples)  # fmt: skip

    by_mode = {r.mode: r for r in runs}
    modes = {}
    for m, r in by_mode.items():
        host = [s.host_s for s in r.steps]
        step = [s.step_s for s in r.steps]
        blocked = [s.blocked_s for s in r.steps]
        modes[m] = {
            "host_us": proc.summarize(host, scale=1e6, seed=seed, resamples=resamples),
            "step_us": proc.summarize(step, scale=1e6, seed=seed, resamples=resamples),
            "counters_per_step": r.counters,
            # the host-state marker: how long the host was blocked inside each measured step
            "blocked_us": {"median": float(np.median(blocked)) * 1e6,
                           "max": float(np.max(blocked)) * 1e6},
            "slept_steps": sum(b > SLEPT_S for b in blocked),
            # the other marker: the run mode of the unmeasured step before each measured one
            "preceded_by": sorted({s.preceded_by for s in r.steps}),
        }
    a, b = by_mode["host_update"], by_mode["device_tiling"]
    out = {
        "layers": point.layers,
        "batch": point.batch,
        "source": point.source,
        "steps": len(a.steps),
        "modes": modes,
        "host_ratio": ratio("host_s", a, b),
        "step_ratio": ratio("step_s", a, b),
    }
    if "pre_replay" in by_mode:
        out["host_ratio_pre_replay"] = ratio("host_s", a, by_mode["pre_replay"])
        out["step_ratio_pre_replay"] = ratio("step_s", a, by_mode["pre_replay"])
    if FLOOR_MODE in by_mode:
        floor = by_mode[FLOOR_MODE]
        out["floor_ratio"] = {m: ratio("host_s", by_mode[m], floor)
                              for m in ("device_tiling", "pre_replay") if m in by_mode}
    floors = {r.workload["floor_method"]: r for r in runs if "floor_method" in r.workload}
    if floors:  # symmetric: every floor method's floor, side by side
        out["floor_ratios"] = {
            fm: {"mode": r.mode, "preceded_by": modes[r.mode]["preceded_by"],
                 **{m: ratio("host_s", by_mode[m], r)
                    for m in ("device_tiling", "pre_replay") if m in by_mode}}
            for fm, r in floors.items()}  # fmt: skip
    return out


def floor_mode_name(floor_method: str, floor_methods: list[str]) -> str:
    """The run mode of a floor method's floor in a point's ``modes``: ``floor`` for the
    headline's (the first), ``floor_<method>`` for the others."""
    return FLOOR_MODE if floor_method == floor_methods[0] else f"{FLOOR_MODE}_{floor_method}"


def method_lines(result: dict) -> list[str]:
    """Each point's host time by method, side by side, and the floor ratios (medians, us)."""
    lines = [(f"methods (headline: {result['method']['headline']}; K = "
              f"{result['method']['graph_keys']} graph keys in symmetric): host us per step, "
              "host_update / graph / pre-replay / floor; host_update over each; floor ratio")]
    for p in result["points"]:
        for m, q in p["methods"].items():
            us = {k: v["host_us"]["median"] for k, v in q["modes"].items()}
            floor = q.get("floor_ratio", {})
            others = "".join(
                f"; {fm} {r.get('device_tiling', {}).get('value', float('nan')):.2f} / "
                f"{r.get('pre_replay', {}).get('value', float('nan')):.2f}"
                for fm, r in q.get("floor_ratios", {}).items())
            lines.append(
                f"  L={p['layers']} b{p['batch']} {p['source']:<8} {m:<9} "
                f"{us['host_update']:9.1f} / {us['device_tiling']:7.1f} / "
                f"{us['pre_replay']:7.1f} / {us.get(FLOOR_MODE, float('nan')):7.1f}   "
                f"{q['host_ratio']['value']:6.1f}x {q['host_ratio_pre_replay']['value']:6.1f}x"
                f"   floor ratio {floor.get('device_tiling', {}).get('value', float('nan')):.2f}"
                f" / {floor.get('pre_replay', {}).get('value', float('nan')):.2f}{others}")
    return lines


def engine_work(graph_keys: int) -> dict[str, EngineWork]:
    """The hook engine's per-step work for each device mode with ``graph_keys`` keys, counted
    off `NpuTilingEngine` itself (`pyruntime.hook.engine_step`)."""
    from ..hook.engine_step import EngineStepError, engine_step_work

    out = {}
    for mode in ("device_tiling", "pre_replay"):
        try:
            counts = engine_step_work(VARIANTS[mode][1], graph_keys)
        except EngineStepError as exc:
            raise CliError(str(exc)) from exc
        out[mode] = EngineWork.from_counts(graph_keys, counts)
    return out


def run_methods(point: Point, geom: Geometry, methods: list[str], engine: dict, *,
                steps: int, warmup: int, seed: int, on_step=None,
                backend_factory=None,
                floor_methods: list[str] | None = None) -> dict[str, list]:
    """Every mode and the floor of `point` under every method, side by side in one
    interleaved run; method -> its runs (``host_update`` first, the floors last).

    Under ``symmetric`` there is one floor per floor method (`FLOOR_METHODS`; default the
    headline's alone), its run mode `floor_mode_name` and its ``workload["floor_method"]``
    set; under ``old`` one floor, which follows its own step of the warm pair."""
    floor_methods = list(floor_methods or [DEFAULT_FLOOR_METHOD])
    specs = []
    for m in methods:
        specs += [RunSpec(f"{m}/{mode}", mode, point.layers, m) for mode in BENCH_MODES]
        if m == "symmetric":
            specs += [RunSpec(f"{m}/{floor_mode_name(fm, floor_methods)}", FLOOR_MODE,
                              point.layers, m, floor_method=fm) for fm in floor_methods]
        else:
            specs.append(RunSpec(f"{m}/{FLOOR_MODE}", FLOOR_MODE, point.layers, m))
    workload = {"name": point.name, "layers": point.layers, "batch": point.batch,
                "source": point.source, "geometry": geom.as_dict()}
    runs = run_interleaved(specs, point.batch, point.source, geom, workload, steps=steps,
                           warmup=warmup, seed=seed, engine=engine,
                           backend_factory=backend_factory, on_step=on_step)  # fmt: skip
    out: dict[str, list] = {m: [] for m in methods}
    for spec, run in zip(specs, runs):
        run.mode = spec.key.split("/", 1)[1]
        if spec.mode == FLOOR_MODE and spec.method == "symmetric":
            run.workload["floor_method"] = spec.floor_method
        out[spec.method].append(run)
    return out


def placements_summary(points: list[dict]) -> dict | None:
    """Host time per step against L for each run mode, at the headline's batch and source,
    and the backend counters at the largest L. (How host time grows with L is the
    flatness figure, `flatness_summary`, measured side by side rather than across points.)
    """
    rows = sorted((p for p in points if (p["batch"], p["source"]) ==
                   (HEADLINE.batch, HEADLINE.source)), key=lambda p: p["layers"])
    if len(rows) < 2:
        return None
    modes = [m for m in rows[0]["modes"] if not m.startswith(FLOOR_MODE)]
    return {
        "batch": HEADLINE.batch, "source": HEADLINE.source,
        "layers": [p["layers"] for p in rows],
        "host_us": {m: [p["modes"][m]["host_us"]["median"] for p in rows] for m in modes},
        "counters_per_step": {m: rows[-1]["modes"][m]["counters_per_step"] for m in modes},
    }  # fmt: skip


def flatness_summary(runs: dict, *, steps: int, warmup: int, seed: int,
                     resamples: int) -> dict:
    """The flatness figure per device-path mode from `measure_flatness`'s runs."""
    low, high = FLATNESS_LAYERS
    modes = {}
    for mode, (run_low, run_high) in runs.items():
        ratio = proc.ratio_of_medians([s.host_s for s in run_high.steps],
                                      [s.host_s for s in run_low.steps], seed=seed,
                                      resamples=resamples)  # fmt: skip
        modes[mode] = {
            f"host_us_L{low}": proc.summarize([s.host_s for s in run_low.steps], scale=1e6,
                                              seed=seed, resamples=resamples),
            f"host_us_L{high}": proc.summarize([s.host_s for s in run_high.steps], scale=1e6,
                                               seed=seed, resamples=resamples),
            "ratio": ratio,
            "within_target": ratio["value"] <= FLATNESS_TARGET,
            "counters_per_step": {f"L{low}": run_low.counters, f"L{high}": run_high.counters},
        }  # fmt: skip
    return {"definition": FLATNESS_DEFINITION, "target": FLATNESS_TARGET,
            "layers": list(FLATNESS_LAYERS), "batch": FLATNESS_BATCH,
            "source": FLATNESS_SOURCE, "steps": steps, "warmup": warmup,
            "modes": modes}  # fmt: skip


def invariants_summary(counts: dict, *, warmup: int, method: str = "old") -> dict:
    """`inv.judge`'s verdict on the invariants table, with what it was judged on (the
    method of the counted step among them) and host_update's per-layer amount (the positive
    control)."""
    layers = sorted({int(n) for rows in counts.values() for n in rows})
    problems = inv.judge(counts)
    per_layer = (inv.per_layer_amount(counts[inv.PER_LAYER_MODE])
                 if inv.PER_LAYER_MODE in counts else None)
    return {"definition": INVARIANTS_DEFINITION, "layers": layers, "batch": HEADLINE.batch,
            "source": HEADLINE.source, "warmup": warmup, "method": method,
            "holds": not problems,
            "problems": problems, "per_layer": {inv.PER_LAYER_MODE: per_layer}}


def _environment() -> dict:
    import numpy

    env = {"python": platform.python_version(), "platform": platform.platform(),
           "cpus": os.cpu_count(), "numpy": numpy.__version__}  # fmt: skip
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:  # pragma: no cover
        pass
    return env


def run(args: argparse.Namespace) -> int:
    """Run the grid and report."""
    if args.bench_command is not None:  # pragma: no cover - argparse dispatches those
        return 2
    if args.png and not args.no_save:  # say it before the grid runs, not after
        from ..profiler.renderers import plots

        if not plots.available():
            raise CliError("--png needs matplotlib: pip install 'aicpu-tiling[plot]'")
    points = grid(args)
    mla = getattr(args, "geometry", "gqa") == "deepseek-v3"
    explicit_grid = bool(args.layers or args.batch_sizes or args.sources) or mla
    flatness = (not explicit_grid) if args.flatness is None else args.flatness
    check_before_work(args, points, flatness)
    quick_steps, quick_warmup = ((DEEPSEEK_V3_QUICK_STEPS, DEEPSEEK_V3_QUICK_WARMUP) if mla
                                 else (QUICK_STEPS, QUICK_WARMUP))
    full_steps, full_warmup = ((DEEPSEEK_V3_STEPS, DEEPSEEK_V3_WARMUP) if mla
                               else (DEFAULT_STEPS, DEFAULT_WARMUP))
    methods = list(dict.fromkeys(args.method))
    floor_methods = list(dict.fromkeys(args.floor_method))
    if floor_methods != [DEFAULT_FLOOR_METHOD] and "symmetric" not in methods:
        raise CliError("--floor-method chooses what the symmetric method's floor follows; "
                       "add symmetric to --method")
    if args.graph_keys < 1:
        raise CliError(f"--graph-keys must be >= 1 (got {args.graph_keys})")
    engine = engine_work(args.graph_keys) if "symmetric" in methods else {}
    steps = args.steps or (quick_steps if args.quick else full_steps)
    warmup = args.warmup if args.warmup is not None else (
        quick_warmup if args.quick else full_warmup)  # fmt: skip
    geom = geometry(args)
    counting = (not explicit_grid) if args.invariants is None else args.invariants
    if counting and mla:
        raise CliError("--invariants counts the GQA modes; not with --geometry deepseek-v3")
    inv_layers = sorted(set(args.invariant_layers or INVARIANT_LAYERS))
    if counting and (len(inv_layers) < 2 or inv_layers[0] < 1
                     or inv_layers[-1] > INVARIANT_MAX_LAYERS):
        raise CliError(f"--invariant-layers needs two or more layer counts from 1 to "
                       f"{INVARIANT_MAX_LAYERS} (a model's layers; got {inv_layers})")
    # the host-time fit's points: the grid's at the headline batch and source, and the
    # other invariant layer counts measured the same way
    sweep = [Point(n, HEADLINE.batch, HEADLINE.source) for n in inv_layers
             if counting and Point(n, HEADLINE.batch, HEADLINE.source) not in points]
    flat_steps = max(steps, FLATNESS_MIN_STEPS)
    factory = backend_factory(args.backend)  # npu-twin: activates the twin here
    started = time.time()
    results = []
    host_samples: dict = {}  # mode -> L -> host us of each measured step (headline b, source)
    with progress(not (args.json or args.no_progress)) as bar:
        task = bar.add_task("bench", total=(len(points) + len(sweep)) * (steps + warmup)
                            + flatness * (flat_steps + warmup)
                            + counting * len(BENCH_MODES) * len(inv_layers))
        for point in [*points, *sweep]:
            bar.update(task, description=f"bench {point.name}")
            try:
                by_method = run_methods(point, geom, methods, engine, steps=steps,
                                        warmup=warmup, seed=args.seed,
                                        backend_factory=factory, floor_methods=floor_methods,
                                        on_step=lambda: bar.advance(task))  # fmt: skip
            except SourceError as exc:
                raise CliError(str(exc)) from exc
            except ValueError as exc:  # tiling params or attention sizes out of range
                raise CliError(f"{point.name}: {exc}") from exc
            runs = by_method[methods[0]]  # the headline method's
            if (point.batch, point.source) == (HEADLINE.batch, HEADLINE.source):
                for r in runs:
                    host_samples.setdefault(r.mode, {})[point.layers] = [
                        1e6 * s.host_s for s in r.steps]
            if point in sweep:
                continue  # measured for the host-time fit only
            summaries = {m: summarize_point(point, runs, seed=args.seed,
                                            resamples=args.resamples)
                         for m, runs in by_method.items()}  # fmt: skip
            head = dict(summaries[methods[0]])
            head["method"] = methods[0]
            head["methods"] = summaries
            results.append(head)
        flat = None
        if flatness:
            bar.update(task, description="bench flatness")
            try:
                flat_runs = measure_flatness(geom, steps=flat_steps, warmup=warmup,
                                             seed=args.seed, method=methods[0], engine=engine,
                                             backend_factory=factory,
                                             on_step=lambda: bar.advance(task))  # fmt: skip
            except (SourceError, ValueError) as exc:
                raise CliError(f"flatness: {exc}") from exc
            flat = flatness_summary(flat_runs, steps=flat_steps, warmup=warmup, seed=args.seed,
                                    resamples=args.resamples)  # fmt: skip
        counts = check = fit = None
        if counting:
            bar.update(task, description="bench invariants")
            try:
                counts = inv.measure(geom, layers=inv_layers, modes=BENCH_MODES,
                                     batch=HEADLINE.batch, source=HEADLINE.source,
                                     warmup=max(warmup, 1), seed=args.seed,
                                     backend_factory=factory,
                                     method=methods[0], engine=engine,
                                     on_point=lambda: bar.advance(task))
            except (SourceError, ValueError) as exc:
                raise CliError(f"invariants: {exc}") from exc
            check = invariants_summary(counts, warmup=max(warmup, 1), method=methods[0])
            fit = {"batch": HEADLINE.batch, "source": HEADLINE.source,
                   **inv.host_time_fit({m: {n: v for n, v in by_l.items() if n in inv_layers}
                                        for m, by_l in host_samples.items()},
                                       ratio_layers=HEADLINE.layers)}
    result = {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "command": " ".join(getattr(args, "argv", ["aicpu-tiling", "bench"])),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "elapsed_s": round(time.time() - started, 3),
        "environment": _environment(),
        "config": {"backend": args.backend, "times": TIMES[args.backend],
                   "times_emulated": is_emulated(args.backend), "geometry": geom.as_dict(), "steps": steps,
                   "warmup": warmup, "seed": args.seed, "resamples": args.resamples,
                   "confidence": 0.95, "quick": args.quick, "modes": list(BENCH_MODES),
                   "placements": {m: VARIANTS[m][1] for m in BENCH_MODES if VARIANTS[m][1]}},
        "method": {"headline": methods[0], "methods": methods,
                   "graph_keys": args.graph_keys if engine else None,
                   "engine_per_step": {m: w.as_dict() for m, w in engine.items()},
                   "definitions": METHOD_DEFINITIONS},
        "floor_method": {"headline": floor_methods[0], "methods": floor_methods,
                         "definitions": FLOOR_METHOD_DEFINITIONS},
        "points": results,
        "floor_ratio": None,
        "floor_ratios": None,
        "placements": placements_summary(results),
        "host_flatness": flat,
        "invariants": counts,
        "invariants_check": check,
        "host_time_vs_layers": fit,
        "headline": None,
    }  # fmt: skip
    if results:  # the headline point's, else the first point's
        at = next((p for p in results if (p["layers"], p["batch"], p["source"]) ==
                   (HEADLINE.layers, HEADLINE.batch, HEADLINE.source)), results[0])
        result["floor_ratio"] = {m: r["value"] for m, r in at["floor_ratio"].items()}
        if "floor_ratios" in at:
            result["floor_ratios"] = {fm: {m: r[m]["value"] for m in ("device_tiling",
                                                                        "pre_replay") if m in r}
                                      for fm, r in at["floor_ratios"].items()}
    for p in results:
        if (p["layers"], p["batch"], p["source"]) == (61, 64, "trace"):
            result["headline"] = {
                "layers": 61, "batch": 64, "source": "trace",
                "host_update_us": p["modes"]["host_update"]["host_us"]["median"],
                "device_tiling_us": p["modes"]["device_tiling"]["host_us"]["median"],
                "host_ratio": p["host_ratio"]["value"], "host_ratio_ci": p["host_ratio"]["ci"],
                "pre_replay_us": p["modes"]["pre_replay"]["host_us"]["median"],
                "host_ratio_pre_replay": p["host_ratio_pre_replay"]["value"],
                "host_ratio_pre_replay_ci": p["host_ratio_pre_replay"]["ci"],
                "method": p["method"],
                "by_method": {m: {
                    "host_update_us": q["modes"]["host_update"]["host_us"]["median"],
                    "device_tiling_us": q["modes"]["device_tiling"]["host_us"]["median"],
                    "pre_replay_us": q["modes"]["pre_replay"]["host_us"]["median"],
                    "host_ratio": q["host_ratio"]["value"], "host_ratio_ci": q["host_ratio"]["ci"],
                    "host_ratio_pre_replay": q["host_ratio_pre_replay"]["value"],
                    "host_ratio_pre_replay_ci": q["host_ratio_pre_replay"]["ci"],
                    "floor_ratio": {k: v["value"] for k, v in q["floor_ratio"].items()},
                } for m, q in p["methods"].items()},
            }  # fmt: skip
            if flat is not None:
                result["headline"]["host_flatness"] = {
                    m: v["ratio"]["value"] for m, v in flat["modes"].items()}
    written = _save(args, result)
    if args.json:
        emit_json(result)
        return 0
    console = make_console()
    for item in bench_table(result):
        console.print(item)
    for line in method_lines(result):
        console.print(line, highlight=False)
    for path in written:
        console.print(f"wrote {path}")
    return 0


def _save(args: argparse.Namespace, result: dict) -> list[Path]:
    """Write the JSON (and the PNG); their paths were checked before the run."""
    if args.no_save:
        return []
    output = args.output or DEFAULT_OUTPUT
    written = [write_json(output, result, force=args.force)]
    from ..profiler.renderers import plots

    png = args.png or (str(Path(output).with_suffix(".png")) if plots.available() else None)
    if png:
        try:
            written.append(plots.plot_bench(result, png))
        except plots.PlotUnavailableError as exc:
            raise CliError(str(exc)) from exc
    return written
