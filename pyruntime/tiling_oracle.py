"""Slow, literal pure-Python oracle of the tiling kernel in ``aicpu_kernels/aicpu_tiling.h``.

The header is the specification (ABI version 5); this module re-implements it independently
of the C code so that the two can be compared byte for byte. It is deliberately naive: it
enumerates every unit (request, kv head, query tile) in head-major work order, lays the units
out on the position axis, finds the min-max budget by plain bisection over brute-force greedy
fills and snaps each greedy cut by scanning the legal cuts of the containing unit. Python
integers are exact, so the partition arithmetic matches the C int64 arithmetic wherever that
does not overflow.

Public API:
    oracle_params_check(params) -> int           AICPU_TILING_OK or E_PARAMS
    oracle_tiling_bytes(params) -> int           buffer size in bytes, 0 for invalid params
    oracle_max_slots(params) -> int              2 * (num_cores - 1), 0 for invalid params
    oracle_workspace_bytes(params) -> int        partials workspace bytes
    oracle_live_batch(seqlens_kv, batch) -> int   batch less its trailing kv_len == 0 slots
    oracle_units(params, cu_seqlens_q, seqlens_kv, batch, causal) -> list[Unit]
    oracle_cuts(params, units) -> list[tuple[int, int]]   per-core position ranges
    oracle_plan(params, cu_seqlens_q, seqlens_kv, batch, causal, epoch=0) -> np.ndarray (int32)
    segments(params, buffer, cu_seqlens_q, seqlens_kv, causal) -> list[Segment]
    check_coverage(params, cu_seqlens_q, seqlens_kv, batch, causal, buffer) -> None

``params`` is any object with int attributes named like the C struct fields; an optional
``sliding_window`` attribute (ABI v5; None or absent means 0) and an optional ``reserved``
attribute (a sequence of 3 ints) which is checked to be all zero, and treated as zeros when
absent.

Sliding window (ABI v5). With W = sliding_window > 0 (causal only) the unit (r, h, t) whose
rows are the positions [p0, p1) reads [kv_begin, kv_end) with kv_begin = max(0, p0 - W + 1):
its blocks are the block-table columns [floor(kv_begin / bs), ceil(kv_end / bs)), and its cost
and place on the position axis count only those. Core records name absolute columns.

The work order and the partition (header: THE WORK ORDER, THE PARTITION)
-------------------------------------------------------------------------
Units are laid out head-major: kv head h, then request r, then query tile t; unit u occupies
[U, U + cost_segment + blocks * w) of the position axis [0, W) (blocks = its columns
[first, last), see above). Every head has the same units,
so head h's work is [h * W_h, (h + 1) * W_h) with W_h = W / H. Legal cuts are unit starts and
the block boundaries U + cost_segment + k * w (1 <= k < blocks). A core takes a range [s, e)
of legal cuts and costs e - s, plus cost_segment when s lies strictly inside a unit.

The partition is always the exact min-max, never nearest cuts:
    * P a multiple of H (Q = P / H cores per head): cores h*Q .. h*Q + Q - 1 take head h, and
      every head is cut at the same offsets, the min-max partition of one head's interval
      [0, W_h) into Q ranges.
    * otherwise: the min-max partition of the whole axis [0, W) into P ranges.
The min-max of an interval [lo, hi) into n ranges: greedy filling with budget X, where each
core in turn takes work up to X and stops at the last legal cut that fits (a core that
cannot take one whole block stalls), fits when the n-th core reaches hi. X is the smallest
budget that fits; the partition is greedy filling with that X, so the busiest core costs X,
the least these cuts allow. Cores left over once the work is placed are idle at hi (the
start of the next head's first unit, or the end of the work).
Bound (tested, not used): with n ranges over an interval of cost S, the busiest core costs at
most ceil((S + (n - 1) * cost_segment) / n) + cost_segment + w_max, so at most
W / P + 2 * cost_segment + w_max + 1; and segments <= units + P - 1.

Rules chosen where the header leaves room (the C kernel must match them)
-------------------------------------------------------------------------
Invalid params (E_PARAMS), also a window without causal.
    ``oracle_plan`` returns only the 24-word header (the C kernel writes only the header):
    MAGIC, VERSION, STATUS = E_PARAMS, BAD_REQUEST = -1, BAD_VALUE = 0, BAD_LIMIT = 0,
    BATCH = batch as given, NUM_CORES = params.num_cores as given, FLAGS = flags passed,
    EPOCH = epoch as given, every other word 0. Nothing of cu_seqlens_q / seqlens_kv is read.

Validation order. First E_BATCH, then requests r = 0, 1, ..., batch - 1 in order; the first
    request with any offence is reported, and within a request the checks run in the order of
    the status codes. Fields are (status, BAD_REQUEST, BAD_VALUE, BAD_LIMIT):
    E_BATCH             batch < 0 or batch > max_batch:     (3, -1, batch, max_batch)
    E_QUERY_START       cu[0] != 0:                         (4, 0, cu[0], 0)
                        checked as the first check of request 0, and also when batch == 0
                        (cu[0] is still read); it always names request 0.
    E_QUERY_DECREASING  cu[r+1] < cu[r]:                    (5, r, cu[r+1], cu[r])
    E_QUERY_OVERFLOW    cu[r+1] > max_tokens:               (6, r, cu[r+1], max_tokens)
    E_KV_NEGATIVE       kv[r] < 0:                          (7, r, kv[r], 0)
    E_KV_SHORT          causal and kv[r] < q_len:           (8, r, kv[r], q_len)
    E_KV_CAPACITY       kv[r] > max_blocks_per_req*block:   (9, r, kv[r], max_blocks_per_req*block)
    E_KV_EMPTY          not causal, q_len > 0, kv[r] == 0:  (10, r, 0, 1)
    where q_len = cu[r+1] - cu[r] (only formed once cu[r+1] passed checks 5 and 6, so it lies
    in [0, max_tokens]). A request with q_len == 0 and 0 < kv_len <= capacity is valid and has
    no units, exactly like a padded slot.

Input error buffer. Header: MAGIC, VERSION, status, the three bad fields, BATCH = batch as
    given, NUM_TOKENS = 0, NUM_CORES = P, every count and cost 0, FLAGS, EPOCH. Every core
    record is begin = end = (0, 0, 0, 0), first_slot = last_slot = -1, 0 segments, cost 0.
    Combine table and padding all 0.

Trailing padding (ABI v4). Once E_BATCH has passed, batch becomes the live batch: batch less
    its trailing slots with kv_len == 0 (``oracle_live_batch``), whose query offsets are never
    read. Everything below, the header's BATCH included, uses the live batch.

Success buffer. BAD_REQUEST = -1, BAD_VALUE = BAD_LIMIT = 0; NUM_TOKENS = cu[batch].
    A position is written as (r, h, t, k) and compared as (h, r, t, k); k is an absolute
    block-table column. A legal cut at a unit boundary names the next unit in work order with
    k = its first column, and the end of the work (also
    position 0 when there is no work at all) is (0, H, 0, 0). An idle core has
    begin == end == the position where it sits; first_slot = last_slot = -1, 0 segments,
    cost 0. Unused combine records and padding are 0. FLAGS = 1 if causal else 0.
    EPOCH = the epoch argument, on every header written.
    Every int32 count or cost (NUM_UNITS, NUM_SEGMENTS, MAX_CORE_COST, TOTAL_COST, core cost)
    saturates at INT32_MAX.

Slots. A unit is split when some core boundary lies strictly inside it; its pieces are the
    intervals between its distinct interior cuts. Slots are numbered 0, 1, ... over the
    pieces of split units in (head-major) work order, and the combine records follow the same
    order. A segment costs cost_segment + (blocks in the segment) * w; a core's cost is the sum.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

AICPU_TILING_MAGIC = 0x4C495441
AICPU_TILING_VERSION = 5

AICPU_TILING_OK = 0
AICPU_TILING_E_PARAMS = 1
AICPU_TILING_E_BUFFER = 2
AICPU_TILING_E_BATCH = 3
AICPU_TILING_E_QUERY_START = 4
AICPU_TILING_E_QUERY_DECREASING = 5
AICPU_TILING_E_QUERY_OVERFLOW = 6
AICPU_TILING_E_KV_NEGATIVE = 7
AICPU_TILING_E_KV_SHORT = 8
AICPU_TILING_E_KV_CAPACITY = 9
AICPU_TILING_E_KV_EMPTY = 10
AICPU_TILING_NUM_STATUS = 11

AICPU_TILING_CAUSAL = 1

AICPU_TILING_HDR_MAGIC = 0
AICPU_TILING_HDR_VERSION = 1
AICPU_TILING_HDR_STATUS = 2
AICPU_TILING_HDR_BAD_REQUEST = 3
AICPU_TILING_HDR_BAD_VALUE = 4
AICPU_TILING_HDR_BAD_LIMIT = 5
AICPU_TILING_HDR_BATCH = 6
AICPU_TILING_HDR_NUM_TOKENS = 7
AICPU_TILING_HDR_NUM_CORES = 8
AICPU_TILING_HDR_NUM_UNITS = 9
AICPU_TILING_HDR_NUM_SEGMENTS = 10
AICPU_TILING_HDR_NUM_SLOTS = 11
AICPU_TILING_HDR_NUM_COMBINE = 12
AICPU_TILING_HDR_MAX_CORE_COST = 13
AICPU_TILING_HDR_TOTAL_COST = 14
AICPU_TILING_HDR_FLAGS = 15
AICPU_TILING_HDR_EPOCH = 16
AICPU_TILING_HDR_WORDS = 24

AICPU_TILING_CORE_BEGIN = 0
AICPU_TILING_CORE_END = 4
AICPU_TILING_CORE_FIRST_SLOT = 8
AICPU_TILING_CORE_LAST_SLOT = 9
AICPU_TILING_CORE_NUM_SEGMENTS = 10
AICPU_TILING_CORE_COST = 11
AICPU_TILING_CORE_WORDS = 12

AICPU_TILING_COMB_REQUEST = 0
AICPU_TILING_COMB_KV_HEAD = 1
AICPU_TILING_COMB_Q_TILE = 2
AICPU_TILING_COMB_FIRST_SLOT = 3
AICPU_TILING_COMB_NUM_PIECES = 4
AICPU_TILING_COMB_WORDS = 6

AICPU_TILING_MAX_HEADS = 1024
AICPU_TILING_MAX_HEAD_DIM = 1024
AICPU_TILING_MAX_BLOCK_SIZE = 4096
AICPU_TILING_MAX_BATCH = 1 << 20
AICPU_TILING_MAX_TOKENS = 1 << 22
AICPU_TILING_MAX_KV_TOKENS = 1 << 26
AICPU_TILING_MAX_CORES = 1024
AICPU_TILING_MAX_TILE_ROWS = 4096
AICPU_TILING_MAX_COST_WEIGHT = 1024

AICPU_TILING_DEFAULT_COST_KV_LOAD = 4
AICPU_TILING_DEFAULT_COST_QK_TILE = 1
AICPU_TILING_DEFAULT_COST_SEGMENT = 32

INT32_MAX = 2**31 - 1

PARAM_FIELDS = (
    "num_q_heads",
    "num_kv_heads",
    "head_dim",
    "block_size",
    "max_batch",
    "max_tokens",
    "max_blocks_per_req",
    "num_cores",
    "q_tile",
    "cost_kv_load",
    "cost_qk_tile",
    "cost_segment",
)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _sat(x: int) -> int:
    return min(x, INT32_MAX)


def _fields(params) -> dict[str, int]:
    return {name: int(getattr(params, name)) for name in PARAM_FIELDS}


def _window(params) -> int:
    """The sliding window W of ABI v5; None or a missing attribute means 0 (none)."""
    value = getattr(params, "sliding_window", 0)
    return 0 if value is None else int(value)


# --------------------------------------------------------------------------------------------
# Static parameters
# --------------------------------------------------------------------------------------------


def oracle_params_check(params) -> int:
    """Return AICPU_TILING_OK when every static parameter is in range, else E_PARAMS.

    Ranges (header, aicpu_tiling_params_check): heads, head_dim, block_size, max_batch,
    max_tokens, max_blocks_per_req, num_cores and q_tile are >= 1 and at most their
    AICPU_TILING_MAX_* limit (max_blocks_per_req through max_blocks_per_req * block_size <=
    AICPU_TILING_MAX_KV_TOKENS, q_tile through q_tile * group <= AICPU_TILING_MAX_TILE_ROWS);
    num_q_heads % num_kv_heads == 0; cost weights in [0, AICPU_TILING_MAX_COST_WEIGHT] with
    cost_kv_load + cost_qk_tile >= 1; 0 <= sliding_window <= AICPU_TILING_MAX_KV_TOKENS;
    reserved words (if present) all 0.
    """
    p = _fields(params)
    reserved = [int(x) for x in getattr(params, "reserved", (0, 0, 0))]
    bounded = (
        ("num_q_heads", AICPU_TILING_MAX_HEADS),
        ("num_kv_heads", AICPU_TILING_MAX_HEADS),
        ("head_dim", AICPU_TILING_MAX_HEAD_DIM),
        ("block_size", AICPU_TILING_MAX_BLOCK_SIZE),
        ("max_batch", AICPU_TILING_MAX_BATCH),
        ("max_tokens", AICPU_TILING_MAX_TOKENS),
        ("max_blocks_per_req", AICPU_TILING_MAX_KV_TOKENS),
        ("num_cores", AICPU_TILING_MAX_CORES),
        ("q_tile", AICPU_TILING_MAX_TILE_ROWS),
    )
    if any(not 1 <= p[name] <= limit for name, limit in bounded):
        return AICPU_TILING_E_PARAMS
    if p["num_q_heads"] % p["num_kv_heads"] != 0:
        return AICPU_TILING_E_PARAMS
    group = p["num_q_heads"] // p["num_kv_heads"]
    if p["q_tile"] * group > AICPU_TILING_MAX_TILE_ROWS:
        return AICPU_TILING_E_PARAMS
    if p["max_blocks_per_req"] * p["block_size"] > AICPU_TILING_MAX_KV_TOKENS:
        return AICPU_TILING_E_PARAMS
    weights = (p["cost_kv_load"], p["cost_qk_tile"], p["cost_segment"])
    if any(not 0 <= x <= AICPU_TILING_MAX_COST_WEIGHT for x in weights):
        return AICPU_TILING_E_PARAMS
    if p["cost_kv_load"] + p["cost_qk_tile"] < 1:
        return AICPU_TILING_E_PARAMS
    if not 0 <= _window(params) <= AICPU_TILING_MAX_KV_TOKENS:
        return AICPU_TILING_E_PARAMS
    if len(reserved) != 3 or any(reserved):
        return AICPU_TILING_E_PARAMS
    # The worst case: max_tokens one-token requests on every kv head, each a unit with a full
    # block table at the widest tile's block cost. It must stay below 2^60 so that C's int64
    # sums cannot overflow.
    w_max = _ceil_div(p["block_size"], 16) * (
        p["cost_kv_load"] + p["cost_qk_tile"] * _ceil_div(p["q_tile"] * group, 16)
    )
    worst = p["max_tokens"] * p["num_kv_heads"] * (
        p["cost_segment"] + p["max_blocks_per_req"] * w_max
    )
    if worst > 1 << 60:
        return AICPU_TILING_E_PARAMS
    return AICPU_TILING_OK


@dataclass(frozen=True)
class Layout:
    """Word offsets of the buffer sections for one set of valid params (header: THE BUFFER).

    Header [0, 24), core table of 12 words per core, combine table of 6 words per record
    (num_cores - 1 records), then zero padding to a multiple of 16 words.
    """

    num_cores: int

    @property
    def core_table(self) -> int:
        return AICPU_TILING_HDR_WORDS

    @property
    def combine(self) -> int:
        return self.core_table + AICPU_TILING_CORE_WORDS * self.num_cores

    @property
    def combine_records(self) -> int:
        return self.num_cores - 1

    @property
    def words(self) -> int:
        used = self.combine + AICPU_TILING_COMB_WORDS * self.combine_records
        return _ceil_div(used, 16) * 16


def _layout(params) -> Layout:
    return Layout(int(params.num_cores))


def oracle_tiling_bytes(params) -> int:
    """Tiling buffer size in bytes (a multiple of 64), or 0 for invalid params."""
    if oracle_params_check(params) != AICPU_TILING_OK:
        return 0
    return 4 * _layout(params).words


def oracle_max_slots(params) -> int:
    """Partial slots the workspace must hold, 2 * (num_cores - 1); 0 for invalid params."""
    if oracle_params_check(params) != AICPU_TILING_OK:
        return 0
    return 2 * (int(params.num_cores) - 1)


def oracle_workspace_bytes(params) -> int:
    """Bytes of the partials workspace: max_slots * q_tile * group * (head_dim + 1) * 4."""
    slots = oracle_max_slots(params)
    if slots == 0:
        return 0
    p = _fields(params)
    group = p["num_q_heads"] // p["num_kv_heads"]
    return slots * p["q_tile"] * group * (p["head_dim"] + 1) * 4


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def oracle_validate(
    params, cu_seqlens_q: Sequence[int], seqlens_kv: Sequence[int], batch: int, causal: bool
) -> tuple[int, int, int, int]:
    """Return (status, bad_request, bad_value, bad_limit) for valid params (module docstring).

    Reads cu_seqlens_q[0..batch] and seqlens_kv[0..batch-1] only, and only when
    0 <= batch <= max_batch.
    """
    p = _fields(params)
    if batch < 0 or batch > p["max_batch"]:
        return AICPU_TILING_E_BATCH, -1, batch, p["max_batch"]
    batch = oracle_live_batch(seqlens_kv, batch)
    capacity = p["max_blocks_per_req"] * p["block_size"]
    cu0 = int(cu_seqlens_q[0])
    if cu0 != 0:
        return AICPU_TILING_E_QUERY_START, 0, cu0, 0
    for r in range(batch):
        lo, hi = int(cu_seqlens_q[r]), int(cu_seqlens_q[r + 1])
        if hi < lo:
            return AICPU_TILING_E_QUERY_DECREASING, r, hi, lo
        if hi > p["max_tokens"]:
            return AICPU_TILING_E_QUERY_OVERFLOW, r, hi, p["max_tokens"]
        q_len = hi - lo
        kv = int(seqlens_kv[r])
        if kv < 0:
            return AICPU_TILING_E_KV_NEGATIVE, r, kv, 0
        if causal and kv < q_len:
            return AICPU_TILING_E_KV_SHORT, r, kv, q_len
        if kv > capacity:
            return AICPU_TILING_E_KV_CAPACITY, r, kv, capacity
        if not causal and q_len > 0 and kv == 0:
            return AICPU_TILING_E_KV_EMPTY, r, 0, 1
    return AICPU_TILING_OK, -1, 0, 0


def oracle_live_batch(seqlens_kv: Sequence[int], batch: int) -> int:
    """``batch`` less its trailing slots with kv_len == 0 (ABI v4, TRAILING PADDING in
    aicpu_tiling.h): those are padding whatever their query offsets, which are not read."""
    while batch > 0 and int(seqlens_kv[batch - 1]) == 0:
        batch -= 1
    return batch


# --------------------------------------------------------------------------------------------
# Units and the position axis
# --------------------------------------------------------------------------------------------


def block_cost(params, rows: int) -> int:
    """w(rows) = ceil(block_size / 16) * (cost_kv_load + cost_qk_tile * ceil(rows / 16))."""
    return _ceil_div(int(params.block_size), 16) * (
        int(params.cost_kv_load) + int(params.cost_qk_tile) * _ceil_div(rows, 16)
    )


@dataclass(frozen=True)
class Unit:
    """One (request, kv head, query tile) unit and its interval [start, start + cost)."""

    request: int
    kv_head: int
    q_tile: int
    q_start: int  # query token offset within the request
    q_end: int
    rows: int
    kv_begin: int  # window start of the first row (0 without a window)
    kv_end: int
    first: int  # block-table column of the first block, floor(kv_begin / block_size)
    blocks: int  # ceil(kv_end / block_size) - first
    w: int
    start: int
    cost: int

    def legal_cuts(self, cost_segment: int) -> list[int]:
        """Legal cuts in [start, start + cost], ascending: start, block boundaries, end."""
        inner = [self.start + cost_segment + k * self.w for k in range(1, self.blocks)]
        return [self.start, *inner, self.start + self.cost]


def oracle_units(
    params, cu_seqlens_q: Sequence[int], seqlens_kv: Sequence[int], batch: int, causal: bool
) -> list[Unit]:
    """Every unit in head-major work order (kv head, request, query tile) with its position
    interval; the inputs must be valid (a window only with causal)."""
    q_tile, seg = int(params.q_tile), int(params.cost_segment)
    window = _window(params)
    group = int(params.num_q_heads) // int(params.num_kv_heads)
    block = int(params.block_size)
    units: list[Unit] = []
    position = 0
    for h in range(int(params.num_kv_heads)):
        for r in range(batch):
            q_len = int(cu_seqlens_q[r + 1]) - int(cu_seqlens_q[r])
            kv_len = int(seqlens_kv[r])
            for t in range(_ceil_div(q_len, q_tile)):
                q_start, q_end = t * q_tile, min((t + 1) * q_tile, q_len)
                rows = (q_end - q_start) * group
                kv_end = kv_len - q_len + q_end if causal else kv_len
                kv_begin = max(0, kv_len - q_len + q_start - window + 1) if window else 0
                first = kv_begin // block
                blocks = _ceil_div(kv_end, block) - first
                w = block_cost(params, rows)
                cost = seg + blocks * w
                units.append(Unit(r, h, t, q_start, q_end, rows, kv_begin, kv_end, first, blocks,
                                  w, position, cost))
                position += cost
    return units


def _containing_unit(starts: list[int], x: int) -> int:
    """Index of the unit u with U <= x < U + cost (x < W)."""
    return bisect.bisect_right(starts, x) - 1


def _snap_down(units: list[Unit], starts: list[int], target: int, seg: int) -> int:
    """The largest legal cut <= target inside its unit (target < W)."""
    unit = units[_containing_unit(starts, target)]
    return max(cut for cut in unit.legal_cuts(seg) if cut <= target)


def _range_cost(begin: int, end: int, unit_starts: set[int], seg: int) -> int:
    """A core's cost: its span, plus one more segment when it starts inside a unit."""
    if end <= begin:
        return 0
    return end - begin + (0 if begin in unit_starts else seg)


