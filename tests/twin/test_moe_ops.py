"""The twin's MoE ops of vLLM-Ascend's fused-MoE path at TP 1 (`pyruntime.npu_twin.moe_ops`):
``npu_moe_init_routing_v2``, ``npu_grouped_matmul``, ``npu_moe_token_unpermute`` and
``_C_ascend.moe_gating_top_k``. Each against an independent float64 formula written here (loops
over tokens and experts, no shared code with the twin), each documented refusal, the schemas
against the torch_npu wheel's library and the releases' ``csrc/torch_binding.cpp``, capture
and replay, the fake kernels under Dynamo, and the whole routed-expert chain of a gpt-oss- and
a DeepSeek-V3-shaped layer as vLLM-Ascend calls it, against a float64 MoE written here. Then
vLLM-Ascend's own router, AllGather dispatcher and expert MLP in each release's environment
(``tools/vllm_ascend_moe_paths.py``), without our hook."""

from __future__ import annotations

import pytest

from pyruntime.npu_twin import moe_ops, vllm_ascend_c_schemas
from tests.twin.conftest import OP_SCRIPT

pytestmark = pytest.mark.usefixtures("run_twin")


@pytest.mark.parametrize("schema", [moe_ops.INIT_ROUTING_V2_SCHEMA,
                                    moe_ops.GROUPED_MATMUL_SCHEMA,
                                    moe_ops.TOKEN_UNPERMUTE_SCHEMA],
                         ids=["init_routing_v2", "grouped_matmul", "token_unpermute"])
def test_moe_op_schemas_are_the_wheels(schema, registered_schemas):
    # the registration string, NUL-terminated in the library's read-only data
    assert b"\0" + schema.encode() + b"\0" in registered_schemas


@pytest.mark.parametrize("release", ["0.23.0.post1", "0.30.0rc2"])
def test_the_c_ascend_moe_ops_have_bodies(release):
    # the schemas are the release's own (tests/twin/test_vllm_ascend_c.py checks SCHEMAS
    # against csrc/torch_binding.cpp); the twin gives the router (both releases) and
    # 0.23.0.post1's init routing a body
    from pyruntime.npu_twin import vllm_ascend_c
    assert "moe_gating_top_k" in vllm_ascend_c_schemas.SCHEMAS[release]
    assert vllm_ascend_c.BODIES["moe_gating_top_k"][0] is moe_ops.gating_top_k
    if release == "0.23.0.post1":
        assert "npu_moe_init_routing_custom" in vllm_ascend_c_schemas.SCHEMAS[release]
        assert vllm_ascend_c.BODIES["npu_moe_init_routing_custom"][0] is \
            moe_ops.init_routing_custom


COMMON = OP_SCRIPT

