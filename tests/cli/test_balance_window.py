"""``bench balance --window W``: windowed workloads, the FlashInfer ``window_left`` model, the CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyruntime.partitioners import CostModel, Workload, WorkloadError, ours
from pyruntime.partitioners.fia_v2_sink import (
    default_mask,
    fia_v2_sink_metadata,
    sink_rows,
    sink_split_sizes,
)
from pyruntime.partitioners.windowed import (
    WindowedWorkload,
    _window_items,
    flashinfer_decode_masked,
    flashinfer_window,
)

needs_tiling = pytest.mark.skipif(
    __import__("importlib").util.find_spec("pyruntime._native") is None,
    reason="the tiling kernel's extension is not built",
)


def test_windowed_workload_counts_only_the_window_blocks():
    # block 16, q_tile 4, w = 1 * (4 + 1) = 5, segment 32, W = 20 (the tiling's hand case):
    # r0 decode kv 100 -> columns [5, 7); r1 q 10 kv 40 -> tiles [0, 3), [0, 3), [1, 3).
    model = CostModel(num_q_heads=1, num_kv_heads=1, block_size=16, q_tile=4, num_cores=1)
    w = WindowedWorkload(model, [0, 1, 11], [100, 40], 20)
    assert w.first_blocks.tolist() == [5, 0, 0, 1]
    assert w.blocks.tolist() == [2, 3, 3, 2]
    assert w.kv_begin.tolist() == [80, 11, 15, 19]
    assert w.total_cost == 178 and Workload(model, [0, 1, 11], [100, 40]).total_cost == 208
    # a token span maps onto absolute columns, counted from each unit's first
    assert w.window_segments(0, 0, (0, 1), (80, 100))[0][1:] == (0, 2)
    assert w.window_segments(1, 0, (8, 10), (16, 40))[0][1:] == (0, 2)
    assert w.window_segments(1, 0, (8, 10), (40, 40)) == []


@pytest.mark.parametrize("window, causal, fragment", [(0, True, ">= 1"), (True, True, ">= 1"),
                                                      (8, False, "causal")])
def test_windowed_workload_refuses_bad_windows(window, causal, fragment):
    model = CostModel(num_q_heads=1, num_kv_heads=1, block_size=16, causal=causal)
    with pytest.raises(WorkloadError, match=fragment):
        WindowedWorkload(model, [0, 1], [10], window)


def _one_decode() -> WindowedWorkload:
    # kv 1000, block 16, W 100 (window_left 99), 4 cores, one head, group 1 (q_tile 128)
    model = CostModel(num_q_heads=1, num_kv_heads=1, block_size=16, num_cores=4)
    return WindowedWorkload(model, [0, 1], [1000], 100)


def test_flashinfer_window_items_hand_worked():
    # pages 63; tile max(16, 128) = 128 rows; effective min(ceil((99 + 128) / 16), 63) = 15
    # pages; chunk search over [8, 15] with at most 4 items: 8 pages (ceil(15 / 8) = 2 items);
    # kv_start_idx = 1000 + 0 - 1 - 99 = 900: chunks [900, 1000) and [1000, 1000) (empty).
    w = _one_decode()
    assert _window_items(w, 1) == [(0, 0, (0, 1), (900, 1000)), (0, 0, (0, 1), (1000, 1000))]
    part = flashinfer_window(w, 1)
    part.validate()
    # the unit is columns [56, 63): 7 blocks, cost 32 + 35 = 67, all on one core
    assert part.core_costs() == [67, 0, 0, 0]
    assert part.balance().ratio == pytest.approx(67 / (67 / 4 + 32))


def test_flashinfer_decode_ignores_the_window_but_pays_for_it():
    # Without the window: 63 pages, chunk 16 pages (ceil(63 / 15) = 5 > 4 items), so four
    # chunks of 16, 16, 16, 15 blocks: 112, 112, 112, 107; scored over the windowed ideal.
    masked = flashinfer_decode_masked(_one_decode(), 1)
    assert sorted(masked.core_costs) == [107, 112, 112, 112]
    assert masked.ratio == pytest.approx(112 / (67 / 4 + 32))
    with pytest.raises(ValueError, match="one query token"):
        flashinfer_decode_masked(WindowedWorkload(CostModel(num_q_heads=1, num_kv_heads=1),
                                                  [0, 2], [300], 64), 1)


@settings(max_examples=30, deadline=None)
@given(kv=st.lists(st.integers(1, 5000), min_size=1, max_size=16),
       chunks=st.lists(st.integers(1, 300), min_size=1, max_size=16),
       window=st.integers(1, 3000), cores=st.integers(1, 24),
       heads=st.sampled_from([(16, 1), (32, 8), (64, 8)]))  # fmt: skip
def test_fia_v2_sink_metadata_covers_the_window_exactly_once(kv, chunks, window, cores, heads):
    """Its band rows (CalcS2Range) start at each row tile's window start on the 512-token
    grid: every windowed block of every unit is on exactly one core, and every row starts at
    or before its units' window starts."""
    n = min(len(kv), len(chunks))
    q = [min(c, k) for k, c in zip(kv[:n], chunks[:n])]
    cu = [0]
    for x in q:
        cu.append(cu[-1] + x)
    model = CostModel(num_q_heads=heads[0], num_kv_heads=heads[1], num_cores=cores)
    w = WindowedWorkload(model, cu, kv[:n], window)
    fia_v2_sink_metadata(w).validate()
    m_base, s2_base = sink_split_sizes(max(kv[:n]), model.block_size, default_mask(w))
    rows_tokens = m_base // model.group
    for r, (qr, kr) in enumerate(zip(q, kv[:n])):
        for t, row in enumerate(sink_rows(qr, kr, model.group, m_base, s2_base,
                                          default_mask(w))):  # fmt: skip
            first_token_kv = kr - qr + t * rows_tokens  # the row's first token's position
            assert row.s2_start == max(0, first_token_kv - window + 1) // s2_base, (r, t)


