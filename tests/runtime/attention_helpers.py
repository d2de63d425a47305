"""Shared shapes and builders for the attention tests (tiny, so CI stays fast)."""

import torch

from pyruntime import backends
from pyruntime.attention import StaticAttention
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.driver import randomize

SHAPES = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16, "block_size": 8, "max_batch": 8,
              "max_tokens": 24, "max_blocks_per_req": 16}
NUM_BLOCKS = SHAPES["max_batch"] * SHAPES["max_blocks_per_req"] + 8
BUCKETS = (1, 2, 4, 8)


def make_attention(mode, *, dtype=torch.float32, num_layers=2, causal=True, backend=None,
                   **overrides):
    # one core lane: fewer thread hand-offs per step (parallel cores are tested elsewhere)
    backend = backend or backends.get("cpu", num_threads=1, wait_timeout_s=10.0)
    shapes = {**SHAPES, **overrides}
    attn = StaticAttention(backend, num_layers=num_layers, num_blocks=NUM_BLOCKS, mode=mode,
                           dtype=dtype, causal=causal, num_cores=4, **shapes)
    randomize(attn)
    attn.capture()
    return attn


def make_batcher(requests, **options):
    shapes = {k: SHAPES[k] for k in ("max_batch", "max_tokens", "block_size",
                                      "max_blocks_per_req")}
    return ContinuousBatcher(requests, num_blocks=NUM_BLOCKS, buckets=BUCKETS, **shapes,
                             **options)
