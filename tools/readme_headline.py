"""Regenerate the README's headline table from an ``aicpu-tiling bench`` JSON.

    aicpu-tiling bench -o bench.json && python tools/readme_headline.py bench.json

rewrites the block between ``<!-- headline:begin -->`` and ``<!-- headline:end -->`` in
README.md (``--print`` only prints it). The JSON must come from the default grid (it has
the L=61, batch 64, trace point and the flatness run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"


class HeadlineError(ValueError):
    """A bench JSON without the headline point or the flatness run."""


def render(result: dict) -> str:
    """The markdown block for one bench result (schema version 3 or 4: version 4 added the
    invariants, and kept every field read here)."""
    head, flat = result.get("headline"), result.get("host_flatness")
    if result.get("version") not in (3, 4) or head is None or flat is None:
        raise HeadlineError("needs a version-3 or -4 bench JSON of the default grid (the "
                            "L=61, batch 64, trace point and the flatness run)")
    modes = flat["modes"]
    rows = [("host_update", head["host_update_us"], None, None),
            ("device tiling, `graph`", head["device_tiling_us"], head["host_ratio"],
             modes["device_tiling"]["ratio"]),
            ("device tiling, `pre-replay`", head["pre_replay_us"],
             head["host_ratio_pre_replay"], modes["pre_replay"]["ratio"])]
    lines = ["| L = 61, batch 64 | host us per step | host_update / this | "
             "flatness: L = 61 / L = 1 (target <= 1.3) |", "|---|---:|---:|---:|"]
    for name, us, ratio, flatness in rows:
        lines.append(f"| {name} | {us:,.1f} | {f'{ratio:.0f}x' if ratio else '-'} | "
                     + (f"{flatness['value']:.2f} ({flatness['ci'][0]:.2f}-"
                        f"{flatness['ci'][1]:.2f})" if flatness else "-") + " |")
    env = result["environment"]
    lines.append("")
    lines.append(f"`{result['command']}`, {result['created'][:10]}, {env['cpus']} CPUs, "
                 f"torch {env.get('torch', '?')}; medians of {result['config']['steps']} "
                 f"steps (flatness: {flat['steps']}), 95% bootstrap intervals.")
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with the headline block replaced (the markers must be there, once each)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise HeadlineError(f"README.md needs one {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("--print", action="store_true", help="print the block, change nothing")
    args = parser.parse_args(argv)
    try:
        block = render(json.loads(args.bench_json.read_text()))
        if args.print:
            print(block)
            return 0
        README.write_text(replace_block(README.read_text(), block))
    except (OSError, json.JSONDecodeError, HeadlineError) as exc:
        print(f"readme_headline: {exc}", file=sys.stderr)
        return 2
    print(f"wrote the headline block of {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
