"""``aicpu-tiling inspect``: the tiling of given lengths.

Lengths come from arguments (``--kv 700,3000,90`` with ``--q 1,1,4``), a file
(``--file``: JSON with ``cu_seqlens_q`` and ``seqlens_kv``, or CSV lines ``q_len,kv_len``)
or a trace step (``--trace-step N --batch B``). Shows the status, per-core load as bars,
segments and splits; ``--png`` draws the per-core load.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

from ..measurement.sources import ContinuousBatch, SourceError
from ..partitioners import Workload, WorkloadError
from ..profiler.renderers.tiling_tables import tiling_tables
from ._common import CliError, add_output_args, emit_json, make_console
from .balance import add_geometry_args, cost_model


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``inspect``."""
    p = sub.add_parser(
        "inspect",
        help="show the tiling of given lengths",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    src = p.add_argument_group("lengths (one of)")
    src.add_argument("--kv", type=_nonneg_list, help="kv lengths, comma-separated")
    src.add_argument("--q", type=_nonneg_list, help="query lengths (default 1 per request)")
    src.add_argument("--file", help="JSON {cu_seqlens_q, seqlens_kv} or CSV q_len,kv_len")
    src.add_argument("--trace-step", type=int, help="step N of a trace continuous batch")
    p.add_argument("--batch", type=int, default=64, help="batch for --trace-step (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-batch", type=int, help="capture bucket batch (default: the batch)")
    p.add_argument("--max-tokens", type=int, help="capture bucket tokens T (default: tokens)")
    p.add_argument("--png", help="write a per-core load chart (needs the plot extra)")
    add_geometry_args(p)
    add_output_args(p)
    p.set_defaults(run=run)
    return p


def _nonneg_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


#: --trace-step prints a progress line to stderr every this many steps it skips
TRACE_PROGRESS_STEPS = 100_000

_FILE_FORMAT = "JSON {\"cu_seqlens_q\": [...], \"seqlens_kv\": [...]} or CSV lines q_len,kv_len"
_HEADER_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_ ]*")


