"""The twin's torch_npu ops of vLLM-Ascend's MLA path (`pyruntime.npu_twin.mla_ops`):
``npu_interleave_rope``, ``npu_kv_rmsnorm_rope_cache`` (PA), ``npu_format_cast`` to ND, and
FIA's MLA calls (v2 ``BNSD_NBSD`` paged decode with query_rope/key_rope, eager, captured and
updated as vLLM-Ascend's graph path does; v1 ``TND`` prefill with rope). Each against an
independent float64 formula written here (element-wise RoPE pairs, the concatenated
``[nope | rope]`` query and key in one softmax), each documented refusal, the schemas against
the torch_npu wheel's library, and the fake kernels under Dynamo. Then vLLM-Ascend's own
``AscendMLAImpl`` forward (prefill, graph decode, eager decode) in the oldest and newest
supported release's environment, without our hook."""

from __future__ import annotations

import pytest

from pyruntime.npu_twin import mla_ops
from tests.twin.conftest import OP_SCRIPT

pytestmark = pytest.mark.usefixtures("run_twin")


@pytest.mark.parametrize("schema", [mla_ops.INTERLEAVE_ROPE_SCHEMA,
                                    mla_ops.KV_RMSNORM_ROPE_CACHE_SCHEMA,
                                    mla_ops.FORMAT_CAST_SCHEMA],
                         ids=["interleave_rope", "kv_rmsnorm_rope_cache", "format_cast"])
def test_mla_op_schemas_are_the_wheels(schema, registered_schemas):
    # the registration string, NUL-terminated in the library's read-only data
    assert b"\0" + schema.encode() + b"\0" in registered_schemas


COMMON = OP_SCRIPT + '''

def rope64(x, cos, sin):
    """Interleaved RoPE, element by element in float64: pair i is (x[2i], x[2i+1]); its
    rotated halves land at i and 32 + i, with the cos/sin of those positions."""
    x, cos, sin = (np.asarray(t.double().numpy()) for t in (x, cos, sin))
    out = np.empty(np.broadcast_shapes(x.shape, cos.shape))
    for i in range(32):
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., i] = a * cos[..., i] - b * sin[..., i]
        out[..., 32 + i] = b * cos[..., 32 + i] + a * sin[..., 32 + i]
    return out
'''

