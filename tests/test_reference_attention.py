"""The reference attention (AI Core role) against an independent float64 per-request reference.

Tilings come from the C kernel (``tiling.plan``) and from the pure-Python oracle
(``tiling.reference_plan``); the attention reads only the tiling to decide its work, so every
core count, split pattern and core order must give the same result.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyruntime import tiling
from pyruntime.kernels import reference_attention as ra
from pyruntime.kernels.sliding_window import first_block as sliding_window_first_block
from pyruntime.tiling import TilingParams
from pyruntime.workload.reference import reference_attention

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
POISON_BLOCK = 2**31 - 1  # block-table entries the kernel must never read
HDR = tiling.lib if hasattr(tiling, "lib") else tiling._lib


@pytest.fixture(autouse=True, params=ra.isa_variants()["supported"])
def isa(request):
    """Every test runs once per instruction-set variant this machine supports."""
    before = ra.isa_variants()["active"]
    ra.select_isa(request.param)
    assert ra.isa_variants()["active"] == request.param
    yield request.param
    ra.select_isa(before)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class Case:
    """A paged-KV attention problem: static params, live lengths and tensors."""

    def __init__(
        self,
        rng: np.random.Generator,
        *,
        hq=8,
        hkv=2,
        d=32,
        bs=16,
        max_batch=None,
        max_tokens=None,
        mbpr=None,
        cores=4,
        q_tile=None,
        q_lens=(1, 1),
        kv_lens=(20, 5),
        dtype=torch.float32,
        causal=True,
        spare_blocks=3,
        soft_cap=None,
        q_mul=1.0,
        sinks=None,
        sliding_window=None,
        poison_below_window=False,
    ):
        batch = len(q_lens)
        self.max_batch = max_batch or batch + 1
        self.max_tokens = max_tokens or sum(q_lens) + 2
        self.mbpr = mbpr or max(1, max(_ceil_div(k, bs) for k in kv_lens) if kv_lens else 1)
        self.params = TilingParams(
            num_q_heads=hq,
            num_kv_heads=hkv,
            head_dim=d,
            block_size=bs,
            max_batch=self.max_batch,
            max_tokens=self.max_tokens,
            max_blocks_per_req=self.mbpr,
            num_cores=cores,
            q_tile=q_tile,
        )
        self.causal, self.dtype, self.batch = causal, dtype, batch
        self.soft_cap = soft_cap  # logits soft cap: None (off) or C > 0
        self.sinks = sinks  # attention sinks: None (off) or float32 [hq]
        self.sliding_window = sliding_window  # None (off) or W >= 1
        self.q_lens, self.kv_lens = list(q_lens), list(kv_lens)
        self.cu = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
        self.kv = torch.tensor(kv_lens, dtype=torch.int32)
        needed = [_ceil_div(k, bs) for k in kv_lens]
        num_blocks = sum(needed) + spare_blocks
        ids = rng.permutation(num_blocks)
        self.block_table = torch.full((self.max_batch, self.mbpr), POISON_BLOCK, dtype=torch.int32)
        at = 0
        for r, n in enumerate(needed):
            self.block_table[r, :n] = torch.from_numpy(ids[at : at + n].astype(np.int32))
            at += n
            if poison_below_window and q_lens[r]:  # blocks no row's window reaches
                first = sliding_window_first_block(kv_lens[r], q_lens[r], 0, sliding_window, bs)
                self.block_table[r, :first] = POISON_BLOCK
        gen = torch.Generator().manual_seed(int(rng.integers(2**31)))
        # q_mul > 1 makes scores large enough for a soft cap to bend them
        self.query = (q_mul * torch.randn(self.max_tokens, hq, d, generator=gen)).to(dtype)
        self.key_cache = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(dtype)
        self.value_cache = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(dtype)
        self.scale = 1.0 / math.sqrt(d)

    def tiling(self, oracle: bool = False):
        make = tiling.reference_plan if oracle else tiling.plan
        return make(self.params, self.cu.numpy(), self.kv.numpy(), causal=self.causal)

    def run(self, tiling_obj=None, order=None, threads: int = 0, out_fill=float("nan")):
        """Run every core then finalize; returns (out, core statuses, finalize status)."""
        t = tiling_obj if tiling_obj is not None else self.tiling()
        out = torch.full_like(self.query, out_fill)
        po, pl = ra.partial_buffers(self.params)
        po.fill_(float("nan"))
        pl.fill_(float("nan"))
        cores = list(order) if order is not None else list(range(self.params.num_cores))
        statuses: dict[int, int] = {}

        def one(core: int) -> None:
            statuses[core] = ra.attention_core(
                self.params,
                t,
                core,
                query=self.query,
                key_cache=self.key_cache,
                value_cache=self.value_cache,
                block_table=self.block_table,
                cu_seqlens_q=self.cu,
                seqlens_kv=self.kv,
                out=out,
                partial_out=po,
                partial_lse=pl,
                scale=self.scale,
                causal=self.causal,
                logits_soft_cap=self.soft_cap,
                sinks=self.sinks,
                sliding_window=self.sliding_window,
            )

        if threads:
            workers = [
                threading.Thread(target=lambda cs=cores[i::threads]: [one(c) for c in cs])
                for i in range(threads)
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
        else:
            for core in cores:
                one(core)
        fin = ra.attention_finalize(
            self.params, t, cu_seqlens_q=self.cu, out=out, partial_out=po, partial_lse=pl,
            sinks=self.sinks,
        )
        return out, statuses, fin

    def reference(self, sink_terms: int = 1) -> torch.Tensor:
        """float64 attention computed request by request from the paged cache.

        With sinks, each row's softmax gets ``sink_terms`` copies of its head's sink term in the
        denominator (1: the definition; 2: what a kernel adding the sink twice computes)."""
        p = self.params
        group = p.num_q_heads // p.num_kv_heads
        ref = torch.zeros(self.max_tokens, p.num_q_heads, p.head_dim, dtype=torch.float64)
        for r in range(self.batch):
            lo, hi, kl = int(self.cu[r]), int(self.cu[r + 1]), self.kv_lens[r]
            ql = hi - lo
            if ql == 0:
                continue
            first = sliding_window_first_block(kl, ql, 0, self.sliding_window, p.block_size)
            base = first * p.block_size  # kv positions [base, kl) are read
            ids = self.block_table[r, first : _ceil_div(kl, p.block_size)].long()
            k = self.key_cache[ids].double().reshape(-1, p.num_kv_heads, p.head_dim)[: kl - base]
            v = self.value_cache[ids].double().reshape(-1, p.num_kv_heads, p.head_dim)[: kl - base]
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            q = self.query[lo:hi].double()
            s = torch.einsum("qhd,khd->hqk", q, k) * self.scale
            if self.soft_cap is not None:
                s = self.soft_cap * torch.tanh(s / self.soft_cap)
            if self.causal:
                i = torch.arange(ql).view(ql, 1)
                j = torch.arange(base, kl).view(1, kl - base)
                s = s.masked_fill(j >= kl - ql + i + 1, float("-inf"))
                if self.sliding_window:  # the row at position kl - ql + i sees its last W keys
                    s = s.masked_fill(j <= kl - ql + i - self.sliding_window, float("-inf"))
            if self.sinks is not None:  # one more column: the sink, with no value
                sink = self.sinks.double() + math.log(sink_terms)
                s = torch.cat([s, sink.view(-1, 1, 1).expand(-1, ql, 1)], dim=-1)
                prob = torch.softmax(s, dim=-1)[..., :-1]
            else:
                prob = torch.softmax(s, dim=-1)
            ref[lo:hi] = torch.einsum("hqk,khd->qhd", prob, v)
        return ref


def assert_close(case: Case, out: torch.Tensor) -> None:
    ref = case.reference()
    got = out.double()
    assert not torch.isnan(got).any(), "some output row was never written"
    num_tokens = int(case.cu[-1])
    assert torch.equal(got[num_tokens:], torch.zeros_like(got[num_tokens:])), "padding not zero"
    tol = TOL[case.dtype]
    if num_tokens:
        rel = (got - ref).norm() / ref.norm()
        worst = (got - ref).abs().max() / ref.abs().max()
        assert rel <= tol and worst <= 4 * tol, (float(rel), float(worst))


def check_ok(case: Case, **run_kwargs) -> torch.Tensor:
    out, statuses, fin = case.run(**run_kwargs)
    assert set(statuses.values()) <= {0}, {c: ra.strerror(s) for c, s in statuses.items() if s}
    assert fin == 0, ra.strerror(fin)
    assert_close(case, out)
    return out


# ------------------------------------------------------------------------------ correctness

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cores", [1, 3, 8])
def test_decode_gqa_paged(dtype, cores):
    rng = np.random.default_rng(cores)
    case = Case(
        rng,
        hq=8,
        hkv=2,
        d=64,
        bs=16,
        cores=cores,
        q_lens=[1] * 5,
        kv_lens=[1, 17, 130, 64, 33],
        dtype=dtype,
    )
    check_ok(case)


@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_prefill_and_speculative_mix(dtype):
    rng = np.random.default_rng(7)
    case = Case(
        rng,
        hq=4,
        hkv=1,
        d=48,
        bs=8,
        cores=5,
        q_tile=4,
        q_lens=[1, 3, 11, 0, 6, 1],
        kv_lens=[9, 40, 11, 0, 70, 1],
        dtype=dtype,
        max_tokens=30,
        max_batch=8,
    )
    check_ok(case)


@pytest.mark.parametrize("causal", [True, False])
def test_non_causal_and_causal(causal):
    rng = np.random.default_rng(11)
    case = Case(
        rng,
        hq=6,
        hkv=3,
        d=40,
        bs=4,
        cores=6,
        q_tile=2,
        q_lens=[5, 2, 7],
        kv_lens=[9, 2, 30],
        causal=causal,
    )
    check_ok(case)


#: logits soft caps: (C, query multiplier): C = 2 with scores x4 (tanh saturates) and Gemma
#: 2's C = 50 with scores beyond it (queries x30)
SOFT_CAPS = [(2.0, 4.0), (50.0, 30.0)]


def soft_cap_case(dtype, cap, q_mul, *, cores=5):
    """Decode, speculative decode, chunked prefill and a padded slot, split over cores."""
    return Case(np.random.default_rng(7), hq=4, hkv=1, d=48, bs=8, cores=cores, q_tile=4,
                q_lens=[1, 3, 11, 0, 6, 1], kv_lens=[9, 40, 11, 0, 70, 1], dtype=dtype,
                max_tokens=30, max_batch=8, soft_cap=cap, q_mul=q_mul)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cap, q_mul", SOFT_CAPS, ids=["C2-saturating", "C50-gemma2"])
def test_soft_cap_matches_float64_and_changes_the_result(dtype, cap, q_mul):
    case = soft_cap_case(dtype, cap, q_mul)
    check_ok(case)
    # the cap matters here: the uncapped answer is far outside the tolerance of the capped one
    capped, uncapped = case.reference(), soft_cap_case(dtype, None, q_mul).reference()
    assert (capped - uncapped).abs().max() / capped.abs().max() > 0.1


def test_soft_cap_off_is_the_uncapped_path_and_bad_values_raise():
    case = soft_cap_case(torch.float32, None, 4.0)
    plan = case.tiling()
    off, _, _ = case.run(plan)
    case.soft_cap = 1e30  # a huge cap: the identity up to fp32 rounding, through the cap pass
    huge, _, _ = case.run(plan)
    torch.testing.assert_close(huge, off, rtol=1e-4, atol=1e-5)
    for bad in (0.0, -1.0, float("nan"), float("inf"), True, "2.0"):
        case.soft_cap = bad
        with pytest.raises(ValueError, match="logits_soft_cap"):
            case.run(plan)


def sinks_case(dtype, cores, *, sinks=True, soft_cap=None, q_mul=1.0):
    """Decode, speculative decode, chunked prefill and a padded slot; sinks 3 + h / 2 for q
    head h, large against the rows' summed weights (kv lengths 1 to 70), so they matter."""
    hq = 4
    return Case(np.random.default_rng(9), hq=hq, hkv=1, d=48, bs=8, cores=cores, q_tile=4,
                q_lens=[1, 3, 11, 0, 6, 1, 2], kv_lens=[9, 40, 11, 0, 70, 1, 33], dtype=dtype,
                max_tokens=30, max_batch=8, soft_cap=soft_cap, q_mul=q_mul,
                sinks=3.0 + 0.5 * torch.arange(hq, dtype=torch.float32) if sinks else None)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cores", [1, 7], ids=["whole-units", "split-units"])
