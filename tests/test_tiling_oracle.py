"""Oracle-only tests of pyruntime.tiling_oracle: hand-computed plans, validation, invariants."""

from __future__ import annotations

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
    p = make_params()  # 24 + 48 + 5 + 18 = 95 words -> 96 words
    assert o.oracle_tiling_bytes(p) == 384
    assert o.oracle_max_slots(p) == 6
    assert o.oracle_workspace_bytes(p) == 6 * 4 * 2 * 65 * 4
    one = make_params(num_cores=1, max_batch=1)  # 24 + 12 + 2 + 0 = 38 -> 48 words
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
    assert header(buf) == [o.AICPU_TILING_MAGIC, 2, 1, -1, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 1,
                           -77, 0, 0, 0, 0, 0, 0, 0]


# --------------------------------------------------------------------------------------------
# Hand-computed plans (worked on paper; see the comments)
# --------------------------------------------------------------------------------------------


def test_plan_mixed_causal_hand_computed():
    # group 2, w = 1 * (4 + 1) = 5 for every unit (rows <= 16), segment 32.
    # r0: q 1, kv 40 -> 3 blocks, cost 47 per head: [0,47) [47,94)
    # r1: q 1, kv 17 -> 2 blocks, cost 42: [94,136) [136,178)
    # r2: q 6, kv 30: t0 kv_end 28, t1 kv_end 30, 2 blocks each, cost 42:
    #     h0 [178,220) [220,262), h1 [262,304) [304,346).  W = 346.
    # B = ceil((346 + 3 * 32) / 4) = 111.
    # c0: T 111 in [94,136), cuts 94/131/136 -> 94.   c1: T 222 in [220,262) -> 220.
    # c2: T 333 in [304,346), cuts 304/341/346 -> 341.  c3: continuation, ends at W.
    p = make_params()
    cu, kv = [0, 1, 2, 8], [40, 17, 30]
    buf = o.oracle_plan(p, cu, kv, 3, True, refine=False)
    assert len(buf) == 96
    assert header(buf) == [o.AICPU_TILING_MAGIC, 2, 0, -1, 0, 0, 3, 8, 4, 8, 9, 2, 1, 126, 346, 1,
                           0, 0, 0, 0, 0, 0, 0, 0]
    assert cores(p, buf).tolist() == [
        [0, 0, 0, 0, 1, 0, 0, 0, -1, -1, 2, 94],
        [1, 0, 0, 0, 2, 0, 1, 0, -1, -1, 3, 126],
        [2, 0, 1, 0, 2, 1, 1, 1, -1, 0, 3, 121],
        [2, 1, 1, 1, 3, 0, 0, 0, 1, 1, 1, 37],
    ]
    assert buf[72:77].tolist() == [0, 0, 0, 2, 2]  # split prefix, max_batch + 1 entries
    assert buf[77:83].tolist() == [2, 1, 1, 0, 2, 0]  # one combine record
    assert not buf[83:].any()
    segs = o.segments(p, buf, cu, kv, True)
    assert segs[-2:] == [
        o.Segment(2, 2, 1, 4, 6, 0, 16, 0),
        o.Segment(3, 2, 1, 4, 6, 16, 30, 1),
    ]
    o.check_coverage(p, cu, kv, 3, True, buf)


def test_plan_idle_cores_inside_a_unit_count_as_continuations():
    # One unit: q 1, kv 32 -> 2 blocks, w = 3 + 1 = 4, cost 32 + 8 = 40, cuts 0/36/40.
    # P 8: B = ceil((40 + 7 * 32) / 8) = 33. c0: T 33 -> 36.
    # c1..c6 start at 36 (inside), so m = 1..6: T = 34, 35, 36, 37, 38 (tie -> 36), 39 -> 40.
    # Cores 1..5 are idle at (0,0,0,1); core 6 takes the second block; core 7 idles at the end.
    p = make_params(num_q_heads=1, num_kv_heads=1, num_cores=8, cost_kv_load=3)
    buf = o.oracle_plan(p, [0, 1], [32], 1, False, refine=False)
    table = cores(p, buf).tolist()
    assert table[0] == [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 36]
    for c in range(1, 6):
        assert table[c] == [0, 0, 0, 1, 0, 0, 0, 1, -1, -1, 0, 0]
    assert table[6] == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 36]
    assert table[7] == [1, 0, 0, 0, 1, 0, 0, 0, -1, -1, 0, 0]
    assert header(buf)[9:15] == [1, 2, 2, 1, 36, 40]
    o.check_coverage(p, [0, 1], [32], 1, False, buf)


