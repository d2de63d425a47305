"""Tilings built by hand in the ABI v3 layout (v5 block columns), with cuts the test chooses.

The consumers (the C reference attention, the Triton kernels, `pyruntime.tiling`'s decoders,
the partitioners' reader) must accept any valid tiling, not only the cuts the kernel's
partition happens to pick. :func:`handmade_tiling` writes one from the lengths and a list of
core boundaries on the head-major block axis (``aicpu_tiling.h``, THE WORK ORDER and THE
BUFFER), so a test can put a core's range across kv heads, across padded requests at a head
change, or inside a unit, wherever the partition would not. With ``params.sliding_window``
(ABI v5) a unit's blocks are the columns [floor(kv_begin / bs), ceil(kv_end / bs)) and the
core records name absolute columns.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from pyruntime._native import lib

from pyruntime import tiling
from pyruntime.tiling_oracle import oracle_live_batch

_INT32_MAX = 2**31 - 1


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def work_units(params, cu: Sequence[int], kv: Sequence[int], causal: bool):
    """``[(r, h, t, blocks, block_cost, first_column)]`` in the head-major work order."""
    group = params.num_q_heads // params.num_kv_heads
    window = getattr(params, "sliding_window", 0) or 0
    units = []
    for h in range(params.num_kv_heads):
        for r in range(len(kv)):
            q_len = cu[r + 1] - cu[r]
            for t in range(_ceil_div(q_len, params.q_tile)):
                t_end = min((t + 1) * params.q_tile, q_len)
                kv_end = kv[r] - q_len + t_end if causal else kv[r]
                rows = (t_end - t * params.q_tile) * group
                w = _ceil_div(params.block_size, 16) * (
                    params.cost_kv_load + params.cost_qk_tile * _ceil_div(rows, 16))
                kv_begin = max(0, kv[r] - q_len + t * params.q_tile - window + 1) if window else 0
                first = kv_begin // params.block_size
                units.append((r, h, t, _ceil_div(kv_end, params.block_size) - first, w, first))
    return units


def num_work_blocks(params, cu, kv, causal: bool = True) -> int:
    """Blocks over all units: the length of the axis :func:`handmade_tiling` cuts."""
    return sum(u[3] for u in work_units(params, cu, kv, causal))


def handmade_tiling(params, cu: Sequence[int], kv: Sequence[int], bounds: Sequence[int], *,
                    causal: bool = True, epoch: int = 0) -> tiling.Tiling:
    """A successful ABI v3 tiling whose core c runs blocks ``[bounds[c], bounds[c + 1])``.

    Args:
        params: a ``pyruntime.tiling.TilingParams``.
        cu, kv: ``cu_seqlens_q [batch + 1]`` and ``seqlens_kv [batch]`` (valid inputs).
        bounds: ``num_cores + 1`` non-decreasing offsets on the axis of every kv block of
            every unit in head-major work order, from 0 to :func:`num_work_blocks`.
        causal: the flag the tiling is made for.
        epoch: the header's epoch word.

    Returns:
        A ``pyruntime.tiling.Tiling`` over a ``uint8 [params.tiling_bytes]`` buffer, laid out
        as the kernel lays it out (slots and combine records numbered in work order).
    """
    units = work_units(params, cu, kv, causal)
    starts = np.cumsum([0] + [u[3] for u in units]).tolist()
    assert len(bounds) == params.num_cores + 1 and bounds[0] == 0 and bounds[-1] == starts[-1]
    assert all(a <= b for a, b in itertools.pairwise(bounds))

    def position(offset: int) -> tuple[int, int, int, int]:
        if offset == starts[-1]:
            return 0, params.num_kv_heads, 0, 0
        u = int(np.searchsorted(starts, offset, side="right")) - 1
        r, h, t = units[u][:3]
        return r, h, t, units[u][5] + offset - starts[u]

    # pieces of each unit, in work order; a unit cut by a bound has a slot per piece
    pieces: dict[int, list[tuple[int, int, int]]] = {}   # unit -> [(core, k_begin, k_end)]
    for c in range(params.num_cores):
        lo, hi = bounds[c], bounds[c + 1]
        for u, (start, end) in enumerate(itertools.pairwise(starts)):
            if max(lo, start) < min(hi, end):
                pieces.setdefault(u, []).append((c, max(lo, start) - start, min(hi, end) - start))
    slot_of: dict[tuple[int, int], int] = {}
    combine = []
    next_slot = 0
    for u in sorted(pieces):
        if len(pieces[u]) > 1:
            combine.append((*units[u][:3], next_slot, len(pieces[u])))
            for c, _, _ in pieces[u]:
                slot_of[(u, c)] = next_slot
                next_slot += 1

    words = np.zeros(params.tiling_bytes // 4, dtype=np.int32)
    seg_cost = params.cost_segment
    core_costs = []
    for c in range(params.num_cores):
        mine = [(u, kb, ke) for u in sorted(pieces) for (cc, kb, ke) in pieces[u] if cc == c]
        cost = sum(seg_cost + (ke - kb) * units[u][4] for u, kb, ke in mine)
        core_costs.append(cost)
        first = slot_of.get((mine[0][0], c), -1) if mine else -1
        last = slot_of.get((mine[-1][0], c), -1) if mine else -1
        rec = (*position(bounds[c]), *position(bounds[c + 1]), first, last, len(mine),
               min(cost, _INT32_MAX))
        at = lib.AICPU_TILING_HDR_WORDS + c * lib.AICPU_TILING_CORE_WORDS
        words[at : at + lib.AICPU_TILING_CORE_WORDS] = rec
    comb_at = lib.AICPU_TILING_HDR_WORDS + lib.AICPU_TILING_CORE_WORDS * params.num_cores
    for i, rec in enumerate(combine):
        at = comb_at + i * lib.AICPU_TILING_COMB_WORDS
        words[at : at + 5] = rec
    total = sum(seg_cost + u[3] * u[4] for u in units)
    live = oracle_live_batch(kv, len(kv))
    header = {
        lib.AICPU_TILING_HDR_MAGIC: lib.AICPU_TILING_MAGIC,
        lib.AICPU_TILING_HDR_VERSION: lib.AICPU_TILING_VERSION,
        lib.AICPU_TILING_HDR_STATUS: lib.AICPU_TILING_OK,
        lib.AICPU_TILING_HDR_BAD_REQUEST: -1,
        lib.AICPU_TILING_HDR_BATCH: live,  # trailing kv_len 0 slots are padding (ABI v4)
        lib.AICPU_TILING_HDR_NUM_TOKENS: cu[live],
        lib.AICPU_TILING_HDR_NUM_CORES: params.num_cores,
        lib.AICPU_TILING_HDR_NUM_UNITS: len(units),
        lib.AICPU_TILING_HDR_NUM_SEGMENTS: sum(len(p) for p in pieces.values()),
        lib.AICPU_TILING_HDR_NUM_SLOTS: next_slot,
        lib.AICPU_TILING_HDR_NUM_COMBINE: len(combine),
        lib.AICPU_TILING_HDR_MAX_CORE_COST: min(max(core_costs, default=0), _INT32_MAX),
        lib.AICPU_TILING_HDR_TOTAL_COST: min(total, _INT32_MAX),
        lib.AICPU_TILING_HDR_FLAGS: lib.AICPU_TILING_CAUSAL if causal else 0,
        lib.AICPU_TILING_HDR_EPOCH: epoch,
    }
    for index, value in header.items():
        words[index] = value
    return tiling.Tiling(params, words.view(np.uint8), np.asarray(cu, dtype=np.int32),
                         np.asarray(kv, dtype=np.int32), causal)


def expected_segments(params, cu, kv, bounds, causal: bool = True) -> list[tiling.Segment]:
    """The segments the tiling of :func:`handmade_tiling` holds, cores in order, each core's
    in work order (what ``Tiling.segments()`` must decode)."""
    units = work_units(params, cu, kv, causal)
    starts = np.cumsum([0] + [u[3] for u in units]).tolist()
    made = handmade_tiling(params, cu, kv, bounds, causal=causal)
    records = made.cores()
    out = []
    for c in range(params.num_cores):
        lo, hi = bounds[c], bounds[c + 1]
        mine = [u for u, (a, b) in enumerate(itertools.pairwise(starts)) if max(lo, a) < min(hi, b)]
        for i, u in enumerate(mine):
            r, h, t, _, _, first = units[u]
            q_len = cu[r + 1] - cu[r]
            kv_end = kv[r] - q_len + min((t + 1) * params.q_tile, q_len) if causal else kv[r]
            kb, ke = max(lo, starts[u]) - starts[u], min(hi, starts[u + 1]) - starts[u]
            split = -1
            if i == 0:
                split = records[c].first_slot
            elif i == len(mine) - 1:
                split = records[c].last_slot
            out.append(tiling.Segment(c, r, h, t * params.q_tile,
                                      min((t + 1) * params.q_tile, q_len),
                                      (first + kb) * params.block_size,
                                      min((first + ke) * params.block_size, kv_end), split,
                                      first + kb, first + ke))
    return out
