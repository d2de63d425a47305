"""The ``aicpu-tiling`` command line: A/B benchmarks, profiles and tiling inspection.

Subcommands (one module each):

* ``bench``: interleaved A/B runs of ``host_update`` against ``device_tiling``;
  ``bench balance``: our tiling against the anchors' partitioners;
  ``bench projection``: the projected host saving on an NPU, with its assumptions;
  ``bench tiling``: the C kernel's time per call.
* ``profile``: one workload, per-step host breakdown and device task timings, Chrome trace.
* ``inspect``: the tiling of given lengths, per-core load bars.
* ``selfcheck``: kernels, AI-CPU replay (the tiling placement), attention correctness and
  host time on this machine, with a verdict.
* ``hook-dryrun``: the vLLM-Ascend hook inside the installed vLLM-Ascend's own classes.

``main(argv)`` returns the exit code: 0 success, 1 a check failed, 2 a user error (one
line on stderr, never a traceback), 130 interrupted.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from . import (
    balance,
    bench,
    hook_dryrun,
    inspect,
    profile,
    projection,
    selfcheck,
    tiling_bench,
)
from ._common import PROG, ArgumentParser, CliError

__all__ = ["CliError", "build_parser", "main"]


def build_parser() -> ArgumentParser:
    """The full argument parser."""
    parser = ArgumentParser(
        prog=PROG,
        description="Measure AI-CPU device tiling against the host-update path.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench_parser = bench.add_parser(sub)
    bench_sub = bench_parser.add_subparsers(dest="bench_command", metavar="WHAT")
    balance.add_parser(bench_sub)
    tiling_bench.add_parser(bench_sub)
    projection.add_parser(bench_sub)
    profile.add_parser(sub)
    inspect.add_parser(sub)
    selfcheck.add_parser(sub)
    hook_dryrun.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        args = parser.parse_args(argv)
        args.argv = [PROG, *argv]
        if args.command is None:
            parser.print_help()
            return 0
        return int(args.run(args) or 0)
    except CliError as exc:
        print(
            f"{PROG}: error: {exc}" if not str(exc).startswith(PROG) else str(exc), file=sys.stderr
        )
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
