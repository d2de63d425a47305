"""Decode throughput of the reference attention against this machine's memory bandwidth.

Runs one decode attention layer (every emulated AI Core's range of a tiling, then the combine
step) on a paged KV cache far larger than the caches, and reports bytes of KV read per second
next to the bandwidth of simple streaming loops measured in the same run, in turns with the
attention steps, with the same thread count. The cores are called in groups spread over the
worker threads (``--grouping``): by default as sibling sets when num_cores is a multiple of
num_kv_heads > 1 (a head-0 core and its copies for the other heads in one call,
``aicpu_attention_core_siblings``), else as one span of consecutive cores per thread
(``aicpu_attention_core_span``); both read each token's K and V of several heads together.
``--grouping cores`` calls one core at a time, as the CPU backend does. For example:

    python tools/bench_attention.py                     # defaults: Llama-3-8B-like, bf16
    python tools/bench_attention.py --dtype float32 --q-heads 32 --kv-heads 8 --json
    python tools/bench_attention.py --isa all           # every variant this CPU supports

The attention's inner kernels run in the variant ``--isa`` names (default: the active one,
i.e. $AICPU_TILING_ATTENTION_ISA or the best the CPU supports); the output names it. With
``--isa all`` the variants are timed in turns (one step each, round-robin), so that they share
the machine's load, and each gets its own line.

KV bytes per step count K and V of every live token once: sum(kv_len) * kv_heads * head_dim *
2 * itemsize. Memory bandwidth is the best of a read-only reduction (bytes read) and a copy
(bytes read + bytes written, STREAM's convention), so the ratio is against the faster loop.
Every figure is the median of ``--repeats`` timed rounds after one warm-up. ``--clock cpu``
times both sides by process CPU time divided by the thread count instead of wall time: on a
machine shared with other jobs this removes time-slicing (not memory contention) from both.
"""

from __future__ import annotations

import argparse
import itertools
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

from pyruntime import tiling
from pyruntime.kernels import reference_attention as ra
from pyruntime.workload.trace import load_trace

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def trace_context_lengths(count: int, seed: int, cap: int) -> list[int]:
    """Context lengths of `count` requests drawn from the Azure conversation trace (the bundled
    one, or $AICPU_TILING_TRACE), clipped to [1, cap]."""
    rng = np.random.default_rng(seed)
    lengths = np.array([r.context_tokens for r in load_trace()])
    picked = rng.choice(lengths, size=count)
    return [int(min(max(x, 1), cap)) for x in picked]


def memory_loops(threads: int, megabytes: int) -> dict[str, tuple]:
    """(function, bytes moved) of a read-only sum and of a copy (read + write) over large
    buffers, run with ``threads`` torch threads."""
    src = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    nbytes = src.numel() * 4

    def with_threads(fn):
        def run():
            previous = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                fn()
            finally:
                torch.set_num_threads(previous)

        return run

    return {
        "read": (with_threads(lambda: src.sum()), nbytes),
        "copy": (with_threads(lambda: dst.copy_(src)), 2 * nbytes),
    }


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
    out = torch.empty_like(query)
    bound = ra.BoundAttention(
        params, plan.buffer, query=query, key_cache=key_cache, value_cache=value_cache,
        block_table=block_table, cu_seqlens_q=cu, seqlens_kv=kv, out=out, partial_out=po,
        partial_lse=pl, causal=True,
    )
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
        "out": out,
        "bound": bound,
        "po": po,
        "pl": pl,
        "kv_bytes": kv_bytes,
        "cache_bytes": 2 * key_cache.numel() * key_cache.element_size(),
    }


GROUPINGS = ("auto", "siblings", "spans", "cores")


def resolve_grouping(bound: ra.BoundAttention, grouping: str) -> str:
    """auto: sibling sets when they fuse (P % H == 0 with H > 1: fewer sets than cores), else
    spans."""
    if grouping != "auto":
        return grouping
    return "siblings" if bound.num_sibling_sets < bound.num_cores else "spans"


def core_jobs(bound: ra.BoundAttention, grouping: str, threads: int) -> list:
    """The calls that run every core once, as zero-argument functions returning a C status.

    siblings: one call per sibling set (``core_siblings``); spans: ``threads`` spans of
    consecutive cores, as equal as the core count allows (``core_span``); cores: one call per
    core, as the CPU backend runs them; auto: see :func:`resolve_grouping`.
    """
    grouping = resolve_grouping(bound, grouping)
    if grouping == "siblings":
        return [lambda j=j: bound.core_siblings(j) for j in range(bound.num_sibling_sets)]
    if grouping == "cores":
        return [lambda c=c: bound.core(c) for c in range(bound.num_cores)]
    cuts = [round(i * bound.num_cores / threads) for i in range(threads + 1)]
    return [
        lambda a=a, b=b: bound.core_span(a, b - a) for a, b in itertools.pairwise(cuts) if b > a
    ]


