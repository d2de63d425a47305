"""Fused attention calls must do what aicpu_attention_core does on each of their cores:
sibling sets (aicpu_attention_core_siblings: core j and its copies j + h*Q for the other kv
heads) and spans (aicpu_attention_core_span: consecutive cores, any P and H).

The C program aicpu_kernels/tests/attention_fused.c compares both with the per-core loop for
random v3 tilings (decode, speculative decode, chunked prefill, the logits soft cap off and on,
attention sinks off and on, P % H == 0 and not, splits, idle cores, random partitions into
spans, bad block ids, stale and corrupt tilings, emptied ranges, NULL arguments) on every variant,
plainly and under ASan+UBSan; the Python tests cover the bindings against the float64 reference and the per-core path.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from test_attention_c import KERNELS, SANITIZE, STRICT, compile_c, skip_without_sanitizers
from test_reference_attention import Case, assert_close

from pyruntime.kernels import reference_attention as ra

SOURCES = [KERNELS / "tests" / "attention_fused.c", KERNELS / "attention_ref.c",
           KERNELS / "attention_x86.c", KERNELS / "aicpu_tiling.c"]
FAULTS = ("ok", "bad-block", "bad-slot", "bad-end", "dropped-core", "failed-tiling",
          "wrong-flag", "stale-lengths", "null-arg")

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def run_program(binary: Path, problems: int) -> None:
    result = subprocess.run([str(binary), str(problems)], capture_output=True, text=True,
                            check=False, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"siblings: ([a-z0-9 ]+); (\d+) runs, (\d+) fused-shape problems; spans: "
                      r"(\d+) multi-core spans, (\d+) across kv heads; (\d+) soft-capped "
                      r"problems, (\d+) with sinks, (\d+) with a window; faults((?: [a-z-]+ \d+)+)",
                      result.stdout)
    assert match, result.stdout
    names = match.group(1).split()
    assert names == ra.isa_variants()["supported"]
    assert int(match.group(2)) == problems * len(names)
    assert int(match.group(3)) > problems // 4  # enough problems where the sets can fuse
    assert int(match.group(4)) > problems // 2  # spans of several cores ...
    assert int(match.group(5)) > problems // 8  # ... some of them over several kv heads
    assert int(match.group(6)) == problems // 3  # every third problem has the soft cap on
    assert int(match.group(7)) == problems // 2  # every other problem has sinks
    assert int(match.group(8)) > problems // 16  # every fourth causal one has a window
    counts = dict(zip(match.group(9).split()[::2], map(int, match.group(9).split()[1::2])))
    assert set(counts) == set(FAULTS) and min(counts.values()) > 0, counts


@needs_gcc
def test_fused_calls_match_per_core_runs(tmp_path):
    binary = compile_c(tmp_path / "fused", SOURCES, ["-std=c99", "-pedantic", "-O2", *STRICT])
    run_program(binary, 1500)


@needs_gcc
def test_fused_calls_under_address_and_undefined_sanitizers(tmp_path):
    skip_without_sanitizers(tmp_path)
    binary = compile_c(tmp_path / "fused_asan", SOURCES,
                       ["-std=c99", "-O1", "-g", *STRICT, *SANITIZE])
    run_program(binary, 300)


# ---------------------------------------------------------------------------- the bindings


@pytest.fixture(params=ra.isa_variants()["supported"])
def isa(request):
    before = ra.isa_variants()["active"]
    ra.select_isa(request.param)
    yield request.param
    ra.select_isa(before)


def bound(case: Case, plan, out, po, pl) -> ra.BoundAttention:
    return ra.BoundAttention(
        case.params, plan, query=case.query, key_cache=case.key_cache,
        value_cache=case.value_cache, block_table=case.block_table, cu_seqlens_q=case.cu,
        seqlens_kv=case.kv, out=out, partial_out=po, partial_lse=pl, scale=case.scale,
        causal=case.causal, logits_soft_cap=case.soft_cap, sinks=case.sinks,
    )


def groups_of(b: ra.BoundAttention, spans):
    """The fused calls and the cores each one covers: sibling sets (spans None), else the
    spans given as (first_core, num_cores) pairs."""
    if spans is None:
        return [(lambda j=j: b.core_siblings(j), b.sibling_cores(j))
                for j in range(b.num_sibling_sets)]
    return [(lambda a=a, n=n: b.core_span(a, n), range(a, a + n)) for a, n in spans]


def run_both(case: Case, spans=None):
    """(per-core out, statuses per group), (fused out, statuses per group), after finalize;
    groups are sibling sets, or the spans given as (first_core, num_cores) pairs."""
    plan = case.tiling()
    results = []
    for fused in (False, True):
        out = torch.full_like(case.query, float("nan"))
        po, pl = ra.partial_buffers(case.params)
        b = bound(case, plan, out, po, pl)
        statuses = []
        for call, cores in groups_of(b, spans):
            if fused:
                statuses.append(call())
            else:
                per_core = [b.core(c) for c in cores]
                statuses.append(next((s for s in per_core if s), 0))
        assert b.finalize() == 0
        results.append((out, statuses))
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "hkv, cores, q_lens, kv_lens",
    [
        (8, 24, [1] * 12, [300, 5, 77, 16, 17, 129, 1, 64, 250, 33, 90, 48]),  # decode, splits
        (4, 8, [3, 1, 4, 2], [40, 130, 9, 70]),  # speculative decode
        (2, 6, [1, 9, 0, 5], [33, 60, 12, 5]),  # chunked prefill with a padded slot
        (4, 6, [1, 1, 5], [200, 31, 50]),  # P % H != 0: every set is one core
        (2, 16, [1], [20]),  # idle cores
    ],
)
def test_siblings_equal_per_core_and_reference(isa, dtype, hkv, cores, q_lens, kv_lens):
    case = Case(np.random.default_rng(cores), hq=4 * hkv, hkv=hkv, d=64, bs=16, cores=cores,
                q_tile=4, q_lens=q_lens, kv_lens=kv_lens, dtype=dtype)
    (ref, st_ref), (out, st) = run_both(case)
    assert st == st_ref == [0] * len(st)
    assert_close(case, out)
    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(out.double(), ref.double(), rtol=tol, atol=1e-6)


def test_sets_cover_every_core_once():
    case = Case(np.random.default_rng(0), hq=16, hkv=8, cores=24)
    b = bound(case, case.tiling(), torch.zeros_like(case.query), *ra.partial_buffers(case.params))
    assert b.num_sibling_sets == ra.num_sibling_sets(case.params) == 3
    assert list(b.sibling_cores(1)) == [1 + 3 * h for h in range(8)]
    assert sorted(c for j in range(3) for c in b.sibling_cores(j)) == list(range(24))
    odd = Case(np.random.default_rng(0), hq=16, hkv=8, cores=5)
    assert ra.num_sibling_sets(odd.params) == 5


@pytest.mark.parametrize(
    "hkv, cores, spans",
    [(4, 8, None), (8, 5, [(0, 2), (2, 3)])],
    ids=["sibling-sets", "spans"],
)
def test_bad_block_id_status_and_rows_as_per_core(hkv, cores, spans):
    case = Case(np.random.default_rng(3), hq=2 * hkv, hkv=hkv, cores=cores, q_lens=[1, 1, 1],
                kv_lens=[100, 40, 70])
    case.block_table[1, 1] = 10_000
    (ref, st_ref), (out, st) = run_both(case, spans)
    assert st == st_ref and ra.E_BLOCK_ID in st
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # request 1 zeroed on every head


def test_function_and_argument_errors():
    case = Case(np.random.default_rng(1), hq=8, hkv=4, cores=8)
    out = torch.full_like(case.query, float("nan"))
    po, pl = ra.partial_buffers(case.params)
    plan = case.tiling()
    kwargs = {"query": case.query, "key_cache": case.key_cache, "value_cache": case.value_cache,
              "block_table": case.block_table, "cu_seqlens_q": case.cu, "seqlens_kv": case.kv,
              "out": out, "partial_out": po, "partial_lse": pl, "scale": case.scale}
    for j in range(ra.num_sibling_sets(case.params)):
        assert ra.attention_core_siblings(case.params, plan, j, **kwargs) == 0
    assert ra.attention_finalize(case.params, plan, cu_seqlens_q=case.cu, out=out,
                                 partial_out=po, partial_lse=pl) == 0
    assert_close(case, out)
    with pytest.raises(ValueError, match="first_core"):
        ra.attention_core_siblings(case.params, plan, 2, **kwargs)  # Q = 2
    with pytest.raises(ValueError, match="first_core"):
        bound(case, plan, out, po, pl).core_siblings(-1)
    with pytest.raises(TypeError):
        ra.attention_core_siblings(case.params, plan, 0, **{**kwargs, "query": None})
    finalize_only = ra.BoundAttention(case.params, plan, query=None, key_cache=None,
                                      value_cache=None, block_table=None, cu_seqlens_q=case.cu,
                                      seqlens_kv=None, out=out, partial_out=po, partial_lse=pl)
    with pytest.raises(ValueError, match="only finalize"):
        finalize_only.core_siblings(0)


# ---------------------------------------------------------------------------- spans


def spans_from(cuts: list[int]) -> list[tuple[int, int]]:
    return [(a, b - a) for a, b in itertools.pairwise(cuts)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "hkv, cores, q_lens, kv_lens, cuts",
    [
        # P % H != 0, decode: each core holds parts of two or three heads; the halves and
        # the whole run fuse across heads, with units cut between cores inside a span
        (8, 6, [1] * 12, [300, 5, 77, 16, 17, 129, 1, 64, 250, 33, 90, 48], [0, 3, 6]),
        (8, 6, [1] * 12, [300, 5, 77, 16, 17, 129, 1, 64, 250, 33, 90, 48], [0, 6]),
        (4, 5, [1] * 7, [40, 130, 9, 70, 1, 64, 17], [0, 1, 4, 5]),
        (4, 6, [3, 1, 4, 2], [40, 130, 9, 70], [0, 4, 6]),  # speculative decode
        (2, 5, [1, 9, 0, 5], [33, 60, 12, 5], [0, 2, 5]),  # chunked prefill, a padded slot
        (8, 24, [1] * 12, [300, 5, 77, 16, 17, 129, 1, 64, 250, 33, 90, 48], [0, 12, 24]),
        (2, 16, [1], [20], [0, 7, 16]),  # idle cores
    ],
)
def test_spans_equal_per_core_and_reference(isa, dtype, hkv, cores, q_lens, kv_lens, cuts):
    case = Case(np.random.default_rng(cores), hq=4 * hkv, hkv=hkv, d=64, bs=16, cores=cores,
                q_tile=4, q_lens=q_lens, kv_lens=kv_lens, dtype=dtype)
    (ref, st_ref), (out, st) = run_both(case, spans_from(cuts))
    assert st == st_ref == [0] * len(st)
    assert_close(case, out)
    tol = {torch.float32: 1e-5, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(out.double(), ref.double(), rtol=tol, atol=1e-6)


def test_span_argument_errors():
    case = Case(np.random.default_rng(1), hq=8, hkv=4, cores=6)
    out = torch.full_like(case.query, float("nan"))
    po, pl = ra.partial_buffers(case.params)
    b = bound(case, case.tiling(), out, po, pl)
    for first, n in [(0, 0), (-1, 2), (5, 2), (0, 7)]:
        with pytest.raises(ValueError, match="span of"):
            b.core_span(first, n)
    assert torch.isnan(out).all()  # nothing ran
    assert b.core_span(0, 6) == 0 and b.finalize() == 0
    assert_close(case, out)
    finalize_only = ra.BoundAttention(case.params, case.tiling(), query=None, key_cache=None,
                                      value_cache=None, block_table=None, cu_seqlens_q=case.cu,
                                      seqlens_kv=None, out=out, partial_out=po, partial_lse=pl)
    with pytest.raises(ValueError, match="only finalize"):
        finalize_only.core_span(0, 1)


@pytest.mark.parametrize(
    "hkv, cores, q_lens, kv_lens, spans",
    [
        (8, 24, [1] * 12, [300, 5, 77, 16, 17, 129, 1, 64, 250, 33, 90, 48], None),  # siblings
        (2, 5, [1, 9, 0, 5], [33, 60, 12, 5], [(0, 2), (2, 3)]),  # spans, chunked prefill
    ],
    ids=["sibling-sets", "spans"],
)
def test_soft_cap_fused_calls_equal_per_core_and_reference(isa, hkv, cores, q_lens, kv_lens,
                                                           spans):
    """The fused calls pass the logits soft cap on: same result as the per-core loop, and the
    capped float64 reference (queries x4, C = 2: tanh saturates, so ignoring it would fail)."""
    case = Case(np.random.default_rng(cores), hq=4 * hkv, hkv=hkv, d=64, bs=16, cores=cores,
                q_tile=4, q_lens=q_lens, kv_lens=kv_lens, soft_cap=2.0, q_mul=4.0)
    (ref, st_ref), (out, st) = run_both(case, spans)
    assert st == st_ref == [0] * len(st)
    assert_close(case, out)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "hkv, cores, q_lens, kv_lens, spans",
    [
        (8, 24, [1] * 12, [300, 5, 77, 16, 17, 129, 1, 64, 250, 33, 90, 48], None),  # siblings
        (2, 5, [1, 9, 0, 5], [500, 60, 12, 5], [(0, 2), (2, 3)]),  # spans, chunked prefill
    ],
    ids=["sibling-sets", "spans"],
)
def test_sinks_fused_calls_equal_per_core_and_reference(isa, hkv, cores, q_lens, kv_lens, spans):
    """The fused calls pass the attention sinks on (whole units add them, finalize adds them to
    split units): same result as the per-core loop and the float64 reference with each sink
    counted once (sinks 3 + h / 8, far from negligible)."""
    hq = 4 * hkv
    case = Case(np.random.default_rng(cores), hq=hq, hkv=hkv, d=64, bs=16, cores=cores,
                q_tile=4, q_lens=q_lens, kv_lens=kv_lens,
                sinks=3.0 + torch.arange(hq, dtype=torch.float32) / 8)
    assert case.tiling().combine_records()  # split units too
    (ref, st_ref), (out, st) = run_both(case, spans)
    assert st == st_ref == [0] * len(st)
    assert_close(case, out)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