def _read_file(path: str) -> tuple[list[int], list[int]]:
    """``(cu_seqlens_q, seqlens_kv)`` from a lengths file; anything else is a one-line error.

    JSON: an object with integer lists ``cu_seqlens_q`` and ``seqlens_kv``. CSV: one
    ``q_len,kv_len`` line of two integers per request, an optional header line of names
    first, ``#`` comments and blank lines anywhere.

    Raises:
        CliError: unreadable file, or text in neither format (naming the line).
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    if text.lstrip().startswith("{"):
        return _read_json(path, text)
    q, kv = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        fields = [f.strip() for f in raw.split("#")[0].split(",")]
        if fields == [""]:
            continue
        is_header = len(fields) == 2 and all(_HEADER_FIELD.fullmatch(f) for f in fields)
        if is_header and not kv:
            continue  # the header line, e.g. q_len,kv_len
        try:
            if len(fields) != 2:
                raise ValueError
            q.append(int(fields[0]))
            kv.append(int(fields[1]))
        except ValueError:
            raise CliError(f"{path}, line {number}: {raw.strip()[:40]!r} is not two integers "
                           f"q_len,kv_len (expected {_FILE_FORMAT})") from None
    if not kv:
        raise CliError(f"{path}: no q_len,kv_len lines (expected {_FILE_FORMAT})")
    return [0, *np.cumsum(q).tolist()], kv


def _read_json(path: str, text: str) -> tuple[list[int], list[int]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{path} is not JSON: {exc.msg} at line {exc.lineno}") from None
    lists = []
    for key in ("cu_seqlens_q", "seqlens_kv"):
        value = data.get(key) if isinstance(data, dict) else None
        if not isinstance(value, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in value
        ):
            raise CliError(f"{path}: {key} is missing or not a list of integers "
                           f"(expected {_FILE_FORMAT})")
        lists.append(value)
    return lists[0], lists[1]


def lengths(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """``(cu_seqlens_q, seqlens_kv)`` from whichever source the arguments name."""
    chosen = [x is not None for x in (args.kv, args.file, args.trace_step)]
    if sum(chosen) != 1:
        raise CliError("give exactly one of --kv, --file or --trace-step")
    if args.kv is not None:
        q = args.q if args.q is not None else [1] * len(args.kv)
        if len(q) != len(args.kv):
            raise CliError(f"--q has {len(q)} values but --kv has {len(args.kv)}")
        return [0, *np.cumsum(q).tolist()], list(args.kv)
    if args.file is not None:
        return _read_file(args.file)
    if args.trace_step < 0:
        raise CliError(f"--trace-step must be >= 0, got {args.trace_step}")
    try:
        gen = ContinuousBatch("trace", args.batch, seed=args.seed)
        for done in range(args.trace_step):
            if done and done % TRACE_PROGRESS_STEPS == 0:  # about 2 s apart here: not silent
                print(f"inspect: batching the trace, step {done:,} of {args.trace_step:,}",
                      file=sys.stderr)
            next(gen)
        step = next(gen)
    except SourceError as exc:
        raise CliError(str(exc)) from exc
    return step.cu_seqlens_q.tolist(), step.seqlens_kv.tolist()


def describe(tiling, ideal: float | None) -> dict:
    """A plain-data view of a ``pyruntime.tiling.Tiling`` (what ``--json`` prints)."""
    err = tiling.error
    total = tiling.total_cost
    summary = {
        "batch": tiling.batch, "num_tokens": tiling.num_tokens, "num_units": tiling.num_units,
        "num_segments": tiling.num_segments, "num_slots": tiling.num_slots,
        "num_combine": len(tiling.combine_records()), "max_core_cost": tiling.max_core_cost,
        "total_cost": total, "ideal": ideal,
        "ratio": tiling.max_core_cost / ideal if ideal else None,
    }  # fmt: skip
    return {
        "status": tiling.status,
        "error": None if err is None else str(err),
        "params": tiling.params.as_dict(),
        "cu_seqlens_q": [int(x) for x in tiling.cu_seqlens_q],
        "seqlens_kv": [int(x) for x in tiling.seqlens_kv],
        "summary": summary,
        "cores": [
            {
                "begin": list(c.begin),
                "end": list(c.end),
                "first_slot": c.first_slot,
                "last_slot": c.last_slot,
                "num_segments": c.num_segments,
                "cost": c.cost,
            }
            for c in tiling.cores()
        ],
        "combine": [r._asdict() for r in tiling.combine_records()],
        "segments": [s._asdict() for s in tiling.segments()],
    }


def run(args: argparse.Namespace) -> int:
    """Plan the lengths with the kernel and show the tiling; exit 1 when its status is bad."""
    from .. import tiling as tl

    model = cost_model(args)
    cu, kv = lengths(args)
    batch = len(kv)
    max_kv = max(kv, default=1)
    try:
        params = tl.TilingParams(
            num_q_heads=model.num_q_heads, num_kv_heads=model.num_kv_heads, head_dim=128,
            block_size=model.block_size, max_batch=args.max_batch or max(batch, 1),
            max_tokens=args.max_tokens or max(cu[-1] if cu else 1, 1),
            max_blocks_per_req=max(-(-max_kv // model.block_size), 1), num_cores=model.num_cores,
            q_tile=model.q_tile, cost_kv_load=model.cost_kv_load,
            cost_qk_tile=model.cost_qk_tile, cost_segment=model.cost_segment,
        )  # fmt: skip
        tiling = tl.plan(params, cu, kv, causal=True)
    except tl.TilingError as exc:
        raise CliError(str(exc)) from exc
    ideal = None
    if tiling.status == 0:
        try:
            live = tiling.batch  # trailing kv_len 0 slots are padding (tiling ABI v4)
            ideal = Workload(model, cu[: live + 1], kv[:live]).ideal()
        except WorkloadError:
            ideal = None
    view = describe(tiling, ideal)
    if args.png:
        from ..profiler.renderers.plots import PlotUnavailableError, plot_core_load

        try:
            plot_core_load(view, args.png)
        except PlotUnavailableError as exc:
            raise CliError(str(exc)) from exc
    if args.json:
        emit_json(view)
    else:
        console = make_console()
        for item in tiling_tables(view):
            console.print(item)
        if args.png:
            console.print(f"wrote {args.png}")
    return 0 if tiling.status == 0 else 1