def run_layer(p: dict, threads: int, grouping: str) -> None:
    """One layer: the core jobs spread round-robin over ``threads`` threads, then finalize."""
    bound = p["bound"]
    jobs = core_jobs(bound, grouping, threads)
    statuses = []

    def worker(first: int) -> None:
        for job in jobs[first::threads]:
            statuses.append(job())

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    statuses.append(bound.finalize())
    if any(statuses):
        raise SystemExit(f"attention failed: {ra.strerror(max(statuses))}")


def timed_rounds(problem: dict, args, variants: list[str]) -> tuple[dict, dict]:
    """Median step seconds per variant and memory bytes per second per loop.

    After one warm-up of each, every round times one step of each variant and one run of each
    memory loop, so all share the machine's load of that moment (this machine is shared).
    With clock "cpu" a sample is process CPU seconds / threads instead of wall seconds.
    """
    now = time.perf_counter if args.clock == "wall" else time.process_time
    per = 1 if args.clock == "wall" else args.threads
    loops = memory_loops(args.threads, args.bandwidth_mb)
    steps: dict[str, list[float]] = {name: [] for name in variants}
    memory: dict[str, list[float]] = {name: [] for name in loops}
    for name in variants:
        ra.select_isa(name)
        run_layer(problem, args.threads, args.grouping)
    for fn, _ in loops.values():
        fn()
    for _ in range(args.repeats):
        for name in variants:
            ra.select_isa(name)
            start = now()
            run_layer(problem, args.threads, args.grouping)
            steps[name].append((now() - start) / per)
        for name, (fn, nbytes) in loops.items():
            start = now()
            fn()
            memory[name].append(nbytes / ((now() - start) / per))
    return (
        {name: statistics.median(t) for name, t in steps.items()},
        {name: statistics.median(r) for name, r in memory.items()},
    )


def cpu_features() -> list[str]:
    """The SIMD flags of /proc/cpuinfo that matter here (empty where there is no such file)."""
    wanted = ("sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
              "avx512_bf16", "avx512_fp16", "asimd", "sve")
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            have = set(line.split(":", 1)[1].split())
            return [f for f in wanted if f in have]
    return []


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
    parser.add_argument(
        "--isa",
        choices=(*ra.ISA_NAMES, "all"),
        default=None,
        help="kernel variant (default: the active one); all: every supported one in turns",
    )
    parser.add_argument(
        "--grouping",
        choices=GROUPINGS,
        default="auto",
        help="how the cores are called: sibling sets, spans of consecutive cores (one per "
        "thread), or one call per core; auto: siblings when they fuse (cores a multiple of "
        "kv heads > 1), else spans",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)

    info = ra.isa_variants()
    if args.isa == "all":
        variants = list(info["supported"])
    else:
        variants = [args.isa or info["active"]]
    try:
        ra.select_isa(variants[0])
    except ra.AttentionIsaError as error:
        raise SystemExit(str(error)) from None
    problem = build_problem(args)
    problem["grouping"] = resolve_grouping(problem["bound"], args.grouping)
    times, bandwidth = timed_rounds(problem, args, variants)
    bandwidth["best"] = max(bandwidth["read"], bandwidth["copy"])
    by_isa = {
        name: {
            "step_seconds": seconds,
            "kv_bytes_per_second": problem["kv_bytes"] / seconds,
            "ratio": problem["kv_bytes"] / seconds / bandwidth["best"],
        }
        for name, seconds in times.items()
    }
    isa = variants[-1]
    seconds = times[isa]
    kv_rate = problem["kv_bytes"] / seconds
    result = {
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "cpu_features": cpu_features(),
        "isa": isa,
        "grouping": problem["grouping"],
        "isa_supported": info["supported"],
        "kv_bytes_per_step": problem["kv_bytes"],
        "cache_bytes": problem["cache_bytes"],
        "step_seconds": seconds,
        "kv_bytes_per_second": kv_rate,
        "memory_read_bytes_per_second": bandwidth["read"],
        "memory_copy_bytes_per_second": bandwidth["copy"],
        "ratio": kv_rate / bandwidth["best"],
        "by_isa": by_isa,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    gb = 1e9
    print(
        f"decode attention: batch {args.batch}, heads {args.q_heads}/{args.kv_heads}, "
        f"head_dim {args.head_dim}, block {args.block_size}, {args.dtype}, "
        f"{args.cores} emulated cores on {args.threads} threads ({problem['grouping']}), "
        f"{args.clock} clock"
    )
    print(
        f"  KV read per step      {problem['kv_bytes'] / 2**20:10.1f} MiB "
        f"(cache {problem['cache_bytes'] / 2**20:.1f} MiB)"
    )
    print(f"  CPU SIMD features     {' '.join(result['cpu_features']) or '(none found)'}")
    print(f"  memory read (sum)     {bandwidth['read'] / gb:10.2f} GB/s")
    print(f"  memory copy (r+w)     {bandwidth['copy'] / gb:10.2f} GB/s")
    for name, row in by_isa.items():
        print(f"  kernel variant        {name:>10}")
        print(f"  step time (median)    {row['step_seconds'] * 1e3:10.2f} ms")
        print(f"  KV throughput         {row['kv_bytes_per_second'] / gb:10.2f} GB/s")
        print(f"  ratio KV / best       {row['ratio'] * 100:10.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
