"""The twin's FIA for vLLM-Ascend's C8 call (BNSD, int8 NZ KV, per-channel antiquant) and
FIA v2 with learnable sinks: eager, captured and updated, against the float64 reference, and
the errors torch_npu's docs make of what they forbid (each script runs on a fresh twin); and
each path vLLM-Ascend calls (v1 TND eager and captured, v2 TND with sinks, C8's BNSD on the
int8 NZ view) bit-equal on vLLM-Ascend 0.30's page-strided caches (K and V pages side by side
in one allocation) and on contiguous ones (``STRIDED``; a twin that read the allocation as a
contiguous cache fails it, checked by mutating ``_attention`` and ``_nz_to_nd``). Then
vLLM-Ascend's own C8 and sinks layers (``tools/vllm_ascend_fia_paths.py``) in the oldest and
newest supported release's environment, without our hook."""

from __future__ import annotations

import pytest

from tests.twin.conftest import OP_SCRIPT

pytestmark = pytest.mark.usefixtures("run_twin")

# Builders shared by the scripts: random caches written through our own quantiser and our own
# ND -> NZ permute ([blocks, bs, Hkv, D] -> [blocks, Hkv, D/32, bs, 32]).
COMMON = OP_SCRIPT + '''
from pyruntime.kernels import kv_quant
from pyruntime.workload.reference import reference_attention


def to_nz(nd):
    blocks, bs, heads, dim = nd.shape
    return nd.reshape(blocks, bs, heads, dim // 32, 32).permute(0, 2, 3, 1, 4).contiguous()
'''

