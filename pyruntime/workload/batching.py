"""Continuous batching of requests into padded capture buckets.

Requests arrive (trace time advances `step_s` per step; `step_s=None` admits as fast as
slots free up), are admitted while a slot, token budget and KV blocks are free, prefill
(in chunks of `prefill_chunk` tokens when > 0, else their context is taken as already
cached), decode their generated tokens (`spec_tokens` query tokens per step when > 1:
speculative decode, accepting 1..spec_tokens), and leave. The live batch is padded to the
smallest capture bucket that holds it with zero-length slots (q_len = kv_len = 0), as
vLLM pads a batch to a captured graph size.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator, Sequence

import numpy as np

from .trace import TraceRequest


@dataclasses.dataclass(frozen=True)
class StepBatch:
    """One step's inputs (int32 numpy) in the `StaticAttention.step` layout.

    Attributes:
        block_table: ``[max_batch, max_blocks_per_req]``; rows past `live` are zero.
        cu_seqlens_q: ``[bucket + 1]``; seqlens_kv: ``[bucket]`` (padding slots are 0).
        live: real requests (the first `live` slots); bucket: padded batch size.
        prefills: requests in this step that are prefilling a chunk.
    """

    block_table: np.ndarray
    cu_seqlens_q: np.ndarray
    seqlens_kv: np.ndarray
    live: int
    prefills: int

    @property
    def bucket(self) -> int:
        return int(self.seqlens_kv.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens_q[-1])


@dataclasses.dataclass
class _Running:
    prefill_left: int
    decode_left: int
    kv: int
    blocks: list[int]


class ContinuousBatcher:
    """Turns a request stream into `StepBatch`es (iterate it, or call `next_step`).

    Args:
        requests: the stream (e.g. `trace.load_trace()` or `synthetic.synthetic_requests`).
        max_batch, max_tokens, block_size, max_blocks_per_req, num_blocks: the static shapes.
        buckets: capture batch sizes to pad to (default: no padding beyond the live batch).
        spec_tokens: query tokens per decoding request per step (1: plain decode).
        prefill_chunk: prefill chunk size (0: contexts are already in the KV cache).
        length_scale: multiply context and generated lengths (to shrink trace shapes).
        step_s: trace seconds per step (None: admit regardless of arrival time).
        seed: block placement and speculative acceptance.
    """

    def __init__(self, requests: Sequence[TraceRequest], *, max_batch: int, max_tokens: int,
                 block_size: int, max_blocks_per_req: int, num_blocks: int,
                 buckets: Sequence[int] | None = None, spec_tokens: int = 1,
                 prefill_chunk: int = 0, length_scale: float = 1.0,
                 step_s: float | None = None, seed: int = 0) -> None:
        if spec_tokens < 1 or spec_tokens > max_tokens:
            raise ValueError(f"spec_tokens must be in [1, max_tokens], got {spec_tokens}")
        self.max_batch, self.max_tokens = max_batch, max_tokens
        self.block_size, self.max_blocks_per_req = block_size, max_blocks_per_req
        self.buckets = sorted(buckets) if buckets else None
        if self.buckets and self.buckets[-1] < max_batch:
            self.buckets.append(max_batch)
        self.spec_tokens, self.prefill_chunk = spec_tokens, prefill_chunk
        self.length_scale, self.step_s = length_scale, step_s
        self.rng = np.random.default_rng(seed)
        self.free_blocks = deque(int(b) for b in self.rng.permutation(num_blocks))
        self.waiting = deque(requests)
        self.running: list[_Running] = []
        self.clock = 0.0
        self.finished = 0

    def _shape(self, req: TraceRequest) -> tuple[int, int]:
        capacity = self.max_blocks_per_req * self.block_size
        generated = max(1, min(int(req.generated_tokens * self.length_scale), capacity // 2))
        context = int(req.context_tokens * self.length_scale)
        context = max(1, min(context, capacity - generated - self.spec_tokens))
        return context, generated

    def _grow(self, run: _Running, kv_len: int) -> bool:
        need = -(-kv_len // self.block_size) - len(run.blocks)
        if need > len(self.free_blocks):
            return False
        run.blocks.extend(self.free_blocks.popleft() for _ in range(max(0, need)))
        return True

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_batch:
            req = self.waiting[0]
            if self.step_s is not None and req.arrival_s > self.clock:
                if self.running:
                    return
                self.clock = req.arrival_s  # idle: jump to the next arrival
            context, generated = self._shape(req)
            chunked = self.prefill_chunk > 0
            run = _Running(context if chunked else 0, generated, 0 if chunked else context, [])
            if not self._grow(run, run.kv + self.spec_tokens):
                return
            self.waiting.popleft()
            self.running.append(run)

    def next_step(self) -> StepBatch | None:
        """The next step's batch, or None when every request has finished."""
        self._admit()
        if not self.running:
            return None
        budget = self.max_tokens
        plan = []  # (run, q_len); decodes first, as vLLM orders them
        for run in sorted(self.running, key=lambda r: r.prefill_left > 0):
            want = min(self.prefill_chunk, run.prefill_left) if run.prefill_left else \
                self.spec_tokens
            q_len = min(want, budget)
            if q_len == 0 or not self._grow(run, run.kv + q_len):
                continue
            budget -= q_len
            plan.append((run, q_len))
        live = len(plan)
        if live == 0:
            raise RuntimeError(f"no running request can grow its KV: all {len(self.running)} "
                               "are stuck on KV blocks; raise num_blocks")
        bucket = next((b for b in self.buckets if b >= live), live) if self.buckets else live
        table = np.zeros((self.max_batch, self.max_blocks_per_req), np.int32)
        cu = np.zeros(bucket + 1, np.int32)
        kv = np.zeros(bucket, np.int32)
        for i, (run, q_len) in enumerate(plan):
            table[i, : len(run.blocks)] = run.blocks
            cu[i + 1] = cu[i] + q_len
            kv[i] = run.kv + q_len
        cu[live + 1 :] = cu[live]
        prefills = sum(1 for run, _ in plan if run.prefill_left)
        for run, q_len in plan:
            self._advance(run, q_len)
        if self.step_s is not None:
            self.clock += self.step_s
        return StepBatch(table, cu, kv, live, prefills)

    def _advance(self, run: _Running, q_len: int) -> None:
        if run.prefill_left:
            run.prefill_left -= q_len
            run.kv += q_len
            return
        accepted = int(self.rng.integers(1, q_len + 1)) if q_len > 1 else q_len
        accepted = min(accepted, run.decode_left)
        run.kv += accepted
        run.decode_left -= accepted
        if run.decode_left <= 0:
            self.running.remove(run)
            self.free_blocks.extend(run.blocks)
            self.finished += 1

    def __iter__(self) -> Iterator[StepBatch]:
        while (batch := self.next_step()) is not None:
            yield batch