ROUTING = COMMON + '''
T, K, H, E = 5, 3, 16, 6
x_h = torch.randn(T, H, generator=gen).bfloat16()
ids_h = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(T)]).to(torch.int32)
x, ids = x_h.to(dev), ids_h.to(dev)


def want_routing(start, end):
    """By loops: pairs (t, k) in expert order, ties in (t, k) order."""
    pairs = sorted((int(ids_h[t, k]), t * K + k) for t in range(T) for k in range(K))
    pairs = [(e, f) for e, f in pairs if start <= e < end]
    rows = np.zeros((T * K, H))
    where = [-1] * (T * K)
    counts = [0] * (end - start)
    for j, (e, f) in enumerate(pairs):
        rows[j] = x_h[f // K].double().numpy()
        where[f] = j
        counts[e - start] += 1
    return rows, where, counts


def route(**kw):
    args = dict(active_num=T * K, expert_num=E, expert_tokens_num_type=1,
                expert_tokens_num_flag=True, active_expert_range=[0, E], quant_mode=-1)
    args.update(kw)
    return torch_npu.npu_moe_init_routing_v2(kw.pop("x", x), kw.pop("ids", ids),
                                             **{k: v for k, v in args.items()
                                                if k not in ("x", "ids")})


def routing_numerics():
    for start, end in ((0, E), (2, 5)):
        got = route(active_expert_range=[start, end])
        eq([(tuple(t.shape), t.dtype) for t in got],
           [((T * K, H), torch.bfloat16), ((T * K,), torch.int32), ((end - start,), torch.int64),
            ((T * K,), torch.float32)])
        rows, where, counts = want_routing(start, end)
        close(got[0], rows, 0)
        eq(got[1].cpu().tolist(), where)
        eq(got[2].cpu().tolist(), counts)


def routing_captured():
    with capture() as (graph, stream):
        got = route()
    graph.replay()
    rows, where, _ = want_routing(0, E)
    close(got[0], rows, 0)
    eq(got[1].cpu().tolist(), where)


check("init_routing_v2_matches_loops", routing_numerics)
check("init_routing_v2_captured_runs_at_replay", routing_captured)
synced = lambda fn: (fn(), torch.npu.synchronize())  # noqa: E731
check("routing_3d_x_refused", lambda: expect(RuntimeError, "2-D (NUM_ROWS, H)", lambda: route(
    x=x.view(1, T, H))))
check("routing_int64_ids_refused", lambda: expect(RuntimeError, "int32", lambda: route(
    ids=ids.long())))
check("routing_rows_refused", lambda: expect(RuntimeError, "NUM_ROWS", lambda: route(
    ids=ids[:2].contiguous())))
check("routing_cumsum_refused", lambda: expect(RuntimeError, "only 1 (count)", lambda: route(
    expert_tokens_num_type=0)))
check("routing_no_flag_refused", lambda: expect(RuntimeError, "only True", lambda: route(
    expert_tokens_num_flag=False)))
check("routing_drop_pad_refused", lambda: expect(RuntimeError, "drop_pad_mode", lambda: route(
    drop_pad_mode=1)))
check("routing_range_refused", lambda: expect(RuntimeError, "expert_end <= expert_num", lambda:
    route(active_expert_range=[0, E + 1])))
check("routing_expert_num_refused", lambda: expect(RuntimeError, "(0, 10240]", lambda: route(
    expert_num=0, active_expert_range=[])))
check("routing_id_past_expert_num_refused", lambda: expect(RuntimeError, "outside [0, expert_num",
    lambda: synced(lambda: route(expert_num=4, active_expert_range=[0, 4]))))
check("routing_quant_not_modelled", lambda: expect(NotInTwinError, "quant_mode 1", lambda: route(
    quant_mode=1)))
check("routing_key_value_not_modelled", lambda: expect(NotInTwinError, "key_value", lambda: route(
    expert_tokens_num_type=2)))
check("routing_scatter_not_modelled", lambda: expect(NotInTwinError, "row_idx_type", lambda: route(
    row_idx_type=1)))
check("routing_active_not_modelled", lambda: expect(NotInTwinError, "Active", lambda: route(
    active_num=4)))
check("routing_host_tensor_refused", lambda: expect(
    npu_twin.device.HostPointerError, "on the NPU", lambda: route(x=x_h)))
'''

