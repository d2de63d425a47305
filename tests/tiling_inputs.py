"""Input generators shared by the tiling tests: hypothesis strategies and trace batches.

Bounds come from the kernel's own constants (``pyruntime._native.lib``), never retyped.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from hypothesis import strategies as st

from pyruntime.tiling import TilingParams
from pyruntime.workload.trace import load_trace


@lru_cache(maxsize=1)
def trace_lengths() -> tuple[np.ndarray, np.ndarray]:
    """(ContextTokens, GeneratedTokens) of the Azure trace as int64 arrays."""
    requests = load_trace()
    context = np.array([r.context_tokens for r in requests], dtype=np.int64)
    generated = np.array([r.generated_tokens for r in requests], dtype=np.int64)
    return context, generated


def trace_decode_batch(batch: int, rng: np.random.Generator, kv_capacity: int):
    """A decode step of ``batch`` trace requests: q_len 1, kv = context + generated so far."""
    context, generated = trace_lengths()
    pick = rng.integers(0, len(context), batch)
    kv = context[pick] + (rng.random(batch) * generated[pick]).astype(np.int64) + 1
    return np.arange(batch + 1), np.minimum(kv, kv_capacity)


def trace_mixed_batch(batch: int, rng: np.random.Generator, params: TilingParams):
    """Trace requests mixing decode, speculative decode, chunked prefill and padded slots."""
    context, _ = trace_lengths()
    cu, kv = [0], []
    for _ in range(batch):
        room = params.max_tokens - cu[-1]
        kind = rng.integers(0, 5)
        if kind == 0 or room == 0:
            q = 0
        elif kind <= 2:
            q = 1
        elif kind == 3:
            q = int(min(room, rng.integers(2, 6)))
        else:
            q = int(min(room, rng.integers(1, 257)))
        length = int(context[rng.integers(0, len(context))])
        cu.append(cu[-1] + q)
        kv.append(0 if q == 0 and kind == 0 else min(params.kv_capacity, max(q, length + q)))
    return cu, kv


@st.composite
def small_params(draw, windows: bool = False) -> TilingParams:
    """Valid TilingParams small enough for the slow oracle; with ``windows`` the sliding
    window is drawn too (none, a few tokens, about a block, up to past the kv capacity)."""
    num_kv_heads = draw(st.integers(1, 4))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    return TilingParams(
        num_q_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads,
        head_dim=draw(st.sampled_from([8, 64, 128])),
        block_size=draw(st.sampled_from([1, 7, 16, 64, 128])),
        max_batch=draw(st.integers(1, 12)),
        max_tokens=draw(st.integers(1, 160)),
        max_blocks_per_req=draw(st.integers(1, 24)),
        num_cores=draw(st.integers(1, 30)),
        q_tile=draw(st.integers(1, 20)),
        cost_kv_load=draw(st.integers(0, 8)),
        cost_qk_tile=draw(st.integers(1, 4)),
        cost_segment=draw(st.integers(0, 120)),
        sliding_window=draw(window_sizes()) if windows else None,
    )


@st.composite
def window_sizes(draw) -> int | None:
    """A sliding window W: None (none), a few tokens, about a block, or far past any kv."""
    return draw(st.one_of(st.just(None), st.integers(1, 6), st.integers(1, 300),
                          st.integers(1, 4000)))


@st.composite
def valid_inputs(draw, params: TilingParams, causal: bool):
    """(cu_seqlens_q, seqlens_kv) that the kernel must accept."""
    batch = draw(st.integers(0, params.max_batch))
    cu, kv = [0], []
    for _ in range(batch):
        room = params.max_tokens - cu[-1]
        q = draw(st.sampled_from([0, 1, 1, 2, min(room, 40)]))
        q = min(q, room)
        cu.append(cu[-1] + q)
        low = q if causal else (1 if q > 0 else 0)
        if low > params.kv_capacity:  # the query is longer than any legal kv: make it padding
            cu[-1] -= q
            low = 0
        kv.append(draw(st.integers(low, params.kv_capacity)))
    return cu, kv


@st.composite
def any_inputs(draw, params: TilingParams, causal: bool):
    """Valid inputs with, half the time, one value corrupted (possibly into an error)."""
    cu, kv = draw(valid_inputs(params, causal))
    if kv and draw(st.booleans()):
        r = draw(st.integers(0, len(kv) - 1))
        if draw(st.booleans()):
            kv[r] = draw(st.integers(-3, params.kv_capacity + 3))
        else:
            cu[r + 1] = draw(st.integers(-3, params.max_tokens + 3))
    return cu, kv
