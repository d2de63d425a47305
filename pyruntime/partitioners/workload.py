"""The attention work of one step under the tiling cost model of ``aicpu_tiling.h``.

Every partitioner in this package, ours and the anchors' models, splits the same list of
units and is charged by the same integer cost model, so the busiest core's cost and the
segment counts of different partitioners are directly comparable.

A unit is ``(request, kv_head, query_tile)``, indexed request-major (request, kv head,
query tile); the kernel's work order is head-major (kv head, request, query tile), and
:attr:`Workload.work_order` lists the unit indices in that order. Its cost is
``cost_segment + blocks * w(rows)`` where ``w(rows) = ceil(block_size / 16) *
(cost_kv_load + cost_qk_tile * ceil(rows / 16))`` (see THE COST MODEL in the header).
A piece of a unit holding ``n`` of its blocks costs ``cost_segment + n * w``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = [
    "Balance",
    "CostModel",
    "NotApplicableError",
    "Partition",
    "Segment",
    "Workload",
    "WorkloadError",
]


class WorkloadError(ValueError):
    """Lengths that do not describe a valid step (the kernel would reject them too)."""


class NotApplicableError(ValueError):
    """An anchor's kernel cannot run this batch (e.g. IFA or FlashMLA with mixed query lengths)."""


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class CostModel:
    """Head geometry and cost weights: the static part of the tiling parameters.

    Defaults follow ``AICPU_TILING_DEFAULT_COST_*`` in the header.
    """

    num_q_heads: int = 32
    num_kv_heads: int = 8
    block_size: int = 128
    q_tile: int | None = None  # default max(1, 128 // group), as pyruntime.tiling
    num_cores: int = 24
    cost_kv_load: int = 4
    cost_qk_tile: int = 1
    cost_segment: int = 32
    causal: bool = True

    def __post_init__(self) -> None:
        if self.q_tile is None and self.num_kv_heads >= 1 and self.num_q_heads >= 1:
            object.__setattr__(
                self, "q_tile", max(1, 128 // (self.num_q_heads // self.num_kv_heads or 1))
            )
        for name in ("num_q_heads", "num_kv_heads", "block_size", "q_tile", "num_cores"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_q_heads % self.num_kv_heads:
            raise WorkloadError(
                f"num_q_heads ({self.num_q_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if min(self.cost_kv_load, self.cost_qk_tile, self.cost_segment) < 0:
            raise WorkloadError("cost weights must be >= 0")

    @property
    def group(self) -> int:
        """Query heads per kv head (GQA group)."""
        return self.num_q_heads // self.num_kv_heads

    def block_cost(self, rows: int) -> int:
        """``w(rows)``: the cost of one kv block for a unit of ``rows`` query rows."""
        return _ceil_div(self.block_size, 16) * (
            self.cost_kv_load + self.cost_qk_tile * _ceil_div(rows, 16)
        )


class Segment(NamedTuple):
    """Blocks ``[block_begin, block_end)`` of unit ``unit`` run by one core.

    A named tuple, so that a partition's segments convert to one int64 array at once.
    """

    unit: int
    block_begin: int
    block_end: int


class Workload:
    """The units of one step, indexed request-major, with their block counts and block costs.

    The request-major index (:meth:`unit_index`) is what segments name; the kernel's
    head-major work order over the same units is :attr:`work_order` and
    :meth:`work_position`.

    Args:
        model: geometry and cost weights.
        cu_seqlens_q: ``[batch + 1]`` int query offsets, starting at 0.
        seqlens_kv: ``[batch]`` int kv lengths including this step's query tokens.

    Raises:
        WorkloadError: offsets not starting at 0 or decreasing, negative kv lengths,
            kv shorter than the query when causal, or a non-causal query with no kv.
    """

    def __init__(
        self, model: CostModel, cu_seqlens_q: Sequence[int], seqlens_kv: Sequence[int]
    ) -> None:
        cu = [int(x) for x in cu_seqlens_q]
        kv = [int(x) for x in seqlens_kv]
        if len(cu) != len(kv) + 1:
            raise WorkloadError(
                f"cu_seqlens_q has {len(cu)} entries, expected len(seqlens_kv) + 1 = {len(kv) + 1}"
            )
        if cu[0] != 0:
            raise WorkloadError(f"cu_seqlens_q[0] must be 0, got {cu[0]}")
        self.model = model
        self.cu_seqlens_q = cu
        self.seqlens_kv = kv
        self._q_lens = [b - a for a, b in itertools.pairwise(cu)]
        request, head, tile, blocks, w, kv_tokens = [], [], [], [], [], []
        for r, kv_len in enumerate(kv):
            q_len = cu[r + 1] - cu[r]
            if q_len < 0:
                raise WorkloadError(f"request {r}: cu_seqlens_q decreases ({cu[r]} -> {cu[r + 1]})")
            if kv_len < 0:
                raise WorkloadError(f"request {r}: negative kv length {kv_len}")
            if q_len and model.causal and kv_len < q_len:
                raise WorkloadError(f"request {r}: kv length {kv_len} < query length {q_len}")
            if q_len and not model.causal and kv_len == 0:
                raise WorkloadError(f"request {r}: query of {q_len} tokens with no kv")
            for h in range(model.num_kv_heads):
                for t in range(_ceil_div(q_len, model.q_tile)):
                    t_end = min((t + 1) * model.q_tile, q_len)
                    rows = (t_end - t * model.q_tile) * model.group
                    kv_end = kv_len - q_len + t_end if model.causal else kv_len
                    request.append(r)
                    head.append(h)
                    tile.append(t)
                    blocks.append(_ceil_div(kv_end, model.block_size))
                    w.append(model.block_cost(rows))
                    kv_tokens.append(kv_end)
        tiles_per_request = [_ceil_div(cu[r + 1] - cu[r], model.q_tile) for r in range(len(kv))]
        self.tiles_per_request = np.asarray(tiles_per_request, dtype=np.int64)
        self.request_offsets = np.zeros(len(kv) + 1, dtype=np.int64)
        np.cumsum(self.tiles_per_request * model.num_kv_heads, out=self.request_offsets[1:])
        self.request = np.asarray(request, dtype=np.int64)
        self.head = np.asarray(head, dtype=np.int64)
        self.tile = np.asarray(tile, dtype=np.int64)
        self.blocks = np.asarray(blocks, dtype=np.int64)
        self.block_w = np.asarray(w, dtype=np.int64)
        self.kv_tokens = np.asarray(kv_tokens, dtype=np.int64)
        # plain-int copies for the per-piece paths of the anchor models
        self._blocks, self._kv_tokens = blocks, kv_tokens
        self._offsets = [int(x) for x in self.request_offsets]
        self._tiles = [int(x) for x in self.tiles_per_request]
        self._block_w = w
        # a request's first tile within one kv head's units (head-major work order)
        self._head_offsets = [0, *itertools.accumulate(self._tiles)]
        self._work_order: np.ndarray | None = None

    @property
    def batch(self) -> int:
        """Requests in the step, padded slots included."""
        return len(self.seqlens_kv)

    @property
    def q_lens(self) -> list[int]:
        """Query tokens per request."""
        return self._q_lens

    def unit_index(self, request: int, head: int, tile: int) -> int:
        """Index of unit ``(request, head, tile)`` (request-major: request, kv head, tile)."""
        return self._offsets[request] + head * self._tiles[request] + tile

    def work_position(self, request: int, head: int, tile: int) -> int:
        """Position of unit ``(request, head, tile)`` in the kernel's head-major work order
        (kv head, request, query tile; ``aicpu_tiling.h``, THE WORK ORDER)."""
        return head * self._head_offsets[-1] + self._head_offsets[request] + tile

    @property
    def work_order(self) -> np.ndarray:
        """int64 ``[num_units]``: the unit indices in the kernel's head-major work order."""
        if self._work_order is None:
            self._work_order = np.lexsort((self.tile, self.request, self.head)).astype(np.int64)
        return self._work_order

    @property
    def num_units(self) -> int:
        """Units (request, kv head, query tile)."""
        return int(self.blocks.size)

    @property
    def unit_costs(self) -> np.ndarray:
        """``cost_segment + blocks * w`` per unit, int64."""
        return self.model.cost_segment + self.blocks * self.block_w

    @property
    def total_cost(self) -> int:
        """W: the cost of the step with no unit split."""
        return int(self.unit_costs.sum())

    def ideal(self) -> float:
        """The balance lower bound used in reports: ``W / cores + cost_segment``."""
        return self.total_cost / self.model.num_cores + self.model.cost_segment

    def piece_segments(
        self, request: int, head: int, q_span: tuple[int, int], kv_span: tuple[int, int]
    ) -> list[Segment]:
        """The segments of query tokens ``q_span`` of ``(request, head)`` over kv tokens ``kv_span``.

        Anchors cut in tokens; this maps a piece onto units and blocks. Query bounds must fall
        on tile boundaries (or the query's end). A kv bound inside a block snaps to the nearest
        block boundary (half up); an end at or past a unit's causal end takes its last block, a
        begin at or past it takes nothing (so consecutive pieces never overlap), and empty
        segments are dropped.

        Raises:
            ValueError: a query bound is not a tile boundary.
        """
        q_tile = self.model.q_tile
        q_len = self._q_lens[request]
        q_begin, q_end = q_span
        if q_begin % q_tile or (q_end % q_tile and q_end != q_len):
            raise ValueError(f"query span {q_span} is not on {q_tile}-token tile boundaries")
        size = self.model.block_size
        first, last = (kv_span[0] + size // 2) // size, (kv_span[1] + size // 2) // size
        kv_end = kv_span[1]
        base = self._offsets[request] + head * self._tiles[request]
        out = []
        for t in range(q_begin // q_tile, -(-min(q_end, q_len) // q_tile)):
            u = base + t
            blocks = self._blocks[u]
            end = blocks if kv_end >= self._kv_tokens[u] else min(last, blocks)
            begin = blocks if kv_span[0] >= self._kv_tokens[u] else first
            if begin < end:
                out.append(Segment(u, begin, end))
        return out

    def segment_cost(self, seg: Segment) -> int:
        """Cost of one segment: its overhead plus its blocks."""
        return self.model.cost_segment + (seg.block_end - seg.block_begin) * self._block_w[seg.unit]


@dataclass
class Partition:
    """Per-core segment lists produced by one partitioner for one workload.

    ``baseline``: the workload the partition is scored against when its own units are not
    the caller's (FlashMLA's 64-row m blocks, which read each kv block once per m block): the
    ideal is then ``baseline``'s, so the extra work counts against the partition. ``None``:
    ``workload`` itself.
    """

    name: str
    workload: Workload
    cores: list[list[Segment]]
    baseline: Workload | None = None

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(core index, [n, 3] unit/begin/end)`` of every segment, int64."""
        lens = [len(core) for core in self.cores]
        flat = itertools.chain.from_iterable(itertools.chain.from_iterable(self.cores))
        segs = np.fromiter(flat, dtype=np.int64, count=3 * sum(lens)).reshape(-1, 3)
        return np.repeat(np.arange(len(self.cores)), lens), segs

    def core_costs(self) -> list[int]:
        """Each core's cost: the sum of its segments' costs."""
        core, segs = self._arrays()
        w = self.workload
        cost = w.model.cost_segment + (segs[:, 2] - segs[:, 1]) * w.block_w[segs[:, 0]]
        totals = np.zeros(len(self.cores), dtype=np.int64)
        np.add.at(totals, core, cost)
        return [int(c) for c in totals]

    @property
    def num_segments(self) -> int:
        """Segments over all cores."""
        return sum(len(core) for core in self.cores)

    def validate(self) -> None:
        """Check that the segments cover every block of every unit exactly once.

        Raises:
            AssertionError: with the first bad segment, or the first unit whose blocks are
                missed or repeated.
        """
        _, segs = self._arrays()
        w = self.workload
        unit, begin, end = segs[:, 0], segs[:, 1], segs[:, 2]
        ok = (unit >= 0) & (unit < w.num_units) & (begin >= 0) & (begin < end)
        ok[ok] &= end[ok] <= w.blocks[unit[ok]]
        bad_seg = np.nonzero(~ok)[0]
        assert bad_seg.size == 0, f"{self.name}: bad segment {tuple(segs[bad_seg[0]])}"
        covered = np.bincount(unit, weights=end - begin, minlength=w.num_units).astype(np.int64)
        bad = np.nonzero(covered != w.blocks)[0]
        assert bad.size == 0, f"{self.name}: unit {int(bad[0])} covered {covered[bad[0]]} blocks"

    def balance(self) -> Balance:
        """The balance figures of this partition."""
        costs = self.core_costs()
        ideal = (self.baseline or self.workload).ideal()
        busiest = max(costs) if costs else 0
        return Balance(
            name=self.name,
            max_core_cost=busiest,
            ideal=ideal,
            ratio=busiest / ideal if ideal else 1.0,
            segments=self.num_segments,
            units=self.workload.num_units,
            core_costs=costs,
        )


@dataclass(frozen=True)
class Balance:
    """Busiest-core cost over the ideal, and segment count, of one partition."""

    name: str
    max_core_cost: int
    ideal: float
    ratio: float
    segments: int
    units: int
    core_costs: list[int]
