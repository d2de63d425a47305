"""The twin's ops of a dense decoder's forward (`pyruntime.npu_twin.model_ops`, and FIA in TND
with contiguous K/V for prefill): their schemas against the torch_npu wheel (read as a zip),
their numerics against independent float32/float64 formulas written here, the errors
torch_npu's docs make of what they forbid, their fake kernels under FakeTensor, and their
capture and replay like any AI Core task (each script runs on a fresh twin)."""

from __future__ import annotations

import re

import pytest

from pyruntime.npu_twin import model_ops
from tests.wheels import TORCH_NPU_WHEEL, read_wheel_file


@pytest.fixture(scope="module")
def wheel_files() -> dict[str, bytes]:
    names = ("torch_npu/_op_plugin_docs.py", "torch_npu/lib/libtorch_npu.so",
             "torch_npu/lib/libop_plugin_atb.so", "torch_npu/op_plugin/atb/_atb_ops.py")
    return {name.rsplit("/", 1)[1]: read_wheel_file(TORCH_NPU_WHEEL, name) for name in names}


@pytest.mark.parametrize("name", sorted(model_ops.NPU_SCHEMAS))
def test_npu_schemas_are_the_ones_libtorch_npu_registers(name, wheel_files):
    schema = model_ops.NPU_SCHEMAS[name]
    assert schema.encode() + b"\0" in wheel_files["libtorch_npu.so"]
    # and the docs have the op's entry (the rules' source), the same prototype up to the first
    # argument's name (self / input) and npu_mrope's mrope_section default
    docs = wheel_files["_op_plugin_docs.py"].decode()
    if name != "npu_add_rms_norm":  # documented only through its meta kernel and fused kin
        assert re.search(rf"^torch_npu\.{name}\(", docs, re.MULTILINE), name


@pytest.mark.parametrize("name", sorted(model_ops.ATB_SCHEMAS))
def test_atb_schemas_are_the_ones_libop_plugin_atb_registers(name, wheel_files):
    assert model_ops.ATB_SCHEMAS[name].encode() + b"\0" in wheel_files["libop_plugin_atb.so"]
    # torch_npu sets them on the module from torch.ops.atb (_atb_ops.py's API_LIST)
    assert f"'{name}'".encode() in wheel_files["_atb_ops.py"]


COMMON = '''
import math
import numpy as np
import torch_npu
from pyruntime.npu_twin import model_ops
from pyruntime.npu_twin.model_ops import ModelOpError
from pyruntime.npu_twin.npu_module import NotInTwinError
from pyruntime.npu_twin.device import HostPointerError

gen = torch.Generator().manual_seed(0)
dev = "npu"


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def close(got, want, tol):
    got, want = got.detach().cpu().double(), want.double()
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"shape {tuple(got.shape)}, want {tuple(want.shape)}")
    err = float((got - want).abs().max()) if got.numel() else 0.0
    if not err <= tol * max(1.0, float(want.abs().max())):
        raise AssertionError(f"max error {err} over {tol}")


def synced(fn):
    def run():
        fn()
        torch.npu.synchronize()
    return run


# independent formulas (float32 on the host, not the twin's code)
def rms(x, g, eps):
    x = x.float()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * g.float()


def rope_neox(x, cos, sin, head):
    t = x.shape[0]
    h = x.float().reshape(t, -1, head)
    half = cos.shape[-1]
    r, p = h[..., : 2 * half], h[..., 2 * half:]
    c, s = cos[:, None].float(), sin[:, None].float()
    rotated = torch.cat((-r[..., half:], r[..., :half]), -1)
    out = r * torch.cat((c, c), -1) + rotated * torch.cat((s, s), -1)
    return torch.cat((out, p), -1).reshape(x.shape)


def rope_gptj(x, cos, sin, head):
    t = x.shape[0]
    h = x.float().reshape(t, -1, head)
    half = cos.shape[-1]
    z = torch.view_as_complex(h[..., : 2 * half].reshape(t, h.shape[1], half, 2).contiguous())
    turn = torch.polar(torch.ones_like(cos.float()), torch.atan2(sin.float(), cos.float()))
    out = torch.view_as_real(z * turn[:, None]).reshape(t, h.shape[1], 2 * half)
    return torch.cat((out, h[..., 2 * half:]), -1).reshape(x.shape)


def attention(q, k, v, q_ends, kv_ends, scale, window=None):
    """Causal GQA per request in float64, the query rows at the end of each request's keys."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for r in range(len(q_ends)):
        q0, q1 = (q_ends[r - 1] if r else 0), q_ends[r]
        k0, k1 = (kv_ends[r - 1] if r else 0), kv_ends[r]
        qq = q[q0:q1].double()
        kk = k[k0:k1].double().repeat_interleave(group, 1)
        vv = v[k0:k1].double().repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", qq, kk) * scale
        at = (k1 - k0) - (q1 - q0) + torch.arange(q1 - q0)[:, None]
        pos = torch.arange(k1 - k0)[None, :]
        mask = pos > at
        if window is not None:
            mask |= pos < at - window
        s = s.masked_fill(mask, float("-inf"))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", s.softmax(-1), vv)
    return out
'''