C8 = COMMON + '''
B, HQ, HKV, D, BS, NB = 3, 10, 1, 128, 128, 8
SCALE = D ** -0.5
k_f, v_f = (torch.randn(NB, BS, HKV, D, generator=gen) for _ in range(2))
k_s, v_s = ((torch.rand(HKV, D, generator=gen) * 0.02 + 0.01).bfloat16() for _ in range(2))
zero = torch.zeros(HKV, D)
k_q = kv_quant.quantize(k_f, k_s.float(), zero)
v_q = kv_quant.quantize(v_f, v_s.float(), zero)
table_h = torch.randperm(NB, generator=gen)[:6].to(torch.int32).reshape(B, 2)
query_h = torch.randn(B, HQ, D, generator=gen).bfloat16()
k_nz, v_nz = to_nz(k_q).to(dev), to_nz(v_q).to(dev)
query, table = query_h.to(dev).unsqueeze(2), table_h.to(dev)
k_aq, v_aq = k_s.view(HKV, 1, D).to(dev), v_s.view(HKV, 1, D).to(dev)


def want(lens):
    # a batch with no keys: zeros (the twin's rule; the reference needs a key)
    out = reference_attention(query_h, k_q, v_q, table_h.numpy(), np.arange(B + 1),
                              np.maximum(np.asarray(lens), 1), scale=SCALE, causal=False,
                              kv_scales=(k_s.float(), zero, v_s.float(), zero))
    out[np.asarray(lens) == 0] = 0
    return out


def call(**over):
    # vLLM-Ascend's _forward_c8_decode / full_graph_fia with enable_c8_quant (actual_seq_lengths
    # carries the TND query ends, which FIA ignores for a query S of 1)
    kw = dict(key_antiquant_scale=k_aq, value_antiquant_scale=v_aq, block_table=table,
              actual_seq_lengths=[1, 2, 3], actual_seq_lengths_kv=[1, 200, 129], num_heads=HQ,
              num_key_value_heads=HKV, input_layout="BNSD", scale=SCALE, block_size=BS,
              antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0, inner_precise=1,
              sparse_mode=0)
    kw.update(over)
    q = kw.pop("query", query)
    k = kw.pop("key", k_nz)
    return torch_npu.npu_fused_infer_attention_score(q, k, kw.pop("value", v_nz), **kw)


def eager():
    out, lse = call()
    assert tuple(out.shape) == (B, HQ, 1, D) and out.dtype == torch.bfloat16
    assert tuple(lse.shape) == (B, HQ, 1, 1)
    close(out.squeeze(2), want([1, 200, 129]), 2e-2)


def captured_and_updated():
    out = torch.empty(B, HQ, 1, D, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(1, dtype=torch.bfloat16, device=dev)
    kw = dict(key_antiquant_scale=k_aq, value_antiquant_scale=v_aq, block_table=table,
              actual_seq_lengths=[1, 2, 3], num_heads=HQ, num_key_value_heads=HKV,
              input_layout="BNSD", scale=SCALE, block_size=BS, key_antiquant_mode=0,
              value_antiquant_mode=0, inner_precise=1, sparse_mode=0)
    workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(
        query, k_nz, v_nz, actual_seq_lengths_kv=[5, 6, 7], **kw)
    with capture() as (graph, stream):
        torch.npu.graph_task_group_begin(stream)
        torch_npu.npu_fused_infer_attention_score.out(
            query, k_nz, v_nz, actual_seq_lengths_kv=[5, 6, 7], workspace=workspace,
            out=[out, lse], **kw)
        handle = torch.npu.graph_task_group_end(stream)
    graph.replay()
    close(out.squeeze(2), want([5, 6, 7]), 2e-2)
    update = torch.npu.Stream()
    with torch.npu.stream(update):
        torch.npu.graph_task_update_begin(update, handle)
        torch_npu.npu_fused_infer_attention_score.out(
            query, k_nz, v_nz, actual_seq_lengths_kv=[256, 0, 130], workspace=workspace,
            out=[out, lse], **kw)
        torch.npu.graph_task_update_end(update)
    update.synchronize()
    graph.replay()
    close(out.squeeze(2), want([256, 0, 130]), 2e-2)


check("c8_eager_matches_float64", eager)
check("c8_captured_and_updated_matches_float64", captured_and_updated)

synced = lambda **kw: (call(**kw), torch.npu.synchronize())  # noqa: E731
check("c8_inner_precise_0_refused", lambda: expect(
    RuntimeError, "high-performance", lambda: synced(inner_precise=0)))
check("c8_offset_refused", lambda: expect(
    RuntimeError, "antiquant_offset", lambda: synced(key_antiquant_offset=k_aq,
                                                     value_antiquant_offset=v_aq)))
check("c8_one_scale_refused", lambda: expect(
    RuntimeError, "both be given", lambda: synced(value_antiquant_scale=None)))
check("c8_float32_scale_refused", lambda: expect(
    RuntimeError, "bfloat16 [KV_N, 1, D]", lambda: synced(key_antiquant_scale=k_aq.float())))
check("c8_scale_shape_refused", lambda: expect(
    RuntimeError, "[KV_N, 1, D]", lambda: synced(key_antiquant_scale=k_aq.view(HKV, D))))
check("c8_head_pair_refused", lambda: expect(
    RuntimeError, "(num_heads, num_key_value_heads)",
    lambda: synced(query=query[:, :8].contiguous(), num_heads=8)))
check("c8_float16_query_refused", lambda: expect(
    RuntimeError, "bfloat16 query", lambda: synced(query=query.half())))
check("c8_block_table_rows_refused", lambda: expect(
    RuntimeError, "B = 2 rows", lambda: synced(query=query[:2].contiguous())))
check("c8_short_seq_lengths_kv_refused", lambda: expect(
    RuntimeError, "2 entries for B = 3", lambda: synced(actual_seq_lengths_kv=[1, 2])))
check("c8_mask_refused", lambda: expect(
    RuntimeError, "sparse_mode=0 without a mask", lambda: synced(sparse_mode=3)))
check("c8_modes_disagree_refused", lambda: expect(
    RuntimeError, "must agree", lambda: synced(value_antiquant_mode=2)))
check("c8_per_token_not_modelled", lambda: expect(
    NotInTwinError, "(1, 1)", lambda: synced(key_antiquant_mode=1, value_antiquant_mode=1)))
check("c8_mtp_not_modelled", lambda: expect(
    NotInTwinError, "S > 1", lambda: synced(query=query.expand(B, HQ, 2, D).contiguous())))
check("c8_nd_cache_not_modelled", lambda: expect(
    NotInTwinError, "NZ view", lambda: synced(key=k_q.to(dev), value=v_q.to(dev))))
'''

