"""The tiling's consumers on ABI v3 tilings built by hand (tests/handmade_tiling.py).

The head-major work order (kv head, request, query tile, kv block), the end position
(0, num_kv_heads, 0, 0) and the combine table right after the core table, read by the C
reference attention, the Triton kernels and ``pyruntime.tiling``'s decoders, with core ranges
the kernel's partition would rarely pick: across kv heads, starting or ending inside a unit
at a head change, past padded requests, idle cores anywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from handmade_tiling import expected_segments, handmade_tiling, num_work_blocks, work_units
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reference_attention import Case, assert_close

from pyruntime import tiling
from pyruntime.kernels import reference_attention as ra
from pyruntime.kernels import triton_launch

CASES = {
    # name: (Case keyword arguments, core bounds on the head-major block axis)
    # heads of 8 blocks each (1 + 3 + 0 + 4): core 1 runs head 0's tail and head 1's start,
    # cut inside units on both sides
    "across_heads": ({"hq": 8, "hkv": 2, "d": 32, "bs": 8, "cores": 3,
                      "q_lens": (1, 1, 0, 1), "kv_lens": (5, 20, 7, 30)}, [0, 3, 11, 16]),
    # one core: every kv head of every decode request fused
    "one_core": ({"hq": 8, "hkv": 4, "d": 32, "bs": 8, "cores": 1, "q_lens": (1, 0, 1),
                  "kv_lens": (17, 3, 40)}, None),
    # 4 heads of 10 blocks (2 + 5 + 3): core 0 ends inside head 1, core 1 runs the rest
    # (head 1's last units fused with heads 2 and 3 for request 2, not for request 1)
    "tail_heads": ({"hq": 8, "hkv": 4, "d": 16, "bs": 8, "cores": 2, "q_lens": (1, 1, 1),
                    "kv_lens": (9, 33, 20)}, [0, 13, 40]),
    # heads of 4 blocks (request 0 is padding): ranges from and to unit boundaries, one at
    # the next head's first live request, idle cores between and at the end
    "idle_and_unit_bounds": ({"hq": 4, "hkv": 2, "d": 16, "bs": 8, "cores": 5,
                              "q_lens": (0, 1, 1), "kv_lens": (4, 16, 9)}, [0, 2, 2, 4, 8, 8]),
    # multi-tile prefill and speculative decode: cuts inside tiles of both heads
    "prefill_tiles": ({"hq": 4, "hkv": 2, "d": 16, "bs": 4, "cores": 4, "q_tile": 2,
                       "q_lens": (3, 0, 5), "kv_lens": (10, 2, 9), "max_tokens": 10},
                      [0, 5, 13, 20, 26]),
}


def make(name: str, rng_seed: int = 0, dtype=torch.float32):
    kwargs, bounds = CASES[name]
    case = Case(np.random.default_rng(rng_seed), dtype=dtype, **kwargs)
    total = num_work_blocks(case.params, case.cu.tolist(), case.kv_lens, case.causal)
    bounds = bounds or [0, total]
    assert bounds[-1] == total, (name, total)
    made = handmade_tiling(case.params, case.cu.tolist(), case.kv_lens, bounds,
                           causal=case.causal)
    return case, made, bounds


def test_handmade_cases_cut_where_the_names_say():
    _, made, _ = make("across_heads")
    cores = made.cores()
    assert cores[1].begin == (1, 0, 0, 2) and cores[1].end == (1, 1, 0, 2)
    assert cores[2].end == (0, 2, 0, 0)   # the end of the work
    assert made.num_slots == 4 and len(made.combine_records()) == 2
    _case, made, _ = make("idle_and_unit_bounds")
    cores = made.cores()
    assert cores[1].begin == cores[1].end and cores[4].begin == cores[4].end == (0, 2, 0, 0)
    assert cores[2].begin == (2, 0, 0, 0)    # a unit boundary names the next unit ...
    assert cores[2].end == (1, 1, 0, 0)      # ... or the next head's first live request


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(CASES))
def test_c_reference_attention_walks_head_major_ranges(name, dtype):
    case, made, _ = make(name, dtype=dtype)
    out, statuses, fin = case.run(made)
    assert set(statuses.values()) == {0}, {c: ra.strerror(s) for c, s in statuses.items()}
    assert fin == 0, ra.strerror(fin)
    assert_close(case, out)


def test_c_reference_attention_counts_fused_heads_as_segments():
    """A record claiming one segment more than its range holds is refused (E_TILING), also
    when the range's units run fused across kv heads."""
    case, made, _ = make("one_core")
    at = tiling.HEADER_WORDS + tiling.lib.AICPU_TILING_CORE_NUM_SEGMENTS
    made.words[at] += 1
    _, statuses, _ = case.run(made)
    assert statuses[0] == ra.E_TILING


