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

    python tools/sinks_errors.py [--sink-base 3] [--steps 200] [--triton-steps 12] [--json]

Shapes: 8 query heads, 2 kv heads, head_dim 64, block 16, 8 requests, 32 query rows, 6 cores
(splits). Queries, keys and values are N(0, 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch

from pyruntime import backends, tiling
from pyruntime.attention import StaticAttention
from pyruntime.kernels import triton_launch
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.driver import randomize, run_decode_loop
from pyruntime.workload.reference import reference_attention, relative_error
from pyruntime.workload.trace import load_trace

SHAPES = {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "block_size": 16,
          "max_batch": 8, "max_tokens": 32, "max_blocks_per_req": 16}
NUM_BLOCKS = SHAPES["max_batch"] * SHAPES["max_blocks_per_req"] + 8
MIX = {"spec_tokens": 3, "prefill_chunk": 8, "length_scale": 0.15, "step_s": 0.05}
MODES = (("device_tiling", "graph"), ("device_tiling", "pre-replay"), ("host_update", None))
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def run(consumer: str, mode: str, placement: str | None, dtype: torch.dtype, sink_base: float,
        steps: int, trace) -> dict:
    """One loop with sinks; its error and the distances of the wrong answers."""
    backend = backends.get("cpu", num_threads=2, wait_timeout_s=300.0, aicore=consumer)
    extra = {"placement": placement} if placement else {}
    attn = StaticAttention(backend, num_layers=2, num_blocks=NUM_BLOCKS, mode=mode, dtype=dtype,
                           num_cores=6, sinks=True, owns_backend=True, **SHAPES, **extra)
    randomize(attn)
    attn.capture()
    for layer, sink in enumerate(attn.sinks):  # after the capture: read at replay
        heads = torch.arange(sink.numel(), dtype=torch.float32)
        sink.copy_(sink_base + 0.3 * heads + 0.2 * layer)
    scale, far, splits = SHAPES["head_dim"] ** -0.5, [math.inf, math.inf], [0]

    def wrong_answers(i, batch, outputs):
        plan = tiling.plan(attn.params, batch.cu_seqlens_q, batch.seqlens_kv)
        splits[0] += bool(plan.combine_records())
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            for j, sinks in enumerate((None, attn.sinks[layer] + math.log(2.0))):
                want = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                           batch.cu_seqlens_q, batch.seqlens_kv, scale=scale,
                                           sinks=sinks)
                if want.any():
                    far[j] = min(far[j], relative_error(out, want))

    batcher = ContinuousBatcher(trace, num_blocks=NUM_BLOCKS, buckets=(4, 8),
                                **{k: SHAPES[k] for k in ("max_batch", "max_tokens",
                                                          "block_size", "max_blocks_per_req")},
                                **MIX)
    start = time.perf_counter()
    stats = run_decode_loop(attn, batcher, steps=steps, on_step=wrong_answers)
    attn.close()
    return {"consumer": consumer, "mode": mode if placement is None else placement,
            "dtype": str(dtype).removeprefix("torch."), "steps": stats.steps,
            "split_steps": splits[0], "max_rel_err": stats.max_rel_err,
            "no_sinks_min_rel_diff": far[0], "sinks_twice_min_rel_diff": far[1],
            "covered": {"padded": stats.padded_steps, "spec": stats.spec_steps,
                        "prefill": stats.prefill_steps},
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sink-base", type=float, default=3.0)
    parser.add_argument("--steps", type=int, default=200, help="steps per C-consumer run")
    parser.add_argument("--triton-steps", type=int, default=12,
                        help="steps per Triton run (interpreted: about 0.15 s a step)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    trace = load_trace(limit=3000)
    consumers = ["c"] + (["triton"] if triton_launch.available() is None else [])
    rows = []
    for consumer in consumers:
        steps = args.steps if consumer == "c" else args.triton_steps
        for mode, placement in MODES:
            for dtype in DTYPES:
                row = run(consumer, mode, placement, dtype, args.sink_base, steps, trace)
                rows.append(row)
                if not args.json:
                    print(f"{consumer:6} {row['mode']:10} {row['dtype']:8} {row['steps']:4} "
                          f"steps  {row['max_rel_err']:.2e}  ({row['seconds']} s)",
                          file=sys.stderr)
    report = {"sink_base": args.sink_base, "shapes": SHAPES, "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print("| consumer | mode | dtype | steps | steps with split units | max rel. error | "
              "no-sinks answer's distance (min) | sinks-twice answer's distance (min) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['consumer']} | {r['mode']} | {r['dtype']} | {r['steps']} | "
                  f"{r['split_steps']} | {r['max_rel_err']:.1e} | "
                  f"{r['no_sinks_min_rel_diff']:.3f} | {r['sinks_twice_min_rel_diff']:.3f} |")
        missed = [f"{r['consumer']}/{r['mode']}/{r['dtype']}: {k}" for r in rows
                  for k, n in r["covered"].items() if n == 0]
        print("\nEvery run had padded buckets, speculative decode and chunked prefill steps."
              if not missed else f"\nRuns without some kind of step: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
