#!/usr/bin/env python3
"""The int8 KV cache's error table: StaticAttention(kv_cache_dtype="int8") against float64.

For each AI Core consumer (the C reference attention, the Triton kernels under Triton's
interpreter), each mode (device_tiling with placement graph and pre-replay, host_update) and
each query dtype, a trace-driven decode loop (bundled trace: decode, speculative decode,
chunked prefill, padded buckets with zero-length slots) runs with int8 caches, and every
layer's output of every step is compared with ``pyruntime.workload.reference`` (float64 of
the dequantised caches, ``(x - offset) * scale``). The scales and offsets are filled after the
capture (``attn.kv_scales[layer][i].copy_``): scales uniform in [0.04, 0.08], offsets
N(0, offset_sd^2) per channel, then K and V (N(0, 1)) are quantised into the caches by
vLLM-Ascend's rule (`pyruntime.kernels.kv_quant.quantize`). Printed per row: the worst
relative error (max |out - ref| / max |ref| per step and layer, the worst of them), the steps
whose tiling split a unit, and the smallest distance, over every step and layer, of the float64
answers that ignore the offsets (scale-only dequantisation) and that ignore the scales (what a
consumer making either mistake would show at its best step).

    python tools/int8_kv_errors.py [--offset-sd 15] [--steps 200] [--triton-steps 12] [--json]

Shapes and loop: `tools/_variant_errors.py` (8 query heads, 2 kv heads, head_dim 64, block 16,
8 requests, 32 query rows, 6 cores: splits). Queries are N(0, 1).
"""

from __future__ import annotations

import math
import sys

import _variant_errors as ve
import torch

from pyruntime import tiling
from pyruntime.workload.driver import randomize
from pyruntime.workload.reference import reference_attention, relative_error


def fill(attn, offset_sd: float) -> None:
    """Per-channel scales and offsets, then K and V quantised with them."""
    gen = torch.Generator().manual_seed(7)
    for k_scale, k_offset, v_scale, v_offset in attn.kv_scales:
        for scale, offset in ((k_scale, k_offset), (v_scale, v_offset)):
            scale.copy_(torch.rand(scale.shape, generator=gen) * 0.04 + 0.04)
            offset.copy_(torch.randn(offset.shape, generator=gen) * offset_sd)
    randomize(attn, seed=1)


def run(consumer: str, mode: str, placement: str | None, dtype: torch.dtype, offset_sd: float,
        steps: int, trace) -> dict:
    """One loop with int8 caches; its error and the distances of the wrong answers."""
    attn = ve.attention(consumer, mode, placement, dtype, kv_cache_dtype="int8")
    fill(attn, offset_sd)  # after the capture: read at replay
    far, splits = [math.inf, math.inf], [0]

    def wrong_answers(i, batch, outputs):
        plan = tiling.plan(attn.params, batch.cu_seqlens_q, batch.seqlens_kv)
        splits[0] += bool(plan.combine_records())
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            k_scale, k_offset, v_scale, v_offset = attn.kv_scales[layer]
            one = torch.ones_like(k_scale)
            for j, kv_scales in enumerate(((k_scale, 0 * k_offset, v_scale, 0 * v_offset),
                                           (one, k_offset, one, v_offset))):
                want = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                           batch.cu_seqlens_q, batch.seqlens_kv,
                                           scale=ve.SCALE, kv_scales=kv_scales)
                if want.any():
                    far[j] = min(far[j], relative_error(out, want))

    stats, seconds = ve.loop(attn, trace, steps, on_step=wrong_answers)
    return ve.row(consumer, mode, placement, dtype, stats, seconds, split_steps=splits[0],
                  no_offset_min_rel_diff=far[0], no_scale_min_rel_diff=far[1])


def main(argv: list[str] | None = None) -> int:
    parser = ve.parser(__doc__)
    parser.add_argument("--offset-sd", type=float, default=15.0)
    args = parser.parse_args(argv)
    rows = ve.sweep(args, lambda *a: run(*a[:4], args.offset_sd, *a[4:]),
                    progress=lambda r: f"{r['max_rel_err']:.2e}  ({r['seconds']} s)")
    return ve.report(args, rows, {"offset_sd": args.offset_sd}, [
        ("steps with split units", lambda r: str(r["split_steps"])),
        ("max rel. error", lambda r: f"{r['max_rel_err']:.1e}"),
        ("no-offset answer's distance (min)", lambda r: f"{r['no_offset_min_rel_diff']:.3f}"),
        ("no-scale answer's distance (min)", lambda r: f"{r['no_scale_min_rel_diff']:.3f}"),
    ])


if __name__ == "__main__":
    sys.exit(main())
