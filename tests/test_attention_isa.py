"""The reference attention's instruction-set variants: choice, forcing, and errors.

Accuracy per variant is covered by tests/test_reference_attention.py, which runs every test
once per variant this machine supports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_reference_attention import Case, check_ok

from pyruntime.kernels import reference_attention as ra

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def restore_variant():
    before = ra.isa_variants()["active"]
    yield
    ra.select_isa(before)


def test_variants_report_names_in_order():
    info = ra.isa_variants()
    assert ra.ISA_NAMES == ("portable", "avx2", "avx512")
    assert "portable" in info["supported"]
    assert info["best"] == info["supported"][-1]
    assert info["active"] in info["supported"]


def test_default_is_the_best_variant(monkeypatch):
    ra.select_isa("portable")
    monkeypatch.delenv(ra.ISA_ENV, raising=False)
    assert ra.select_isa() == ra.isa_variants()["best"] == ra.isa_variants()["active"]


def test_unknown_variant_is_a_typed_error_and_changes_nothing():
    ra.select_isa("portable")
    with pytest.raises(ra.AttentionIsaError, match="known variants are portable, avx2, avx512"):
        ra.select_isa("sse2")
    assert ra.isa_variants()["active"] == "portable"
    assert issubclass(ra.AttentionIsaError, ValueError)


def test_unsupported_variant_is_refused_by_c():
    # the C setter refuses an index it has no table for; the active variant stays
    lib = ra._lib
    before = lib.aicpu_attention_isa_active()
    assert lib.aicpu_attention_set_isa(lib.AICPU_ATTENTION_NUM_ISA) == lib.AICPU_ATTENTION_E_ISA
    assert lib.aicpu_attention_set_isa(-1) == lib.AICPU_ATTENTION_E_ISA
    assert lib.aicpu_attention_isa_active() == before
    assert ra._ffi.NULL == lib.aicpu_attention_isa_name(lib.AICPU_ATTENTION_NUM_ISA)


def _import_with(env_value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), **{ra.ISA_ENV: env_value})
    code = "from pyruntime.kernels import reference_attention as ra; print(ra.isa_variants()['active'])"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=False, timeout=120)


@pytest.mark.parametrize("name", ra.isa_variants()["supported"])
def test_environment_variable_forces_the_variant_at_import(name):
    result = _import_with(name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == name


def test_environment_variable_with_an_unknown_variant_fails_at_import():
    result = _import_with("neon")
    assert result.returncode != 0
    assert "AttentionIsaError" in result.stderr
    assert "AICPU_TILING_ATTENTION_ISA names the attention variant 'neon'" in result.stderr


@pytest.mark.skipif(len(ra.isa_variants()["supported"]) < 2, reason="one variant only")
def test_forced_variant_runs_its_own_code():
    # fp32 with FMA and another summation order: the SIMD variants round differently from the
    # portable loops, so equal bits would mean the setter had no effect (all stay accurate)
    outs = {}
    for name in ra.isa_variants()["supported"]:
        ra.select_isa(name)
        case = Case(np.random.default_rng(7), hq=8, hkv=2, d=128, bs=16, cores=3,
                    q_lens=[1, 1, 5], kv_lens=[300, 77, 90], dtype=torch.float32)
        outs[name] = check_ok(case)
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.equal(outs[a], outs[b]), f"{a} and {b} gave identical bits"
