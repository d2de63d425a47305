"""``aicpu-tiling bench balance``: our tiling against faithful models of the anchors' splits.

Every partitioner splits the same trace batches (continuous batching over the Azure
conversation trace: decode, speculative decode, chunked prefill) for the same cores, for
each head geometry, and is charged by two cost models: ours (``aicpu_tiling.h``) and FIA V3's
own block cost written in our kernel's weights. The report gives busiest-core cost over the
ideal (``W / cores + cost_segment``) for every anchor variant.

``--geometry deepseek-v3`` runs the study at MLA geometry instead: absorbed MLA decode, one
latent kv head with a 576-wide key row, 128, 64, 32 and 16 q heads per rank (TP 1, 2, 4, 8),
decode and MTP steps (``--q-lens``, default 1-4 query tokens per request) from the trace,
against FlashMLA's m-block grid and FIA's MLA split, under the MLA cost models
(``pyruntime.partitioners.study``).
"""

from __future__ import annotations

import argparse
import time

from ..measurement.sources import SOURCES as ALL_SOURCES
from ..measurement.sources import ContinuousBatch, SourceError
from ..partitioners import CostModel, TilingUnavailableError, WorkloadError
from ..partitioners.study import (
    COST_MODELS,
    GEOMETRIES,
    MLA_COST_MODELS,
    MLA_PRESETS,
    MLA_Q_LENS,
    REFERENCES,
    SOURCES,
    balance_study,
    mla_balance_study,
    mla_cost_table,
)
from ..profiler.renderers.balance_tables import balance_tables
from ._common import (
    CliError,
    add_force_arg,
    add_output_args,
    check_outputs,
    comma_choices,
    emit_json,
    make_console,
    progress,
    write_json,
)

DEFAULT_SIZES = (16, 64, 256, 1024)
QUICK_SIZES = (16, 64)
DEFAULT_SAMPLES = 4
_ALL_COST_MODELS = tuple(dict.fromkeys((*COST_MODELS, *MLA_COST_MODELS, "mla_runtime")))  # GQA, MLA


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
    p.add_argument("--sources", type=comma_choices(tuple(ALL_SOURCES), "source"), default=None,
                   help="length sources (default trace,spec-decode,chunked-prefill)")
    p.add_argument("--geometries", type=_geometries, default=None,
                   help="query/kv head pairs (default 16/1,32/8,64/8)")
    p.add_argument("--cost-models", type=comma_choices(_ALL_COST_MODELS, "cost model"), default=None,
                   help="cost models to score with (default ours,fia_v3; with --geometry "
                        "mla,fia_mla, and ours for the GQA weights)")
    m = p.add_argument_group("MLA geometry")
    m.add_argument("--geometry", choices=tuple(MLA_PRESETS), default=None,
                   help="run at this model's absorbed-MLA geometry (one latent kv head, "
                        "head_dim kv_lora_rank + rope) instead of --geometries")
    m.add_argument("--heads", type=_int_list, default=None,
                   help="with --geometry: q heads per rank (default the model's: 128,64,32,16)")
    m.add_argument("--q-lens", type=_int_list, default=None,
                   help="with --geometry: query tokens per request, 1 = decode, 2-4 = MTP "
                        f"(default {','.join(map(str, MLA_Q_LENS))})")
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
    p.add_argument("-o", "--output", help="also write the JSON result to this file (an "
                                           "existing file is refused unless --force)")
    add_force_arg(p)
    p.add_argument("--window", type=int, default=None,
                   help="sliding window W in tokens, the model's W keys (>= 1; FlashInfer's "
                        "window_left + 1; omit for none): ours (tiling ABI v5) against "
                        "FlashInfer with window_left = W - 1 and the FIA v2 sink metadata "
                        "split with its band mask, over the windowed ideal")
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
    check_outputs({"-o": args.output}, force=args.force)
    if args.geometry is not None:
        return _run_mla(args, samples, sizes)
    for flag, value in (("--heads", args.heads), ("--q-lens", args.q_lens)):
        if value is not None:
            raise CliError(f"{flag} needs --geometry (an MLA geometry)")
    args.sources = args.sources or list(SOURCES)
    args.geometries = args.geometries or list(GEOMETRIES)
    args.cost_models = args.cost_models or list(COST_MODELS)
    bad = [n for n in args.cost_models if n not in COST_MODELS]
    if bad:
        raise CliError(f"cost model {', '.join(bad)} is for --geometry (MLA); "
                       f"choose from {', '.join(COST_MODELS)}")  # fmt: skip
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
    return _report(args, result)