def test_sinks_match_float64_once_and_change_the_result(dtype, cores):
    """Whole units (1 core) and split units merged by finalize (7 cores) against the float64
    reference with each sink counted once; without the sink or with it counted twice the
    answer is far outside the tolerance."""
    case = sinks_case(dtype, cores)
    if cores > 1:
        assert case.tiling().combine_records(), "no split unit: the combine path is not tested"
    check_ok(case)
    once, twice = case.reference(), case.reference(sink_terms=2)
    # the workload's float64 reference (the runtime tests' oracle) agrees with this one
    workload = reference_attention(case.query, case.key_cache, case.value_cache,
                                   case.block_table.numpy(), case.cu.numpy(), case.kv.numpy(),
                                   scale=case.scale, sinks=case.sinks)
    np.testing.assert_allclose(workload, once.numpy(), rtol=1e-9, atol=1e-12)
    none = sinks_case(dtype, cores, sinks=False).reference()
    for other in (twice, none):
        assert (once - other).abs().max() / once.abs().max() > 0.05


def test_sinks_with_soft_cap_and_off_is_today_and_bad_sinks_raise():
    """Sinks with the soft cap (the cap bends the scores, not the sink); sinks=None is
    bit-identical to a call without the argument; a wrong shape or dtype raises."""
    case = sinks_case(torch.float32, 7, soft_cap=2.0, q_mul=4.0)
    check_ok(case)
    plan = case.tiling()
    case.sinks = None
    off, _, _ = case.run(plan)
    bare = torch.full_like(case.query, float("nan"))
    po, pl = ra.partial_buffers(case.params)
    for core in range(case.params.num_cores):
        assert ra.attention_core(case.params, plan, core, query=case.query,
                                 key_cache=case.key_cache, value_cache=case.value_cache,
                                 block_table=case.block_table, cu_seqlens_q=case.cu,
                                 seqlens_kv=case.kv, out=bare, partial_out=po, partial_lse=pl,
                                 scale=case.scale, logits_soft_cap=2.0) == 0
    assert ra.attention_finalize(case.params, plan, cu_seqlens_q=case.cu, out=bare,
                                 partial_out=po, partial_lse=pl) == 0
    assert torch.equal(off, bare)
    for bad, error in ((torch.zeros(3), ValueError), (torch.zeros(4, dtype=torch.float64),
                                                       TypeError), ([0.0] * 4, TypeError)):
        case.sinks = bad
        with pytest.raises(error, match="sinks"):
            case.run(plan)