def _greedy_ranges(
    units: list[Unit], starts: list[int], lo: int, hi: int, parts: int, seg: int, budget: int
) -> list[tuple[int, int]]:
    """Greedy filling of [lo, hi) with ``budget``: each of ``parts`` cores in turn takes work
    up to the budget and stops at the last legal cut that fits (it stalls when not one whole
    block fits); a core that starts at hi is idle there. The work fits when the last range
    ends at hi."""
    unit_starts = set(starts)
    ranges = []
    begin = lo
    for _ in range(parts):
        target = begin + budget - (0 if begin in unit_starts or begin >= hi else seg)
        if target >= hi:
            end = hi
        elif target <= begin:
            end = begin
        else:
            end = _snap_down(units, starts, target, seg)
        ranges.append((begin, end))
        begin = end
    return ranges


def _min_max_ranges(
    units: list[Unit], starts: list[int], lo: int, hi: int, parts: int, seg: int
) -> list[tuple[int, int]]:
    """The min-max partition of [lo, hi) into ``parts`` ranges: greedy filling with the
    smallest budget that fits, found by plain bisection (fitting is monotone in the budget:
    a larger budget never leaves a core behind where a smaller one got)."""
    if hi <= lo:
        return [(lo, lo)] * parts
    unit_starts = set(starts)

    def fits(budget: int) -> bool:
        ranges = _greedy_ranges(units, starts, lo, hi, parts, seg, budget)
        assert all(_range_cost(b, e, unit_starts, seg) <= budget for b, e in ranges)
        return ranges[-1][1] == hi

    low, high = _ceil_div(hi - lo, parts), hi - lo  # one core taking everything costs hi - lo
    while low < high:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid + 1
    return _greedy_ranges(units, starts, lo, hi, parts, seg, low)


