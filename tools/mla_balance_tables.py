"""Print the MLA balance tables of docs/benchmarks.md from a `bench balance --geometry` JSON file.

    aicpu-tiling bench balance --geometry deepseek-v3 -o mla_balance.json
    python tools/mla_balance_tables.py mla_balance.json

One table per cost model: a row per (q heads per rank, query tokens per request, batch),
``mean/worst`` busiest core over the ideal for ours, FIA's MLA split, FlashMLA as shipped
(F=5) and with our segment cost (F=seg), the best FlashMLA overhead of the sweep (by mean),
FlashMLA's own work (its 64-row m blocks' total cost over ours; 1.00 with one m block) and
FlashMLA F=5's busiest core over the ideal of its own m blocks (the split's balance with its
extra work left out; "=" where it has our units). Nothing is computed here but the minimum:
every number is read from the file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = (("ours", "ours"), ("FIA MLA", "fia_mla"), ("MLA F=5", "flashmla"),
           ("MLA F=seg", "flashmla_tuned"))  # fmt: skip
SWEEP = ("flashmla", "flashmla_tuned", "flashmla_f0", "flashmla_f1", "flashmla_f2",
         "flashmla_f3", "flashmla_f8")  # fmt: skip
WIDTH = 14


def _cell(entry: dict | None) -> str:
    if entry is None:
        return "n/a"
    return f"{entry['ratio_mean']:.3f}/{entry['ratio_max']:.3f}"


def _q_len(source: str) -> str:
    return "1" if source == "decode" else source.removeprefix("mtp")


def _table(cases: list[dict]) -> list[str]:
    head = ("    heads  q  batch" + "".join(f"{label:>{WIDTH}}" for label, _ in COLUMNS)
            + f"{'best MLA F':>{WIDTH}}" + f"{'MLA work':>9}" + f"{'F=5 own':>{WIDTH}}")  # fmt: skip
    rows = [head]
    for case in cases:
        parts = case["partitioners"]
        cells = "".join(f"{_cell(parts.get(key)):>{WIDTH}}" for _, key in COLUMNS)
        sweep = [parts[n] for n in SWEEP if n in parts]
        best = _cell(min(sweep, key=lambda e: e["ratio_mean"])) if sweep else "n/a"
        mla = parts.get("flashmla", {})
        work = mla.get("work_mean", 1.0)
        own = (f"{mla['own_ratio_mean']:.3f}/{mla['own_ratio_max']:.3f}"
               if "own_ratio_mean" in mla else "=")  # fmt: skip
        rows.append(f"    {case['num_q_heads']:>5}  {_q_len(case['source'])}  {case['batch']:>5}"
                    f"{cells}{best:>{WIDTH}}{work:>9.2f}{own:>{WIDTH}}")  # fmt: skip
    return rows


def render(result: dict) -> str:
    """The tables, one per cost model, in the file's case order."""
    out: list[str] = []
    for model in result["cost_models"]:
        cases = [c for c in result["cases"] if c["cost_model"] == model]
        if cases:
            out += [f"Cost model {model}:", "", *_table(cases), ""]
    verdict = result["verdict"]
    out.append(f"ours at or below every variant: {verdict['ours_at_or_below_all']}, "
               f"{len(verdict['losses'])} losses, {len(verdict['ties'])} ties "
               f"in {len(result['cases'])} cases")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tools/mla_balance_tables.py mla_balance.json", file=sys.stderr)
        return 2
    try:
        print(render(json.loads(Path(argv[0]).read_text())))
    except (OSError, ValueError, KeyError) as exc:
        print(f"mla_balance_tables: {argv[0]}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