# Windows against block 8: smaller than a block, equal to one, spanning blocks, and at least
# every kv length (off in effect).
WINDOWS = [3, 8, 13, 100]


def window_case(dtype, cores, window, *, sinks=False, poison=True, seed=11):
    """Decode, speculative decode (2 to 4 tokens), chunked prefill (q_tile 4, so units of up
    to 4 rows with 4 window starts) and a padded slot, with the block-table entries below
    every request's window poisoned: reading or checking one would fail the run."""
    hq = 4
    return Case(np.random.default_rng(seed), hq=hq, hkv=2, d=40, bs=8, cores=cores, q_tile=4,
                q_lens=[1, 3, 11, 0, 6, 1, 2, 4], kv_lens=[9, 40, 11, 0, 70, 1, 33, 57],
                dtype=dtype, max_tokens=32, max_batch=9,
                sinks=3.0 + 0.5 * torch.arange(hq, dtype=torch.float32) if sinks else None,
                sliding_window=window, poison_below_window=poison and bool(window))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("cores", [1, 7], ids=["whole-units", "split-units"])
def test_sliding_window_matches_float64(dtype, window, cores):
    """Each row sees its last W keys (p - W < j <= p) and no block below its unit's window is
    read or checked (they are poisoned); the unwindowed answer is far away unless W covers
    every kv length."""
    case = window_case(dtype, cores, window)
    if cores > 1:
        assert case.tiling().combine_records(), "no split unit: the combine path is not tested"
    check_ok(case)
    want = case.reference()
    workload = reference_attention(case.query, case.key_cache, case.value_cache,
                                   case.block_table.numpy(), case.cu.numpy(), case.kv.numpy(),
                                   scale=case.scale, sliding_window=window)
    np.testing.assert_allclose(workload, want.numpy(), rtol=1e-9, atol=1e-12)
    full = window_case(dtype, cores, None).reference()
    distance = float((want - full).abs().max() / want.abs().max())
    if window >= max(case.kv_lens):
        assert distance == 0.0
    else:
        assert distance > 0.1


