"""The Triton AI Core kernels under Triton's interpreter, against the C reference and float64.

The kernels (`pyruntime.kernels.triton_attention`) run here exactly as an NPU would run them,
one launch per grid, on CPU tensors. Cases are tiny (the interpreter runs every tile op in
numpy); ``AICPU_TILING_TRITON_SWEEP=1`` adds a longer sweep that prints its error table.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from test_reference_attention import POISON_BLOCK, Case, with_window_unit_starts

from pyruntime import tiling
from pyruntime.kernels import reference_attention as ra
from pyruntime.kernels import triton_launch

pytestmark = pytest.mark.skipif(triton_launch.available() is not None,
                                reason=str(triton_launch.available()))

HDR = tiling.lib
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: max |out - float64| / max |float64|: fp32 accumulation, then one rounding of P (before the
#: PV product on the cube) and one of the output to the storage dtype
TOL = {torch.float32: 2e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}

CASES = {
    # name: Case keyword arguments (trace-like shapes, tiny)
    "decode_gqa_split": {"hq": 8, "hkv": 2, "d": 16, "bs": 8, "q_lens": (1, 1, 1),
                         "kv_lens": (70, 5, 33), "cores": 6},
    "decode_kv_heads_8": {"hq": 8, "hkv": 8, "d": 16, "bs": 8, "q_lens": (1, 1),
                          "kv_lens": (40, 17), "cores": 3},
    "decode_kv_heads_1": {"hq": 8, "hkv": 1, "d": 32, "bs": 16, "q_lens": (1, 1),
                          "kv_lens": (50, 9), "cores": 4},
    "spec_decode": {"hq": 4, "hkv": 2, "d": 16, "bs": 8, "q_lens": (3, 3, 1),
                    "kv_lens": (40, 20, 9), "cores": 4},
    "chunked_prefill": {"hq": 4, "hkv": 1, "d": 16, "bs": 8, "q_lens": (1, 9),
                        "kv_lens": (30, 25), "q_tile": 4, "cores": 5},
    "padded_zero_length": {"hq": 4, "hkv": 2, "d": 16, "bs": 8, "q_lens": (1, 0, 2, 0),
                           "kv_lens": (20, 11, 10, 0), "max_batch": 6, "max_tokens": 8,
                           "cores": 4},
    "unsplit_one_core": {"hq": 4, "hkv": 2, "d": 16, "bs": 8, "q_lens": (2, 1),
                         "kv_lens": (30, 12), "cores": 1},
    "non_causal": {"hq": 4, "hkv": 2, "d": 16, "bs": 8, "q_lens": (2, 1), "kv_lens": (19, 7),
                   "cores": 3, "causal": False},
}


def run_triton(case: Case, plan, *, fill=float("nan"), step_epoch=None):
    """Both grids on the case; returns (out, attention statuses, combine statuses).

    ``step_epoch`` defaults to the tiling's own epoch (a fresh tiling)."""
    out = torch.full_like(case.query, fill)
    po, pl = ra.partial_buffers(case.params)
    po.fill_(float("nan"))
    pl.fill_(float("nan"))
    words = torch.from_numpy(plan.buffer)
    epoch = torch.tensor([plan.epoch if step_epoch is None else step_epoch], dtype=torch.int32)
    status = triton_launch.launch_attention(
        case.params, tiling_in=words, step_epoch=epoch, query=case.query,
        key_cache=case.key_cache,
        value_cache=case.value_cache, block_table=case.block_table, cu_seqlens_q=case.cu,
        seqlens_kv=case.kv, out=out, partial_out=po, partial_lse=pl, scale=case.scale,
        causal=case.causal, logits_soft_cap=case.soft_cap, sinks=case.sinks,
        sliding_window=case.sliding_window)
    combined = triton_launch.launch_combine(case.params, tiling_in=words, step_epoch=epoch,
                                            cu_seqlens_q=case.cu, out=out, partial_out=po,
                                            partial_lse=pl, causal=case.causal, sinks=case.sinks)
    return out, status.tolist(), combined.tolist()


