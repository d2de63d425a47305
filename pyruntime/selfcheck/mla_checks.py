"""The MLA decode check (issue 20 part 5): `StaticMLAAttention` on the chosen placement
against the float64 absorbed-MLA reference on trace batches.

Not yet in `pyruntime.selfcheck.CHECKS`: registering it is one line there, after
``attention_correctness`` (``("mla_correctness", mla_correctness)``), left to the merge so that
this file touches nothing another change edits (docs/mla.md).
"""

from __future__ import annotations

import torch

from pyruntime.backends import BackendError
from pyruntime.mla_attention import StaticMLAAttention
from pyruntime.tiling import TilingError
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.driver import randomize
from pyruntime.workload.mla_reference import run_mla_loop

from .context import Context
from .report import CheckResult, failed, passed, skipped

#: one TP-8 rank's 16 heads over a narrower latent (64 + 16) than DeepSeek-V3's 512 + 64: the
#: CPU backend emulates every AI Core, and the kernels' shapes scale
SHAPES = {"num_heads": 16, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "block_size": 16,
          "max_batch": 8, "max_tokens": 32, "max_blocks_per_req": 16}
NUM_BLOCKS = SHAPES["max_batch"] * SHAPES["max_blocks_per_req"] + 8
#: MTP speculative decode with 2 tokens per request, padded buckets
TRACE_MIX = {"spec_tokens": 2, "length_scale": 0.05, "step_s": 0.5}
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def mla_correctness(ctx: Context) -> CheckResult:
    """StaticMLAAttention, on the chosen placement, against float64 absorbed MLA (fp32, bf16)."""
    name = "mla_correctness"
    if ctx.placement is None:
        return skipped(name, "no placement was found (see aicpu_replay)")
    steps = 12 if ctx.quick else 32
    results, worst = {}, 0.0
    coverage = {"padded": 0, "mtp": 0, "split_units": 0}
    keys = ("max_batch", "max_tokens", "block_size", "max_blocks_per_req")
    try:
        for dtype, tolerance in TOLERANCE.items():
            be = ctx.make_backend()
            try:
                with StaticMLAAttention(be, num_layers=2, num_blocks=NUM_BLOCKS,
                                        mode="device_tiling", placement=ctx.placement,
                                        dtype=dtype, softmax_scale=0.1, num_cores=8,
                                        **SHAPES) as attn:
                    randomize(attn)
                    attn.capture()
                    batcher = ContinuousBatcher(ctx.requests(), num_blocks=NUM_BLOCKS,
                                                buckets=(2, 4, 8),
                                                **{k: SHAPES[k] for k in keys}, **TRACE_MIX)
                    stats = run_mla_loop(attn, batcher, steps=steps)
            finally:
                close = getattr(be, "close", None)
                if close is not None:
                    close()
            results[str(dtype).removeprefix("torch.")] = stats.max_rel_err
            if stats.max_rel_err > tolerance:
                worst = max(worst, stats.max_rel_err)
            coverage["padded"] += stats.padded_steps
            coverage["mtp"] += stats.spec_steps
            coverage["split_units"] += stats.split_steps
    except (BackendError, TilingError) as exc:
        return failed(name, f"an MLA step failed on placement {ctx.placement}: "
                            f"{type(exc).__name__}: {exc}")
    data = {"placement": ctx.placement, "steps_per_dtype": steps, "max_rel_err": results,
            "tolerance": {str(k).removeprefix("torch."): v for k, v in TOLERANCE.items()},
            "coverage_steps": coverage, "shapes": SHAPES, "requests": ctx.requests_source}
    missing = [k for k, v in coverage.items() if v == 0]
    if missing:
        return failed(name, f"the trace batches never covered {', '.join(missing)}", **data)
    errs = ", ".join(f"{k} {v:.1e}" for k, v in results.items())
    if worst:
        return failed(name, f"max relative error over the tolerance: {errs}", **data)
    return passed(name, f"MLA decode (16 heads, 64 + 16), placement {ctx.placement}, {steps} "
                        f"steps x 2 layers per dtype (MTP, padded buckets, split units) against "
                        f"float64: max rel err {errs}", **data)
