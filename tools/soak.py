#!/usr/bin/env python3
"""Soak: many replays of two graphs on two streams at once, checking outputs and memory.

Two `StaticAttention` instances (one per mode, each with its own streams) share one CPU
backend and run concurrently from two host threads, each on random trace batches
(continuous batching, spec decode and chunked prefill, padded buckets). Every step is
checked with `check()` and for zero padding rows; every `--check-every`th step is compared
with the float64 reference. A step that does not return within `--stall-s` counts as a
deadlock. Prints resident memory at start, after warm-up and at the end. Not run in CI.

    python tools/soak.py                      # 1e5 replays per graph
    python tools/soak.py --replays 2000       # a quick run
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyruntime import backends
from pyruntime.attention import StaticAttention
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.driver import randomize
from pyruntime.workload.reference import reference_attention, relative_error
from pyruntime.workload.trace import load_trace

SHAPES = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16, "block_size": 8,
          "max_batch": 16, "max_tokens": 48, "max_blocks_per_req": 16}
NUM_BLOCKS = 16 * 16 + 16


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def batches(seed: int):
    """An endless stream of trace batches (restarting the trace when it runs out)."""
    requests = load_trace()
    while True:
        yield from ContinuousBatcher(requests, num_blocks=NUM_BLOCKS, buckets=[2, 4, 8, 16],
                                     spec_tokens=2, prefill_chunk=8, length_scale=0.1,
                                     step_s=0.02, seed=seed,
                                     **{k: SHAPES[k] for k in ("max_batch", "max_tokens",
                                                               "block_size",
                                                               "max_blocks_per_req")})
        seed += 1


class Runner(threading.Thread):
    def __init__(self, attn: StaticAttention, replays: int, check_every: int, seed: int):
        super().__init__(daemon=True, name=f"soak-{attn.mode}")
        self.attn, self.replays, self.check_every, self.seed = attn, replays, check_every, seed
        self.done = 0
        self.max_rel_err = 0.0
        self.failure: BaseException | None = None
        self.last_progress = time.monotonic()

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.failure = exc

    def _loop(self) -> None:
        attn, gen = self.attn, torch.Generator().manual_seed(self.seed)
        scale = attn.params.head_dim ** -0.5
        for i, b in zip(range(self.replays), batches(self.seed)):
            if i % self.check_every == 0:
                for q in attn.queries:
                    q.copy_(torch.randn(q.shape, generator=gen))
            outs = attn.step(b.block_table, b.cu_seqlens_q, b.seqlens_kv)
            attn.check()
            tokens = b.num_tokens
            if any(torch.count_nonzero(o[tokens:]) for o in outs):
                raise AssertionError(f"step {i}: padding rows are not zero")
            if i % self.check_every == 0:
                for layer, out in enumerate(outs):
                    k, v = attn.kv_caches[layer]
                    want = reference_attention(attn.queries[layer], k, v, b.block_table,
                                               b.cu_seqlens_q, b.seqlens_kv, scale=scale)
                    err = relative_error(out, want)
                    self.max_rel_err = max(self.max_rel_err, err)
                    if err > 1e-5:
                        raise AssertionError(f"step {i} layer {layer}: rel err {err:.3g}")
            self.done = i + 1
            self.last_progress = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replays", type=int, default=100_000, help="per graph")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--check-every", type=int, default=100)
    parser.add_argument("--stall-s", type=float, default=60.0)
    args = parser.parse_args(argv)

    start_rss = rss_mib()
    backend = backends.get("cpu", wait_timeout_s=args.stall_s)
    runners = []
    for seed, mode in enumerate(("device_tiling", "host_update")):
        attn = StaticAttention(backend, num_layers=args.layers, num_blocks=NUM_BLOCKS,
                               mode=mode, dtype=torch.float32, num_cores=4, **SHAPES)
        randomize(attn, seed=seed)
        attn.capture()
        runners.append(Runner(attn, args.replays, args.check_every, seed))
    print(f"RSS at start: {start_rss:.1f} MiB", flush=True)
    began = time.monotonic()
    for r in runners:
        r.start()
    warm_rss, status = None, 0
    while any(r.is_alive() for r in runners):
        time.sleep(1.0)
        if warm_rss is None and all(r.done >= min(1000, args.replays) for r in runners):
            warm_rss = rss_mib()
            print(f"RSS after 1000 replays per graph: {warm_rss:.1f} MiB", flush=True)
        stalled = [r for r in runners if r.is_alive()
                   and time.monotonic() - r.last_progress > args.stall_s]
        if stalled:
            print(f"DEADLOCK: {[r.name for r in stalled]} made no progress for "
                  f"{args.stall_s} s", flush=True)
            return 2
    elapsed = time.monotonic() - began
    end_rss = rss_mib()
    for r in runners:
        verdict = "ok" if r.failure is None else f"FAILED: {r.failure!r}"
        print(f"{r.name}: {r.done} replays, max rel err {r.max_rel_err:.2e}, {verdict}")
        status |= r.failure is not None
    print(f"RSS at end: {end_rss:.1f} MiB (start {start_rss:.1f}, after warm-up "
          f"{warm_rss if warm_rss is not None else float('nan'):.1f}); {elapsed:.0f} s")
    print(f"backend counters: {backend.counters.snapshot()}")
    backend.close()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