@pytest.mark.parametrize("window", [3, 13])
def test_sliding_window_with_sinks_and_soft_cap(window):
    """gpt-oss's windowed layers: sinks and a window together (split units, so the combine adds
    the sinks), and with the soft cap too."""
    case = window_case(torch.float32, 7, window, sinks=True)
    check_ok(case)
    no_sinks = window_case(torch.float32, 7, window).reference()
    assert (case.reference() - no_sinks).abs().max() / no_sinks.abs().max() > 0.05
    case.soft_cap = 2.0
    check_ok(case)


def _unit_rows(case: Case, r: int, t: int) -> range:
    """The kv positions of unit (r, ., t)'s rows."""
    q_len, kv_len, q_tile = case.q_lens[r], case.kv_lens[r], case.params.q_tile
    p0 = kv_len - q_len + t * q_tile
    return range(p0, p0 + min(q_tile, q_len - t * q_tile))


@pytest.mark.parametrize("cores", [1, 3, 7, 8])
@pytest.mark.parametrize("window", [3, 8, 13])
def test_sliding_window_reads_only_blocks_in_some_rows_window(cores, window):
    """The C block log: every kv block a core reads meets the window of at least one row of its
    unit, also through the fused sibling and span calls, and the window reads fewer blocks
    than the same tiling without it (today's tiling gives every unit all its blocks)."""
    bs = 8
    case = window_case(torch.float32, cores, window, poison=False)
    plan = case.tiling()
    counts = {}
    for w in (window, None):
        case.sliding_window = w
        with ra.BlockLog() as log:
            out, statuses, fin = case.run(plan)
        assert set(statuses.values()) <= {0} and fin == 0
        counts[w] = log.count
        assert 0 < log.count == len(log.reads)
        if w is None:
            continue
        assert_close(case, out)
        for r, h, t, b in log.reads.tolist():
            assert 0 <= h < case.params.num_kv_heads
            rows = _unit_rows(case, r, t)
            assert any(b * bs <= p and p - window < (b + 1) * bs - 1 for p in rows), (r, t, b)
            assert b * bs < rows[-1] + 1  # and never above the unit's last row
    assert counts[window] < counts[None]
    # the fused calls read only window blocks too
    case.sliding_window = window
    po, pl = ra.partial_buffers(case.params)
    out = torch.empty_like(case.query)
    bound = ra.BoundAttention(case.params, plan, query=case.query, key_cache=case.key_cache,
                              value_cache=case.value_cache, block_table=case.block_table,
                              cu_seqlens_q=case.cu, seqlens_kv=case.kv, out=out,
                              partial_out=po, partial_lse=pl, scale=case.scale,
                              sliding_window=window)
    with ra.BlockLog() as log:
        for j in range(bound.num_sibling_sets):
            assert bound.core_siblings(j) == 0
        assert bound.core_span(0, bound.num_cores) == 0
    assert bound.finalize() == 0
    assert_close(case, out)
    for r, _, t, b in log.reads.tolist():
        assert any(b * bs <= p and p - window < (b + 1) * bs - 1 for p in _unit_rows(case, r, t))


