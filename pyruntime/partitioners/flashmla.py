"""A model of FlashMLA's ``get_mla_metadata`` partition (our own code).

From DESIGN.md section 1: with ``n_u`` kv blocks per unit and ``F`` fixed blocks of
overhead per segment, ``T = sum(n_u + F)`` and every part gets a budget
``payload = ceil(T / P) + F``. Parts are filled greedily in unit order: a unit that fits
whole (its remaining blocks plus ``F``) is taken and the walk goes on; otherwise the part
takes ``payload_left - F`` blocks of it (when that is positive) and closes, and the next
part continues the unit. Bound: every part holds at most ``T/P + F + 1`` blocks' worth.

FlashMLA reasons in blocks with ``F = 5``; the resulting segments are charged under our
cost model like every other partitioner. The real kernel first spreads kv heads and query
row tiles over the grid and partitions requests over what is left of the SMs; this model
gives it the more favourable flat form: all units in one order over all ``P`` cores.
"""

from __future__ import annotations

from .workload import Partition, Segment, Workload, _ceil_div

FIXED_OVERHEAD_BLOCKS = 5


def flashmla(workload: Workload, fixed_overhead: int = FIXED_OVERHEAD_BLOCKS) -> Partition:
    """FlashMLA's payload partition of the units over ``num_cores`` parts."""
    cores_n = workload.model.num_cores
    blocks = [int(b) for b in workload.blocks]
    total = sum(b + fixed_overhead for b in blocks)
    payload = _ceil_div(total, cores_n) + fixed_overhead
    cores: list[list[Segment]] = []
    unit, block = 0, 0
    for _ in range(cores_n):
        part: list[Segment] = []
        left = payload
        while unit < len(blocks):
            remain = blocks[unit] - block
            if left >= remain + fixed_overhead:
                part.append(Segment(unit, block, blocks[unit]))
                left -= remain + fixed_overhead
                unit, block = unit + 1, 0
                continue
            if left - fixed_overhead > 0:
                take = left - fixed_overhead
                part.append(Segment(unit, block, block + take))
                block += take
            break
        cores.append(part)
    if unit < len(blocks):  # cannot happen with the payload above; kept as a guard
        raise AssertionError(f"flashmla: unit {unit} of {len(blocks)} left unassigned")
    return Partition("flashmla", workload, cores)
