"""Rich tables for ``bench balance``: busiest-core cost over the ideal and segments."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

LABELS = {
    "ours": "ours",
    "fia_even": "FIA even",
    "fia_weighted": "FIA weighted",
    "flashmla": "FlashMLA",
    "flashinfer": "FlashInfer",
}


def _names(result: dict) -> list[str]:
    return list(result["sizes"][0]["partitioners"]) if result["sizes"] else []


def balance_tables(result: dict) -> list:
    """The two tables and the verdict line of a balance study result."""
    names = _names(result)
    model = result["model"]
    samples = result["sizes"][0]["samples"] if result["sizes"] else 0
    ratio = Table(
        title=f"Busiest core / ideal, mean (worst) of {samples} trace steps, "
        f"{model['num_cores']} cores",
        title_justify="left",
    )
    seg = Table(title="Segments (mean) and units", title_justify="left")
    ratio.add_column("batch", justify="right")
    seg.add_column("batch", justify="right")
    seg.add_column("units", justify="right")
    for n in names:
        ratio.add_column(LABELS.get(n, n), justify="right")
        seg.add_column(LABELS.get(n, n), justify="right")
    for size in result["sizes"]:
        parts = size["partitioners"]
        best = min(parts[n]["ratio_mean"] for n in names)
        cells = []
        for n in names:
            cell = f"{parts[n]['ratio_mean']:.3f} ({parts[n]['ratio_max']:.3f})"
            cells.append(Text(cell, style="bold") if parts[n]["ratio_mean"] == best else cell)
        ratio.add_row(str(size["batch"]), *cells)
        units = parts[names[0]]["units_mean"]
        seg.add_row(
            str(size["batch"]), f"{units:.0f}", *(f"{parts[n]['segments_mean']:.0f}" for n in names)
        )
    verdict = result["verdict"]
    if "ours" not in names:
        line = Text("ours not run: no verdict")
    elif verdict["ours_at_or_below_all"]:
        line = Text("ours is at or below every anchor at every batch size (mean and worst)")
    else:
        bad = ", ".join(
            f"batch {v['batch']} {LABELS.get(v['anchor'], v['anchor'])} {v['statistic']} "
            f"{v['anchor_value']:.4f} < ours {v['ours']:.4f}"
            for v in verdict["violations"]
        )
        line = Text(f"OURS IS ABOVE AN ANCHOR: {bad}", style="bold red")
    ideal = Text(
        f"ideal = total cost / {model['num_cores']} cores + one segment overhead "
        f"({model['cost_segment']}); geometry {model['num_q_heads']} q heads / "
        f"{model['num_kv_heads']} kv heads, block {model['block_size']}",
        style="dim",
    )
    return [ratio, seg, line, ideal]