def with_window_unit_starts(case: Case, plan) -> np.ndarray:
    """The tiling's buffer with every core position at a unit's start (k = 0) renamed to the
    unit's first window block, as a tiling planned with the window names it (ABI v5: a unit's
    blocks are [first, last) in absolute columns). Its cuts below the window stay (a v4
    tiling's), so the result mixes both conventions where they differ: the consumers must
    tell them apart from the core records. (A core that begins a unit and ends below its
    window keeps k = 0: no v5 tiling has that piece, nor a name for its start.)"""
    words = plan.buffer.view(np.int32).copy()
    p, renamed = case.params, 0
    batch = int(words[HDR.AICPU_TILING_HDR_BATCH])
    begin, end = HDR.AICPU_TILING_CORE_BEGIN, HDR.AICPU_TILING_CORE_END
    for core in range(p.num_cores):
        rec = HDR.AICPU_TILING_HDR_WORDS + core * HDR.AICPU_TILING_CORE_WORDS
        end_pos = [int(w) for w in words[rec + end : rec + end + 4]]
        for at in (begin, end):
            r, h, t, k = (int(w) for w in words[rec + at : rec + at + 4])
            if k == 0 and r < batch and h < p.num_kv_heads and case.q_lens[r]:
                first = sliding_window_first_block(case.kv_lens[r], case.q_lens[r],
                                                   t * p.q_tile, case.sliding_window,
                                                   p.block_size)
                if at == begin and end_pos[:3] == [r, h, t] and end_pos[3] <= first:
                    continue
                words[rec + at + 3] = first
                renamed += first > 0
    assert renamed, "no unit start moved: the case does not test the new naming"
    return words


@pytest.mark.parametrize("cores", [5, 8, 12])
@pytest.mark.parametrize("window", [3, 13])
def test_sliding_window_with_unit_starts_at_the_window(cores, window):
    """A tiling that starts units at their first window block (the tiling branch's ABI v5)
    gives the same answer, through per-core, sibling and span calls."""
    case = window_case(torch.float32, cores, window)
    words = with_window_unit_starts(case, case.tiling())
    check_ok(case, tiling_obj=words)
    po, pl = ra.partial_buffers(case.params)
    out = torch.full_like(case.query, float("nan"))
    bound = ra.BoundAttention(case.params, words, query=case.query, key_cache=case.key_cache,
                              value_cache=case.value_cache, block_table=case.block_table,
                              cu_seqlens_q=case.cu, seqlens_kv=case.kv, out=out,
                              partial_out=po, partial_lse=pl, scale=case.scale,
                              sliding_window=window)
    for j in range(bound.num_sibling_sets):
        assert bound.core_siblings(j) == 0
    assert bound.finalize() == 0
    assert_close(case, out)
    out.fill_(float("nan"))
    assert bound.core_span(0, 2) == 0 and bound.core_span(2, cores - 2) == 0
    assert bound.finalize() == 0
    assert_close(case, out)


def test_sliding_window_off_and_wide_are_today_and_bad_windows_raise():
    """None and a window wider than every kv length give the bits of a call without the
    argument; 0 (refused, naming the convention), a negative, bool or float window, or one
    without causal attention, raises."""
    case = window_case(torch.float32, 7, None)
    plan = case.tiling()
    off, _, _ = case.run(plan)
    for same in (10**6,):
        case.sliding_window = same
        got, statuses, fin = case.run(plan)
        assert set(statuses.values()) <= {0} and fin == 0
        assert torch.equal(got, off)
    case.sliding_window = 0
    with pytest.raises(ValueError, match="sliding_window=0 is refused: None is no window"):
        case.run(plan)
    for bad in (-1, True, 2.5, "4"):
        case.sliding_window = bad
        with pytest.raises(ValueError, match="sliding_window"):
            case.run(plan)
    nc = Case(np.random.default_rng(1), causal=False, sliding_window=4)
    with pytest.raises(ValueError, match="causal"):
        nc.run()
    with pytest.raises(ValueError, match="causal"):
        reference_attention(nc.query, nc.key_cache, nc.value_cache, nc.block_table.numpy(),
                            nc.cu.numpy(), nc.kv.numpy(), scale=1.0, causal=False,
                            sliding_window=4)


def test_head_dim_not_multiple_of_lanes_and_mha():
    rng = np.random.default_rng(3)
    case = Case(
        rng, hq=3, hkv=3, d=13, bs=5, cores=7, q_tile=3, q_lens=[4, 1, 9], kv_lens=[23, 1, 9]
    )
    check_ok(case)


