"""Sliding-window balance: our tiling (ABI v5) against a model of FlashInfer with ``window_left``.

A window W lets a row at position p see the keys (p - W, p]. :class:`WindowedWorkload` is a
:class:`~.workload.Workload` whose units hold only the blocks their rows' windows touch, the
block-table columns ``[floor(kv_begin / bs), ceil(kv_end / bs))`` with ``kv_begin = max(0,
p0 - W + 1)`` for the unit's first row p0 (``aicpu_tiling.h``, THE WORK ORDER); its
``ideal()`` is the windowed ``W_total / cores + cost_segment``.

FlashInfer (flashinfer-ai/flashinfer, our own model written from the public source; its
``window_left`` is W - 1):

* The prefill planner (:func:`flashinfer_window`; also what a tensor-core decode runs):
  ``include/flashinfer/attention/scheduler.cuh`` ``PrefillSplitQOKVIndptr`` searches the kv
  chunk size over the effective lengths ``min(ceil((window_left + cta_tile_q) / page_size),
  pages)`` and gives each query tile ``ceil(effective / chunk)`` chunks; the paged prefill
  kernel (``include/flashinfer/attention/prefill.cuh``) starts them at the tile's window
  start ``kv_start_idx = max(0, kv_len + qo_tile_idx * CTA_TILE_Q / group - qo_len -
  window_left)``. So chunks cover the window only, like our units.
* The CUDA-core decode planner (:func:`flashinfer_decode_masked`): ``DecodePlan`` and
  ``BatchDecodeWithPagedKVCacheWorkEstimationDispatched`` take the page counts only, never
  the window, and ``BatchDecodeWithPagedKVCacheDevice`` (``decode.cuh``) walks every chunk
  ``[chunk_start, chunk_end)`` whole, the window being a logits mask. Its work is the
  windowless plan's, scored against the windowed ideal.

Placement on our cores and the cost model are as in :mod:`.flashinfer`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .flashinfer import cta_tile_q, flashinfer, kv_chunk_pages, place
from .workload import Balance, CostModel, Partition, Segment, Workload, WorkloadError, _ceil_div

__all__ = ["WindowedWorkload", "flashinfer_decode_masked", "flashinfer_window"]


class WindowedWorkload(Workload):
    """The units of one step under a sliding window ``window`` (tokens, >= 1; causal only).

    Attributes (beyond :class:`Workload`'s):
        sliding_window: W.
        first_blocks: int64 ``[num_units]``, each unit's first block-table column.
        kv_begin: int64 ``[num_units]``, the window start of each unit's first row.

    ``blocks`` counts only the window's blocks; segments count blocks from a unit's first
    column. ``pyruntime.partitioners.ours`` plans it with ``sliding_window`` set.

    Raises:
        WorkloadError: not causal, a window below 1, or invalid lengths.
    """

    def __init__(self, model: CostModel, cu_seqlens_q: Sequence[int],
                 seqlens_kv: Sequence[int], window: int) -> None:
        if not model.causal:
            raise WorkloadError("a sliding window needs causal attention")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise WorkloadError(f"the sliding window must be an int >= 1, got {window!r}")
        super().__init__(model, cu_seqlens_q, seqlens_kv)
        self.sliding_window = window
        size, q_tile = model.block_size, model.q_tile
        begin = [max(0, self.seqlens_kv[r] - self.q_lens[r] + t * q_tile - window + 1)
                 for r, t in zip(self.request.tolist(), self.tile.tolist())]  # fmt: skip
        self.kv_begin = np.asarray(begin, dtype=np.int64)
        self.first_blocks = self.kv_begin // size
        self.blocks = self.blocks - self.first_blocks
        self._blocks = self.blocks.tolist()

    def window_segments(self, request: int, head: int, q_span: tuple[int, int],
                        kv_span: tuple[int, int]) -> list[Segment]:
        """Segments of query tokens ``q_span`` of ``(request, head)`` over kv tokens ``kv_span``.

        Like :meth:`Workload.piece_segments` in absolute kv tokens: a begin at or before a
        unit's window start takes its first column (the block holding the start), an end at
        or past its causal end its last, an empty span or one that begins at or past the
        causal end nothing; other bounds snap to the nearest block boundary (half up), and
        the columns are counted from the unit's first.

        Raises:
            ValueError: a query bound is not a tile boundary.
        """
        q_tile, size = self.model.q_tile, self.model.block_size
        q_len = self.q_lens[request]
        if q_span[0] % q_tile or (q_span[1] % q_tile and q_span[1] != q_len):
            raise ValueError(f"query span {q_span} is not on {q_tile}-token tile boundaries")
        out = []
        for t in range(q_span[0] // q_tile, _ceil_div(min(q_span[1], q_len), q_tile)):
            u = self.unit_index(request, head, t)
            first = int(self.first_blocks[u])
            last = first + self._blocks[u]
            if kv_span[0] >= min(kv_span[1], self._kv_tokens[u]):
                continue  # empty, or begins at or past the causal end: takes nothing
            begin = first if kv_span[0] <= self.kv_begin[u] else (kv_span[0] + size // 2) // size
            end = last if kv_span[1] >= self._kv_tokens[u] else (kv_span[1] + size // 2) // size
            begin, end = max(begin, first), min(end, last)
            if begin < end:
                out.append(Segment(u, begin - first, end - first))
        return out

    # every anchor cuts in kv tokens: map its pieces onto the windowed units the same way
    piece_segments = window_segments


def _window_items(workload: WindowedWorkload, budget: int):
    """FlashInfer's prefill-planner items with ``window_left = W - 1``, in grid order."""
    model = workload.model
    size, heads, group = model.block_size, model.num_kv_heads, model.group
    q_lens, kv_lens = workload.q_lens, workload.seqlens_kv
    window_left = workload.sliding_window - 1
    pages = [_ceil_div(kv, size) if q else 0 for q, kv in zip(q_lens, kv_lens)]
    packed = [q * group for q in q_lens]
    tile = max(cta_tile_q(sum(packed) // max(len(packed), 1)), model.q_tile * group)
    # scheduler.cuh PrefillSplitQOKVIndptr: effective_kv_len_arr, in pages
    effective = [min(_ceil_div(window_left + tile, size), p) for p in pages]
    chunk = kv_chunk_pages(packed, effective, tile, budget * model.num_cores // heads,
                           max(128 // size, 1))
    tile_tokens = tile // group
    per_head = []
    for r in range(workload.batch):
        for t in range(_ceil_div(q_lens[r], tile_tokens)):
            q_span = (t * tile_tokens, min((t + 1) * tile_tokens, q_lens[r]))
            # prefill.cuh: kv_start_idx, the window start of the tile's first row
            start = max(0, kv_lens[r] + t * tile_tokens - q_lens[r] - window_left)
            for j in range(_ceil_div(max(effective[r], 1), chunk)):
                span = (min(start + j * chunk * size, kv_lens[r]),
                        min(start + (j + 1) * chunk * size, kv_lens[r]))
                per_head.append((r, q_span, span))
    return [(r, h, q, kv) for h in range(heads) for r, q, kv in per_head]


def flashinfer_window(workload: WindowedWorkload, budget: int = 1) -> Partition:
    """FlashInfer's prefill planner with ``window_left = W - 1`` at ``budget`` CTAs per SM."""
    items = [workload.window_segments(r, h, q, kv) for r, h, q, kv in _window_items(workload, budget)]
    items = [segs for segs in items if segs]
    return Partition(f"flashinfer_{budget}x_window", workload, place(workload, items, budget))


def flashinfer_decode_masked(workload: WindowedWorkload, budget: int = 1) -> Balance:
    """FlashInfer's CUDA-core decode: the windowless plan, its whole chunks computed (the
    window only masks), scored against the windowed ideal.

    Raises:
        ValueError: a request has more than one query token (not a decode batch).
    """
    if any(q > 1 for q in workload.q_lens):
        raise ValueError("the CUDA-core decode planner takes one query token per request")
    plain = Workload(workload.model, workload.cu_seqlens_q, workload.seqlens_kv)
    part = flashinfer(plain, budget)
    costs = part.core_costs()
    ideal = workload.ideal()
    busiest = max(costs, default=0)
    return Balance(name=f"flashinfer_{budget}x_decode_masked", max_core_cost=busiest,
                   ideal=ideal, ratio=busiest / ideal if ideal else 1.0,
                   segments=part.num_segments, units=plain.num_units, core_costs=costs)
