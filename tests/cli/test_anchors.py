"""The anchor models on small hand-worked cases of the algorithms they follow.

Each expected value below was worked out by hand from the source the model cites (see the
module docstrings of ``pyruntime.partitioners.{fia_v3, fia_v2_sink, ifa, flashmla, flashinfer}``;
the FIA v2 sink metadata cases cite the lines of its AI-CPU kernel).
"""

from __future__ import annotations

from importlib import import_module

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyruntime.partitioners import CostModel, NotApplicableError, Segment
from pyruntime.partitioners.windowed import WindowedWorkload

from .workloads import workload

# the package exports functions named like these modules
v3 = import_module("pyruntime.partitioners.fia_v3")
sink = import_module("pyruntime.partitioners.fia_v2_sink")
fi = import_module("pyruntime.partitioners.flashinfer")
mla = import_module("pyruntime.partitioners.flashmla")
ifa = import_module("pyruntime.partitioners.ifa")


# ---------------------------------------------------------------- FIA V3 (split_core.cpp)


def test_fia_v3_calc_cost():
    assert v3.block_cost(16, 512) == 6 * 1 + 10 * 8
    assert v3.block_cost(512, 512) == 6 * 32 + 10 * 8
    assert v3.block_cost(17, 65) == 6 * 2 + 10 * 2
    assert v3.block_cost(1, 1) == 16


@pytest.mark.parametrize("args, expected", [
    (("TND", 1, 16, 5000, 128), (512, 512)),          # TND: 512 x 512 whatever the lengths
    (("BSND", 1, 16, 5000, 128, False), (128, 2048)),  # G/5 = 3 -> 2048; aligned 2048 -> M 128
    (("BSND", 1, 4, 5000, 128, False), (32, 5000)),    # 8192 capped at s2 = 5000 -> M 32
    (("BSND", 1, 16, 5000, 128, True), (256, 1024)),   # a compressed mask caps at 1024
    (("BSND", 100, 16, 5000, 128), (512, 512)),        # S1 > 16: prefill sizes
    (("TND", 1, 16, 5000, 112), (512, 448)),           # 512 is not a multiple of 112
])  # fmt: skip
def test_fia_v3_block_sizes(args, expected):
    assert v3.split_sizes(*args) == expected


def test_fia_v3_row_costs_with_causal_mask():
    # decode, 1 token x 16 heads, kv 600: one row of 16 rows; blocks 512 + a tail of 88
    (row,) = v3._batch_rows(1, 600, 16, 512, 512)
    assert (row.s2_end, row.normal, row.last) == (2, 86, 6 + 10 * 2)
    assert row.cost(0) == 86 + 26
    # 64 new tokens after 1000 of context, G = 16: 1024 rows = 2 row tiles of 32 tokens;
    # row 0's last token sees kv 31 + 1000 -> blocks [0, 3); the kv tail is 1064 % 512 = 40
    rows = v3._batch_rows(64, 1064, 16, 512, 512)
    assert [(r.s2_end, r.normal, r.last) for r in rows] == [(3, 272, 202), (3, 272, 202)]
    assert rows[0].cost(0) == 2 * 272 + 202


def test_fia_v3_assigns_whole_batches_then_blocks():
    # 1 kv head, G = 16, kv 2048/512/512: batch costs 4 x 86, 86, 86 (total 516, 6 blocks);
    # core counts 3..3. Core 0 (limit 172, tolerance 43) cannot take batch 0 whole and takes
    # 2 of its blocks; core 1 (limit 172) takes the rest of it; core 2 takes batches 1 and 2.
    w = workload([2048, 512, 512], num_q_heads=16, num_kv_heads=1, num_cores=3)
    pieces, m_base, s2_base = v3.split_core(w)
    assert (m_base, s2_base) == (512, 512)
    assert pieces == [[(0, 0, 0, 2)], [(0, 0, 2, 4)], [(1, 0, 0, 1), (2, 0, 0, 1)]]
    part = v3.fia_v3(w)
    part.validate()
    # FIA's 512-token blocks are 4 of our 128-token blocks
    assert part.cores == [[Segment(0, 0, 8)], [Segment(0, 8, 16)], [Segment(1, 0, 4), Segment(2, 0, 4)]]


