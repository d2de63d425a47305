"""Oracle-only tests of pyruntime.tiling_oracle: hand-computed plans, validation, invariants."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pyruntime import tiling_oracle as o

HEADER = Path(__file__).resolve().parents[1] / "aicpu_kernels" / "aicpu_tiling.h"


def make_params(**overrides) -> SimpleNamespace:
    fields = {
        "num_q_heads": 4,
        "num_kv_heads": 2,
        "head_dim": 64,
        "block_size": 16,
        "max_batch": 4,
        "max_tokens": 64,
        "max_blocks_per_req": 8,
        "num_cores": 4,
        "q_tile": 4,
        "cost_kv_load": 4,
        "cost_qk_tile": 1,
        "cost_segment": 32,
    }
    fields.update(overrides)
    return SimpleNamespace(**fields)


def header(buf) -> list[int]:
    return [int(x) for x in buf[: o.AICPU_TILING_HDR_WORDS]]


def cores(params, buf) -> np.ndarray:
    at = o.AICPU_TILING_HDR_WORDS
    return buf[at : at + o.AICPU_TILING_CORE_WORDS * params.num_cores].reshape(
        params.num_cores, o.AICPU_TILING_CORE_WORDS
    )


class Recorder(list):
    """A list that fails on indices outside [0, limit) and records every index read."""

    def __init__(self, values, limit):
        super().__init__(values)
        self.limit, self.read = limit, set()

    def __getitem__(self, i):
        assert isinstance(i, int) and 0 <= i < self.limit, f"read index {i}"
        self.read.add(i)
        return super().__getitem__(i)


# --------------------------------------------------------------------------------------------
# Constants and sizes
# --------------------------------------------------------------------------------------------


def test_constants_match_header_text():
    text = HEADER.read_text()
    defines = dict(re.findall(r"#define (AICPU_TILING_\w+) (\(1 << \d+\)|0x[0-9A-F]+|\d+)", text))
    assert len(defines) > 50
    for name, value in defines.items():
        shift = re.fullmatch(r"\(1 << (\d+)\)", value)
        number = 1 << int(shift.group(1)) if shift else int(value, 0)
        assert getattr(o, name) == number, name


def test_sizes_hand_computed():
    p = make_params()  # header 24 + cores 4 * 12 + combine 3 * 6 = 90 words -> 96 words
    assert o.oracle_tiling_bytes(p) == 384
    assert o.oracle_tiling_bytes(make_params(max_batch=1000)) == 384  # no per-request section
    assert o.oracle_max_slots(p) == 6
    assert o.oracle_workspace_bytes(p) == 6 * 4 * 2 * 65 * 4
    one = make_params(num_cores=1, max_batch=1)  # 24 + 12 + 0 = 36 -> 48 words
    assert o.oracle_tiling_bytes(one) == 192
    assert o.oracle_max_slots(one) == 0 and o.oracle_workspace_bytes(one) == 0


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_q_heads", 0),
        ("num_q_heads", 1025),
        ("num_kv_heads", 3),  # 4 % 3 != 0
        ("head_dim", 1025),
        ("block_size", 0),
        ("block_size", 4097),
        ("max_batch", (1 << 20) + 1),
        ("max_tokens", 0),
        ("max_tokens", (1 << 22) + 1),
        ("max_blocks_per_req", (1 << 22) + 1),  # * 16 > 1 << 26
        ("num_cores", 0),
        ("num_cores", 1025),
        ("q_tile", 0),
        ("q_tile", 2049),  # * group 2 > 4096
        ("cost_kv_load", -1),
        ("cost_qk_tile", 1025),
        ("cost_segment", -1),
        ("reserved", (0, 0, 1, 0)),
    ],
)
def test_params_check_rejects(field, value):
    p = make_params(**{field: value})
    assert o.oracle_params_check(p) == o.AICPU_TILING_E_PARAMS
    assert o.oracle_tiling_bytes(p) == 0 and o.oracle_max_slots(p) == 0


def test_params_check_edges_accepted():
    assert o.oracle_params_check(make_params(q_tile=2048)) == o.AICPU_TILING_OK
    assert o.oracle_params_check(make_params(max_blocks_per_req=1 << 22)) == o.AICPU_TILING_OK
    assert o.oracle_params_check(make_params(cost_segment=0, cost_qk_tile=0)) == o.AICPU_TILING_OK
    p = make_params(cost_kv_load=0, cost_qk_tile=0)
    assert o.oracle_params_check(p) == o.AICPU_TILING_E_PARAMS


def test_invalid_params_give_header_only():
    p = make_params(num_cores=0)
    buf = o.oracle_plan(p, Recorder([], 0), Recorder([], 0), 3, True, epoch=-77)
    assert buf.dtype == np.int32
    assert header(buf) == [o.AICPU_TILING_MAGIC, o.AICPU_TILING_VERSION, 1, -1, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 1,
                           -77, 0, 0, 0, 0, 0, 0, 0]


# --------------------------------------------------------------------------------------------
# Hand-computed plans (worked on paper; see the comments)
# --------------------------------------------------------------------------------------------


# Shared by the cases below unless they say otherwise: group 2 (4 q / 2 kv heads), block 16,
# segment 32, w = 1 * (4 + 1 * ceil(rows / 16)) = 5 for every unit with rows <= 16.
END2 = (0, 2, 0, 0)  # the end-of-work position with 2 kv heads


def test_plan_two_heads_on_four_cores_decode_hand_computed():
    # Three decode requests, kv 40 / 17 / 30 -> 3 / 2 / 2 blocks, costs 47 / 42 / 42.
    # Head-major: head 0 is [0, 131): r0 [0,47) cuts 0/37/42/47, r1 [47,89) cuts 47/84/89,
    # r2 [89,131) cuts 89/126/131; head 1 the same shifted by W_h = 131. W = 262.
    # P = 4 is a multiple of H = 2: Q = 2 cores per head, cut at the min-max of [0, 131).
    # Budget 84: c0 stops at 84 (r0 + one block of r1, 47 + 37); c1 starts inside r1, pays
    # the segment again, target 84 + 84 - 32 = 136 >= 131: cost 131 - 84 + 32 = 79. Fits.
    # Budget 83: c0 stops at 47 (next cut 84 > 83); c1 target 47 + 83 = 130 -> 126 < 131.
    # So 84, 79 for each head; r1 of each head is split, slots in work order: h0 0/1, h1 2/3.
    p = make_params()
    cu, kv = [0, 1, 2, 3], [40, 17, 30]
    buf = o.oracle_plan(p, cu, kv, 3, True)
    assert len(buf) == 96
    assert header(buf) == [o.AICPU_TILING_MAGIC, o.AICPU_TILING_VERSION, 0, -1, 0, 0, 3, 3, 4, 6, 8, 4, 2, 84, 262, 1,
                           0, 0, 0, 0, 0, 0, 0, 0]
    assert cores(p, buf).tolist() == [
        [0, 0, 0, 0, 1, 0, 0, 1, -1, 0, 2, 84],
        [1, 0, 0, 1, 0, 1, 0, 0, 1, -1, 2, 79],  # ends where head 1 starts: (r 0, h 1)
        [0, 1, 0, 0, 1, 1, 0, 1, -1, 2, 2, 84],
        [1, 1, 0, 1, *END2, 3, -1, 2, 79],
    ]
    assert buf[72:84].tolist() == [1, 0, 0, 0, 2, 0, 1, 1, 0, 2, 2, 0]  # two combine records
    assert not buf[84:].any()
    segs = o.segments(p, buf, cu, kv, True)
    assert segs[:3] == [
        o.Segment(0, 0, 0, 0, 1, 0, 40, -1, 0, 3),
        o.Segment(0, 1, 0, 0, 1, 0, 16, 0, 0, 1),
        o.Segment(1, 1, 0, 0, 1, 16, 17, 1, 1, 2),
    ]
    assert [(s.core, s.request, s.kv_head) for s in segs[3:]] == [
        (1, 2, 0), (2, 0, 1), (2, 1, 1), (3, 1, 1), (3, 2, 1)
    ]
    o.check_coverage(p, cu, kv, 3, True, buf)


def test_plan_cores_not_a_multiple_of_heads_hand_computed():
    # The same three requests on P = 3 cores: 3 is no multiple of 2, so the min-max of the
    # whole axis [0, 262) (cuts of head 1 are head 0's plus 131). Lower bound ceil(262/3) = 88.
    # Budget 88: c0 stops at 84, c1 (continuation) target 84 + 88 - 32 = 140 -> 131,
    # c2 target 131 + 88 = 219 -> 215 < 262: no fit.
    # Budget 89: c0 [0, 89) (r0, r1 of head 0), c1 [89, 178) (r2 of head 0, r0 of head 1:
    # one core across the head boundary), c2 [178, 262) costs 84. No unit is split.
    p = make_params(num_cores=3)
    cu, kv = [0, 1, 2, 3], [40, 17, 30]
    buf = o.oracle_plan(p, cu, kv, 3, True)
    assert header(buf)[9:15] == [6, 6, 0, 0, 89, 262]
    assert cores(p, buf).tolist() == [
        [0, 0, 0, 0, 2, 0, 0, 0, -1, -1, 2, 89],
        [2, 0, 0, 0, 1, 1, 0, 0, -1, -1, 2, 89],
        [1, 1, 0, 0, *END2, -1, -1, 2, 84],
    ]
    assert not buf[o.AICPU_TILING_HDR_WORDS + 36 :].any()
    o.check_coverage(p, cu, kv, 3, True, buf)


def test_plan_multi_tile_causal_prefill_hand_computed():
    # Group 4 (8 q / 2 kv heads), q_tile 8: one request q 10, kv 40, causal.
    # t0: tokens [0, 8), rows 32, w = 4 + 2 = 6, kv_end 40 - 10 + 8 = 38 -> 3 blocks, cost 50,
    #     cuts 0/38/44/50.  t1: tokens [8, 10), rows 8, w 5, kv_end 40 -> 3 blocks, cost 47,
    #     cuts 50/87/92/97.  W_h = 97, W = 194.
    # P = 6, Q = 3 per head. Budget 47: c0 stops at 44 (two blocks of t0); c1 continues,
    # target 44 + 47 - 32 = 59 -> 50 (cost 6 + 32 = 38); c2 target 50 + 47 = 97: fits.
    # Budgets 45 and 46: c0 44, c1 50, c2 target 95 or 96 -> 92 < 97. Budget 44 and below:
    # c0 stops at 38 or 44 and c2 cannot reach 97 either. So 44, 38, 47 on each head.
    p = make_params(num_q_heads=8, num_cores=6, q_tile=8)
    cu, kv = [0, 10], [40]
    buf = o.oracle_plan(p, cu, kv, 1, True)
    assert header(buf)[6:15] == [1, 10, 6, 4, 6, 4, 2, 47, 194]
    assert cores(p, buf).tolist() == [
        [0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 1, 44],
        [0, 0, 0, 2, 0, 0, 1, 0, 1, 1, 1, 38],
        [0, 0, 1, 0, 0, 1, 0, 0, -1, -1, 1, 47],
        [0, 1, 0, 0, 0, 1, 0, 2, 2, 2, 1, 44],
        [0, 1, 0, 2, 0, 1, 1, 0, 3, 3, 1, 38],
        [0, 1, 1, 0, *END2, -1, -1, 1, 47],
    ]
    assert buf[96:108].tolist() == [0, 0, 0, 0, 2, 0, 0, 1, 0, 2, 2, 0]
    assert o.segments(p, buf, cu, kv, True)[:3] == [
        o.Segment(0, 0, 0, 0, 8, 0, 32, 0, 0, 2),
        o.Segment(1, 0, 0, 0, 8, 32, 38, 1, 2, 3),
        o.Segment(2, 0, 0, 8, 10, 0, 40, -1, 0, 3),
    ]
    o.check_coverage(p, cu, kv, 1, True, buf)


def test_plan_padded_requests_name_the_next_live_unit():
    # r0 padded (q 0, kv 0), r1 q 1 kv 16 (1 block, cost 37), r2 q 0 kv 5 (valid, no units),
    # r3 q 1 kv 20 (2 blocks, cost 42, cuts +0/+37/+42). Per head [0, 79), W = 158.
    # P = 4, Q = 2: budget 42 puts r1 and r3 on their own cores (41 fails: c0 37, c1 target
    # 78 -> 74 < 79). Boundaries name the next live unit: after r1 comes r3 (skipping r2),
    # after r3 of head 0 comes r1 of head 1 (skipping r0), then the end.
    p = make_params()
    cu, kv = [0, 0, 1, 1, 2], [0, 16, 5, 20]
    buf = o.oracle_plan(p, cu, kv, 4, True)
    assert cores(p, buf).tolist() == [
        [1, 0, 0, 0, 3, 0, 0, 0, -1, -1, 1, 37],
        [3, 0, 0, 0, 1, 1, 0, 0, -1, -1, 1, 42],
        [1, 1, 0, 0, 3, 1, 0, 0, -1, -1, 1, 37],
        [3, 1, 0, 0, *END2, -1, -1, 1, 42],
    ]
    o.check_coverage(p, cu, kv, 4, True, buf)
    # P = 3: the whole axis. Budgets below 74 leave c0 at 37 and c1 at 79 (its next cut, 116,
    # is 79 away). Budget 74: c0 [0, 74) ends inside r3 of head 0; c1 continues (74 - 74 + 42
    # + 32 = 74) through r1 of head 1 to 116, the start of r3 of head 1; c2 takes the rest.
    p3 = make_params(num_cores=3)
    buf3 = o.oracle_plan(p3, cu, kv, 4, True)
    assert cores(p3, buf3).tolist() == [
        [1, 0, 0, 0, 3, 0, 0, 1, -1, 0, 2, 74],
        [3, 0, 0, 1, 3, 1, 0, 0, 1, -1, 2, 74],
        [3, 1, 0, 0, *END2, -1, -1, 1, 42],
    ]
    assert buf3[60:66].tolist() == [3, 0, 0, 0, 2, 0]
    o.check_coverage(p3, cu, kv, 4, True, buf3)


def test_plan_leftover_cores_idle_at_the_end_of_their_head():
    # One request, 1 block: cost 37 per head. P = 6, Q = 3: the first core of each head takes
    # the whole head; the other two idle at the end of the head's interval, which is the
    # start of the next head's first unit, (0, 1, 0, 0), and for the last head the end.
    p = make_params(num_cores=6)
    buf = o.oracle_plan(p, [0, 1], [16], 1, True)
    idle = [-1, -1, 0, 0]
    assert cores(p, buf).tolist() == [
        [0, 0, 0, 0, 0, 1, 0, 0, -1, -1, 1, 37],
        [0, 1, 0, 0, 0, 1, 0, 0, *idle],
        [0, 1, 0, 0, 0, 1, 0, 0, *idle],
        [0, 1, 0, 0, *END2, -1, -1, 1, 37],
        [*END2, *END2, *idle],
        [*END2, *END2, *idle],
    ]
    o.check_coverage(p, [0, 1], [16], 1, True, buf)


def test_plan_two_units_on_three_cores_hand_computed():
    # One kv head (P = 3 is a multiple of 1: the whole head), q_tile 1, w = 4, segment 16.
    # r0 kv 19: 2 blocks, [0, 24) with cuts 0/20/24; r1 kv 3: 1 block, [24, 44). W 44.
    # Budget 20: c0 stops at 20 (one block); c1 continues (pays 16 again) to 20 + 20 - 16 = 24;
    # c2 takes [24, 44): 20, 20, 20. Budget 19: c0's last cut below 19 is 0, it stalls.
    # (tests/test_tiling.py::test_few_units_min_max_in_the_kernel runs the kernel on it.)
    p = make_params(num_q_heads=1, num_kv_heads=1, q_tile=1, cost_qk_tile=0, cost_segment=16,
                    num_cores=3, max_batch=2)
    cu, kv = [0, 1, 2], [19, 3]
    buf = o.oracle_plan(p, cu, kv, 2, False)
    assert cores(p, buf).tolist() == [
        [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 20],  # one segment, a piece: both slots 0
        [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 20],
        [1, 0, 0, 0, 0, 1, 0, 0, -1, -1, 1, 20],
    ]
    assert header(buf)[9:15] == [2, 3, 2, 1, 20, 44]
    o.check_coverage(p, cu, kv, 2, False, buf)


@pytest.mark.parametrize("num_cores", [3, 4])
def test_plan_empty_work_idles_every_core_at_the_end(num_cores):
    p = make_params(num_cores=num_cores)
    for cu, kv, batch in (([0], [], 0), ([0, 0, 0], [0, 7], 2)):  # empty, all padded
        buf = o.oracle_plan(p, cu, kv, batch, True)
        assert header(buf)[2:16] == [0, -1, 0, 0, batch, 0, num_cores, 0, 0, 0, 0, 0, 0, 1]
        assert cores(p, buf).tolist() == [[*END2, *END2, -1, -1, 0, 0]] * num_cores
        assert not buf[o.AICPU_TILING_HDR_WORDS + 12 * num_cores :].any()
        o.check_coverage(p, cu, kv, batch, True, buf)
        assert o.segments(p, buf, cu, kv, True) == []


def test_end_sentinel_is_the_only_position_past_the_work():
    p = make_params()
    cu, kv = [0, 1, 2, 3], [40, 17, 30]
    units = o.oracle_units(p, cu, kv, 3, True)
    starts = [u.start for u in units]
    total = sum(u.cost for u in units)
    assert o._coordinates(units, starts, total, 2, p.cost_segment) == END2
    assert o._coordinates(units, starts, 131, 2, p.cost_segment) == (0, 1, 0, 0)
    assert o._coordinates([], [], 0, 2, p.cost_segment) == END2
    shape = o._Shape(p, cu, kv, 3, True)
    assert shape.valid(END2) and shape.next_unit(2, 1, 0) == (0, 2, 0)
    assert shape.next_unit(2, 0, 0) == (0, 1, 0)
    for stale in ((3, 0, 0, 0), (0, 2, 0, 1), (1, 2, 0, 0), (0, 0, 0, 3)):
        assert not shape.valid(stale), stale
    # The v2 end position (batch, 0, 0, 0) is refused by the decoder.
    buf = o.oracle_plan(p, cu, kv, 3, True).copy()
    buf[o.AICPU_TILING_HDR_WORDS + 36 + 4 : o.AICPU_TILING_HDR_WORDS + 36 + 8] = [3, 0, 0, 0]
    with pytest.raises(AssertionError, match="bad position"):
        o.check_coverage(p, cu, kv, 3, True, buf)


def test_saturation_of_costs():
    big = make_params(
        num_q_heads=64, num_kv_heads=1, q_tile=64, block_size=4096, max_blocks_per_req=16384,
        max_tokens=4096, num_cores=1, cost_kv_load=1024, cost_qk_tile=1024, cost_segment=0,
    )  # fmt: skip
    # w = 256 * (1024 + 1024 * 256), 4096 tokens -> 64 units of 16384 blocks: far above int32.
    buf = o.oracle_plan(big, [0, 4096], [1 << 26], 1, False)
    assert header(buf)[13:15] == [o.INT32_MAX, o.INT32_MAX]
    assert cores(big, buf)[0, 11] == o.INT32_MAX


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cu, kv, batch, causal, expected",
    [
        ([0], [], -1, True, (3, -1, -1, 4)),
        ([0] * 6, [0] * 5, 5, True, (3, -1, 5, 4)),
        ([1], [], 0, True, (4, 0, 1, 0)),
        ([2, 1, 3], [5, 5], 2, True, (4, 0, 2, 0)),
        ([0, 3, 2], [5, 5], 2, True, (5, 1, 2, 3)),
        ([0, 3, 65], [5, -1], 2, True, (6, 1, 65, 64)),
        ([0, 3, 6], [5, -1], 2, True, (7, 1, -1, 0)),
        ([0, 3, 6], [5, 2], 2, True, (8, 1, 2, 3)),
        ([0, 3, 6], [5, 2], 2, False, (0, -1, 0, 0)),  # kv < q_len is fine when not causal
        ([0, 3, 6], [5, 129], 2, False, (9, 1, 129, 128)),
        ([0, 3, 6, 7], [5, 0, 9], 3, False, (10, 1, 0, 1)),
        ([0, 0, 6, 7], [0, 0, 9], 3, True, (8, 1, 0, 6)),
        # ABI v4: trailing kv_len 0 slots are padding, their offsets unread (vLLM-Ascend's
        # uniform padding, FIA's dummy request, the -1 tail)
        ([0, 3, 6], [5, 0], 2, False, (0, -1, 0, 0)),
        ([0, 0, 6], [0, 0], 2, True, (0, -1, 0, 0)),
        ([0, 1, 99, -1], [5, 0, 0], 3, True, (0, -1, 0, 0)),
        ([0, 1, 99, -1], [5, 0, -1], 3, True, (6, 1, 99, 64)),  # -1 is not padding: read on
        ([0, 3, 2], [-1, 5], 2, True, (7, 0, -1, 0)),  # first request wins over later classes
        ([0, 64, 64], [64, 0], 2, True, (0, -1, 0, 0)),  # cu[batch] == max_tokens is valid
    ],
)
def test_validation_classes(cu, kv, batch, causal, expected):
    p = make_params()
    limit = batch + 1 if 0 <= batch <= p.max_batch else 0
    cu_rec, kv_rec = Recorder(cu, limit), Recorder(kv, max(limit - 1, 0))
    buf = o.oracle_plan(p, cu_rec, kv_rec, batch, causal)
    hdr = header(buf)
    assert tuple(hdr[2 : 2 + len(expected)]) == expected
    if expected[0] != o.AICPU_TILING_OK:
        assert hdr[6:] == [batch, 0, 4, 0, 0, 0, 0, 0, 0, int(causal), 0, 0, 0, 0, 0, 0, 0, 0]
        assert cores(p, buf).tolist() == [[0] * 8 + [-1, -1, 0, 0]] * 4
        assert not buf[o.AICPU_TILING_HDR_WORDS + 48 :].any()


def test_only_documented_entries_are_read():
    p = make_params()
    cu, kv = Recorder([0, 2, 3, 9], 4), Recorder([4, 3, 9], 3)
    buf = o.oracle_plan(p, cu, kv, 3, True)
    assert header(buf)[2] == o.AICPU_TILING_OK
    assert cu.read <= {0, 1, 2, 3} and kv.read <= {0, 1, 2}
    o.oracle_plan(p, Recorder([], 0), Recorder([], 0), 5, True)  # batch > max_batch: no reads


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


@st.composite
def problems(draw):
    kv_heads = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4, 8, 20]))
    p = make_params(
        num_q_heads=kv_heads * group,
        num_kv_heads=kv_heads,
        block_size=draw(st.sampled_from([1, 4, 16, 32, 128])),
        max_batch=draw(st.integers(1, 6)),
        max_tokens=draw(st.integers(1, 80)),
        max_blocks_per_req=draw(st.integers(1, 12)),
        num_cores=draw(st.integers(1, 12)),
        q_tile=draw(st.integers(1, 20)),
        cost_kv_load=draw(st.integers(0, 8)),
        cost_qk_tile=draw(st.integers(1, 4)),
        cost_segment=draw(st.sampled_from([0, 1, 7, 32, 200])),
    )
    causal = draw(st.booleans())
    batch = draw(st.integers(0, p.max_batch))
    capacity = p.max_blocks_per_req * p.block_size
    q_lens = []
    budget = p.max_tokens
    for _ in range(batch):
        q = draw(st.integers(0, min(budget, capacity, 24)))
        budget -= q
        q_lens.append(q)
    kv = [draw(st.integers(max(q, 1 if not causal and q else 0), capacity)) for q in q_lens]
    cu = [0]
    for q in q_lens:
        cu.append(cu[-1] + q)
    return p, cu, kv, batch, causal


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_coverage_and_bounds(problem):
    p, cu, kv, batch, causal = problem
    buf = o.oracle_plan(p, cu, kv, batch, causal)
    assert len(buf) * 4 == o.oracle_tiling_bytes(p) and len(buf) % 16 == 0
    assert header(buf)[2] == o.AICPU_TILING_OK
    o.check_coverage(p, cu, kv, batch, causal, buf)
    assert np.array_equal(buf, o.oracle_plan(p, cu, kv, batch, causal))
    units = o.oracle_units(p, cu, kv, batch, causal)
    total = sum(u.cost for u in units)
    w_max = max((u.w for u in units), default=0)
    busiest, segments = header(buf)[13], header(buf)[10]
    assert header(buf)[14] == total
    # The header's bound, W / P + 2 * cost_segment + w_max + 1, in integers.
    assert busiest * p.num_cores <= total + p.num_cores * (2 * p.cost_segment + w_max + 1)
    # and the nearest-cut bound it comes from: one segment and one block above
    # B = ceil((span + (n - 1) * cost_segment) / n) for the partitioned interval and ranges.
    per_head = p.num_cores % p.num_kv_heads == 0
    n = p.num_cores // p.num_kv_heads if per_head else p.num_cores
    span = total // p.num_kv_heads if per_head else total
    share = -(-(span + (n - 1) * p.cost_segment) // n)
    assert busiest <= share + p.cost_segment + w_max
    assert segments <= len(units) + p.num_cores - 1


def busiest_over_every_partition(params, units) -> int:
    """Brute force over THE PARTITION's rule: the least busiest core over every choice of
    ordered legal cuts, per head (the same offsets on every head) when P % H == 0, else over
    the whole axis."""
    seg, cores, heads = params.cost_segment, params.num_cores, params.num_kv_heads
    total = sum(u.cost for u in units)
    starts = {u.start for u in units}
    parts, span = (cores // heads, total // heads) if cores % heads == 0 else (cores, total)
    cuts = sorted({0, span, *(c for u in units for c in u.legal_cuts(seg) if c <= span)})

    def cost(b, e):
        return e - b + (0 if b in starts else seg) if e > b else 0

    return min(
        max(cost(b, e) for b, e in itertools.pairwise([0, *chosen, span]))
        for chosen in itertools.combinations_with_replacement(cuts, parts - 1)
    )


@st.composite
def tiny_problems(draw):
    kv_heads = draw(st.integers(1, 3))
    p = make_params(
        num_q_heads=kv_heads * draw(st.sampled_from([1, 2, 20])),
        num_kv_heads=kv_heads,
        block_size=draw(st.sampled_from([4, 16])),
        max_batch=3,
        max_blocks_per_req=4,
        num_cores=draw(st.integers(1, 5)),
        q_tile=draw(st.integers(1, 3)),
        cost_kv_load=draw(st.integers(0, 6)),
        cost_qk_tile=draw(st.integers(1, 3)),
        cost_segment=draw(st.sampled_from([0, 1, 5, 32])),
    )
    causal = draw(st.booleans())
    batch = draw(st.integers(0, 3))
    q_lens = [draw(st.integers(0, 3)) for _ in range(batch)]
    kv = [draw(st.integers(max(q, 1), 4 * p.block_size)) if q else 0 for q in q_lens]
    cu = [0, *itertools.accumulate(q_lens)]
    return p, cu, kv, batch, causal


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tiny_problems())
def test_busiest_core_is_the_least_any_allowed_partition_gives(problem):
    p, cu, kv, batch, causal = problem
    units = o.oracle_units(p, cu, kv, batch, causal)
    assume(len({c for u in units for c in u.legal_cuts(p.cost_segment)}) <= 24)
    buf = o.oracle_plan(p, cu, kv, batch, causal)
    assert header(buf)[13] == busiest_over_every_partition(p, units)


@settings(max_examples=300, deadline=None)
@given(problems(), st.data())
def test_first_offence_is_reported(problem, data):
    p, cu, kv, batch, causal = problem
    assume(batch >= 1)
    r = data.draw(st.integers(0, batch - 1))
    kind = data.draw(st.sampled_from(["decreasing", "overflow", "negative", "capacity"]))
    cu, kv = list(cu), list(kv)
    if kind in ("decreasing", "overflow"):  # request r is read only before the padding tail
        assume(any(kv[j] != 0 for j in range(r, batch)))
    if kind == "decreasing":
        cu[r + 1] = cu[r] - 1
        expected = (o.AICPU_TILING_E_QUERY_DECREASING, r)
    elif kind == "overflow":
        for i in range(r + 1, batch + 1):
            cu[i] = p.max_tokens + 1 + i
        expected = (o.AICPU_TILING_E_QUERY_OVERFLOW, r)
    elif kind == "negative":
        kv[r] = -3
        expected = (o.AICPU_TILING_E_KV_NEGATIVE, r)
    else:
        kv[r] = p.max_blocks_per_req * p.block_size + 1
        expected = (o.AICPU_TILING_E_KV_CAPACITY, r)
    hdr = header(o.oracle_plan(p, cu, kv, batch, causal))
    assert tuple(hdr[2:4]) == expected


@pytest.mark.parametrize(
    "word, value",
    [
        (24 + 12 + 3, 0),  # core 1 begins one block early: overlaps core 0's piece
        (24 + 9, -1),  # core 0's last segment is a piece without a slot
        (24 + 12 + 8, 2),  # core 1's piece has another unit's slot
        (72 + 4, 3),  # combine record: wrong piece count
        (72 + 1, 1),  # combine record: wrong kv head
        (24 + 11, 85),  # core 0 cost
        (10, 9),  # header segment count
        (95, 1),  # padding
    ],
)
def test_checker_catches_corruption(word, value):
    p = make_params()
    cu, kv = [0, 1, 2, 3], [40, 17, 30]
    buf = o.oracle_plan(p, cu, kv, 3, True).copy()
    o.check_coverage(p, cu, kv, 3, True, buf)
    assert buf[word] != value
    buf[word] = value
    with pytest.raises(AssertionError):
        o.check_coverage(p, cu, kv, 3, True, buf)


def test_checker_wants_combine_records_in_head_major_order():
    p = make_params()
    cu, kv = [0, 1, 2, 3], [40, 17, 30]
    buf = o.oracle_plan(p, cu, kv, 3, True).copy()
    # Swap the two records' units (r 1 h 0 and r 1 h 1) and the cores' slots with them: every
    # piece still has a slot and a record, but slots no longer follow the work order.
    buf[72:84] = [1, 1, 0, 0, 2, 0, 1, 0, 0, 2, 2, 0]
    for core, first, last in ((0, -1, 2), (1, 3, -1), (2, -1, 0), (3, 1, -1)):
        buf[24 + 12 * core + 8 : 24 + 12 * core + 10] = [first, last]
    with pytest.raises(AssertionError):
        o.check_coverage(p, cu, kv, 3, True, buf)