def oracle_cuts(params, units: list[Unit]) -> list[tuple[int, int]]:
    """Per-core position ranges [s_c, e_c), as in THE PARTITION (see the module docstring).

    Args:
        params: the static params (num_kv_heads, num_cores, cost_segment are read).
        units: oracle_units(...) for the same params, in head-major work order.

    Returns:
        num_cores (begin, end) pairs of absolute positions on [0, W), cores in order. When
        num_cores is a multiple of num_kv_heads H, core h * Q + j (Q = P / H) takes head h's
        interval shifted by h * W_h, cut at the min-max offsets of one head's interval
        [0, W_h) into Q ranges; otherwise the min-max of [0, W) into P ranges.
    """
    cores, heads, seg = int(params.num_cores), int(params.num_kv_heads), int(params.cost_segment)
    starts = [u.start for u in units]
    total = sum(u.cost for u in units)
    if cores % heads != 0:
        return _min_max_ranges(units, starts, 0, total, cores, seg)
    per_head = cores // heads
    head_cost = total // heads  # every head has the same units
    offsets = _min_max_ranges(units, starts, 0, head_cost, per_head, seg)
    return [(h * head_cost + b, h * head_cost + e) for h in range(heads) for b, e in offsets]


def _coordinates(units: list[Unit], starts: list[int], x: int, heads: int, seg: int) -> tuple:
    """Work-order position (r, h, t, k) of the legal cut x: the unit containing it, or the
    end-of-work position (0, heads, 0, 0) at W (also when there are no units)."""
    if not units or x >= units[-1].start + units[-1].cost:
        return (0, heads, 0, 0)
    u = units[_containing_unit(starts, x)]
    k = 0 if x == u.start else (x - u.start - seg) // u.w
    return (u.request, u.kv_head, u.q_tile, u.first + k)


# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


def _header(status: int, bad: tuple[int, int, int], batch: int, cores: int, flags: int,
            epoch: int) -> list:
    words = [0] * AICPU_TILING_HDR_WORDS
    words[AICPU_TILING_HDR_MAGIC] = AICPU_TILING_MAGIC
    words[AICPU_TILING_HDR_VERSION] = AICPU_TILING_VERSION
    words[AICPU_TILING_HDR_STATUS] = status
    words[AICPU_TILING_HDR_BAD_REQUEST : AICPU_TILING_HDR_BAD_LIMIT + 1] = list(bad)
    words[AICPU_TILING_HDR_BATCH] = batch
    words[AICPU_TILING_HDR_NUM_CORES] = cores
    words[AICPU_TILING_HDR_FLAGS] = flags
    words[AICPU_TILING_HDR_EPOCH] = epoch
    return words


def _idle_core(position: tuple) -> list[int]:
    return [*position, *position, -1, -1, 0, 0]


def oracle_plan(
    params,
    cu_seqlens_q: Sequence[int],
    seqlens_kv: Sequence[int],
    batch: int,
    causal: bool,
    *,
    epoch: int = 0,
) -> np.ndarray:
    """The tiling buffer aicpu_tiling_plan() writes, as int32 words.

    Args:
        params: object with the int attributes of aicpu_tiling_params (``reserved`` optional).
        cu_seqlens_q: query offsets; only [0..batch] is read, only if 0 <= batch <= max_batch.
        seqlens_kv: kv lengths; only [0..batch-1] is read, under the same condition.
        batch: requests in the arrays; trailing kv_len == 0 slots are padding.
        causal: the AICPU_TILING_CAUSAL flag.
        epoch: echoed in the header's EPOCH word.

    Returns:
        int32 array of oracle_tiling_bytes(params) // 4 words; for invalid params the 24-word
        header only (see the module docstring). Bad inputs never raise: the status is in
        word AICPU_TILING_HDR_STATUS.
    """
    flags = AICPU_TILING_CAUSAL if causal else 0
    batch = int(batch)
    if oracle_params_check(params) != AICPU_TILING_OK or (_window(params) > 0 and not causal):
        header = _header(AICPU_TILING_E_PARAMS, (-1, 0, 0), batch, int(params.num_cores), flags,
                         epoch)
        return np.array(header, dtype=np.int32)

    layout = _layout(params)
    cores, heads, seg = layout.num_cores, int(params.num_kv_heads), int(params.cost_segment)
    buf = [0] * layout.words
    status, *bad = oracle_validate(params, cu_seqlens_q, seqlens_kv, batch, causal)
    if status != AICPU_TILING_E_BATCH:
        batch = oracle_live_batch(seqlens_kv, batch)
    buf[:AICPU_TILING_HDR_WORDS] = _header(status, tuple(bad), batch, cores, flags, epoch)
    if status != AICPU_TILING_OK:
        for c in range(cores):
            at = layout.core_table + c * AICPU_TILING_CORE_WORDS
            buf[at : at + AICPU_TILING_CORE_WORDS] = _idle_core((0, 0, 0, 0))
        return np.array(buf, dtype=np.int32)

    units = oracle_units(params, cu_seqlens_q, seqlens_kv, batch, causal)
    starts = [u.start for u in units]
    unit_starts = set(starts)
    ranges = oracle_cuts(params, units)
    total = sum(u.cost for u in units)

    # Interior cuts of each unit, then slots over the pieces of split units in work order.
    interior: dict[int, list[int]] = {}
    for cut in sorted({x for pair in ranges for x in pair}):
        if 0 < cut < total and cut not in unit_starts:
            interior.setdefault(_containing_unit(starts, cut), []).append(cut)
    first_slot_of: dict[int, int] = {}
    combine = []
    next_slot = 0
    for i, unit in enumerate(units):
        if i in interior:
            pieces = len(interior[i]) + 1
            first_slot_of[i] = next_slot
            combine.append([unit.request, unit.kv_head, unit.q_tile, next_slot, pieces, 0])
            next_slot += pieces

    def piece_slot(i: int, piece_start: int) -> int:
        if i not in interior:
            return -1
        return first_slot_of[i] + sum(1 for cut in interior[i] if cut <= piece_start)

    num_segments, max_cost = 0, 0
    for c, (begin, end) in enumerate(ranges):
        at = layout.core_table + c * AICPU_TILING_CORE_WORDS
        pos_begin = _coordinates(units, starts, begin, heads, seg)
        if begin == end:
            buf[at : at + AICPU_TILING_CORE_WORDS] = _idle_core(pos_begin)
            continue
        pos_end = _coordinates(units, starts, end, heads, seg)
        first, last = _containing_unit(starts, begin), _containing_unit(starts, end - 1)
        cost = 0
        for i in range(first, last + 1):
            u = units[i]
            lo, hi = max(begin, u.start), min(end, u.start + u.cost)
            k_lo = 0 if lo == u.start else (lo - u.start - seg) // u.w
            k_hi = u.blocks if hi == u.start + u.cost else (hi - u.start - seg) // u.w
            cost += seg + (k_hi - k_lo) * u.w
        assert cost == _range_cost(begin, end, unit_starts, seg)
        segs = last - first + 1
        first_slot = piece_slot(first, begin)
        last_slot = piece_slot(last, max(begin, units[last].start))
        record = [*pos_begin, *pos_end, first_slot, last_slot, segs, _sat(cost)]
        buf[at : at + AICPU_TILING_CORE_WORDS] = record
        num_segments += segs
        max_cost = max(max_cost, cost)

    for j, record in enumerate(combine):
        at = layout.combine + j * AICPU_TILING_COMB_WORDS
        buf[at : at + AICPU_TILING_COMB_WORDS] = record

    buf[AICPU_TILING_HDR_NUM_TOKENS] = int(cu_seqlens_q[batch])
    buf[AICPU_TILING_HDR_NUM_UNITS] = _sat(len(units))
    buf[AICPU_TILING_HDR_NUM_SEGMENTS] = _sat(num_segments)
    buf[AICPU_TILING_HDR_NUM_SLOTS] = next_slot
    buf[AICPU_TILING_HDR_NUM_COMBINE] = len(combine)
    buf[AICPU_TILING_HDR_MAX_CORE_COST] = _sat(max_cost)
    buf[AICPU_TILING_HDR_TOTAL_COST] = _sat(total)
    return np.array(buf, dtype=np.int32)