@given(st.data())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_c_reference_attention_on_random_head_major_cuts(data):
    hkv = data.draw(st.sampled_from([1, 2, 3]))
    group = data.draw(st.sampled_from([1, 4]))
    batch = data.draw(st.integers(1, 4))
    q_tile = data.draw(st.sampled_from([1, 2, 3]))
    q_lens = data.draw(st.lists(st.integers(0, 4), min_size=batch, max_size=batch))
    kv_lens = [q + data.draw(st.integers(0, 20)) for q in q_lens]   # causal: kv >= q
    cores = data.draw(st.integers(1, 6))
    case = Case(np.random.default_rng(data.draw(st.integers(0, 99))), hq=hkv * group, hkv=hkv,
                d=16, bs=4, cores=cores, q_tile=q_tile, q_lens=q_lens, kv_lens=kv_lens,
                max_tokens=sum(q_lens) + 1)
    total = num_work_blocks(case.params, case.cu.tolist(), kv_lens)
    cuts = sorted(data.draw(st.lists(st.integers(0, total), min_size=cores - 1,
                                     max_size=cores - 1)))
    bounds = [0, *cuts, total]
    made = handmade_tiling(case.params, case.cu.tolist(), kv_lens, bounds)
    out, statuses, fin = case.run(made)
    assert set(statuses.values()) <= {0} and fin == 0, (statuses, fin)
    assert_close(case, out)
    # pyruntime.tiling's decoder walks the same ranges
    assert made.segments() == expected_segments(case.params, case.cu.tolist(), kv_lens, bounds)


@pytest.mark.parametrize("name", sorted(CASES))
def test_decode_segments_walks_head_major_ranges(name):
    case, made, bounds = make(name)
    got = made.segments()
    assert got == expected_segments(case.params, case.cu.tolist(), case.kv_lens, bounds)
    assert len(got) == made.num_segments
    # every core's segments are in work order
    for core in range(case.params.num_cores):
        keys = [(s.kv_head, s.request, s.q_start) for s in got if s.core == core]
        assert keys == sorted(keys)


def test_combine_records_follow_the_core_table():
    case, made, _ = make("across_heads")
    records = made.combine_records()
    assert [(r.request, r.kv_head, r.q_tile, r.first_slot, r.num_pieces) for r in records] == [
        (1, 0, 0, 0, 2), (1, 1, 0, 2, 2)]
    start = tiling.HEADER_WORDS + tiling.CORE_WORDS * case.params.num_cores
    assert made.words[start : start + 5].tolist() == [1, 0, 0, 0, 2]
    assert not hasattr(made, "split_prefix")


def test_work_order_key_sorts_head_first():
    positions = [(0, 1, 0, 0), (2, 0, 0, 1), (0, 2, 0, 0), (1, 0, 3, 0)]
    assert sorted(positions, key=tiling.work_order_key) == [
        (1, 0, 3, 0), (2, 0, 0, 1), (0, 1, 0, 0), (0, 2, 0, 0)]


# --------------------------------------------------------------------------- Triton

triton_only = pytest.mark.skipif(triton_launch.available() is not None,
                                 reason=str(triton_launch.available()))


