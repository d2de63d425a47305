#!/usr/bin/env python3
"""The sliding window's error table: StaticAttention(sliding_window=W) against float64.

For each AI Core consumer (the C reference attention, the Triton kernels under Triton's
interpreter), each mode (device_tiling with placement graph and pre-replay, host_update) and
each storage dtype, a trace-driven decode loop (bundled trace: decode, speculative decode,
chunked prefill, padded buckets with zero-length slots) runs with the window, and every
layer's output of every step is compared with ``pyruntime.workload.reference`` (float64,
``sliding_window=W``: the query at position p sees p - W < j <= p). Today's tiling knows no
window, so split units leave pieces with no block in it, which the combine must merge. Printed
per row: the steps whose tiling split a unit, the steps where the window cuts some context
(kv_len > W), the worst relative error (max |out - ref| / max |ref| per step and layer, the
worst of them), and, over the steps where the window cuts a context, the smallest distance of
two wrong float64 answers: without the window, and with FIA's band ``pre_tokens = W`` (the
W + 1 keys [p - W, p] that vLLM-Ascend's host path asks FIA for).

    python tools/variant_errors.py window [--window 24] [--sinks] [--steps 200]
                                          [--triton-steps 12] [--json]

``--sinks`` adds attention sinks (``2 + 0.3 h + 0.2 layer``), gpt-oss's windowed layers.
Shapes and loop: `tools/_variant_errors.py` (8 query heads, 2 kv heads, head_dim 64, block 16,
8 requests, 32 query rows, 6 cores: splits). Queries, keys and values are N(0, 1).
"""

from __future__ import annotations

import math
import sys

import _variant_errors as ve
import torch

from pyruntime import tiling
from pyruntime.workload.reference import reference_attention, relative_error


def run(consumer: str, mode: str, placement: str | None, dtype: torch.dtype, window: int,
        sinks: bool, steps: int, trace) -> dict:
    """One loop with the window; its error and the distances of the wrong answers."""
    attn = ve.attention(consumer, mode, placement, dtype, sliding_window=window, sinks=sinks)
    for layer, sink in enumerate(attn.sinks or []):  # after the capture: read at replay
        sink.copy_(2.0 + 0.3 * torch.arange(sink.numel(), dtype=torch.float32) + 0.2 * layer)
    far, counts = [math.inf, math.inf], {"split": 0, "cut": 0}

    def wrong_answers(i, batch, outputs):
        plan = tiling.plan(attn.params, batch.cu_seqlens_q, batch.seqlens_kv)
        counts["split"] += bool(plan.combine_records())
        if not (batch.seqlens_kv > window).any():
            return
        counts["cut"] += 1
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            args = (attn.queries[layer], k, v, batch.block_table, batch.cu_seqlens_q,
                    batch.seqlens_kv)
            layer_sinks = attn.sinks[layer] if sinks else None
            for j, band in enumerate((None, (window, 0))):
                want = reference_attention(*args, scale=ve.SCALE, band=band, sinks=layer_sinks)
                far[j] = min(far[j], relative_error(out, want))

    stats, seconds = ve.loop(attn, trace, steps, on_step=wrong_answers)
    return ve.row(consumer, mode, placement, dtype, stats, seconds, split_steps=counts["split"],
                  cut_steps=counts["cut"], unwindowed_min_rel_diff=far[0],
                  fia_band_min_rel_diff=far[1])


def add_arguments(parser) -> None:
    ve.add_options(parser)
    parser.add_argument("--window", type=int, default=24)
    parser.add_argument("--sinks", action="store_true")


def table(args) -> int:
    rows = ve.sweep(args, lambda *a: run(*a[:4], args.window, args.sinks, *a[4:]),
                    progress=lambda r: f"{r['max_rel_err']:.2e}  ({r['seconds']} s)")
    return ve.report(args, rows, {"window": args.window, "sinks": args.sinks}, [
        ("steps with split units", lambda r: str(r["split_steps"])),
        ("steps the window cuts", lambda r: str(r["cut_steps"])),
        ("max rel. error", lambda r: f"{r['max_rel_err']:.1e}"),
        ("unwindowed answer's distance (min)", lambda r: f"{r['unwindowed_min_rel_diff']:.3f}"),
        ("FIA band (W + 1 keys) answer's distance (min)",
         lambda r: f"{r['fia_band_min_rel_diff']:.3f}"),
    ])


if __name__ == "__main__":  # alone, as before; or: python tools/variant_errors.py window
    sys.exit(ve.main(sys.modules[__name__]))
