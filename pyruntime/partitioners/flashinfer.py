"""Models of FlashInfer's split-kv planners (our own code, written from the public source).

Follows flashinfer-ai/flashinfer ``include/flashinfer/attention/scheduler.cuh``:

* Decode (:func:`flashinfer`, every request has one query token):
  ``BatchDecodeWithPagedKVCacheWorkEstimationDispatched``. The budget is the occupancy,
  ``max_grid_size = num_blocks_per_sm * num_sm`` (``budget`` = blocks per SM: 1, 2 or 4).
  When ``batch * num_kv_heads >= max_grid_size`` nothing is split; otherwise
  ``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch`` finds the smallest pages per chunk
  (at least ``max(128 / page_size, 1)``) whose chunk count times ``num_kv_heads`` fits the
  grid (CUDA-graph mode: the split kernel is always used). The grid is
  ``(chunks, num_kv_heads)``, chunk index fastest.
* Other batches (:func:`flashinfer`): ``PrefillPlan`` / ``PrefillSplitQOKVIndptr``:
  ``cta_tile_q`` from ``FA2DetermineCtaTileQ`` on the mean packed query length
  (``> 64``: 128 rows, ``> 16``: 64, else 16), then ``PrefillBinarySearchKVChunkSize``
  over ``max_grid_size / num_kv_heads`` (the source fixes 2 blocks per SM here; the budget is
  applied instead). Items are (request, query tile, kv chunk) per kv head; chunks past a
  tile's causal end are empty and skipped.
* Persistent (:func:`flashinfer_persistent`): ``TwoStageHolisticPlan`` (``BatchAttention``):
  two CTAs per SM (head dim < 256); requests with more than 16 packed rows use 128-row tiles,
  the others 16; ``kv_len_limit = f(ceil(total causal kv * num_kv_heads / CTAs))`` with
  ``f(x) = 128`` for ``x <= 128`` else ``x`` rounded up to 256, halved (up to
  ``num_kv_heads``) for the 128-row tiles; every (tile, kv chunk, kv head) goes to the CTA
  with the least accumulated ``2 * tile_rows + kv_tokens`` (a min-heap).

Placement and scoring: a GPU runs ``budget`` CTAs per SM at once, sharing the SM; the items
are placed in grid order on ``cores * budget`` slots, each to the slot that frees first
(slot ``s`` on core ``s % cores``), a slot's time advancing by ``budget * cost``. A core's cost
is the sum of its items' costs under the cost model. Query tiles are never finer than the cost
model's unit (128 packed rows under ours: FA2's and the persistent planner's own choice for
long queries; 512 under the FIA V3 model, so there prefill tiles are coarser than FlashInfer's);
kv chunk bounds snap to our blocks.
"""

from __future__ import annotations

import heapq

from .workload import Partition, Segment, Workload, _ceil_div

CTAS_PER_SM_PERSISTENT = 2
HOLISTIC_TILE_ROWS = (128, 16)

Item = tuple[int, int, tuple[int, int], tuple[int, int]]  # request, head, q span, kv span


def place(workload: Workload, items: list[list[Segment]], budget: int) -> list[list[Segment]]:
    """Items (each a segment list) in grid order onto ``cores * budget`` shared slots."""
    cores_n = workload.model.num_cores
    cores: list[list[Segment]] = [[] for _ in range(cores_n)]
    free = [(0, s) for s in range(cores_n * budget)]
    for segs in items:
        at, slot = heapq.heappop(free)
        cores[slot % cores_n] += segs
        heapq.heappush(free, (at + budget * sum(workload.segment_cost(s) for s in segs), slot))
    return cores


def min_pages_per_chunk(pages: list[int], heads: int, max_grid: int, lower: int = 1) -> int:
    """``PartitionPagedKVCacheBinarySearchMinNumPagePerBatch``: the chunk size in pages."""
    low, high = lower, max(pages, default=0)
    while low < high:
        mid = (low + high) // 2
        if sum(_ceil_div(p, mid) for p in pages) * heads > max_grid:
            low = mid + 1
        else:
            high = mid
    return low


def cta_tile_q(avg_packed_rows: int) -> int:
    """``FA2DetermineCtaTileQ`` for head dim 128 on sm80+."""
    if avg_packed_rows > 64:
        return 128
    return 64 if avg_packed_rows > 16 else 16


def kv_chunk_pages(
    packed: list[int], pages: list[int], tile: int, max_batch: int, lower: int = 1
) -> int:
    """``PrefillBinarySearchKVChunkSize``: the kv chunk size in pages."""
    low, high = lower, max(max(pages, default=1), 1)
    while low < high:
        mid = (low + high) // 2
        count = sum(_ceil_div(q, tile) * _ceil_div(max(p, 1), mid) for q, p in zip(packed, pages))
        if count > max_batch:
            low = mid + 1
        else:
            high = mid
    return low