def test_fia_v3_tries_several_core_counts():
    # 4 equal batches of 2 blocks: 8 blocks, core counts from round(sqrt(8.25)) = 3 down to
    # min(2, 8) = 2 -> only 2 cores; each takes two whole batches (344 <= 344 + 43).
    w = workload([1024] * 4, num_q_heads=16, num_kv_heads=1, num_cores=2)
    assert v3.split_core(w)[0] == [[(0, 0, 0, 2), (1, 0, 0, 2)], [(2, 0, 0, 2), (3, 0, 0, 2)]]
    # with 24 cores the 8 blocks go to 8 cores at most (max_core = blocks) and FIA keeps the
    # core count whose busiest core is cheapest: one block each
    w = workload([1024] * 4, num_q_heads=16, num_kv_heads=1, num_cores=24)
    pieces = v3.split_core(w)[0]
    assert len(pieces) == 8 and all(len(p) == 1 and p[0][3] - p[0][2] == 1 for p in pieces)


def test_fia_v3_rows_map_to_query_tiles():
    # a 256-token chunk at G = 4: 1024 rows = 2 FIA rows of 128 tokens = 4 of our 32-token tiles
    w = workload([256 + 700], q=[256], num_q_heads=32, num_kv_heads=8)
    part = v3.fia_v3(w)
    part.validate()
    assert w.model.q_tile == 32


# ---------------------------------------------------------------- FIA v2 sink metadata (AI-CPU)
# vllm-ascend csrc/attention/fused_infer_attention_score_v2_sink_metadata/op_kernel_aicpu/
# fused_infer_attention_score_v2_sink_metadata_aicpu.cpp at 79e5f65; "kernel N" is its line N.

CAUSAL, BAND = sink.SinkMask(3), sink.SinkMask(4, 127, 0)  # W = 128: pre_tokens = W - 1


def test_sink_mask_tokens_from_the_corner():
    # GetPreNextToken (kernel 718-757), CalcPreTokenLeftUp/CalcNextTokenLeftUp (1227-1255)
    assert CAUSAL.masked and CAUSAL.tokens() == (sink.TOKENS_MAX, 0)
    assert CAUSAL.left_up(4, 100) == (sink.TOKENS_MAX, 96)  # right-down: s2 - s1
    assert BAND.left_up(1, 1100) == (1 - 1100 + 127, 1100 - 1 + 0)
    assert not sink.SinkMask(0).masked  # mode 0 with both limits at INT_MAX: no mask (723)
    for bad in ({"sparse_mode": 2}, {"sparse_mode": 4, "pre_tokens": -1},
                {"sparse_mode": 0, "pre_tokens": 5}):
        with pytest.raises(ValueError):
            sink.SinkMask(**bad)


@pytest.mark.parametrize("args, expected", [
    ((5000, 128, CAUSAL), (512, 512)),   # TND 512 (294), mBaseSize 512 (365)
    ((300, 128, CAUSAL), (512, 300)),    # capped at the longest kv (354-356)
    ((5000, 112, BAND), (512, 448)),     # rounded down to the paged block (344-349)
    ((0, 128, CAUSAL), (512, 512)),      # every kv empty: s2Size 1024 (53), 512 stays
    ((700, 0, sink.SinkMask(0)), (512, 512)),
])  # fmt: skip
def test_sink_block_sizes(args, expected):
    assert sink.sink_split_sizes(*args) == expected


def test_sink_mla_same_length_test_counts_padded_entries():
    # CalcMBaseSizeMla (186-227): B*N2 = 5 on 24 cores -> lcm 120 -> S1*G split in 24:
    # 36 tokens x 128 heads = 4608 rows -> 192 per tile, in [128, 256]; but only when every
    # kv length is the same, and GetActualSeqInfo (759-796) compares every entry, so a padded
    # slot (kv 0) keeps 256. FIA MLA's model compares the live requests only.
    kw = {"bn2": 5, "s1g": 36 * 128}
    assert sink.sink_split_sizes_mla(5000, 128, **kw, same_lengths=True) == (192, 512)
    assert sink.sink_split_sizes_mla(5000, 128, **kw, same_lengths=False) == (256, 512)
    # on a step with that padded slot and 2-token units (256 rows): the sink kernel keeps
    # 256-row tiles, whole units; FIA MLA's model shrinks to 192 rows, 1.5 units
    w = workload([1000] * 4 + [0], q=[36] * 4 + [0], num_q_heads=128, num_kv_heads=1, q_tile=2)
    sink.fia_v2_sink_metadata_mla(w).validate()
    with pytest.raises(NotApplicableError, match="192 rows"):
        v3.fia_mla(w)
    with pytest.raises(NotApplicableError, match="G = 20"):
        sink.fia_v2_sink_metadata_mla(workload([100], num_q_heads=20, num_kv_heads=1))
    with pytest.raises(NotApplicableError, match="2 kv"):
        sink.fia_v2_sink_metadata_mla(workload([100], num_q_heads=32, num_kv_heads=2))