ROPE_AND_CACHE = COMMON + '''
B = 5
x_h = torch.randn(B, 4, 1, 64, generator=gen).bfloat16()
cos_h, sin_h = (torch.randn(B, 1, 1, 64, generator=gen).bfloat16() for _ in range(2))
x, cos, sin = x_h.to(dev), cos_h.to(dev), sin_h.to(dev)


def rope_numerics():
    y = torch_npu.npu_interleave_rope(x, cos, sin)
    eq((tuple(y.shape), y.dtype), ((B, 4, 1, 64), torch.bfloat16))
    close(y, rope64(x_h, cos_h, sin_h), 1e-2)
    # vLLM-Ascend's rope_single: a strided slice of the query ([T, N, 192] -> [..., 128:])
    wide = torch.randn(B, 4, 192, generator=gen).bfloat16()
    strided = wide.to(dev)[..., 128:].view(B, 4, 1, 64)
    close(torch_npu.npu_interleave_rope(strided, cos, sin),
          rope64(wide[..., 128:].reshape(B, 4, 1, 64), cos_h, sin_h), 1e-2)


check("interleave_rope_matches_float64", rope_numerics)
rope = lambda **kw: torch_npu.npu_interleave_rope(  # noqa: E731
    kw.get("x", x), kw.get("cos", cos), kw.get("sin", sin))
check("rope_d_refused", lambda: expect(RuntimeError, "must be 64", lambda: rope(
    x=x[..., :32].contiguous(), cos=cos[..., :32].contiguous(), sin=sin[..., :32].contiguous())))
check("rope_cos_n_refused", lambda: expect(RuntimeError, "(B, 1, 1 or S, D)", lambda: rope(
    cos=cos.expand(B, 4, 1, 64).contiguous())))
check("rope_dtype_refused", lambda: expect(RuntimeError, "x's dtype", lambda: rope(
    cos=cos.float())))
check("rope_float32_refused", lambda: expect(RuntimeError, "bfloat16 or float16", lambda: rope(
    x=x.float(), cos=cos.float(), sin=sin.float())))
check("rope_3d_refused", lambda: expect(RuntimeError, "4-D", lambda: rope(x=x.view(B, 4, 64))))
check("rope_host_tensor_refused", lambda: expect(
    npu_twin.device.HostPointerError, "on the NPU", lambda: rope(cos=cos_h)))

NB, BS, EPS = 6, 16, 1e-6
kv_h = torch.randn(B, 1, 1, 576, generator=gen).bfloat16()
gamma_h = torch.randn(512, generator=gen).bfloat16()
slots_h = torch.tensor([17, -1, 3, 90, 40])
kv, gamma, slots = kv_h.to(dev), gamma_h.to(dev), slots_h.to(dev)


def caches():
    k = torch.full((NB, BS, 1, 64), 7.0, dtype=torch.bfloat16).to(dev)
    c = torch.full((NB, BS, 1, 512), 7.0, dtype=torch.bfloat16).to(dev)
    return k, c


def want_rows():
    lat = kv_h[..., :512].double().numpy()
    normed = lat / np.sqrt((lat ** 2).mean(-1, keepdims=True) + EPS) * gamma_h.double().numpy()
    return rope64(kv_h[..., 512:], cos_h, sin_h).reshape(B, 64), normed.reshape(B, 512)


def kv_cache_numerics():
    for output_kv in (False, True):
        k_cache, c_cache = caches()
        got = torch_npu.npu_kv_rmsnorm_rope_cache(
            kv, gamma, cos, sin, slots, k_cache, c_cache, epsilon=EPS, cache_mode="PA",
            is_output_kv=output_kv)
        eq([tuple(t.shape) for t in got], [(NB, BS, 1, 64), (NB, BS, 1, 512), (B, 1, 1, 64),
                                           (B, 1, 1, 512)])
        assert got[0] is k_cache and got[1] is c_cache  # updated in place
        rope_rows, norm_rows = want_rows()
        k_flat = k_cache.cpu().reshape(-1, 64)
        c_flat = c_cache.cpu().reshape(-1, 512)
        for t, slot in enumerate(slots_h.tolist()):
            if slot >= 0:
                close(k_flat[slot], rope_rows[t], 1e-2)
                close(c_flat[slot], norm_rows[t], 1e-2)
        # slot -1 (vLLM's padding) writes nothing; every other slot keeps its 7.0
        untouched = [s for s in range(NB * BS) if s not in slots_h.tolist()]
        eq(bool((k_flat[untouched] == 7).all() and (c_flat[untouched] == 7).all()), True)
        if output_kv:
            close(got[2].reshape(B, 64), rope_rows, 1e-2)
            close(got[3].reshape(B, 512), norm_rows, 1e-2)


def kv_cache_captured():
    k_cache, c_cache = caches()
    with capture() as (graph, stream):
        torch_npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, slots, k_cache, c_cache,
                                            epsilon=EPS, cache_mode="PA")
    eq(bool((k_cache.cpu() == 7).all()), True)  # nothing ran at capture
    graph.replay()
    rope_rows, _ = want_rows()
    close(k_cache.cpu().reshape(-1, 64)[17], rope_rows[0], 1e-2)


check("kv_rmsnorm_rope_cache_matches_float64", kv_cache_numerics)
check("kv_rmsnorm_rope_cache_captured_runs_at_replay", kv_cache_captured)


def cache_call(**kw):
    k_cache, c_cache = caches()
    args = dict(kv=kv, gamma=gamma, cos=cos, sin=sin, index=slots, k_cache=k_cache,
                ckv_cache=c_cache)
    args.update({k: kw.pop(k) for k in list(kw) if k in args})
    kw.setdefault("cache_mode", "PA")
    torch_npu.npu_kv_rmsnorm_rope_cache(*args.values(), **kw)
    torch.npu.synchronize()


check("cache_hidden_size_refused", lambda: expect(RuntimeError, "576", lambda: cache_call(
    kv=kv[..., :512].contiguous())))
check("cache_gamma_refused", lambda: expect(RuntimeError, "gamma must be [512]", lambda: cache_call(
    gamma=gamma.float())))
check("cache_index_dtype_refused", lambda: expect(RuntimeError, "int64", lambda: cache_call(
    index=slots.int())))
check("cache_shape_refused", lambda: expect(RuntimeError, "[block_num, block_size, 1, 64]",
                                            lambda: cache_call(k_cache=caches()[1])))
check("cache_dtype_refused", lambda: expect(RuntimeError, "kv's dtype", lambda: cache_call(
    ckv_cache=caches()[1].half())))
check("cache_index_past_end_refused", lambda: expect(RuntimeError, "past the cache", lambda:
    cache_call(index=torch.tensor([0, 1, 2, 3, NB * BS]).to(dev))))
check("cache_norm_mode_not_modelled", lambda: expect(NotInTwinError, "'Norm'", lambda:
    cache_call(cache_mode="Norm")))
check("cache_nz_mode_not_modelled", lambda: expect(NotInTwinError, "'PA_NZ'", lambda:
    cache_call(cache_mode="PA_NZ")))
check("cache_quant_not_modelled", lambda: expect(NotInTwinError, "c_kv_scale", lambda:
    cache_call(c_kv_scale=torch.ones(512).to(dev))))


def format_cast():
    w = torch.randn(8, 4, generator=gen).bfloat16().to(dev)
    assert torch_npu.npu_format_cast(w, 2) is w
    expect(NotInTwinError, "acl_format 29", lambda: torch_npu.npu_format_cast(w, 29))
    expect(TypeError, "npu tensor", lambda: torch_npu.npu_format_cast(w.cpu(), 2))


check("format_cast_to_nd_is_identity", format_cast)
'''

