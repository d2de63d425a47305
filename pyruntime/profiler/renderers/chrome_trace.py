"""Chrome trace JSON (the Trace Event Format; opens in Perfetto and chrome://tracing).

One process per run (``mode: workload``); in it a ``host`` lane with one slice per step
and its phase spans nested inside, and one lane per device stream (``device: <lane>``)
with a slice per task. Timestamps are microseconds from the session's earliest event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..data import Session

HOST_TID = 0


def _t0(session: Session) -> float:
    starts = [s.start for r in session.runs for s in r.steps]
    starts += [t.start for r in session.runs for t in r.device_tasks]
    return min(starts, default=0.0)


def chrome_trace(session: Session) -> dict[str, Any]:
    """The trace as a dict: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``."""
    t0 = _t0(session)

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    events: list[dict[str, Any]] = []
    backend = session.meta.get("backend", "cpu")
    # whose times these are, in every process name (an emulated lane must not pass for a
    # device's): the CPU backend and the NPU twin run the device's tasks on the host
    note = {"cpu": " (emulated, CPU backend)", "npu-twin": " (emulated, NPU twin)"}.get(
        backend, "")
    for pid, run in enumerate(session.runs, start=1):
        label = f"{run.mode}: {run.workload.get('name', '')}".rstrip(": ") + note
        events.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": pid,
                "tid": HOST_TID,
                "args": {"name": label},
            }
        )
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": HOST_TID,
                "args": {"name": "host"},
            }
        )
        for i, step in enumerate(run.steps):
            events.append(
                {
                    "ph": "X",
                    "name": f"step {i}",
                    "cat": "host",
                    "pid": pid,
                    "tid": HOST_TID,
                    "ts": us(step.start),
                    "dur": round(step.step_s * 1e6, 3),
                    "args": {"host_us": round(step.host_s * 1e6, 3)},
                }
            )
            for phase, start, end in step.spans:
                events.append(
                    {
                        "ph": "X",
                        "name": phase,
                        "cat": "host",
                        "pid": pid,
                        "tid": HOST_TID,
                        "ts": us(start),
                        "dur": round((end - start) * 1e6, 3),
                    }
                )
        lanes: dict[str, int] = {}
        for task in run.device_tasks:
            if task.lane not in lanes:
                lanes[task.lane] = len(lanes) + 1
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": lanes[task.lane],
                        "args": {"name": f"device: {task.lane}"},
                    }
                )
            events.append(
                {
                    "ph": "X",
                    "name": task.name,
                    "cat": task.kind,
                    "pid": pid,
                    "tid": lanes[task.lane],
                    "ts": us(task.start),
                    "dur": round(task.seconds * 1e6, 3),
                    "args": {"step": task.step},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "aicpu-tiling profile", "backend": backend,
                      "times": session.meta.get("times", ""), **session.meta.get("trace", {})},
    }


def write_chrome_trace(session: Session, path: str | Path) -> Path:
    """Write :func:`chrome_trace` to ``path``; OSError passes through."""
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(session)) + "\n")
    return path
