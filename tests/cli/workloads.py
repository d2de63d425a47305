"""Small hand-made workloads for the partitioner tests."""

from __future__ import annotations

from pyruntime.partitioners import CostModel, Workload


def workload(kv, q=None, **model) -> Workload:
    """A `Workload` of requests with kv lengths `kv` and query lengths `q` (decode: all 1)."""
    q = q or [1] * len(kv)
    cu = [0]
    for x in q:
        cu.append(cu[-1] + x)
    return Workload(CostModel(**model), cu, kv)
