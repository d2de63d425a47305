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

    python tools/soft_cap_errors.py [--cap 50] [--query-scale 30] [--steps 200]
                                    [--triton-steps 12] [--json]

Shapes: 8 query heads, 2 kv heads, head_dim 64, block 16, 8 requests, 32 query rows,
6 cores (splits). Queries are N(0, query_scale^2), keys and values N(0, 1), so scores are
about N(0, query_scale^2): at C = 50 and scale 30 most scores lie beyond C, as the capped
logits of Gemma 2 can.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from pyruntime import backends
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


def run(consumer: str, mode: str, placement: str | None, dtype: torch.dtype, cap: float | None,
        query_scale: float, steps: int, trace) -> dict:
    """One loop; the errors against the float64 reference with and without the cap."""
    backend = backends.get("cpu", num_threads=2, wait_timeout_s=300.0, aicore=consumer)
    extra = {"placement": placement} if placement else {}
    attn = StaticAttention(backend, num_layers=2, num_blocks=NUM_BLOCKS, mode=mode, dtype=dtype,
                           num_cores=6, logits_soft_cap=cap, owns_backend=True, **SHAPES,
                           **extra)
    randomize(attn)
    attn.capture()
    uncapped = [0.0]

    def without_cap(i, batch, outputs):
        for layer, out in enumerate(outputs):
            k, v = attn.kv_caches[layer]
            want = reference_attention(attn.queries[layer], k, v, batch.block_table,
                                       batch.cu_seqlens_q, batch.seqlens_kv,
                                       scale=SHAPES["head_dim"] ** -0.5)
            uncapped[0] = max(uncapped[0], relative_error(out, want))

    batcher = ContinuousBatcher(trace, num_blocks=NUM_BLOCKS, buckets=(4, 8),
                                **{k: SHAPES[k] for k in ("max_batch", "max_tokens",
                                                          "block_size", "max_blocks_per_req")},
                                **MIX)
    start = time.perf_counter()
    stats = run_decode_loop(attn, batcher, steps=steps, query_scale=query_scale,
                            on_step=without_cap if cap is not None else None)
    attn.close()
    return {"consumer": consumer, "mode": mode if placement is None else placement,
            "dtype": str(dtype).removeprefix("torch."), "steps": stats.steps,
            "max_rel_err": stats.max_rel_err, "uncapped_answer_rel_diff": uncapped[0],
            "covered": {"padded": stats.padded_steps, "spec": stats.spec_steps,
                        "prefill": stats.prefill_steps},
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cap", type=float, default=50.0)
    parser.add_argument("--query-scale", type=float, default=30.0)
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
                on = run(consumer, mode, placement, dtype, args.cap, args.query_scale, steps,
                         trace)
                off = run(consumer, mode, placement, dtype, None, args.query_scale, steps,
                          trace)
                on["max_rel_err_cap_off"] = off["max_rel_err"]
                rows.append(on)
                if not args.json:
                    print(f"{consumer:6} {on['mode']:10} {on['dtype']:8} {on['steps']:4} "
                          f"steps  capped {on['max_rel_err']:.2e}  uncapped run "
                          f"{off['max_rel_err']:.2e}  ignoring the cap would be "
                          f"{on['uncapped_answer_rel_diff']:.2f} off", file=sys.stderr)
    report = {"cap": args.cap, "query_scale": args.query_scale, "shapes": SHAPES, "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"| consumer | mode | dtype | steps | max rel. error, C = {args.cap:g} | "
              "same, cap off | uncapped answer's distance |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['consumer']} | {r['mode']} | {r['dtype']} | {r['steps']} | "
                  f"{r['max_rel_err']:.1e} | {r['max_rel_err_cap_off']:.1e} | "
                  f"{r['uncapped_answer_rel_diff']:.2f} |")
        missed = [f"{r['consumer']}/{r['mode']}/{r['dtype']}: {k}" for r in rows
                  for k, n in r["covered"].items() if n == 0]
        print("\nEvery run had padded buckets, speculative decode and chunked prefill steps."
              if not missed else f"\nRuns without some kind of step: {', '.join(missed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