def test_sink_rows_under_the_band():
    # CalcS2Range (1283-1344), decode, G = 16, kv 1100, W = 128: the row sees kv [972, 1099]
    # -> blocks [972 // 512, 1099 // 512 + 1) = [1, 3): a 128-token window costs two 512-token
    # blocks when it straddles 1024. Block 2 is the kv tail (1100 % 512 = 76, CalcCostTable
    # 1266-1281): CalcCost(16, 76) = 6 + 10 * 2 = 26; block 1 CalcCost(16, 512) = 86.
    (row,) = sink.sink_rows(1, 1100, 16, 512, 512, BAND)
    assert (row.s2_start, row.s2_end, row.normal, row.last) == (1, 3, 86, 26)
    assert row.cost(row.s2_start) == 112
    # causal, same entry: all blocks from 0
    (row,) = sink.sink_rows(1, 1100, 16, 512, 512, CAUSAL)
    assert (row.s2_start, row.s2_end) == (0, 3)
    # a 64-token chunk after 1000 tokens, G = 16, W = 256: two 32-token row tiles; row 0's
    # first token is kv 1000 -> window from 745 (block 1), its last sees 1031 (block 2)
    rows = sink.sink_rows(64, 1064, 16, 512, 512, sink.SinkMask(4, 255, 0))
    assert [(r.s2_start, r.s2_end) for r in rows] == [(1, 3), (1, 3)]
    # no mask: every row reads the whole kv; padding: no rows at all (1293-1295, 1568)
    assert [(r.s2_start, r.s2_end) for r in sink.sink_rows(2, 1100, 16, 512, 512,
                                                           sink.SinkMask(0))] == [(0, 3)]
    assert sink.sink_rows(0, 0, 16, 512, 512, CAUSAL) == []


def test_sink_padded_slots_ride_free():
    # kv 2048/0/512/512 with an empty slot (q 0, kv 0), G = 16, 3 cores: entry costs 344, 0,
    # 86, 86 (6 blocks, core counts 3..3). Core 0 (limit 172, tolerance 43) takes 2 blocks
    # of entry 0; core 1 (limit 172) the rest of it, then the empty slot at no cost
    # (AssignByBatch's bN2Cost == 0, kernel 1668); core 2 takes entries 2 and 3.
    w = workload([2048, 0, 512, 512], q=[1, 0, 1, 1], num_q_heads=16, num_kv_heads=1,
                 num_cores=3)  # fmt: skip
    pieces = sink.sink_split_core(w, (512, 512), CAUSAL)
    assert pieces == [[(0, 0, 0, 2)], [(0, 0, 2, 4)], [(2, 0, 0, 1), (3, 0, 0, 1)]]
    part = sink.fia_v2_sink_metadata(w)
    part.validate()
    assert part.cores == [[Segment(0, 0, 8)], [Segment(0, 8, 16)], [Segment(1, 0, 4),
                                                                     Segment(2, 0, 4)]]