GMM = COMMON + '''
M, KD, N, E = 11, 8, 6, 4
counts = [3, 0, 5, 2]  # 10 of 11 rows: the last is past every group
x_h = torch.randn(M, KD, generator=gen).bfloat16()
w_h = torch.randn(E, N, KD, generator=gen).bfloat16()  # vLLM's [E, N, K], passed transposed
b_h = torch.randn(E, N, generator=gen)
x, w, b = x_h.to(dev), w_h.to(dev), b_h.to(dev)


def want(with_bias):
    out = np.zeros((M, N))
    row = 0
    for e, n in enumerate(counts):
        for r in range(row, row + n):
            for j in range(N):
                out[r, j] = sum(float(x_h[r, i]) * float(w_h[e, j, i]) for i in range(KD))
                out[r, j] += float(b_h[e, j]) if with_bias else 0.0
        row += n
    return out


def gmm(**kw):
    args = dict(bias=[b], split_item=2, group_list_type=1, group_type=0)
    args.update(kw)
    if "group_list" not in args:
        args["group_list"] = torch.tensor(counts).to(dev)
    return torch_npu.npu_grouped_matmul(x=[args.pop("x", x)],
                                        weight=[args.pop("w", w.transpose(1, 2))], **args)


def gmm_numerics():
    got = gmm()
    eq((len(got), tuple(got[0].shape), got[0].dtype), (1, (M, N), torch.bfloat16))
    close(got[0][:10], want(True)[:10], 1e-2)
    close(gmm(bias=None)[0][:10], want(False)[:10], 1e-2)
    cumsum = torch.tensor(np.cumsum(counts).tolist()).to(dev)
    close(gmm(group_list=cumsum, group_list_type=0)[0][:10], want(True)[:10], 1e-2)


def gmm_captured():
    group_list = torch.tensor(counts).to(dev)
    with capture() as (graph, stream):
        got = gmm(group_list=group_list)
    graph.replay()
    close(got[0][:10], want(True)[:10], 1e-2)


check("grouped_matmul_matches_loops", gmm_numerics)
check("grouped_matmul_captured_runs_at_replay", gmm_captured)
synced = lambda fn: (fn(), torch.npu.synchronize())  # noqa: E731
check("gmm_bias_dtype_refused", lambda: expect(RuntimeError, "torch.float32 for an x of", lambda:
    gmm(bias=[b.bfloat16()])))
check("gmm_weight_dtype_refused", lambda: expect(RuntimeError, "x's dtype", lambda: gmm(
    w=w.transpose(1, 2).half())))
check("gmm_k_refused", lambda: expect(RuntimeError, "weight's K", lambda: gmm(w=w)))
check("gmm_group_list_dtype_refused", lambda: expect(RuntimeError, "int64", lambda: gmm(
    group_list=torch.tensor(counts, dtype=torch.int32).to(dev))))
check("gmm_group_list_length_refused", lambda: expect(RuntimeError, "one entry per", lambda: gmm(
    group_list=torch.tensor(counts[:3]).to(dev))))
check("gmm_group_list_type_refused", lambda: expect(RuntimeError, "0 (cumsum) or 1", lambda: gmm(
    group_list_type=2)))
check("gmm_groups_past_x_refused", lambda: expect(RuntimeError, "x has 11", lambda: synced(
    lambda: gmm(group_list=torch.tensor([3, 0, 5, 4]).to(dev)))))
check("gmm_decreasing_cumsum_refused", lambda: expect(RuntimeError, "non-decreasing", lambda:
    synced(lambda: gmm(group_list=torch.tensor([3, 2, 5, 6]).to(dev), group_list_type=0))))
check("gmm_split_item_not_modelled", lambda: expect(NotInTwinError, "split_item 0", lambda: gmm(
    split_item=0)))
check("gmm_quant_not_modelled", lambda: expect(NotInTwinError, "per_token_scale", lambda: gmm(
    per_token_scale=[b[0]])))
check("gmm_group_type_not_modelled", lambda: expect(NotInTwinError, "group_type -1", lambda: gmm(
    group_type=-1)))
check("gmm_lists_not_modelled", lambda: expect(NotInTwinError, "several", lambda:
    torch_npu.npu_grouped_matmul([x, x], [w.transpose(1, 2)], group_type=0, split_item=2,
                                 group_list=torch.tensor(counts).to(dev))))
'''

