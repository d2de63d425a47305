"""Work partitioners evaluated under one cost model: ours and models of the anchors'.

``PARTITIONERS`` maps a name to a function ``Workload -> Partition``. All partitions are
charged by :class:`CostModel` (the cost model of ``aicpu_tiling.h``), so
``Partition.balance()`` (busiest core over ``W / P + cost_segment``, segment count) is
comparable across them.

    >>> from pyruntime.partitioners import CostModel, Workload, PARTITIONERS
    >>> w = Workload(CostModel(num_cores=4), [0, 1, 2], [300, 5000])
    >>> PARTITIONERS["flashmla"](w).balance().segments >= w.num_units
    True
"""

from __future__ import annotations

from collections.abc import Callable

from .fia import fia_even, fia_weighted
from .flashinfer import flashinfer
from .flashmla import flashmla
from .ours_abi import TilingUnavailableError, ours
from .workload import Balance, CostModel, Partition, Segment, Workload, WorkloadError

Partitioner = Callable[[Workload], Partition]

ANCHORS: dict[str, Partitioner] = {
    "fia_even": fia_even,
    "fia_weighted": fia_weighted,
    "flashmla": flashmla,
    "flashinfer": flashinfer,
}
PARTITIONERS: dict[str, Partitioner] = {"ours": ours, **ANCHORS}

__all__ = [
    "ANCHORS",
    "PARTITIONERS",
    "Balance",
    "CostModel",
    "Partition",
    "Partitioner",
    "Segment",
    "TilingUnavailableError",
    "Workload",
    "WorkloadError",
]