NUMERICS = COMMON + '''
def rms_norm(dtype, tol):
    x, g = rand(5, 3, 64, dtype=dtype), rand(64, dtype=dtype)  # Qwen3's q norm: [T, heads, D]
    y, rstd = torch_npu.npu_rms_norm(x.to(dev), g.to(dev), 1e-6)
    assert y.dtype == dtype and rstd.dtype == torch.float32 and tuple(rstd.shape) == (5, 3, 1)
    close(y, rms(x, g, 1e-6), tol)
    close(rstd, 1 / torch.sqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6), 1e-5)


def add_rms_norm(dtype, tol):
    a, b, g = rand(7, 96, dtype=dtype), rand(7, 96, dtype=dtype), rand(96, dtype=dtype)
    y, rstd, s = torch_npu.npu_add_rms_norm(a.to(dev), b.to(dev), g.to(dev), 1e-5)
    want_sum = a.float() + b.float()
    close(s, want_sum, tol)
    close(y, rms(want_sum, g, 1e-5), tol)
    assert tuple(rstd.shape) == (7, 1) and y.dtype == s.dtype == dtype


def swiglu(dtype, tol):
    x = rand(6, 2 * 40, dtype=dtype)
    out = torch_npu.npu_swiglu(x.to(dev))
    gate, up = x.float()[:, :40], x.float()[:, 40:]
    close(out, gate * torch.sigmoid(gate) * up, tol)
    x3 = rand(2, 8, 3, dtype=dtype)
    close(torch_npu.npu_swiglu(x3.to(dev), dim=1), torch.nn.functional.silu(x3.float()[:, :4])
          * x3.float()[:, 4:], tol)


def cos_sin_cache(rows, rotary_dim, dtype):
    freqs = torch.arange(rows)[:, None] * 10000 ** (-torch.arange(rotary_dim // 2) / (rotary_dim // 2))
    return torch.cat((freqs.cos(), freqs.sin()), -1).to(dtype)


def mrope(dtype, tol, rotary_dim, mode):
    head, t = 64, 5
    cache = cos_sin_cache(32, rotary_dim, dtype)
    pos = torch.tensor([0, 7, 3, 31, 12])
    q, k = rand(t, 4 * head, dtype=dtype), rand(t, 2 * head, dtype=dtype)
    qo, ko = torch_npu.npu_mrope(pos.to(dev), q.to(dev), k.to(dev), cache.to(dev), head,
                                 mrope_section=[0, 0, 0], rotary_mode=mode, cache_mode="default")
    cos, sin = cache.float()[pos].chunk(2, -1)
    formula = rope_neox if mode == "half" else rope_gptj
    close(qo, formula(q, cos, sin, head), tol)
    close(ko, formula(k, cos, sin, head), tol)
    assert qo.dtype == dtype and tuple(qo.shape) == tuple(q.shape)


def rotary_atb(neox):
    head = 64
    cache = cos_sin_cache(16, head, torch.bfloat16)
    pos = torch.tensor([3, 0, 15])
    q, k = rand(3, 2 * head, dtype=torch.bfloat16), rand(3, head, dtype=torch.bfloat16)
    qd, kd = q.to(dev), k.to(dev)
    assert torch_npu._npu_rotary_embedding(pos.to(dev), qd, kd, head, cache.to(dev), neox) is None
    cos, sin = cache.float()[pos].chunk(2, -1)
    formula = rope_neox if neox else rope_gptj
    close(qd, formula(q, cos, sin, head), 1e-2)
    close(kd, formula(k, cos, sin, head), 1e-2)


NB, BS, HKV, D = 6, 8, 2, 16


def strided_caches(dtype):
    """vLLM-Ascend 0.30's layout: one allocation, K and V pages of a block side by side."""
    base = torch.zeros(NB, 2, BS, HKV, D, dtype=dtype, device=dev)
    page = BS * HKV * D
    stride = (2 * page, HKV * D, D, 1)
    return base, (base.as_strided((NB, BS, HKV, D), stride, 0),
                  base.as_strided((NB, BS, HKV, D), stride, page))


def scatter_strided():
    base, (kc, vc) = strided_caches(torch.bfloat16)
    key, value = rand(4, HKV, D, dtype=torch.bfloat16), rand(4, HKV, D, dtype=torch.bfloat16)
    slots = torch.tensor([0, 9, 47, 20], dtype=torch.int32)
    torch_npu.npu_scatter_pa_kv_cache(key=key.to(dev), value=value.to(dev), key_cache=kc,
                                      value_cache=vc, slot_mapping=slots.to(dev),
                                      cache_mode="Norm")
    want = torch.zeros(NB, 2, BS, HKV, D)
    for i, slot in enumerate(slots.tolist()):
        want[slot // BS, 0, slot % BS] = key[i].float()
        want[slot // BS, 1, slot % BS] = value[i].float()
    close(base, want, 0)  # every other byte of the allocation untouched


def reshape_and_cache_atb():
    kc = torch.zeros(NB, BS, HKV, D, device=dev)
    vc = torch.zeros(NB, BS, HKV, D + 8, device=dev)  # V's head dim may differ
    key, value = rand(3, HKV, D), rand(3, HKV, D + 8)
    slots = torch.tensor([5, 40, 8], dtype=torch.int32)
    torch_npu._npu_reshape_and_cache(key=key.to(dev), value=value.to(dev), key_cache=kc,
                                     value_cache=vc, slot_indices=slots.to(dev))
    want_k, want_v = torch.zeros(NB, BS, HKV, D), torch.zeros(NB, BS, HKV, D + 8)
    for i, slot in enumerate(slots.tolist()):
        want_k[slot // BS, slot % BS], want_v[slot // BS, slot % BS] = key[i], value[i]
    close(kc, want_k, 0)
    close(vc, want_v, 0)


def matmul_add():
    # NPUWorker._warm_up_atb's call
    x, w = torch.rand(2, 4, dtype=torch.float16), torch.rand(2, 4, dtype=torch.float16)
    c = torch.rand(4, 4)
    cd = c.to(dev)
    torch_npu._npu_matmul_add_fp32(x.to(dev), w.to(dev), cd)
    close(cd, c + x.float().t() @ w.float(), 1e-6)


MASK = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)


def prefill(dtype, tol):
    # vLLM-Ascend's PrefillNoCache: TND, contiguous K/V, cumulative q and kv ends, sparse 3
    hq, d, ends = 4, 64, [3, 8, 9]
    q, k, v = rand(9, hq, d, dtype=dtype), rand(9, HKV, d, dtype=dtype), rand(9, HKV, d, dtype=dtype)
    out, _ = torch_npu.npu_fused_infer_attention_score(
        query=q.to(dev), key=k.to(dev), value=v.to(dev), atten_mask=MASK.to(dev),
        block_table=None, input_layout="TND", block_size=128, actual_seq_lengths=ends,
        actual_seq_lengths_kv=ends, num_key_value_heads=HKV, num_heads=hq, scale=d ** -0.5,
        sparse_mode=3)
    assert out.dtype == dtype
    close(out, attention(q, k, v, ends, ends, d ** -0.5), tol)


def prefill_window_sinks():
    # gpt-oss's sliding-window prefill: FIA v2 TND, contiguous K/V, sparse 4, learnable sinks
    hq, d, ends, window = 4, 64, [6, 10], 2
    q, k, v = rand(10, hq, d), rand(10, HKV, d), rand(10, HKV, d)
    sink = torch.zeros(hq, dtype=torch.bfloat16)  # exp(0 - m) in the denominator
    out, _ = torch_npu.npu_fused_infer_attention_score_v2(
        q.to(dev), k.to(dev), v.to(dev), num_query_heads=hq, num_key_value_heads=HKV,
        input_layout="TND", pre_tokens=window, next_tokens=0, atten_mask=MASK.to(dev),
        sparse_mode=4, softmax_scale=d ** -0.5, block_table=None, block_size=128,
        actual_seq_qlen=ends, actual_seq_kvlen=ends, learnable_sink=sink.to(dev))
    # the sink as one more key with logit 0 and value 0 per head
    group = hq // HKV
    want = torch.zeros(10, hq, d, dtype=torch.float64)
    for r, (q0, q1) in enumerate(((0, 6), (6, 10))):
        s = torch.einsum("qhd,khd->hqk", q[q0:q1].double(),
                         k[q0:q1].double().repeat_interleave(group, 1)) * d ** -0.5
        at, pos = torch.arange(q1 - q0)[:, None], torch.arange(q1 - q0)[None, :]
        s = s.masked_fill((pos > at) | (pos < at - window), float("-inf"))
        s = torch.cat((s, torch.zeros(hq, q1 - q0, 1, dtype=torch.float64)), -1)
        p = s.softmax(-1)[..., :-1]
        want[q0:q1] = torch.einsum("hqk,khd->qhd", p, v[q0:q1].double().repeat_interleave(group, 1))
    close(out, want, 1e-5)


def arange_on_device():
    # vLLM's rotary layers build their cos_sin_cache with torch.arange under torch.device("npu")
    eq(torch.arange(10, device=dev).cpu().tolist(), list(range(10)))
    eq(torch.arange(1, 2, 0.25, device=dev).cpu().tolist(), [1.0, 1.25, 1.5, 1.75])
    eq(torch.arange(3, 7, dtype=torch.int32, device="npu:1").device, torch.device("npu", 1))
    with torch.device(dev):
        inv = 1.0 / (10000 ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))
    eq(inv.device.type, "npu")
    close(inv, 1.0 / (10000 ** (torch.tensor([0.0, 2.0, 4.0, 6.0]) / 8)), 1e-6)


check("arange_on_device", arange_on_device)
def under_inference_mode():
    # vLLM's execute_model runs the forward under torch.inference_mode
    with torch.inference_mode():
        rms_norm(torch.bfloat16, 1e-2)
        scatter_strided()
        prefill(torch.bfloat16, 2e-2)


check("rms_norm_float32", lambda: rms_norm(torch.float32, 1e-5))
check("rms_norm_bfloat16", lambda: rms_norm(torch.bfloat16, 1e-2))
check("add_rms_norm_float32", lambda: add_rms_norm(torch.float32, 1e-5))
check("add_rms_norm_float16", lambda: add_rms_norm(torch.float16, 2e-3))
check("swiglu_float32", lambda: swiglu(torch.float32, 1e-5))
check("swiglu_bfloat16", lambda: swiglu(torch.bfloat16, 1e-2))
check("mrope_half_full_float32", lambda: mrope(torch.float32, 1e-5, 64, "half"))
check("mrope_half_partial_bfloat16", lambda: mrope(torch.bfloat16, 1e-2, 32, "half"))
check("mrope_interleave_float32", lambda: mrope(torch.float32, 1e-5, 64, "interleave"))
check("rotary_atb_neox", lambda: rotary_atb(True))
check("rotary_atb_gptj", lambda: rotary_atb(False))
check("scatter_pa_kv_cache_into_strided_pages", scatter_strided)
check("reshape_and_cache_atb", reshape_and_cache_atb)
check("matmul_add_fp32", matmul_add)
def prefill_window():
    # a sliding-window layer's prefill (FIA v1, TND contiguous, sparse 4: W + 1 keys)
    hq, d, ends, window = 4, 32, [5, 9], 2
    q, k, v = rand(9, hq, d), rand(9, HKV, d), rand(9, HKV, d)
    out, _ = torch_npu.npu_fused_infer_attention_score(
        query=q.to(dev), key=k.to(dev), value=v.to(dev), atten_mask=MASK.to(dev),
        input_layout="TND", block_size=128, actual_seq_lengths=ends, actual_seq_lengths_kv=ends,
        num_key_value_heads=HKV, num_heads=hq, scale=d ** -0.5, pre_tokens=window,
        next_tokens=0, sparse_mode=4)
    close(out, attention(q, k, v, ends, ends, d ** -0.5, window=window), 1e-5)


check("fia_prefill_window_contiguous", prefill_window)
check("fia_prefill_contiguous_float32", lambda: prefill(torch.float32, 1e-5))
check("fia_prefill_contiguous_bfloat16", lambda: prefill(torch.bfloat16, 2e-2))
check("fia_v2_prefill_window_sinks", prefill_window_sinks)
check("under_inference_mode", under_inference_mode)
'''

