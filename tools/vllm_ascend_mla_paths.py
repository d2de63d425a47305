"""vLLM-Ascend's own MLA attention (``AscendMLAImpl.forward``, ``vllm_ascend/attention/
mla_v1.py``) on the NPU twin without our hook: a prefill step, a decode batch captured and
replayed under vLLM-Ascend's ``ACLGraphWrapper`` with its own ``update_graph_params`` after
each replay (FULL_DECODE_ONLY), and one eager decode step, against a float64 DeepSeek MLA
written here.

Run it with a release's environment (``tools/vllm_env.sh RELEASE``)::

    PYTHONPATH=$PWD:$ENV/vllm-ascend $ENV/venv/bin/python tools/vllm_ascend_mla_paths.py

with ``ENV=~/.cache/aicpu-tiling/vllm-envs/<release>``. It prints one JSON line: the largest
relative error of each phase, the torch_npu ops vLLM-Ascend issued in each, and how far the
answer without the rope part is (so the check can fail).

One layer of a DeepSeek-V3-shaped decoder (bf16, 4 query heads, ``kv_lora_rank`` 512,
``qk_rope_head_dim`` 64, ``qk_nope_head_dim`` = ``v_head_dim`` 128, no ``q_lora_rank``, block
size 16) is vLLM-Ascend's ``AscendMLAImpl``, built by its ``__init__`` and
``process_weights_after_loading`` (``npu_format_cast`` on ``kv_b_proj``); its forward runs
the release's whole default path: ``kv_a_proj_with_mqa``, ``npu_kv_rmsnorm_rope_cache`` into
the paged caches, ``npu_interleave_rope`` on the query, FIA v1 TND with rope for the prefill,
FIA v2 ``BNSD_NBSD`` with rope for the decode (captured with ``.out`` and updated by
``update_graph_params``), ``npu_transpose_batchmatmul`` (``_v_up_proj``), ``o_proj``. What
stands in: the linear layers (a ``(x @ W.T, None)`` callable, as vLLM's ``LinearBase``
returns), the metadata (a namespace with the fields the forward reads: vLLM-Ascend's builder
needs the model's rotary embedding and runner), and the rotary tables (``cos``/``sin`` of the
positions, each frequency at i and 32 + i, as ``get_cos_and_sin_mla`` hands them). The model
config is vLLM's own ``ModelConfig`` of a DeepSeek-V3 ``config.json`` at these sizes, and one
rank's process groups are made as the worker makes them (``tools/_vllm_setup.py``): with
Triton, vLLM picks its model runner V2, whose forward context in vLLM-Ascend 0.30 reads the TP
group and whose choice reads config fields a namespace lacks.

The float64 reference is DeepSeek's MLA without absorption: per token ``q = x Wq``, latent
``c = RMSNorm(x Wkv_a[:512])``, ``k_pe = RoPE(x Wkv_a[512:])`` (GPT-J interleaved pairs),
``[k_nope | v] = c Wkv_b``, causal softmax over the request's tokens of ``q_nope . k_nope +
q_pe . k_pe``, times the scale, ``o = softmax v``, output ``o Wo``.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _vllm_setup  # tools/, beside this file

HEADS, HIDDEN, LORA, ROPE, NOPE, VDIM = 4, 64, 512, 64, 128, 128
BLOCK_SIZE, NUM_BLOCKS, MAX_BLOCKS = 16, 12, 3
NAME = "model.layers.0.self_attn.attn"
BUCKET = 4  # the decode graph's size: two requests padded to four
PROMPTS = (14, 3)  # request A crosses into its second block while decoding
TABLE = ((3, 7, 9), (1, 4, 0))
DECODE_STEPS = 3


def main() -> int:
    from pyruntime.hook.dryrun import check_real_vllm_ascend, start_device

    check_real_vllm_ascend()
    device_name = start_device("graph")
    import importlib
    from importlib import metadata

    import numpy as np
    import torch
    import torch_npu

    for module in ("vllm_ascend.ops", "vllm_ascend.attention.mla_v1",
                   "vllm_ascend.compilation.acl_graph"):
        importlib.import_module(module)
    import vllm_ascend.attention.mla_v1 as mla
    from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config
    from vllm.forward_context import BatchDescriptor, get_forward_context, set_forward_context
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm_ascend.ascend_config import init_ascend_config
    from vllm_ascend.compilation import acl_graph

    from pyruntime.npu_twin import device as twin
    from pyruntime.npu_twin import fia, mla_ops

    # the twin's ops vLLM-Ascend issues, by name, per phase
    issued: list[str] = []

    def recording(name, fn):
        def call(*args, **kwargs):
            issued.append(name)
            return fn(*args, **kwargs)
        return call

    fia_issue = fia._issue

    def recorded_issue(query, key, value, options, *args, **kwargs):
        op = kwargs.get("op", "npu_fused_infer_attention_score")
        issued.append(f"{op} {options.get('input_layout')} rope="
                      f"{options.get('query_rope') is not None}")
        return fia_issue(query, key, value, options, *args, **kwargs)

    fia._issue = recorded_issue
    enqueue_aicore = twin.Device.enqueue_aicore

    def recorded_enqueue(dev, op, run, **kwargs):
        # npu_interleave_rope's and npu_kv_rmsnorm_rope_cache's task (its body is mla_ops')
        if run.__module__ == mla_ops.__name__:
            issued.append(op)
        return enqueue_aicore(dev, op, run, **kwargs)

    twin.Device.enqueue_aicore = recorded_enqueue
    for name in ("npu_format_cast", "npu_transpose_batchmatmul"):
        setattr(torch_npu, name, recording(name, getattr(torch_npu, name)))

    dev = torch.device("npu", 0)
    bf16 = torch.bfloat16
    # vLLM's own ModelConfig of the tiny DeepSeek-V3 at this layer's sizes (one layer, dense
    # MLP, no q_lora_rank), and one rank's process groups, as the worker makes them
    # (tools/_vllm_setup.py: 0.30's forward context for vLLM's model runner V2, which vLLM
    # picks once Triton is there, reads the TP group)
    cfg = VllmConfig()
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    cfg.model_config = _vllm_setup.model_config(
        "deepseek-v3", max_model_len=MAX_BLOCKS * BLOCK_SIZE, enforce_eager=False,
        hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        kv_lora_rank=LORA, qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=VDIM,
        q_lora_rank=None, num_hidden_layers=1, first_k_dense_replace=1)
    ascend_config = init_ascend_config(cfg)
    _vllm_setup.single_rank_groups(cfg)
    import vllm_ascend.utils as ascend_utils

    if hasattr(ascend_utils, "set_weight_prefetch_method"):
        # as the model runner's __init__ does (0.23: model_runner_v1.py); forward reads it
        with set_current_vllm_config(cfg):
            ascend_utils.set_weight_prefetch_method(ascend_config.weight_prefetch_config)
    gen = torch.Generator().manual_seed(0)
    scale = (NOPE + ROPE) ** -0.5

    def weight(rows, cols):
        return (torch.randn(rows, cols, generator=gen) / cols ** 0.5).to(bf16)

    w_q = weight(HEADS * (NOPE + ROPE), HIDDEN)
    w_kva = weight(LORA + ROPE, HIDDEN)
    w_kvb = weight(HEADS * (NOPE + VDIM), LORA)
    w_o = weight(HIDDEN, HEADS * VDIM)
    gamma = (1 + 0.1 * torch.randn(LORA, generator=gen)).to(bf16)
    eps = 1e-6

    class Linear:
        """vLLM's linear layer as the MLA code calls it: ``(x @ W.T, bias)``."""

        def __init__(self, w):
            self.weight = torch.nn.Parameter(w.to(dev), requires_grad=False)
            self.quant_method = UnquantizedLinearMethod()

        def __call__(self, x, **kwargs):
            return x @ self.weight.T, None

    norm = types.SimpleNamespace(weight=gamma.to(dev), variance_epsilon=eps)
    with set_current_vllm_config(cfg):
        impl = mla.AscendMLAImpl(
            HEADS, LORA + ROPE, scale, 1, None, None, "auto", None, "decoder", None,
            q_lora_rank=None, kv_lora_rank=LORA, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE,
            qk_head_dim=NOPE + ROPE, v_head_dim=VDIM, rotary_emb=None, q_b_proj=None,
            q_proj=Linear(w_q), kv_b_proj=Linear(w_kvb), o_proj=Linear(w_o),
            kv_a_proj_with_mqa=Linear(w_kva), kv_a_layernorm=norm, fused_qkv_a_proj=None,
            q_a_layernorm=None, layer_name=NAME)
        impl.process_weights_after_loading(bf16)
    loaded = sorted(set(issued))
    assert not impl.enable_mlapo and not impl.enable_kv_nz and not impl.fa_quant_layer
    # vLLM-Ascend's MLA cache pair (num_kv_heads 1): the latent, then the rope part
    kv_cache = (torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 1, LORA, dtype=bf16, device=dev),
                torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 1, ROPE, dtype=bf16, device=dev))
    inv_freq = 1.0 / 10000 ** (torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE)

    def cos_sin(positions):
        """``[T, 1, 1, 64]`` each: frequency i's cos/sin at i and 32 + i."""
        angles = torch.tensor(positions, dtype=torch.float64)[:, None] * inv_freq
        angles = torch.cat([angles, angles], -1).view(-1, 1, 1, ROPE)
        return angles.cos().to(bf16), angles.sin().to(bf16)

    def slot(req, pos):
        return TABLE[req][pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE

    history = [[], []]  # each request's hidden states (host, bf16), position = index

    # ---- the float64 reference --------------------------------------------------------------
    def rope_gptj(x, pos):
        out = x.clone()
        angles = pos * inv_freq
        c, s = angles.cos(), angles.sin()
        out[..., 0::2] = x[..., 0::2] * c - x[..., 1::2] * s
        out[..., 1::2] = x[..., 1::2] * c + x[..., 0::2] * s
        return out

    def reference(req, rope=True):
        """The layer's output for every token of request ``req`` so far: ``[T, HIDDEN]``."""
        x = torch.stack(history[req]).double()
        t = x.shape[0]
        q = (x @ w_q.double().T).view(t, HEADS, NOPE + ROPE)
        kva = x @ w_kva.double().T
        lat = kva[:, :LORA]
        c = lat / torch.sqrt(lat.square().mean(-1, keepdim=True) + eps) * gamma.double()
        kvb = (c @ w_kvb.double().T).view(t, HEADS, NOPE + VDIM)
        k_nope, v = kvb[..., :NOPE], kvb[..., NOPE:]
        q_pe = torch.stack([rope_gptj(q[i, :, NOPE:], i) for i in range(t)])
        k_pe = torch.stack([rope_gptj(kva[i, LORA:], i) for i in range(t)])
        if not rope:
            q_pe = q_pe * 0
        scores = (torch.einsum("qhd,khd->hqk", q[..., :NOPE], k_nope) +
                  torch.einsum("qhd,kd->hqk", q_pe, k_pe)) * scale
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, -1)
        return o @ w_o.double().T

    def rel_err(got, want):
        return float((got.double() - want).abs().max() / want.abs().max())

    def forward_context(metas, num_tokens, mode):
        descriptor = BatchDescriptor(num_tokens=num_tokens, num_reqs=num_tokens, uniform=True)
        return set_forward_context(metas, cfg, num_tokens=num_tokens,
                                   cudagraph_runtime_mode=mode, batch_descriptor=descriptor)

    def set_extras(num_tokens):
        context = get_forward_context()
        for name, value in (("capturing", False), ("is_draft_model", False),
                            ("is_draft_model_prefill", False), ("sinks", False),
                            ("in_profile_run", False), ("num_tokens", num_tokens)):
            setattr(context, name, value)
        return context

    report: dict = {"vllm_ascend": metadata.version("vllm-ascend"), "device": device_name,
                    "ops": {"load": loaded}}

    # ---- prefill (eager): both prompts in one batch, attn_state PrefillNoCache ---------------
    issued.clear()
    xs = [torch.randn(n, HIDDEN, generator=gen).to(bf16) for n in PROMPTS]
    for req, x in enumerate(xs):
        history[req].extend(x)
    positions = [p for n in PROMPTS for p in range(n)]
    total = sum(PROMPTS)
    cos, sin = cos_sin(positions)
    slots = torch.tensor([slot(r, p) for r, n in enumerate(PROMPTS) for p in range(n)])
    ends = list(np.cumsum(PROMPTS).tolist())
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.int8), 1).to(dev)
    prefill = types.SimpleNamespace(
        actual_seq_lengths_q=ends, attn_mask=mask, cos=cos.to(dev), sin=sin.to(dev),
        chunked_context=None, pcp_local_num_input_tokens=None)
    meta = types.SimpleNamespace(
        num_actual_tokens=total, num_decodes=0, num_prefills=len(PROMPTS), num_decode_tokens=0,
        slot_mapping=slots.to(dev), attn_state=mla.AscendAttentionState.PrefillNoCache,
        causal=True, decode=None, prefill=prefill)
    out = torch.zeros(total, HIDDEN, dtype=bf16, device=dev)
    with set_current_vllm_config(cfg), forward_context({NAME: meta}, total, CUDAGraphMode.NONE):
        set_extras(total)
        impl.forward(NAME, torch.cat(xs).to(dev), kv_cache, meta, output=out)
    got = out.cpu()
    report["prefill_max_rel_err"] = max(
        rel_err(got[a:b], reference(r)) for r, (a, b) in enumerate(zip([0] + ends, ends)))
    report["ops"]["prefill"] = sorted(set(issued))

    # ---- decode: the graph's persistent buffers, vLLM-Ascend's wrapper and update -------------
    hidden = torch.zeros(BUCKET, HIDDEN, dtype=bf16, device=dev)
    cos_buf = torch.zeros(BUCKET, 1, 1, ROPE, dtype=bf16, device=dev)
    sin_buf = torch.zeros(BUCKET, 1, 1, ROPE, dtype=bf16, device=dev)
    slot_buf = torch.full((BUCKET,), -1, dtype=torch.int64, device=dev)
    table_buf = torch.zeros(BUCKET, MAX_BLOCKS, dtype=torch.int32, device=dev)
    out_buf = torch.zeros(BUCKET, HIDDEN, dtype=bf16, device=dev)
    table_buf[: len(TABLE)] = torch.tensor(TABLE, dtype=torch.int32).to(dev)

    def decode_meta(seq_lens, num_tokens):
        decode = types.SimpleNamespace(
            block_table=table_buf[:num_tokens], seq_lens_list=list(seq_lens),
            actual_seq_lengths_q=list(range(1, num_tokens + 1)), attn_mask=None,
            cos=cos_buf[:num_tokens], sin=sin_buf[:num_tokens], nope_zero_rope_cache=None)
        return types.SimpleNamespace(
            num_actual_tokens=num_tokens, num_decodes=num_tokens, num_prefills=0,
            num_decode_tokens=num_tokens, slot_mapping=slot_buf[:num_tokens],
            attn_state=mla.AscendAttentionState.DecodeOnly, causal=True, decode=decode,
            prefill=None)

    def forward(metas, num_tokens):
        impl.forward(NAME, hidden[:num_tokens], kv_cache, metas[NAME], output=out_buf[:num_tokens])
        return out_buf

    acl_graph.set_graph_params([BUCKET])
    update_stream = torch.npu.Stream()
    wrapper = acl_graph.ACLGraphWrapper(forward, cfg, CUDAGraphMode.FULL)
    if hasattr(wrapper, "set_attn_backend"):
        wrapper.set_attn_backend(mla.AscendMLABackend)
    updates = {"count": 0}
    begin = torch.npu.graph_task_update_begin

    def counted_begin(*args, **kwargs):
        updates["count"] += 1
        return begin(*args, **kwargs)

    torch.npu.graph_task_update_begin = counted_begin

    def run(seq_lens, num_tokens, mode):
        metas = {NAME: decode_meta(seq_lens, num_tokens)}
        with set_current_vllm_config(cfg), forward_context(metas, num_tokens, mode):
            context = set_extras(num_tokens)
            if mode == CUDAGraphMode.FULL:
                wrapper(metas, num_tokens)
                if not context.capturing:
                    acl_graph.update_full_graph_params(mla.AscendMLABackend, update_stream,
                                                       context, num_tokens, cfg, None)
            else:
                forward(metas, num_tokens)
        torch.npu.synchronize()

    # the capture (capture_model's dummy batch: padding slots write nothing)
    issued.clear()
    run([1] * BUCKET, BUCKET, CUDAGraphMode.FULL)
    report["ops"]["capture"] = sorted(set(issued))
    updates["count"] = 0
    errors = {"graph": [], "eager": []}
    without_rope, steps = float("inf"), 0
    for step in range(DECODE_STEPS + 1):
        eager = step == DECODE_STEPS  # the last step runs vLLM-Ascend's eager decode
        issued.clear()
        xs = [torch.randn(HIDDEN, generator=gen).to(bf16) for _ in PROMPTS]
        lens = []
        hidden.zero_()
        slot_buf.fill_(-1)
        for req, x in enumerate(xs):
            pos = len(history[req])
            history[req].append(x)
            lens.append(pos + 1)
            hidden[req] = x.to(dev)
            cos, sin = cos_sin([pos])
            cos_buf[req], sin_buf[req] = cos[0].to(dev), sin[0].to(dev)
            slot_buf[req] = slot(req, pos)
        if eager:
            run(lens, len(PROMPTS), CUDAGraphMode.NONE)
            report["ops"]["eager_decode"] = sorted(set(issued))
        else:
            run(lens + [0] * (BUCKET - len(lens)), BUCKET, CUDAGraphMode.FULL)
            steps += 1
            report["ops"]["replayed_decode"] = sorted(set(issued))
        got = out_buf.cpu()
        for req in range(len(PROMPTS)):
            want = reference(req)[-1]
            errors["eager" if eager else "graph"].append(rel_err(got[req], want))
            without_rope = min(without_rope, rel_err(reference(req, rope=False)[-1], want))
    report["graph_decode_max_rel_err"] = max(errors["graph"])
    report["eager_decode_max_rel_err"] = max(errors["eager"])
    report.update(graph_steps=steps, updates_per_step=updates["count"] / steps,
                  rope_distance=without_rope,
                  cache_blocks_written=sorted({int(b) for b in range(NUM_BLOCKS)
                                               if kv_cache[0][b].cpu().abs().sum() > 0}))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
