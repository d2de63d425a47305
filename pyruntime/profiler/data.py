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
        blocked_s: wall time of the host part minus ``host_s``: how long the host was
            blocked inside it (``last_step_blocked_seconds``; a sleep through a device
            phase shows here).
        preceded_by: the run mode of the unmeasured step that ran just before it on the
            same backend (the bench's host-state marker; empty where not recorded).
    """

    start: float
    step_s: float
    host_s: float
    phases: dict[str, float] = field(default_factory=dict)
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    blocked_s: float = 0.0
    preceded_by: str = ""


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
        """Inverse of ``dataclasses.asdict``.

        Raises:
            KeyError, TypeError: a field is missing or has the wrong type.
        """
        steps = [
            HostStep(_num(s["start"]), _num(s["step_s"]), _num(s["host_s"]),
                     {_str(k): _num(v) for k, v in _dict(s.get("phases", {})).items()},
                     [(_str(p), _num(a), _num(b)) for p, a, b in _list(s.get("spans", []))],
                     _num(s.get("blocked_s", 0.0)), _str(s.get("preceded_by", "")))
            for s in map(_dict, _list(d.get("steps", [])))
        ]  # fmt: skip
        tasks = [
            DeviceTask(int(_num(t["step"])), _str(t["kind"]), _str(t["name"]), _str(t["lane"]),
                       _num(t["start"]), _num(t["end"]))
            for t in map(_dict, _list(d.get("device_tasks", [])))
        ]  # fmt: skip
        counters = {_str(k): _num(v) for k, v in _dict(d.get("counters", {})).items()}
        return cls(_str(d["mode"]), _dict(d.get("workload", {})), steps, tasks, counters)


def _typed(kind: type | tuple[type, ...], what: str):
    def check(value: Any) -> Any:
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TypeError(f"expected {what}, found {type(value).__name__} {value!r:.40}")
        return value

    return check


_num, _str = _typed((int, float), "a number"), _typed(str, "a string")
_dict, _list = _typed(dict, "an object"), _typed(list, "a list")


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
            runs = [Run.from_dict(_dict(r)) for r in _list(data["runs"])]
            meta = dict(_dict(data.get("meta", {})))
        except KeyError as exc:
            raise SessionError(f"{path} is a damaged session: missing field {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise SessionError(f"{path} is a damaged session: {exc}") from exc
        if not runs:
            raise SessionError(f"{path} is a damaged session: it holds no runs")
        return cls(runs, meta)