# vLLM-Ascend's MLA decode (mla_v1.py, _forward_decode without enable_kv_nz): q_nope [B, N,
# 1, 512], q_pe [B, N, 1, 64], the latent and rope caches viewed [blocks, 1, bs, D],
# BNSD_NBSD, sparse 0, the latent cache as key and value; the output [N, B, 1, 512]
DECODE = COMMON + '''
B, N, NB, BS = 3, 4, 10, 16
SCALE = 0.07
q_h = torch.randn(B, N, 1, 512, generator=gen).bfloat16()
qr_h = torch.randn(B, N, 1, 64, generator=gen).bfloat16()
kc_h = torch.randn(NB, BS, 1, 512, generator=gen).bfloat16()  # vLLM's kv_cache[0]
kr_h = torch.randn(NB, BS, 1, 64, generator=gen).bfloat16()   # kv_cache[1]
table_h = torch.randperm(NB, generator=gen)[:9].to(torch.int32).reshape(B, 3)
q, qr, table = q_h.to(dev), qr_h.to(dev), table_h.to(dev)
k_nope = kc_h.to(dev).view(-1, 1, BS, 512)
k_pe = kr_h.to(dev).view(-1, 1, BS, 64)


def want(lens):
    """[N, B, 1, 512]: one softmax over [q_nope | q_pe] . [k_nope | k_pe], values k_nope."""
    out = np.zeros((N, B, 1, 512))
    for b, n in enumerate(lens):
        if n == 0:
            continue
        rows = [int(table_h[b, s // BS]) * BS + s % BS for s in range(n)]
        k = np.concatenate([kc_h.reshape(-1, 512)[rows].double().numpy(),
                            kr_h.reshape(-1, 64)[rows].double().numpy()], -1)
        for h in range(N):
            qv = np.concatenate([q_h[b, h, 0].double().numpy(), qr_h[b, h, 0].double().numpy()])
            s = k @ qv * SCALE
            p = np.exp(s - s.max())
            out[h, b, 0] = (p / p.sum()) @ k[:, :512]
    return out


def kwargs(lens, **over):
    kw = dict(query_rope=qr, key_rope=k_pe, num_query_heads=N, num_key_value_heads=1,
              input_layout="BNSD_NBSD", atten_mask=None, sparse_mode=0, softmax_scale=SCALE,
              block_table=table, block_size=BS, actual_seq_qlen=None, actual_seq_kvlen=lens)
    kw.update(over)
    return kw


def eager():
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(q, k_nope, k_nope,
                                                            **kwargs([5, 33, 48]))
    eq((tuple(out.shape), out.dtype, lse.numel()), ((N, B, 1, 512), torch.bfloat16, 0))
    close(out, want([5, 33, 48]), 2e-2)
    # the rope part matters: without it the answer moves
    assert np.abs(want([5, 33, 48]) - _no_rope([5, 33, 48])).max() > 0.05


def _no_rope(lens):
    global qr_h
    saved, qr_h = qr_h, torch.zeros_like(qr_h)
    try:
        return want(lens)
    finally:
        qr_h = saved


def bnsd_layout_and_lse():
    out, lse = torch_npu.npu_fused_infer_attention_score_v2(
        q, k_nope, k_nope, **kwargs([5, 33, 48], input_layout="BNSD", return_softmax_lse=True))
    eq((tuple(out.shape), tuple(lse.shape)), ((B, N, 1, 512), (B, N, 1, 1)))
    close(out.permute(1, 0, 2, 3), want([5, 33, 48]), 2e-2)


def captured_and_updated():
    # _forward_decode under capture, then AscendMLAImpl.update_graph_params's re-issue
    out = torch.empty(N, B, 1, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(B, dtype=torch.bfloat16, device=dev)
    workspace = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(
        q, k_nope, k_nope, **kwargs([1, 2, 3]))
    with capture() as (graph, stream):
        torch.npu.graph_task_group_begin(stream)
        torch_npu.npu_fused_infer_attention_score_v2.out(
            q, k_nope, k_nope, workspace=workspace, out=[out, lse], **kwargs([1, 2, 3]))
        handle = torch.npu.graph_task_group_end(stream)
    graph.replay()
    close(out, want([1, 2, 3]), 2e-2)
    update = torch.npu.Stream()
    with torch.npu.stream(update):
        torch.npu.graph_task_update_begin(update, handle)
        torch_npu.npu_fused_infer_attention_score_v2.out(
            q, k_nope, k_nope, workspace=workspace, out=[out, lse], **kwargs([40, 0, 17]))
        torch.npu.graph_task_update_end(update)
    update.synchronize()
    graph.replay()
    close(out, want([40, 0, 17]), 2e-2)


check("mla_decode_eager_matches_float64", eager)
check("mla_decode_bnsd_layout_and_lse", bnsd_layout_and_lse)
check("mla_decode_captured_and_updated_matches_float64", captured_and_updated)

decode = lambda **kw: (torch_npu.npu_fused_infer_attention_score_v2(  # noqa: E731
    kw.pop("query", q), kw.get("key", k_nope), kw.pop("key", k_nope), **kwargs([5, 33, 48], **kw)),
    torch.npu.synchronize())
check("mla_decode_one_rope_refused", lambda: expect(
    RuntimeError, "together", lambda: decode(key_rope=None)))
check("mla_decode_kv_heads_refused", lambda: expect(
    RuntimeError, "num_key_value_heads 1", lambda: decode(num_key_value_heads=2)))
check("mla_decode_block_size_refused", lambda: expect(
    RuntimeError, "16 or 128", lambda: decode(
        key=kc_h.to(dev).view(-1, 1, 32, 512), key_rope=kr_h.to(dev).view(-1, 1, 32, 64),
        block_size=32)))
check("mla_decode_heads_refused", lambda: expect(
    RuntimeError, "one of", lambda: decode(query=q.expand(B, N, 1, 512)[:, :3].contiguous(),
                                           query_rope=qr[:, :3].contiguous(), num_query_heads=3)))
check("mla_decode_rope_dtype_refused", lambda: expect(
    RuntimeError, "query's dtype", lambda: decode(query_rope=qr.half())))
check("mla_decode_rope_d_refused", lambda: expect(
    RuntimeError, "D 64", lambda: decode(query_rope=qr[..., :32].contiguous())))
check("mla_decode_mask_refused", lambda: expect(
    RuntimeError, "sparse_mode=0", lambda: decode(sparse_mode=3)))
check("mla_decode_no_table_refused", lambda: expect(
    RuntimeError, "page attention", lambda: decode(block_table=None)))
check("mla_decode_long_kv_refused", lambda: expect(
    RuntimeError, "[0, 48]", lambda: decode(actual_seq_kvlen=[5, 33, 49])))
check("mla_decode_tnd_ntd_not_modelled", lambda: expect(
    NotInTwinError, "TND_NTD", lambda: decode(input_layout="TND_NTD")))
check("mla_decode_mtp_not_modelled", lambda: expect(
    NotInTwinError, "S of 2", lambda: decode(query=q.expand(B, N, 2, 512).contiguous(),
                                             query_rope=qr.expand(B, N, 2, 64).contiguous())))
check("mla_decode_nz_not_modelled", lambda: expect(
    NotInTwinError, "NZ", lambda: decode(key=kc_h.to(dev).view(NB, 1, 32, BS, 16))))
check("mla_decode_quant_not_modelled", lambda: expect(
    NotInTwinError, "dequant_scale_query", lambda: decode(dequant_scale_query=qr)))
'''

