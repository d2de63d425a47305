"""Print the balance tables of docs/tiling.md from a `bench balance --json` file.

    aicpu-tiling bench balance --reference --json -o balance.json
    python tools/balance_readme_tables.py balance.json

Mean busiest core / ideal per (heads, batch): one table per (batch source, cost model) with
the main anchors, then the FlashMLA sweep with the exact min-max references (decode, cost
model ours; only when the file was made with --reference). Nothing is computed here: every
number is read from the file, so the tables in docs/tiling.md are the command's output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MAIN = (("ours", "ours"), ("FIA V3", "fia_v3"), ("IFA 24c", "ifa_weighted_aic"),
        ("IFA 48v", "ifa_weighted_aiv"), ("MLA F=5", "flashmla"), ("FI 1x", "flashinfer_1x"),
        ("FI 2x", "flashinfer_2x"), ("FI 4x", "flashinfer_4x"),
        ("FI pers", "flashinfer_persistent"))
SWEEP = (("ours", "ours"), ("F=0", "flashmla_f0"), ("F=1", "flashmla_f1"),
         ("F=2", "flashmla_f2"), ("F=3", "flashmla_f3"), ("F=5", "flashmla"),
         ("F=8", "flashmla_f8"), ("F=seg", "flashmla_tuned"), ("exact", "minmax"),
         ("exact2", "minmax_best_order"))
SOURCES = (("trace", "Decode (`trace`)"), ("spec-decode", "Speculative decode"),
           ("chunked-prefill", "Chunked prefill"))


def _mean(case: dict, key: str) -> str:
    entry = case["partitioners"].get(key) or case.get("references", {}).get(key)
    return "n/a" if entry is None or entry.get("ratio_mean") is None else f"{entry['ratio_mean']:.3f}"


def _table(cases: list[dict], columns, width: int) -> list[str]:
    head = "    heads  batch" + "".join(f"{label:>{width}}" for label, _ in columns)
    rows = [head]
    for case in cases:
        cells = "".join(f"{_mean(case, key):>{width}}" for _, key in columns)
        rows.append(f"    {case['geometry']:>5}  {case['batch']:>5}{cells}")
    return rows


def render(result: dict) -> str:
    out: list[str] = []
    for source, title in SOURCES:
        for model in result["cost_models"]:
            cases = [c for c in result["cases"]
                     if c["source"] == source and c["cost_model"] == model]
            if cases:
                out += [f"{title}, cost model {model}:", "", *_table(cases, MAIN, 8), ""]
    sweep = [c for c in result["cases"] if c["source"] == "trace" and c["cost_model"] == "ours"
             and "minmax" in c.get("references", {})]
    if sweep:
        out += ["FlashMLA sweep, decode, cost model ours:", "", *_table(sweep, SWEEP, 7), ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/balance_readme_tables.py balance.json", file=sys.stderr)
        return 2
    try:
        result = json.loads(Path(argv[0]).read_text())
        print(render(result))
    except (OSError, ValueError, KeyError) as exc:
        print(f"balance_readme_tables: {argv[0]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
