"""Clocks: timing code takes a clock so tests can drive it without sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything with a monotonic ``now()`` in seconds."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...


class PerfClock:
    """``time.perf_counter`` (the same scale as the CPU backend's task timings)."""

    def now(self) -> float:
        """Seconds from ``time.perf_counter()``."""
        return time.perf_counter()


class FakeClock:
    """A clock that moves only when told: ``advance(seconds)``, or ``tick`` per read.

    Args:
        start: the initial reading.
        tick: added after every ``now()`` (0: time stands still between advances).
    """

    def __init__(self, start: float = 0.0, tick: float = 0.0) -> None:
        self.t = start
        self.tick = tick

    def now(self) -> float:
        """The current reading, then move on by ``tick``."""
        t = self.t
        self.t += self.tick
        return t

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self.t += seconds