# vLLM-Ascend's MLA prefill (mla_v1.py, _forward_prefill): TND bfloat16, q_nope / k_nope /
# value [T, N, 128], q_pe [T, N, 64], k_pe expanded over the heads and made contiguous,
# sparse 3 with the 2048 mask, no block table, actual_seq_lengths_kv = the query's ends
PREFILL = COMMON + '''
T, N = 9, 4
SCALE = 0.09
ENDS = [4, 5, 9]
q_h, k_h, v_h = (torch.randn(T, N, 128, generator=gen).bfloat16() for _ in range(3))
qr_h = torch.randn(T, N, 64, generator=gen).bfloat16()
kr_h = torch.randn(T, 1, 64, generator=gen).bfloat16().expand(T, N, 64).contiguous()
q, k, v, qr, kr = (t.to(dev) for t in (q_h, k_h, v_h, qr_h, kr_h))
mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1).to(dev)


def want():
    out = np.zeros((T, N, 128))
    for start, end in zip([0] + ENDS, ENDS):
        for t in range(start, end):
            for h in range(N):
                qv = np.concatenate([q_h[t, h].double().numpy(), qr_h[t, h].double().numpy()])
                keys = [np.concatenate([k_h[j, h].double().numpy(), kr_h[j, h].double().numpy()])
                        for j in range(start, t + 1)]  # causal: up to its own position
                s = np.array(keys) @ qv * SCALE
                p = np.exp(s - s.max())
                out[t, h] = (p / p.sum()) @ v_h[start:t + 1, h].double().numpy()
    return out


def call(**over):
    kw = dict(num_heads=N, num_key_value_heads=N, input_layout="TND", atten_mask=mask,
              sparse_mode=3, scale=SCALE, antiquant_mode=0, antiquant_scale=None,
              block_table=None, block_size=0, softmax_lse_flag=True, actual_seq_lengths=ENDS,
              actual_seq_lengths_kv=list(ENDS), query_rope=qr, key_rope=kr)
    kw.update(over)
    query, key, value = (kw.pop(name, t) for name, t in (("query", q), ("key", k),
                                                         ("value", v)))
    return torch_npu.npu_fused_infer_attention_score(query, key, value, **kw)


def eager():
    out, lse = call()
    eq((tuple(out.shape), out.dtype, tuple(lse.shape)), ((T, N, 128), torch.bfloat16, (T, N, 1)))
    close(out, want(), 2e-2)


check("mla_prefill_matches_float64", eager)
synced = lambda **kw: (call(**kw), torch.npu.synchronize())  # noqa: E731
check("mla_prefill_float16_refused", lambda: expect(
    RuntimeError, "bfloat16 only", lambda: synced(query=q.half(), query_rope=qr.half())))
check("mla_prefill_d_refused", lambda: expect(
    RuntimeError, "Q_D, K_D and V_D 128", lambda: synced(value=v.repeat(1, 1, 2))))
check("mla_prefill_rope_shape_refused", lambda: expect(
    RuntimeError, "key_rope must be", lambda: synced(key_rope=kr[:, :1].contiguous())))
check("mla_prefill_one_rope_refused", lambda: expect(
    RuntimeError, "together", lambda: synced(key_rope=None)))
check("mla_prefill_mask_shape_refused", lambda: expect(
    RuntimeError, "(2048, 2048)", lambda: synced(atten_mask=mask[:16, :16].contiguous())))
check("mla_prefill_ends_refused", lambda: expect(
    RuntimeError, "non-decreasing", lambda: synced(actual_seq_lengths=[4, 3, 9])))
check("mla_prefill_paged_not_modelled", lambda: expect(
    NotInTwinError, "page attention", lambda: synced(block_table=torch.zeros(
        3, 1, dtype=torch.int32).to(dev))))
check("mla_prefill_pse_not_modelled", lambda: expect(
    NotInTwinError, "pse_shift", lambda: synced(pse_shift=qr)))
'''

