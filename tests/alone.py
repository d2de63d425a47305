"""Tests that measure host time run alone under pytest-xdist.

Their verdicts include a host-time figure (until issue 30, ``selfcheck``'s ``host_time``
judged device tiling's host time at L = 61 over L = 1; it now judges exact per-step counts).
On the 2-core machine a second worker's test running beside them adds noise that such a
figure was never meant to absorb, so such a test holds this
run's lock exclusively while every other test holds it shared (`tests/conftest.py`): it
starts once the tests running on other workers have ended, and none starts until it is done.
Without xdist (``-n 0``) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _lock_path() -> Path | None:
    """The lock of this xdist run (its workers share PYTEST_XDIST_TESTRUNUID), or None."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run or not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    return Path(tempfile.gettempdir()) / f"aicpu-tiling-tests-{run}.lock"


@contextlib.contextmanager
def holding(exclusive: bool) -> Iterator[None]:
    """Hold this run's lock: exclusively (no other test runs meanwhile) or shared."""
    path = _lock_path()
    if path is None:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def alone() -> contextlib.AbstractContextManager[None]:
    """No other test of this run runs meanwhile (for a module fixture that measures time)."""
    return holding(exclusive=True)
