"""vLLM-Ascend's own MoE pieces at TP 1 on the NPU twin without our hook, against a float64 MoE
written here: its router op (``DeviceOperator.moe_gating_top_k`` of the A2/A3 adaptor), its
AllGather token dispatcher (``TokenDispatcherWithAllGather.token_dispatch`` /
``token_combine``) and its unquantised expert MLP (0.30.0rc2: ``moe_mlp.apply_moe_mlp`` with
``AscendUnquantizedFusedMoEMethod``'s ``apply_gmm1``/``apply_gmm2``; 0.23.0.post1:
``moe_mlp.unquant_apply_mlp``).

Run it with a release's environment (``tools/vllm_env.sh RELEASE``)::

    PYTHONPATH=$PWD:$ENV/vllm-ascend $ENV/venv/bin/python tools/vllm_ascend_moe_paths.py

with ``ENV=~/.cache/aicpu-tiling/vllm-envs/<release>``. It prints one JSON line: per case the
largest error relative to the reference's largest value, the ops vLLM-Ascend issued, and how
far the answer is from one with the router's bias (or expert biases) dropped, so the check can
fail.

Cases: a gpt-oss-shaped layer (8 experts, top 2, softmax renormalised, expert biases, the
``swigluoai`` activation, which vLLM-Ascend runs as vLLM's ``SwigluOAIAndMul.forward_native``)
through router, dispatch, MLP and combine; and a DeepSeek-V3-shaped router (8 experts in 4
groups, keep 2, top 3, sigmoid, ``e_score_correction_bias``, scale 2.5) through router,
dispatch and combine with the experts as identity (its ``silu`` MLP calls ``npu_swiglu``, a
dense op another module of the twin models). What stands in: the layer (an ``nn.Module``
holding the weights as ``process_weights_after_loading`` leaves them, ``[E, H, 2I]`` and
``[E, I, H]``), the method's ``moe`` config (``has_bias``) for 0.30.0rc2 (its ``__init__`` needs
a model's vLLM config).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKENS, HIDDEN, INTER, EXPERTS = 6, 16, 8, 8


def main() -> int:
    from pyruntime.hook.dryrun import check_real_vllm_ascend, start_device

    check_real_vllm_ascend()
    device_name = start_device("graph")
    from importlib import metadata

    import torch
    import vllm_ascend.ops
    import vllm_ascend.vllm_ascend_C  # noqa: F401  (the _C_ascend ops)
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm_ascend.device.device_op import DeviceOperator
    from vllm_ascend.ops.fused_moe import moe_mlp
    from vllm_ascend.ops.fused_moe.token_dispatcher import TokenDispatcherWithAllGather

    from pyruntime.npu_twin import device as twin
    from pyruntime.npu_twin import moe_ops

    release = metadata.version("vllm_ascend")
    if release.startswith("0.23"):  # the same dataclasses, in other modules
        from vllm_ascend.ops.fused_moe.moe_stage_contracts import MoETokenDispatchInput
        from vllm_ascend.ops.fused_moe.moe_stage_params import MoEQuantParams
        from vllm_ascend.ops.fused_moe.moe_stage_params import MoERoutingParams as MoeRouterInput
    else:
        from vllm_ascend.ops.fused_moe.dataclass.moe_quant import MoEQuantParams
        from vllm_ascend.ops.fused_moe.dataclass.router_input import MoeRouterInput
        from vllm_ascend.ops.fused_moe.dataclass.token_dispatcher import MoETokenDispatchInput
    issued: list[str] = []
    enqueue_aicore = twin.Device.enqueue_aicore

    def recorded_enqueue(dev, op, run, **kwargs):
        if run.__module__ == moe_ops.__name__:  # a task of moe_ops (its body is moe_ops')
            issued.append(op)
        return enqueue_aicore(dev, op, run, **kwargs)

    twin.Device.enqueue_aicore = recorded_enqueue
    gen = torch.Generator().manual_seed(0)
    dev = torch.device("npu", 0)
    bf16 = torch.bfloat16

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(bf16)

    def route(logits, router: dict):
        weights, ids, _ = DeviceOperator.moe_gating_top_k(
            logits.to(dev), out_flag=False, eps=1e-20,
            bias_opt=router["bias"].to(dev) if router["bias"] is not None else None,
            **{k: v for k, v in router.items() if k != "bias"})
        return weights, ids

    def dispatch(x, weights, ids, k):
        dispatcher = TokenDispatcherWithAllGather(top_k=k, num_experts=EXPERTS,
                                                  num_local_experts=EXPERTS)
        out = dispatcher.token_dispatch(MoETokenDispatchInput(
            hidden_states=x.to(dev), topk_weights=weights, topk_ids=ids,
            routing=MoeRouterInput(expert_map=None, global_redundant_expert_num=0,
                                   mc2_mask=None, apply_router_weight_on_input=False),
            quant=MoEQuantParams()))
        return dispatcher, out

    def mlp(out, layer, has_bias):
        if release.startswith("0.23"):
            hidden, _ = moe_mlp.unquant_apply_mlp(
                out.hidden_states, layer.w13_weight, layer.w2_weight, out.group_list,
                w1_bias=layer.w13_bias if has_bias else None,
                w2_bias=layer.w2_bias if has_bias else None,
                activation=MoEActivation.SWIGLUOAI, group_list_type=out.group_list_type,
                need_trans=False)
            return hidden
        from vllm_ascend.ops.fused_moe.dataclass.fused_experts import MoEWeights
        from vllm_ascend.ops.fused_moe.dataclass.moe_mlp import MoEMlpComputeInput
        from vllm_ascend.ops.fused_moe.routed_experts import AscendUnquantizedFusedMoEMethod

        method = AscendUnquantizedFusedMoEMethod.__new__(AscendUnquantizedFusedMoEMethod)
        method.moe = types.SimpleNamespace(has_bias=has_bias)
        method.lora_context = None
        hidden, _ = moe_mlp.apply_moe_mlp(MoEMlpComputeInput(
            hidden_states=out.hidden_states, group_list=out.group_list,
            group_list_type=out.group_list_type, dynamic_scale=None, topk_scales=None,
            weights=MoEWeights(w1=layer.w13_weight, w2=layer.w2_weight), quant=MoEQuantParams(),
            fusion=False, layer=layer, activation=MoEActivation.SWIGLUOAI, need_trans=False),
            method)
        return hidden

    def choose(logits, router: dict):
        """float64: each token's experts and weights (``moe_ops`` is not used here)."""
        logits = logits.double()
        groups, k_group, k = router["group_count"], router["k_group"], router["k"]
        bias = router["bias"]
        picks = []
        for t in range(TOKENS):
            norm = (torch.softmax(logits[t], -1) if router["norm_type"] == 0
                    else logits[t].sigmoid())
            score = norm + (bias.double() if bias is not None else 0)
            size = EXPERTS // groups
            group_score = [score[g * size:(g + 1) * size].topk(min(2, size)).values.sum()
                           for g in range(groups)]
            kept = sorted(range(groups), key=lambda g: -float(group_score[g]))[:k_group]
            allowed = [e for e in range(EXPERTS) if e // size in kept]
            top = sorted(allowed, key=lambda e: -float(score[e]))[:k]
            w = torch.stack([norm[e] for e in top])
            picks.append((top, w / (w.sum() + 1e-20) * router["routed_scaling_factor"]))
        return picks

    def swigluoai(gate_up, alpha=1.702, limit=7.0):
        gate, up = gate_up[::2].clamp(max=limit), gate_up[1::2].clamp(-limit, limit)
        return (up + 1) * gate * torch.sigmoid(gate * alpha)

    def error(got, want):
        return float((got.detach().cpu().double() - want).abs().max() / want.abs().max())

    report: dict = {"vllm_ascend": release, "device": device_name}

    # gpt-oss: router, dispatch, MLP with biases and swigluoai, combine
    x, logits = rnd(TOKENS, HIDDEN), rnd(TOKENS, EXPERTS)
    w13, w2 = rnd(EXPERTS, 2 * INTER, HIDDEN, scale=0.3), rnd(EXPERTS, HIDDEN, INTER, scale=0.3)
    b13, b2 = rnd(EXPERTS, 2 * INTER, scale=0.5), rnd(EXPERTS, HIDDEN, scale=0.5)
    layer = torch.nn.Module()
    # as process_weights_after_loading leaves them (transposed, contiguous)
    layer.w13_weight = torch.nn.Parameter(w13.transpose(1, 2).contiguous().to(dev),
                                          requires_grad=False)
    layer.w2_weight = torch.nn.Parameter(w2.transpose(1, 2).contiguous().to(dev),
                                         requires_grad=False)
    layer.w13_bias = torch.nn.Parameter(b13.to(dev), requires_grad=False)
    layer.w2_bias = torch.nn.Parameter(b2.to(dev), requires_grad=False)
    router = {"k": 2, "k_group": 1, "group_count": 1, "group_select_mode": 1, "renorm": 1,
              "norm_type": 0, "routed_scaling_factor": 1.0, "bias": None}
    issued.clear()
    weights, ids = route(logits, router)
    dispatcher, out = dispatch(x, weights, ids, 2)
    hidden = mlp(out, layer, has_bias=True)
    got = dispatcher.token_combine(hidden, out.combine_metadata)
    torch.npu.synchronize()

    def gpt_oss_reference(with_bias: bool):
        want = torch.zeros(TOKENS, HIDDEN, dtype=torch.float64)
        for t, (top, w) in enumerate(choose(logits, router)):
            for e, we in zip(top, w):
                gate_up = w13[e].double() @ x[t].double() + (b13[e].double() if with_bias else 0)
                down = w2[e].double() @ swigluoai(gate_up) + (b2[e].double() if with_bias else 0)
                want[t] += we * down
        return want

    want = gpt_oss_reference(True)
    report["gpt_oss"] = {"max_rel_err": error(got, want), "ops": list(issued),
                         "distance_without_expert_biases":
                             error(got, gpt_oss_reference(False)) if want.abs().max() else 0.0}

    # DeepSeek-V3 router: grouped sigmoid top-k with the correction bias, identity experts
    x, logits = rnd(TOKENS, HIDDEN), rnd(TOKENS, EXPERTS)
    router = {"k": 3, "k_group": 2, "group_count": 4, "group_select_mode": 1, "renorm": 1,
              "norm_type": 1, "routed_scaling_factor": 2.5, "bias": rnd(EXPERTS, scale=0.5)}
    issued.clear()
    weights, ids = route(logits, router)
    dispatcher, out = dispatch(x, weights, ids, 3)
    got = dispatcher.token_combine(out.hidden_states, out.combine_metadata)
    got_ids = ids.cpu().tolist()
    torch.npu.synchronize()
    picks = choose(logits, router)
    want = torch.stack([w.sum() * x[t].double() for t, (_, w) in enumerate(picks)])
    unbiased = choose(logits, dict(router, bias=None))
    report["deepseek_v3_router"] = {
        "max_rel_err": error(got, want), "ops": list(issued),
        "experts_match": got_ids == [top for top, _ in picks],
        "bias_changes_experts": [top for top, _ in unbiased] != [top for top, _ in picks]}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
