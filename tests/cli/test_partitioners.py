"""Partitioners: exact coverage, the anchors' documented rules, ours against the kernel."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyruntime.partitioners import ANCHORS, CostModel, Segment, Workload, WorkloadError, fia
from pyruntime.partitioners import ours_abi as ours
from pyruntime.partitioners.flashinfer import chunk_blocks, flashinfer
from pyruntime.partitioners.flashmla import FIXED_OVERHEAD_BLOCKS, flashmla
from pyruntime.partitioners.study import balance_study
from pyruntime.tiling import CoreRange


def _workload(kv, q=None, **model):
    q = q or [1] * len(kv)
    cu = [0]
    for x in q:
        cu.append(cu[-1] + x)
    return Workload(CostModel(**model), cu, kv)


def test_cost_model_matches_the_header_formula():
    m = CostModel(num_q_heads=32, num_kv_heads=8, block_size=128)
    assert m.block_cost(4) == 8 * (4 + 1)
    assert m.block_cost(17) == 8 * (4 + 2)
    w = _workload([300], num_q_heads=32, num_kv_heads=8)
    assert w.num_units == 8 and list(w.blocks) == [3] * 8
    assert w.total_cost == 8 * (32 + 3 * 40)


def test_invalid_lengths_are_typed_errors():
    with pytest.raises(WorkloadError, match="request 0"):
        _workload([0], q=[1])
    with pytest.raises(WorkloadError):
        Workload(CostModel(), [1, 2], [5])
    with pytest.raises(WorkloadError, match="multiple"):
        CostModel(num_q_heads=6, num_kv_heads=4)


lengths = st.lists(st.integers(1, 5000), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(kv=lengths, cores=st.integers(1, 32), kv_heads=st.sampled_from([1, 2, 8]))
def test_every_anchor_covers_the_work_exactly_once(kv, cores, kv_heads):
    w = _workload(kv, num_q_heads=8 * kv_heads, num_kv_heads=kv_heads,
                  num_cores=cores)  # fmt: skip
    for name, fn in ANCHORS.items():
        part = fn(w)
        part.validate()
        assert len(part.cores) == cores, name
        bal = part.balance()
        assert bal.max_core_cost * cores >= w.total_cost  # nobody beats the average


@settings(max_examples=40, deadline=None)
@given(kv=lengths, cores=st.integers(1, 32))
def test_flashmla_part_bound(kv, cores):
    w = _workload(kv, num_cores=cores)
    part = flashmla(w)
    total = sum(int(b) + FIXED_OVERHEAD_BLOCKS for b in w.blocks)
    payload = -(-total // cores) + FIXED_OVERHEAD_BLOCKS
    for core in part.cores:
        used = sum(s.block_end - s.block_begin + FIXED_OVERHEAD_BLOCKS for s in core)
        assert used <= payload + FIXED_OVERHEAD_BLOCKS


def test_flash_decoding_rule():
    # 2 pairs on 24 cores: kvSplitPart = 12, reduced while 4096 / parts < 512 -> 8
    w = _workload([4096, 1000], num_q_heads=1, num_kv_heads=1, num_cores=24)
    assert fia.flash_decoding_parts(w) == 8
    # GQA with short kv: no flash decoding
    assert fia.flash_decoding_parts(_workload([1000, 900], num_q_heads=8, num_kv_heads=1)) == 1
    # bn >= 0.4 * cores: off
    assert fia.flash_decoding_parts(_workload([4096] * 10, num_q_heads=1, num_kv_heads=1)) == 1
    part = fia.fia_weighted(_workload([4096, 1000], num_q_heads=1, num_kv_heads=1))
    part.validate()
    assert part.num_segments == 8 + 2  # 32 blocks in chunks of 4, 8 blocks in chunks of 4


def test_fia_even_split_counts():
    part = fia.fia_even(_workload([100] * 50, num_q_heads=1, num_kv_heads=1, num_cores=24))
    assert [len(c) for c in part.cores] == [3, 3] + [2] * 22


def test_flashinfer_chunk_is_smallest_that_fits():
    w = _workload([128 * 10, 128 * 3], num_q_heads=1, num_kv_heads=1, num_cores=6)
    chunk = chunk_blocks(w)
    count = sum(-(-int(b) // chunk) for b in w.blocks)
    assert count <= 6
    assert chunk == 1 or sum(-(-int(b) // (chunk - 1)) for b in w.blocks) > 6
    segs = flashinfer(w).cores
    assert all(len(c) <= 1 for c in segs)


@pytest.mark.parametrize("engine", ["kernel", "oracle"])
def test_ours_through_the_abi_matches_the_cost_model(engine):
    pytest.importorskip("pyruntime.tiling")
    w = _workload([700, 3000, 90, 5000], q=[1, 1, 1, 4], num_q_heads=16, num_kv_heads=2)
    part = ours.ours(w, engine)  # asserts kernel costs == cost model
    part.validate()
    bal = part.balance()
    assert bal.segments <= w.num_units + w.model.num_cores - 1
    bound = w.total_cost / 24 + 32 + max(32, int(w.block_w.max())) + 32
    assert bal.max_core_cost <= bound


def test_core_segments_decodes_ranges():
    w = _workload([300, 300], num_q_heads=1, num_kv_heads=1)
    rec = CoreRange((0, 0, 0, 1), (1, 0, 0, 2), -1, -1, 2, 0)
    assert ours.core_segments(w, rec) == [Segment(0, 1, 3), Segment(1, 0, 2)]
    rec = CoreRange((1, 0, 0, 0), (2, 0, 0, 0), -1, -1, 1, 0)
    assert ours.core_segments(w, rec) == [Segment(1, 0, 3)]


def test_ours_at_or_below_every_anchor_on_trace_batches():
    """The issue's claim, on a reduced sample (the CLI runs the full study)."""
    pytest.importorskip("pyruntime.tiling")
    from pyruntime.cli.sources import ContinuousBatch

    batches = {
        b: [(s.cu_seqlens_q, s.seqlens_kv) for s in
            (next(ContinuousBatch("trace", b, seed=i)) for i in range(2))]
        for b in (16, 64, 256, 1024)
    }  # fmt: skip
    result = balance_study(batches, CostModel(num_q_heads=16, num_kv_heads=1, num_cores=24))
    assert result["verdict"]["violations"] == []