RULES = COMMON + '''
x, g = rand(4, 64).to(dev), rand(64).to(dev)
check("rms_norm_int_refused", lambda: expect(
    ModelOpError, "float16, bfloat16, float32",
    lambda: torch_npu.npu_rms_norm(x.to(torch.int32), g.to(torch.int32))))
check("rms_norm_1d_refused", lambda: expect(
    ModelOpError, "2 to 8 dims", lambda: torch_npu.npu_rms_norm(g, g)))
check("rms_norm_gamma_dtype_refused", lambda: expect(
    ModelOpError, "gamma must have", lambda: torch_npu.npu_rms_norm(x, g.bfloat16())))
check("rms_norm_gamma_shape_refused", lambda: expect(
    ModelOpError, "trailing dims", lambda: torch_npu.npu_rms_norm(x, rand(32).to(dev))))
check("rms_norm_host_gamma_refused", lambda: expect(
    HostPointerError, "gamma is a cpu tensor", lambda: torch_npu.npu_rms_norm(x, rand(64))))
check("add_rms_norm_shapes_refused", lambda: expect(
    ModelOpError, "one shape", lambda: torch_npu.npu_add_rms_norm(x, rand(2, 64).to(dev), g)))
check("swiglu_odd_refused", lambda: expect(
    ModelOpError, "two halves", lambda: torch_npu.npu_swiglu(rand(3, 5).to(dev))))
check("swiglu_dim_refused", lambda: expect(
    ModelOpError, "out of range", lambda: torch_npu.npu_swiglu(x, dim=2)))

pos = torch.tensor([0, 1, 2]).to(dev)
q, k = rand(3, 128, dtype=torch.bfloat16).to(dev), rand(3, 64, dtype=torch.bfloat16).to(dev)
cache = rand(8, 64, dtype=torch.bfloat16).to(dev)


def mrope(**over):
    kw = dict(positions=pos, query=q, key=k, cos_sin_cache=cache, head_size=64,
              mrope_section=[0, 0, 0], rotary_mode="half", cache_mode="default")
    kw.update(over)
    args = [kw.pop(n) for n in ("positions", "query", "key", "cos_sin_cache", "head_size")]
    return torch_npu.npu_mrope(*args, **kw)


check("mrope_rotary_dim_multiple_refused", lambda: expect(
    ModelOpError, "multiple of 32", lambda: mrope(cos_sin_cache=rand(8, 48, dtype=torch.bfloat16).to(dev))))
check("mrope_3d_query_refused", lambda: expect(
    ModelOpError, "query must be 2-D", lambda: mrope(query=q.view(3, 2, 64))))
check("mrope_mode_refused", lambda: expect(
    ModelOpError, "'half' or 'interleave'", lambda: mrope(rotary_mode="interleaved")))
check("mrope_dtype_mix_refused", lambda: expect(
    ModelOpError, "one dtype", lambda: mrope(cos_sin_cache=cache.float())))
check("mrope_section_not_modelled", lambda: expect(
    NotInTwinError, "mrope mode", lambda: mrope(mrope_section=[16, 8, 8])))
check("mrope_float_positions_refused", lambda: expect(
    ModelOpError, "int32, int64", lambda: mrope(positions=pos.float())))
check("mrope_position_past_cache_faults_at_sync", lambda: expect(
    ModelOpError, "out of the cos_sin_cache", synced(lambda: mrope(positions=pos + 6))))
check("device_runs_on_after_a_fault", synced(lambda: mrope()))
check("rotary_atb_partial_not_modelled", lambda: expect(
    NotInTwinError, "rotary dim 32", lambda: torch_npu._npu_rotary_embedding(
        pos, q, k, 64, rand(8, 32, dtype=torch.bfloat16).to(dev), True)))

kc, vc = torch.zeros(4, 8, 2, 16, device=dev), torch.zeros(4, 8, 2, 16, device=dev)
key, value = rand(3, 2, 16).to(dev), rand(3, 2, 16).to(dev)
slots = torch.tensor([1, 2, 3], dtype=torch.int32).to(dev)


def scatter(**over):
    kw = dict(key=key, value=value, key_cache=kc, value_cache=vc, slot_mapping=slots,
              cache_mode="Norm")
    kw.update(over)
    return torch_npu.npu_scatter_pa_kv_cache(**kw)


check("scatter_nz_not_modelled", lambda: expect(
    NotInTwinError, "'PA_NZ'", lambda: scatter(cache_mode="PA_NZ")))
check("scatter_dtype_mix_refused", lambda: expect(
    ModelOpError, "one dtype", lambda: scatter(value=value.bfloat16())))
check("scatter_slot_dtype_refused", lambda: expect(
    ModelOpError, "int32, int64", lambda: scatter(slot_mapping=slots.float())))
check("scatter_slot_count_refused", lambda: expect(
    ModelOpError, "one slot per token", lambda: scatter(slot_mapping=slots[:2])))
check("scatter_row_shape_refused", lambda: expect(
    ModelOpError, "must hold rows", lambda: scatter(key_cache=torch.zeros(4, 8, 1, 32, device=dev))))
check("scatter_noncontiguous_key_refused", lambda: expect(
    ModelOpError, "key must be contiguous", lambda: scatter(key=rand(2, 3, 16).to(dev).transpose(0, 1))))
check("scatter_transposed_cache_refused", lambda: expect(
    ModelOpError, "dense pages", lambda: scatter(
        key_cache=torch.zeros(4, 2, 8, 16, device=dev).transpose(1, 2))))
check("scatter_slot_past_cache_faults_at_sync", lambda: expect(
    ModelOpError, "outside [0, 31]", synced(lambda: scatter(
        slot_mapping=torch.tensor([1, 32, 3], dtype=torch.int32).to(dev)))))


def scatter_negative_slot_skipped():
    # the kernel skips a negative slot (vLLM's padding -1) and writes the others
    k_cache, v_cache = torch.zeros(4, 8, 2, 16, device=dev), torch.zeros(4, 8, 2, 16, device=dev)
    scatter(key_cache=k_cache, value_cache=v_cache,
            slot_mapping=torch.tensor([-1, 9, 3], dtype=torch.int32).to(dev))
    got_k, got_v = k_cache.cpu(), v_cache.cpu()
    want_k, want_v = torch.zeros(4, 8, 2, 16), torch.zeros(4, 8, 2, 16)
    hk, hv = key.cpu(), value.cpu()
    want_k[1, 1], want_v[1, 1], want_k[0, 3], want_v[0, 3] = hk[1], hv[1], hk[2], hv[2]
    eq((torch.equal(got_k, want_k), torch.equal(got_v, want_v)), (True, True))


check("scatter_negative_slot_writes_nothing", scatter_negative_slot_skipped)


def reshape_and_cache_negative_slot_skipped():
    k_cache, v_cache = torch.zeros(4, 8, 2, 16, device=dev), torch.zeros(4, 8, 2, 16, device=dev)
    torch_npu._npu_reshape_and_cache(key, value, k_cache, v_cache,
                                     torch.tensor([5, -1, 30], dtype=torch.int32).to(dev))
    want_k, want_v = torch.zeros(4, 8, 2, 16), torch.zeros(4, 8, 2, 16)
    hk, hv = key.cpu(), value.cpu()
    want_k[0, 5], want_v[0, 5], want_k[3, 6], want_v[3, 6] = hk[0], hv[0], hk[2], hv[2]
    eq((torch.equal(k_cache.cpu(), want_k), torch.equal(v_cache.cpu(), want_v)), (True, True))


check("reshape_and_cache_negative_slot_writes_nothing", reshape_and_cache_negative_slot_skipped)
check("reshape_and_cache_int64_not_modelled", lambda: expect(
    NotInTwinError, "int64", lambda: torch_npu._npu_reshape_and_cache(
        key, value, kc, vc, slots.long())))
check("matmul_add_c_dtype_refused", lambda: expect(
    ModelOpError, "C must be one of float32", lambda: torch_npu._npu_matmul_add_fp32(
        rand(2, 4, dtype=torch.float16).to(dev), rand(2, 4, dtype=torch.float16).to(dev),
        torch.zeros(4, 4, dtype=torch.float16, device=dev))))
check("matmul_add_shapes_refused", lambda: expect(
    ModelOpError, "do not fit", lambda: torch_npu._npu_matmul_add_fp32(
        rand(2, 4, dtype=torch.float16).to(dev), rand(3, 4, dtype=torch.float16).to(dev),
        torch.zeros(4, 4, device=dev))))

MASK = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1).to(dev)
qf, kf = rand(5, 4, 64).to(dev), rand(5, 2, 64).to(dev)


def prefill(**over):
    kw = dict(query=qf, key=kf, value=kf, atten_mask=MASK, input_layout="TND", block_size=128,
              actual_seq_lengths=[2, 5], actual_seq_lengths_kv=[2, 5], num_key_value_heads=2,
              num_heads=4, scale=0.125, sparse_mode=3)
    kw.update(over)
    return torch_npu.npu_fused_infer_attention_score(**kw)


check("fia_prefill_runs", synced(prefill))
check("fia_prefill_lengths_not_cumulative_refused", lambda: expect(
    RuntimeError, "must be cumulative", synced(lambda: prefill(actual_seq_lengths_kv=[3, 2]))))
check("fia_prefill_kv_past_key_refused", lambda: expect(
    RuntimeError, "past the key's 5 rows", synced(lambda: prefill(actual_seq_lengths_kv=[2, 6]))))
check("fia_prefill_kv_heads_refused", lambda: expect(
    RuntimeError, "[T_kv, KV_N=2, D]", synced(lambda: prefill(key=rand(5, 4, 64).to(dev)))))
check("fia_prefill_needs_the_mask", lambda: expect(
    RuntimeError, "(2048, 2048)", synced(lambda: prefill(atten_mask=None))))
check("fia_bnsd_without_pages_not_modelled", lambda: expect(
    NotInTwinError, "input_layout='BNSD' with paged", synced(lambda: prefill(
        input_layout="BNSD"))))

# the fake kernels (the wheel's meta kernels): FakeTensor, as Dynamo traces the model
from torch._subclasses.fake_tensor import FakeTensorMode


def fakes():
    with FakeTensorMode():
        fx = torch.empty(5, 3, 64, dtype=torch.bfloat16, device=dev)
        fg = torch.empty(64, dtype=torch.bfloat16, device=dev)
        y, rstd = torch.ops.npu.npu_rms_norm(fx, fg)
        eq((tuple(y.shape), y.dtype, tuple(rstd.shape), rstd.dtype, y.device.type),
           ((5, 3, 64), torch.bfloat16, (5, 3, 1), torch.float32, "npu"))
        y, rstd, s = torch.ops.npu.npu_add_rms_norm(fx, fx, fg)
        eq((tuple(y.shape), tuple(rstd.shape), tuple(s.shape)), ((5, 3, 64), (5, 3, 1), (5, 3, 64)))
        eq(tuple(torch.ops.npu.npu_swiglu(fx, dim=1).shape), (5, 1, 64))
        p = torch.empty(5, dtype=torch.int64, device=dev)
        fq, fk = torch.empty(5, 256, device=dev), torch.empty(5, 128, device=dev)
        qo, ko = torch.ops.npu.npu_mrope(p, fq, fk, torch.empty(9, 64, device=dev), 64,
                                         mrope_section=[0, 0, 0])
        eq((tuple(qo.shape), tuple(ko.shape)), ((5, 256), (5, 128)))
        cache = torch.empty(4, 8, 2, 64, device=dev)
        rows = torch.empty(5, 2, 64, device=dev)
        slots = torch.empty(5, dtype=torch.int32, device=dev)
        eq(torch.ops.npu.npu_scatter_pa_kv_cache(rows, rows, cache, cache, slots,
                                                 cache_mode="Norm"), None)
        eq(torch.ops.atb._npu_reshape_and_cache(rows, rows, cache, cache, slots), None)
        eq(torch.ops.atb._npu_rotary_embedding(p, fq, fk, 64, torch.empty(9, 64, device=dev),
                                               True), None)
        eq(torch.ops.atb._npu_matmul_add_fp32(fq, fq, torch.empty(256, 256, device=dev)), None)


check("fake_kernels_follow_the_wheels_meta", fakes)


def atb_extensions():
    # vLLM-Ascend's worker/worker.py imports it at module top; NPUWorker.__init__ calls it
    from torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions

    eq(_register_atb_extensions(), None)
    eq(torch_npu._npu_reshape_and_cache, torch.ops.atb._npu_reshape_and_cache)
    from torch_npu.op_plugin.atb import _atb_ops

    expect(NotInTwinError, "_npu_paged_attention_mla", lambda: _atb_ops._npu_paged_attention_mla())


check("atb_extensions_importable_and_registered", atb_extensions)


def dynamo_traces_a_layer():
    """Dynamo (fullgraph) over a layer's ops, through their fake kernels (meta inputs: the
    wrapper tensor layer itself is not traceable)."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def layer(x, g, gu, pos, cache, kc, slots, c):
        y, _ = torch.ops.npu.npu_rms_norm(x, g)
        q, k = torch.ops.npu.npu_mrope(pos, y, y, cache, 64, mrope_section=[0, 0, 0])
        torch.ops.npu.npu_scatter_pa_kv_cache(k.view(-1, 2, 64), k.view(-1, 2, 64), kc, kc,
                                              slots, cache_mode="Norm")
        torch.ops.atb._npu_matmul_add_fp32(x.half(), x.half(), c)
        return torch.ops.npu.npu_swiglu(gu) + q.sum()

    m = lambda *shape, **kw: torch.empty(*shape, device="meta", **kw)  # noqa: E731
    out = torch.compile(layer, backend=backend, fullgraph=True)(
        m(4, 128), m(128), m(4, 256), m(4, dtype=torch.int64), m(16, 64), m(3, 8, 2, 64),
        m(4, dtype=torch.int32), m(128, 128))
    eq((tuple(out.shape), out.device.type), ((4, 128), "meta"))
    ops = [name for name in seen if name.startswith(("npu.", "atb."))]
    eq(ops, ["npu.npu_rms_norm", "npu.npu_mrope", "npu.npu_scatter_pa_kv_cache",
             "atb._npu_matmul_add_fp32", "npu.npu_swiglu"])


check("dynamo_traces_a_layer_fullgraph", dynamo_traces_a_layer)
check("torch_npu_names_are_the_ops", lambda: eq(
    [getattr(torch_npu, n) is getattr(getattr(torch.ops, ns), n)
     for n, (ns, _, _) in model_ops.OPS.items()], [True] * len(model_ops.OPS)))
'''