V2 = COMMON + '''
HQ, HKV, D, BS, NB = 8, 2, 64, 16, 12
SCALE = D ** -0.5
key_h, value_h = (torch.randn(NB, BS, HKV, D, generator=gen).bfloat16() for _ in range(2))
sink_h = (torch.randn(HQ, generator=gen) * 2).bfloat16()
table_h = torch.randperm(NB, generator=gen)[:12].to(torch.int32).reshape(3, 4)
query_h = torch.randn(6, HQ, D, generator=gen).bfloat16()
query, key, value = query_h.to(dev), key_h.to(dev), value_h.to(dev)
sink, table = sink_h.to(dev), table_h.to(dev)
mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1).to(dev)


def want(ends, lens, window=None):
    return reference_attention(query_h, key_h, value_h, table_h.numpy(),
                               np.concatenate([[0], ends]), np.asarray(lens), scale=SCALE,
                               causal=True, sinks=sink_h,
                               band=None if window is None else (window, 0))


def options(ends, lens, window=None, **over):
    # vLLM-Ascend's full_graph_fia_v2 (0.23.0.post1 and 0.30.0rc2)
    kw = dict(atten_mask=mask, block_table=table, input_layout="TND", block_size=BS,
              actual_seq_qlen=ends, actual_seq_kvlen=lens, num_key_value_heads=HKV,
              num_query_heads=HQ, sparse_mode=4 if window is not None else 3,
              pre_tokens=window if window is not None else 2147483647, next_tokens=0,
              softmax_scale=SCALE, learnable_sink=sink)
    kw.update(over)
    return kw


def eager():
    for window in (None, 4):
        out, _ = torch_npu.npu_fused_infer_attention_score_v2(
            query, key, value, **options([1, 2, 5], [5, 17, 30], window))
        assert out.dtype == torch.bfloat16
        close(out[:5], want([1, 2, 5], [5, 17, 30], window)[:5], 2e-2)


def sink_matters():
    out, _ = torch_npu.npu_fused_infer_attention_score_v2(
        query, key, value, **options([1, 2, 5], [5, 17, 30], learnable_sink=None))
    plain = reference_attention(query_h, key_h, value_h, table_h.numpy(), np.array([0, 1, 2, 5]),
                                np.array([5, 17, 30]), scale=SCALE, causal=True)
    close(out[:5], plain[:5], 2e-2)
    assert np.abs(plain[:5] - want([1, 2, 5], [5, 17, 30])[:5]).max() > 0.05


def captured_and_updated():
    out = torch.zeros(6, HQ, D, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(1, dtype=torch.bfloat16, device=dev)
    # vLLM-Ascend 0.30 passes the seq_lens tensor as actual_seq_kvlen at capture
    lens_t = torch.tensor([3, 9, 20], dtype=torch.int32)
    workspace = torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(
        query, key, value, **options([1, 2, 3], lens_t))
    with capture() as (graph, stream):
        torch.npu.graph_task_group_begin(stream)
        torch_npu.npu_fused_infer_attention_score_v2.out(
            query, key, value, workspace=workspace, out=[out, lse],
            **options([1, 2, 3], lens_t))
        handle = torch.npu.graph_task_group_end(stream)
    graph.replay()
    close(out[:3], want([1, 2, 3], [3, 9, 20])[:3], 2e-2)
    update = torch.npu.Stream()
    with torch.npu.stream(update):  # FIAV2ParamProvider: actual_seq_qlen and actual_seq_kvlen
        torch.npu.graph_task_update_begin(update, handle)
        torch_npu.npu_fused_infer_attention_score_v2.out(
            query, key, value, workspace=workspace, out=[out, lse],
            **options([2, 4, 6], [40, 2, 64]))
        torch.npu.graph_task_update_end(update)
    update.synchronize()
    graph.replay()
    close(out, want([2, 4, 6], [40, 2, 64]), 2e-2)


check("v2_sink_eager_matches_float64", eager)
check("v2_without_sink_is_plain_attention", sink_matters)
check("v2_sink_captured_and_updated_matches_float64", captured_and_updated)

v2 = lambda **kw: (torch_npu.npu_fused_infer_attention_score_v2(  # noqa: E731
    query, kw.pop("key", key), kw.pop("value", value), **options([1, 2, 5], [5, 17, 30], **kw)),
    torch.npu.synchronize())
check("v2_float32_sink_refused", lambda: expect(
    RuntimeError, "bfloat16 of shape (Q_N,)", lambda: v2(learnable_sink=sink.float())))
check("v2_sink_shape_refused", lambda: expect(
    RuntimeError, "bfloat16 of shape (Q_N,)", lambda: v2(learnable_sink=sink[:4].contiguous())))
check("v2_sink_layout_refused", lambda: expect(
    RuntimeError, "TND or NTD_TND", lambda: v2(input_layout="BSND")))
big = torch.zeros(NB, BS, HKV, 192, dtype=torch.bfloat16, device=dev)
check("v2_sink_value_d_refused", lambda: expect(
    RuntimeError, "D <= 128", lambda: v2(key=big, value=big)))
# vLLM-Ascend hands the paged cache as [blocks, block_size, KV_N * D] (here 2 * 64 = 128 wide,
# D 64): d is per head; the 3-D view of a D-192 cache is refused the same
check("v2_sink_paged_3d_view_reads_d_per_head", lambda: (
    v2(key=key.view(NB, BS, HKV * D), value=value.view(NB, BS, HKV * D)),
    expect(RuntimeError, "D <= 128", lambda: v2(key=big.view(NB, BS, -1),
                                                value=big.view(NB, BS, -1)))))
check("v2_quant_not_modelled", lambda: expect(
    NotInTwinError, "dequant_scale_key", lambda: v2(dequant_scale_key=sink)))
check("v2_sink_lse_not_modelled", lambda: expect(
    NotInTwinError, "return_softmax_lse", lambda: v2(return_softmax_lse=True)))
check("v2_workspace_unknown_option_refused", lambda: expect(
    TypeError, "learnable_sinks",
    lambda: torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace(
        query, key, value, learnable_sinks=sink)))
'''


