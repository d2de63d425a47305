#!/usr/bin/env python3
"""Bit-exact fingerprints of every attention consumer's outputs, for refactors that must not
change a single bit (the shared tiling walk, for example).

For each consumer (the C reference under each ISA variant this CPU supports, the Triton
kernels under Triton's interpreter when installed) and each layer set (plain GQA, logits soft
cap, sliding window, sinks, int8 KV cache, MLA decode), a trace-driven decode loop runs on the
CPU backend in mode device_tiling (placement graph) with fixed seeds, and every layer's output
bytes of every step (the live rows only) go into one sha256 per (consumer, set). Padding rows
are excluded: nothing promises their contents.

    python tools/output_hashes.py [--steps 40] [--triton-steps 4] [--json] [--only SET,...]

Compare two trees: run it in each and diff the JSON (``--json``). Shapes and loop:
`tools/_variant_errors.py` for GQA, `tools/mla_errors.py` for MLA (both run as tables by
`tools/variant_errors.py`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import _variant_errors as ve
import torch

from pyruntime.kernels import reference_attention, triton_launch
from pyruntime.workload.driver import randomize
from pyruntime.workload.trace import load_trace

# name -> (StaticAttention variant keywords, query scale); MLA is its own set below.
GQA_SETS = {
    "plain": ({}, 1.0),
    "soft_cap": ({"logits_soft_cap": 5.0}, 4.0),
    "window": ({"sliding_window": 24}, 1.0),
    "sinks": ({"sinks": True}, 1.0),
    "int8_kv": ({"kv_cache_dtype": "int8"}, 1.0),
}
SETS = (*GQA_SETS, "mla")


def _digest_rows(h: hashlib._Hash, outputs, live_rows: int) -> None:
    for out in outputs:
        h.update(out[:live_rows].contiguous().view(torch.uint8).numpy().tobytes())


def _fill_variant(attn) -> None:
    """Deterministic sinks and int8 scales, written after the capture (read at replay)."""
    for layer, sink in enumerate(getattr(attn, "sinks", None) or []):
        heads = torch.arange(sink.numel(), dtype=torch.float32)
        sink.copy_((2.0 + 0.3 * heads + 0.2 * layer).to(sink.dtype))
    for layer, (k_scale, k_offset, v_scale, v_offset) in enumerate(
            getattr(attn, "kv_scales", None) or []):
        for i, t in enumerate((k_scale, v_scale)):
            n = torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape)
            t.copy_((0.04 + 0.04 * ((n * 7 + 3 * layer + i) % 11) / 10).to(t.dtype))
        for i, t in enumerate((k_offset, v_offset)):
            n = torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape)
            t.copy_(((n * 5 + layer + i) % 9 - 4).to(t.dtype))
    randomize(attn)  # after the scales: int8 caches are quantised with them


def gqa_hash(consumer: str, variant: dict, query_scale: float, dtype: torch.dtype,
             steps: int, trace) -> tuple[str, int]:
    attn = ve.attention(consumer, "device_tiling", "graph", dtype, **variant)
    _fill_variant(attn)
    h = hashlib.sha256()

    def on_step(_i, batch, outputs):
        _digest_rows(h, outputs, int(batch.cu_seqlens_q[batch.live]))

    stats, _ = ve.loop(attn, trace, steps, on_step=on_step, query_scale=query_scale)
    return h.hexdigest(), stats.steps


def mla_hash(consumer: str, dtype: torch.dtype, steps: int, trace) -> tuple[str, int]:
    """`tools/mla_errors.py`'s three loops (q_len 1, 2, 4), mode graph, hashing each step."""
    import mla_errors as me

    h = hashlib.sha256()

    def on_step(_i, batch, outputs):
        _digest_rows(h, outputs, int(batch.cu_seqlens_q[batch.live]))

    row = me.run(consumer, "device_tiling", "graph", dtype, steps, trace, on_step=on_step)
    return h.hexdigest(), row["steps"]


def consumers() -> list[tuple[str, str | None]]:
    """(aicore consumer, ISA) pairs: C under each supported ISA, then Triton if present."""
    isas = reference_attention.isa_variants()["supported"]
    found = [("c", isa) for isa in isas]
    if triton_launch.available() is None:
        found.append(("triton", None))
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40, help="steps per C run (per q_len for MLA)")
    p.add_argument("--triton-steps", type=int, default=4, help="steps per Triton run")
    p.add_argument("--only", default=",".join(SETS), help=f"sets to run, of {', '.join(SETS)}")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sets = args.only.split(",")
    unknown = [s for s in sets if s not in SETS]
    if unknown:
        p.error(f"unknown set(s) {', '.join(unknown)}; known: {', '.join(SETS)}")
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    trace = load_trace(limit=3000)
    rows = []
    for consumer, isa in consumers():
        if isa is not None:
            reference_attention.select_isa(isa)
        steps = args.steps if consumer == "c" else args.triton_steps
        for name in sets:
            for dtype in dtypes:
                if name == "mla":
                    digest, n = mla_hash(consumer, dtype, steps, trace)
                else:
                    variant, qscale = GQA_SETS[name]
                    digest, n = gqa_hash(consumer, variant, qscale, dtype, steps, trace)
                row = {"consumer": consumer if isa is None else f"c/{isa}", "set": name,
                       "dtype": str(dtype).removeprefix("torch."), "steps": n,
                       "sha256": digest}
                rows.append(row)
                print(f"{row['consumer']:12} {name:9} {row['dtype']:9} {n:4} steps  "
                      f"{digest[:16]}", file=sys.stderr)
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
    else:
        for r in rows:
            print(f"| {r['consumer']} | {r['set']} | {r['dtype']} | {r['steps']} | "
                  f"`{r['sha256'][:16]}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
