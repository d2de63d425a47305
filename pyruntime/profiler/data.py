"""Profile data: what was measured, with no statistics. Saved and loaded as JSON.

A :class:`Session` holds the runs of one ``profile`` (or ``bench``) invocation; a
:class:`Run` is one workload in one mode: per-step host records and device task records,
all times in seconds on the host's ``perf_counter`` scale.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "aicpu-tiling/profile"
SCHEMA_VERSION = 1

#: host phases of one step, in the order they are shown
HOST_PHASES = ("input_copies", "host_tiling", "task_updates", "replay_launch", "synchronize",
               "other")  # fmt: skip


class SessionError(ValueError):
    """A session file that cannot be read, is not a session, or has another version."""


@dataclass
class HostStep:
    """One step seen from the host.

    Attributes:
        start: host clock at the step's start.
        step_s: end-to-end step time (inputs in to outputs ready).
        host_s: the runtime's own host time (``last_step_host_seconds``).
        phases: exclusive seconds per host phase (see :data:`HOST_PHASES`).
        spans: ``(phase, start, end)`` intervals for the trace; may be empty.
    """

    start: float
    step_s: float
    host_s: float
    phases: dict[str, float] = field(default_factory=dict)
    spans: list[tuple[str, float, float]] = field(default_factory=list)


@dataclass
class DeviceTask:
    """One device task execution: ``lane`` is the stream (or core) that ran it."""

    step: int
    kind: str
    name: str
    lane: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        """Duration."""
        return self.end - self.start


@dataclass
class Run:
    """One workload in one mode."""

    mode: str
    workload: dict[str, Any]
    steps: list[HostStep] = field(default_factory=list)
    device_tasks: list[DeviceTask] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Run:
        """Inverse of ``dataclasses.asdict``."""
        steps = [
            HostStep(s["start"], s["step_s"], s["host_s"], dict(s.get("phases", {})),
                     [tuple(x) for x in s.get("spans", [])])  # type: ignore[misc]
            for s in d.get("steps", [])
        ]  # fmt: skip
        tasks = [DeviceTask(**t) for t in d.get("device_tasks", [])]
        return cls(
            d["mode"], dict(d.get("workload", {})), steps, tasks, dict(d.get("counters", {}))
        )


@dataclass
class Session:
    """Runs of one invocation plus free-form metadata (command, config, versions)."""

    runs: list[Run] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form, with schema name and version."""
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "meta": self.meta,
            "runs": [asdict(r) for r in self.runs],
        }

    def save(self, path: str | Path) -> Path:
        """Write the session as JSON.

        Raises:
            SessionError: the file cannot be written.
        """
        path = Path(path)
        self.meta.setdefault("saved_at", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        try:
            path.write_text(json.dumps(self.to_dict()) + "\n")
        except OSError as exc:
            raise SessionError(f"cannot write session {path}: {exc.strerror or exc}") from exc
        return path

    @classmethod
    def load(cls, path: str | Path) -> Session:
        """Read a session written by :meth:`save`.

        Raises:
            SessionError: unreadable file, not JSON, another schema or version.
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise SessionError(f"cannot read session {path}: {exc.strerror or exc}") from exc
        except json.JSONDecodeError as exc:
            raise SessionError(f"{path} is not JSON: {exc.msg} at line {exc.lineno}") from exc
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise SessionError(f"{path} is not an aicpu-tiling profile session")
        if data.get("version") != SCHEMA_VERSION:
            raise SessionError(
                f"{path} has session version {data.get('version')}, "
                f"this tool reads version {SCHEMA_VERSION}"
            )
        try:
            return cls([Run.from_dict(r) for r in data["runs"]], dict(data.get("meta", {})))
        except (KeyError, TypeError) as exc:
            raise SessionError(f"{path} is a damaged session: {exc!r}") from exc