@needs_tiling
def test_ours_plans_the_window_and_splits_the_unit():
    w = _one_decode()
    part = ours(w)  # asserts the kernel's core costs equal the cost model's
    part.validate()
    assert part.balance().ratio < flashinfer_window(w, 1).balance().ratio
    assert sum(part.core_costs()) > 67  # a split unit pays the segment more than once


@needs_tiling
def test_cli_json_and_verdict(cli, tmp_path):
    out_file = tmp_path / "window.json"
    code, out, _ = cli("bench", "balance", "--window", "128", "--quick", "--batch-sizes", "16",
                       "--geometries", "32/8", "--sources", "trace,chunked-prefill", "--json",
                       "-o", str(out_file))
    data = json.loads(out)
    assert code == 0 and data == json.loads(out_file.read_text())
    assert data["window"] == 128 and len(data["cases"]) == 2
    trace, prefill = data["cases"]
    assert {"ours", "flashinfer_1x_window", "flashinfer_1x_decode_masked",
            "fia_v2_sink_metadata"} <= set(trace["ratios"])
    assert "flashinfer_1x_decode_masked" not in prefill["ratios"]
    assert "fia_v2_sink_metadata" in prefill["ratios"]
    assert 0 < trace["work_share"] < 1
    assert data["verdict"]["ours_at_or_below_all"] == (not data["verdict"]["losses"])


def test_cli_window_below_one_is_a_one_line_error(cli):
    code, _, err = cli("bench", "balance", "--window", "0", "--quick")
    assert code == 2 and "--window must be >= 1" in err
    assert "FlashInfer window_left + 1" in err and "omit --window for none" in err
    code, _, err = cli("bench", "balance", "--window", "-3", "--quick")
    assert code == 2 and "--window must be >= 1 (tokens), got -3" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
