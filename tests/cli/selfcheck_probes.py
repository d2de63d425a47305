"""Checks for the selfcheck runner's tests: module-level functions, so a child process can
import them by name (`pyruntime.selfcheck.child.check_reference`). Each is fast."""

from __future__ import annotations

import json
import os
import sys
import time

from pyruntime.selfcheck.report import passed

#: set by the tests: the JSON file the run writes (`snapshot_report` reads it)
REPORT_ENV = "SELFCHECK_PROBE_REPORT"


def first(ctx):
    """Passes, and tells the next check a placement through the context."""
    ctx.placement = "pre-replay"
    return passed("first", "first probe ran")


def second(ctx):
    """Passes, saying which placement it was handed (proves the context travels)."""
    return passed("second", f"second probe saw placement {ctx.placement}",
                  seen_placement=ctx.placement, seen_backend=ctx.backend, pid=os.getpid())


def snapshot_report(ctx):
    """Passes, carrying what the report file held while this check was running."""
    with open(os.environ[REPORT_ENV]) as f:
        return passed("snapshot_report", "read the report file", on_disk=json.load(f))


def crash(ctx):
    """Dies the way a lost device can take a process: no exception, no result."""
    print("probe: the device went away", file=sys.stderr, flush=True)
    os._exit(3)


def exit_now(ctx):
    """Ends the process that runs it (in process: the selfcheck itself dies here)."""
    raise SystemExit(7)


def hang(ctx):
    """Never returns in time (a hung device call)."""
    print("probe: waiting on the device", flush=True)
    time.sleep(120)
    return passed("hang", "woke up")
