"""Sliding-window tilings (ABI v5): the C kernel against the oracle and the window's rules.

A window W > 0 (``TilingParams(sliding_window=W)``, causal only) lets a row at position p see
the keys (p - W, p]. The unit (r, h, t) whose rows are the positions [p0, p1) reads the
block-table columns [floor(kv_begin / bs), ceil(kv_end / bs)) with kv_begin = max(0, p0 - W + 1)
and kv_end = p1; its cost, the work order and the balance count only those blocks, and core
records name absolute columns (aicpu_tiling.h, THE WORK ORDER and THE BUFFER).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from handmade_tiling import handmade_tiling, work_units
from hypothesis import given, settings
from hypothesis import strategies as st
from pyruntime._native import ffi, lib
from tiling_inputs import (
    any_inputs,
    small_params,
    trace_decode_batch,
    trace_mixed_batch,
    valid_inputs,
)

from pyruntime import tiling, tiling_oracle
from pyruntime.tiling import TilingParams, plan, reference_plan

LLAMA_8B = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 128}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def unit_columns(params, cu, kv) -> dict[tuple[int, int], tuple[int, int]]:
    """(request, q_tile) -> the columns [first, last) the spec gives each causal unit, derived
    here from the definition (rows [p0, p1), kv_begin = max(0, p0 - W + 1), kv_end = p1)."""
    out = {}
    window, bs, qt = params.sliding_window, params.block_size, params.q_tile
    for r in range(tiling_oracle.oracle_live_batch(kv, len(kv))):
        q_len = cu[r + 1] - cu[r]
        for t in range(_ceil_div(q_len, qt)):
            p0 = kv[r] - q_len + t * qt
            p1 = kv[r] - q_len + min((t + 1) * qt, q_len)
            kv_begin = max(0, p0 - window + 1) if window else 0
            out[(r, t)] = (kv_begin // bs, _ceil_div(p1, bs))
    return out


def windowed_total(params, cu, kv) -> tuple[int, int]:
    """(W_total, w_max): the windowed total cost and the widest block cost, from the spec."""
    group = params.num_q_heads // params.num_kv_heads
    total, w_max = 0, 0
    for (r, t), (first, last) in unit_columns(params, cu, kv).items():
        q_len = cu[r + 1] - cu[r]
        rows = (min((t + 1) * params.q_tile, q_len) - t * params.q_tile) * group
        w = tiling_oracle.block_cost(params, rows)
        w_max = max(w_max, w)
        total += params.num_kv_heads * (params.cost_segment + (last - first) * w)
    return total, w_max


def with_window(params: TilingParams, window: int) -> TilingParams:
    return TilingParams(**{**params.as_dict(), "sliding_window": window})


# ----------------------------------------------------------------- params


def test_params_take_the_window_in_place_of_the_first_reserved_word():
    params = TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                          num_cores=24)  # sliding_window=None, the default: no window
    assert params.sliding_window is None
    assert params.as_dict()["sliding_window"] == 0  # the C word keeps 0 for none
    assert params._c_params().sliding_window == 0
    assert tiling.params_from_words(params.as_dict()) == params
    assert ffi.sizeof("aicpu_tiling_params") == 64
    assert ffi.offsetof("aicpu_tiling_params", "sliding_window") == 48
    assert ffi.offsetof("aicpu_tiling_params", "reserved") == 52
    assert lib.AICPU_TILING_VERSION == tiling_oracle.AICPU_TILING_VERSION == 5
    windowed = with_window(params, 128)
    assert windowed._c_params().sliding_window == 128
    assert windowed.tiling_bytes == params.tiling_bytes  # the layout does not change


@pytest.mark.parametrize("window", [-1, lib.AICPU_TILING_MAX_KV_TOKENS + 1, -(2**31)])
def test_window_out_of_range_raises_naming_it(window):
    with pytest.raises(tiling.TilingParamsError, match="sliding_window") as info:
        TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                     num_cores=24, sliding_window=window)
    assert isinstance(info.value, ValueError)
    bare = {**LLAMA_8B, "max_batch": 4, "max_tokens": 8, "max_blocks_per_req": 64,
            "num_cores": 24, "q_tile": 4, "cost_kv_load": 4, "cost_qk_tile": 1,
            "cost_segment": 32, "sliding_window": window}
    assert lib.aicpu_tiling_params_check(ffi.new("aicpu_tiling_params *", bare)) == 1
    assert tiling_oracle.oracle_params_check(type("P", (), bare)) == 1


def test_window_zero_is_refused_naming_the_convention():
    """0 is no window only in the C word: a peer's 0 (FlashInfer window_left, FlashAttention
    window_size left) is a one-key window, which is 1 here."""
    for zero in (0, np.int32(0)):
        with pytest.raises(tiling.TilingParamsError, match="sliding_window=0 is refused") as info:
            TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                         num_cores=24, sliding_window=zero)
        assert isinstance(info.value, ValueError)
        assert "None is no window" in str(info.value)
        assert "FlashInfer window_left + 1" in str(info.value)
        assert "FlashAttention window_size left + 1" in str(info.value)


@pytest.mark.parametrize("value", [True, 2.0, "128"])
def test_window_must_be_an_int(value):
    with pytest.raises(tiling.TilingParamsError, match="sliding_window must be an int"):
        TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                     num_cores=24, sliding_window=value)


def test_the_largest_window_is_valid_and_a_reserved_word_is_not():
    fields = {**LLAMA_8B, "max_batch": 4, "max_tokens": 8, "max_blocks_per_req": 64,
              "num_cores": 24, "q_tile": 4, "cost_kv_load": 4, "cost_qk_tile": 1,
              "cost_segment": 32, "sliding_window": lib.AICPU_TILING_MAX_KV_TOKENS}
    c_params = ffi.new("aicpu_tiling_params *", fields)
    assert lib.aicpu_tiling_params_check(c_params) == 0
    for i in range(3):
        c_params.reserved[i] = 1
        assert lib.aicpu_tiling_params_check(c_params) == lib.AICPU_TILING_E_PARAMS
        assert tiling_oracle.oracle_params_check(
            type("P", (), {**fields, "reserved": [int(x) for x in c_params.reserved]})) == 1
        c_params.reserved[i] = 0


@pytest.mark.parametrize("window", [1, 128])
def test_window_without_causal_is_e_params_with_only_the_header(window):
    params = TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                          num_cores=24, sliding_window=window)
    c_tiling = plan(params, [0, 1, 2], [300, 40], causal=False, epoch=-5)
    assert c_tiling.status == lib.AICPU_TILING_E_PARAMS
    assert isinstance(c_tiling.error, tiling.TilingParamsError)
    assert c_tiling.epoch == -5 and c_tiling._header(lib.AICPU_TILING_HDR_BAD_REQUEST) == -1
    assert not c_tiling.words[lib.AICPU_TILING_HDR_WORDS:].any()
    oracle = reference_plan(params, [0, 1, 2], [300, 40], causal=False, epoch=-5)
    assert c_tiling.buffer.tobytes() == oracle.buffer.tobytes()
    # the same window with causal plans
    assert plan(params, [0, 1, 2], [300, 40], causal=True).status == 0


# ----------------------------------------------------------------- hand computed


def test_hand_computed_window_counts_only_the_window_blocks():
    # One head, block 16, q_tile 4, w = 1 * (4 + 1) = 5 per block, segment 32, W = 20.
    # r0 decode kv 100: row 99 sees (79, 99], kv_begin 80 -> columns [5, 7): 2 blocks, cost 42
    #   (no window: 7 blocks, cost 67).
    # r1 prefill q 10 kv 40: rows 30..39 in tiles [30,34) [34,38) [38,40):
    #   t0 kv_begin max(0, 30 - 19) = 11 -> [0, ceil(34/16) = 3): 3 blocks, cost 47
    #   t1 kv_begin 15 -> [0, 3): 3 blocks, cost 47;  t2 kv_begin 19 -> [1, 3): 2 blocks, 42.
    # W_total = 42 + 47 + 47 + 42 = 178, against 67 + 47 + 47 + 47 = 208 without a window.
    params = TilingParams(num_q_heads=1, num_kv_heads=1, head_dim=8, block_size=16,
                          max_batch=2, max_tokens=16, max_blocks_per_req=8, num_cores=1,
                          q_tile=4, sliding_window=20)
    cu, kv = [0, 1, 11], [100, 40]
    result = plan(params, cu, kv)
    assert result.status == 0
    assert result.total_cost == result.max_core_cost == 178
    assert plan(with_window(params, None), cu, kv).total_cost == 208
    (core,) = result.cores()
    assert core.begin == (0, 0, 0, 5) and core.end == (0, 1, 0, 0)
    segs = result.segments()
    assert [(s.request, s.q_start, s.block_start, s.block_end) for s in segs] == [
        (0, 0, 5, 7), (1, 0, 0, 3), (1, 4, 0, 3), (1, 8, 1, 3)]
    assert [(s.kv_start, s.kv_end) for s in segs] == [(80, 100), (0, 34), (0, 38), (16, 40)]
    assert result.buffer.tobytes() == reference_plan(params, cu, kv).buffer.tobytes()


def test_hand_computed_window_split_names_absolute_columns():
    # One decode request, kv 100, W 64: row 99 sees (35, 99], kv_begin 36 -> columns [2, 7),
    # 5 blocks of w 5, unit cost 32 + 25 = 57. Two cores: budget 47 takes seg + 3 blocks
    # (cost 47), the second core pays the segment again for 2 blocks (cost 42); budget 46
    # leaves the second core 3 blocks (47). So the cut is at column 2 + 3 = 5.
    params = TilingParams(num_q_heads=1, num_kv_heads=1, head_dim=8, block_size=16,
                          max_batch=1, max_tokens=4, max_blocks_per_req=8, num_cores=2,
                          q_tile=4, sliding_window=64)
    result = plan(params, [0, 1], [100])
    first, second = result.cores()
    assert first.begin == (0, 0, 0, 2) and first.end == (0, 0, 0, 5) and first.cost == 47
    assert second.begin == (0, 0, 0, 5) and second.end == (0, 1, 0, 0) and second.cost == 42
    assert [(s.block_start, s.block_end, s.split) for s in result.segments()] == [
        (2, 5, 0), (5, 7, 1)]
    assert result.buffer.tobytes() == reference_plan(params, [0, 1], [100]).buffer.tobytes()


@pytest.mark.parametrize("kv_len, blocks", [(32768, 1), (32769, 2), (32767, 2), (128, 1),
                                            (129, 2), (100, 1)])
def test_window_128_over_32k_is_one_or_two_blocks(kv_len, blocks):
    params = TilingParams(**LLAMA_8B, max_batch=1, max_tokens=1, max_blocks_per_req=512,
                          num_cores=8, sliding_window=128)
    result = plan(params, [0, 1], [kv_len])
    w = tiling_oracle.block_cost(params, params.group)
    assert result.total_cost == 8 * (params.cost_segment + blocks * w)
    assert blocks == _ceil_div(kv_len, 128) - max(0, kv_len - 128) // 128  # the header's formula
    assert {s.block_end - s.block_start for s in result.segments()} <= {1, 2}


# ----------------------------------------------------------------- C against the oracle


@given(st.data(), small_params(windows=True), st.integers(0, 3))
@settings(max_examples=400, deadline=None)
def test_window_c_and_oracle_are_byte_identical(data, params, noncausal):
    causal = noncausal != 0  # one case in four without causal: E_PARAMS when W > 0
    cu, kv = data.draw(any_inputs(params, causal))
    c_tiling = plan(params, cu, kv, causal=causal, epoch=11)
    oracle_tiling = reference_plan(params, cu, kv, causal=causal, epoch=11)
    assert c_tiling.buffer.tobytes() == oracle_tiling.buffer.tobytes()
    if params.sliding_window and not causal:
        assert c_tiling.status == lib.AICPU_TILING_E_PARAMS


@given(st.data(), small_params(windows=True))
@settings(max_examples=300, deadline=None)
def test_window_units_read_exactly_their_columns_and_stay_balanced(data, params):
    cu, kv = data.draw(valid_inputs(params, True))
    result = plan(params, cu, kv)
    assert result.status == 0, result.error
    tiling_oracle.check_coverage(params, cu, kv, len(kv), True, result.words)
    ours = result.segments()
    assert [tuple(s) for s in ours] == [
        tuple(s) for s in tiling_oracle.segments(params, result.words, cu, kv, True)]
    # Every unit's pieces, joined in work order, are exactly its columns.
    expected = unit_columns(params, cu, kv)
    got: dict[tuple[int, int, int], list[tuple[int, int]]] = {}
    for s in ours:
        assert s.kv_start == s.block_start * params.block_size
        got.setdefault((s.request, s.kv_head, s.q_start // params.q_tile), []).append(
            (s.block_start, s.block_end))
    assert set(got) == {(r, h, t) for (r, t) in expected for h in range(params.num_kv_heads)}
    for (r, h, t), pieces in got.items():
        assert all(b == c for (_, b), (c, _) in itertools.pairwise(pieces)), pieces
        assert (pieces[0][0], pieces[-1][1]) == expected[(r, t)], (r, h, t, pieces)
    # The cost and the balance bound use the windowed total.
    total, w_max = windowed_total(params, cu, kv)
    if total < 2**31:
        assert result.total_cost == total
        bound = total // params.num_cores + 2 * params.cost_segment + w_max + 1
        assert result.max_core_cost <= bound


@given(st.data(), small_params(), st.integers(0, 5000))
@settings(max_examples=200, deadline=None)
def test_a_window_wider_than_every_first_row_changes_nothing(data, params, extra):
    """W >= kv_len for every request gives the windowless buffer byte for byte (the header does
    not echo W). More exactly, the buffers are equal exactly when every unit's window starts
    in block 0 (first column 0); any later first column lowers the total cost."""
    cu, kv = data.draw(valid_inputs(params, True))
    plain = plan(params, cu, kv).buffer.tobytes()
    widest = min(max(kv, default=0) + extra, lib.AICPU_TILING_MAX_KV_TOKENS)
    if widest:  # 0 (no kv, no extra) is no window here, and refused by TilingParams
        assert plan(with_window(params, widest), cu, kv).buffer.tobytes() == plain
    window = data.draw(st.integers(1, max(1, max(kv, default=1))))
    narrow = with_window(params, window)
    starts_at_zero = all(first == 0 for first, _ in unit_columns(narrow, cu, kv).values())
    assert (plan(narrow, cu, kv).buffer.tobytes() == plain) == starts_at_zero


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_handmade_layout_is_the_kernels_for_windowed_cuts(data):
    """tests/handmade_tiling.py writes absolute columns: given the kernel's own cuts under a
    window it is the kernel's buffer byte for byte."""
    hkv = data.draw(st.sampled_from([1, 2, 4]))
    batch = data.draw(st.integers(1, 5))
    q_lens = data.draw(st.lists(st.integers(0, 9), min_size=batch, max_size=batch))
    kv_lens = [q + data.draw(st.integers(0, 40)) for q in q_lens]
    cu = np.concatenate([[0], np.cumsum(q_lens)]).tolist()
    params = TilingParams(
        num_q_heads=hkv * 2, num_kv_heads=hkv, head_dim=16, block_size=8,
        max_batch=batch + 1, max_tokens=sum(q_lens) + 1, max_blocks_per_req=7,
        num_cores=data.draw(st.integers(1, 9)), q_tile=data.draw(st.sampled_from([1, 2, 4])),
        sliding_window=data.draw(st.integers(1, 20)))
    planned = plan(params, cu, kv_lens, epoch=3)
    assert planned.status == 0, planned.error
    units = work_units(params, cu, kv_lens, True)
    starts = np.cumsum([0] + [u[3] for u in units]).tolist()
    at = {(*u[:3],): (s, u[5]) for u, s in zip(units, starts)}

    def offset(pos):
        r, h, t, k = pos
        if h == params.num_kv_heads:
            return starts[-1]
        start, first = at[(r, h, t)]
        return start + k - first

    bounds = [offset(c.begin) for c in planned.cores()] + [starts[-1]]
    made = handmade_tiling(params, cu, kv_lens, bounds, epoch=3)
    assert made.words.tolist() == planned.words.tolist()
    assert made.segments() == planned.segments()