def test_plan_padding_and_empty_work():
    p = make_params(num_cores=3)
    # Padded slot 0 and a q_len 0 request with kv: no units, core 0 starts at request 2.
    buf = o.oracle_plan(p, [0, 0, 0, 1], [0, 5, 16], 3, False)
    # r2: 1 block, w 5, cost 37 = W. B = ceil((37 + 64) / 3) = 34 -> cuts 0/37 -> 37 (d 3).
    assert cores(p, buf).tolist() == [
        [2, 0, 0, 0, 2, 1, 0, 0, -1, -1, 1, 37],
        [2, 1, 0, 0, 3, 0, 0, 0, -1, -1, 1, 37],
        [3, 0, 0, 0, 3, 0, 0, 0, -1, -1, 0, 0],
    ]
    o.check_coverage(p, [0, 0, 0, 1], [0, 5, 16], 3, False, buf)
    empty = o.oracle_plan(p, [0], [], 0, True)
    assert header(empty)[2:16] == [0, -1, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 1]
    assert cores(p, empty).tolist() == [[0] * 8 + [-1, -1, 0, 0]] * 3
    assert not empty[o.AICPU_TILING_HDR_WORDS + 36 :].any()


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
        ([0, 3, 6], [5, 0], 2, False, (10, 1, 0, 1)),
        ([0, 0, 6], [0, 0], 2, True, (8, 1, 0, 6)),
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
    share = -(-(total + (p.num_cores - 1) * p.cost_segment) // p.num_cores)
    max_w = max((u.w for u in units), default=0)
    assert header(buf)[14] == total
    # The header claims B + max(cost_segment, w); snapping a target by up to half a gap at
    # both ends of a core only gives B + cost_segment + w (see test_header_bound_counterexample).
    assert header(buf)[13] <= share + p.cost_segment + max_w


@settings(max_examples=300, deadline=None)
@given(problems(), st.data())
def test_first_offence_is_reported(problem, data):
    p, cu, kv, batch, causal = problem
    assume(batch >= 1)
    r = data.draw(st.integers(0, batch - 1))
    kind = data.draw(st.sampled_from(["decreasing", "overflow", "negative", "capacity"]))
    cu, kv = list(cu), list(kv)
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


def test_header_bound_counterexample():
    # Three 1-block units of cost 7 + 8 = 15 on 3 cores: W 45, B = ceil(59 / 3) = 20.
    # c0: T 20 in [15,30) -> 15; c1: T 40 in [30,45) -> 45; core 1 costs 30 > B + max(7, 8).
    p = make_params(
        num_q_heads=3, num_kv_heads=3, block_size=128, max_batch=1, max_tokens=1,
        max_blocks_per_req=1, num_cores=3, q_tile=1, cost_kv_load=0, cost_segment=7,
    )  # fmt: skip
    buf = o.oracle_plan(p, [0, 1], [1], 1, False, refine=False)
    assert cores(p, buf)[:, 11].tolist() == [15, 30, 0]
    assert header(buf)[13] == 30 > 20 + 8
    # 30 is more than B + B / 16, so the kernel refines: the smallest greedy budget that fits
    # is 15, one unit per core, which is optimal.
    refined = o.oracle_plan(p, [0, 1], [1], 1, False)
    assert cores(p, refined)[:, 11].tolist() == [15, 15, 15]


def test_refinement_hand_computed():
    # The mixed causal case of test_plan_mixed_causal_hand_computed: nearest cuts leave core 1
    # at 126 > 111 + 111 / 16, so the kernel bisects the greedy budget in [ceil(346 / 4), 126].
    # Units (start, cost): 0:47 47:47 94:42 136:42 178:42 220:42 262:42 304:42, w 5, seg 32.
    # Budget 94: c0 takes units 0-1 [0,94); c1 [94,178) 84 (the next unit would reach 220);
    # c2 [178,262) 84; c3 the rest [262,346) 84: fits.
    # Budget 93: c0 stops inside unit 1 at 47+32+2*5 = 89; c1 pays 32 again, target 150
    # snaps down to 136; c2 target 229 snaps down to 220; c3 would take 126 > 93: no fit.
    # So the kernel's answer is the optimum for these cuts: 94, 84, 84, 84.
    p = make_params()
    cu, kv = [0, 1, 2, 8], [40, 17, 30]
    buf = o.oracle_plan(p, cu, kv, 3, True)
    assert cores(p, buf)[:, 11].tolist() == [94, 84, 84, 84]
    assert header(buf)[13] == 94
    o.check_coverage(p, cu, kv, 3, True, buf)


def few_units_params() -> SimpleNamespace:
    """One kv head, one-token tiles, w = 4, segment 16, 3 cores (two units, 3 cores)."""
    return make_params(
        num_q_heads=1, num_kv_heads=1, q_tile=1, cost_qk_tile=0, cost_segment=16,
        num_cores=3, max_batch=2,
    )  # fmt: skip


def test_few_units_take_the_exact_min_max():
    # Units: request 0, kv 19 -> 2 blocks, [0, 24) with cuts 0, 20, 24; request 1, kv 3 ->
    # 1 block, [24, 44). W 44, B = ceil((44 + 2 * 16) / 3) = 26.
    # Nearest: c0 T 26 snaps to 24; c1 T 52 >= W takes [24, 44); c2 idle: 24, 20, 0. That is
    # below B + B / 16, so the old rule kept it.
    # Two units on three cores: the min-max. Budget 20: c0 stops at 20 (1 block); c1 pays
    # the segment again and reaches 20 + 20 - 16 = 24; c2 takes [24, 44): 20, 20, 20.
    # Budget 19: c0's last cut below 19 is 0, an empty core that stalls: no fit. So 20.
    p = few_units_params()
    cu, kv = [0, 1, 2], [19, 3]
    nearest = o.oracle_plan(p, cu, kv, 2, False, refine=False)
    assert cores(p, nearest)[:, 11].tolist() == [24, 20, 0]
    buf = o.oracle_plan(p, cu, kv, 2, False)
    assert cores(p, buf)[:, 11].tolist() == [20, 20, 20]
    assert cores(p, buf)[:, 0:8].tolist() == [
        [0, 0, 0, 0, 0, 0, 0, 1], [0, 0, 0, 1, 1, 0, 0, 0], [1, 0, 0, 0, 2, 0, 0, 0]
    ]
    assert header(buf)[13] == 20
    o.check_coverage(p, cu, kv, 2, False, buf)


def test_few_units_min_max_is_optimal_over_every_cut_choice():
    # Brute force: every choice of P - 1 ordered legal cuts, the busiest core's cost.
    import itertools as it

    p = few_units_params()
    for kv in ([19, 3], [40, 17], [64, 1], [5, 33]):
        cu = [0, 1, 2]
        units = o.oracle_units(p, cu, kv, 2, False)
        total = sum(u.cost for u in units)
        starts = {u.start for u in units}
        cuts = sorted({c for u in units for c in u.legal_cuts(p.cost_segment)})
        best = min(
            max(
                (e - b + (p.cost_segment if b not in starts and 0 < b < total else 0))
                if e > b else 0
                for b, e in it.pairwise([0, *chosen, total])
            )
            for chosen in it.combinations_with_replacement(cuts, p.num_cores - 1)
        )
        assert header(o.oracle_plan(p, cu, kv, 2, False))[13] == best, kv


@pytest.mark.parametrize(
    "word, value",
    [
        (16 + 36 + 3, 0),  # core 3 begins one block early: overlaps core 2's piece
        (16 + 24 + 9, -1),  # core 2's last segment is a piece without a slot
        (69 + 4, 3),  # combine record: wrong piece count
        (64 + 2, 1),  # split prefix of request 2
        (16 + 11, 95),  # core 0 cost
        (10, 8),  # header segment count
    ],
)
def test_checker_catches_corruption(word, value):
    p = make_params()
    cu, kv = [0, 1, 2, 8], [40, 17, 30]
    buf = o.oracle_plan(p, cu, kv, 3, True, refine=False).copy()
    assert buf[word] != value
    buf[word] = value
    with pytest.raises(AssertionError):
        o.check_coverage(p, cu, kv, 3, True, buf)