# --------------------------------------------------------------------------------------------
# Decoding a buffer (from the oracle or from the C kernel) and checking it
# --------------------------------------------------------------------------------------------


class Segment(NamedTuple):
    """One contiguous piece of a unit on one core.

    q_start / q_end are query-token offsets within the request, kv_start / kv_end kv token
    offsets (kv_start = block_start * block_size, kv_end clamped to the unit's kv_end), split
    the partial slot or -1, block_start / block_end the absolute block-table columns
    [block_start, block_end) the segment reads.
    """

    core: int
    request: int
    kv_head: int
    q_start: int
    q_end: int
    kv_start: int
    kv_end: int
    split: int
    block_start: int
    block_end: int


class _Shape:
    """Unit geometry recomputed from the inputs, independently of oracle_units."""

    def __init__(self, params, cu_seqlens_q, seqlens_kv, batch: int, causal: bool):
        self.batch, self.causal = batch, causal
        self.window = _window(params)
        self.heads = int(params.num_kv_heads)
        self.q_tile, self.block = int(params.q_tile), int(params.block_size)
        self.q_len = [int(cu_seqlens_q[r + 1]) - int(cu_seqlens_q[r]) for r in range(batch)]
        self.kv_len = [int(seqlens_kv[r]) for r in range(batch)]
        self.tiles = [_ceil_div(q, self.q_tile) for q in self.q_len]
        self.live = [r for r in range(batch) if self.tiles[r]]

    def q_range(self, r: int, t: int) -> tuple[int, int]:
        return t * self.q_tile, min((t + 1) * self.q_tile, self.q_len[r])

    def kv_end(self, r: int, t: int) -> int:
        if not self.causal:
            return self.kv_len[r]
        return self.kv_len[r] - self.q_len[r] + self.q_range(r, t)[1]

    def kv_begin(self, r: int, t: int) -> int:
        """Window start of the tile's first row (0 without a window)."""
        if not self.window:
            return 0
        return max(0, self.kv_len[r] - self.q_len[r] + self.q_range(r, t)[0] - self.window + 1)

    def columns(self, r: int, t: int) -> tuple[int, int]:
        """The unit's block-table columns [floor(kv_begin / bs), ceil(kv_end / bs))."""
        return self.kv_begin(r, t) // self.block, _ceil_div(self.kv_end(r, t), self.block)

    def start(self, r: int, h: int, t: int) -> tuple[int, int, int, int]:
        """The position of a unit's start, or the end-of-work position for (0, H, 0)."""
        if h >= self.heads:
            return self.end()
        return (r, h, t, self.columns(r, t)[0])

    def end(self) -> tuple[int, int, int, int]:
        """The end-of-work position (0, H, 0, 0)."""
        return (0, self.heads, 0, 0)

    def valid(self, pos: tuple) -> bool:
        """pos is the sentinel or a block of a real unit (k < blocks: canonical form)."""
        if pos == self.end():
            return True
        r, h, t, k = pos
        return (
            0 <= r < self.batch
            and 0 <= h < self.heads
            and 0 <= t < self.tiles[r]
            and self.columns(r, t)[0] <= k < self.columns(r, t)[1]
        )

    def next_unit(self, r: int, h: int, t: int) -> tuple[int, int, int]:
        """The unit after (r, h, t) in head-major work order, or (0, H, 0) at the end."""
        if t + 1 < self.tiles[r]:
            return r, h, t + 1
        later = bisect.bisect_right(self.live, r)  # the next request with q_len > 0
        if later < len(self.live):
            return self.live[later], h, 0
        if h + 1 < self.heads:  # r was live, so self.live is not empty
            return self.live[0], h + 1, 0
        return 0, self.heads, 0