# The fake kernels: Dynamo traces a function calling the ops on fake tensors (fullgraph,
# no graph break) and the outputs have the real op's shapes and dtypes
FAKE = '''
import torch_npu
from pyruntime.npu_twin import mla_ops
from torch._subclasses.fake_tensor import FakeTensorMode

graphs = []


def backend(gm, example_inputs):
    graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
    return gm.forward


def fn(x, cos, sin, kv, gamma, index, k_cache, ckv_cache):
    y = torch.ops.npu.npu_interleave_rope(x, cos, sin)
    outs = torch.ops.npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache,
                                                   ckv_cache, cache_mode="PA",
                                                   is_output_kv=True)
    return (y,) + tuple(outs)


def traced():
    with FakeTensorMode():
        args = (torch.empty(3, 4, 1, 64, dtype=torch.bfloat16),
                torch.empty(3, 1, 1, 64, dtype=torch.bfloat16),
                torch.empty(3, 1, 1, 64, dtype=torch.bfloat16),
                torch.empty(3, 1, 1, 576, dtype=torch.bfloat16),
                torch.empty(512, dtype=torch.bfloat16),
                torch.empty(3, dtype=torch.int64),
                torch.empty(6, 16, 1, 64, dtype=torch.bfloat16),
                torch.empty(6, 16, 1, 512, dtype=torch.bfloat16))
        out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    eq([(tuple(t.shape), t.dtype) for t in out],
       [((3, 4, 1, 64), torch.bfloat16), ((6, 16, 1, 64), torch.bfloat16),
        ((6, 16, 1, 512), torch.bfloat16), ((3, 1, 1, 64), torch.bfloat16),
        ((3, 1, 1, 512), torch.bfloat16)])
    eq(graphs, [["npu.npu_interleave_rope", "npu.npu_kv_rmsnorm_rope_cache",
                 "<built-in function getitem>", "<built-in function getitem>",
                 "<built-in function getitem>", "<built-in function getitem>"]])


check("fake_kernels_trace_under_dynamo", traced)
'''


