"""Rich tables for ``profile``: per-step host breakdown and device task timings."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..data import HOST_PHASES

_PHASE_LABEL = {
    "input_copies": "input copies",
    "host_tiling": "host tiling",
    "task_updates": "task updates",
    "replay_launch": "replay launch",
    "synchronize": "synchronize + wait",
    "other": "other",
    "host": "host (runtime's own)",
    "total": "step, end to end",
    "device_step": "device time per step",
    "aicpu_task": "AI-CPU tiling task",
    "attention_layer": "attention, per layer",
    "idle_tiling_to_attention": "idle: tiling -> first attention",
}
#: the note every title carries: whose times these are (``--backend``)
TITLE_NOTE = {"cpu": "emulated, CPU backend", "npu": "NPU", "npu-twin": "emulated, NPU twin"}


def _f(x: float) -> str:
    return f"{x:,.1f}"


def _stats_table(title: str, first: str, rows: dict[str, dict], with_count: bool) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column(first)
    if with_count:
        table.add_column("count", justify="right")
    for name in ("p50", "p90", "p99", "mean"):
        table.add_column(name, justify="right")
    for key, st in rows.items():
        cells = [_f(st["p50"]), _f(st["p90"]), _f(st["p99"]), _f(st["mean"])]
        if with_count:
            cells.insert(0, str(int(st["count"])))
        table.add_row(_PHASE_LABEL.get(key, key), *cells)
    return table


def _note(backend: str) -> str:
    return TITLE_NOTE.get(backend, backend)


def host_table(mode: str, breakdown: dict[str, dict], backend: str = "cpu") -> Table:
    """Per-phase host time per step (us) for one run."""
    order = [*HOST_PHASES, "host", "total"]
    rows = {k: breakdown[k] for k in order if k in breakdown}
    return _stats_table(f"{mode}: host time per step (us; {_note(backend)})", "phase", rows,
                        False)


def device_table(mode: str, summary: dict[str, dict], backend: str = "cpu") -> Table:
    """Per-task-group device time (us) for one run."""
    return _stats_table(f"{mode}: device task time (us; {_note(backend)})", "task", summary,
                        True)


def device_step_table(mode: str, stats: dict[str, dict], backend: str = "cpu") -> Table:
    """Per-step device figures (us) for one run (`processors.device_step_stats`)."""
    return _stats_table(f"{mode}: device per step (us; {_note(backend)})", "figure", stats,
                        True)


def profile_tables(report: dict) -> list:
    """Every table of a processed profile report (see ``cli.profile.process``)."""
    out: list = []
    backend = report.get("backend", "cpu")
    for run in report["runs"]:
        out.append(
            Text(
                f"{run['mode']} · {run['workload'].get('name', '')} · {run['steps']} steps",
                style="bold",
            )
        )
        out.append(host_table(run["mode"], run["host"], backend))
        if run["device"]:
            out.append(device_table(run["mode"], run["device"], backend))
        if run.get("device_per_step"):
            out.append(device_step_table(run["mode"], run["device_per_step"], backend))
        if run.get("counters_per_step"):
            counts = ", ".join(f"{k} {v:g}" for k, v in run["counters_per_step"].items())
            out.append(Text(f"per step: {counts}", style="dim"))
    if report.get("host_ratio") is not None:
        out.append(
            Text(
                f"host time per step, host_update / device_tiling: {report['host_ratio']:.1f}x"
                f" ({_note(backend)})",
                style="bold",
            )
        )
    return out
