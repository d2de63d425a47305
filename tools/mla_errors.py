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

    python tools/mla_errors.py [--steps 10] [--triton-steps 2] [--skip 3] [--json]

Shapes: one TP-8 rank of DeepSeek-V3 (16 heads, kv_lora_rank 512, qk_rope_head_dim 64), cache
block 128 (vLLM-Ascend's MLA block), 8 requests, 32 query rows, kv up to 512, 24 cores (the
910B3's cube cores: most steps split units).
Queries and caches are N(0, 1); the softmax scale is 1 / sqrt(192), DeepSeek's
1 / sqrt(qk_nope_head_dim + qk_rope_head_dim) without the YaRN factor.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from pyruntime import backends
from pyruntime.kernels import triton_launch
from pyruntime.mla_attention import StaticMLAAttention
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.driver import randomize
from pyruntime.workload.mla_reference import run_mla_loop
from pyruntime.workload.trace import load_trace

SHAPES = {"num_heads": 16, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "block_size": 128,
          "max_batch": 8, "max_tokens": 32, "max_blocks_per_req": 4}
NUM_BLOCKS = SHAPES["max_batch"] * SHAPES["max_blocks_per_req"] + 4
SCALE = 192 ** -0.5
MODES = (("device_tiling", "graph"), ("device_tiling", "pre-replay"), ("host_update", None))
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SPEC_TOKENS = (1, 2, 4)


def run(consumer: str, mode: str, placement: str | None, dtype: torch.dtype, steps: int,
        trace, skip: int = 3) -> dict:
    """Three loops (q_len 1, 2, 4) on one attention; their worst error and coverage."""
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
            stats = run_mla_loop(attn, batcher, steps=steps, seed=spec)
            row["steps"] += stats.steps
            row["split_steps"] += stats.split_steps
            row["mtp_steps"] += stats.spec_steps
            row["padded_steps"] += stats.padded_steps
            row["max_rel_err"] = max(row["max_rel_err"], stats.max_rel_err)
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10,
                        help="steps per loop for the C consumer (3 loops per row)")
    parser.add_argument("--triton-steps", type=int, default=2,
                        help="steps per loop for the Triton consumer (interpreted: slow)")
    parser.add_argument("--skip", type=int, default=3,
                        help="batches drawn before each loop (the trace's first ones hold one "
                             "short request: no split units)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    trace = load_trace(limit=2000)
    consumers = ["c"] + (["triton"] if triton_launch.available() is None else [])
    rows = []
    for consumer in consumers:
        steps = args.steps if consumer == "c" else args.triton_steps
        for mode, placement in MODES:
            for dtype in DTYPES:
                row = run(consumer, mode, placement, dtype, steps, trace, args.skip)
                rows.append(row)
                if not args.json:
                    print(f"{consumer:6} {row['mode']:11} {row['dtype']:8} {row['steps']:3} "
                          f"steps  {row['max_rel_err']:.2e}  ({row['seconds']} s)",
                          file=sys.stderr)
    report = {"shapes": SHAPES, "scale": SCALE, "spec_tokens": SPEC_TOKENS, "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print("| consumer | mode | dtype | steps | split-unit steps | MTP steps | padded steps | "
          "max rel. error |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['consumer']} | {r['mode']} | {r['dtype']} | {r['steps']} | "
              f"{r['split_steps']} | {r['mtp_steps']} | {r['padded_steps']} | "
              f"{r['max_rel_err']:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
