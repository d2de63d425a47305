"""The int8 KV cache in vLLM-Ascend's NZ layout in every consumer.

vLLM-Ascend 0.30 keeps its C8 caches as ``[num_blocks, num_kv_heads, head_dim // 32,
block_size, 32]`` (``vllm_ascend/attention/attention_v1.py``,
``AscendC8AttentionBackendImpl._nz_5d_view``); our consumers take such 5-D int8 caches in place,
the rank telling the layout (`pyruntime.kernels.kv_quant.cache_layout`). The same values in
ND and NZ must give bit-identical outputs from the C reference (the same fp32 rows are
dequantised), close ones from the Triton kernels (interpreter), and both must match the float64
reference. The cases of `tests/test_int8_kv.py` are reused: split units, speculative decode,
chunked prefill, the sliding window with sinks and the soft cap. Bad caches are refused with
the entry points' usual typed errors, before anything is written.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from pyruntime.kernels import kv_quant
from pyruntime.kernels import reference_attention as ra
from pyruntime.workload.reference import reference_attention, relative_error
from tests.test_attention_c import KERNELS, SANITIZE, STRICT, compile_c, skip_without_sanitizers
from tests.test_int8_kv import CASES, DTYPES, TOL_C, TOL_TRITON, VARIANTS, Int8Case, check

D = 64   # two NZ parts per head


def nz_case(name: str, dtype, **kw) -> tuple[Int8Case, Int8Case]:
    """The same problem twice: ND caches, and the NZ copies of the same int8 values."""
    nd = Int8Case(name, dtype, d=kw.pop("d", D), **kw)
    nz = Int8Case.__new__(Int8Case)
    nz.__dict__.update(nd.__dict__)
    nz.key_cache, nz.value_cache = kv_quant.to_nz(nd.key_cache), kv_quant.to_nz(nd.value_cache)
    return nd, nz


def test_to_nz_places_each_element_as_vllm_ascend_does():
    gen = torch.Generator().manual_seed(5)
    nb, bs, h, d = 3, 8, 2, 64
    nd = torch.randint(-128, 128, (nb, bs, h, d), dtype=torch.int8, generator=gen)
    nz = kv_quant.to_nz(nd)
    assert tuple(nz.shape) == (nb, h, d // 32, bs, 32) and nz.is_contiguous()
    flat = nz.reshape(-1)
    for b, t, hh, x in [(0, 0, 0, 0), (2, 7, 1, 63), (1, 3, 0, 33), (2, 5, 1, 31)]:
        at = (((b * h + hh) * (d // 32) + x // 32) * bs + t) * 32 + x % 32
        assert flat[at] == nd[b, t, hh, x]
    assert torch.equal(kv_quant.from_nz(nz), nd)
    with pytest.raises(ValueError, match="head_dim % 32"):
        kv_quant.to_nz(torch.zeros(2, 8, 2, 48, dtype=torch.int8))
    for convert, bad in ((kv_quant.from_nz, nd), (kv_quant.from_nz, torch.zeros(2, 2, 2, 8, 16)),
                         (kv_quant.to_nz, nz), (kv_quant.to_nz, "cache")):
        with pytest.raises(ValueError):
            convert(bad)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_c_nz_is_bit_identical_to_nd_and_matches_float64(dtype, variant):
    for name in CASES:
        nd, nz = nz_case(name, dtype, **VARIANTS[variant])
        out = nz.run_c()
        assert torch.equal(out, nd.run_c()), name
        check(nz, out, TOL_C[dtype])   # the float64 reference reads the NZ caches too
    assert nz_case("decode_split", dtype)[1].split_units() > 0


def test_c_nz_on_every_isa_and_fused_call():
    before = ra.isa_variants()["active"]
    try:
        for isa in ra.isa_variants()["supported"]:
            ra.select_isa(isa)
            for name in ("decode_split", "spec_decode"):
                nd, nz = nz_case(name, torch.bfloat16, sinks=True)
                for how in ("cores", "span", "siblings"):
                    assert torch.equal(nz.run_c(how), nd.run_c(how)), (isa, name, how)
    finally:
        ra.select_isa(before)


def test_float64_reference_reads_nz():
    nd, nz = nz_case("chunked_prefill", torch.float32, sliding_window=13)
    np.testing.assert_array_equal(nz.reference(), nd.reference())
    with pytest.raises(ValueError, match="int8 only"):
        reference_attention(nz.query, nz.key_cache.float(), nz.value_cache.float(),
                            nz.block_table.numpy(), nz.cu.numpy(), nz.kv.numpy(), scale=1.0)


def _bad_caches(nd: Int8Case, nz: Int8Case) -> dict[str, tuple]:
    """name -> (key_cache, value_cache, kv_scales, error type)."""
    k, v, s = nz.key_cache, nz.value_cache, nz.kv_scales
    nb, h, parts, bs, w = k.shape
    return {
        "5-D non-int8": (k.to(nd.dtype), v.to(nd.dtype), None, ValueError),
        "5-D wrong width": (k.reshape(nb, h, parts * 2, bs, w // 2),
                            v.reshape(nb, h, parts * 2, bs, w // 2), s, ValueError),
        "5-D tokens and width swapped": (k.reshape(nb, h, parts, w, bs),
                                         v.reshape(nb, h, parts, w, bs), s, ValueError),
        "mixed layouts": (k, nd.value_cache, s, ValueError),
        "mixed layouts, ND key": (nd.key_cache, v, s, ValueError),
        "value blocks differ": (k, v[:-1].contiguous(), s, ValueError),
        "6-D": (k[None], v[None], s, ValueError),
        "5-D fp16 with scales": (k.half(), v.half(), s, TypeError),
    }


def test_c_refuses_bad_nz_caches_before_writing():
    nd, nz = nz_case("decode_split", torch.float16)
    po, pl = ra.partial_buffers(nz.params)
    for what, (k, v, scales, error) in _bad_caches(nd, nz).items():
        out = torch.full_like(nz.query, 7.0)
        with pytest.raises(error) as caught:
            ra.attention_core(nz.params, nz.plan, 0, query=nz.query, key_cache=k, value_cache=v,
                              block_table=nz.block_table, cu_seqlens_q=nz.cu, seqlens_kv=nz.kv,
                              out=out, partial_out=po, partial_lse=pl, kv_scales=scales)
        assert "cache" in str(caught.value), (what, caught.value)
        assert bool((out == 7.0).all()), what


def test_nz_needs_head_dim_a_multiple_of_32():
    """head_dim 16: a 5-D cache is refused by the shape check (ValueError naming the rule), and
    the C struct with the NZ layout is refused by the kernel itself (E_ARGS, nothing written)."""
    case = Int8Case("decode_split", torch.float32, d=16)
    nb, bs, h, d = case.key_cache.shape
    k5 = case.key_cache.reshape(nb, h, 1, bs, d)   # any 5-D int8 tensor
    po, pl = ra.partial_buffers(case.params)
    out = torch.full_like(case.query, 7.0)
    with pytest.raises(ValueError, match="head_dim % 32 == 0"):
        ra.attention_core(case.params, case.plan, 0, query=case.query, key_cache=k5,
                          value_cache=k5, block_table=case.block_table, cu_seqlens_q=case.cu,
                          seqlens_kv=case.kv, out=out, partial_out=po, partial_lse=pl,
                          kv_scales=case.kv_scales)
    bound = ra.BoundAttention(case.params, case.plan, query=case.query, key_cache=case.key_cache,
                              value_cache=case.value_cache, block_table=case.block_table,
                              cu_seqlens_q=case.cu, seqlens_kv=case.kv, out=out, partial_out=po,
                              partial_lse=pl, kv_scales=case.kv_scales)
    args = list(bound._core_args)
    at = args.index(bound._kv_int8)
    fields = {name: getattr(bound._kv_int8, name)
              for name in ("k_scale", "k_offset", "v_scale", "v_offset")}
    for layout in (ra._lib.AICPU_ATTENTION_KV_NZ, 2, -1):
        args[at] = ra._ffi.new("aicpu_attention_kv_int8 *", {**fields, "layout": layout})
        for core in range(case.params.num_cores):
            assert ra._lib.aicpu_attention_core(bound._c_params, bound._tiling, core,
                                                *args) == ra.E_ARGS, layout
    assert bool((out == 7.0).all())


def test_custom_op_takes_nz_caches():
    """torch.ops.aicpu_tiling.paged_attention (the CPU body) with 5-D caches: no new argument."""
    from pyruntime.kernels import custom_ops, step
    nd, nz = nz_case("decode_split", torch.float16)
    ops = custom_ops.ops()
    outs = []
    for case in (nd, nz):
        out = torch.zeros_like(case.query)
        po, pl = ra.partial_buffers(case.params)
        words = torch.from_numpy(case.plan.buffer).view(torch.uint8)
        epoch = torch.tensor([case.plan.epoch], dtype=torch.int32)
        ops.paged_attention(case.query, case.key_cache, case.value_cache, case.block_table,
                            case.cu, case.kv, epoch, words, out, po, pl,
                            step.params_list(case.params), case.scale, True,
                            k_scale=case.kv_scales[0], k_offset=case.kv_scales[1],
                            v_scale=case.kv_scales[2], v_offset=case.kv_scales[3])
        ops.attention_combine(case.cu, epoch, words, out, po, pl, step.params_list(case.params))
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    check(nz, outs[1], TOL_C[torch.float16])


def _triton_or_skip():
    from pyruntime.kernels import triton_launch
    if triton_launch.available() is not None:
        pytest.skip(str(triton_launch.available()))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_nz_matches_nd_and_float64(dtype):
    _triton_or_skip()
    for name in ("decode_split", "chunked_prefill"):
        nd, nz = nz_case(name, dtype)
        out = nz.run_triton()
        check(nz, out, TOL_TRITON[dtype])
        # the same tiles and casts as ND: equal up to the interpreter's summation order
        assert relative_error(out, nd.run_triton().double().numpy()) <= 1e-6, name
        assert relative_error(out, nd.run_c().double().numpy()) <= TOL_TRITON[dtype]


def test_triton_nz_with_window_sinks_and_soft_cap():
    _triton_or_skip()
    _, nz = nz_case("decode_split", torch.bfloat16, **VARIANTS["window_sinks_cap"])
    check(nz, nz.run_triton(), TOL_TRITON[torch.bfloat16])


def test_triton_refuses_bad_nz_caches_before_launching():
    _triton_or_skip()
    nd, nz = nz_case("decode_split", torch.float16)
    for what, (k, v, scales, error) in _bad_caches(nd, nz).items():
        nz.key_cache, nz.value_cache, nz.kv_scales = k, v, scales
        with pytest.raises(error) as caught:
            nz.run_triton()
        assert "cache" in str(caught.value), (what, caught.value)
    case = Int8Case("decode_split", torch.float32, d=16)
    nb, bs, h, d = case.key_cache.shape
    case.key_cache = case.value_cache = case.key_cache.reshape(nb, h, 1, bs, d)
    with pytest.raises(ValueError, match="head_dim % 32 == 0"):
        case.run_triton()


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "asan-ubsan"])
def test_c_program_nz_equals_nd(tmp_path, sanitize):
    """aicpu_kernels/tests/attention_nz.c: every entry point, variant, dtype, head_dim 32/64/128,
    group, core count and window, NZ against ND bit for bit (partials included), the flag doing
    the work, bad layouts refused; under AddressSanitizer a read outside the exact-size NZ
    caches fails it."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    if sanitize:
        skip_without_sanitizers(tmp_path)
    flags = ["-std=c99", "-pedantic", "-O1" if sanitize else "-O2", *STRICT,
             *(["-g", *SANITIZE] if sanitize else [])]
    binary = compile_c(tmp_path / "nz", [KERNELS / "tests" / "attention_nz.c",
                                         KERNELS / "attention_ref.c", KERNELS / "attention_x86.c",
                                         KERNELS / "aicpu_tiling.c"], flags)
    result = subprocess.run([str(binary)], capture_output=True, text=True, check=False,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"nz: ([a-z0-9 ]+); (\d+) comparisons", result.stdout)
    assert match, result.stdout
    assert match.group(1).split() == ra.isa_variants()["supported"]
    # 3 head dims x 2 groups x 3 core counts x 2 windows x 3 dtypes x 3 entry points per variant
    assert int(match.group(2)) == 324 * len(match.group(1).split())


def test_c8_nz_views_of_vllm_030_strided_caches_read_in_place():
    """C8 on vLLM-Ascend 0.30.0rc2: the int8 caches are strided views of one allocation (K
    and V pages side by side) and ``_nz_5d_view`` keeps that page stride; the C reference
    (every entry point) and the Triton kernels give the contiguous NZ caches' bits."""
    from tests.test_attention_c import vllm_030_kv_views

    for name in ("decode_split", "spec_decode"):
        _, nz = nz_case(name, torch.bfloat16, sinks=True)
        want_c = {how: nz.run_c(how) for how in ("cores", "span", "siblings")}
        want_triton = nz.run_triton()
        nz.key_cache, nz.value_cache = vllm_030_kv_views(nz.key_cache, nz.value_cache)
        assert nz.key_cache.dim() == 5 and not nz.key_cache.is_contiguous()
        for how, out in want_c.items():
            assert torch.equal(nz.run_c(how), out), (name, how)
        assert torch.equal(nz.run_triton(), want_triton), name