def test_sink_windowed_plan_prices_whole_512_blocks():
    # W = 128, G = 16, 2 cores, kv 1100, 1100, 1000. Its rows: [1, 3) at 86 + 26, [1, 3) at
    # 86 + 26 and [1, 2) at CalcCost(16, 1000 % 512 = 488) = 86: 310 in all, 5 blocks, core
    # counts round(sqrt(5.25)) = 2..2. Core 0 (limit 155): entry 0 (112 <= 155 + 13), not
    # entry 1 (224 > 168), then AssignByBlock (kernel 1758-1792) one 86 block of entry 1:
    # 112 + 86 = 198 = 155 + 86 / 2, within tolerance (">=", header 79-82). Core 1: the tail
    # block of entry 1 and entry 2. On our units (two 128-token windowed blocks each, 32 + 2 *
    # 40 = 112; entry 1 is cut at kv 1024, its column 8): 112 + 72 and 72 + 112, over the
    # ideal 336 / 2 + 32 = 200.
    model = CostModel(num_q_heads=16, num_kv_heads=1, num_cores=2)
    w = WindowedWorkload(model, [0, 1, 2, 3], [1100, 1100, 1000], 128)
    mask = sink.default_mask(w)
    assert mask == BAND
    assert sink.sink_split_core(w, (512, 512), mask) == [[(0, 0, 1, 3), (1, 0, 1, 2)],
                                                         [(1, 0, 2, 3), (2, 0, 1, 2)]]
    part = sink.fia_v2_sink_metadata(w)
    part.validate()
    assert part.cores == [[Segment(0, 0, 2), Segment(1, 0, 1)], [Segment(1, 1, 2),
                                                                   Segment(2, 0, 2)]]
    assert part.core_costs() == [184, 184]
    assert part.balance().ratio == pytest.approx(184 / 200)


# ---------------------------------------------------------------- IFA


def test_ifa_split_bn_v0():
    assert ifa.split_bn_v0(50, 24)[:4] == [0, 3, 6, 8]
    assert ifa.split_bn_v0(5, 8) == [0, 1, 2, 3, 4, 5, 5, 5]


@pytest.mark.parametrize("weights, cores, expected", [
    # ceil split [0, 3] loads 7/3; the greedy fill reaches the average 5 with one pair
    ([5, 1, 1, 1, 1, 1], 2, [0, 1]),
    # the greedy fill takes five 1s (load 5 = average); ceil split gives 3/7
    ([1, 1, 1, 1, 1, 5], 2, [0, 5]),
    # greedy: 4 then 8 overshoots by 3 > 1 undershoot: drop back to [0, 1], loads 4/6 < 8/2
    ([4, 4, 1, 1], 2, [0, 1]),
])  # fmt: skip
def test_ifa_set_sparse_start_idx(weights, cores, expected):
    assert ifa.set_sparse_start_idx(weights, cores) == expected


def test_ifa_balance_load_moves_boundaries():
    # loads 2/9: the forward pass moves pair 3 (weight 2) to core 0 (2 + 2 < 9): loads 4/7;
    # the backward pass would move it back only if 7 + 2 < 7
    starts, weights = [0, 3], [1, 1, 0, 2, 7]
    loads = ifa._loads(starts, weights)
    assert loads == [2, 9]
    assert ifa.balance_load(starts, weights, loads)
    assert starts == [0, 4] and loads == [4, 7]


@pytest.mark.parametrize("kv, cores, cube, heads, expected", [
    ([4096] * 4, 24, True, (16, 1), 6),    # bn 4 <= 12; 24 / 4 = 6; 4096 / 6 = 682 >= 512
    ([3000] * 4, 24, True, (16, 1), 5),    # 3000 / 6 = 500 < 512 -> 5
    ([1024] * 4, 24, True, (16, 1), 1),    # paged KV on 910B, max kv <= 1024: no FD
    ([1500] * 4, 24, True, (16, 1), 1),    # GQA needs max kv >= 2048
    ([1500] * 4, 24, True, (1, 1), 2),     # MHA: 24 / 4 = 6 -> 1500 / 2 = 750 >= 512
    ([4096] * 12, 24, True, (16, 1), 2),   # bn 12 <= 0.5 * 24
    ([4096] * 13, 24, True, (16, 1), 1),   # bn 13 > 12
    ([4096] * 19, 48, False, (16, 1), 2),  # NORMAL: bn 19 < 0.4 * 48 = 19.2
    ([4096] * 20, 48, False, (16, 1), 1),
])  # fmt: skip
def test_ifa_flash_decoding_rule(kv, cores, cube, heads, expected):
    w = workload(kv, num_q_heads=heads[0], num_kv_heads=heads[1])
    assert ifa.flash_decoding_parts(w, cores, cube_mode=cube) == expected


def test_ifa_no_flash_decoding_for_gqa_multi_token():
    w = workload([4096] * 2, q=[4, 4], num_q_heads=16, num_kv_heads=1)
    assert ifa.flash_decoding_parts(w, 24, cube_mode=True) == 1


