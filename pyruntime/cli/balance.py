"""``aicpu-tiling bench balance``: our tiling against faithful models of the anchors' splits.

Every partitioner splits the same trace batches (continuous batching over the Azure
conversation trace: decode, speculative decode, chunked prefill) for the same cores, for
each head geometry, and is charged by two cost models: ours (``aicpu_tiling.h``) and FIA V3's
own block cost written in our kernel's weights. The report gives busiest-core cost over the
ideal (``W / cores + cost_segment``) for every anchor variant.
"""

from __future__ import annotations

import argparse
import time

from ..partitioners import CostModel, TilingUnavailableError, WorkloadError
from ..partitioners.study import COST_MODELS, GEOMETRIES, REFERENCES, SOURCES, balance_study
from ..profiler.renderers.balance_tables import balance_tables
from ._common import (
    CliError,
    add_output_args,
    comma_choices,
    emit_json,
    make_console,
    progress,
    write_json,
)
from .sources import SOURCES as ALL_SOURCES
from .sources import ContinuousBatch, SourceError

DEFAULT_SIZES = (16, 64, 256, 1024)
QUICK_SIZES = (16, 64)
DEFAULT_SAMPLES = 4


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


def _geometries(text: str) -> list[tuple[int, int]]:
    try:
        out = [tuple(int(v) for v in g.split("/")) for g in text.split(",") if g.strip()]
    except ValueError:
        out = []
    if not out or any(len(g) != 2 or min(g) < 1 for g in out):
        raise argparse.ArgumentTypeError(f"expected Q/KV head pairs like 16/1,32/8, got {text!r}")
    return out  # type: ignore[return-value]


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench balance``."""
    p = sub.add_parser(
        "balance",
        help="our tiling against FIA V3, IFA, FlashMLA and FlashInfer partitioners",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument("--batch-sizes", type=_int_list, default=None,
                   help="comma-separated batch sizes (default 16,64,256,1024; --quick 16,64)")
    p.add_argument("--samples", type=int, default=None,
                   help=f"trace steps per batch size (default {DEFAULT_SAMPLES}; --quick 1)")
    p.add_argument("--sources", type=comma_choices(tuple(ALL_SOURCES), "source"), default=list(SOURCES),
                   help="length sources (default trace,spec-decode,chunked-prefill)")
    p.add_argument("--geometries", type=_geometries, default=list(GEOMETRIES),
                   help="query/kv head pairs (default 16/1,32/8,64/8)")
    p.add_argument("--cost-models", type=comma_choices(tuple(COST_MODELS), "cost model"), default=list(COST_MODELS),
                   help="cost models to score with (default ours,fia_v3)")
    p.add_argument("--cores", type=int, default=24, help="AI Cores (default 24, a 910B2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine", choices=("kernel", "oracle"), default="kernel",
                   help="run ours through the C kernel or the pure-Python oracle")
    p.add_argument("--quick", action="store_true", help="1 sample, batch sizes 16,64 (smoke)")
    p.add_argument("--reference", action="store_true",
                   help="also show exact min-max bounds in our unit order and in the better of "
                        "it and head-major order (slow pure Python; not in the verdict)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 unless ours is at or below every anchor variant everywhere")
    p.add_argument("-o", "--output", help="also write the JSON result to this file")
    p.add_argument("--window", type=int, default=None,
                   help="sliding window W in tokens: ours (tiling ABI v5) against FlashInfer "
                        "with window_left = W - 1, over the windowed ideal")
    add_output_args(p)
    p.set_defaults(run=run)
    return p  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run the balance study and print it."""
    samples = args.samples if args.samples is not None else (1 if args.quick else DEFAULT_SAMPLES)
    sizes = args.batch_sizes or list(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    if samples < 1:
        raise CliError(f"--samples must be >= 1, got {samples}")
    if args.cores < 1:
        raise CliError(f"--cores must be >= 1, got {args.cores}")
    for q, kv in args.geometries:
        if q % kv:
            raise CliError(f"geometry {q}/{kv}: query heads must be a multiple of kv heads")
    if getattr(args, "window", None) is not None:  # balance_window.py
        from .balance_window import run_window

        return run_window(args, sizes, samples)
    show = not (args.json or args.no_progress)
    started = time.perf_counter()
    try:
        batches = {
            source: {
                size: [(s.cu_seqlens_q, s.seqlens_kv)
                       for s in (next(ContinuousBatch(source, size, seed=args.seed + i))
                                 for i in range(samples))]
                for size in sizes
            }
            for source in args.sources
        }  # fmt: skip
        cases = len(args.geometries) * len(batches) * len(sizes) * len(args.cost_models)
        with progress(show) as bar:
            task = bar.add_task("balance", total=cases)
            result = balance_study(
                batches, args.geometries, args.cost_models, num_cores=args.cores,
                engine=args.engine, references=REFERENCES if args.reference else (),
                on_case=lambda: bar.advance(task),
            )  # fmt: skip
    except (SourceError, WorkloadError, TilingUnavailableError) as exc:
        raise CliError(str(exc)) from exc
    result = {
        "command": "bench balance", "seed": args.seed, "samples": samples,
        "elapsed_s": round(time.perf_counter() - started, 1), **result,
    }  # fmt: skip
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
