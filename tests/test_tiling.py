"""The C tiling kernel through its Python boundary, against the pure-Python oracle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyruntime._native import lib
from tiling_inputs import (
    any_inputs,
    small_params,
    trace_decode_batch,
    trace_mixed_batch,
    valid_inputs,
)

from pyruntime import tiling, tiling_oracle
from pyruntime.tiling import TilingParams, plan, plan_into, reference_plan

GOLDEN = Path(__file__).parent / "data" / "golden_tiling.json"

LLAMA_8B = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 128}


def trace_params(max_batch: int = 1024, num_cores: int = 24, **overrides) -> TilingParams:
    fields = dict(LLAMA_8B, max_batch=max_batch, max_tokens=max(max_batch, 512),
                  max_blocks_per_req=512, num_cores=num_cores)
    fields.update(overrides)
    return TilingParams(**fields)


# ----------------------------------------------------------------- constants and params


def test_oracle_mirrors_every_status_and_layout_constant():
    names = [n for n in dir(tiling_oracle) if n.startswith("AICPU_TILING_")]
    assert len(names) > 40
    for name in names:
        assert getattr(tiling_oracle, name) == getattr(lib, name), name


def test_params_defaults_and_sizes():
    params = trace_params(max_batch=64)
    assert params.q_tile == 128 // params.group == 32
    assert params.tiling_bytes % 64 == 0
    assert params.tiling_bytes == tiling_oracle.oracle_tiling_bytes(params)
    assert params.max_partial_slots == 2 * (params.num_cores - 1)
    rows = params.q_tile * params.group
    assert params.workspace_bytes == params.max_partial_slots * rows * (params.head_dim + 1) * 4


@pytest.mark.parametrize(
    "change, message",
    [
        ({"num_kv_heads": 5}, "multiple of num_kv_heads"),
        ({"num_cores": 0}, "num_cores is 0"),
        ({"block_size": lib.AICPU_TILING_MAX_BLOCK_SIZE + 1}, "block_size"),
        ({"max_blocks_per_req": lib.AICPU_TILING_MAX_KV_TOKENS}, "kv tokens"),
        ({"q_tile": lib.AICPU_TILING_MAX_TILE_ROWS}, r"q_tile \* group"),
        ({"cost_segment": -1}, "cost_segment"),
        ({"cost_kv_load": 0, "cost_qk_tile": 0}, "at least 1"),
        ({"head_dim": 2.5}, "must be an int"),
        ({"max_tokens": 2**40}, "int32 range"),
        ({"max_tokens": lib.AICPU_TILING_MAX_TOKENS, "num_kv_heads": 32, "num_q_heads": 1024,
              "max_blocks_per_req": 1 << 19, "cost_kv_load": 1024, "cost_qk_tile": 1024}, "overflow"),
    ],
)
def test_bad_params_raise_a_value_error_naming_the_field(change, message):
    fields = dict(LLAMA_8B, max_batch=8, max_tokens=64, max_blocks_per_req=64, num_cores=24)
    fields.update(change)
    with pytest.raises(tiling.TilingParamsError, match=message) as info:
        TilingParams(**fields)
    assert isinstance(info.value, ValueError)
    assert info.value.code == lib.AICPU_TILING_E_PARAMS


@given(small_params())
@settings(max_examples=200, deadline=None)
def test_params_check_agrees_with_oracle_on_valid_params(params):
    assert tiling_oracle.oracle_params_check(params) == lib.AICPU_TILING_OK
    assert tiling_oracle.oracle_tiling_bytes(params) == params.tiling_bytes
    assert tiling_oracle.oracle_workspace_bytes(params) == params.workspace_bytes


# ----------------------------------------------------------------- C against the oracle


@given(st.data(), small_params(), st.booleans())
@settings(max_examples=400, deadline=None)
def test_c_and_oracle_are_byte_identical(data, params, causal):
    cu, kv = data.draw(any_inputs(params, causal))
    c_tiling = plan(params, cu, kv, causal=causal)
    oracle_tiling = reference_plan(params, cu, kv, causal=causal)
    assert c_tiling.buffer.tobytes() == oracle_tiling.buffer.tobytes()


@given(st.data(), small_params(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_every_valid_tiling_covers_the_attention_exactly(data, params, causal):
    cu, kv = data.draw(valid_inputs(params, causal))
    result = plan(params, cu, kv, causal=causal)
    assert result.status == 0, result.error
    tiling_oracle.check_coverage(params, cu, kv, len(kv), causal, result.words)
    # Our decoder and the oracle's agree segment for segment.
    ours = result.segments()
    theirs = tiling_oracle.segments(params, result.words, cu, kv, causal)
    assert [tuple(s) for s in ours] == [tuple(s) for s in theirs]
    assert len(ours) == result.num_segments <= result.num_units + params.num_cores - 1


@pytest.mark.parametrize("batch", [1, 16, 64, 256, 1024])
def test_trace_decode_batches_match_oracle(batch):
    params = trace_params()
    rng = np.random.default_rng(batch)
    for _ in range(3 if batch < 1024 else 1):
        cu, kv = trace_decode_batch(batch, rng, params.kv_capacity)
        c_tiling = plan(params, cu, kv)
        assert c_tiling.status == 0
        assert c_tiling.buffer.tobytes() == reference_plan(params, cu, kv).buffer.tobytes()


@pytest.mark.parametrize("causal", [True, False])
def test_trace_mixed_batches_match_oracle_and_cover(causal):
    params = trace_params(max_batch=48, max_tokens=1024, num_cores=20)
    rng = np.random.default_rng(7)
    for _ in range(6):
        cu, kv = trace_mixed_batch(48, rng, params)
        result = plan(params, cu, kv, causal=causal)
        assert result.status == 0, result.error
        assert result.buffer.tobytes() == reference_plan(params, cu, kv, causal=causal).buffer.tobytes()
        tiling_oracle.check_coverage(params, cu, kv, len(kv), causal, result.words)


def test_golden_vectors():
    """tests/data/golden_tiling.json was made by `python tools/make_golden.py`."""
    cases = json.loads(GOLDEN.read_text())
    assert len(cases) >= 10
    for case in cases:
        params = tiling.params_from_words(case["params"])  # the C word's 0: no window
        result = plan(params, case["cu_seqlens_q"], case["seqlens_kv"], causal=case["causal"],
                      epoch=case["epoch"])
        assert result.words.tolist() == case["words"], case["name"]
        assert result.epoch == case["epoch"], case["name"]


# ----------------------------------------------------------------- validation classes

INVALID = [
    # name, cu_seqlens_q, seqlens_kv, causal, error class, request, value, limit
    ("query start", [1, 2], [5], True, tiling.QueryStartError, 0, 1, 0),
    ("decreasing", [0, 3, 2], [5, 5], True, tiling.QueryDecreasingError, 1, 2, 3),
    ("past T", [0, 4, 65], [5, 80], True, tiling.QueryOverflowError, 1, 65, 64),
    ("negative kv", [0, 1, 2], [5, -1], True, tiling.KvNegativeError, 1, -1, 0),
    ("kv < q", [0, 1, 5], [5, 3], True, tiling.KvShortError, 1, 3, 4),
    ("kv capacity", [0, 1], [8193], True, tiling.KvCapacityError, 0, 8193, 8192),
    ("empty kv", [0, 0, 2, 3], [0, 0, 5], False, tiling.KvEmptyError, 1, 0, 1),
]


@pytest.mark.parametrize("case", INVALID, ids=[c[0] for c in INVALID])
def test_each_invalid_class_has_its_own_typed_error(case):
    _, cu, kv, causal, error_class, request, value, limit = case
    params = TilingParams(**LLAMA_8B, max_batch=4, max_tokens=64, max_blocks_per_req=64,
                          num_cores=8)
    result = plan(params, cu, kv, causal=causal)
    assert result.status == error_class.code
    error = result.error
    assert type(error) is error_class and isinstance(error, ValueError)
    assert (error.request, error.value, error.limit) == (request, value, limit)
    assert f"request {request}" in str(error)
    with pytest.raises(error_class):
        result.raise_for_status()
    assert result.segments() == []
    assert all(core.num_segments == 0 for core in result.cores())


def test_batch_over_capacity_reads_nothing_and_reports():
    params = TilingParams(**LLAMA_8B, max_batch=2, max_tokens=64, max_blocks_per_req=64,
                          num_cores=8)
    result = plan(params, [0, 1, 2, 3], [5, 5, 5])
    assert isinstance(result.error, tiling.BatchError)
    assert (result.error.request, result.error.value, result.error.limit) == (-1, 3, 2)


def test_distinct_codes_for_every_status():
    codes = {cls.code for cls in tiling._ERROR_BY_CODE.values()}
    assert codes == set(range(1, lib.AICPU_TILING_NUM_STATUS))


def test_padding_rows_are_valid_and_get_no_work():
    params = TilingParams(**LLAMA_8B, max_batch=4, max_tokens=16, max_blocks_per_req=8,
                          num_cores=4)
    result = plan(params, [0, 1, 1, 2, 2], [300, 0, 40, 0])
    assert result.status == 0 and result.num_tokens == 2
    assert {s.request for s in result.segments()} == {0, 2}


# ----------------------------------------------------------------- caller-owned memory


def test_plan_into_writes_only_the_buffer_and_matches_plan():
    params = trace_params(max_batch=8)
    cu = np.arange(9, dtype=np.int32)
    kv = np.full(8, 1000, dtype=np.int32)
    out = np.full(params.tiling_bytes + 64, 0xAB, dtype=np.uint8)
    assert plan_into(params, cu, kv, 8, out) == 0
    assert (out[params.tiling_bytes:] == 0xAB).all()
    assert out[: params.tiling_bytes].tobytes() == plan(params, cu, kv).buffer.tobytes()


def test_plan_into_accepts_torch_tensors():
    torch = pytest.importorskip("torch")
    params = trace_params(max_batch=8)
    cu = torch.arange(9, dtype=torch.int32)
    kv = torch.full((8,), 777, dtype=torch.int32)
    out = torch.zeros(params.tiling_bytes, dtype=torch.uint8)
    assert plan_into(params, cu, kv, 8, out) == 0
    assert out.numpy().tobytes() == plan(params, cu.numpy(), kv.numpy()).buffer.tobytes()


@pytest.mark.parametrize(
    "cu, kv, out_bytes, message",
    [
        (np.arange(9, dtype=np.int64), np.ones(8, np.int32), None, "int32"),
        (np.arange(5, dtype=np.int32), np.ones(8, np.int32), None, "holds 5 values, need 9"),
        (np.arange(9, dtype=np.int32), np.ones(8, np.int32), 64, "need"),
    ],
)
def test_plan_into_rejects_unusable_memory(cu, kv, out_bytes, message):
    params = trace_params(max_batch=8)
    out = np.zeros(out_bytes or params.tiling_bytes, dtype=np.uint8)
    with pytest.raises(tiling.TilingBufferError, match=message):
        plan_into(params, cu, kv, 8, out)


def test_plan_rejects_mismatched_lengths():
    params = trace_params(max_batch=8)
    with pytest.raises(tiling.TilingBufferError, match="len\\(seqlens_kv\\) \\+ 1"):
        plan(params, [0, 1, 2], [5])
    with pytest.raises(tiling.TilingBufferError, match="int32 range"):
        plan(params, [0, 2**33], [5])


# One offence in an otherwise valid decode batch (every q_len 0 or 1, block size a power of
# two): the kernel's branch-free decode pass must flag it and the general pass report it.
# The last case is valid: a padded slot exactly at the capacity, which the decode pass
# flags conservatively and the general pass plans.
DECODE_OFFENCES = [
    ("decreasing", True, lib.AICPU_TILING_E_QUERY_DECREASING),
    ("overflow", True, lib.AICPU_TILING_E_QUERY_OVERFLOW),
    ("negative", True, lib.AICPU_TILING_E_KV_NEGATIVE),
    ("short", True, lib.AICPU_TILING_E_KV_SHORT),
    ("capacity", True, lib.AICPU_TILING_E_KV_CAPACITY),
    ("empty", False, lib.AICPU_TILING_E_KV_EMPTY),
    ("padded_at_capacity", True, lib.AICPU_TILING_OK),
]


@pytest.mark.parametrize("kind, causal, status", DECODE_OFFENCES, ids=[k[0] for k in DECODE_OFFENCES])
@pytest.mark.parametrize("batch", [1, 7, 300])
def test_decode_pass_validation_classes(kind, causal, status, batch):
    params = trace_params(max_batch=512, max_tokens=512)
    capacity = params.max_blocks_per_req * params.block_size
    r = batch // 2
    cu = list(range(batch + 1))
    kv = [100 + 37 * i for i in range(batch)]
    if kind == "decreasing":  # request r's end below its start; later offsets stay valid
        cu[r + 1] = cu[r] - 1
    elif kind == "overflow" and r > 0:  # one token a request, max_tokens = r: r is first
        params = trace_params(max_batch=512, max_tokens=r)
    elif kind == "overflow":  # batch 1: a one-request batch can only overflow by q_len > 1
        cu[1] = params.max_tokens + 1
        kv[0] = params.max_tokens + 1
    elif kind == "negative":
        kv[r] = -1
    elif kind in ("short", "empty"):
        kv[r] = 0
    elif kind == "capacity":
        kv[r] = capacity + 1
    else:  # a padded slot (q_len 0) at exactly the capacity
        cu = cu[: r + 1] + [x - 1 for x in cu[r + 1 :]]
        kv[r] = capacity
    if kind in ("short", "empty") and r == batch - 1:
        status = lib.AICPU_TILING_OK  # ABI v4: a trailing kv_len 0 slot is padding
    result = plan(params, cu, kv, causal=causal)
    expected = tiling_oracle.oracle_plan(params, cu, kv, batch, causal)
    assert result.status == status
    if status != lib.AICPU_TILING_OK:
        assert result.words[lib.AICPU_TILING_HDR_BAD_REQUEST] == r
    assert np.array_equal(result.words[: len(expected)], expected)


# ----------------------------------------------------------------- balance


def test_few_units_min_max_in_the_kernel():
    """Two units on three cores (tests/test_tiling_oracle.py, by hand): the kernel takes the
    exact min-max 20, 20, 20 (cuts aimed at equal shares and snapped to the nearest block
    boundary would give 24, 20, 0)."""
    params = TilingParams(num_q_heads=1, num_kv_heads=1, head_dim=64, block_size=16,
                          max_batch=2, max_tokens=64, max_blocks_per_req=8, num_cores=3,
                          q_tile=1, cost_kv_load=4, cost_qk_tile=0, cost_segment=16)
    result = plan(params, [0, 1, 2], [19, 3], causal=False)
    assert [core.cost for core in result.cores()] == [20, 20, 20]
    assert result.max_core_cost == 20
    expected = tiling_oracle.oracle_plan(params, [0, 1, 2], [19, 3], 2, False)
    assert np.array_equal(result.words[: len(expected)], expected)


@pytest.mark.parametrize("batch", [16, 64, 256, 1024])
@pytest.mark.parametrize("heads", [(32, 8), (16, 1)], ids=["32q-8kv", "16q-1kv"])
def test_balance_on_trace_batches(batch, heads):
    """Busiest core within 10% of total / cores + one segment, 24 cores.

    32q/8kv is Llama-3-8B on one card; 16q/1kv is a tensor-parallel shard (few units per
    core, where exact cuts matter most).
    """
    params = trace_params(num_q_heads=heads[0], num_kv_heads=heads[1])
    rng = np.random.default_rng(1000 + batch)
    for _ in range(8):
        cu, kv = trace_decode_batch(batch, rng, params.kv_capacity)
        result = plan(params, cu, kv)
        ideal = result.total_cost / params.num_cores + params.cost_segment
        assert result.max_core_cost <= 1.10 * ideal, (result.max_core_cost, ideal)
