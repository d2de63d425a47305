"""``aicpu-tiling profile``: one workload in one or both modes, in detail.

Per-step host breakdown (input copies, host tiling, task updates, replay launch,
synchronize, other) and device-side task timings (AI-CPU tiling, each attention layer,
combine) as tables with percentiles; ``--trace`` writes a Chrome trace (host and device
lanes; open it in Perfetto); ``--save`` keeps the session so ``--load`` renders it again.
"""

from __future__ import annotations

import argparse

import numpy as np

from ..measurement.abrun import DTYPES, MODES, Geometry, Point, run_point
from ..measurement.sources import SOURCES, SourceError
from ..profiler import processors as proc
from ..profiler.data import Session, SessionError
from ..profiler.renderers.chrome_trace import write_chrome_trace
from ..profiler.renderers.profile_tables import profile_tables
from ._common import CliError, add_output_args, emit_json, make_console, progress


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``profile``."""
    p = sub.add_parser(
        "profile",
        help="host breakdown and device task timings of one workload",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument("--mode", choices=(*MODES, "both"), default="both")
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--source", choices=SOURCES, default="trace")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="L=8, batch 8, 4 steps")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace JSON here")
    p.add_argument("--save", metavar="PATH", help="save the session (JSON) here")
    p.add_argument("--load", metavar="PATH", help="render a saved session; run nothing")
    d = Geometry()
    p.add_argument("--head-dim", type=int, default=d.head_dim)
    p.add_argument("--dtype", choices=DTYPES, default=d.dtype)
    add_output_args(p)
    p.set_defaults(run=run)
    return p


def process(session: Session) -> dict:
    """The report of a session: per run host breakdown and device summary (pure)."""
    runs = []
    for r in session.runs:
        runs.append({
            "mode": r.mode, "workload": r.workload, "steps": len(r.steps),
            "host": proc.host_breakdown(r),
            "device": proc.collapse_layers(proc.device_summary(r)),
            "counters_per_step": r.counters,
        })  # fmt: skip
    ratio = None
    modes = {r.mode: r for r in session.runs}
    if set(MODES) <= set(modes) and modes["device_tiling"].steps:
        a = np.median([s.host_s for s in modes["host_update"].steps])
        b = np.median([s.host_s for s in modes["device_tiling"].steps])
        ratio = float(a / b) if b else None
    return {"meta": session.meta, "runs": runs, "host_ratio": ratio}


def record(args: argparse.Namespace) -> Session:
    """Run the workload and return its session."""
    layers, batch, steps = (8, 8, 4) if args.quick else (args.layers, args.batch, args.steps)
    if steps < 1 or layers < 1 or batch < 1:
        raise CliError("--steps, --layers and --batch must be >= 1")
    modes = MODES if args.mode == "both" else (args.mode,)
    geom = Geometry(head_dim=args.head_dim, dtype=args.dtype)
    point = Point(layers, batch, args.source)
    warmup = 1 if args.quick else args.warmup
    with progress(not (args.json or args.no_progress)) as bar:
        task = bar.add_task(f"profile {point.name}", total=steps + warmup)
        try:
            runs = run_point(point, geom, steps=steps, warmup=warmup, seed=args.seed,
                             modes=modes, phases=True, device_tasks=True,
                             warm_host=False,  # one step per record: device tasks per step
                             on_step=lambda: bar.advance(task))  # fmt: skip
        except SourceError as exc:
            raise CliError(str(exc)) from exc
        except ValueError as exc:
            raise CliError(f"{point.name}: {exc}") from exc
    return Session(runs, {"command": " ".join(getattr(args, "argv", ["aicpu-tiling", "profile"])),
                          "point": point.name, "geometry": geom.as_dict()})  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Record (or load) a session, write what was asked, render the tables."""
    try:
        session = Session.load(args.load) if args.load else record(args)
        if args.save:
            session.save(args.save)
    except SessionError as exc:
        raise CliError(str(exc)) from exc
    if args.trace:
        try:
            write_chrome_trace(session, args.trace)
        except OSError as exc:
            raise CliError(f"cannot write {args.trace}: {exc.strerror or exc}") from exc
    report = process(session)
    if args.json:
        emit_json(report)
        return 0
    console = make_console()
    for item in profile_tables(report):
        console.print(item)
    for what, path in (("session", args.save), ("Chrome trace", args.trace)):
        if path:
            console.print(f"wrote {what} {path}")
    return 0