def errors(case: Case, out: torch.Tensor, c_out: torch.Tensor) -> tuple[float, float]:
    """(vs float64, vs the C reference), each max |diff| / max |float64|."""
    ref = case.reference()
    scale = float(ref.abs().max()) or 1.0
    return (float((out.double() - ref).abs().max()) / scale,
            float((out.double() - c_out.double()).abs().max()) / scale)


def assert_triton_matches_c_and_float64(case, plan, tolerance: float, name: str) -> None:
    """Run `plan` through the C reference and the Triton kernels: every core and combine
    reports status 0, every row is written and padding rows are zero, and the Triton output
    is within `tolerance` of float64 and of the C reference."""
    c_out, c_status, c_fin = case.run(plan)
    assert set(c_status.values()) == {0} and c_fin == 0
    out, status, combined = run_triton(case, plan)
    assert status == [0] * case.params.num_cores
    assert set(combined) == {0}
    assert not torch.isnan(out).any(), "a row was never written"
    tokens = int(case.cu[-1])
    assert torch.equal(out[tokens:], torch.zeros_like(out[tokens:])), "padding rows not zero"
    vs_ref, vs_c = errors(case, out, c_out)
    assert vs_ref <= tolerance, (name, vs_ref)
    assert vs_c <= tolerance, (name, vs_c)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_c_reference_and_float64(name, dtype):
    case = Case(np.random.default_rng(7), dtype=dtype, **CASES[name])
    plan = case.tiling()
    assert plan.status == 0
    assert_triton_matches_c_and_float64(case, plan, TOL[dtype], name)