@pytest.mark.parametrize("d", [128, 72, 200])
@pytest.mark.parametrize("dtype", DTYPES)
def test_model_head_dims_decode_and_prefill(d, dtype):
    # head_dim 128 (Llama), 72 and 200 (vector tails of 8 and 16 lanes), groups of 4 and 3
    # rows (the SIMD kernels block rows by four), decode beside a causal prefill of 7 tokens
    rng = np.random.default_rng(d)
    for hq, hkv in ((8, 2), (6, 2)):
        case = Case(rng, hq=hq, hkv=hkv, d=d, bs=16, cores=5, q_lens=[1, 7, 1],
                    kv_lens=[150, 40, 67], dtype=dtype)
        check_ok(case)


def test_splits_are_merged():
    rng = np.random.default_rng(5)
    case = Case(rng, hq=4, hkv=1, d=32, bs=4, cores=16, q_lens=[1, 1], kv_lens=[400, 7])
    t = case.tiling()
    assert t.buffer.view(np.int32)[HDR.AICPU_TILING_HDR_NUM_COMBINE] >= 1
    check_ok(case, tiling_obj=t)


@pytest.mark.parametrize("oracle", [False, True])
def test_oracle_and_c_tilings_agree(oracle):
    rng = np.random.default_rng(9)
    case = Case(
        rng,
        hq=8,
        hkv=4,
        d=32,
        bs=16,
        cores=9,
        q_tile=8,
        q_lens=[1, 20, 0, 2],
        kv_lens=[300, 50, 0, 90],
        max_batch=6,
        max_tokens=40,
    )
    check_ok(case, tiling_obj=case.tiling(oracle=oracle))


def test_core_order_and_threads_give_identical_bits():
    rng = np.random.default_rng(13)
    case = Case(
        rng,
        hq=8,
        hkv=2,
        d=64,
        bs=16,
        cores=12,
        q_lens=[1, 4, 1, 2],
        kv_lens=[200, 77, 5, 150],
        dtype=torch.bfloat16,
        q_tile=2,
    )
    base = check_ok(case)
    backwards, _, _ = case.run(order=reversed(range(12)))
    threaded, _, _ = case.run(threads=3)
    assert torch.equal(base.view(torch.int16), backwards.view(torch.int16))
    assert torch.equal(base.view(torch.int16), threaded.view(torch.int16))


def test_empty_batch_zeroes_everything():
    rng = np.random.default_rng(1)
    case = Case(rng, q_lens=[], kv_lens=[], max_batch=2, max_tokens=4, mbpr=2)
    out = check_ok(case)
    assert torch.equal(out, torch.zeros_like(out))


def test_padded_slots_with_lengths_but_no_queries():
    rng = np.random.default_rng(2)
    case = Case(rng, q_lens=[0, 1, 0], kv_lens=[30, 12, 0], cores=3)
    check_ok(case)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_property_random_problems(data):
    draw = data.draw
    hkv = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4, 5]))
    d = draw(st.integers(1, 40))
    bs = draw(st.integers(1, 9))
    batch = draw(st.integers(0, 5))
    causal = draw(st.booleans())
    q_lens = draw(st.lists(st.integers(0, 9), min_size=batch, max_size=batch))
    kv_lens = [q + draw(st.integers(0 if causal or q == 0 else 1, 40)) for q in q_lens]
    if not causal:
        kv_lens = [k if q else draw(st.integers(0, 5)) for q, k in zip(q_lens, kv_lens)]
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    case = Case(
        rng,
        hq=hkv * group,
        hkv=hkv,
        d=d,
        bs=bs,
        cores=draw(st.integers(1, 12)),
        q_tile=draw(st.integers(1, 6)),
        q_lens=q_lens,
        kv_lens=kv_lens,
        dtype=dtype,
        causal=causal,
        max_batch=batch + draw(st.integers(0, 2)),
        max_tokens=sum(q_lens) + draw(st.integers(0, 3)) or 1,
        mbpr=max([_ceil_div(k, bs) for k in kv_lens] + [1]) + draw(st.integers(0, 2)),
    )
    check_ok(case, tiling_obj=case.tiling(oracle=draw(st.booleans())))


# ------------------------------------------------------------------------------ failures


def test_bad_tiling_status_does_nothing_then_finalize_zeroes_all_rows():
    rng = np.random.default_rng(4)
    case = Case(rng, q_lens=[1, 2], kv_lens=[5, 1])  # kv 1 < q_len 2: E_KV_SHORT
    t = case.tiling()
    assert t.status == HDR.AICPU_TILING_E_KV_SHORT
    keys, values, bt = case.key_cache.clone(), case.value_cache.clone(), case.block_table.clone()
    out, statuses, fin = case.run(tiling_obj=t, out_fill=7.0)
    assert set(statuses.values()) == {HDR.AICPU_TILING_E_KV_SHORT}
    assert fin == HDR.AICPU_TILING_E_KV_SHORT
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(keys, case.key_cache) and torch.equal(values, case.value_cache)
    assert torch.equal(bt, case.block_table)


