"""Length sources: the per-step ``(cu_seqlens_q, seqlens_kv)`` of a continuous-batching loop.

Every source is a stream of requests ``(prompt, generated)`` fed into ``batch`` slots.
Each step, every slot runs one iteration of its request and a finished request is
replaced by the next one, as a continuous-batching server does:

* ``trace``: requests from the Azure LLM inference trace 2023 (conversation), in order;
  one query token per decode step.
* ``uniform``: prompt uniform in [64, 4096] tokens, 16 to 512 generated tokens.
* ``long-tail``: log-normal prompts (median 512, sigma 1.5, clipped to [16, 32768]).
* ``spec-decode``: trace requests decoding 4 query tokens per step (3 draft + 1).
* ``chunked-prefill``: trace requests whose prompts are first prefilled in chunks of
  256 tokens inside the decode batch.

kv lengths include the step's own query tokens (the kernel's convention). Slots start at a
seeded random point of their request so the first step already looks like steady state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyruntime.workload import trace as workload_trace
from pyruntime.workload.trace import TRACE_ENV, TRACE_NAME  # noqa: F401 - re-exported

SOURCES = ("trace", "uniform", "long-tail", "spec-decode", "chunked-prefill")


class SourceError(ValueError):
    """A length source cannot be built (unknown name, missing or malformed trace)."""


@dataclass(frozen=True)
class Step:
    """One step's lengths: ``cu_seqlens_q`` int32 ``[batch + 1]``, ``seqlens_kv`` int32 ``[batch]``."""

    cu_seqlens_q: np.ndarray
    seqlens_kv: np.ndarray

    @property
    def num_tokens(self) -> int:
        """Query tokens in the step."""
        return int(self.cu_seqlens_q[-1])


def trace_path() -> Path:
    """The trace, found by :func:`pyruntime.workload.trace.trace_path`.

    Raises:
        SourceError: no trace file there.
    """
    try:
        return workload_trace.trace_path()
    except workload_trace.TraceError as exc:
        raise SourceError(str(exc)) from exc


_TRACE_CACHE: dict[Path, np.ndarray] = {}


def load_trace(path: Path | None = None) -> np.ndarray:
    """``[n, 2]`` int64 array of (ContextTokens, GeneratedTokens) rows, in file order, each >= 1.

    Args:
        path: a trace CSV, plain or gzip (default: :func:`trace_path`).

    Raises:
        SourceError: missing or unreadable file, missing columns, malformed values, no rows.
    """
    path = path or trace_path()
    if path in _TRACE_CACHE:
        return _TRACE_CACHE[path]
    try:
        requests = workload_trace.load_trace(path)
    except workload_trace.TraceError as exc:
        raise SourceError(str(exc)) from exc
    rows = [(r.context_tokens, r.generated_tokens) for r in requests]
    _TRACE_CACHE[path] = np.maximum(np.asarray(rows, dtype=np.int64), 1)
    return _TRACE_CACHE[path]


def _requests(source: str, rng: np.random.Generator) -> Iterator[tuple[int, int]]:
    if source in ("trace", "spec-decode", "chunked-prefill"):
        rows = load_trace()
        start = int(rng.integers(0, len(rows)))
        while True:
            for i in range(len(rows)):
                prompt, gen = rows[(start + i) % len(rows)]
                yield int(prompt), int(gen)
    while True:
        if source == "uniform":
            yield int(rng.integers(64, 4097)), int(rng.integers(16, 513))
        else:
            prompt = int(np.clip(rng.lognormal(np.log(512), 1.5), 16, 32768))
            yield prompt, int(rng.integers(16, 513))


class ContinuousBatch:
    """``batch`` slots fed by a length source; ``next()`` gives the next :class:`Step`.

    Args:
        source: one of :data:`SOURCES`.
        batch: live requests per step (>= 1).
        seed: seeds the request order and the slots' starting points.
        max_kv: kv lengths are capped here (prompt clipped so prompt + generated fits).

    Raises:
        SourceError: unknown source, batch < 1, or the trace cannot be loaded.
    """

    CHUNK = 256
    SPEC_TOKENS = 4

    def __init__(self, source: str, batch: int, seed: int = 0, max_kv: int = 1 << 16) -> None:
        if source not in SOURCES:
            raise SourceError(f"unknown length source {source!r}; choose from {', '.join(SOURCES)}")
        if batch < 1:
            raise SourceError(f"batch must be >= 1, got {batch}")
        self.source, self.batch, self.max_kv = source, batch, max_kv
        self.q_decode = self.SPEC_TOKENS if source == "spec-decode" else 1
        self._rng = np.random.default_rng(seed)
        self._stream = _requests(source, self._rng)
        # per slot: prompt, tokens to generate, prompt tokens prefilled, tokens generated
        self._slots = [self._new_request(warm=True) for _ in range(batch)]

    def _new_request(self, warm: bool = False) -> list[int]:
        prompt, gen = next(self._stream)
        gen = max(1, min(gen, self.max_kv // 2))
        prompt = max(1, min(prompt, self.max_kv - gen - self.q_decode))
        prefilled = prompt if self.source != "chunked-prefill" else 0
        done = 0
        if warm:  # start somewhere inside the request's life
            chunks = -(-prompt // self.CHUNK)
            if self.source == "chunked-prefill" and self._rng.random() < chunks / (chunks + gen):
                prefilled = int(self._rng.integers(0, prompt))
            else:
                prefilled, done = prompt, int(self._rng.integers(0, gen))
        return [prompt, gen, prefilled, done]

    def __iter__(self) -> ContinuousBatch:
        return self

    def __next__(self) -> Step:
        q = np.empty(self.batch, dtype=np.int64)
        kv = np.empty(self.batch, dtype=np.int64)
        for i, slot in enumerate(self._slots):
            prompt, gen, prefilled, done = slot
            if prefilled < prompt:
                q[i] = min(self.CHUNK, prompt - prefilled)
                kv[i] = prefilled + q[i]
                slot[2] += int(q[i])
            else:
                q[i] = self.q_decode
                kv[i] = prompt + done + q[i]
                slot[3] += self.q_decode  # every draft token accepted
                if slot[3] >= gen:
                    self._slots[i] = self._new_request()
        cu = np.zeros(self.batch + 1, dtype=np.int32)
        np.cumsum(q, out=cu[1:])
        return Step(cu, kv.astype(np.int32))

    def max_tokens(self) -> int:
        """An upper bound on query tokens per step for this source and batch."""
        if self.source == "chunked-prefill":
            return self.batch * self.CHUNK
        return self.batch * self.q_decode


def steps(source: str, batch: int, count: int, seed: int = 0, max_kv: int = 1 << 16) -> list[Step]:
    """``count`` consecutive steps of :class:`ContinuousBatch`."""
    gen = ContinuousBatch(source, batch, seed=seed, max_kv=max_kv)
    return [next(gen) for _ in range(count)]
