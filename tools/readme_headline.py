"""Regenerate the README's headline table from an ``aicpu-tiling bench`` JSON.

    aicpu-tiling bench -o bench.json && python tools/readme_headline.py bench.json

rewrites the block between ``<!-- headline:begin -->`` and ``<!-- headline:end -->`` in
README.md (``--print`` only prints it). The JSON must come from the default grid (it has
the L=61, batch 64, trace point and the flatness run) under the symmetric method (the
default): the block shows the ratio measured here, labelled as such, and the NPU projection
table of ``aicpu-tiling bench projection``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
from pyruntime.cli import projection

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- headline:begin -->", "<!-- headline:end -->"


class HeadlineError(ValueError):
    """A bench JSON without the headline point or the flatness run."""


def render(result: dict) -> str:
    """The markdown block for one bench result: the figures measured here under the
    symmetric method, labelled as such (host time per step, host_update over each device
    mode, each device mode over its floor, the flatness figure), then the NPU projection
    table of ``aicpu-tiling bench projection`` from the same JSON.

    Raises:
        HeadlineError: not a version-4 JSON of the default grid (the L=61, batch 64, trace
            point and the flatness run), or its headline was not measured with the symmetric
            method (the old method's figures are history, docs/benchmarks.md).
    """
    head, flat = result.get("headline"), result.get("host_flatness")
    if result.get("version") != 4 or head is None or flat is None:
        raise HeadlineError("needs a version-4 bench JSON of the default grid (the L=61, "
                            "batch 64, trace point and the flatness run)")
    if head.get("method") != "symmetric":
        raise HeadlineError(f"the headline was measured with the {head.get('method', 'old')!r} "
                            "method; the README shows the symmetric one (bench's default)")
    floor = head.get("by_method", {}).get("symmetric", {}).get("floor_ratio") or {}
    modes = flat["modes"]
    rows = [("host_update", head["host_update_us"], None, None, None),
            ("device tiling, `graph`", head["device_tiling_us"], head["host_ratio"],
             floor.get("device_tiling"), modes["device_tiling"]["ratio"]),
            ("device tiling, `pre-replay`", head["pre_replay_us"],
             head["host_ratio_pre_replay"], floor.get("pre_replay"), modes["pre_replay"]["ratio"])]
    keys = (result.get("method") or {}).get("graph_keys")
    label = ("Measured here, on the CPU backend (not an NPU), symmetric method"
             f"{f', K = {keys} graph keys' if keys else ''}:")
    header = ("| L = 61, batch 64 | host us per step | host_update / this (measured here) | "
              "this / its floor | flatness: L = 61 / L = 1 |")
    lines = [label, "", header, "|---|---:|---:|---:|---:|"]
    for name, us, ratio, over_floor, flatness in rows:
        lines.append(f"| {name} | {us:,.1f} | {f'{ratio:.0f}x' if ratio else '-'} | "
                     + (f"{over_floor:.2f}" if over_floor else "-") + " | "
                     + (f"{flatness['value']:.2f} ({flatness['ci'][0]:.2f}-"
                        f"{flatness['ci'][1]:.2f})" if flatness else "-") + " |")
    env = result["environment"]
    lines.append("")
    lines.append(f"`{result['command']}`, {result['created'][:10]}, {env['cpus']} CPUs, "
                 f"torch {env.get('torch', '?')}; medians of {result['config']['steps']} "
                 f"steps (flatness: {flat['steps']}), 95% bootstrap intervals.")
    intro = ("Projected on an NPU from the same JSON (`aicpu-tiling bench projection --from` "
             "it): a range over the replay host cost R and the layer count L, not a "
             "measurement:")
    lines += ["", intro, "", "```text", projection.render(projection.projection(result)),
              "```"]
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