def test_core_with_bad_status_writes_nothing():
    rng = np.random.default_rng(4)
    case = Case(rng, q_lens=[1, 2], kv_lens=[5, 1])
    out = torch.full_like(case.query, 3.0)
    status = ra.attention_core(
        case.params,
        case.tiling(),
        0,
        query=case.query,
        key_cache=case.key_cache,
        value_cache=case.value_cache,
        block_table=case.block_table,
        cu_seqlens_q=case.cu,
        seqlens_kv=case.kv,
        out=out,
        partial_out=None,
        partial_lse=None,
        causal=True,
    )
    assert status == HDR.AICPU_TILING_E_KV_SHORT
    assert torch.equal(out, torch.full_like(out, 3.0))


@pytest.mark.parametrize("cores", [2, 5])
@pytest.mark.parametrize("bad", [-1, 10**6])
def test_bad_block_id_is_reported_and_zeroed(bad, cores):
    rng = np.random.default_rng(6)
    case = Case(rng, q_lens=[1, 1, 1], kv_lens=[40, 40, 40], bs=8, cores=cores)
    ref = case.reference()
    case.block_table[1, 2] = bad
    out, statuses, fin = case.run()
    assert ra.E_BLOCK_ID in statuses.values() and fin == 0
    for r in (0, 2):
        assert torch.allclose(out[r].double(), ref[r], atol=1e-5)
    assert not torch.isnan(out).any()
    # every unit of request 1 reads block 2: its rows are zero, also where a unit was split
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_flags_mismatch_and_corrupt_buffer():
    rng = np.random.default_rng(8)
    case = Case(rng, q_lens=[1, 1], kv_lens=[40, 9], cores=2)
    t = case.tiling()
    args = {
        "query": case.query,
        "key_cache": case.key_cache,
        "value_cache": case.value_cache,
        "block_table": case.block_table,
        "cu_seqlens_q": case.cu,
        "seqlens_kv": case.kv,
        "out": torch.zeros_like(case.query),
        "partial_out": None,
        "partial_lse": None,
    }
    assert ra.attention_core(case.params, t, 0, causal=False, **args) == ra.E_TILING
    words = t.buffer.copy().view(np.int32)
    words[0] ^= 1
    assert ra.attention_core(case.params, words, 0, causal=True, **args) == ra.E_TILING
    out = torch.ones_like(case.query)
    fin = ra.attention_finalize(
        case.params, words, cu_seqlens_q=case.cu, out=out, partial_out=None, partial_lse=None
    )
    assert fin == ra.E_TILING and torch.equal(out, torch.zeros_like(out))
    # lengths changed after planning: detected, never read out of bounds
    longer = case.kv.clone()
    longer[0] = case.params.kv_capacity + 1
    args["seqlens_kv"] = longer
    statuses = {ra.attention_core(case.params, t, c, causal=True, **args) for c in range(2)}
    assert ra.E_TILING in statuses


# ------------------------------------------------------------------------------ wrapper


def test_wrapper_rejects_bad_arguments():
    rng = np.random.default_rng(10)
    case = Case(rng, q_lens=[1], kv_lens=[3])
    t = case.tiling()
    po, pl = ra.partial_buffers(case.params)
    good = {
        "query": case.query,
        "key_cache": case.key_cache,
        "value_cache": case.value_cache,
        "block_table": case.block_table,
        "cu_seqlens_q": case.cu,
        "seqlens_kv": case.kv,
        "out": torch.zeros_like(case.query),
        "partial_out": po,
        "partial_lse": pl,
    }

    def call(core=0, **change):
        return ra.attention_core(case.params, t, core, **{**good, **change})

    assert call() == 0
    with pytest.raises(TypeError, match="key_cache"):
        call(key_cache=case.key_cache.half())
    with pytest.raises(TypeError, match="block_table"):
        call(block_table=case.block_table.long())
    with pytest.raises(ValueError, match="query must have shape"):
        call(query=case.query[:-1].contiguous())
    with pytest.raises(ValueError, match="contiguous"):
        call(out=torch.zeros(case.query.shape[::-1]).transpose(0, 2))
    with pytest.raises(ValueError, match="core"):
        call(core=case.params.num_cores)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        call(cu_seqlens_q=case.cu[:1].contiguous())
    with pytest.raises(ValueError, match="partial_out"):
        call(partial_out=po[:, :1].contiguous())
    with pytest.raises(TypeError, match="torch.Tensor"):
        call(query=case.query.numpy())
    with pytest.raises(ValueError, match="tiling_buffer holds"):
        call_buf = t.buffer[:16]
        ra.attention_core(case.params, call_buf, 0, **good)


def test_strerror_names_every_status():
    for status in (0, ra.E_ARGS, ra.E_TILING, ra.E_BLOCK_ID, HDR.AICPU_TILING_E_KV_SHORT):
        assert ra.strerror(status)
    assert "block" in ra.strerror(ra.E_BLOCK_ID)


