#!/usr/bin/env python3
"""Headline benchmark: host time per decode step, host_update over device_tiling.

Both modes run side by side in one process on the same trace-driven batches (continuous
batching from the Azure conversation trace, batch padded to vLLM-style buckets), one
step each in turn. Host time is `StaticAttention.last_step_host_seconds` (copies, replay,
updates; not the wait for results). Also prints device_tiling's host time at 1 and 64
layers (it should be flat).

    python tools/bench_headline.py                     # L = 61, batch 64
    python tools/bench_headline.py --layers 20 --steps 100 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyruntime import backends
from pyruntime.attention import StaticAttention
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.driver import randomize
from pyruntime.workload.trace import load_trace

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
# small heads keep the emulated device work light; the host work does not depend on them
SHAPES = {"num_q_heads": 8, "num_kv_heads": 1, "head_dim": 16, "block_size": 16,
          "max_blocks_per_req": 64}


def build(backend, mode: str, layers: int, batch: int) -> StaticAttention:
    attn = StaticAttention(backend, num_layers=layers, num_blocks=batch * 64 + 64,
                           max_batch=batch, max_tokens=batch, mode=mode,
                           dtype=torch.bfloat16, num_cores=24, **SHAPES)
    randomize(attn)
    attn.capture()
    return attn


def batches(batch: int, count: int, seed: int):
    batcher = ContinuousBatcher(load_trace(limit=5000), max_batch=batch, max_tokens=batch,
                                block_size=SHAPES["block_size"],
                                max_blocks_per_req=SHAPES["max_blocks_per_req"],
                                num_blocks=batch * 64 + 64, buckets=BUCKETS,
                                length_scale=0.25, seed=seed)
    return [b for _, b in zip(range(count), batcher)]


def host_times(attns: dict[str, StaticAttention], steps, warmup: int) -> dict[str, float]:
    times: dict[str, list[float]] = {mode: [] for mode in attns}
    for i, b in enumerate(steps):
        for mode, attn in attns.items():
            attn.step(b.block_table, b.cu_seqlens_q, b.seqlens_kv)
            attn.check()
            if i >= warmup:
                times[mode].append(attn.last_step_host_seconds)
    return {mode: statistics.median(t) for mode, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    steps = batches(args.batch, args.steps + args.warmup, seed=0)
    backend = backends.get("cpu")
    modes = ("host_update", "device_tiling")
    medians = host_times({m: build(backend, m, args.layers, args.batch) for m in modes},
                         steps, args.warmup)
    flat = host_times({f"L={n}": build(backend, "device_tiling", n, args.batch)
                       for n in (1, 64)}, steps, args.warmup)
    backend.close()
    live = statistics.median(b.live for b in steps)
    result = {
        "layers": args.layers, "batch": args.batch, "median_live_requests": live,
        "steps_measured": args.steps,
        "host_update_us": medians["host_update"] * 1e6,
        "device_tiling_us": medians["device_tiling"] * 1e6,
        "ratio": medians["host_update"] / medians["device_tiling"],
        "device_tiling_L1_us": flat["L=1"] * 1e6, "device_tiling_L64_us": flat["L=64"] * 1e6,
        "L64_over_L1": flat["L=64"] / flat["L=1"],
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"host time per decode step, median of {args.steps} trace steps "
          f"(L={args.layers}, batch bucket {args.batch}, median live {live}):")
    print(f"  host_update    {result['host_update_us']:10.1f} us")
    print(f"  device_tiling  {result['device_tiling_us']:10.1f} us")
    print(f"  ratio host_update / device_tiling = {result['ratio']:.1f}x (target >= 20x)")
    print(f"device_tiling host time, L=1: {result['device_tiling_L1_us']:.1f} us, "
          f"L=64: {result['device_tiling_L64_us']:.1f} us, "
          f"L64/L1 = {result['L64_over_L1']:.2f} (target <= 1.3)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