@pytest.mark.parametrize("script", [ROPE_AND_CACHE, DECODE, PREFILL, FAKE],
                         ids=["rope-and-cache", "decode", "prefill", "fake"])
def test_mla_ops_on_the_twin(script, run_twin):
    found = run_twin.rules(run_twin(script, timeout=240))
    assert found and "<script>" not in found, found.get("<script>", found)
    bad = {rule: outcome for rule, outcome in found.items() if outcome != "ok"}
    assert not bad, bad



@pytest.mark.parametrize("release", ["0.23.0.post1", "0.30.0rc2"])
def test_vllm_ascends_own_mla_layer_on_the_twin(release, run_vllm_tool):
    """vLLM-Ascend's ``AscendMLAImpl`` (``tools/vllm_ascend_mla_paths.py``) without our hook:
    its weight loading casts ``kv_b_proj`` to ND; its prefill writes both caches through
    ``npu_kv_rmsnorm_rope_cache``, ropes the query and runs FIA v1 TND with rope; its decode
    graph captures the same cache write, rope, FIA v2 ``.out`` BNSD_NBSD with rope and
    ``npu_transpose_batchmatmul``, and each replay re-issues only the FIA through its own
    ``update_graph_params``, once a step; an eager decode step calls FIA v2 itself. Every
    output matches float64 non-absorbed DeepSeek MLA, closer than the answer without the rope
    part."""
    report = run_vllm_tool(release, "vllm_ascend_mla_paths.py")
    fia_v1 = "npu_fused_infer_attention_score TND rope=True"
    fia_v2_out = "npu_fused_infer_attention_score_v2.out BNSD_NBSD rope=True"
    rope, cache, up_proj = ("npu_interleave_rope", "npu_kv_rmsnorm_rope_cache",
                            "npu_transpose_batchmatmul")
    assert report["ops"] == {
        "load": ["npu_format_cast"],
        "prefill": [fia_v1, rope, cache],
        "capture": [fia_v2_out, rope, cache, up_proj],
        "replayed_decode": [fia_v2_out],  # the update's re-issue; the rest is the replay
        "eager_decode": ["npu_fused_infer_attention_score_v2 BNSD_NBSD rope=True", rope, cache,
                         up_proj]}
    assert report["graph_steps"] == 3 and report["updates_per_step"] == 1
    errors = [report[f"{phase}_max_rel_err"] for phase in ("prefill", "graph_decode",
                                                            "eager_decode")]
    assert max(errors) < 2e-2 < report["rope_distance"], report
    # the decode steps' cache writes (request A's third block is never reached)
    assert report["cache_blocks_written"] == [1, 3, 7]
