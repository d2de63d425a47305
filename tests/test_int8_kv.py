"""The int8 KV cache (kv_cache_dtype="int8", vLLM-Ascend's C8) in both AI Core consumers.

Every case quantises random K and V with per-channel scales and nonzero offsets by
vLLM-Ascend's rule (`pyruntime.kernels.kv_quant.quantize`), runs the C reference (every
instruction-set variant) or the Triton kernels (interpreter) on the int8 caches, and compares
with the float64 reference of the dequantised caches, ``(x - offset) * scale``. The cases mix
decode, speculative decode, chunked prefill and padded (zero-length) slots with split units,
alone and with the sliding window, sinks and the soft cap. Each also checks that the answers a
consumer would give by ignoring the offset or the scale are far outside the tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pyruntime import tiling
from pyruntime.kernels import kv_quant
from pyruntime.kernels import reference_attention as ra
from pyruntime.tiling import TilingParams
from pyruntime.workload.reference import reference_attention, relative_error

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: max |out - float64| / max |float64|: fp32 dequantisation and accumulation (C), plus one
#: rounding of K, V and P to the query's dtype before the dot products (Triton), and one of the
#: output
TOL_C = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TOL_TRITON = {torch.float32: 4e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}

CASES = {
    # decode, split over cores (7 cores, 2 kv heads), with a padded zero-length slot
    "decode_split": {"q_lens": (1, 1, 0, 1), "kv_lens": (70, 9, 0, 33), "cores": 7},
    # speculative decode (3 tokens) next to decode
    "spec_decode": {"q_lens": (3, 3, 1), "kv_lens": (40, 20, 9), "cores": 4},
    # chunked prefill (q_tile 4) next to decode and a padded slot
    "chunked_prefill": {"q_lens": (1, 9, 0, 6), "kv_lens": (30, 25, 0, 47), "cores": 5,
                        "q_tile": 4},
}

VARIANTS = {
    "plain": {},
    "window_sinks_cap": {"sliding_window": 13, "sinks": True, "logits_soft_cap": 20.0},
}


class Int8Case:
    """A paged attention problem with int8 caches, its scales and its float64 answer."""

    def __init__(self, name: str, dtype, *, d: int = 16, bs: int = 8, hq: int = 8, hkv: int = 2,
                 sliding_window=None, sinks=False, logits_soft_cap=None, seed: int = 3):
        spec = CASES[name]
        q_lens, kv_lens = spec["q_lens"], spec["kv_lens"]
        rng = np.random.default_rng(seed)
        gen = torch.Generator().manual_seed(seed)
        mbpr = max(-(-k // bs) for k in kv_lens)
        self.params = TilingParams(num_q_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs,
                                   max_batch=len(q_lens) + 1, max_tokens=sum(q_lens) + 3,
                                   max_blocks_per_req=mbpr, num_cores=spec["cores"],
                                   q_tile=spec.get("q_tile"), sliding_window=sliding_window)
        self.cu = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32)
        self.kv = torch.tensor(kv_lens, dtype=torch.int32)
        needed = [-(-k // bs) for k in kv_lens]
        num_blocks = sum(needed) + 2
        ids = rng.permutation(num_blocks).astype(np.int32)
        self.block_table = torch.zeros(self.params.max_batch, mbpr, dtype=torch.int32)
        at = 0
        for r, n in enumerate(needed):
            self.block_table[r, :n] = torch.from_numpy(ids[at:at + n])
            at += n
        self.dtype, self.scale, self.window = dtype, d ** -0.5, sliding_window
        self.soft_cap = logits_soft_cap
        # per-channel scales in [0.04, 0.08] and offsets of either sign, about 15 steps (an
        # offset's worth, offset * scale, is then as large as the values): N(0, 1) values use
        # most of the int8 range and rarely clip
        self.kv_scales = (torch.rand(hkv, d, generator=gen) * 0.04 + 0.04,
                          torch.randn(hkv, d, generator=gen) * 15.0,
                          torch.rand(hkv, d, generator=gen) * 0.04 + 0.04,
                          torch.randn(hkv, d, generator=gen) * 15.0)
        k_scale, k_offset, v_scale, v_offset = self.kv_scales
        shape = (num_blocks, bs, hkv, d)
        self.key_cache = kv_quant.quantize(torch.randn(shape, generator=gen), k_scale, k_offset)
        self.value_cache = kv_quant.quantize(torch.randn(shape, generator=gen), v_scale,
                                             v_offset)
        self.query = torch.randn(self.params.max_tokens, hq, d, generator=gen).to(dtype)
        self.query[int(self.cu[-1]):] = 0
        self.sinks = (torch.randn(hq, generator=gen) + 2.0) if sinks else None
        self.plan = tiling.plan(self.params, self.cu.numpy(), self.kv.numpy(), causal=True)

    def reference(self, kv_scales=None) -> np.ndarray:
        return reference_attention(self.query, self.key_cache, self.value_cache,
                                   self.block_table.numpy(), self.cu.numpy(), self.kv.numpy(),
                                   scale=self.scale, logits_soft_cap=self.soft_cap,
                                   sinks=self.sinks, sliding_window=self.window,
                                   kv_scales=self.kv_scales if kv_scales is None else kv_scales)

    def wrong_answers(self) -> dict[str, np.ndarray]:
        """The float64 answers of a consumer that ignores the offsets or the scales."""
        k_scale, k_offset, v_scale, v_offset = self.kv_scales
        one = torch.ones_like(k_scale)
        return {"no offset": self.reference((k_scale, 0 * k_offset, v_scale, 0 * v_offset)),
                "no scale": self.reference((one, k_offset, one, v_offset))}

    def split_units(self) -> int:
        return int(self.plan.buffer[tiling.lib.AICPU_TILING_HDR_NUM_COMBINE])

    def run_c(self, how: str = "cores") -> torch.Tensor:
        out = torch.full_like(self.query, float("nan"))
        po, pl = ra.partial_buffers(self.params)
        bound = ra.BoundAttention(self.params, self.plan, query=self.query,
                                  key_cache=self.key_cache, value_cache=self.value_cache,
                                  block_table=self.block_table, cu_seqlens_q=self.cu,
                                  seqlens_kv=self.kv, out=out, partial_out=po, partial_lse=pl,
                                  scale=self.scale, logits_soft_cap=self.soft_cap,
                                  sinks=self.sinks, sliding_window=self.window,
                                  kv_scales=self.kv_scales)
        if how == "span":
            statuses = [bound.core_span(0, self.params.num_cores)]
        elif how == "siblings":
            statuses = [bound.core_siblings(j) for j in range(bound.num_sibling_sets)]
        else:
            statuses = [bound.core(c) for c in range(self.params.num_cores)]
        assert statuses == [0] * len(statuses), [ra.strerror(s) for s in statuses]
        assert bound.finalize() == 0
        return out

    def run_triton(self) -> torch.Tensor:
        from pyruntime.kernels import triton_launch
        out = torch.full_like(self.query, float("nan"))
        po, pl = ra.partial_buffers(self.params)
        words = torch.from_numpy(self.plan.buffer)
        epoch = torch.tensor([self.plan.epoch], dtype=torch.int32)
        status = triton_launch.launch_attention(
            self.params, tiling_in=words, step_epoch=epoch, query=self.query,
            key_cache=self.key_cache, value_cache=self.value_cache, block_table=self.block_table,
            cu_seqlens_q=self.cu, seqlens_kv=self.kv, out=out, partial_out=po, partial_lse=pl,
            scale=self.scale, causal=True, logits_soft_cap=self.soft_cap, sinks=self.sinks,
            sliding_window=self.window, kv_scales=self.kv_scales)
        combined = triton_launch.launch_combine(self.params, tiling_in=words, step_epoch=epoch,
                                                cu_seqlens_q=self.cu, out=out, partial_out=po,
                                                partial_lse=pl, sinks=self.sinks)
        assert status.tolist() == [0] * self.params.num_cores
        assert set(combined.tolist()) == {0}
        return out


def check(case: Int8Case, out: torch.Tensor, tol: float) -> None:
    ref = case.reference()
    assert not torch.isnan(out).any(), "some output row was never written"
    err = relative_error(out, ref)
    assert err <= tol, err
    for what, wrong in case.wrong_answers().items():
        # a consumer making that mistake would be far outside the tolerance
        assert relative_error(torch.from_numpy(wrong), ref) > 10 * tol, what


@pytest.fixture(params=ra.isa_variants()["supported"])
def isa(request):
    before = ra.isa_variants()["active"]
    ra.select_isa(request.param)
    yield request.param
    ra.select_isa(before)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_c_reference_matches_float64_on_every_isa(isa, dtype, variant):
    for name in CASES:
        case = Int8Case(name, dtype, d=64, **VARIANTS[variant])
        check(case, case.run_c(), TOL_C[dtype])
    assert Int8Case("decode_split", dtype).split_units() > 0


def test_c_fused_calls_match_the_per_core_loop():
    for name in CASES:
        case = Int8Case(name, torch.float32, d=64, sinks=True)
        per_core = case.run_c()
        for how in ("span", "siblings"):
            torch.testing.assert_close(case.run_c(how), per_core, rtol=2e-6, atol=2e-6)


def test_c_bad_kv_scales_raise():
    case = Int8Case("decode_split", torch.float16)
    po, pl = ra.partial_buffers(case.params)
    args = {"query": case.query, "key_cache": case.key_cache, "value_cache": case.value_cache,
            "block_table": case.block_table, "cu_seqlens_q": case.cu, "seqlens_kv": case.kv,
            "out": torch.empty_like(case.query), "partial_out": po, "partial_lse": pl}
    k_scale = case.kv_scales[0]
    for bad in (case.kv_scales[:3], (k_scale.double(),) + case.kv_scales[1:],
                (k_scale[:1],) + case.kv_scales[1:], "int8"):
        with pytest.raises(ValueError):
            ra.attention_core(case.params, case.plan, 0, kv_scales=bad, **args)
    with pytest.raises(TypeError):   # int8 caches without their scales
        ra.attention_core(case.params, case.plan, 0, **args)


def test_quantize_is_vllm_ascends_rule():
    """round(x / scale + offset), clamped to int8, and (x - offset) * scale back."""
    x = torch.tensor([[0.0, 1.0, -1.0, 100.0, -100.0, 0.0749]])
    scale, offset = torch.full_like(x, 0.1), torch.tensor([[3.0, 0.0, 0.0, 0.0, 0.0, -2.0]])
    q = kv_quant.quantize(x, scale, offset)
    assert q.tolist() == [[3, 10, -10, 127, -128, -1]]
    back = kv_quant.dequantize(q, scale, offset)
    torch.testing.assert_close(back, torch.tensor([[0.0, 1.0, -1.0, 12.7, -12.8, 0.1]],
                                                  dtype=torch.float64))
    assert kv_quant.check("int8") == "int8"
    for bad in ("fp8", "float16", None, 8):
        with pytest.raises(ValueError):
            kv_quant.check(bad)


def _triton_or_skip():
    from pyruntime.kernels import triton_launch
    if triton_launch.available() is not None:
        pytest.skip(str(triton_launch.available()))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_matches_float64_and_the_c_reference(dtype):
    _triton_or_skip()
    for name in CASES:
        case = Int8Case(name, dtype)
        out = case.run_triton()
        check(case, out, TOL_TRITON[dtype])
        c_out = case.run_c()
        assert relative_error(out, c_out.double().numpy()) <= TOL_TRITON[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_with_window_sinks_and_soft_cap(dtype):
    _triton_or_skip()
    for name in ("decode_split", "chunked_prefill"):
        case = Int8Case(name, dtype, **VARIANTS["window_sinks_cap"])
        check(case, case.run_triton(), TOL_TRITON[dtype])


def test_triton_checks_the_int8_arguments():
    _triton_or_skip()
    case = Int8Case("decode_split", torch.float16)
    with pytest.raises(ValueError):
        case.kv_scales = case.kv_scales[:3]
        case.run_triton()
    case = Int8Case("decode_split", torch.float16)
    case.key_cache = case.key_cache.to(torch.float16)   # int8 scales with an fp16 cache
    with pytest.raises(TypeError):
        case.run_triton()


def test_c_refuses_an_incomplete_scale_struct():
    """The C entry points check the struct themselves: a NULL scale or offset is E_ARGS, and
    nothing is written."""
    case = Int8Case("decode_split", torch.float32)
    out = torch.full_like(case.query, 7.0)
    po, pl = ra.partial_buffers(case.params)
    bound = ra.BoundAttention(case.params, case.plan, query=case.query, key_cache=case.key_cache,
                              value_cache=case.value_cache, block_table=case.block_table,
                              cu_seqlens_q=case.cu, seqlens_kv=case.kv, out=out, partial_out=po,
                              partial_lse=pl, kv_scales=case.kv_scales)
    args = list(bound._core_args)
    at = args.index(bound._kv_int8)
    for missing in ("k_scale", "k_offset", "v_scale", "v_offset"):
        fields = {name: getattr(bound._kv_int8, name)
                  for name in ("k_scale", "k_offset", "v_scale", "v_offset")}
        fields[missing] = ra._ffi.NULL
        args[at] = ra._ffi.new("aicpu_attention_kv_int8 *", fields)
        for core in range(case.params.num_cores):
            status = ra._lib.aicpu_attention_core(bound._c_params, bound._tiling, core, *args)
            assert status == ra.E_ARGS, missing
        assert ra._lib.aicpu_attention_core_span(bound._c_params, bound._tiling, 0,
                                                 case.params.num_cores, *args) == ra.E_ARGS
    assert bool((out == 7.0).all())