UNPERMUTE = COMMON + '''
T, K, H = 4, 2, 8
perm_h = torch.randn(T * K, H, generator=gen).bfloat16()
idx_h = torch.randperm(T * K, generator=gen).to(torch.int32)
probs_h = torch.rand(T, K, generator=gen).bfloat16()
perm, idx, probs = perm_h.to(dev), idx_h.to(dev), probs_h.to(dev)


def want(with_probs):
    out = np.zeros((T, H))
    for t in range(T):
        for k in range(K):
            weight = float(probs_h[t, k]) if with_probs else 1.0
            out[t] += perm_h[int(idx_h[t * K + k])].double().numpy() * weight
    return out


def unpermute_numerics():
    got = torch_npu.npu_moe_token_unpermute(permuted_tokens=perm, sorted_indices=idx, probs=probs)
    eq((tuple(got.shape), got.dtype), ((T, H), torch.bfloat16))
    close(got, want(True), 1e-2)
    close(torch_npu.npu_moe_token_unpermute(perm, idx.long(), probs), want(True), 1e-2)
    # without probs topK is 1: one row each
    one = torch_npu.npu_moe_token_unpermute(perm, idx)
    close(one, perm_h[idx_h.long()].double().numpy(), 0)


def unpermute_captured():
    with capture() as (graph, stream):
        got = torch_npu.npu_moe_token_unpermute(perm, idx, probs)
    graph.replay()
    close(got, want(True), 1e-2)


check("token_unpermute_matches_loops", unpermute_numerics)
check("token_unpermute_captured_runs_at_replay", unpermute_captured)
un = lambda **kw: (torch_npu.npu_moe_token_unpermute(  # noqa: E731
    kw.get("perm", perm), kw.get("idx", idx), kw.get("probs", probs),
    kw.get("padded_mode", False)), torch.npu.synchronize())
check("unpermute_float16_refused", lambda: expect(RuntimeError, "bfloat16", lambda: un(
    perm=perm.half())))
check("unpermute_probs_dtype_refused", lambda: expect(RuntimeError, "probs must be", lambda: un(
    probs=probs.float())))
check("unpermute_rows_refused", lambda: expect(RuntimeError, "num_tokens*topK = 8", lambda: un(
    perm=perm[:6].contiguous())))
check("unpermute_probs_count_refused", lambda: expect(RuntimeError, "one weight", lambda: un(
    probs=probs[:3].contiguous())))
check("unpermute_padded_refused", lambda: expect(RuntimeError, "padded_mode", lambda: un(
    padded_mode=True)))
check("unpermute_index_past_rows_refused", lambda: expect(RuntimeError, "outside [0, 8)", lambda:
    un(idx=torch.tensor([0, 1, 2, 3, 4, 5, 6, 8], dtype=torch.int32).to(dev))))
'''

