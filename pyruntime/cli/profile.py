"""``aicpu-tiling profile``: one workload in one or both modes, in detail.

Per-step host breakdown (input copies, host tiling, task updates, replay launch,
synchronize, other) and device-side task timings (AI-CPU tiling, each attention layer,
combine; per step: device time, AI-CPU task time, attention time per layer and the idle gap
between the tiling and the first attention kernel) as tables with percentiles; ``--trace``
writes a Chrome trace (host and device lanes of both paths side by side; open it in
Perfetto); ``--save`` keeps the session so ``--load`` renders it again. ``--backend``: cpu
(the emulation), npu (an Ascend NPU: device lanes from torch_npu's profiler) or npu-twin
(the NPU code path on the NPU twin, whose torch_npu profiler writes the same files; times
emulated).
"""

from __future__ import annotations

import argparse

from ..measurement.abrun import DTYPES, MODES, Geometry, Point, run_point
from ..measurement.sources import SOURCES, SourceError
from ..profiler.ascend_files import AscendProfileError
from ..profiler.data import Session, SessionError
from ..profiler.renderers.chrome_trace import write_chrome_trace
from ..profiler.renderers.profile_tables import profile_tables
from ..profiler.report import profile_report
from . import _limits
from ._backend import BACKENDS, TIMES, backend_factory
from ._common import (
    CliError,
    add_force_arg,
    add_output_args,
    check_outputs,
    emit_json,
    make_console,
    progress,
)

#: (flag, dest, default, --quick's value): what --quick sets, and the defaults without it
RUN_SIZES = (("--layers", "layers", 61, 8), ("--batch", "batch", 64, 8),
             ("--steps", "steps", 20, 4), ("--warmup", "warmup", 2, 1))
#: flags that shape a recording, so --load (which records nothing) refuses them
RECORD_FLAGS = ("--mode", "--layers", "--batch", "--source", "--steps", "--warmup", "--seed",
                "--quick", "--head-dim", "--dtype", "--backend")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``profile``."""
    p = sub.add_parser(
        "profile",
        help="host breakdown and device task timings of one workload",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    # None: not given (so --quick and --load can refuse what they would override)
    p.add_argument("--mode", choices=(*MODES, "both"), default=None, help="default both")
    for flag, dest, default, quick in RUN_SIZES:
        p.add_argument(flag, type=int, default=None, dest=dest,
                       help=f"default {default}; --quick {quick}")
    p.add_argument("--source", choices=SOURCES, default=None, help="default trace")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="default cpu (the emulation); npu: an Ascend NPU, device lanes from "
                        "torch_npu's profiler; npu-twin: the NPU code path on the NPU twin "
                        "(times emulated)")
    p.add_argument("--seed", type=int, default=None, help="default 0")
    p.add_argument("--quick", action="store_true",
                   help="L=8, batch 8, 4 steps after 1 warm-up; cannot be combined with "
                        "--layers, --batch, --steps or --warmup, which it sets")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace JSON here")
    p.add_argument("--save", metavar="PATH", help="save the session (JSON) here")
    p.add_argument("--load", metavar="PATH", help="render a saved session; run nothing")
    add_force_arg(p)
    d = Geometry()
    p.add_argument("--head-dim", type=int, default=None, help=f"default {d.head_dim}")
    p.add_argument("--dtype", choices=DTYPES, default=None, help=f"default {d.dtype}")
    add_output_args(p)
    p.set_defaults(run=run)
    return p


#: the report of a session (`pyruntime.profiler.report.profile_report`)
process = profile_report


def check_before_work(args: argparse.Namespace) -> None:
    """Refuse, before anything runs (issue 30): flags --quick or --load would override or
    ignore, sizes past their limits or past this machine's memory, and output files that
    cannot be written or exist (without --force). Imports no torch.

    Raises:
        CliError: one line saying what to change; nothing was run.
    """
    given = [flag for flag in RECORD_FLAGS
             if getattr(args, flag.lstrip("-").replace("-", "_")) not in (None, False)]
    if args.load and given:
        raise CliError(f"--load renders a saved session and records nothing; "
                       f"{', '.join(given)} would be ignored")
    if args.quick:
        sized = [flag for flag, dest, _, _ in RUN_SIZES if getattr(args, dest) is not None]
        if sized:
            raise CliError(f"--quick sets --layers, --batch, --steps and --warmup; it cannot "
                           f"be combined with {', '.join(sized)} (drop --quick to choose them)")
    if not args.load:
        layers, batch, steps, warmup = _sizes(args)
        _limits.LAYERS.check("--layers", layers)
        _limits.BATCH.check("--batch", batch)
        _limits.STEPS.check("--steps", steps)
        _limits.WARMUP.check("--warmup", warmup)
        _limits.HEAD_DIM.check("--head-dim", args.head_dim)
        modes = 2 if (args.mode or "both") == "both" else 1
        _limits.check_memory([(f"L={layers}, batch {batch}", modes, layers,
                               args.source or "trace", batch)], _geometry(args))
    check_outputs({"--trace": args.trace, "--save": args.save}, force=args.force)


def _sizes(args: argparse.Namespace) -> tuple[int, int, int, int]:
    """``(layers, batch, steps, warmup)``: the flags, --quick's values or the defaults."""
    return tuple(quick if args.quick else (getattr(args, dest) if getattr(args, dest)
                                            is not None else default)
                 for _, dest, default, quick in RUN_SIZES)  # type: ignore[return-value]


def _geometry(args: argparse.Namespace) -> Geometry:
    d = Geometry()
    return Geometry(head_dim=args.head_dim or d.head_dim, dtype=args.dtype or d.dtype)


def record(args: argparse.Namespace) -> Session:
    """Run the workload and return its session."""
    layers, batch, steps, warmup = _sizes(args)
    mode = args.mode or "both"
    modes = MODES if mode == "both" else (mode,)
    geom = _geometry(args)
    point = Point(layers, batch, args.source or "trace")
    seed = 0 if args.seed is None else args.seed
    backend = args.backend or "cpu"
    factory = backend_factory(backend)
    lanes: dict = {}
    with progress(not (args.json or args.no_progress)) as bar:
        task = bar.add_task(f"profile {point.name}", total=steps + warmup)
        try:
            runs = run_point(point, geom, steps=steps, warmup=warmup, seed=seed,
                             modes=modes, phases=True, device_tasks=True,
                             warm_host=False,  # one step per record: device tasks per step
                             backend_factory=factory, lanes_info=lanes,
                             on_step=lambda: bar.advance(task))  # fmt: skip
        except (SourceError, AscendProfileError) as exc:
            raise CliError(str(exc)) from exc
        except ValueError as exc:
            raise CliError(f"{point.name}: {exc}") from exc
    meta = {"command": " ".join(getattr(args, "argv", ["aicpu-tiling", "profile"])),
            "point": point.name, "geometry": geom.as_dict(), "backend": backend,
            "times": TIMES[backend],
            "device_lanes": lanes or {"source": "the backend's own task records"
                                      if backend == "cpu" else "none"}}
    return Session(runs, meta)


def run(args: argparse.Namespace) -> int:
    """Record (or load) a session, write what was asked, render the tables."""
    check_before_work(args)
    try:
        session = Session.load(args.load) if args.load else record(args)
        if args.save:
            check_outputs({"--save": args.save}, force=args.force)  # none appeared meanwhile
            session.save(args.save)
    except SessionError as exc:
        raise CliError(str(exc)) from exc
    if args.trace:
        check_outputs({"--trace": args.trace}, force=args.force)
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