def _plan_items(workload: Workload, budget: int) -> list[Item]:
    """FlashInfer's work items in grid order (decode or prefill planner)."""
    model = workload.model
    size = model.block_size
    q_lens, kv_lens = workload.q_lens, workload.seqlens_kv
    pages = [_ceil_div(kv, size) if q else 0 for q, kv in zip(q_lens, kv_lens)]
    max_grid = budget * model.num_cores
    lower = max(128 // size, 1)
    heads = model.num_kv_heads
    live = [r for r in range(workload.batch) if q_lens[r]]
    if all(q <= 1 for q in q_lens):
        if len(live) * heads >= max_grid:
            chunk = max(pages, default=1)
        else:
            chunk = min_pages_per_chunk([pages[r] for r in live], heads, max_grid, lower)
        per_head = [(r, (0, 1), (j * chunk * size, (j + 1) * chunk * size))
                    for r in live for j in range(_ceil_div(max(pages[r], 1), chunk))]  # fmt: skip
    else:
        packed = [q * model.group for q in q_lens]
        tile = max(cta_tile_q(sum(packed) // max(len(packed), 1)), model.q_tile * model.group)
        chunk = kv_chunk_pages(packed, pages, tile, max_grid // heads, lower)
        per_head = []
        tile_tokens = tile // model.group
        for r in live:
            for t in range(_ceil_div(q_lens[r], tile_tokens)):
                q_span = (t * tile_tokens, min((t + 1) * tile_tokens, q_lens[r]))
                for j in range(_ceil_div(max(pages[r], 1), chunk)):
                    per_head.append((r, q_span, (j * chunk * size, (j + 1) * chunk * size)))
    return [(r, h, q, kv) for h in range(heads) for r, q, kv in per_head]


def flashinfer(workload: Workload, budget: int = 1) -> Partition:
    """FlashInfer's split-kv plan at ``budget`` CTAs per SM, placed on the cores."""
    items = [workload.piece_segments(r, h, q, kv) for r, h, q, kv in _plan_items(workload, budget)]
    items = [segs for segs in items if segs]
    return Partition(f"flashinfer_{budget}x", workload, place(workload, items, budget))


def _causal_kv_end(q_len: int, kv_len: int, tile: int, tile_rows: int, tiles: int, group: int) -> int:
    """``packed_causal_kv_end``."""
    if tile + 1 == tiles:
        return kv_len
    return max(min(kv_len - q_len + _ceil_div((tile + 1) * tile_rows, group), kv_len), 0)


def holistic_items(workload: Workload) -> list[tuple[int, Item]]:
    """``TwoStageHolisticPlan``: ``(cta, item)`` for every work item, in planning order."""
    model = workload.model
    group, heads = model.group, model.num_kv_heads
    ctas = CTAS_PER_SM_PERSISTENT * model.num_cores
    q_lens, kv_lens = workload.q_lens, workload.seqlens_kv
    tasks: list[list[int]] = [[], []]
    for r in range(workload.batch):
        tasks[0 if q_lens[r] * group > HOLISTIC_TILE_ROWS[1] else 1].append(r)
    total_kv = 0
    unit_rows = model.q_tile * group
    tile_rows = [max(HOLISTIC_TILE_ROWS[0], unit_rows), HOLISTIC_TILE_ROWS[1]]
    for task, rows in zip(tasks, tile_rows):
        for r in task:
            tiles = _ceil_div(q_lens[r] * group, rows)
            total_kv += sum(_causal_kv_end(q_lens[r], kv_lens[r], t, rows, tiles, group)
                            for t in range(tiles))  # fmt: skip
    share = max(_ceil_div(total_kv * heads, ctas), 1)
    heap = [(0, c) for c in range(ctas)]
    out: list[tuple[int, Item]] = []
    for task, rows in zip(tasks, tile_rows):
        limit = 128 if share <= 128 else _ceil_div(share, 256) * 256
        if rows >= 64:
            limit //= min(heads, 2)
        for r in task:
            if not q_lens[r]:
                continue
            tiles = _ceil_div(q_lens[r] * group, rows)
            tile_tokens = max(rows // group, 1)
            for t in range(tiles):
                remaining = _causal_kv_end(q_lens[r], kv_lens[r], t, rows, tiles, group)
                q_span = (t * tile_tokens, min((t + 1) * tile_tokens, q_lens[r])) if tiles > 1 \
                    else (0, q_lens[r])
                start = 0
                while remaining > 0:
                    length = min(remaining, limit)
                    for h in range(heads):
                        cost, cta = heapq.heappop(heap)
                        heapq.heappush(heap, (cost + 2 * rows + length, cta))
                        out.append((cta, (r, h, q_span, (start, start + length))))
                    remaining -= length
                    start += length
    return out


def flashinfer_persistent(workload: Workload) -> Partition:
    """FlashInfer's persistent (holistic) schedule; CTA ``j`` on core ``j % cores``."""
    cores_n = workload.model.num_cores
    cores: list[list[Segment]] = [[] for _ in range(cores_n)]
    for cta, (r, h, q, kv) in holistic_items(workload):
        cores[cta % cores_n] += workload.piece_segments(r, h, q, kv)
    return Partition("flashinfer_persistent", workload, cores)
