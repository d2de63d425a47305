"""``aicpu-tiling bench balance --window W``: balance under a sliding window (tiling ABI v5).

The same trace batches as ``bench balance``, each a :class:`~pyruntime.partitioners.windowed.
WindowedWorkload`: our kernel plans it with ``sliding_window=W``; FlashInfer is modelled
with ``window_left = W - 1`` (its prefill planner, which chunks only the window, and for
decode batches also its CUDA-core decode planner, which ignores the window and computes whole
chunks under a mask); vLLM-Ascend's FIA v2 sink metadata operator with its band mask
(sparse mode 4, ``pre_tokens = W - 1``, :mod:`pyruntime.partitioners.fia_v2_sink`). Every
figure is the busiest core over the windowed ideal ``W_total / cores + cost_segment`` under
our cost model, mean and worst over the samples.
"""

from __future__ import annotations

import argparse
import time

from rich.table import Table

from ..measurement.sources import ContinuousBatch, SourceError
from ..partitioners import CostModel, TilingUnavailableError, WorkloadError, ours
from ..partitioners.fia_v2_sink import fia_v2_sink_metadata
from ..partitioners.windowed import WindowedWorkload, flashinfer_decode_masked, flashinfer_window
from ..partitioners.workload import Workload
from ..tiling import window_zero_refusal
from ._common import CliError, emit_json, make_console, progress, write_json

BUDGETS = (1, 2, 4)  # CTAs per SM, as the windowless FlashInfer anchors


def _stats(values: list[float]) -> dict:
    return {"mean": round(sum(values) / len(values), 4), "worst": round(max(values), 4)}


def window_case(model: CostModel, steps: list[tuple[list[int], list[int]]], window: int,
                engine: str = "kernel") -> dict:
    """One (geometry, source, batch size) case: every partitioner on every step.

    Returns:
        ``{"ratios": {name: {"mean", "worst"}}, "work_share": float}``, ``work_share`` the
        windowed total cost over the windowless one (mean over the steps). The decode-masked
        FlashInfer variants appear only when every step is a decode batch.
    """
    ratios: dict[str, list[float]] = {}
    shares = []
    for cu, kv in steps:
        workload = WindowedWorkload(model, cu, kv, window)
        shares.append(workload.total_cost / max(Workload(model, cu, kv).total_cost, 1))
        ours_part = ours(workload, engine)
        ours_part.validate()
        ratios.setdefault("ours", []).append(ours_part.balance().ratio)
        for part in (*(flashinfer_window(workload, k) for k in BUDGETS),
                     fia_v2_sink_metadata(workload)):  # fmt: skip
            part.validate()
            ratios.setdefault(part.name, []).append(part.balance().ratio)
        if all(q <= 1 for q in workload.q_lens):
            for k in BUDGETS:
                masked = flashinfer_decode_masked(workload, k)
                ratios.setdefault(masked.name, []).append(masked.ratio)
    decode_only = all(len(v) == len(steps) for v in ratios.values())
    return {"ratios": {n: _stats(v) for n, v in ratios.items() if decode_only or len(v) == len(steps)},
            "work_share": round(sum(shares) / len(shares), 4)}  # fmt: skip


def _table(result: dict) -> Table:
    table = Table(title=f"sliding window {result['window']}: busiest core / windowed ideal, "
                  f"mean/worst of {result['samples']}; work = windowed / full total cost",
                  title_justify="left")  # fmt: skip
    for column in ("geometry", "source", "batch", "work", "partitioner", "mean", "worst"):
        table.add_column(column, justify="left" if column in ("source", "partitioner") else "right")
    for case in result["cases"]:
        first = True
        for name, stats in case["ratios"].items():
            head = (case["geometry"], case["source"], str(case["batch"]),
                    f"{case['work_share']:.3f}") if first else ("", "", "", "")  # fmt: skip
            table.add_row(*head, name, f"{stats['mean']:.4f}", f"{stats['worst']:.4f}")
            first = False
    return table


def run_window(args: argparse.Namespace, sizes: list[int], samples: int) -> int:
    """``bench balance --window W``; the other flags mean what they mean for ``bench balance``."""
    window = args.window
    if window == 0:  # a peer's 0 is a one-key window; no window is no --window
        raise CliError(f"--window must be >= 1 (tokens); {window_zero_refusal('--window')}"
                       " (omit --window for none)")
    if window < 1:
        raise CliError(f"--window must be >= 1 (tokens), got {window}")
    started = time.perf_counter()
    cases = []
    show = not (args.json or args.no_progress)
    try:
        with progress(show) as bar:
            task = bar.add_task("balance (window)",
                                total=len(args.geometries) * len(args.sources) * len(sizes))
            for q_heads, kv_heads in args.geometries:
                model = CostModel(num_q_heads=q_heads, num_kv_heads=kv_heads,
                                  num_cores=args.cores)
                for source in args.sources:
                    for size in sizes:
                        steps = [(s.cu_seqlens_q, s.seqlens_kv)
                                 for s in (next(ContinuousBatch(source, size, seed=args.seed + i))
                                           for i in range(samples))]  # fmt: skip
                        case = window_case(model, steps, window, args.engine)
                        cases.append({"geometry": f"{q_heads}/{kv_heads}", "source": source,
                                      "batch": size, **case})  # fmt: skip
                        bar.advance(task)
    except (SourceError, WorkloadError, TilingUnavailableError) as exc:
        raise CliError(str(exc)) from exc
    losses = [{"geometry": c["geometry"], "source": c["source"], "batch": c["batch"],
               "anchor": n} for c in cases for n, v in c["ratios"].items()
              if n != "ours" and v["mean"] < c["ratios"]["ours"]["mean"]]  # fmt: skip
    result = {"command": "bench balance", "window": window, "seed": args.seed,
              "samples": samples, "elapsed_s": round(time.perf_counter() - started, 1),
              "cases": cases,
              "verdict": {"ours_at_or_below_all": not losses, "losses": losses}}  # fmt: skip
    if args.output:
        write_json(args.output, result)
    if args.json:
        emit_json(result)
    else:
        console = make_console()
        console.print(_table(result))
        console.print(f"ours at or below every FlashInfer variant and the FIA v2 sink "
                      f"metadata split on the mean: {result['verdict']['ours_at_or_below_all']}")
        for loss in result["verdict"]["losses"]:
            console.print(f"  below ours: {loss['anchor']} at {loss['geometry']} "
                          f"{loss['source']} batch {loss['batch']}")
    return 1 if (args.check and losses) else 0
