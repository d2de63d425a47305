"""``aicpu-tiling selfcheck``: check this machine end to end and give a verdict.

Runs every check of `pyruntime.selfcheck` on the chosen backend (``cpu``: the emulation
here, every check that can run; ``npu``: an Ascend device through torch_npu), prints a
table (or JSON with ``--json``), writes the JSON with ``-o FILE``, and on the NPU saves
the placement it found for the vLLM-Ascend hook. Exit status 0 only when the verdict is
pass.
"""

from __future__ import annotations

import argparse

from ..profiler.renderers.selfcheck_table import selfcheck_tables
from ._common import CliError, add_output_args, emit_json, make_console, progress, write_json


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``selfcheck``."""
    p = sub.add_parser("selfcheck", help="check kernels, AI-CPU replay, attention and host time; "
                                         "give a verdict",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--backend", choices=("cpu", "npu"), default="cpu")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the JSON report here")
    p.add_argument("--build", action="store_true",
                   help="npu: build our kernels with tools/build_aicpu_kernel.sh if missing")
    p.add_argument("--quick", action="store_true", help="fewer steps in every check")
    p.add_argument("--no-save-placement", action="store_true",
                   help="npu: do not save the placement found for the vLLM-Ascend hook")
    add_output_args(p)
    p.set_defaults(run=run)
    return p


def _context(args: argparse.Namespace):
    from .. import backends
    from ..backends import BackendError
    from ..selfcheck import Context

    if args.backend == "cpu":
        def make(**options):
            return backends.get("cpu", num_threads=2, wait_timeout_s=120.0, **options)

        return Context("cpu", make, quick=args.quick)
    try:
        first = backends.get("npu")
    except BackendError as exc:
        raise CliError(f"--backend npu: {exc}") from exc
    return Context("npu", lambda **options: backends.get("npu", **options), quick=args.quick,
                   npu=first.npu, build=args.build)


def run(args: argparse.Namespace) -> int:
    """Run the checks, report, save; 0 on a pass verdict, 1 otherwise."""
    from .. import selfcheck

    ctx = _context(args)
    with progress(not (args.json or args.no_progress)) as bar:
        task = bar.add_task("selfcheck", total=len(selfcheck.CHECKS))
        done = []

        def on_check(name: str) -> None:
            if done:
                bar.advance(task)
            done.append(name)
            bar.update(task, description=f"selfcheck: {name}")

        report = selfcheck.run(ctx, on_check=on_check)
        bar.advance(task)
    report.command = " ".join(getattr(args, "argv", ["aicpu-tiling", "selfcheck"]))
    data = report.as_dict()
    notes = []
    if args.backend == "npu" and report.placement and not args.no_save_placement:
        from .. import placement

        replay = next(c for c in report.checks if c.name == "aicpu_replay")
        try:
            path = placement.save(report.placement, backend="npu",
                                  device=str(data["environment"]["device"].get("soc")),
                                  evidence=replay.detail)
        except OSError as exc:
            raise CliError(f"cannot save the placement: {exc}") from exc
        data["placement_file"] = str(path)
        notes.append(f"saved placement {report.placement} to {path} (the vLLM-Ascend hook reads it)")
    if args.output:
        notes.append(f"wrote {write_json(args.output, data)}")
    if args.json:
        emit_json(data)
    else:
        console = make_console()
        for item in selfcheck_tables(data):
            console.print(item)
        for note in notes:
            console.print(note)
    return 0 if report.verdict == "pass" else 1