STRIDED = COMMON + """
# vLLM-Ascend 0.30.0rc2's KV caches of a full-attention or C8 layer: ONE int8 allocation of
# num_blocks * page_size_bytes, viewed as the dtype and torch.as_strided to (2, NB, BS, H, D)
# with strides (hidden, 2 * hidden, H * D, D, 1), K = [0], V = [1]
# (vllm_ascend/worker/model_runner_v1.py:5158-5189 and 5718-5744); the same values in
# contiguous caches must give FIA's very bits, on each of its paths vLLM-Ascend calls
def page_strided(key_h, value_h):
    nb, bs, heads, dim = key_h.shape
    hidden = bs * heads * dim
    raw = torch.zeros(nb * 2 * hidden * key_h.element_size(), dtype=torch.int8, device=dev)
    both = torch.as_strided(raw.view(key_h.dtype), (2, nb, bs, heads, dim),
                            (hidden, 2 * hidden, heads * dim, dim, 1))
    both[0].copy_(key_h)
    both[1].copy_(value_h)
    eq((tuple(both[0].stride()), both[1].storage_offset(), both[0].is_contiguous()),
       ((2 * hidden, heads * dim, dim, 1), hidden, False))
    return both[0], both[1]


def same(got, want):
    got, want = got.cpu(), want.cpu()
    if not torch.equal(got, want):
        raise AssertionError(f"strided caches differ by {(got.float() - want.float()).abs().max()}")


HQ, HKV, D, BS, NB = 8, 2, 64, 16, 12
SCALE = D ** -0.5
key_h, value_h = (torch.randn(NB, BS, HKV, D, generator=gen).bfloat16() for _ in range(2))
table = torch.randperm(NB, generator=gen)[:12].to(torch.int32).reshape(3, 4).to(dev)
query = torch.randn(6, HQ, D, generator=gen).bfloat16().to(dev)
sink = (torch.randn(HQ, generator=gen) * 2).bfloat16().to(dev)
mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1).to(dev)
contiguous = (key_h.to(dev), value_h.to(dev))
strided = page_strided(key_h, value_h)


def tnd(caches):
    # vLLM-Ascend's _get_kv_cache_view: [num_blocks, block_size, H * D] (a .view: the page
    # stride stays), FIA v1 TND as its decode and full_graph_fia call it (MTP: q_len 1 and 2)
    k, v = (c.view(NB, BS, -1) for c in caches)
    return torch_npu.npu_fused_infer_attention_score(
        query, k, v, atten_mask=mask, block_table=table, input_layout="TND", block_size=BS,
        actual_seq_lengths=[1, 3, 5], actual_seq_lengths_kv=[5, 17, 60], num_heads=HQ,
        num_key_value_heads=HKV, scale=SCALE, sparse_mode=3)[0]


def tnd_v2_sinks(caches):
    # full_graph_fia_v2 (layers with sinks), with a window (sparse_mode 4)
    k, v = (c.view(NB, BS, -1) for c in caches)
    return torch_npu.npu_fused_infer_attention_score_v2(
        query, k, v, atten_mask=mask, block_table=table, input_layout="TND", block_size=BS,
        actual_seq_qlen=[1, 3, 5], actual_seq_kvlen=[5, 17, 60], num_query_heads=HQ,
        num_key_value_heads=HKV, softmax_scale=SCALE, sparse_mode=4, pre_tokens=7,
        next_tokens=0, learnable_sink=sink)[0]


def captured(caches):
    out = torch.zeros(6, HQ, D, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(1, dtype=torch.bfloat16, device=dev)
    k, v = (c.view(NB, BS, -1) for c in caches)
    kw = dict(atten_mask=mask, block_table=table, input_layout="TND", block_size=BS,
              actual_seq_lengths=[1, 3, 5], actual_seq_lengths_kv=[5, 17, 60], num_heads=HQ,
              num_key_value_heads=HKV, scale=SCALE, sparse_mode=3)
    workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(query, k, v, **kw)
    with capture() as (graph, stream):
        torch_npu.npu_fused_infer_attention_score.out(query, k, v, workspace=workspace,
                                                      out=[out, lse], **kw)
    graph.replay()
    return out


# C8: int8 pages, vLLM-Ascend's _nz_5d_view of each ND cache (a .view keeping the page stride)
C8_HQ, C8_HKV, C8_D, C8_BS, C8_NB = 10, 1, 128, 128, 8
k_s, v_s = ((torch.rand(C8_HKV, C8_D, generator=gen) * 0.02 + 0.01).bfloat16() for _ in range(2))
zero = torch.zeros(C8_HKV, C8_D)
k_q, v_q = (kv_quant.quantize(torch.randn(C8_NB, C8_BS, C8_HKV, C8_D, generator=gen),
                              s.float(), zero) for s in (k_s, v_s))
# the int8 memory holds NZ: the ND-shaped cache is that memory, as vLLM-Ascend keeps it
nz_nd = [to_nz(q).view(C8_NB, C8_BS, C8_HKV, C8_D) for q in (k_q, v_q)]
c8_contiguous = tuple(t.to(dev) for t in nz_nd)
c8_strided = page_strided(*nz_nd)
c8_table = torch.randperm(C8_NB, generator=gen)[:6].to(torch.int32).reshape(3, 2).to(dev)
c8_query = torch.randn(3, C8_HQ, 1, C8_D, generator=gen).bfloat16().to(dev)


def bnsd_nz(caches):
    k, v = (c.view(-1, C8_HKV, C8_D // 32, C8_BS, 32) for c in caches)
    return torch_npu.npu_fused_infer_attention_score(
        c8_query, k, v, key_antiquant_scale=k_s.view(C8_HKV, 1, C8_D).to(dev),
        value_antiquant_scale=v_s.view(C8_HKV, 1, C8_D).to(dev), block_table=c8_table,
        actual_seq_lengths=[1, 2, 3], actual_seq_lengths_kv=[1, 200, 129], num_heads=C8_HQ,
        num_key_value_heads=C8_HKV, input_layout="BNSD", scale=C8_D ** -0.5,
        block_size=C8_BS, key_antiquant_mode=0, value_antiquant_mode=0, inner_precise=1,
        sparse_mode=0)[0]


def differs(fn, a, b):
    # the values differ where the strided memory's gaps are read as a contiguous cache's
    # pages: a twin that read the allocation flat would fail `same`
    if torch.equal(fn(a).cpu(), fn(b).cpu()):
        raise AssertionError("the check cannot tell the layouts apart")


check("tnd_strided_equals_contiguous", lambda: same(tnd(strided), tnd(contiguous)))
check("tnd_v2_sinks_strided_equals_contiguous",
      lambda: same(tnd_v2_sinks(strided), tnd_v2_sinks(contiguous)))
check("tnd_captured_strided_equals_contiguous",
      lambda: same(captured(strided), captured(contiguous)))
check("bnsd_nz_strided_equals_contiguous", lambda: same(bnsd_nz(c8_strided),
                                                         bnsd_nz(c8_contiguous)))
# the allocation read flat as one contiguous [2 * NB, ...] cache: K's blocks interleaved with
# V's, a different answer (so the equalities above can fail)
flat = strided[0].as_strided((NB, BS, HKV, D), (BS * HKV * D, HKV * D, D, 1), 0)
check("a_flat_read_differs", lambda: differs(tnd, (flat, flat), (strided[0], strided[0])))
"""


