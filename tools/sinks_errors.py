#!/usr/bin/env python3
"""The attention sinks' error table: StaticAttention(sinks=True) against the float64 reference.

For each AI Core consumer (the C reference attention, the Triton kernels under Triton's
interpreter), each mode (device_tiling with placement graph and pre-replay, host_update) and
each storage dtype, a trace-driven decode loop (bundled trace: decode, speculative decode,
chunked prefill, padded buckets with zero-length slots) runs with sinks, and every layer's
output of every step is compared with ``pyruntime.workload.reference`` (float64, each sink
counted once). The sinks are filled after the capture (``attn.sinks[layer].copy_``): q head
h of layer l gets ``sink_base + 0.3 h + 0.2 l``. Printed per row: the worst relative error
(max |out - ref| / max |ref| per step and layer, the worst of them), the steps whose tiling
split a unit (so the combine added the sink), and the smallest distance, over every step and
layer, of the float64 answers without the sinks and with each sink counted twice (what a
consumer that dropped the sink, or added it in both the attention and the combine, would
show at its best step).

    python tools/variant_errors.py sinks [--sink-base 3] [--steps 200] [--triton-steps 12]
                                         [--json]

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


def run(consumer: str, mode: str, placement: str | None, dtype: torch.dtype, sink_base: float,
        steps: int, trace) -> dict:
    """One loop with sinks; its error and the distances of the wrong answers."""
    attn = ve.attention(consumer, mode, placement, dtype, sinks=True)
    for layer, sink in enumerate(attn.sinks):  # after the capture: read at replay
        heads = torch.arange(sink.numel(), dtype=torch.float32)
        sink.copy_(sink_base + 0.3 * heads + 0.2 * layer)
    far, splits = [math.inf, math.inf], [0]

    def wrong_answers(i, batch, outputs):
        plan = tiling.plan(attn.params, batch.cu_seqlens_q, batch.seqlens_kv)
        splits[0] += bool(plan.combine_records())
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            for j, sinks in enumerate((None, attn.sinks[layer] + math.log(2.0))):
                want = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                           batch.cu_seqlens_q, batch.seqlens_kv,
                                           scale=ve.SCALE, sinks=sinks)
                if want.any():
                    far[j] = min(far[j], relative_error(out, want))

    stats, seconds = ve.loop(attn, trace, steps, on_step=wrong_answers)
    return ve.row(consumer, mode, placement, dtype, stats, seconds, split_steps=splits[0],
                  no_sinks_min_rel_diff=far[0], sinks_twice_min_rel_diff=far[1])


def add_arguments(parser) -> None:
    ve.add_options(parser)
    parser.add_argument("--sink-base", type=float, default=3.0)


def table(args) -> int:
    rows = ve.sweep(args, lambda *a: run(*a[:4], args.sink_base, *a[4:]),
                    progress=lambda r: f"{r['max_rel_err']:.2e}  ({r['seconds']} s)")
    return ve.report(args, rows, {"sink_base": args.sink_base}, [
        ("steps with split units", lambda r: str(r["split_steps"])),
        ("max rel. error", lambda r: f"{r['max_rel_err']:.1e}"),
        ("no-sinks answer's distance (min)", lambda r: f"{r['no_sinks_min_rel_diff']:.3f}"),
        ("sinks-twice answer's distance (min)",
         lambda r: f"{r['sinks_twice_min_rel_diff']:.3f}"),
    ])


if __name__ == "__main__":  # alone, as before; or: python tools/variant_errors.py sinks
    sys.exit(ve.main(sys.modules[__name__]))
