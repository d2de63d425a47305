"""vLLM-Ascend's own C8 (int8 KV) and attention-sink layers, captured, updated and replayed on
the NPU twin without our hook, against float64.

Run it with a release's environment (``tools/vllm_env.sh RELEASE``)::

    PYTHONPATH=$PWD:$ENV/vllm-ascend $ENV/venv/bin/python tools/vllm_ascend_fia_paths.py

with ``ENV=~/.cache/aicpu-tiling/vllm-envs/<release>``. It prints one JSON line: per layer its
vLLM-Ascend entry, the task updates per step and the largest relative error over the steps.

Two layers of one decoder (bf16, 10 query heads, 1 kv head, head dim 128, block size 128: the
shape FIA's int8 NZ path takes) run through vLLM-Ascend's classes (``vllm_ascend/attention/
attention_v1.py``): ``AscendC8AttentionBackendImpl`` with ``enable_c8_quant`` and
``kv_cache_dtype="int8"``, whose graph path is ``full_graph_fia`` with BNSD and the NZ 5-D
cache view, and ``AscendAttentionBackendImpl`` with ``sinks`` (gpt-oss's bf16 ``[num_heads]``),
whose graph path is ``full_graph_fia_v2``. ``AscendAttentionMetadataBuilder`` builds the
metadata and ``ACLGraphWrapper`` captures and replays; the update after each replay is
vLLM-Ascend's own (0.23: ``update_full_graph_params``; 0.29+: the updatable graph's
``FIAParamProvider``/``FIAV2ParamProvider``). The steps pass no new key and value (decode
with a prefilled cache, as the dry run in ``pyruntime/hook/dryrun/`` does), so each layer's
cache is the one the test wrote: for C8, int8 values of our quantiser
(`pyruntime.kernels.kv_quant`, zero offsets: vLLM-Ascend's FIA path is symmetric) stored in
NZ order.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 10, 1, 128, 128
NUM_BLOCKS, MAX_BLOCKS_PER_REQ = 24, 3
NAMES = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")  # C8, sinks
#: each layer is its own one-layer model with its own graph size: vLLM-Ascend 0.23 updates a
#: graph size's captured FIAs all as v2 (sinks) or all as v1 (forward_context.sinks), so a
#: C8 layer and a sinks layer never share a graph there (a model has one kind)
BUCKETS = (4, 8)
BUCKET = max(BUCKETS)


def to_nz(nd):
    """``[blocks, bs, Hkv, D]`` -> ``[blocks, Hkv, D/32, bs, 32]`` (contiguous)."""
    blocks, bs, heads, dim = nd.shape
    return nd.reshape(blocks, bs, heads, dim // 32, 32).permute(0, 2, 3, 1, 4).contiguous()


def main() -> int:
    from pyruntime.hook.dryrun import check_real_vllm_ascend, start_device

    check_real_vllm_ascend()
    # the V1 model runner's graph path (ACLGraphWrapper replay, update_full_graph_params), as
    # the hook's dry run drives it: with Triton usable vLLM 0.30 would pick Model Runner V2
    # (vllm/config/vllm.py `VllmConfig.use_v2_model_runner`), whose choice reads model-config
    # fields this tool's stand-in config does not carry
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    device_name = start_device("graph")
    import numpy as np
    import torch

    for module in ("vllm_ascend.ops", "vllm_ascend.attention.attention_v1",
                   "vllm_ascend.compilation.acl_graph"):
        importlib.import_module(module)
    from importlib import metadata

    import vllm_ascend.attention.attention_v1 as attention
    from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config
    from vllm.forward_context import BatchDescriptor, get_forward_context, set_forward_context
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm_ascend.ascend_config import init_ascend_config
    from vllm_ascend.attention.utils import AscendCommonAttentionMetadata
    from vllm_ascend.compilation import acl_graph

    from pyruntime.kernels import kv_quant
    from pyruntime.npu_twin import fia
    from pyruntime.workload.reference import reference_attention, relative_error

    # what each FIA the twin issues is: its op, layout, cache and sink (the entry seen)
    issued: list[dict] = []
    issue = fia._issue

    def recorded_issue(query, key, value, options, *args, **kwargs):
        issued.append({"op": kwargs.get("op", "npu_fused_infer_attention_score"),
                       "layout": options.get("input_layout"), "key": list(key.shape),
                       "key_dtype": str(key.dtype).replace("torch.", ""),
                       "learnable_sink": options.get("learnable_sink") is not None,
                       "key_antiquant_scale": options.get("key_antiquant_scale") is not None})
        return issue(query, key, value, options, *args, **kwargs)

    fia._issue = recorded_issue
    dev = torch.device("npu", 0)
    bf16, i32 = torch.bfloat16, torch.int32
    cfg = VllmConfig()
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    cfg.model_config = types.SimpleNamespace(
        max_model_len=MAX_BLOCKS_PER_REQ * BLOCK_SIZE, runner_type="generate", dtype=bf16,
        use_mla=False, hf_text_config=None, is_hybrid=False, enforce_eager=False,
        quantization=None, is_deepseek_mla=False,
        hf_config=types.SimpleNamespace(model_type="llama", architectures=["LlamaForCausalLM"]))
    # the field of vLLM-Ascend's quant config its attention reads (kv_c8.py sets it)
    cfg.quant_config = types.SimpleNamespace(enable_c8_quant=True)
    init_ascend_config(cfg)
    gen = torch.Generator().manual_seed(0)
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                             dtype=bf16)
    scale = HEAD_DIM ** -0.5
    # gpt-oss's sinks: a bf16 [num_heads] parameter on the device
    sinks = torch.nn.Parameter((1 + 3 * torch.rand(HEADS, generator=gen)).to(dev, bf16),
                               requires_grad=False)
    with set_current_vllm_config(cfg):
        builder = attention.AscendAttentionMetadataBuilder(spec, list(NAMES), cfg, dev)
        c8 = attention.AscendC8AttentionBackendImpl(HEADS, HEAD_DIM, scale, KV_HEADS, None,
                                                    None, "int8", None, "decoder", None)
        sink = attention.AscendAttentionBackendImpl(HEADS, HEAD_DIM, scale, KV_HEADS, None,
                                                    None, "auto", None, "decoder", None,
                                                    sinks=sinks)
    impls = (c8, sink)
    # (0.23 sets enable_c8_quant on every layer of a C8 config; a layer with sinks takes
    # full_graph_fia_v2 either way)
    assert c8.enable_c8_quant

    # the C8 layer: per-channel bf16 scales ([Hkv * D] parameters, as kv_c8.py loads them)
    shape = (NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_scale, v_scale = ((torch.rand(KV_HEADS, HEAD_DIM, generator=gen) * 0.02 + 0.01).to(bf16)
                        for _ in range(2))
    zero = torch.zeros(KV_HEADS, HEAD_DIM)
    k_nd, v_nd = (kv_quant.quantize(torch.randn(shape, generator=gen), s.float(), zero)
                  for s in (k_scale, v_scale))
    param = lambda t: torch.nn.Parameter(t.reshape(-1).to(dev), requires_grad=False)
    c8_layer = types.SimpleNamespace(
        layer_name=NAMES[0], _k_scale_float=1.0, _v_scale_float=1.0,
        k_cache_scale=param(k_scale), v_cache_scale=param(v_scale),
        k_cache_offset=param(zero.to(bf16)), v_cache_offset=param(zero.to(bf16)))
    sink_layer = types.SimpleNamespace(layer_name=NAMES[1], _k_scale_float=1.0,
                                       _v_scale_float=1.0)
    # the caches: C8's int8 allocation [blocks, bs, Hkv, D] holds NZ-ordered data
    caches = [(to_nz(k_nd).view(shape).to(dev), to_nz(v_nd).view(shape).to(dev)),
              tuple(torch.randn(shape, generator=gen).to(bf16).to(dev) for _ in range(2))]
    for impl, (k, v) in zip(impls, caches):
        # what the step's cache write (reshape_and_cache) sets before the graph path reads it
        impl.key_cache, impl.value_cache = k, v
    layers = (c8_layer, sink_layer)
    queries = [torch.zeros(BUCKET, HEADS, HEAD_DIM, dtype=bf16, device=dev) for _ in NAMES]
    outputs = [torch.zeros(BUCKET, HEADS, HEAD_DIM, dtype=bf16, device=dev) for _ in NAMES]
    qsl_cpu = torch.zeros(BUCKET + 2, dtype=i32)
    qsl = torch.zeros(BUCKET + 2, dtype=i32, device=dev)
    seq_cpu = torch.zeros(BUCKET, dtype=i32)
    seq = torch.zeros(BUCKET, dtype=i32, device=dev)
    table_cpu = torch.zeros(BUCKET, MAX_BLOCKS_PER_REQ, dtype=i32)
    table_dev = torch.zeros(BUCKET, MAX_BLOCKS_PER_REQ, dtype=i32, device=dev)
    slots = torch.zeros(BUCKET, dtype=torch.int64, device=dev)

    def forward_of(i: int):
        def forward(metas: dict, num_tokens: int):
            impls[i].forward(layers[i], queries[i][:num_tokens], None, None, caches[i],
                             metas[NAMES[i]], outputs[i][:num_tokens])
            return outputs[i]
        return forward

    acl_graph.set_graph_params(list(BUCKETS))
    update_stream = torch.npu.Stream()
    updatable = hasattr(acl_graph.ACLGraphWrapper, "_updatable_graph_replay")
    wrappers = [acl_graph.ACLGraphWrapper(forward_of(i), cfg, CUDAGraphMode.FULL,
                                          **({"update_stream": update_stream} if updatable
                                             else {}))
                for i in range(len(NAMES))]
    for wrapper in wrappers if updatable else ():
        wrapper.set_attn_backend(attention.AscendAttentionBackend)
    updates = {"count": 0}
    begin = torch.npu.graph_task_update_begin

    def counted_begin(*args, **kwargs):
        updates["count"] += 1
        return begin(*args, **kwargs)

    torch.npu.graph_task_update_begin = counted_begin

    def step(i: int, kv_lens: list[int], table, eager: bool = False) -> None:
        """One decode step of layer i's model (q_len 1 per request), padded to its graph
        size as the model runner pads a uniform batch (q_len 1, kv_len 0, a -1 tail); a
        replay of its graph and vLLM-Ascend's update, or (``eager``) the layer's eager call
        (C8: ``_forward_c8_decode``; sinks: ``forward_fused_infer_attention``'s v2 call)."""
        n, size = len(kv_lens), BUCKETS[i]
        qsl_cpu.fill_(-1)
        qsl_cpu[: size + 1] = torch.arange(size + 1)
        seq_cpu.zero_()
        seq_cpu[:n] = torch.tensor(kv_lens)
        table_cpu.zero_()
        table_cpu[:n, : table.shape[1]] = table
        for device_buffer, host in ((qsl, qsl_cpu), (seq, seq_cpu), (table_dev, table_cpu)):
            device_buffer.copy_(host.pin_memory(), non_blocking=True)
        fields = {
            "query_start_loc": qsl[: size + 1], "query_start_loc_cpu": qsl_cpu[: size + 1],
            "seq_lens": seq[:size], "num_reqs": size, "num_actual_tokens": n,
            "max_query_len": 1, "max_seq_len": max(kv_lens),
            "block_table_tensor": table_dev[:size], "slot_mapping": slots[:size],
            "seq_lens_cpu": seq_cpu[:size],
            "attn_state": attention.AscendAttentionState.DecodeOnly,
            "actual_seq_lengths_q": qsl_cpu[1: size + 1].tolist(),
            "num_input_tokens": size}
        if "_seq_lens_cpu" in AscendCommonAttentionMetadata.__dataclass_fields__:
            fields["_seq_lens_cpu"] = seq_cpu[:size]
        metas = {NAMES[i]: builder.build(0, AscendCommonAttentionMetadata(**fields))}
        descriptor = BatchDescriptor(num_tokens=size, num_reqs=size, uniform=True)
        with set_current_vllm_config(cfg), set_forward_context(
                metas, cfg, num_tokens=size, cudagraph_runtime_mode=CUDAGraphMode.FULL,
                batch_descriptor=descriptor):
            context = get_forward_context()
            for name, value in (("capturing", False), ("is_draft_model", False),
                                ("is_draft_model_prefill", False),
                                ("sinks", impls[i].sinks is not None),
                                ("in_profile_run", False), ("num_tokens", size)):
                setattr(context, name, value)
            if eager:
                forward_of(i)(metas, size)
            else:
                wrappers[i](metas, size)
            if not eager and not updatable and not context.capturing:
                acl_graph.update_full_graph_params(attention.AscendAttentionBackend,
                                                   update_stream, context, size, cfg, None)
        torch.npu.synchronize()

    for i, size in enumerate(BUCKETS):  # the captures (capture_model's dummy batches)
        step(i, [1] * size, torch.zeros(size, 1, dtype=i32))
    captured = [dict(call) for call in issued]
    updates["count"] = 0
    issued.clear()
    errors = [0.0, 0.0]
    distance = float("inf")  # what dropping the sinks would be off by
    steps = 0
    eager_steps = 0
    for kv_lens, eager in (([300, 5, 129], False), ([1, 384, 256, 77], False),
                           ([130], False), ([7, 200], True)):
        n = len(kv_lens)
        for q in queries:
            q.copy_(torch.randn(q.shape, generator=gen).to(bf16))
        table = torch.randperm(NUM_BLOCKS, generator=gen)[: n * MAX_BLOCKS_PER_REQ].view(
            n, MAX_BLOCKS_PER_REQ).int()
        if eager:
            updated = list(issued)
        for i in range(len(NAMES)):
            step(i, kv_lens, table, eager=eager)
        steps += not eager
        eager_steps += eager
        cu, lens = np.arange(n + 1), np.asarray(kv_lens)
        c8_want = reference_attention(
            queries[0].cpu()[:n], k_nd, v_nd, table.numpy(), cu, lens, scale=scale,
            kv_scales=(k_scale.float(), zero, v_scale.float(), zero))
        errors[0] = max(errors[0], relative_error(outputs[0].cpu()[:n], c8_want))
        k, v = (t.cpu() for t in caches[1])
        inputs = (queries[1].cpu()[:n], k, v, table.numpy(), cu, lens)
        sink_want = reference_attention(*inputs, scale=scale, sinks=sinks.detach().cpu())
        errors[1] = max(errors[1], relative_error(outputs[1].cpu()[:n], sink_want))
        without = torch.from_numpy(reference_attention(*inputs, scale=scale))
        distance = min(distance, relative_error(without, sink_want))
    # the FIA each layer's graph captured (in capture order: layer 0's graph first; the
    # workspace queries are not issued FIAs), and the FIAs issued by the updates
    report = {"vllm_ascend": metadata.version("vllm-ascend"), "device": device_name,
              "steps": steps, "updates_per_step": updates["count"] / steps,
              "layers": [{"name": name, "max_rel_err": err} for name, err in zip(NAMES, errors)],
              "captured": captured, "updated": updated, "eager": issued[len(updated):],
              "eager_steps": eager_steps, "sinks_distance": distance}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