def _order(pos: tuple) -> tuple:
    """Work-order sort key of a position (r, h, t, k): compared as (h, r, t, k)."""
    r, h, t, k = pos
    return (h, r, t, k)


def _core_record(buffer, params, c: int) -> list[int]:
    at = AICPU_TILING_HDR_WORDS + c * AICPU_TILING_CORE_WORDS
    return [int(x) for x in buffer[at : at + AICPU_TILING_CORE_WORDS]]


def _decode(params, buffer, cu_seqlens_q, seqlens_kv, causal: bool):
    """Yield (core, record, pieces) per core, pieces (segment, k_lo, k_hi, first, last, rows)
    with absolute columns: the segment reads [k_lo, k_hi) of the unit's [first, last)."""
    batch = int(buffer[AICPU_TILING_HDR_BATCH])
    shape = _Shape(params, cu_seqlens_q, seqlens_kv, batch, causal)
    group = int(params.num_q_heads) // int(params.num_kv_heads)
    for c in range(int(params.num_cores)):
        rec = _core_record(buffer, params, c)
        begin, end = tuple(rec[0:4]), tuple(rec[4:8])
        assert shape.valid(begin) and shape.valid(end), f"core {c}: bad position {rec[:8]}"
        assert _order(begin) <= _order(end), f"core {c}: begin {begin} after end {end}"
        pieces = []
        pos = begin
        while pos != end:
            r, h, t, k_lo = pos
            assert h < shape.heads, f"core {c}: walked past the end towards {end}"
            first, last = shape.columns(r, t)
            k_hi = end[3] if end[:3] == (r, h, t) else last
            q_start, q_end = shape.q_range(r, t)
            kv_end = min(k_hi * shape.block, shape.kv_end(r, t))
            seg = Segment(c, r, h, q_start, q_end, k_lo * shape.block, kv_end, -1, k_lo, k_hi)
            pieces.append((seg, k_lo, k_hi, first, last, (q_end - q_start) * group))
            pos = shape.start(*shape.next_unit(r, h, t)) if k_hi == last else end
        if pieces:
            first, last = rec[AICPU_TILING_CORE_FIRST_SLOT], rec[AICPU_TILING_CORE_LAST_SLOT]
            pieces[0] = (pieces[0][0]._replace(split=first), *pieces[0][1:])
            if len(pieces) > 1 or first == last:
                pieces[-1] = (pieces[-1][0]._replace(split=last), *pieces[-1][1:])
            else:
                raise AssertionError(f"core {c}: one segment but slots {first} != {last}")
        yield c, rec, pieces