#: logits soft caps, (C, query multiplier): C = 2 with scores x4 (tanh saturates) and Gemma 2's
#: C = 50 with scores beyond it (queries x30)
SOFT_CAPS = {"C2-saturating": (2.0, 4.0), "C50-gemma2": (50.0, 30.0)}
#: with the cap, fp32 against float64: scores of size ~C carry an fp32 rounding of ~C * 6e-8
#: and the kernel's tanh adds up to ~C * 1.1e-7 (``triton_attention._soft_cap``)
SOFT_CAP_TOL = {torch.float32: 5e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cap", sorted(SOFT_CAPS))
@pytest.mark.parametrize("name", ["decode_gqa_split", "spec_decode", "chunked_prefill",
                                  "padded_zero_length"])
def test_soft_cap_matches_c_reference_and_float64(name, cap, dtype):
    soft_cap, q_mul = SOFT_CAPS[cap]
    case = Case(np.random.default_rng(7), dtype=dtype, soft_cap=soft_cap, q_mul=q_mul,
                **CASES[name])
    plan = case.tiling()
    assert_triton_matches_c_and_float64(case, plan, SOFT_CAP_TOL[dtype], name)
    # the cap matters: ignoring it would miss the capped reference by far more than the tolerance
    capped = case.reference()
    uncapped = Case(np.random.default_rng(7), dtype=dtype, q_mul=q_mul, **CASES[name]).reference()
    assert (capped - uncapped).abs().max() / capped.abs().max() > 0.1


def test_soft_cap_argument_is_checked_before_launching():
    case = Case(np.random.default_rng(7), **CASES["decode_gqa_split"])
    plan = case.tiling()
    for bad in (0.0, -2.0, float("nan"), float("inf"), True):
        case.soft_cap = bad
        with pytest.raises(ValueError, match="logits_soft_cap"):
            run_triton(case, plan)


def sinks_for(name: str) -> torch.Tensor:
    """Sinks 3 + h / 2 for q head h: large against rows of 1 to 70 keys, so they matter."""
    return 3.0 + 0.5 * torch.arange(CASES[name]["hq"], dtype=torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["decode_gqa_split", "decode_kv_heads_1", "spec_decode",
                                  "chunked_prefill", "padded_zero_length", "unsplit_one_core"])
def test_sinks_match_c_reference_and_float64_once(name, dtype):
    """Whole units add the sink in the attention kernel, split units in the combine: both
    against the C reference and float64 with each sink counted once; counting it twice or not
    at all would miss by far more than the tolerance."""
    case = Case(np.random.default_rng(7), dtype=dtype, sinks=sinks_for(name), **CASES[name])
    plan = case.tiling()
    if name in ("decode_gqa_split", "decode_kv_heads_1"):
        assert plan.combine_records(), "no split unit: the combine's sink is not tested"
    assert_triton_matches_c_and_float64(case, plan, TOL[dtype], name)
    once = case.reference()
    none = Case(np.random.default_rng(7), dtype=dtype, **CASES[name]).reference()
    for other in (case.reference(sink_terms=2), none):
        assert (once - other).abs().max() / once.abs().max() > 0.05


def test_sinks_with_soft_cap_and_bad_sinks_raise():
    """Sinks with the soft cap (the cap bends the scores, never the sink), split units."""
    name = "decode_gqa_split"
    case = Case(np.random.default_rng(7), soft_cap=2.0, q_mul=4.0, sinks=sinks_for(name),
                **CASES[name])
    plan = case.tiling()
    c_out, _, _ = case.run(plan)
    out, status, combined = run_triton(case, plan)
    assert status == [0] * case.params.num_cores and set(combined) == {0}
    vs_ref, vs_c = errors(case, out, c_out)
    assert vs_ref <= SOFT_CAP_TOL[torch.float32] and vs_c <= SOFT_CAP_TOL[torch.float32]
    for bad, error in ((torch.zeros(3), ValueError), (torch.zeros(8, dtype=torch.float64),
                                                       TypeError), ([0.0] * 8, TypeError)):
        case.sinks = bad
        with pytest.raises(error, match="sinks"):
            run_triton(case, plan)


#: sliding windows against the cases' block of 8: smaller than a block, equal, spanning blocks,
#: and one past every kv length (off in effect)
WINDOWS = [3, 8, 13, 100]
WINDOW_CASES = ["decode_gqa_split", "spec_decode", "chunked_prefill", "padded_zero_length"]


def window_case(name: str, dtype, window, **kwargs) -> Case:
    """The case with a window and the block-table entries below every request's window
    poisoned: a kernel that read or checked one would report E_BLOCK_ID."""
    return Case(np.random.default_rng(7), dtype=dtype, sliding_window=window,
                poison_below_window=True, **CASES[name], **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("name", WINDOW_CASES)
def test_sliding_window_matches_c_reference_and_float64(name, window, dtype):
    """Each row sees its last W keys, against the C reference and float64 on today's tiling
    (every unit given all its blocks, so pieces below the window are empty); the unwindowed
    answer is far away unless W covers every kv length."""
    case = window_case(name, dtype, window)
    plan = case.tiling()
    if name == "decode_gqa_split":
        assert plan.combine_records(), "no split unit: the combine path is not tested"
    assert_triton_matches_c_and_float64(case, plan, TOL[dtype], name)
    want = case.reference()
    full = Case(np.random.default_rng(7), dtype=dtype, **CASES[name]).reference()
    distance = float((want - full).abs().max() / want.abs().max())
    assert distance == 0.0 if window >= max(case.kv_lens) else distance > 0.05


@pytest.mark.parametrize("window", [3, 13])
def test_sliding_window_with_sinks_and_soft_cap(window):
    """gpt-oss's windowed layers (sinks and a window, split units), and with the soft cap."""
    name = "decode_gqa_split"
    case = window_case(name, torch.float32, window, sinks=sinks_for(name))
    plan = case.tiling()
    assert plan.combine_records()
    assert_triton_matches_c_and_float64(case, plan, TOL[torch.float32], name)
    case.soft_cap, case.query = 2.0, case.query * 4
    assert_triton_matches_c_and_float64(case, plan, SOFT_CAP_TOL[torch.float32], name)


@pytest.mark.parametrize("window", [3, 13])
def test_sliding_window_with_unit_starts_at_the_window(window):
    """A tiling that starts units at their first window block (the tiling branch's ABI v5,
    here mixed with today's cuts below the window) gives the same answer."""

    class Renamed:  # what run_triton reads of a plan
        def __init__(self, buffer, epoch):
            self.buffer, self.epoch = buffer, epoch

    for name, cores in (("chunked_prefill", 5), ("spec_decode", 7), ("decode_gqa_split", 8)):
        case = Case(np.random.default_rng(7), sliding_window=window, poison_below_window=True,
                    **{**CASES[name], "cores": cores})
        plan = case.tiling()
        words = with_window_unit_starts(case, plan)
        assert_triton_matches_c_and_float64(case, Renamed(words, plan.epoch),
                                            TOL[torch.float32], name)


def test_sliding_window_argument_is_checked_before_launching():
    case = Case(np.random.default_rng(7), **CASES["decode_gqa_split"])
    plan = case.tiling()
    for bad in (0, -1, True, 2.5):  # 0: a peer's one-key window, refused
        case.sliding_window = bad
        with pytest.raises(ValueError, match="sliding_window"):
            run_triton(case, plan)
    case = Case(np.random.default_rng(7), sliding_window=4, **CASES["non_causal"])
    with pytest.raises(ValueError, match="causal"):
        run_triton(case, case.tiling())


def test_cases_cover_split_and_unsplit_units():
    splits = {name: Case(np.random.default_rng(7), **kw).tiling().num_slots
              for name, kw in CASES.items()}
    assert splits["decode_gqa_split"] > 0 and splits["unsplit_one_core"] == 0


def test_split_partials_match_the_c_reference_slots():
    """Same slots, same partial rows and LSE convention (natural log, -inf when unseen)."""
    case = Case(np.random.default_rng(3), **CASES["decode_gqa_split"])
    plan = case.tiling()
    po_c, pl_c = ra.partial_buffers(case.params)
    for core in range(case.params.num_cores):
        ra.attention_core(case.params, plan, core, query=case.query, key_cache=case.key_cache,
                          value_cache=case.value_cache, block_table=case.block_table,
                          cu_seqlens_q=case.cu, seqlens_kv=case.kv,
                          out=torch.zeros_like(case.query), partial_out=po_c,
                          partial_lse=pl_c, scale=case.scale, causal=True)
    po, pl = ra.partial_buffers(case.params)
    triton_launch.launch_attention(
        case.params, tiling_in=torch.from_numpy(plan.buffer),
        step_epoch=torch.zeros(1, dtype=torch.int32), query=case.query,
        key_cache=case.key_cache, value_cache=case.value_cache, block_table=case.block_table,
        cu_seqlens_q=case.cu, seqlens_kv=case.kv, out=torch.zeros_like(case.query),
        partial_out=po, partial_lse=pl, scale=case.scale, causal=True)
    used = plan.num_slots
    assert used > 0
    torch.testing.assert_close(pl[:used], pl_c[:used], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(po[:used], po_c[:used], rtol=1e-5, atol=1e-5)


def test_bad_tiling_status_does_nothing_and_combine_zeroes_every_row():
    case = Case(np.random.default_rng(1), q_lens=(1, 2), kv_lens=(20, 1), cores=3)  # kv < q
    plan = case.tiling()
    assert plan.status == HDR.AICPU_TILING_E_KV_SHORT
    out, status, combined = run_triton(case, plan, fill=5.0)
    assert status == [plan.status] * 3 and set(combined) == {plan.status}
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("epochs", [(7, 8), (-1, 0)])
def test_stale_tiling_does_no_work_and_combine_zeroes_every_row(epochs):
    """A tiling planned for another step (ABI v2 epoch word) never produces silent output."""
    tiling_epoch, step_epoch = epochs
    case = Case(np.random.default_rng(1), **CASES["decode_gqa_split"])
    plan = tiling.plan(case.params, case.cu.numpy(), case.kv.numpy(), epoch=tiling_epoch)
    assert plan.status == 0 and plan.epoch == tiling_epoch
    out = torch.full_like(case.query, float("nan"))
    po, pl = ra.partial_buffers(case.params)
    po.fill_(3.0)
    status = triton_launch.launch_attention(
        case.params, tiling_in=torch.from_numpy(plan.buffer),
        step_epoch=torch.tensor([step_epoch], dtype=torch.int32), query=case.query,
        key_cache=case.key_cache, value_cache=case.value_cache, block_table=case.block_table,
        cu_seqlens_q=case.cu, seqlens_kv=case.kv, out=out, partial_out=po, partial_lse=pl,
        scale=case.scale, causal=True)
    assert status.tolist() == [triton_launch.E_STALE] * case.params.num_cores
    assert torch.isnan(out).all() and (po == 3.0).all(), "a stale tiling did some work"
    _, _, combined = run_triton(case, plan, step_epoch=step_epoch)
    out_fresh, status_fresh, _ = run_triton(case, plan)  # same buffers, right epoch: computed
    assert set(combined) == {triton_launch.E_STALE} and set(status_fresh) == {0}
    zeroed, _, _ = run_triton(case, plan, fill=5.0, step_epoch=step_epoch)
    assert torch.equal(zeroed, torch.zeros_like(zeroed))
    assert out_fresh.abs().sum() > 0


def test_stale_status_collides_with_no_c_status():
    codes = {getattr(HDR, name) for name in dir(HDR)
             if name.startswith(("AICPU_ATTENTION_E_", "AICPU_TILING_E_"))}
    assert codes and triton_launch.E_STALE not in codes
    assert triton_launch.E_STALE >= HDR.AICPU_TILING_NUM_STATUS


def test_corrupt_header_is_reported_and_zeroed():
    case = Case(np.random.default_rng(1), cores=3)
    plan = case.tiling()
    plan.words[HDR.AICPU_TILING_HDR_MAGIC] ^= 1
    out, status, combined = run_triton(case, plan, fill=5.0)
    assert status == [ra.E_TILING] * 3 and set(combined) == {ra.E_TILING}
    assert torch.equal(out, torch.zeros_like(out))


def test_flags_mismatch_is_a_tiling_error():
    case = Case(np.random.default_rng(1), cores=2)
    plan = case.tiling()
    case.causal = False  # launched non-causal on a causal tiling
    _, status, _ = run_triton(case, plan)
    assert set(status) == {ra.E_TILING}


@pytest.mark.parametrize("bad", [-1, POISON_BLOCK])
def test_bad_block_id_zeroes_the_unit_like_the_c_reference(bad):
    case = Case(np.random.default_rng(2), q_lens=(1, 1), kv_lens=(60, 20), cores=5)
    case.block_table[0, 2] = bad
    plan = case.tiling()
    c_out, c_status, _ = case.run(plan)
    out, status, combined = run_triton(case, plan)
    assert sorted(set(status)) == sorted(set(c_status.values())) == [0, ra.E_BLOCK_ID]
    assert set(combined) == {0}
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # request 0: zeroed, never garbage
    torch.testing.assert_close(out, c_out, rtol=1e-5, atol=1e-6)


def test_segment_count_mismatch_is_a_tiling_error():
    case = Case(np.random.default_rng(4), q_lens=(1, 1), kv_lens=(30, 30), cores=2)
    plan = case.tiling()
    first = HDR.AICPU_TILING_HDR_WORDS
    plan.words[first + HDR.AICPU_TILING_CORE_NUM_SEGMENTS] += 1
    _, status, _ = run_triton(case, plan)
    assert status[0] == ra.E_TILING


def test_empty_batch_zeroes_everything():
    case = Case(np.random.default_rng(5), q_lens=(0, 0), kv_lens=(0, 0), cores=3)
    out, status, combined = run_triton(case, case.tiling(), fill=5.0)
    assert status == [0] * 3 and set(combined) == {0}
    assert torch.equal(out, torch.zeros_like(out))


def test_wrong_shapes_and_dtypes_raise_before_launch():
    case = Case(np.random.default_rng(6))
    plan = torch.from_numpy(case.tiling().buffer)
    po, pl = ra.partial_buffers(case.params)
    args = {"tiling_in": plan, "step_epoch": torch.zeros(1, dtype=torch.int32),
            "query": case.query, "key_cache": case.key_cache, "value_cache": case.value_cache,
            "block_table": case.block_table, "cu_seqlens_q": case.cu, "seqlens_kv": case.kv,
            "out": torch.zeros_like(case.query), "partial_out": po, "partial_lse": pl,
            "scale": 0.25, "causal": True}
    with pytest.raises(TypeError, match="query"):
        triton_launch.launch_attention(case.params, **{**args, "query": case.query.half()})
    with pytest.raises(ValueError, match="out"):
        triton_launch.launch_attention(case.params, **{**args, "out": case.query[:1].clone()})
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        triton_launch.launch_attention(case.params, **{**args, "cu_seqlens_q": case.cu.long()})
    with pytest.raises(TypeError, match="step_epoch"):
        triton_launch.launch_attention(case.params, **{**args, "step_epoch": np.zeros(1)})
    with pytest.raises(ValueError, match="seqlens_kv has 1 entries"):
        triton_launch.launch_attention(case.params, **{**args, "seqlens_kv": case.kv[:1]})
    with pytest.raises(ValueError, match="cu_seqlens_q has 2 entries"):
        triton_launch.launch_combine(case.params, tiling_in=plan,
                                     step_epoch=args["step_epoch"], cu_seqlens_q=case.cu[:2],
                                     out=args["out"], partial_out=po, partial_lse=pl)
    with pytest.raises(TypeError, match="tiling_in"):
        triton_launch.launch_attention(case.params, **{**args, "tiling_in": plan.float()})


# ------------------------------------------------------------------ the longer sweep (opt-in)

SWEEP = os.environ.get("AICPU_TILING_TRITON_SWEEP") == "1"


@pytest.mark.slow
@pytest.mark.skipif(not SWEEP, reason="set AICPU_TILING_TRITON_SWEEP=1 for the long sweep")
def test_sweep_prints_max_relative_error_per_dtype():
    """Random trace-like batches at model-like head sizes; prints the error table."""
    rng = np.random.default_rng(2026)
    worst = {dtype: [0.0, 0.0, 0] for dtype in DTYPES}
    shapes = [{"hq": 32, "hkv": 8, "d": 128, "bs": 128}, {"hq": 16, "hkv": 1, "d": 64, "bs": 16},
              {"hq": 8, "hkv": 8, "d": 64, "bs": 32}]
    for trial in range(int(os.environ.get("AICPU_TILING_TRITON_SWEEP_TRIALS", "12"))):
        shape = shapes[trial % len(shapes)]
        batch = int(rng.integers(1, 6))
        kind = trial % 3   # decode, spec decode, chunked prefill mix
        q_lens = [int(rng.integers(0, 2)) if kind == 0 else int(rng.integers(0, 4))
                  for _ in range(batch)]
        if kind == 2:
            q_lens[0] = int(rng.integers(5, 40))
        kv_lens = [q + int(rng.integers(0, 300)) for q in q_lens]
        cores = int(rng.choice([1, 8, 24]))
        for dtype in DTYPES:
            case = Case(rng, dtype=dtype, q_lens=q_lens, kv_lens=kv_lens, cores=cores,
                        max_batch=batch + 2, **shape)
            plan = case.tiling()
            c_out, _, _ = case.run(plan)
            out, status, combined = run_triton(case, plan)
            assert set(status) == {0} and set(combined) == {0}
            vs_ref, vs_c = errors(case, out, c_out)
            w = worst[dtype]
            w[0], w[1], w[2] = max(w[0], vs_ref), max(w[1], vs_c), w[2] + 1
    print("\ndtype     cases  max rel err vs float64  max rel diff vs C")
    for dtype, (vs_ref, vs_c, n) in worst.items():
        print(f"{dtype!s:9} {n:5d}  {vs_ref:22.3e}  {vs_c:17.3e}")
        assert vs_ref <= TOL[dtype]


# ------------------------------------------------------------------ the NPU implementations


def test_npu_implementations_match_the_c_path_on_cpu_tensors():
    """`step.attention_npu` / `combine_npu` (the ops' PrivateUse1 kernels) run the same launch;
    on CPU tensors it is interpreted, so the NPU code path is checked here up to the device."""
    from pyruntime.kernels import step

    case = Case(np.random.default_rng(9), dtype=torch.float16, **CASES["decode_gqa_split"])
    plan = case.tiling()
    c_out, _, _ = case.run(plan)
    out = torch.full_like(case.query, float("nan"))
    po, pl = ra.partial_buffers(case.params)
    params = step.params_list(case.params)
    epoch = np.array([plan.epoch], dtype=np.int32)   # by value, as the host-update path passes
    step.attention_npu(case.query, case.key_cache, case.value_cache, case.block_table, case.cu,
                       case.kv, epoch, plan.buffer, out, po, pl, params, case.scale, True)
    step.combine_npu(case.cu, epoch, plan.buffer, out, po, pl, params)
    assert step.status_buffer(out.device, "attention", case.params.num_cores).tolist() == [0] * 6
    assert set(step.status_buffer(out.device, "combine", 6).tolist()) == {0}
    assert errors(case, out, c_out)[1] <= TOL[torch.float16]


def test_custom_ops_register_the_npu_implementations():
    from pyruntime.kernels import custom_ops

    custom_ops.ops()
    for op in ("paged_attention", "attention_combine"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(
            f"{custom_ops.NAMESPACE}::{op}", "PrivateUse1"), op


def test_corrupt_combine_record_zeroes_every_row():
    case = Case(np.random.default_rng(3), **CASES["decode_gqa_split"])
    plan = case.tiling()
    assert plan.num_slots > 0
    start = tiling.HEADER_WORDS + tiling.CORE_WORDS * case.params.num_cores  # combine table
    plan.words[start + HDR.AICPU_TILING_COMB_REQUEST] = 99   # a request past the batch
    out, status, combined = run_triton(case, plan, fill=5.0)
    assert set(status) == {0} and set(combined) == {ra.E_TILING}
    assert torch.equal(out, torch.zeros_like(out))


def test_launcher_docstring_example_runs():
    import textwrap

    code = triton_launch.__doc__.split("Example (CPU, interpreted)::\n")[1]
    exec(textwrap.dedent(code), {})  # noqa: S102 (our own docstring)


@pytest.mark.parametrize("sink_dtype", [torch.bfloat16, torch.float16], ids=str)
def test_model_dtype_sinks_are_read_in_place_as_their_fp32_values(sink_dtype):
    """gpt-oss keeps its sinks in the model dtype (vLLM loads them under the model's default
    dtype), and the hook hands the kernels the layer's own tensor. Both consumers must read a
    bf16/fp16 sink as exactly its fp32 value: the same bits out as fp32 sinks holding the
    rounded values, split units included, and far from the unrounded fp32 sinks' answer
    would be if the rounding were lost (checked: the rounding moves the sinks)."""
    name = "decode_gqa_split"
    hq = CASES[name]["hq"]
    wide = 3.1 + 0.37 * torch.arange(hq, dtype=torch.float32)   # not representable in 8 bits
    narrow = wide.to(sink_dtype)
    assert not torch.equal(narrow.float(), wide), "the rounding does not move the sinks"
    model = Case(np.random.default_rng(7), dtype=torch.float32, sinks=narrow, **CASES[name])
    widened = Case(np.random.default_rng(7), dtype=torch.float32, sinks=narrow.float(),
                   **CASES[name])
    plan = model.tiling()
    assert plan.combine_records(), "no split unit: the combine's sink is not tested"
    c_model, c_widened = model.run(plan)[0], widened.run(plan)[0]
    t_model, t_widened = run_triton(model, plan)[0], run_triton(widened, plan)[0]
    assert torch.equal(c_model, c_widened) and torch.equal(t_model, t_widened)
    vs_ref, vs_c = errors(widened, t_model, c_model)
    assert vs_ref <= TOL[torch.float32] and vs_c <= TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_reads_vllm_030_strided_caches_in_place(dtype):
    """GQA ND caches as vLLM-Ascend 0.30.0rc2 hands them to a full-attention layer (K and V
    pages side by side in one allocation, `tests.test_attention_c.vllm_030_kv_views`): the
    launcher takes them (it raised "key_cache must be contiguous" before) and the kernel,
    reading them in place, gives the contiguous caches' bits."""
    from tests.test_attention_c import _float_case, vllm_030_kv_views

    for name in ("decode_split", "spec_decode"):
        case = _float_case(name, dtype)
        want = case.run_triton()
        case.key_cache, case.value_cache = vllm_030_kv_views(case.key_cache, case.value_cache)
        assert torch.equal(case.run_triton(), want), name


def test_launcher_refuses_caches_whose_blocks_are_not_dense():
    from pyruntime.kernels import kv_quant
    from tests.test_attention_c import _float_case

    case = _float_case("decode_split", torch.float16)
    head_major = case.key_cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    case.key_cache = head_major
    found = "strides " + str(list(head_major.stride())).replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(kv_quant.CacheStrideError, match=found):
        case.run_triton()