def test_ifa_flash_decoding_partition():
    # MHA, 24 cube cores, kv 4096/1000: 12 parts lowered to 8 (4096 / 8 = 512); chunks of
    # 512 tokens = 4 blocks: request 0 on cores 0..7, request 1's 1000 tokens on cores 8, 9
    w = workload([4096, 1000], num_q_heads=1, num_kv_heads=1)
    part = ifa.ifa_weighted(w, vector_cores=False)
    part.validate()
    assert [len(c) for c in part.cores] == [1] * 10 + [0] * 14
    assert part.cores[9] == [Segment(1, 4, 8)]


def test_ifa_vector_cores_pair_onto_cube_cores():
    # 50 pairs over 48 vector cores (first 2 take 2); core c runs vector cores 2c and 2c + 1
    w = workload([100] * 50, num_q_heads=1, num_kv_heads=1)
    part = ifa.ifa_even(w, vector_cores=True)
    part.validate()
    assert [len(c) for c in part.cores] == [4, 2] + [2] * 22


def test_ifa_rejects_mixed_query_lengths():
    w = workload([500, 600], q=[1, 3], num_q_heads=8, num_kv_heads=1)
    with pytest.raises(NotApplicableError):
        ifa.ifa_weighted(w)


# ---------------------------------------------------------------- FlashMLA


def test_flashmla_num_sm_parts():
    assert mla.num_sm_parts(24, 1, 16) == 24
    assert mla.num_sm_parts(24, 8, 4) == 3
    assert mla.num_sm_parts(132, 1, 128) == 66  # an H800 with 128 query rows: 2 m blocks


@pytest.mark.parametrize("blocks, parts, w, f, expected", [
    # T = 15 + 7 = 22, payload = 11 + 5 = 16: request 0 whole (15), request 1 on part 1
    ([10, 2], 2, 1, 5, [[(0, 0, 10)], [(1, 0, 2)]]),
    # T = 35, payload = 18 + 5 = 23: part 0 takes 23 - 5 = 18 blocks, part 1 the other 12
    ([30], 2, 1, 5, [[(0, 0, 18)], [(0, 18, 30)]]),
    # in cost units (w = 2, F = 3): T = 26, payload 16; 13 fits, the other 13 does not
    ([5, 5], 2, 2, 3, [[(0, 0, 5)], [(1, 0, 5)]]),
    # payload = max(ceil(T / P) + F, 2 F)
    ([1, 1], 4, 1, 5, [[(0, 0, 1)], [(1, 0, 1)], [], []]),
    # F = 1/3 block (w = 3): T = 12, payload 2 x 3 + 1 = 7 leaves request 2 over (4 > 3 left
    # on both parts); one more block of payload (10) places all three
    ([1, 1, 1], 2, 3, 1, [[(0, 0, 1), (1, 0, 1)], [(2, 0, 1)]]),
])  # fmt: skip
def test_flashmla_metadata_walk(blocks, parts, w, f, expected):
    assert mla.mla_parts(blocks, parts, w, f) == expected


def test_flashmla_per_head_grid():
    # 32/8 heads: 3 parts per head; core = head + 8 * part; every head splits alike
    w = workload([128 * 30, 128 * 2, 128 * 4], num_q_heads=32, num_kv_heads=8)
    part = mla.flashmla(w)
    part.validate()
    for head in range(8):
        per_head = [[s.block_begin for s in part.cores[head + 8 * p]] for p in range(3)]
        assert per_head == [[s.block_begin for s in part.cores[8 * p]] for p in range(3)]
    assert all(not c for c in part.cores[24:])


def test_flashmla_overhead_translation():
    # F = 5 blocks of 64 tokens = 2.5 of our 128-token blocks (w = 40): F = 100 cost units.
    # 40 blocks: T = 1600 + 100 = 1700; ceil(T / P) in whole blocks = 22 x 40 = 880;
    # payload 980: part 0 takes (980 - 100) / 40 = 22 blocks, part 1 the other 18
    w = workload([128 * 40], num_q_heads=16, num_kv_heads=1, num_cores=2)
    assert w.model.block_cost(16) == 40
    part = mla.flashmla(w)
    assert part.cores == [[Segment(0, 0, 22)], [Segment(0, 22, 40)]]
    # F given in our units (cost_segment 32): payload 21 x 40 + 32 = 872 -> 21 blocks
    part = mla.flashmla(w, overhead_cost=32)
    assert part.cores == [[Segment(0, 0, 21)], [Segment(0, 21, 40)]]


