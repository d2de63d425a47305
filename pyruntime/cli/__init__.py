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
* ``serve-check``: vLLM's whole engine on the installed vLLM-Ascend without and with the hook.

``main(argv)`` returns the exit code: 0 success, 1 a check failed, 2 a user error (one
line on stderr, never a traceback), 130 interrupted (Ctrl-C: one line, at any moment).

Start-up is kept short: this module imports only the standard library, the subcommands'
modules are imported when the parser is built (inside `main`, where Ctrl-C is handled), and
torch only where a subcommand starts its work, so ``--help``, ``--version`` and usage errors
answer in well under a second.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from ._common import PROG, ArgumentParser, CliError

__all__ = ["CliError", "build_parser", "main"]


def build_parser() -> ArgumentParser:
    """The full argument parser."""
    from .. import __version__
    from . import (
        balance,
        bench,
        hook_dryrun,
        inspect,
        profile,
        projection,
        selfcheck,
        serve_check,
        tiling_bench,
    )

    parser = ArgumentParser(
        prog=PROG,
        description="Measure AI-CPU device tiling against the host-update path.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
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
    serve_check.add_parser(sub)
    return parser


class _Interrupt:
    """SIGINT while `main` runs: raise KeyboardInterrupt (so ``finally`` blocks release
    threads, files and child processes) and remember it, so that whatever exception the
    interrupted code turns it into (an import half done raises ImportError, a library may
    wrap it) still reads as an interrupt."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, signum: int, frame: object) -> None:
        self.seen = True
        raise KeyboardInterrupt


def _quiet_exit(signum: int, frame: object) -> None:
    """A second Ctrl-C after the interrupt was reported: exit at once, silently."""
    os._exit(130)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    With ``argv`` None this is the process's command (the ``aicpu-tiling`` script, ``python -m
    pyruntime.cli``): after Ctrl-C it prints its one line and ends the process at once
    (``os._exit(130)``), so no thread, atexit handler or second Ctrl-C during shutdown can
    print a traceback. Called with a list (tests, other code), it returns 130 instead and
    restores the SIGINT handler it found.
    """
    entry = argv is None
    interrupt = _Interrupt()
    previous = None
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not SIG_IGN (nohup)
        previous = signal.signal(signal.SIGINT, interrupt)
    try:
        parser = build_parser()
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
    except BaseException as exc:
        if not (isinstance(exc, KeyboardInterrupt) or interrupt.seen):
            raise
        if entry:
            signal.signal(signal.SIGINT, _quiet_exit)
        print(f"{PROG}: interrupted", file=sys.stderr)
        if entry:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        return 130
    finally:
        if previous is not None and not (entry and interrupt.seen):
            signal.signal(signal.SIGINT, previous)