GATING = COMMON + '''
from pyruntime.npu_twin import vllm_ascend_c
vllm_ascend_c.register("0.30.0rc2")  # what importing vllm_ascend.vllm_ascend_C does there

gate = torch.ops._C_ascend.moe_gating_top_k
T = 5


def want(logits, k, k_group, groups, mode, renorm, norm_type, scale, bias):
    """By loops in float64: scores, group pick, top-k, weights."""
    logits = logits.double().numpy()
    bias = np.zeros(logits.shape[1]) if bias is None else bias.double().numpy()
    weights, ids = np.zeros((len(logits), k)), np.zeros((len(logits), k), dtype=int)
    for t, row in enumerate(logits):
        if norm_type == 0:
            norm = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        else:
            norm = 1 / (1 + np.exp(-row))
        score = norm + bias
        size = len(row) // groups
        group_score = [sorted(score[g * size:(g + 1) * size])[-2:] for g in range(groups)]
        group_score = [max(s) if mode == 0 else sum(s) for s in group_score]
        kept = sorted(range(groups), key=lambda g: -group_score[g])[:k_group]
        allowed = [e for e in range(len(row)) if e // size in kept]
        top = sorted(allowed, key=lambda e: -score[e])[:k]
        w = np.array([norm[e] for e in top])
        if norm_type == 1 or renorm == 1:
            w = w / (w.sum() + 1e-20)
        weights[t], ids[t] = w * scale, top
    return weights, ids


def gpt_oss_router():
    # 0.30.0rc2 fused_topk_router: softmax, renorm 1, no groups, no bias, scale 1
    logits_h = torch.randn(T, 8, generator=gen).bfloat16()
    y, idx, out = gate(logits_h.to(dev), k=2, k_group=1, group_count=1, group_select_mode=1,
                       renorm=1, norm_type=0, out_flag=False, routed_scaling_factor=1.0,
                       eps=1e-20, bias_opt=None)
    eq([(tuple(t.shape), t.dtype) for t in (y, idx, out)],
       [((T, 2), torch.bfloat16), ((T, 2), torch.int32), ((T, 8), torch.float32)])
    w, ids = want(logits_h, 2, 1, 1, 1, 1, 0, 1.0, None)
    eq(idx.cpu().tolist(), ids.tolist())
    close(y, w, 1e-2)


def deepseek_router():
    # sigmoid, 8 groups keep 4, top-2-sum group score, e_score_correction_bias, scale 2.5
    logits_h = torch.randn(T, 64, generator=gen).bfloat16()
    bias_h = (torch.randn(64, generator=gen) * 0.1).bfloat16()
    y, idx, out = gate(logits_h.to(dev), k=6, k_group=4, group_count=8, group_select_mode=1,
                       renorm=1, norm_type=1, out_flag=True, routed_scaling_factor=2.5,
                       eps=1e-20, bias_opt=bias_h.to(dev))
    w, ids = want(logits_h, 6, 4, 8, 1, 1, 1, 2.5, bias_h)
    eq(idx.cpu().tolist(), ids.tolist())
    close(y, w, 1e-2)
    close(out, 1 / (1 + np.exp(-logits_h.double().numpy())), 1e-5)
    # the bias steers the choice only: dropping it changes the experts here
    eq(want(logits_h, 6, 4, 8, 1, 1, 1, 2.5, None)[1].tolist() != ids.tolist(), True)


def gating_captured():
    logits_h = torch.randn(T, 8, generator=gen).bfloat16()
    logits = logits_h.to(dev)
    with capture() as (graph, stream):
        y, idx, _ = gate(logits, 2, 1, 1, 0, 1, 0, False, 1.0, 1e-20)
    graph.replay()
    eq(idx.cpu().tolist(), want(logits_h, 2, 1, 1, 0, 1, 0, 1.0, None)[1].tolist())


check("gating_top_k_gpt_oss_matches_loops", gpt_oss_router)
check("gating_top_k_deepseek_matches_loops", deepseek_router)
check("gating_top_k_captured_runs_at_replay", gating_captured)
lg = torch.randn(T, 64, generator=gen).bfloat16().to(dev)
g = lambda *a, bias=None: gate(lg, *a, False, 1.0, 1e-20, bias_opt=bias)  # noqa: E731
check("gating_k_refused", lambda: expect(RuntimeError, "(0, expert num 64]", lambda: g(
    65, 1, 1, 0, 0, 0)))
check("gating_groups_refused", lambda: expect(RuntimeError, "not divisible", lambda: g(
    2, 1, 5, 0, 0, 0)))
check("gating_k_group_refused", lambda: expect(RuntimeError, "0 < k_group <= group_count",
    lambda: g(2, 9, 8, 0, 0, 0)))
check("gating_norm_type_refused", lambda: expect(RuntimeError, "norm type 2", lambda: g(
    2, 1, 1, 0, 0, 2)))
check("gating_k_past_groups_refused", lambda: expect(RuntimeError, "k_group * experts", lambda:
    g(20, 2, 8, 0, 0, 1)))
check("gating_bias_dtype_refused", lambda: expect(RuntimeError, "should be same", lambda: g(
    2, 1, 1, 0, 0, 0, bias=torch.zeros(64).to(dev))))
check("gating_3d_refused", lambda: expect(RuntimeError, "should be 2D", lambda: gate(
    lg.view(1, T, 64), 2, 1, 1, 0, 0, 0, False, 1.0, 1e-20)))
'''

