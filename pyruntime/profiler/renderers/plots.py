"""PNG charts through matplotlib, installed with the ``plot`` extra.

``pip install 'aicpu-tiling[plot]'``; without it every function raises
:class:`PlotUnavailableError` with that instruction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailableError(
            "PNG output needs matplotlib: pip install 'aicpu-tiling[plot]'"
        ) from exc
    return plt


def available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        _pyplot()
    except PlotUnavailableError:
        return False
    return True


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    try:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    except OSError as exc:
        raise PlotUnavailableError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        _pyplot().close(fig)
    return path


def plot_core_load(view: dict, path: str | Path) -> Path:
    """Per-core cost bars of an ``inspect`` view, with the ideal as a line."""
    plt = _pyplot()
    costs = [c["cost"] for c in view["cores"]]
    segs = [c["num_segments"] for c in view["cores"]]
    fig, ax = plt.subplots(figsize=(max(6, len(costs) * 0.35), 3.5))
    bars = ax.bar(range(len(costs)), costs, color="#4477aa")
    for bar, n in zip(bars, segs):
        ax.annotate(
            str(n),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=7,
        )
    ideal = view["summary"].get("ideal")
    if ideal:
        ax.axhline(ideal, color="#cc6677", linestyle="--", label=f"ideal {ideal:.0f}")
        ax.legend(loc="lower right")
    ax.set_xlabel("core (label: segments)")
    ax.set_ylabel("cost")
    ax.set_title(f"tiling: batch {view['summary']['batch']}, status {view['status']}")
    return _save(fig, path)


def plot_bench(result: dict, path: str | Path) -> Path:
    """Host time per step of every mode (host_update, device tiling in each placement) per
    grid point (log scale), with the CIs."""
    plt = _pyplot()
    points = result["points"]
    labels = [f"L{p['layers']} b{p['batch']}\n{p['source']}" for p in points]
    fig, ax = plt.subplots(figsize=(max(6, len(points) * 0.9), 4))
    modes = [(m, label, c) for m, label, c in (
        ("host_update", "host_update", "#cc6677"), ("device_tiling", "graph", "#4477aa"),
        ("pre_replay", "pre-replay", "#228833")) if points and m in points[0]["modes"]]
    width = 0.8 / max(len(modes), 1)
    for i, (mode, label, color) in enumerate(modes):
        med = [p["modes"][mode]["host_us"]["median"] for p in points]
        lo = [m - p["modes"][mode]["host_us"]["ci"][0] for m, p in zip(med, points)]
        hi = [p["modes"][mode]["host_us"]["ci"][1] - m for m, p in zip(med, points)]
        xs = [x + (i - (len(modes) - 1) / 2) * width for x in range(len(points))]
        ax.bar(xs, med, width, yerr=[lo, hi], label=label, color=color, capsize=2)
    for x, p in enumerate(points):
        ax.annotate(f"{p['host_ratio']['value']:.0f}x", (x, max(
            p["modes"]["host_update"]["host_us"]["median"], 1)), ha="center", va="bottom",
            fontsize=8)  # fmt: skip
    ax.set_yscale("log")
    ax.set_xticks(range(len(points)), labels, fontsize=7)
    ax.set_ylabel("host time per step (us, median, 95% CI)")
    ax.set_title("host_update vs device tiling (graph, pre-replay); label: host_update / graph")
    ax.legend()
    return _save(fig, path)
