"""Synthetic request streams in the trace's shape (all arrive at once, arrival 0)."""

from __future__ import annotations

import numpy as np

from .trace import TraceRequest

DISTRIBUTIONS = ("uniform", "long_tail")


def synthetic_requests(kind: str, count: int, *, max_context: int, max_generated: int = 64,
                       seed: int = 0) -> list[TraceRequest]:
    """`count` requests with context lengths drawn from `kind`.

    Args:
        kind: ``"uniform"`` (context uniform in [1, max_context]) or ``"long_tail"``
            (lognormal: most requests short, a few near `max_context`).
        max_context: the largest context length.
        max_generated: output lengths are uniform in [1, max_generated].
    """
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        context = rng.integers(1, max_context + 1, count)
    elif kind == "long_tail":
        context = np.minimum(rng.lognormal(np.log(max_context / 16), 1.2, count), max_context)
    else:
        raise ValueError(f"kind must be one of {DISTRIBUTIONS}, got {kind!r}")
    generated = rng.integers(1, max_generated + 1, count)
    return [TraceRequest(0.0, max(1, int(c)), int(g)) for c, g in zip(context, generated)]