def test_flashmla_rejects_mixed_queries_and_uneven_m_blocks():
    with pytest.raises(NotApplicableError):
        mla.flashmla(workload([500, 600], q=[1, 3], num_q_heads=8, num_kv_heads=1))
    # 2 tokens x 48 heads = 96 rows: m block 0 would hold token 0 and a third of token 1
    with pytest.raises(NotApplicableError, match="unevenly"):
        mla.flashmla(workload([500, 600], q=[2, 2], num_q_heads=48, num_kv_heads=1))
    # 8 tokens x 16 heads = 128 rows was refused before MLA geometry: now 2 m blocks
    part = mla.flashmla(workload([500, 600], q=[8, 8], num_q_heads=16, num_kv_heads=1))
    part.validate()
    assert part.workload.model.q_tile == 4 and part.baseline is not None


# ---------------------------------------------------------------- FlashMLA at MLA geometry
# (csrc/sm90/decode/dense: grid (ceil(s_q * G / 64), h_k, num_sm_parts), every m block runs
# the same metadata part; its causal end is its last row's)


@pytest.mark.parametrize("s_q, group, m_blocks, parts", [
    (1, 128, 2, 12), (4, 128, 8, 3), (3, 128, 6, 4), (2, 64, 2, 12), (1, 64, 1, 24),
    (3, 32, 2, 12), (4, 16, 1, 24),
])  # fmt: skip
def test_flashmla_m_blocks_and_parts(s_q, group, m_blocks, parts):
    # num_sm_parts = 24 / h_k / ceil(s_q * h_q / h_k / 64) (dense_decode.h)
    assert mla.m_blocks(s_q, group) == m_blocks
    assert mla.num_sm_parts(24, 1, s_q * group) == parts


def test_flashmla_m_block_geometry():
    from pyruntime.partitioners import CostModel

    m128 = mla.m_block_model(CostModel(num_q_heads=128, num_kv_heads=1))
    assert (m128.num_kv_heads, m128.q_tile, m128.group) == (2, 1, 64)
    m32 = mla.m_block_model(CostModel(num_q_heads=64, num_kv_heads=2))
    assert (m32.num_kv_heads, m32.q_tile, m32.group) == (2, 2, 32)
    with pytest.raises(NotApplicableError):
        mla.m_block_model(CostModel(num_q_heads=96, num_kv_heads=1))


def test_flashmla_two_m_blocks_hand_worked():
    # 128 heads, 1 token, 4 cores: 2 m blocks, num_sm_parts = 4 / 2 = 2. An m block of 64
    # rows costs w(64) = 8 * (4 + 4) = 64 per 128-token block; F = 5 * 64 * 64 / 128 = 160.
    # Walk on blocks [10, 2]: T = 800 + 288 = 1088, payload = ceil(1088 / 128) * 64 + 160 =
    # 736: part 0 takes (736 - 160) / 64 = 9 blocks of request 0; part 1 the last one (224)
    # and request 1 (288). Core m + 2 * part; virtual heads 0, 1 are m blocks 0, 1.
    w = workload([128 * 10, 128 * 2], num_q_heads=128, num_kv_heads=1, num_cores=4)
    part = mla.flashmla(w)
    part.validate()
    assert part.cores == [
        [Segment(0, 0, 9)], [Segment(1, 0, 9)],
        [Segment(0, 9, 10), Segment(2, 0, 2)], [Segment(1, 9, 10), Segment(3, 0, 2)],
    ]  # fmt: skip
    # scored against ours: 128-row units, w(128) = 8 * (4 + 8) = 96, W = 992 + 224 = 1216
    assert w.total_cost == 1216 and part.workload.total_cost == 2 * 672 + 2 * 160
    bal = part.balance()
    assert bal.max_core_cost == 32 + 9 * 64
    assert bal.ratio == pytest.approx((32 + 9 * 64) / (1216 / 4 + 32))