def segments(
    params, buffer, cu_seqlens_q: Sequence[int], seqlens_kv: Sequence[int], causal: bool
) -> list[Segment]:
    """Decode a successful tiling buffer into Segments, cores in order, each in execution order.

    Args:
        params: the static params the buffer was planned with.
        buffer: int32 words (numpy array or sequence); the batch is read from its header.
        cu_seqlens_q, seqlens_kv, causal: the inputs the buffer was planned with.

    Raises:
        AssertionError: when a core record names a position outside the work order, or
            begin > end, or a single-segment core has different first and last slots.
    """
    out: list[Segment] = []
    for _, _, pieces in _decode(params, buffer, cu_seqlens_q, seqlens_kv, causal):
        out.extend(piece[0] for piece in pieces)
    return out


def _check_rows(segs: list[Segment], shape: _Shape, r: int, where: str) -> None:
    """Disjoint, in-range kv ranges covering each row's visible range, for one (r, h): from
    the block holding the window start of the tile's first row (0 without a window) up to
    the last row's visible end."""
    q_len, kv_len, causal = shape.q_len[r], shape.kv_len[r], shape.causal
    cuts = sorted({0, q_len, *(s.q_start for s in segs), *(s.q_end for s in segs)})
    for lo, hi in itertools.pairwise(cuts):
        if lo >= q_len:
            break
        covering = sorted((s.kv_start, s.kv_end) for s in segs if s.q_start <= lo and hi <= s.q_end)
        # Within [lo, hi) every row sees the same segments; the last row sees the most kv and
        # the first row's window starts first (every q range is a whole tile).
        visible = kv_len - q_len + hi if causal else kv_len
        begin = shape.kv_begin(r, lo // shape.q_tile) // shape.block * shape.block
        reach = begin
        for i, (a, b) in enumerate(covering):
            assert begin <= a < b <= kv_len, f"{where} rows [{lo},{hi}): kv [{a},{b}) out of range"
            if i:
                assert a >= covering[i - 1][1], f"{where} rows [{lo},{hi}): kv ranges overlap"
            if a == reach:
                reach = b
        assert reach >= visible, (
            f"{where} rows [{lo},{hi}): kv covered up to {reach}, visible up to {visible}"
        )


def check_coverage(
    params,
    cu_seqlens_q: Sequence[int],
    seqlens_kv: Sequence[int],
    batch: int,
    causal: bool,
    buffer,
) -> None:
    """Assert that a successful tiling buffer covers the attention exactly once.

    Checks: status OK and the header's batch (the live batch); for every request, kv head and query row, the
    kv ranges of the segments covering the row are disjoint, lie in [0, kv_len) and cover
    exactly the unit's block-table columns [floor(kv_begin / bs), ceil(kv_end / bs)) up to the
    causally visible end kv_len - q_len + row + 1 (kv_len when not causal), kv_begin the
    window start of the tile's first row (0 without a window);
    no segment is empty or entirely masked; padded slots (q_len == 0) get none; the cores'
    ranges are contiguous in head-major work order, from the first unit to the end-of-work
    position (0, H, 0, 0); header segment count = decoded count <= units + P - 1; split
    pieces, slots (numbered in work order) and the combine table agree; core costs follow
    the cost model (saturated).

    Raises:
        AssertionError: naming the first broken invariant.
    """
    buffer = np.asarray(buffer)
    assert int(buffer[AICPU_TILING_HDR_STATUS]) == AICPU_TILING_OK, "status is not OK"
    batch = oracle_live_batch(seqlens_kv, batch)
    assert int(buffer[AICPU_TILING_HDR_BATCH]) == batch, "header batch is not the live batch"
    cores, seg_cost = int(params.num_cores), int(params.cost_segment)
    shape = _Shape(params, cu_seqlens_q, seqlens_kv, batch, causal)
    by_head: dict[tuple[int, int], list[Segment]] = {}
    pieces_of: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {}
    total = 0
    live = [r for r in range(batch) if shape.tiles[r]]
    expected_begin = shape.start(live[0], 0, 0) if live else shape.end()
    for c, rec, pieces in _decode(params, buffer, cu_seqlens_q, seqlens_kv, causal):
        begin, end = tuple(rec[0:4]), tuple(rec[4:8])
        assert begin == expected_begin, f"core {c} begins at {begin}, not {expected_begin}"
        expected_begin = end
        cost = 0
        if not pieces:
            assert rec[8:12] == [-1, -1, 0, 0], f"idle core {c}: record {rec}"
        for seg, k_lo, k_hi, first, last, rows in pieces:
            where = f"core {c} request {seg.request} head {seg.kv_head}"
            assert shape.q_len[seg.request] > 0, f"{where}: padded request has work"
            assert seg.q_start < seg.q_end and seg.kv_start < seg.kv_end, f"{where}: empty"
            if causal:
                last_visible = shape.kv_len[seg.request] - shape.q_len[seg.request] + seg.q_end
                assert seg.kv_start < last_visible, f"{where}: segment entirely masked"
            whole = (k_lo, k_hi) == (first, last)
            assert (seg.split == -1) == whole, f"{where}: slot {seg.split} vs piece {k_lo, k_hi}"
            cost += seg_cost + (k_hi - k_lo) * block_cost(params, rows)
            by_head.setdefault((seg.request, seg.kv_head), []).append(seg)
            if not whole:
                tile = seg.q_start // shape.q_tile
                pieces_of.setdefault((seg.request, seg.kv_head, tile), []).append(
                    (k_lo, k_hi, seg.split)
                )
        assert rec[AICPU_TILING_CORE_NUM_SEGMENTS] == len(pieces), f"core {c}: segment count"
        assert rec[AICPU_TILING_CORE_COST] == _sat(cost), f"core {c}: cost {rec[11]} != {cost}"
        total += len(pieces)

    assert expected_begin == shape.end(), f"the last core ends at {expected_begin}"
    for r in range(batch):
        for h in range(shape.heads):
            if shape.q_len[r] > 0:
                where = f"request {r} head {h}"
                _check_rows(by_head.get((r, h), []), shape, r, where)

    units = shape.heads * sum(shape.tiles)
    assert int(buffer[AICPU_TILING_HDR_NUM_UNITS]) == _sat(units), "header unit count"
    assert int(buffer[AICPU_TILING_HDR_NUM_SEGMENTS]) == _sat(total), "header segment count"
    assert total <= units + cores - 1, f"{total} segments > {units} units + {cores - 1}"

    # Slots: pieces of a split unit have consecutive slots in work order; all slots used once.
    layout = _layout(params)
    num_slots = int(buffer[AICPU_TILING_HDR_NUM_SLOTS])
    num_combine = int(buffer[AICPU_TILING_HDR_NUM_COMBINE])
    assert num_slots <= 2 * (cores - 1) and num_combine <= cores - 1, "too many slots"
    assert len(pieces_of) == num_combine, "combine count differs from split units"
    next_slot = 0
    for j, key in enumerate(sorted(pieces_of, key=lambda rht: (rht[1], rht[0], rht[2]))):
        ordered = sorted(pieces_of[key])
        slots = [slot for _, _, slot in ordered]
        assert len(ordered) >= 2, f"unit {key}: split into one piece"
        assert slots == list(range(next_slot, next_slot + len(slots))), f"unit {key}: {slots}"
        at = layout.combine + j * AICPU_TILING_COMB_WORDS
        record = [int(x) for x in buffer[at : at + AICPU_TILING_COMB_WORDS]]
        assert record == [*key, next_slot, len(slots), 0], f"combine {j}: {record}"
        next_slot += len(slots)
    assert next_slot == num_slots, "header slot count"
    unused = buffer[layout.combine + num_combine * AICPU_TILING_COMB_WORDS :]
    assert not unused.any(), "unused combine records or padding not zero"
