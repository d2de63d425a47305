"""A model of FlashInfer's split-kv planning (our own code).

From DESIGN.md section 1 and FlashInfer's public planner: a binary search finds the
smallest kv chunk size (in blocks, at least 1) such that the number of work items,
``sum over units of ceil(blocks_u / chunk)``, fits the core budget ``P``. Every unit is
cut into chunks of that size. When even unsplit units outnumber the cores the search ends
at the longest unit (no split) and the work items are placed as a GPU block scheduler
places CTAs: in order, each on the core that becomes free first (ties to the lower core).
"""

from __future__ import annotations

import heapq

from .workload import Partition, Segment, Workload, _ceil_div


def chunk_blocks(workload: Workload) -> int:
    """The smallest chunk size in blocks whose work items fit ``num_cores``."""
    blocks = [int(b) for b in workload.blocks]
    budget = workload.model.num_cores
    low, high = 1, max(blocks, default=1)
    while low < high:
        mid = (low + high) // 2
        if sum(_ceil_div(b, mid) for b in blocks) > budget:
            low = mid + 1
        else:
            high = mid
    return low


def flashinfer(workload: Workload) -> Partition:
    """FlashInfer's uniform-chunk split, scheduled onto the cores."""
    cores_n = workload.model.num_cores
    chunk = chunk_blocks(workload)
    items = []
    for u in range(workload.num_units):
        blocks = int(workload.blocks[u])
        for j in range(_ceil_div(blocks, chunk)):
            items.append(Segment(u, j * chunk, min((j + 1) * chunk, blocks)))
    cores: list[list[Segment]] = [[] for _ in range(cores_n)]
    free = [(0, c) for c in range(cores_n)]  # (time the core is free, core)
    for seg in items:
        at, c = heapq.heappop(free)
        cores[c].append(seg)
        heapq.heappush(free, (at + workload.segment_cost(seg), c))
    return Partition("flashinfer", workload, cores)