def test_flashmla_m_block_causal_trim_drops_empty_pieces():
    # 3 tokens x 32 heads = 96 rows: m block 0 = tokens 0-1 (64 rows), m block 1 = token 2.
    # kv 129: the walk sees 2 blocks; m block 0's last row is token 1, kv end 128 -> 1 block.
    # F = 0, 4 cores: 2 parts, payload 64 = one block each. Part 1's block 1 is past m block
    # 0's causal end (the kernel's end_block_idx trim): core 2 gets nothing.
    w = workload([129], q=[3], num_q_heads=32, num_kv_heads=1, num_cores=4)
    part = mla.flashmla(w, overhead_cost=0)
    part.validate()
    assert part.cores == [[Segment(0, 0, 1)], [Segment(1, 0, 1)], [], [Segment(1, 1, 2)]]


@settings(max_examples=30, deadline=None)
@given(kv=st.lists(st.integers(4, 5000), min_size=1, max_size=12),  # kv >= the 4 query tokens
       group=st.sampled_from([16, 32, 64, 128]), kv_heads=st.sampled_from([1, 2]),
       s_q=st.integers(1, 4), cores=st.integers(8, 24), f=st.sampled_from([0, 5]))  # fmt: skip
def test_flashmla_m_blocks_cover_every_row_and_block_once(kv, group, kv_heads, s_q, cores, f):
    w = workload(kv, q=[s_q] * len(kv), num_q_heads=group * kv_heads, num_kv_heads=kv_heads,
                 num_cores=cores)  # fmt: skip
    n_m = mla.m_blocks(s_q, group)
    if n_m * kv_heads > cores:
        with pytest.raises(NotApplicableError):
            mla.flashmla(w, fixed_overhead=f)
        return
    part = mla.flashmla(w, fixed_overhead=f)
    part.validate()  # every (m block, kv block) exactly once
    mw = part.workload
    assert mw.total_cost >= w.total_cost  # an m block re-reads the kv its siblings read
    parts = mla.num_sm_parts(cores, kv_heads, s_q * group)
    used = [c for c, segs in enumerate(part.cores) if segs]
    assert not used or max(used) < n_m * kv_heads * parts
    # every m block of every kv head runs the same part: the same (request, first block)
    # pieces, less those its causal trim emptied
    for p in range(parts):
        ctas = range(n_m * kv_heads * p, n_m * kv_heads * (p + 1))
        pieces = [[(int(mw.request[s.unit]), s.block_begin) for s in part.cores[c]] for c in ctas]
        longest = max(pieces, key=len)
        for mine in pieces:
            it = iter(longest)
            assert all(piece in it for piece in mine)  # a subsequence of the longest


# ---------------------------------------------------------------- FIA MLA (FiaTilingNonQuantMla)


@pytest.mark.parametrize("args, kwargs, expected", [
    ((5000, 128), {}, (256, 512)),    # mBaseSize_ 256, sInnerSize_ 512
    ((300, 128), {}, (256, 300)),     # capped at the kv length
    ((5000, 112), {}, (256, 448)),    # 512 rounded down to a multiple of the paged block
    # CalcMBaseSize: B*N2 = 16 on 24 cores, lcm 48 -> 3 splits of S1*G = 384 -> 128 rows
    ((5000, 128), {"bn2": 16, "s1g": 384, "same_lengths": True}, (128, 512)),
    ((5000, 128), {"bn2": 16, "s1g": 512, "same_lengths": True}, (256, 512)),   # 512 % 3
    ((5000, 128), {"bn2": 16, "s1g": 384}, (256, 512)),                          # kv differ
    ((5000, 128), {"bn2": 48, "s1g": 384, "same_lengths": True}, (256, 512)),   # 48 % 24 == 0
    ((5000, 128), {"bn2": 20, "s1g": 2304, "same_lengths": True}, (256, 512)),  # 384 > 256
])  # fmt: skip
def test_fia_mla_block_sizes(args, kwargs, expected):
    assert v3.split_sizes_mla(*args, **kwargs) == expected


def test_fia_mla_splits_mtp_rows_in_256_row_tiles():
    # 4 tokens x 128 heads = 512 rows: 2 row tiles of 256 (FIA V3's GQA TND tile is 512).
    # kv 1024: each tile's last token sees >= 1021 tokens -> 2 blocks of 512, CalcCost(256,
    # 512) = 6 * 16 + 10 * 8 = 176 each; 4 blocks, core counts 2..2. Core 0 (limit 352) takes
    # row 0 whole (352 <= 352 + 88), core 1 the rest. Our units: one token each (q_tile 1).
    w = workload([1024], q=[4], num_q_heads=128, num_kv_heads=1, num_cores=2)
    part = v3.fia_mla(w)
    part.validate()
    assert part.cores == [[Segment(0, 0, 8), Segment(1, 0, 8)],
                          [Segment(2, 0, 8), Segment(3, 0, 8)]]  # fmt: skip