def _report(args: argparse.Namespace, result: dict) -> int:
    if args.output:
        write_json(args.output, result, force=args.force)
    if args.json:
        emit_json(result)
    else:
        console = make_console()
        for item in balance_tables(result):
            console.print(item)
    ok = result["verdict"]["ours_at_or_below_all"]
    return 1 if (args.check and not ok) else 0


# ---------------------------------------------------------------- MLA geometry (issue 20)


class _DraftBatch(ContinuousBatch):
    """The ``spec-decode`` source with ``q_len`` query tokens per request (MTP: ``q_len - 1``
    draft tokens, all accepted), or the ``trace`` decode source when ``q_len`` is 1."""

    def __init__(self, batch: int, q_len: int, seed: int) -> None:
        self.SPEC_TOKENS = q_len  # read by ContinuousBatch.__init__ for "spec-decode"
        super().__init__("trace" if q_len == 1 else "spec-decode", batch, seed=seed)


def mla_source_label(q_len: int) -> str:
    """``"decode"`` for one query token per request, ``"mtp<q_len>"`` otherwise."""
    return "decode" if q_len == 1 else f"mtp{q_len}"


def _run_mla(args: argparse.Namespace, samples: int, sizes: list[int]) -> int:
    """``bench balance --geometry <model>``: the study at absorbed-MLA geometry."""
    given = [flag for flag, value in (("--geometries", args.geometries), ("--sources", args.sources),
                                      ("--reference", args.reference)) if value]  # fmt: skip
    if given:
        raise CliError(f"{', '.join(given)} cannot be combined with --geometry "
                       "(use --heads and --q-lens)")  # fmt: skip
    table = mla_cost_table()
    cost_models = args.cost_models or list(MLA_COST_MODELS)
    bad = [n for n in cost_models if n not in table]
    if bad:
        raise CliError(f"cost model {', '.join(bad)} is not an MLA cost model; "
                       f"choose from {', '.join(table)}")  # fmt: skip
    q_lens = args.q_lens or list(MLA_Q_LENS)
    heads = args.heads or list(MLA_PRESETS[args.geometry]["heads"])
    try:  # head counts past the kernel's limits are the user's error, not a traceback
        from ..tiling import TilingParamsError
    except ImportError:  # no extension: the study raises TilingUnavailableError itself
        TilingParamsError = TilingUnavailableError
    show = not (args.json or args.no_progress)
    started = time.perf_counter()
    try:
        batches = {
            mla_source_label(q): {
                size: [(s.cu_seqlens_q, s.seqlens_kv)
                       for s in (next(_DraftBatch(size, q, args.seed + i)) for i in range(samples))]
                for size in sizes
            }
            for q in dict.fromkeys(q_lens)
        }  # fmt: skip
        cases = len(heads) * len(batches) * len(sizes) * len(cost_models)
        with progress(show) as bar:
            task = bar.add_task("balance (MLA)", total=cases)
            result = mla_balance_study(
                batches, args.geometry, cost_models, heads=heads, num_cores=args.cores,
                engine=args.engine, on_case=lambda: bar.advance(task),
            )  # fmt: skip
    except (SourceError, WorkloadError, TilingUnavailableError, TilingParamsError) as exc:
        raise CliError(str(exc)) from exc
    result = {
        "command": "bench balance", "geometry": args.geometry, "seed": args.seed,
        "samples": samples, "q_lens": list(dict.fromkeys(q_lens)),
        "elapsed_s": round(time.perf_counter() - started, 1), **result,
    }  # fmt: skip
    return _report(args, result)