# ----------------------------------------------------------------- decode and chunked prefill


@pytest.mark.parametrize("block_size", [128, 100])  # the decode pass, and the general pass
@pytest.mark.parametrize("window", [1, 128, 4096])
def test_decode_batches_with_a_window(block_size, window):
    params = TilingParams(**{**LLAMA_8B, "block_size": block_size}, max_batch=256,
                          max_tokens=256, max_blocks_per_req=40000 // block_size + 1,
                          num_cores=24, sliding_window=window)
    rng = np.random.default_rng(window + block_size)
    cu, kv = trace_decode_batch(256, rng, params.kv_capacity)
    result = plan(params, cu, kv)
    assert result.status == 0
    blocks = [_ceil_div(k, block_size) - max(0, k - window) // block_size for k in kv.tolist()]
    w = tiling_oracle.block_cost(params, params.group)
    assert result.total_cost == 8 * sum(params.cost_segment + b * w for b in blocks)
    assert result.buffer.tobytes() == reference_plan(params, cu, kv).buffer.tobytes()
    tiling_oracle.check_coverage(params, cu.tolist(), kv.tolist(), len(kv), True, result.words)


@pytest.mark.parametrize("window", [16, 128, 1000])
def test_chunked_prefill_mixes_with_a_window(window):
    params = TilingParams(**LLAMA_8B, max_batch=48, max_tokens=1024, max_blocks_per_req=512,
                          num_cores=20, sliding_window=window)
    rng = np.random.default_rng(window)
    for _ in range(4):
        cu, kv = trace_mixed_batch(48, rng, params)
        result = plan(params, cu, kv)
        assert result.status == 0, result.error
        assert result.buffer.tobytes() == reference_plan(params, cu, kv).buffer.tobytes()
        tiling_oracle.check_coverage(params, cu, kv, len(kv), True, result.words)
        total, w_max = windowed_total(params, cu, kv)
        assert result.total_cost == total
        assert result.max_core_cost <= total // 20 + 2 * params.cost_segment + w_max + 1
        assert total < plan(with_window(params, None), cu, kv).total_cost