CAPTURED = COMMON + '''
# a decoder layer's non-attention ops captured once and replayed on new inputs: each runs as a
# captured AI Core task, on the capturing stream, re-run at every replay
T, H, HEADS, HEAD = 4, 64, 2, 32
x = torch.zeros(T, H, device=dev)
residual = torch.zeros(T, H, device=dev)
gate_up = torch.zeros(T, 2 * H, device=dev)
pos = torch.zeros(T, dtype=torch.int64, device=dev)
g = rand(H).to(dev)
cache = torch.cat((torch.rand(16, 16), torch.rand(16, 16)), -1).to(dev)
kc = torch.zeros(3, 4, HEADS, HEAD, device=dev)
slots = torch.zeros(T, dtype=torch.int32, device=dev)
torch.npu.synchronize()


def layer():
    normed, _, new_residual = torch_npu.npu_add_rms_norm(x, residual, g, 1e-6)
    q, k = torch_npu.npu_mrope(pos, normed, normed, cache, HEAD, mrope_section=[0, 0, 0])
    torch_npu.npu_scatter_pa_kv_cache(k.view(T, HEADS, HEAD), k.view(T, HEADS, HEAD), kc, kc,
                                      slots, cache_mode="Norm")
    return torch_npu.npu_swiglu(gate_up), q, new_residual


def run():
    with capture() as (graph, stream):
        outs = layer()
    tasks = graph.state.nodes
    names = [w.label for w in tasks if w.kind == "aicore"]
    eq(names, ["npu_add_rms_norm", "npu_mrope", "npu_scatter_pa_kv_cache", "npu_swiglu"])
    for step in range(2):
        hx, hr, hgu = rand(T, H), rand(T, H), rand(T, 2 * H)
        hp = torch.tensor([0, 5, 9, 15]) if step else torch.tensor([1, 2, 3, 4])
        hs = torch.tensor([0, 5, 6, 10], dtype=torch.int32) + step
        for dst, src in ((x, hx), (residual, hr), (gate_up, hgu), (pos, hp), (slots, hs)):
            dst.copy_(src)
        graph.replay()
        act, q, new_residual = outs
        s = hx + hr
        close(new_residual, s, 1e-6)
        cos, sin = cache.cpu()[hp].chunk(2, -1)
        close(q, rope_neox(rms(s, g.cpu(), 1e-6), cos, sin, HEAD), 1e-5)
        close(act, hgu[:, :H] * torch.sigmoid(hgu[:, :H]) * hgu[:, H:], 1e-5)
        written = kc.cpu().reshape(-1, HEADS * HEAD)[hs.long()]
        close(written, rope_neox(rms(s, g.cpu(), 1e-6), cos, sin, HEAD), 1e-5)


check("captured_and_replayed_on_new_inputs", run)


def arange_captured():
    with capture() as (graph, stream):
        ramp = torch.arange(2, 6, device=dev)
    eq([w.label for w in graph.state.nodes if w.kind == "op"][-1], "aten::arange")
    graph.replay()
    eq(ramp.cpu().tolist(), [2, 3, 4, 5])


check("arange_captured_and_replayed", arange_captured)
'''


