"""What the attention-variant error tools share (``tools/*_errors.py``, run through
``tools/variant_errors.py VARIANT``): the problem, the loop, the sweep over consumers, modes
and dtypes, the options every tool has, and the report (JSON or the Markdown table).

Each tool runs, for each AI Core consumer (the C reference attention, the Triton kernels
under Triton's interpreter), each mode (device_tiling with placement graph and pre-replay,
host_update) and each storage dtype, a trace-driven decode loop of `StaticAttention` with its
variant on (bundled trace: decode, speculative decode, chunked prefill, padded buckets with
zero-length slots), and compares every layer's output of every step with
``pyruntime.workload.reference`` (float64, the same variant; `run_decode_loop` passes the
attention's variant arguments). Shapes: 8 query heads, 2 kv heads, head_dim 64, block 16,
8 requests, 32 query rows, 6 cores (so units split). MLA (``tools/mla_errors.py``) has its own
problem, attention and loop, and shares the sweep, the options and the report.

A tool is a module with its ``__doc__`` (the table's description), ``add_arguments(parser)``
(its own options after :func:`add_options`) and ``table(args) -> int`` (:func:`sweep`, then
:func:`report`); :func:`main` runs one alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

from pyruntime import backends
from pyruntime.attention import StaticAttention
from pyruntime.kernels import triton_launch
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.driver import LoopStats, randomize, run_decode_loop
from pyruntime.workload.trace import load_trace

SHAPES = {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "block_size": 16,
          "max_batch": 8, "max_tokens": 32, "max_blocks_per_req": 16}
NUM_BLOCKS = SHAPES["max_batch"] * SHAPES["max_blocks_per_req"] + 8
MIX = {"spec_tokens": 3, "prefill_chunk": 8, "length_scale": 0.15, "step_s": 0.05}
MODES = (("device_tiling", "graph"), ("device_tiling", "pre-replay"), ("host_update", None))
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCALE = SHAPES["head_dim"] ** -0.5


def add_options(p: argparse.ArgumentParser, *, steps: int = 200, triton_steps: int = 12,
                steps_help: str = "steps per C-consumer run",
                triton_help: str = "steps per Triton run (interpreted: about 0.15 s a step)"
                ) -> argparse.ArgumentParser:
    """The options every tool has: --steps, --triton-steps, --json."""
    p.add_argument("--steps", type=int, default=steps, help=steps_help)
    p.add_argument("--triton-steps", type=int, default=triton_steps, help=triton_help)
    p.add_argument("--json", action="store_true")
    return p


def main(tool, argv: list[str] | None = None) -> int:
    """Run one tool module alone (its old ``python tools/NAME_errors.py`` entry)."""
    p = argparse.ArgumentParser(description=tool.__doc__.split("\n")[0])
    tool.add_arguments(p)
    return tool.table(p.parse_args(argv))


def attention(consumer: str, mode: str, placement: str | None, dtype: torch.dtype,
              **variant) -> StaticAttention:
    """A captured two-layer attention with random queries and caches, owning its backend."""
    backend = backends.get("cpu", num_threads=2, wait_timeout_s=300.0, aicore=consumer)
    extra = {"placement": placement} if placement else {}
    attn = StaticAttention(backend, num_layers=2, num_blocks=NUM_BLOCKS, mode=mode, dtype=dtype,
                           num_cores=6, owns_backend=True, **SHAPES, **extra, **variant)
    randomize(attn)
    attn.capture()
    return attn


def loop(attn: StaticAttention, trace, steps: int, *, on_step=None,
         query_scale: float = 1.0) -> tuple[LoopStats, float]:
    """Run the checked loop, close the attention; returns (stats, seconds)."""
    batcher = ContinuousBatcher(trace, num_blocks=NUM_BLOCKS, buckets=(4, 8),
                                **{k: SHAPES[k] for k in ("max_batch", "max_tokens",
                                                          "block_size", "max_blocks_per_req")},
                                **MIX)
    start = time.perf_counter()
    stats = run_decode_loop(attn, batcher, steps=steps, query_scale=query_scale,
                            on_step=on_step)
    attn.close()
    return stats, time.perf_counter() - start


def row(consumer: str, mode: str, placement: str | None, dtype: torch.dtype,
        stats: LoopStats, seconds: float, **fields) -> dict:
    """The fields every row has, then the tool's own."""
    return {"consumer": consumer, "mode": mode if placement is None else placement,
            "dtype": str(dtype).removeprefix("torch."), "steps": stats.steps,
            **fields, "max_rel_err": stats.max_rel_err,
            "covered": {"padded": stats.padded_steps, "spec": stats.spec_steps,
                        "prefill": stats.prefill_steps},
            "seconds": round(seconds, 1)}


def sweep(args: argparse.Namespace, run: Callable[..., dict], *, trace_limit: int = 3000,
          progress: Callable[[dict], str] | None = None,
          modes: tuple[tuple[str, str | None], ...] = MODES) -> list[dict]:
    """``run(consumer, mode, placement, dtype, steps, trace)`` for every consumer available
    here (Triton when it is installed), mode of ``modes`` (default all) and dtype, over the
    bundled trace's first ``trace_limit`` requests; progress lines go to stderr."""
    trace = load_trace(limit=trace_limit)
    consumers = ["c"] + (["triton"] if triton_launch.available() is None else [])
    rows = []
    for consumer in consumers:
        steps = args.steps if consumer == "c" else args.triton_steps
        for mode, placement in modes:
            for dtype in DTYPES:
                r = run(consumer, mode, placement, dtype, steps, trace)
                rows.append(r)
                if not args.json:
                    line = progress(r) if progress else f"{r['max_rel_err']:.2e}"
                    print(f"{consumer:6} {r['mode']:10} {r['dtype']:8} {r['steps']:4} steps  "
                          f"{line}", file=sys.stderr)
    return rows


def report(args: argparse.Namespace, rows: list[dict], header: dict,
           columns: list[tuple[str, Callable[[dict], str]]]) -> int:
    """Print the JSON report (``header``, the shapes, the rows) or the Markdown table:
    consumer, mode, dtype, steps, then ``columns`` (title, cell), then, when the rows count
    them (``covered``, :func:`row`), whether every run covered padded buckets, speculative
    decode and chunked prefill. The shapes are :data:`SHAPES` unless ``header`` names its
    own (``"shapes"``, MLA's). Returns the exit status, 0."""
    if args.json:
        print(json.dumps({**header, "shapes": header.get("shapes", SHAPES), "rows": rows},
                         indent=1))
        return 0
    titles = ["consumer", "mode", "dtype", "steps", *(title for title, _ in columns)]
    print("| " + " | ".join(titles) + " |")
    print("|" + "---|" * len(titles))
    for r in rows:
        cells = [r["consumer"], r["mode"], r["dtype"], str(r["steps"]),
                 *(cell(r) for _, cell in columns)]
        print("| " + " | ".join(cells) + " |")
    if not all("covered" in r for r in rows):
        return 0
    missed = [f"{r['consumer']}/{r['mode']}/{r['dtype']}: {k}" for r in rows
              for k, n in r["covered"].items() if n == 0]
    print("\nEvery run had padded buckets, speculative decode and chunked prefill steps."
          if not missed else f"\nRuns without some kind of step: {', '.join(missed)}")
    return 0
