"""Print ours against the FIA v2 sink metadata split from `bench balance --json` files.

    aicpu-tiling bench balance --json -o balance.json
    aicpu-tiling bench balance --window 128 --json -o window.json
    aicpu-tiling bench balance --geometry deepseek-v3 --json -o mla.json
    python tools/competitor_balance_table.py balance.json window.json mla.json

One row per (geometry, batch source, cost model): busiest core / ideal of ours and of
`fia_v2_sink_metadata`, the mean over the batch sizes of each size's mean over the sampled
steps, and the worst step of any size; then every (case, statistic) where the competitor is
below ours, or "none". Nothing is computed beyond these two aggregates: the per-size values
are in the files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COMPETITOR = "fia_v2_sink_metadata"


def _stats(case: dict, name: str) -> tuple[float, float] | None:
    """(mean, worst) of one partitioner in one case of either file kind."""
    if "ratios" in case:  # bench balance --window
        entry = case["ratios"].get(name)
        return None if entry is None else (entry["mean"], entry["worst"])
    entry = case["partitioners"].get(name)
    return None if entry is None else (entry["ratio_mean"], entry["ratio_max"])


def rows(result: dict) -> tuple[list[str], list[str]]:
    """The table's rows and the loss lines of one result."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for case in result["cases"]:
        key = (case["geometry"], case["source"], case.get("cost_model", "ours"))
        groups.setdefault(key, []).append(case)
    out, losses = [], []
    for (geometry, source, model), cases in groups.items():
        pairs = [(_stats(c, "ours"), _stats(c, COMPETITOR), c["batch"]) for c in cases]
        pairs = [p for p in pairs if p[0] and p[1]]
        if not pairs:
            out.append(f"  {geometry:>6}  {source:<15} {model:<8}  {'n/a':>36}")
            continue
        ours_mean = sum(o[0] for o, _, _ in pairs) / len(pairs)
        theirs_mean = sum(t[0] for _, t, _ in pairs) / len(pairs)
        ours_worst = max(o[1] for o, _, _ in pairs)
        theirs_worst = max(t[1] for _, t, _ in pairs)
        out.append(f"  {geometry:>6}  {source:<15} {model:<8}  {ours_mean:8.4f} {ours_worst:8.4f}"
                   f"  {theirs_mean:8.4f} {theirs_worst:8.4f}")  # fmt: skip
        for o, t, batch in pairs:
            for label, mine, theirs in (("mean", o[0], t[0]), ("worst", o[1], t[1])):
                if theirs < mine - 1e-9:
                    losses.append(f"  {geometry} {source} {model} batch {batch} {label}: "
                                  f"ours {mine:.4f} > competitor {theirs:.4f}")  # fmt: skip
    return out, losses


def render(name: str, result: dict) -> str:
    title = name
    if result.get("window"):
        title += f" (window {result['window']})"
    if result.get("geometry"):
        title += f" ({result['geometry']})"
    head = (f"  {'heads':>6}  {'source':<15} {'cost':<8}  {'ours':>8} {'worst':>8}"
            f"  {'FIA v2 sink':>8} {'worst':>8}")  # fmt: skip
    table, losses = rows(result)
    below = ["competitor below ours:", *losses] if losses else ["competitor below ours: none"]
    return "\n".join([title, "", head, *table, *below, ""])


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python tools/competitor_balance_table.py RESULT.json...", file=sys.stderr)
        return 2
    for path in argv:
        try:
            print(render(path, json.loads(Path(path).read_text())))
        except (OSError, ValueError, KeyError) as exc:
            print(f"competitor_balance_table: {path}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
