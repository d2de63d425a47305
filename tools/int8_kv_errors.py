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

NZ rows (``layout nz``; one per consumer and dtype, mode graph): the same loop, and at every
step each layer is computed once more by the consumer's op bodies (``step.attention_body`` /
``combine_body`` for C, ``step.attention_triton`` / ``combine_triton`` for Triton) from the NZ
copies of the layer's int8 caches (`kv_quant.to_nz`: vLLM-Ascend's C8 layout ``[num_blocks,
num_kv_heads, head_dim // 32, block_size, 32]``), with the step's tiling. Printed: that
output's worst error against float64 (read from the NZ caches too) and its largest distance
from the ND output of the same step and layer (C: 0, the same fp32 rows).

    python tools/variant_errors.py int8_kv [--offset-sd 15] [--steps 200] [--triton-steps 12]
                                           [--json]

Shapes and loop: `tools/_variant_errors.py` (8 query heads, 2 kv heads, head_dim 64, block 16,
8 requests, 32 query rows, 6 cores: splits). Queries are N(0, 1).
"""

from __future__ import annotations

import math
import sys

import _variant_errors as ve
import numpy as np
import torch

from pyruntime import tiling
from pyruntime.kernels import kv_quant, step
from pyruntime.kernels import reference_attention as ra
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


def nz_output(consumer: str, attn, plan, batch, layer: int) -> torch.Tensor:
    """Layer ``layer`` of this step computed again by ``consumer``'s op bodies from the NZ
    copies of its int8 caches (the tiling ``plan`` of the step)."""
    p, (k, v) = attn.params, attn.kv_caches[layer]
    k, v = kv_quant.to_nz(k), kv_quant.to_nz(v)
    query = attn.queries[layer]
    out = torch.zeros_like(query)
    po, pl = ra.partial_buffers(p)
    k_scale, k_offset, v_scale, v_offset = attn.kv_scales[layer]
    args = {"query": query, "key_cache": k, "value_cache": v,
            "block_table": torch.from_numpy(np.ascontiguousarray(batch.block_table, np.int32)),
            "cu_seqlens_q": torch.from_numpy(np.ascontiguousarray(batch.cu_seqlens_q,
                                                                  np.int32)),
            "seqlens_kv": torch.from_numpy(np.ascontiguousarray(batch.seqlens_kv, np.int32)),
            "step_epoch": torch.tensor([plan.epoch], dtype=torch.int32),
            "tiling_in": torch.from_numpy(plan.buffer), "out": out, "partial_out": po,
            "partial_lse": pl, "params": step.params_list(p), "scale": ve.SCALE,
            "causal": True, "k_scale": k_scale, "k_offset": k_offset, "v_scale": v_scale,
            "v_offset": v_offset}
    combine = {name: args[name] for name in ("cu_seqlens_q", "step_epoch", "tiling_in", "out",
                                             "partial_out", "partial_lse", "params")}
    if consumer == "c":
        for core in range(p.num_cores):
            step.attention_body(core, **args)
        step.combine_body(0, **combine)
    else:
        step.attention_triton(**args)
        step.combine_triton(**combine)
    return out


def run(consumer: str, mode: str, placement: str | None, dtype: torch.dtype, offset_sd: float,
        steps: int, trace, layout: str = kv_quant.ND) -> dict:
    """One loop with int8 caches; its error and the distances of the wrong answers. With
    ``layout`` NZ, also each step's layers from the NZ copies of the caches (`nz_output`)."""
    attn = ve.attention(consumer, mode, placement, dtype, kv_cache_dtype="int8")
    fill(attn, offset_sd)  # after the capture: read at replay
    far, splits = [math.inf, math.inf], [0]
    nz_err, nz_vs_nd = [0.0], [0.0]

    def wrong_answers(i, batch, outputs):
        plan = tiling.plan(attn.params, batch.cu_seqlens_q, batch.seqlens_kv)
        splits[0] += bool(plan.combine_records())
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            k_scale, k_offset, v_scale, v_offset = attn.kv_scales[layer]
            if layout == kv_quant.NZ:
                got = nz_output(consumer, attn, plan, batch, layer)
                want = reference_attention(attn.queries[layer], kv_quant.to_nz(k),
                                           kv_quant.to_nz(v), batch.block_table,
                                           batch.cu_seqlens_q, batch.seqlens_kv,
                                           scale=ve.SCALE, kv_scales=attn.kv_scales[layer])
                nz_err[0] = max(nz_err[0], relative_error(got, want))
                nz_vs_nd[0] = max(nz_vs_nd[0],
                                  relative_error(got, out.detach().double().numpy()))
            one = torch.ones_like(k_scale)
            for j, kv_scales in enumerate(((k_scale, 0 * k_offset, v_scale, 0 * v_offset),
                                           (one, k_offset, one, v_offset))):
                want = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                           batch.cu_seqlens_q, batch.seqlens_kv,
                                           scale=ve.SCALE, kv_scales=kv_scales)
                if want.any():
                    far[j] = min(far[j], relative_error(out, want))

    stats, seconds = ve.loop(attn, trace, steps, on_step=wrong_answers)
    nz = {"nz_max_rel_err": nz_err[0], "nz_vs_nd": nz_vs_nd[0]} if layout == kv_quant.NZ else {}
    return ve.row(consumer, mode, placement, dtype, stats, seconds, layout=layout,
                  split_steps=splits[0], no_offset_min_rel_diff=far[0],
                  no_scale_min_rel_diff=far[1], **nz)


def add_arguments(parser) -> None:
    ve.add_options(parser)
    parser.add_argument("--offset-sd", type=float, default=15.0)


def table(args) -> int:
    rows = ve.sweep(args, lambda *a: run(*a[:4], args.offset_sd, *a[4:]),
                    progress=lambda r: f"{r['max_rel_err']:.2e}  ({r['seconds']} s)")
    # the NZ layout: one mode (the layout changes no mode's work), every consumer and dtype
    rows += ve.sweep(args, lambda *a: run(*a[:4], args.offset_sd, *a[4:],
                                             layout=kv_quant.NZ),
                     modes=(("device_tiling", "graph"),),
                     progress=lambda r: f"NZ {r['nz_max_rel_err']:.2e}, NZ vs ND "
                                        f"{r['nz_vs_nd']:.1e}  ({r['seconds']} s)")
    return ve.report(args, rows, {"offset_sd": args.offset_sd}, [
        ("layout", lambda r: r["layout"].upper()),
        ("steps with split units", lambda r: str(r["split_steps"])),
        ("max rel. error", lambda r: f"{r['max_rel_err']:.1e}"),
        ("NZ max rel. error", lambda r: f"{r['nz_max_rel_err']:.1e}" if "nz_vs_nd" in r
         else "-"),
        ("NZ vs ND (max rel.)", lambda r: f"{r['nz_vs_nd']:.1e}" if "nz_vs_nd" in r else "-"),
        ("no-offset answer's distance (min)", lambda r: f"{r['no_offset_min_rel_diff']:.3f}"),
        ("no-scale answer's distance (min)", lambda r: f"{r['no_scale_min_rel_diff']:.3f}"),
    ])


if __name__ == "__main__":  # alone, as before; or: python tools/variant_errors.py int8_kv
    sys.exit(ve.main(sys.modules[__name__]))