# ---------------------------------------------------------------- FlashInfer


def test_flashinfer_page_search():
    # pages 10 and 3 on a grid of 6: chunk 3 gives 4 + 1 = 5 items, chunk 2 gives 7 > 6
    assert fi.min_pages_per_chunk([10, 3], heads=1, max_grid=6) == 3
    assert fi.min_pages_per_chunk([10, 3], heads=2, max_grid=6) == 5  # (2 + 1) * 2 = 6
    assert fi.kv_chunk_pages([16], [10], tile=16, max_batch=4) == 3


def test_flashinfer_cta_tile_q():
    assert [fi.cta_tile_q(n) for n in (100, 65, 64, 17, 16, 1)] == [128, 128, 64, 64, 16, 16]


def test_flashinfer_decode_budget_and_no_split():
    # 30 requests x 1 kv head >= 24 x 1 CTAs: nothing split, one item per request
    w = workload([128 * 5] * 30, num_q_heads=16, num_kv_heads=1)
    part = fi.flashinfer(w, budget=1)
    part.validate()
    assert part.num_segments == 30
    # with 4 CTAs per SM (grid 96) the same batch is split: chunk = 2 pages (90 items)
    part = fi.flashinfer(w, budget=4)
    part.validate()
    assert part.num_segments == 90


def test_flashinfer_placement_shares_an_sm():
    # costs 32 + 5 x 40 = 232 then three of 32 + 40 = 72 on 2 cores, 1 slot each:
    # item 0 -> core 0, items 1..3 -> core 1 (free first every time)
    w = workload([640, 128, 128, 128], num_q_heads=16, num_kv_heads=1, num_cores=2)
    items = [[Segment(u, 0, int(w.blocks[u]))] for u in range(4)]
    cores = fi.place(w, items, budget=1)
    assert [len(c) for c in cores] == [1, 3]
    # two slots per core: slots 0..3 on cores 0, 1, 0, 1 take one item each
    assert [len(c) for c in fi.place(w, items, budget=2)] == [2, 2]


def test_flashinfer_persistent_chunks_and_heap():
    # G = 16 decode: 16 packed rows -> the 16-row task. 48 CTAs; total kv 400 -> share
    # ceil(400 / 48) = 9 -> limit 128: request 0 in chunks 128/128/44, request 1 whole;
    # each goes to the least-loaded CTA: 0, 1, 2, 3
    w = workload([300, 100], num_q_heads=16, num_kv_heads=1)
    items = fi.holistic_items(w)
    assert [(cta, kv) for cta, (_, _, _, kv) in items] == [
        (0, (0, 128)), (1, (128, 256)), (2, (256, 300)), (3, (0, 100))]
    part = fi.flashinfer_persistent(w)
    part.validate()
    assert part.cores[2] == [Segment(0, 2, 3)]


# ---------------------------------------------------------------- reference: exact min-max

minmax_mod = import_module("pyruntime.partitioners.minmax")


def test_minmax_hand_worked():
    # two units of 4 blocks, w = 40 (16 rows), segment 32: W = 2 x 192 = 384
    w = workload([512, 512], num_q_heads=16, num_kv_heads=1, num_cores=2)
    assert minmax_mod.minmax(w).core_costs() == [192, 192]
    # 3 cores: at B = 151 core 0 takes 2 blocks (112), core 1 the other 2 (112) and no block
    # of unit 1, which then does not fit core 2 (192); at B = 152: 3 blocks (152), then
    # 1 + 1 blocks (32 + 40 + 32 + 40 = 144), then 3 blocks (152)
    w = workload([512, 512], num_q_heads=16, num_kv_heads=1, num_cores=3)
    part = minmax_mod.minmax(w)
    part.validate()
    assert part.core_costs() == [152, 144, 152]
    assert part.cores[1] == [Segment(0, 3, 4), Segment(1, 0, 1)]