# vLLM-Ascend's routed experts at TP 1 (AllGather dispatcher), the ops in its order, on a
# gpt-oss-shaped layer (softmax top-k renormalised, expert biases, swigluoai by plain torch)
# and a DeepSeek-V3-shaped one (grouped sigmoid top-k with correction bias and scaling,
# npu_swiglu's silu * up done here in plain torch: a dense op of model_ops), against a float64
# MoE by loops
CHAIN = COMMON + '''
RELEASE = "{release}"
from pyruntime.npu_twin import vllm_ascend_c
vllm_ascend_c.register(RELEASE)
# the dispatcher's routing op: 0.30.0rc2 torch_npu's, 0.23.0.post1 its own (A2/A3 DeviceOperator)
init_routing = (torch_npu.npu_moe_init_routing_v2 if RELEASE == "0.30.0rc2"
                else torch.ops._C_ascend.npu_moe_init_routing_custom)

T, H, I = 6, 16, 8


def swigluoai(gate_up, alpha=1.702, limit=7.0):
    # vLLM's SwigluOAIAndMul.forward_native: interleaved gate/up
    g, u = gate_up[..., ::2].clamp(max=limit), gate_up[..., 1::2].clamp(-limit, limit)
    return (u + 1) * g * torch.sigmoid(g * alpha)


def silu_mul(gate_up):
    g, u = gate_up.chunk(2, -1)
    return torch.nn.functional.silu(g) * u


def layer(x, logits, w13, b13, w2, b2, act, router):
    """As vLLM-Ascend: router, init_routing_v2, gmm1, activation, gmm2, unpermute."""
    E, K = w13.shape[0], router["k"]
    weights, ids, _ = torch.ops._C_ascend.moe_gating_top_k(logits, out_flag=False, eps=1e-20,
                                                           **router)
    ids = ids.to(torch.int32)
    sorted_x, row_idx, counts, _ = init_routing(
        x, ids, scale=None, active_num=T * K, expert_num=E, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[0, E], quant_mode=-1)
    counts = counts.to(torch.int64)
    gate_up = torch_npu.npu_grouped_matmul(
        x=[sorted_x], weight=[w13.transpose(1, 2)],
        bias=[b13.float()] if b13 is not None else None, split_item=2, group_list_type=1,
        group_type=0, group_list=counts)[0]
    h = act(gate_up)
    down = torch_npu.npu_grouped_matmul(
        x=[h], weight=[w2.transpose(1, 2)], bias=[b2.float()] if b2 is not None else None,
        split_item=2, group_list_type=1, group_type=0, group_list=counts)[0]
    return torch_npu.npu_moe_token_unpermute(permuted_tokens=down,
                                             sorted_indices=torch.abs(row_idx),
                                             probs=weights.to(down.dtype))


def reference(x, logits, w13, b13, w2, b2, act, router):
    """float64 by loops: each token's top-k experts' MLPs, weighted."""
    x, logits = x.double(), logits.double()
    E, k = w13.shape[0], router["k"]
    groups, k_group = router["group_count"], router["k_group"]
    bias = router.get("bias_opt")
    out = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        norm = torch.softmax(logits[t], -1) if router["norm_type"] == 0 else logits[t].sigmoid()
        score = norm + (bias.double() if bias is not None else 0)
        size = E // groups
        gs = [score[g * size:(g + 1) * size].topk(2).values.sum() for g in range(groups)]
        kept = sorted(range(groups), key=lambda g: -float(gs[g]))[:k_group]
        allowed = [e for e in range(E) if e // size in kept]
        top = sorted(allowed, key=lambda e: -float(score[e]))[:k]
        w = torch.stack([norm[e] for e in top])
        w = w / (w.sum() + 1e-20) * router["routed_scaling_factor"]
        for e, we in zip(top, w):
            gu = w13[e].double() @ x[t] + (b13[e].double() if b13 is not None else 0)
            d = w2[e].double() @ act(gu) + (b2[e].double() if b2 is not None else 0)
            out[t] += we * d
    return out.numpy()


def run(shape):
    E = 8
    x_h = torch.randn(T, H, generator=gen).bfloat16()
    logits_h = torch.randn(T, E, generator=gen).bfloat16()
    w13_h = (torch.randn(E, 2 * I, H, generator=gen) * 0.3).bfloat16()
    w2_h = (torch.randn(E, H, I, generator=gen) * 0.3).bfloat16()
    if shape == "gpt-oss":
        b13_h, b2_h = (torch.randn(E, 2 * I, generator=gen) * 0.1).bfloat16(), \\
            (torch.randn(E, H, generator=gen) * 0.1).bfloat16()
        act = swigluoai
        router = dict(k=2, k_group=1, group_count=1, group_select_mode=1, renorm=1,
                      norm_type=0, routed_scaling_factor=1.0)
    else:
        b13_h = b2_h = None
        act = silu_mul
        router = dict(k=3, k_group=2, group_count=4, group_select_mode=1, renorm=1,
                      norm_type=1, routed_scaling_factor=2.5,
                      bias_opt=(torch.randn(E, generator=gen) * 0.1).bfloat16())
    on = lambda t: t.to(dev) if t is not None else None  # noqa: E731
    dev_router = dict(router, bias_opt=on(router.get("bias_opt")))
    got = layer(*(on(t) for t in (x_h, logits_h, w13_h, b13_h, w2_h, b2_h)), act, dev_router)
    close(got, reference(x_h, logits_h, w13_h, b13_h, w2_h, b2_h, act, router), 3e-2)


check("gpt_oss_moe_chain_matches_float64", lambda: run("gpt-oss"))
check("deepseek_v3_moe_chain_matches_float64", lambda: run("deepseek-v3"))
'''

