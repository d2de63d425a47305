"""Each validation class on decode batches, the kernel's fast path.

A decode batch (every q_len 0 or 1) with a power-of-two block size is screened by the
kernel's branch-free decode pass (``decode_pass`` in aicpu_tiling.c); only a flagged batch
goes to the general pass that names the first offence. A check loosened in the fast pass
would let a bad batch through with status OK, so every class is planted here in decode
batches, at the first, a middle and the last request, at the exact limit and one past it,
and the result must match the header's rules, the pure-Python oracle byte for byte, and
the same batch with a block size that is not a power of two (the general pass only).
"""

from __future__ import annotations

import numpy as np
import pytest

from pyruntime import tiling
from pyruntime.tiling import TilingParams, plan, reference_plan

BATCH = 200  # more than one checkpoint chunk of requests
FAST_BLOCK, GENERAL_BLOCK = 128, 96  # a power of two takes the decode pass; 96 does not
BLOCKS_PER_REQ = 8
INT32_MAX, INT32_MIN = 2**31 - 1, -(2**31)
POSITIONS = (0, BATCH // 2 + 3, BATCH - 1)


def decode_batch(block_size: int, causal: bool = True):
    """A valid decode batch: q_len 1 for most requests, padding slots (q 0, kv 0) in between,
    kv lengths up to exactly the capacity. ``max_tokens`` is exactly the tokens used."""
    rng = np.random.default_rng(7)
    cap = BLOCKS_PER_REQ * block_size
    q = np.ones(BATCH, dtype=np.int64)
    q[rng.choice(np.arange(1, BATCH - 1), 20, replace=False)] = 0
    kv = rng.integers(1, cap + 1, BATCH)
    kv[q == 0] = 0
    kv[[1, BATCH // 2]] = cap  # the capacity itself is valid
    cu = np.concatenate([[0], np.cumsum(q)])
    return cu, kv, params_for(block_size, max_tokens=int(cu[-1]))


def params_for(block_size: int, max_tokens: int, max_batch: int = BATCH) -> TilingParams:
    return TilingParams(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=block_size,
                        max_batch=max_batch, max_tokens=max_tokens,
                        max_blocks_per_req=BLOCKS_PER_REQ, num_cores=24)  # fmt: skip


def live(cu, at: int) -> int:
    """The first request at or after ``at`` with q_len 1 (bad kv only matters there)."""
    return next(r for r in range(at, BATCH) if cu[r + 1] - cu[r] == 1) if at < BATCH - 1 else at


# Each case plants one offence: (cu, kv, params, r) -> (cu, kv, params, expected
# (error class, request, value, limit), causal).
def query_start(cu, kv, params, r):
    cu = cu + 1
    return cu, kv, params, (tiling.QueryStartError, 0, 1, 0), True


def query_decreasing(cu, kv, params, r):
    r = max(r, 1)
    cu = cu.copy()
    cu[r + 1] = cu[r] - 1
    return cu, kv, params, (tiling.QueryDecreasingError, r, cu[r] - 1, cu[r]), True


def query_overflow_by_one(cu, kv, params, r):
    r = live(cu, max(r, 1))  # T one below cu[r + 1] (T >= 1): request r is the first past it
    cu = cu.copy()
    cu[r + 1 :] = cu[r + 1]  # later requests get q_len 0: the whole batch is one token past T
    limit = int(cu[r + 1]) - 1
    p = params_for(params.block_size, max_tokens=limit)
    return cu, kv, p, (tiling.QueryOverflowError, r, limit + 1, limit), True


def query_overflow_huge(cu, kv, params, r):
    cu = cu.copy()
    cu[r + 1 :] = INT32_MAX  # q_len of r wraps; later requests have q_len 0
    return cu, kv, params, (tiling.QueryOverflowError, r, INT32_MAX, params.max_tokens), True


def kv_negative(cu, kv, params, r):
    kv = kv.copy()
    kv[r] = -1
    return cu, kv, params, (tiling.KvNegativeError, r, -1, 0), True


def kv_most_negative_on_padding(cu, kv, params, r):
    kv = kv.copy()
    kv[r] = INT32_MIN  # even a q_len 0 slot may not have a negative kv length
    return cu, kv, params, (tiling.KvNegativeError, r, INT32_MIN, 0), True


def kv_short(cu, kv, params, r):
    r = live(cu, r)
    kv = kv.copy()
    kv[r] = 0
    return cu, kv, params, (tiling.KvShortError, r, 0, 1), True


def kv_capacity_by_one(cu, kv, params, r):
    kv = kv.copy()
    kv[r] = params.kv_capacity + 1  # any q_len, padding slots too
    return cu, kv, params, (tiling.KvCapacityError, r, params.kv_capacity + 1,
                            params.kv_capacity), True


def kv_empty_not_causal(cu, kv, params, r):
    r = live(cu, r)
    kv = kv.copy()
    kv[r] = 0
    return cu, kv, params, (tiling.KvEmptyError, r, 0, 1), False


CASES = [query_start, query_decreasing, query_overflow_by_one, query_overflow_huge, kv_negative,
         kv_most_negative_on_padding, kv_short, kv_capacity_by_one, kv_empty_not_causal]


@pytest.mark.parametrize("block_size", [FAST_BLOCK, GENERAL_BLOCK], ids=["fast", "general"])
def test_the_clean_decode_batch_is_valid_at_its_limits(block_size):
    cu, kv, params = decode_batch(block_size)
    assert int(cu[-1]) == params.max_tokens and kv.max() == params.kv_capacity
    for causal in (True, False):
        result = plan(params, cu, kv, causal=causal)
        assert result.status == tiling.OK and result.num_tokens == params.max_tokens
        assert result.words.tolist() == reference_plan(params, cu, kv, causal=causal).words.tolist()


@pytest.mark.parametrize("position", POSITIONS, ids=["first", "middle", "last"])
@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_each_class_is_caught_on_the_decode_fast_path(case, position):
    results = []
    for block_size in (FAST_BLOCK, GENERAL_BLOCK):
        cu, kv, params, expected, causal = case(*decode_batch(block_size), position)
        error_class, request, value, limit = expected
        result = plan(params, cu, kv, causal=causal)
        if value == 0 and request == BATCH - 1:  # an empty kv planted on the last request:
            # ABI v4 makes it trailing padding, planned without it
            assert result.status == tiling.OK and result.batch == BATCH - 1
            assert result.words.tolist() == reference_plan(params, cu, kv,
                                                           causal=causal).words.tolist()
            results.append((None, request))
            continue
        error = result.error
        assert type(error) is error_class, (block_size, result.status)
        assert (error.request, error.value, error.limit) == (request, value, limit)
        assert all(core.num_segments == 0 and core.begin == core.end for core in result.cores())
        assert result.words.tolist() == reference_plan(params, cu, kv, causal=causal).words.tolist()
        results.append((type(error), error.request))
    assert results[0] == results[1]  # fast and general passes name the same offence


def test_the_first_offence_in_request_order_is_named():
    cu, kv, params = decode_batch(FAST_BLOCK)
    kv = kv.copy()
    kv[150] = -5                       # a later, different offence
    kv[40] = params.kv_capacity + 1    # the first one
    error = plan(params, cu, kv).error
    assert type(error) is tiling.KvCapacityError and error.request == 40


def test_within_a_request_the_checks_go_in_status_code_order():
    cu, kv, _ = decode_batch(FAST_BLOCK)
    r = live(cu, 60)
    kv = kv.copy()
    kv[r] = -1                                           # also negative ...
    p = params_for(FAST_BLOCK, max_tokens=int(cu[r + 1]) - 1)  # ... but past T comes first
    error = plan(p, cu, kv).error
    assert type(error) is tiling.QueryOverflowError and error.request == r


def test_a_decode_batch_over_max_batch_is_refused_before_reading():
    cu, kv, _ = decode_batch(FAST_BLOCK)
    params = params_for(FAST_BLOCK, max_tokens=int(cu[-1]), max_batch=BATCH - 1)
    error = plan(params, cu, kv).error
    assert type(error) is tiling.BatchError
    assert (error.request, error.value, error.limit) == (-1, BATCH, BATCH - 1)
