"""The processed report of a profile session: what ``profile`` prints and writes, and what
another command (``serve-check --profile``) calls to render a session the same way.

Example::

    from pyruntime.profiler.report import profile_report, write_profile
    report = profile_report(session)            # pure: dict, JSON-ready
    tables = write_profile(session, trace="t.json")   # writes the trace; returns the tables
    files = write_profile_folder(session, "out/")      # trace.json, tables.txt, profile.json
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from . import processors as proc
from .data import Session
from .renderers.chrome_trace import write_chrome_trace
from .renderers.profile_tables import profile_tables

#: the A/B pair whose host times are compared
PAIR = ("host_update", "device_tiling")


def profile_report(session: Session) -> dict:
    """Per run: host breakdown, device task summary and per-step device figures
    (`processors.device_step_stats`); the host_update / device_tiling host-time ratio; the
    session's backend and what its times are (``meta["backend"]``, ``meta["times"]``)."""
    runs = []
    for r in session.runs:
        runs.append({
            "mode": r.mode, "workload": r.workload, "steps": len(r.steps),
            "host": proc.host_breakdown(r),
            "device": proc.collapse_layers(proc.device_summary(r)),
            "device_per_step": proc.device_step_stats(r),
            "counters_per_step": r.counters,
        })  # fmt: skip
    ratio = None
    modes = {r.mode: r for r in session.runs}
    if set(PAIR) <= set(modes) and modes[PAIR[1]].steps and modes[PAIR[0]].steps:
        a = np.median([s.host_s for s in modes[PAIR[0]].steps])
        b = np.median([s.host_s for s in modes[PAIR[1]].steps])
        ratio = float(a / b) if b else None
    backend = session.meta.get("backend", "cpu")
    return {"backend": backend, "times": session.meta.get("times"),
            "times_emulated": backend != "npu", "meta": session.meta, "runs": runs,
            "host_ratio": ratio}


def write_profile(session: Session, *, trace: str | Path | None = None) -> list:
    """Write the Chrome trace of `session` to `trace` (when given) and return the rich
    renderables of its tables (`profile_tables` of `profile_report`).

    Raises:
        OSError: the trace cannot be written.
    """
    if trace is not None:
        write_chrome_trace(session, trace)
    return profile_tables(profile_report(session))


#: what `write_profile_folder` writes in its folder
TRACE_FILE, TABLES_FILE, REPORT_FILE = "trace.json", "tables.txt", "profile.json"


def write_profile_folder(session: Session, folder: str | Path, *, width: int = 120,
                         ) -> list[Path]:
    """Write what ``aicpu-tiling profile --trace trace.json`` writes and prints for `session`
    into `folder` (made when missing): ``trace.json`` (the Chrome trace), ``tables.txt`` (the
    tables as text, `width` columns) and ``profile.json`` (`profile_report`).

    Returns:
        the three paths, in that order.

    Raises:
        OSError: a file cannot be written.
    """
    from rich.console import Console

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tables = write_profile(session, trace=folder / TRACE_FILE)
    text = io.StringIO()
    console = Console(file=text, width=width, highlight=False, soft_wrap=False,
                      force_terminal=False, color_system=None)
    for item in tables:
        console.print(item)
    (folder / TABLES_FILE).write_text(text.getvalue())
    (folder / REPORT_FILE).write_text(json.dumps(profile_report(session), indent=1) + "\n")
    return [folder / TRACE_FILE, folder / TABLES_FILE, folder / REPORT_FILE]