# The fake kernels: Dynamo traces the chain on fake tensors (fullgraph, no graph break) and
# the outputs have the real op's shapes and dtypes
FAKE = '''
import torch_npu
from torch._subclasses.fake_tensor import FakeTensorMode

graphs = []


def backend(gm, example_inputs):
    graphs.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                   and str(n.target).startswith("npu.")])
    return gm.forward


def fn(x, ids, w, b, probs):
    sorted_x, row_idx, counts, _ = torch.ops.npu.npu_moe_init_routing_v2(
        x, ids, active_num=12, expert_num=4, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[0, 4])
    y = torch.ops.npu.npu_grouped_matmul([sorted_x], [w], bias=[b], group_list=counts,
                                         split_item=2, group_type=0, group_list_type=1)[0]
    out = torch.ops.npu.npu_moe_token_unpermute(y, row_idx, probs)
    return sorted_x, row_idx, counts, y, out


def traced():
    with FakeTensorMode():
        args = (torch.empty(6, 16, dtype=torch.bfloat16), torch.empty(6, 2, dtype=torch.int32),
                torch.empty(4, 16, 8, dtype=torch.bfloat16), torch.empty(4, 8),
                torch.empty(6, 2, dtype=torch.bfloat16))
        out = torch.compile(fn, backend=backend, fullgraph=True)(*args)
    eq([(tuple(t.shape), t.dtype) for t in out],
       [((12, 16), torch.bfloat16), ((12,), torch.int32), ((4,), torch.int64),
        ((12, 8), torch.bfloat16), ((6, 8), torch.bfloat16)])
    eq(graphs, [["npu.npu_moe_init_routing_v2", "npu.npu_grouped_matmul",
                 "npu.npu_moe_token_unpermute"]])


check("fake_kernels_trace_under_dynamo", traced)

from pyruntime.npu_twin import vllm_ascend_c  # noqa: E402
vllm_ascend_c.register("0.23.0.post1")
custom = []


def custom_backend(gm, example_inputs):
    custom.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                   and str(n.target).startswith("_C_ascend.")])
    return gm.forward


def router(logits, bias, x):
    y, ids, out = torch.ops._C_ascend.moe_gating_top_k(logits, 3, 2, 4, 1, 1, 1, False, 2.5,
                                                       1e-20, bias_opt=bias)
    routed = torch.ops._C_ascend.npu_moe_init_routing_custom(
        x, ids, active_num=18, expert_num=8, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[0, 8], quant_mode=-1)
    return (y, ids, out) + tuple(routed)


def traced_c_ascend():
    with FakeTensorMode():
        args = (torch.empty(6, 8, dtype=torch.bfloat16), torch.empty(8, dtype=torch.bfloat16),
                torch.empty(6, 16, dtype=torch.bfloat16))
        out = torch.compile(router, backend=custom_backend, fullgraph=True)(*args)
    eq([(tuple(t.shape), t.dtype) for t in out],
       [((6, 3), torch.bfloat16), ((6, 3), torch.int32), ((6, 8), torch.float32),
        ((18, 16), torch.bfloat16), ((18,), torch.int32), ((8,), torch.int64),
        ((18,), torch.float32)])
    eq(custom, [["_C_ascend.moe_gating_top_k",
                 "_C_ascend.npu_moe_init_routing_custom"]])


check("c_ascend_meta_kernels_trace_under_dynamo", traced_c_ascend)
'''


