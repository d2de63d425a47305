"""Rich tables for ``bench balance``: busiest core over the ideal for every anchor variant.

One table per (head geometry, length source, cost model): a row per partitioner (ours first),
a column per batch size, each cell ``mean/worst`` over the sampled steps. The best mean of a
column is bold; an anchor below ours (a loss of ours) is red. Then the verdict, the losses if
any, and how the figures are made.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

# labels of the reference bounds (pyruntime.partitioners.study.REFERENCES)
REFERENCE_LABELS = {"minmax": "exact min-max (ref)", "minmax_best_order": "exact, best order (ref)"}


def _label(result: dict, name: str) -> str:
    return "ours" if name == "ours" else result["anchors"].get(name, {}).get("label", name)


def _group_key(case: dict) -> tuple[str, str, str]:
    return case["geometry"], case["source"], case["cost_model"]


def _case_table(result: dict, cases: list[dict]) -> Table:
    geometry, source, cm = _group_key(cases[0])
    samples = cases[0]["samples"]
    table = Table(
        title=f"{geometry} heads, {source}, cost model {cm}: busiest core / ideal, "
        f"mean/worst of {samples}",
        title_justify="left",
    )
    table.add_column("partitioner")
    for case in cases:
        table.add_column(f"b={case['batch']}", justify="right")
    names = ["ours", *result["anchors"]]
    losing = {(v["batch"], v["anchor"]) for v in result["verdict"]["losses"]
              if (v["geometry"], v["source"], v["cost_model"]) == (geometry, source, cm)}  # fmt: skip
    for name in names:
        cells = []
        for case in cases:
            parts = case["partitioners"]
            if name not in parts:
                cells.append(Text("n/a", style="dim"))
                continue
            stats = parts[name]
            best = min(p["ratio_mean"] for p in parts.values())
            cell = f"{stats['ratio_mean']:.3f}/{stats['ratio_max']:.3f}"
            style = "bold" if stats["ratio_mean"] == best else ""
            if (case["batch"], name) in losing:
                style = "bold red"
            cells.append(Text(cell, style=style))
        if any(str(c) != "n/a" for c in cells):
            table.add_row(_label(result, name), *cells)
    for name, label in REFERENCE_LABELS.items():
        if all(name in case.get("references", {}) for case in cases):
            cells = [f"{c['references'][name]['ratio_mean']:.3f}/"
                     f"{c['references'][name]['ratio_max']:.3f}" for c in cases]  # fmt: skip
            table.add_row(Text(label, style="dim"), *(Text(c, style="dim") for c in cells))
    return table


def _loss_table(result: dict) -> Table:
    table = Table(title="Where an anchor is below ours", title_justify="left")
    for col in ("heads", "source", "cost", "batch", "anchor", "stat"):
        table.add_column(col)
    table.add_column("anchor", justify="right")
    table.add_column("ours", justify="right")
    for v in result["verdict"]["losses"]:
        table.add_row(v["geometry"], v["source"], v["cost_model"], str(v["batch"]),
                      _label(result, v["anchor"]), v["statistic"], f"{v['anchor_value']:.4f}",
                      f"{v['ours']:.4f}")  # fmt: skip
    return table


def balance_tables(result: dict) -> list:
    """The per-case tables, the verdict (and losses) and a note of a balance study result."""
    out: list = []
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for case in result["cases"]:  # in run order: geometry, source, then cost model
        groups.setdefault(_group_key(case), []).append(case)
    for group in groups.values():
        out.append(_case_table(result, sorted(group, key=lambda c: c["batch"])))
    verdict = result["verdict"]
    n_cases, n_ties = len(result["cases"]), len(verdict["ties"])
    if verdict["variants_missing"]:
        missing = ", ".join(_label(result, n) for n in verdict["variants_missing"])
        out.append(Text(f"NO VERDICT: these variants never ran: {missing}", style="bold red"))
    if verdict["losses"]:
        out.append(Text(f"OURS IS ABOVE AN ANCHOR in {len(verdict['losses'])} comparisons "
                        f"(of {n_cases} cases; {n_ties} ties)", style="bold red"))  # fmt: skip
        out.append(_loss_table(result))
    elif not verdict["variants_missing"]:
        out.append(Text(f"ours is at or below every anchor variant, mean and worst, in all "
                        f"{n_cases} cases ({n_ties} ties)"))  # fmt: skip
    weights = "; ".join(
        f"{name}: block {m['block_size']}, kv load {m['cost_kv_load']}, qk tile "
        f"{m['cost_qk_tile']}, segment {m['cost_segment']}"
        for name, m in result["cost_models"].items()
    )
    out.append(Text(f"ideal = total cost / {next(iter(result['cost_models'].values()))['num_cores']}"
                    f" cores + one segment overhead; cost models: {weights}; n/a: the anchor's "
                    "kernel does not take these batches", style="dim"))  # fmt: skip
    return out
