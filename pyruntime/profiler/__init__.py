"""Profiler: data (a session that saves and loads), pure processors, and renderers.

* :mod:`.data`: :class:`Session`, :class:`Run`, :class:`HostStep`, :class:`DeviceTask`;
  JSON save/load with a schema version.
* :mod:`.clock`: the clock protocol, the real clock, and :class:`FakeClock` for tests.
* :mod:`.instrument`: host phase timing around a backend's calls.
* :mod:`.processors`: medians, percentiles, seeded bootstrap CIs, host breakdowns,
  device task summaries; pure functions of the data.
* :mod:`.renderers`: rich tables, Chrome trace JSON, PNG plots (``plot`` extra).
"""

from .clock import Clock, FakeClock, PerfClock
from .data import DeviceTask, HostStep, Run, Session, SessionError

__all__ = [
    "Clock",
    "DeviceTask",
    "FakeClock",
    "HostStep",
    "PerfClock",
    "Run",
    "Session",
    "SessionError",
]  # fmt: skip
