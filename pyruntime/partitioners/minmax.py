"""Reference bounds for the balance study: exact min-max partitions over the legal cuts.

Not an anchor and not our kernel: a slow pure-Python yardstick. Given an order of the units,
the legal cuts are the unit starts and the block boundaries inside a unit (as in
``aicpu_tiling.h``); a piece that continues a unit pays ``cost_segment`` again. The smallest
bottleneck ``B`` for which a greedy fill (each core takes as much as fits under ``B``) places
every block is the exact min-max over contiguous partitions in that order (taking more never
hurts the cores after: a unit's remainder costs ``cost_segment`` plus its blocks whoever
starts it). :func:`minmax` takes the units in the kernel's work order by default, the
head-major order ``(kv head, request, query tile)`` (also the order of FlashMLA's per-head
grid), so it bounds our partition from below; :func:`minmax_best_order` also tries the
request-major order ``(request, kv head, query tile)``.
"""

from __future__ import annotations

from .workload import Partition, Segment, Workload, _ceil_div


def _fill(blocks: list[int], costs: list[int], seg: int, bound: int, cores: int):
    """Greedy fill under ``bound``: per core ``(position, begin, end)`` pieces, or None."""
    out: list[list[tuple[int, int, int]]] = []
    i, k, n = 0, 0, len(blocks)
    for _ in range(cores):
        load, mine = 0, []
        while i < n:
            full = seg + (blocks[i] - k) * costs[i]
            if load + full <= bound:
                mine.append((i, k, blocks[i]))
                load += full
                i, k = i + 1, 0
                continue
            take = (bound - load - seg) // costs[i] if costs[i] else 0
            if take > 0:
                mine.append((i, k, k + take))
                k += take
            break
        out.append(mine)
    return out if i >= n else None


def minmax(workload: Workload, order: list[int] | None = None) -> Partition:
    """The exact min-max partition of the units taken in ``order``, a list of unit indices
    (by default the kernel's head-major work order, ``workload.work_order``)."""
    model = workload.model
    order = [int(u) for u in workload.work_order] if order is None else order
    blocks = [int(workload.blocks[u]) for u in order]
    costs = [int(workload.block_w[u]) for u in order]
    seg, cores = model.cost_segment, model.num_cores
    low = _ceil_div(workload.total_cost, cores)
    high = low + 2 * seg + max(costs, default=0) + 1  # the kernel's own bound is below this
    while _fill(blocks, costs, seg, high, cores) is None:
        high *= 2
    while low < high:
        mid = (low + high) // 2
        if _fill(blocks, costs, seg, mid, cores) is None:
            low = mid + 1
        else:
            high = mid
    pieces = _fill(blocks, costs, seg, low, cores)
    assert pieces is not None
    parts = [[Segment(order[i], a, b) for i, a, b in core if b > a] for core in pieces]
    return Partition("minmax", workload, parts)


def minmax_best_order(workload: Workload) -> Partition:
    """The better of the exact min-max partitions in head-major (work) and request-major order."""
    first, second = minmax(workload), minmax(workload, list(range(workload.num_units)))
    best = min((first, second), key=lambda p: max(p.core_costs(), default=0))
    return Partition("minmax_best_order", workload, best.cores)