@pytest.mark.parametrize("script", [NUMERICS, RULES, CAPTURED],
                         ids=["numerics", "rules", "captured"])
def test_model_ops_on_the_twin(script, run_twin):
    found = run_twin.rules(run_twin(script, timeout=240))
    assert found and "<script>" not in found, found.get("<script>", found)
    bad = {rule: outcome for rule, outcome in found.items() if outcome != "ok"}
    assert not bad, bad

#: the AI Core tasks each vLLM-Ascend entry queues, per release, on the default path of an NPU
#: with Triton-Ascend and vllm_ascend_C (the twin registers Triton-Ascend's backend, so vLLM
#: sets HAS_TRITON, and installs the vllm_ascend_C twin, so custom ops are on): the norm with
#: a residual is the _C_ascend op on both releases, the rope is vLLM-Ascend's Triton kernel
EXPECTED_OPS = {
    "0.23.0.post1": {"rms_norm": ["npu_rms_norm"], "qk_rms_norm": ["npu_rms_norm"],
                     "add_rms_norm": ["_C_ascend::npu_add_rms_norm_bias"],
                     "silu_and_mul": ["npu_swiglu"],
                     "rope_full": ["triton _triton_rope"],
                     "rope_partial": ["triton _triton_rope"],
                     "reshape_and_cache": ["_npu_reshape_and_cache"],
                     "prefill_attention": ["npu_fused_infer_attention_score"]},
    "0.30.0rc2": {"rms_norm": ["npu_rms_norm"], "qk_rms_norm": ["npu_rms_norm"],
                  "add_rms_norm": ["_C_ascend::npu_add_rms_norm_bias"],
                  "silu_and_mul": ["npu_swiglu"], "rope_full": ["triton _triton_rope"],
                  "rope_partial": ["triton _triton_rope"],
                  "reshape_and_cache": ["npu_scatter_pa_kv_cache"],
                  "prefill_attention": ["npu_fused_infer_attention_score"]},
}
#: the same entries with vLLM-Ascend's HAS_TRITON and custom-op switches off (a machine
#: without Triton-Ascend and vllm_ascend_C): the torch_npu ops; 0.30's norm with a residual
#: calls the _C_ascend op unconditionally (ops/layernorm.py imports vllm_ascend_C for it)
FALLBACK_OPS = {
    "0.23.0.post1": {"add_rms_norm": ["npu_add_rms_norm"],
                     "rope_full": ["_npu_rotary_embedding"],
                     "rope_partial": ["_npu_rotary_embedding"]},
    "0.30.0rc2": {"add_rms_norm": ["_C_ascend::npu_add_rms_norm_bias"],
                  "rope_full": ["npu_mrope"], "rope_partial": ["npu_mrope"]},
}


