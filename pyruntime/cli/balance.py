"""``aicpu-tiling bench balance``: our tiling against the anchors' partitioners.

Every partitioner splits the same trace batches (continuous batching over the Azure
conversation trace) for the same core count and is charged by the cost model of
``aicpu_tiling.h``; the report gives busiest-core cost over the ideal
(``W / cores + cost_segment``) and segment counts per batch size.
"""

from __future__ import annotations

import argparse

from ..partitioners import CostModel, TilingUnavailableError, WorkloadError
from ..partitioners.study import balance_study
from ..profiler.renderers.balance_tables import balance_tables
from ._common import CliError, add_output_args, emit_json, make_console, progress, write_json
from .sources import SOURCES, ContinuousBatch, SourceError

DEFAULT_SIZES = (16, 64, 256, 1024)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_geometry_args(parser: argparse.ArgumentParser) -> None:
    """Head geometry, block size, cores and cost weights (shared with ``inspect``)."""
    g = parser.add_argument_group("geometry and cost model")
    g.add_argument("--q-heads", type=int, default=16, help="query heads (default 16)")
    g.add_argument("--kv-heads", type=int, default=1, help="kv heads (default 1)")
    g.add_argument("--block-size", type=int, default=128, help="kv block size (default 128)")
    g.add_argument("--cores", type=int, default=24, help="AI Cores (default 24, a 910B2)")
    g.add_argument("--q-tile", type=int, default=None, help="query tokens per unit")
    g.add_argument("--cost-kv-load", type=int, default=4)
    g.add_argument("--cost-qk-tile", type=int, default=1)
    g.add_argument("--cost-segment", type=int, default=32)


def cost_model(args: argparse.Namespace) -> CostModel:
    """The CostModel the geometry flags describe; bad values are user errors."""
    try:
        return CostModel(
            num_q_heads=args.q_heads, num_kv_heads=args.kv_heads, block_size=args.block_size,
            q_tile=args.q_tile, num_cores=args.cores, cost_kv_load=args.cost_kv_load,
            cost_qk_tile=args.cost_qk_tile, cost_segment=args.cost_segment,
        )  # fmt: skip
    except WorkloadError as exc:
        raise CliError(str(exc)) from exc


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench balance``."""
    p = sub.add_parser(
        "balance",
        help="our tiling against FIA, FlashMLA and FlashInfer partitioners",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument(
        "--batch-sizes",
        type=_int_list,
        default=list(DEFAULT_SIZES),
        help="comma-separated batch sizes (default 16,64,256,1024)",
    )
    p.add_argument("--samples", type=int, default=16, help="trace steps per batch size")
    p.add_argument("--source", choices=SOURCES, default="trace", help="length source")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--engine",
        choices=("kernel", "oracle"),
        default="kernel",
        help="run ours through the C kernel or the pure-Python oracle",
    )
    p.add_argument("--quick", action="store_true", help="2 samples per size (CI smoke)")
    p.add_argument(
        "--check", action="store_true", help="exit 1 when ours is above any anchor at any size"
    )
    p.add_argument("-o", "--output", help="also write the JSON result to this file")
    add_geometry_args(p)
    add_output_args(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run the balance study and print it."""
    model = cost_model(args)
    samples = 2 if args.quick else args.samples
    if samples < 1:
        raise CliError(f"--samples must be >= 1, got {samples}")
    show = not (args.json or args.no_progress)
    try:
        batches = {
            size: [
                (s.cu_seqlens_q, s.seqlens_kv)
                for s in (next(ContinuousBatch(args.source, size, seed=args.seed + i))
                          for i in range(samples))
            ]
            for size in args.batch_sizes
        }  # fmt: skip
        with progress(show) as bar:
            task = bar.add_task("balance", total=samples * len(batches))
            result = balance_study(
                batches, model, engine=args.engine, on_batch=lambda: bar.advance(task)
            )
    except (SourceError, WorkloadError, TilingUnavailableError) as exc:
        raise CliError(str(exc)) from exc
    result = {"command": "bench balance", "source": args.source, "seed": args.seed, **result}
    if args.output:
        write_json(args.output, result)
    if args.json:
        emit_json(result)
    else:
        console = make_console()
        for item in balance_tables(result):
            console.print(item)
    ok = result["verdict"]["ours_at_or_below_all"]
    return 1 if (args.check and not ok) else 0
