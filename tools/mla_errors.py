#!/usr/bin/env python3
"""The MLA decode error table: StaticMLAAttention against the float64 absorbed-MLA reference.

For each AI Core consumer (the C reference, the Triton kernel under Triton's interpreter), each
mode (device_tiling with placement graph and pre-replay, host_update) and each storage dtype,
trace-driven step loops run three times on one attention: plain decode (q_len 1) and MTP
speculative decode with q_len 2 and 4. The bundled trace advances 2 trace seconds a step, so the
live batch varies and is padded to buckets 4 and 8 with zero-length slots; each loop first draws
``--skip`` batches (the trace's first ones hold one short request, which no core splits). Every
layer's output of every step is compared with ``pyruntime.workload.mla_reference`` (float64).
Printed per row: the worst relative error (max |out - ref| / max |ref| per step and layer, the
worst of them), the steps run, and how many split a unit (so the combine merged pieces), had
MTP requests, or were padded.

    python tools/variant_errors.py mla [--steps 10] [--triton-steps 2] [--skip 3] [--json]

Shapes: one TP-8 rank of DeepSeek-V3 (16 heads, kv_lora_rank 512, qk_rope_head_dim 64), cache
block 128 (vLLM-Ascend's MLA block), 8 requests, 32 query rows, kv up to 512, 24 cores (the
910B3's cube cores: most steps split units).
Queries and caches are N(0, 1); the softmax scale is 1 / sqrt(192), DeepSeek's
1 / sqrt(qk_nope_head_dim + qk_rope_head_dim) without the YaRN factor. The sweep, the options
and the report are `tools/_variant_errors.py`'s (the shapes above are MLA's own).
"""

from __future__ import annotations

import sys
import time

import _variant_errors as ve
import torch

from pyruntime import backends
from pyruntime.mla_attention import StaticMLAAttention
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.driver import randomize
from pyruntime.workload.mla_reference import run_mla_loop

SHAPES = {"num_heads": 16, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "block_size": 128,
          "max_batch": 8, "max_tokens": 32, "max_blocks_per_req": 4}
NUM_BLOCKS = SHAPES["max_batch"] * SHAPES["max_blocks_per_req"] + 4
SCALE = 192 ** -0.5
SPEC_TOKENS = (1, 2, 4)


def run(consumer: str, mode: str, placement: str | None, dtype: torch.dtype, steps: int,
        trace, skip: int = 3, on_step=None) -> dict:
    """Three loops (q_len 1, 2, 4) on one attention; their worst error and coverage
    (`on_step(i, batch, outputs)` after each step, as `run_mla_loop` calls it)."""
    backend = backends.get("cpu", num_threads=2, wait_timeout_s=600.0, aicore=consumer)
    extra = {"placement": placement} if placement else {}
    start = time.perf_counter()
    row = {"consumer": consumer, "mode": placement or mode,
           "dtype": str(dtype).removeprefix("torch."), "steps": 0, "split_steps": 0,
           "mtp_steps": 0, "padded_steps": 0, "max_rel_err": 0.0}
    with StaticMLAAttention(backend, num_layers=2, num_blocks=NUM_BLOCKS, mode=mode,
                            dtype=dtype, softmax_scale=SCALE, num_cores=24, owns_backend=True,
                            **SHAPES, **extra) as attn:
        randomize(attn)
        attn.capture()
        for spec in SPEC_TOKENS:
            batcher = ContinuousBatcher(trace, num_blocks=NUM_BLOCKS, buckets=(4, 8),
                                        spec_tokens=spec, length_scale=0.2, step_s=2.0,
                                        seed=spec,
                                        **{k: SHAPES[k] for k in ("max_batch", "max_tokens",
                                                                  "block_size",
                                                                  "max_blocks_per_req")})
            for _ in range(skip):  # the trace's first batches hold one short request
                batcher.next_step()
            stats = run_mla_loop(attn, batcher, steps=steps, seed=spec, on_step=on_step)
            row["steps"] += stats.steps
            row["split_steps"] += stats.split_steps
            row["mtp_steps"] += stats.spec_steps
            row["padded_steps"] += stats.padded_steps
            row["max_rel_err"] = max(row["max_rel_err"], stats.max_rel_err)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def add_arguments(parser) -> None:
    ve.add_options(parser, steps=10, triton_steps=2,
                   steps_help="steps per loop for the C consumer (3 loops per row)",
                   triton_help="steps per loop for the Triton consumer (interpreted: slow)")
    parser.add_argument("--skip", type=int, default=3,
                        help="batches drawn before each loop (the trace's first ones hold one "
                             "short request: no split units)")


def table(args) -> int:
    rows = ve.sweep(args, lambda *a: run(*a, args.skip), trace_limit=2000,
                    progress=lambda r: f"{r['max_rel_err']:.2e}  ({r['seconds']} s)")
    header = {"shapes": SHAPES, "scale": SCALE, "spec_tokens": SPEC_TOKENS}
    return ve.report(args, rows, header, [
        ("split-unit steps", lambda r: str(r["split_steps"])),
        ("MTP steps", lambda r: str(r["mtp_steps"])),
        ("padded steps", lambda r: str(r["padded_steps"])),
        ("max rel. error", lambda r: f"{r['max_rel_err']:.1e}"),
    ])


if __name__ == "__main__":  # alone, as before; or: python tools/variant_errors.py mla
    sys.exit(ve.main(sys.modules[__name__]))