# ------------------------------------------------------------------------------ conversions


def test_half_conversions_match_ieee_round_to_nearest_even():
    lib = ra._lib
    every = np.arange(2**16, dtype=np.uint16)
    as_float = np.array([lib.aicpu_attention_half_to_float(int(h)) for h in every], np.float32)
    expect = every.view(np.float16).astype(np.float32)
    same = (as_float.view(np.uint32) == expect.view(np.uint32)) | (
        np.isnan(as_float) & np.isnan(expect)
    )
    assert same.all()
    rng = np.random.default_rng(0)
    bits = np.concatenate(
        [
            rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32),
            expect.view(np.uint32),  # exact halves
            expect.view(np.uint32) + 0x1000,
            expect.view(np.uint32) + 0xFFF,
            np.array(
                [
                    0x477FF000,
                    0x477FEFFF,
                    0x33000000,
                    0x33000001,
                    0x38800000,
                    0x387FFFFF,
                    0x7F800000,
                    0xFF800001,
                ],
                np.uint32,
            ),
        ]
    )
    floats = bits.view(np.float32)
    got = np.array([lib.aicpu_attention_float_to_half(float(f)) for f in floats], np.uint16)
    with np.errstate(over="ignore"):
        want = floats.astype(np.float16).view(np.uint16)
    nan = np.isnan(floats)
    assert (got[~nan] == want[~nan]).all()
    assert np.isnan(got[nan].view(np.float16)).all()


def test_bf16_conversions_match_torch():
    lib = ra._lib
    rng = np.random.default_rng(1)
    bits = np.concatenate(
        [
            rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32),
            np.array([0x7F7FFFFF, 0x3F808000, 0x3F818000, 0xFF800000, 0x7FC00001], np.uint32),
        ]
    )
    floats = bits.view(np.float32)
    got = np.array([lib.aicpu_attention_float_to_bf16(float(f)) for f in floats], np.uint16)
    want = torch.from_numpy(floats).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(floats)
    assert (got[~nan] == want[~nan]).all()
    assert all(
        lib.aicpu_attention_bf16_to_float(int(b)) != lib.aicpu_attention_bf16_to_float(int(b))
        for b in got[nan]
    )
    for b in rng.integers(0, 2**16, 1000):
        raw = torch.from_numpy(np.array([b], np.uint16).view(np.int16))
        want_f = raw.view(torch.bfloat16).float().item()
        got_f = lib.aicpu_attention_bf16_to_float(int(b))
        assert got_f == want_f or (math.isnan(got_f) and math.isnan(want_f))


def test_module_docstring_example_runs():
    import textwrap

    after = ra.__doc__.split("computes one attention layer::")[1].splitlines()
    block = []
    for line in after[1:]:
        if line.strip() and not line.startswith("    "):
            break
        block.append(line)
    code = "\n".join(block)
    namespace: dict = {}
    exec(textwrap.dedent(code), namespace)  # noqa: S102 (our own docstring)
    out = namespace["out"]
    assert torch.equal(out[4:], torch.zeros_like(out[4:]))


def test_bound_attention_follows_the_tiling_buffer_across_steps():
    """Bound once to static buffers, launched for two steps planned into the same buffer."""
    rng = np.random.default_rng(21)
    case = Case(rng, hq=8, hkv=2, d=32, bs=8, cores=6, q_lens=[1, 1, 1], kv_lens=[90, 3, 40],
                max_batch=4, max_tokens=6, mbpr=12)  # fmt: skip
    buf = torch.zeros(case.params.tiling_bytes // 4, dtype=torch.int32)
    cu = torch.zeros(case.max_batch + 1, dtype=torch.int32)
    kv = torch.zeros(case.max_batch, dtype=torch.int32)
    out = torch.full_like(case.query, float("nan"))
    po, pl = ra.partial_buffers(case.params)
    bound = ra.BoundAttention(
        case.params, buf, query=case.query, key_cache=case.key_cache,
        value_cache=case.value_cache, block_table=case.block_table, cu_seqlens_q=cu,
        seqlens_kv=kv, out=out, partial_out=po, partial_lse=pl, scale=case.scale,
    )  # fmt: skip
    for q_lens, kv_lens in (([1, 1, 1], [90, 3, 40]), ([1, 1], [85, 1])):
        batch = len(q_lens)
        cu[: batch + 1] = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]))
        kv[:batch] = torch.tensor(kv_lens)
        tiling.plan_into(case.params, cu, kv, batch, buf, causal=True)
        statuses = [bound.core(c) for c in range(case.params.num_cores)]
        assert statuses == [0] * case.params.num_cores, [ra.strerror(x) for x in statuses]
        assert bound.finalize() == 0
        case.batch, case.q_lens, case.kv_lens = batch, q_lens, kv_lens
        case.cu, case.kv = cu[: batch + 1].clone(), kv[:batch].clone()
        assert_close(case, out)
    with pytest.raises(ValueError, match="core"):
        bound.core(case.params.num_cores)