@triton_only
@pytest.mark.parametrize("name", ["across_heads", "prefill_tiles", "idle_and_unit_bounds"])
def test_triton_kernels_walk_head_major_ranges(name):
    from test_triton_attention import TOL, errors, run_triton

    case, made, _ = make(name, dtype=torch.float16)
    c_out, _, _ = case.run(made)
    out, statuses, combined = run_triton(case, made)
    assert set(statuses) == {0} and set(combined) == {0}, (statuses, combined)
    vs_ref, vs_c = errors(case, out, c_out)
    assert vs_ref <= TOL[torch.float16] and vs_c <= TOL[torch.float16]


# --------------------------------------------------------------------------- the kernel

@given(st.data())
@settings(max_examples=60, deadline=None)
def test_handmade_layout_is_the_kernels_for_the_kernels_cuts(data):
    """Given the kernel's own cuts, the hand-built buffer is the kernel's byte for byte: the
    tests above read the layout the kernel writes (positions, slots, combine records, header)."""
    hkv = data.draw(st.sampled_from([1, 2, 4]))
    group = data.draw(st.sampled_from([1, 4]))
    batch = data.draw(st.integers(1, 5))
    q_lens = data.draw(st.lists(st.integers(0, 5), min_size=batch, max_size=batch))
    kv_lens = [q + data.draw(st.integers(0, 40)) for q in q_lens]
    cu = np.concatenate([[0], np.cumsum(q_lens)]).tolist()
    params = tiling.TilingParams(
        num_q_heads=hkv * group, num_kv_heads=hkv, head_dim=16, block_size=8,
        max_batch=batch + 1, max_tokens=sum(q_lens) + 1, max_blocks_per_req=6,
        num_cores=data.draw(st.integers(1, 9)), q_tile=data.draw(st.sampled_from([1, 2, 4])))
    planned = tiling.plan(params, cu, kv_lens, causal=True, epoch=7)
    assert planned.status == 0, planned.error
    # the cuts: each core's begin on the block axis
    units = work_units(params, cu, kv_lens, True)
    starts = np.cumsum([0] + [u[3] for u in units]).tolist()
    at = {(*u[:3],): s for u, s in zip(units, starts)}

    def offset(pos):
        r, h, t, k = pos
        return starts[-1] if h == params.num_kv_heads else at[(r, h, t)] + k

    bounds = [offset(c.begin) for c in planned.cores()] + [starts[-1]]
    made = handmade_tiling(params, cu, kv_lens, bounds, epoch=7)
    assert made.words.tolist() == planned.words.tolist()


@triton_only
@given(st.data())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_triton_kernels_on_random_head_major_cuts(data):
    from test_triton_attention import TOL, errors, run_triton

    hkv = data.draw(st.sampled_from([1, 2, 3]))
    batch = data.draw(st.integers(1, 4))
    q_lens = data.draw(st.lists(st.integers(0, 3), min_size=batch, max_size=batch))
    kv_lens = [q + data.draw(st.integers(0, 20)) for q in q_lens]
    cores = data.draw(st.integers(1, 5))
    case = Case(np.random.default_rng(data.draw(st.integers(0, 99))), hq=hkv * 2, hkv=hkv,
                d=16, bs=4, cores=cores, q_tile=data.draw(st.sampled_from([1, 2])),
                q_lens=q_lens, kv_lens=kv_lens, max_tokens=sum(q_lens) + 1,
                dtype=torch.float16)
    total = num_work_blocks(case.params, case.cu.tolist(), kv_lens)
    cuts = sorted(data.draw(st.lists(st.integers(0, total), min_size=cores - 1,
                                     max_size=cores - 1)))
    made = handmade_tiling(case.params, case.cu.tolist(), kv_lens, [0, *cuts, total])
    c_out, _, _ = case.run(made)
    out, statuses, combined = run_triton(case, made)
    assert set(statuses) == {0} and set(combined) == {0}, (statuses, combined)
    if sum(q_lens):
        vs_ref, vs_c = errors(case, out, c_out)
        assert vs_ref <= TOL[torch.float16] and vs_c <= TOL[torch.float16]
    else:
        assert torch.equal(out, torch.zeros_like(out))