@pytest.mark.parametrize("script", [ROUTING, GMM, UNPERMUTE, GATING,
                                    CHAIN.replace("{release}", "0.30.0rc2"),
                                    CHAIN.replace("{release}", "0.23.0.post1"), FAKE],
                         ids=["init-routing", "grouped-matmul", "unpermute", "gating",
                              "chain-0.30.0rc2", "chain-0.23.0.post1", "fake"])
def test_moe_ops_on_the_twin(script, run_twin):
    found = run_twin.rules(run_twin(script, timeout=240))
    assert found and "<script>" not in found, found.get("<script>", found)
    bad = {rule: outcome for rule, outcome in found.items() if outcome != "ok"}
    assert not bad, bad



@pytest.mark.parametrize("release", ["0.23.0.post1", "0.30.0rc2"])
def test_vllm_ascends_own_moe_path_on_the_twin(release, run_vllm_tool):
    """vLLM-Ascend's own ``DeviceOperator.moe_gating_top_k``, ``TokenDispatcherWithAllGather``
    (the dispatcher ``select_moe_comm_method`` picks at TP 1) and unquantised expert MLP
    (0.30.0rc2 ``apply_moe_mlp``, 0.23.0.post1 ``unquant_apply_mlp``) issue the twin's MoE
    ops in order, and the gpt-oss-shaped layer and the DeepSeek-V3 router match float64, much
    closer than the answer without the expert biases; the correction bias changes the experts
    chosen, and the twin chose the reference's."""
    report = run_vllm_tool(release, "vllm_ascend_moe_paths.py")
    routing = ("_C_ascend::npu_moe_init_routing_custom" if release == "0.23.0.post1"
               else "npu_moe_init_routing_v2")
    gate, unpermute, gmm = ("_C_ascend::moe_gating_top_k", "npu_moe_token_unpermute",
                            "npu_grouped_matmul")
    assert report["gpt_oss"]["ops"] == [gate, routing, gmm, gmm, unpermute]
    assert report["deepseek_v3_router"]["ops"] == [gate, routing, unpermute]
    assert report["gpt_oss"]["max_rel_err"] < 2e-2 < \
        report["gpt_oss"]["distance_without_expert_biases"], report
    deepseek = report["deepseek_v3_router"]
    assert deepseek["max_rel_err"] < 2e-2 and deepseek["experts_match"], report
    assert deepseek["bias_changes_experts"], report
