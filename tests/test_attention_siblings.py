"""Sibling cores (aicpu_attention_core_siblings): one call for core j and its copies j + h*Q for
the other kv heads must do what aicpu_attention_core does on each of them.

The C program aicpu_kernels/tests/attention_siblings.c compares the two for random v3 tilings
(decode, speculative decode, chunked prefill, P % H == 0 and not, splits, idle cores, bad block
ids, stale and corrupt tilings, NULL arguments) on every variant, plainly and under ASan+UBSan;
the Python tests cover the bindings against the float64 reference and the per-core path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from test_attention_c import KERNELS, SANITIZE, STRICT, compile_c
from test_reference_attention import Case, assert_close

from pyruntime.kernels import reference_attention as ra

SOURCES = [KERNELS / "tests" / "attention_siblings.c", KERNELS / "attention_ref.c",
           KERNELS / "attention_x86.c", KERNELS / "aicpu_tiling.c"]
FAULTS = ("ok", "bad-block", "bad-slot", "bad-end", "failed-tiling", "wrong-flag",
          "stale-lengths", "null-arg")

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def run_program(binary: Path, problems: int) -> None:
    result = subprocess.run([str(binary), str(problems)], capture_output=True, text=True,
                            check=False, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"siblings: ([a-z0-9 ]+); (\d+) runs, (\d+) fused-shape problems; faults"
                      r"((?: [a-z-]+ \d+)+)", result.stdout)
    assert match, result.stdout
    names = match.group(1).split()
    assert names == ra.isa_variants()["supported"]
    assert int(match.group(2)) == problems * len(names)
    assert int(match.group(3)) > problems // 4  # enough problems where the sets can fuse
    counts = dict(zip(match.group(4).split()[::2], map(int, match.group(4).split()[1::2])))
    assert set(counts) == set(FAULTS) and min(counts.values()) > 0, counts


@needs_gcc
def test_siblings_match_per_core_runs(tmp_path):
    binary = compile_c(tmp_path / "siblings", SOURCES, ["-std=c99", "-pedantic", "-O2", *STRICT])
    run_program(binary, 1500)


@needs_gcc
def test_siblings_under_address_and_undefined_sanitizers(tmp_path):
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    if subprocess.run(["gcc", *SANITIZE, str(probe), "-o", str(tmp_path / "probe")],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("this compiler cannot link AddressSanitizer/UBSan programs")
    binary = compile_c(tmp_path / "siblings_asan", SOURCES,
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
        causal=case.causal,
    )


def run_both(case: Case):
    """(per-core out, statuses per set), (sibling out, statuses per set), after finalize."""
    plan = case.tiling()
    results = []
    for siblings in (False, True):
        out = torch.full_like(case.query, float("nan"))
        po, pl = ra.partial_buffers(case.params)
        b = bound(case, plan, out, po, pl)
        statuses = []
        for j in range(b.num_sibling_sets):
            if siblings:
                statuses.append(b.core_siblings(j))
            else:
                per_core = [b.core(c) for c in b.sibling_cores(j)]
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


def test_bad_block_id_status_and_rows_as_per_core():
    case = Case(np.random.default_rng(3), hq=8, hkv=4, cores=8, q_lens=[1, 1, 1],
                kv_lens=[100, 40, 70])
    case.block_table[1, 1] = 10_000
    (ref, st_ref), (out, st) = run_both(case)
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