@pytest.mark.parametrize("release", sorted(EXPECTED_OPS))
def test_vllm_ascends_own_dense_entries_on_the_twin(release, run_vllm_tool):
    """vLLM-Ascend's own norm, activation, rope, KV write (0.30: into the block-strided views
    its model runner makes) and prefill attention run on the twin without our hook, each
    through the task that release queues on an NPU with Triton-Ascend and vllm_ascend_C (the
    default path), and the Triton / custom-op entries again on the torch_npu fallback path,
    within bf16 rounding of float32/float64 formulas (``tools/vllm_ascend_dense_ops.py``)."""
    report = run_vllm_tool(release, "vllm_ascend_dense_ops.py")
    for key, expected in (("entries", EXPECTED_OPS), ("fallback_entries", FALLBACK_OPS)):
        entries = report[key]
        assert {name: entry.get("ops", entry.get("error")) for name, entry in entries.items()} \
            == expected[release], key
        errors = {name: entry["max_rel_err"] for name, entry in entries.items()}
        assert max(errors.values()) < 1e-2, (key, errors)
    # vLLM decided HAS_TRITON itself (the twin's Triton-Ascend driver is the one active one)
    assert report["has_triton"] is True and report["device_adaptor"] == "BaseDeviceAdaptor"
    # with Triton, vLLM picks its model runner V2 (VllmConfig.use_v2_model_runner, both
    # releases); 0.30's forward context for it reads the TP group the tool made
    assert report["model_runner_v2"] is True
