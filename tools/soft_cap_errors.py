#!/usr/bin/env python3
"""The logits soft cap's error table: StaticAttention against the float64 reference.

For each AI Core consumer (the C reference attention, the Triton kernels under Triton's
interpreter), each mode (device_tiling with placement graph and pre-replay, host_update) and
each storage dtype, a trace-driven decode loop (bundled trace: decode, speculative decode,
chunked prefill, padded buckets with zero-length slots) runs with the cap on, and every
layer's output of every step is compared with ``pyruntime.workload.reference`` (float64, the
same cap). Printed per row: the worst relative error (max |out - ref| / max |ref| per step and
layer, the worst of them), the same with the cap off (same inputs), and how far the uncapped
float64 answer is from the capped one (what a consumer that ignored the cap would show).

    python tools/variant_errors.py soft_cap [--cap 50] [--query-scale 30] [--steps 200]
                                            [--triton-steps 12] [--json]

Shapes and loop: `tools/_variant_errors.py` (8 query heads, 2 kv heads, head_dim 64, block 16,
8 requests, 32 query rows, 6 cores: splits). Queries are N(0, query_scale^2), keys and values N(0, 1), so scores are
about N(0, query_scale^2): at C = 50 and scale 30 most scores lie beyond C, as the capped
logits of Gemma 2 can.
"""

from __future__ import annotations

import sys

import _variant_errors as ve
import torch

from pyruntime.workload.reference import reference_attention, relative_error


def run(consumer: str, mode: str, placement: str | None, dtype: torch.dtype, cap: float | None,
        query_scale: float, steps: int, trace) -> dict:
    """One loop; the errors against the float64 reference with and without the cap."""
    attn = ve.attention(consumer, mode, placement, dtype, logits_soft_cap=cap)
    uncapped = [0.0]

    def without_cap(i, batch, outputs):
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            want = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                       batch.cu_seqlens_q, batch.seqlens_kv, scale=ve.SCALE)
            uncapped[0] = max(uncapped[0], relative_error(out, want))

    stats, seconds = ve.loop(attn, trace, steps, query_scale=query_scale,
                             on_step=without_cap if cap is not None else None)
    return ve.row(consumer, mode, placement, dtype, stats, seconds,
                  uncapped_answer_rel_diff=uncapped[0])


def add_arguments(parser) -> None:
    ve.add_options(parser)
    parser.add_argument("--cap", type=float, default=50.0)
    parser.add_argument("--query-scale", type=float, default=30.0)


def table(args) -> int:

    def both(consumer, mode, placement, dtype, steps, trace):
        on = run(consumer, mode, placement, dtype, args.cap, args.query_scale, steps, trace)
        off = run(consumer, mode, placement, dtype, None, args.query_scale, steps, trace)
        on["max_rel_err_cap_off"] = off["max_rel_err"]
        return on

    rows = ve.sweep(args, both, progress=lambda r: (
        f"capped {r['max_rel_err']:.2e}  uncapped run {r['max_rel_err_cap_off']:.2e}  "
        f"ignoring the cap would be {r['uncapped_answer_rel_diff']:.2f} off"))
    return ve.report(args, rows, {"cap": args.cap, "query_scale": args.query_scale}, [
        (f"max rel. error, C = {args.cap:g}", lambda r: f"{r['max_rel_err']:.1e}"),
        ("same, cap off", lambda r: f"{r['max_rel_err_cap_off']:.1e}"),
        ("uncapped answer's distance", lambda r: f"{r['uncapped_answer_rel_diff']:.2f}"),
    ])


if __name__ == "__main__":  # alone, as before; or: python tools/variant_errors.py soft_cap
    sys.exit(ve.main(sys.modules[__name__]))