@pytest.mark.parametrize("script", [C8, V2, STRIDED], ids=["c8", "v2-sinks", "strided"])
def test_fia_paths_on_the_twin(script, run_twin):
    found = run_twin.rules(run_twin(script, timeout=180))
    assert found and "<script>" not in found, found.get("<script>", found)
    bad = {rule: outcome for rule, outcome in found.items() if outcome != "ok"}
    assert not bad, bad



@pytest.mark.parametrize("release", ["0.23.0.post1", "0.30.0rc2"])
def test_vllm_ascends_own_c8_and_sinks_layers_on_the_twin(release, run_vllm_tool):
    """Each layer's graph captures the FIA vLLM-Ascend's entry issues (C8: v1 BNSD on the int8
    NZ view with its antiquant scales; sinks: v2 TND with learnable_sink), vLLM-Ascend's own
    update rewrites it once a step, and every replayed output matches float64, closer than
    the answer without the sinks; so does one eager step."""
    report = run_vllm_tool(release, "vllm_ascend_fia_paths.py")
    c8, sinks = report["captured"]
    assert (c8["layout"], c8["key"], c8["key_dtype"], c8["key_antiquant_scale"]) == (
        "BNSD", [24, 1, 128 // 32, 128, 32], "int8", True)
    assert c8["op"].startswith("npu_fused_infer_attention_score") and "v2" not in c8["op"]
    assert (sinks["op"], sinks["layout"], sinks["learnable_sink"]) == (
        "npu_fused_infer_attention_score_v2.out", "TND", True)
    # one update per layer and step, each re-issuing its layer's FIA
    assert report["updates_per_step"] == 2
    assert len(report["updated"]) == 2 * report["steps"]
    assert {(u["layout"], u["learnable_sink"]) for u in report["updated"]} == {
        ("BNSD", False), ("TND", True)}
    # the eager step: C8's _forward_c8_decode (v1 BNSD) and the sinks layer's v2 call
    assert report["eager_steps"] == 1
    assert [(e["op"], e["layout"], e["key_antiquant_scale"], e["learnable_sink"])
            for e in report["eager"]] == [("npu_fused_infer_attention_score", "BNSD", True, False),
                                          ("npu_fused_infer_attention_score_v2", "TND", False,
                                           True)]
    errors = [layer["max_rel_err"] for layer in report["layers"]]
    assert max(errors) < 1e-2 < report["sinks_distance"], report
