"""Decode throughput of the reference attention against this machine's memory bandwidth.

Runs one decode attention layer (every emulated AI Core's range of a tiling, spread over
worker threads, then the combine step) on a paged KV cache far larger than the caches, and
reports bytes of KV read per second next to the bandwidth of simple streaming loops measured
in the same run with the same thread count:

    python tools/bench_attention.py                     # defaults: Llama-3-8B-like, bf16
    python tools/bench_attention.py --dtype float32 --q-heads 32 --kv-heads 8 --json

KV bytes per step count K and V of every live token once: sum(kv_len) * kv_heads * head_dim *
2 * itemsize. Memory bandwidth is the best of a read-only reduction (bytes read) and a copy
(bytes read + bytes written, STREAM's convention), so the ratio is against the faster loop.
Every figure is the median of ``--repeats`` timed runs after one warm-up. ``--clock cpu``
times both sides by process CPU time divided by the thread count instead of wall time: on a
machine shared with other jobs this removes time-slicing (not memory contention) from both.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyruntime.kernels import reference_attention as ra
from pyruntime import tiling
from pyruntime.workload.trace import load_trace

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def trace_context_lengths(count: int, seed: int, cap: int) -> list[int]:
    """Context lengths of `count` requests drawn from the Azure conversation trace (the bundled
    one, or $AICPU_TILING_TRACE), clipped to [1, cap]."""
    rng = np.random.default_rng(seed)
    lengths = np.array([r.context_tokens for r in load_trace()])
    picked = rng.choice(lengths, size=count)
    return [int(min(max(x, 1), cap)) for x in picked]


def median_seconds(fn, repeats: int, clock: str = "wall", threads: int = 1) -> float:
    """Median seconds of fn(); with clock "cpu", process CPU seconds / threads."""
    now = time.perf_counter if clock == "wall" else time.process_time
    per = 1 if clock == "wall" else threads
    fn()
    times = []
    for _ in range(repeats):
        start = now()
        fn()
        times.append((now() - start) / per)
    return statistics.median(times)


def memory_bandwidth(
    threads: int, megabytes: int, repeats: int, clock: str = "wall"
) -> dict[str, float]:
    """Bytes per second of a read-only sum and of a copy (read + write) over large buffers."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        nbytes = src.numel() * 4
        read = nbytes / median_seconds(lambda: src.sum(), repeats, clock, threads)
        copy = 2 * nbytes / median_seconds(lambda: dst.copy_(src), repeats, clock, threads)
    finally:
        torch.set_num_threads(previous)
    return {"read": read, "copy": copy, "best": max(read, copy)}


def build_problem(args) -> dict:
    dtype = DTYPES[args.dtype]
    kv_lens = trace_context_lengths(args.batch, args.seed, args.max_kv)
    bs = args.block_size
    mbpr = math.ceil(args.max_kv / bs)
    params = tiling.TilingParams(
        num_q_heads=args.q_heads,
        num_kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        block_size=bs,
        max_batch=args.batch,
        max_tokens=args.batch,
        max_blocks_per_req=mbpr,
        num_cores=args.cores,
    )
    needed = [math.ceil(k / bs) for k in kv_lens]
    num_blocks = sum(needed)
    ids = np.random.default_rng(args.seed).permutation(num_blocks).astype(np.int32)
    block_table = torch.zeros(args.batch, mbpr, dtype=torch.int32)
    at = 0
    for r, n in enumerate(needed):
        block_table[r, :n] = torch.from_numpy(ids[at : at + n])
        at += n
    shape = (num_blocks, bs, args.kv_heads, args.head_dim)
    gen = torch.Generator().manual_seed(args.seed)
    key_cache = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    value_cache = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    query = torch.randn(args.batch, args.q_heads, args.head_dim, generator=gen).to(dtype)
    cu = torch.arange(args.batch + 1, dtype=torch.int32)
    kv = torch.tensor(kv_lens, dtype=torch.int32)
    plan = tiling.plan(params, cu.numpy(), kv.numpy(), causal=True)
    if plan.status != 0:
        raise SystemExit(f"tiling failed: {plan.error}")
    po, pl = ra.partial_buffers(params)
    kv_bytes = sum(kv_lens) * args.kv_heads * args.head_dim * 2 * key_cache.element_size()
    return {
        "params": params,
        "plan": plan,
        "query": query,
        "key_cache": key_cache,
        "value_cache": value_cache,
        "block_table": block_table,
        "cu": cu,
        "kv": kv,
        "out": torch.empty_like(query),
        "po": po,
        "pl": pl,
        "kv_bytes": kv_bytes,
        "cache_bytes": 2 * key_cache.numel() * key_cache.element_size(),
    }


def run_layer(p: dict, threads: int) -> None:
    params = p["params"]
    statuses = []

    def cores(first: int) -> None:
        for core in range(first, params.num_cores, threads):
            statuses.append(
                ra.attention_core(
                    params,
                    p["plan"],
                    core,
                    query=p["query"],
                    key_cache=p["key_cache"],
                    value_cache=p["value_cache"],
                    block_table=p["block_table"],
                    cu_seqlens_q=p["cu"],
                    seqlens_kv=p["kv"],
                    out=p["out"],
                    partial_out=p["po"],
                    partial_lse=p["pl"],
                    causal=True,
                )
            )

    workers = [threading.Thread(target=cores, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    statuses.append(
        ra.attention_finalize(
            params,
            p["plan"],
            cu_seqlens_q=p["cu"],
            out=p["out"],
            partial_out=p["po"],
            partial_lse=p["pl"],
        )
    )
    if any(statuses):
        raise SystemExit(f"attention failed: {ra.strerror(max(statuses))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-kv", type=int, default=8192, help="clip trace lengths here")
    parser.add_argument("--cores", type=int, default=24, help="emulated AI Cores (tiling P)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--bandwidth-mb", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)

    problem = build_problem(args)
    seconds = median_seconds(
        lambda: run_layer(problem, args.threads), args.repeats, args.clock, args.threads
    )
    bandwidth = memory_bandwidth(args.threads, args.bandwidth_mb, args.repeats, args.clock)
    kv_rate = problem["kv_bytes"] / seconds
    result = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "kv_bytes_per_step": problem["kv_bytes"],
        "cache_bytes": problem["cache_bytes"],
        "step_seconds": seconds,
        "kv_bytes_per_second": kv_rate,
        "memory_read_bytes_per_second": bandwidth["read"],
        "memory_copy_bytes_per_second": bandwidth["copy"],
        "ratio": kv_rate / bandwidth["best"],
    }
    if args.json:
        print(json.dumps(result))
        return 0
    gb = 1e9
    print(
        f"decode attention: batch {args.batch}, heads {args.q_heads}/{args.kv_heads}, "
        f"head_dim {args.head_dim}, block {args.block_size}, {args.dtype}, "
        f"{args.cores} emulated cores on {args.threads} threads, {args.clock} clock"
    )
    print(
        f"  KV read per step      {problem['kv_bytes'] / 2**20:10.1f} MiB "
        f"(cache {problem['cache_bytes'] / 2**20:.1f} MiB)"
    )
    print(f"  step time (median)    {seconds * 1e3:10.2f} ms")
    print(f"  KV throughput         {kv_rate / gb:10.2f} GB/s")
    print(f"  memory read (sum)     {bandwidth['read'] / gb:10.2f} GB/s")
    print(f"  memory copy (r+w)     {bandwidth['copy'] / gb:10.2f} GB/s")
    print(f"  ratio KV / best       {result['ratio'] * 100:10.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
