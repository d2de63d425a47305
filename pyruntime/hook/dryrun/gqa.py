"""The GQA geometry of the dry run (``aicpu-tiling hook-dryrun``, every ``--model`` but
``mla``): vLLM-Ascend's own ``AscendAttentionMetadataBuilder``,
``AscendAttentionBackendImpl`` (``AscendC8AttentionBackendImpl`` for C8 layers) and
``ACLGraphWrapper``, without and with the hook, driven by `pyruntime.hook.dryrun.driver`.

The layer sets (plain, windows, soft cap, sinks, C8) are `pyruntime.hook.dryrun.models`.
What stands in for the model, besides what the driver lists: the layers (namespaces with
``layer_name`` and unit KV scales; a C8 layer's scale and offset parameters). The KV caches
are allocated as the release's model runner allocates them (`pyruntime.hook.dryrun.kv_caches`:
on 0.30 the full-attention and C8 layers' K and V pages side by side in one allocation), and
each layer's report says how (``kv_cache``).
"""

from __future__ import annotations

import types
from typing import Any

from . import driver, kv_caches


class Runner(driver.Runner):
    """vLLM-Ascend's model runner, reduced to what FULL_DECODE_ONLY attention needs."""

    def build(self) -> None:
        import torch
        import vllm_ascend.attention.attention_v1 as attention
        from vllm.config import CUDAGraphMode
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
        from vllm_ascend.compilation import acl_graph

        self.attention, self.acl_graph = attention, acl_graph
        self.backend = attention.AscendAttentionBackend
        s, hooked = self.shape, self.hooked
        self.dtype = getattr(torch, s.dtype)
        cfg = self.cfg = self._config(
            dtype=self.dtype, use_mla=False, is_deepseek_mla=False,
            hf_config=types.SimpleNamespace(model_type="llama",
                                            architectures=["LlamaForCausalLM"]))
        spec = FullAttentionSpec(block_size=s.block_size, num_kv_heads=s.num_kv_heads,
                                 head_size=s.head_size, dtype=self.dtype)
        with self.set_current_vllm_config(cfg):
            self.builder = attention.AscendAttentionMetadataBuilder(spec, self.names, cfg,
                                                                    self.device)
            self.windows = [s.sliding_window if i in s.windowed_layers else None
                            for i in range(s.num_layers)]
            self.caps = [s.logits_soft_cap if i in s.soft_capped_layers else None
                         for i in range(s.num_layers)]
        gen = torch.Generator().manual_seed(self.seed)
        self.gen = gen
        low, high = s.sink_range
        # vLLM's gpt_oss.py: a [num_heads] parameter of the model dtype on the device, filled
        # by the weight loader before the graphs are captured
        sink_dtype = getattr(torch, s.sink_dtype)
        self.sinks = [torch.nn.Parameter((low + (high - low) * torch.rand(
            s.num_heads, generator=gen)).to(self.device, sink_dtype), requires_grad=False)
            if i in s.sink_layers else None for i in range(s.num_layers)]
        with self.set_current_vllm_config(cfg):
            # a C8 layer: vLLM-Ascend's class, as AscendC8KVCacheAttentionMethod.create_weights
            # swaps it in (layer.impl.__class__; it adds no __init__ of its own)
            self.impls = [(attention.AscendC8AttentionBackendImpl if i in s.c8_layers
                           else attention.AscendAttentionBackendImpl)(
                s.num_heads, s.head_size, s.head_size ** -0.5, s.num_kv_heads, None, window,
                "int8" if i in s.c8_layers else "auto", cap, "decoder", None, sinks=sinks)
                for i, (window, cap, sinks) in enumerate(zip(self.windows, self.caps,
                                                             self.sinks))]
        #: vLLM-Ascend's C8 path takes q_len 1 only: it hands FIA one BNSD batch row per query
        #: token (``query.unsqueeze(2)``) with one kv length per request, and torch_npu
        #: documents fewer kv lengths than batch rows as an error (the twin raises it)
        self.c8_eager = s.q_len == 1
        #: an eager warm-up step per bucket before its capture, as vLLM's capture_model runs
        #: one (``_warmup_and_capture``; vLLM-Ascend sets ``cudagraph_num_of_warmups = 1``):
        #: there the hook launches our kernels once outside the capture, and makes the C8
        #: layers' fp32 scales; not for C8 layers at q_len > 1, which vLLM-Ascend's eager C8
        #: call cannot take (above)
        self.warm_up = self.c8_eager or not s.c8_layers
        #: every layer has sinks (gpt-oss): vLLM's forward context then says so (``sinks``, set
        #: by vLLM-Ascend's set_ascend_forward_context when the model has sink parameters)
        self.all_sinks = all(sinks is not None for sinks in self.sinks)
        #: vLLM-Ascend 0.23's update_graph_params updates every FIA of a graph as FIA v2 (with
        #: sinks) or every one as v1, by that flag: a graph mixing both kinds cannot be
        #: host-updated by it (0.29+ update each registered task by its own kind)
        #: 0.29+: the wrapper updates each registered task in its replay (UpdatableGraph)
        self.updatable = hasattr(acl_graph.ACLGraphWrapper, "_updatable_graph_replay")
        self.sinks_host_updatable = self.updatable or self.all_sinks
        #: the layers run: without the hook, not the sink layers where vLLM-Ascend cannot update
        #: them, nor the C8 layers at q_len > 1 (see `pyruntime.hook.dryrun.models`)
        self.run_layers = [i for i in range(s.num_layers)
                           if hooked or ((self.sinks[i] is None or self.sinks_host_updatable)
                                         and (i not in s.c8_layers or self.c8_eager))]
        cache = (s.num_blocks, s.block_size, s.num_kv_heads, s.head_size)
        dev = self.device
        # each layer's KV cache spec as vLLM's Attention.get_kv_cache_spec makes it (a window:
        # SlidingWindowSpec; C8: int8, kv_c8.py's kv_cache_torch_dtype), and its caches
        # allocated as the release's model runner does (`kv_caches`: on 0.30 one allocation
        # with K and V pages side by side for full-attention and C8 layers), then filled
        self.specs = [SlidingWindowSpec(
            block_size=s.block_size, num_kv_heads=s.num_kv_heads, head_size=s.head_size,
            dtype=self.dtype, sliding_window=window) if window is not None else
            FullAttentionSpec(block_size=s.block_size, num_kv_heads=s.num_kv_heads,
                              head_size=s.head_size,
                              dtype=torch.int8 if i in s.c8_layers else self.dtype)
            for i, window in enumerate(self.windows)]
        with self.set_current_vllm_config(cfg):
            self.strided = [kv_caches.page_strided(spec, impl, self.backend, cfg)
                            for spec, impl in zip(self.specs, self.impls)]
        self.kv = [kv_caches.allocate(spec, self.backend, s.num_blocks, dev, strided=strided)
                   for spec, strided in zip(self.specs, self.strided)]
        for i, caches in enumerate(self.kv):
            values = [torch.randn(cache, generator=gen) for _ in caches]
            if i not in s.c8_layers:  # a C8 layer's int8 values are _make_c8's
                for allocated, value in zip(caches, values):
                    allocated.copy_(value.to(self.dtype))
        self.attn_layers = [types.SimpleNamespace(layer_name=n, _k_scale_float=1.0,
                                              _v_scale_float=1.0) for n in self.names]
        #: per layer, the caches the float64 reference reads: the C8 layers' dequantised ones
        self.kv_ref = list(self.kv)
        #: per C8 layer, the caches read as if unscaled (what an engine ignoring scales sees)
        self.kv_unscaled: dict[int, tuple] = {}
        for i in s.c8_layers:
            self._make_c8(i, gen)
        t = max(s.buckets)
        self.queries = [torch.zeros(t, s.num_heads, s.head_size, device=dev, dtype=self.dtype)
                        for _ in self.names]
        self.inputs = self.queries
        # vLLM's Attention layer hands the implementation [T, num_heads, head_size] views
        self.outputs = [torch.zeros(t, s.num_heads, s.head_size, device=dev, dtype=self.dtype)
                        for _ in self.names]
        self._buffers(s.max_reqs + 2)
        self.slots = torch.zeros(t, dtype=torch.int64, device=dev)
        acl_graph.set_graph_params(list(s.buckets))
        self.update_stream = torch.npu.Stream()
        options = {"update_stream": self.update_stream} if self.updatable else {}
        self.wrapper = acl_graph.ACLGraphWrapper(self._forward, cfg, CUDAGraphMode.FULL,
                                                 **options)
        if self.updatable:
            self.wrapper.set_attn_backend(attention.AscendAttentionBackend)

    def _quant_config(self, cfg: Any) -> None:
        if self.shape.c8_layers:  # the flag a C8 recipe's quant config carries (kv_c8.py)
            cfg.quant_config = types.SimpleNamespace(enable_c8_quant=True)

    def _make_c8(self, i: int, gen) -> None:
        """Layer i's C8 state as vLLM-Ascend leaves it before capture: the layer's scale and
        offset parameters (``create_weights`` + ``process_weights_after_loading``: flat, the
        model dtype; symmetric, zero offsets), and its int8 caches (``[num_blocks, block_size,
        num_kv_heads, head_size]``, allocated by `build` as the release's runner allocates
        them: on 0.30 with the K and V pages side by side) whose memory holds the NZ layout
        ``_nz_5d_view`` reads, filled with N(0, 1) values quantised by
        ``_quantize_kv_to_int8``'s rule. The implementation holds them as ``key_cache`` /
        ``value_cache``, as ``_reshape_and_cache`` leaves them on its first call (the dry run
        writes the caches outside the graph, so that is never called)."""
        import torch

        from pyruntime.kernels import kv_quant

        s, dev = self.shape, self.device
        low, high = s.c8_scale_range
        channels = s.num_kv_heads * s.head_size
        nd = (s.num_blocks, s.block_size, s.num_kv_heads, s.head_size)
        nz = (s.num_blocks, s.num_kv_heads, s.head_size // 32, s.block_size, 32)
        layer, caches, ref, unscaled = self.attn_layers[i], [], [], []
        for name in ("k", "v"):
            scale = (low + (high - low) * torch.rand(channels, generator=gen)).to(self.dtype)
            offset = torch.zeros(channels, dtype=self.dtype)
            setattr(layer, f"{name}_cache_scale",
                    torch.nn.Parameter(scale.to(dev), requires_grad=False))
            setattr(layer, f"{name}_cache_offset",
                    torch.nn.Parameter(offset.to(dev), requires_grad=False))
            per_channel = scale.float().view(s.num_kv_heads, s.head_size)
            stored = kv_quant.quantize(torch.randn(nd, generator=gen), per_channel,
                                       offset.float().view(s.num_kv_heads, s.head_size))
            memory = stored.view(s.num_blocks, s.block_size, s.num_kv_heads,
                                 s.head_size // 32, 32).permute(0, 2, 3, 1, 4).contiguous()
            assert memory.shape == nz
            # written through vLLM-Ascend's own NZ view of the allocated cache (a .view: on
            # 0.30 it keeps the page stride of the K and V pages side by side)
            cache = self.kv[i][len(caches)]
            self.impls[i]._nz_5d_view(cache, s.block_size).copy_(memory)
            caches.append(cache)
            ref.append((stored.double() * per_channel.double()).float())
            unscaled.append(stored.float())
        self.impls[i].key_cache, self.impls[i].value_cache = caches
        self.kv[i], self.kv_ref[i] = tuple(caches), tuple(ref)
        self.kv_unscaled[i] = tuple(unscaled)

    def _forward(self, metas: dict, num_tokens: int):
        for i in self.run_layers:
            self.impls[i].forward(self.attn_layers[i], self.queries[i][:num_tokens], None, None,
                                  self.kv[i], metas[self.names[i]],
                                  self.outputs[i][:num_tokens])
        return self.outputs[0]

    def metadata(self, q_lens: list[int], kv_lens: list[int], table, bucket: int):
        """The persistent buffers filled (a -1 tail past the padded batch) and
        ``common_attn_metadata`` built by vLLM-Ascend's builder."""
        from vllm_ascend.attention.utils import AscendCommonAttentionMetadata

        q, padded = self.shape.q_len, bucket // self.shape.q_len
        cu = self._fill(q_lens, kv_lens, table, bucket, pad=-1)
        fields = {
            "query_start_loc": self.qsl[: padded + 1], "query_start_loc_cpu": cu[: padded + 1],
            "seq_lens": self.seq_lens[:padded], "num_reqs": padded,
            "num_actual_tokens": sum(q_lens), "max_query_len": q, "max_seq_len": max(kv_lens),
            "block_table_tensor": self.table[:padded], "slot_mapping": self.slots[:bucket],
            "seq_lens_cpu": self.seq_lens_cpu[:padded],
            "attn_state": self.attention.AscendAttentionState.DecodeOnly,
            "actual_seq_lengths_q": cu[1: padded + 1].tolist(), "num_input_tokens": bucket}
        if "_seq_lens_cpu" in AscendCommonAttentionMetadata.__dataclass_fields__:
            fields["_seq_lens_cpu"] = self.seq_lens_cpu[:padded]
        return self.builder.build(0, AscendCommonAttentionMetadata(**fields))

    def begin(self, on_host: dict) -> None:
        s = self.shape
        self.on_host = on_host
        # a soft cap acts only on the device path: vLLM-Ascend's own path ignores it
        self.applied_caps = [cap if self.hooked and name not in on_host else None
                             for cap, name in zip(self.caps, self.names)]
        self.layer_err = [0.0] * s.num_layers
        #: per sink layer, the smallest distance over the steps of the answer without the sinks
        self.sinks_distance = [None if sinks is None else float("inf") for sinks in self.sinks]
        #: per windowed layer, the largest distance over the steps of the answer without the
        #: window, and the steps in which some kv length passed the window (it bit)
        self.window_distance = [None if w is None else 0.0 for w in self.windows]
        #: per C8 layer, the smallest distance over the steps of the answer read without scales
        self.scales_distance = [float("inf") if i in s.c8_layers else None
                                for i in range(s.num_layers)]
        self.window_steps = [None if w is None else 0 for w in self.windows]

    def check(self, q_lens: list[int], kv_lens: list[int], table, outs: list) -> None:
        import numpy as np
        import torch

        from pyruntime.workload.reference import reference_attention, relative_error

        s = self.shape
        cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        rows = int(cu[-1])
        for i in self.run_layers:
            k, v = self.kv_ref[i]
            # a windowed layer: the model's W keys on the device path; on vLLM-Ascend's path
            window = self.windows[i]
            on_device = self.hooked and self.names[i] not in self.on_host
            # FIA's band [p - W, p] (W + 1 keys), which torch_npu documents as having no
            # effect at Q_S = 1: at q_len 1 vLLM-Ascend's windowed decode sees the whole kv
            fia_band = s.q_len > 1 and window is not None and not on_device
            options = {"scale": s.head_size ** -0.5, "logits_soft_cap": self.applied_caps[i],
                       "band": (window, 0) if fia_band else None,
                       "sliding_window": window if on_device else None}
            inputs = (self.queries[i].cpu(), k.cpu(), v.cpu(), table.numpy(), cu,
                      np.array(kv_lens, np.int32))
            sinks = None if self.sinks[i] is None else self.sinks[i].detach().cpu().float()
            expected = reference_attention(*inputs, **options, sinks=sinks)[:rows]
            got = outs[i].view(-1, s.num_heads, s.head_size)[:rows]
            self.layer_err[i] = max(self.layer_err[i], relative_error(got, expected))
            if sinks is not None:  # what an engine that dropped the sinks would be off by
                without = torch.from_numpy(reference_attention(*inputs, **options)[:rows])
                self.sinks_distance[i] = min(self.sinks_distance[i],
                                             relative_error(without, expected))
            if i in self.kv_unscaled:  # what an engine that dropped the C8 scales would be
                without = torch.from_numpy(reference_attention(
                    inputs[0], *self.kv_unscaled[i], *inputs[3:], **options)[:rows])
                self.scales_distance[i] = min(self.scales_distance[i],
                                              relative_error(without, expected))
            if window is not None:  # what an engine that dropped the window would be off by
                unwindowed = {**options, "band": None, "sliding_window": None}
                without = torch.from_numpy(
                    reference_attention(*inputs, **unwindowed, sinks=sinks)[:rows])
                self.window_distance[i] = max(self.window_distance[i],
                                              relative_error(without, expected))
                self.window_steps[i] += max(kv_lens) > window

    @property
    def max_rel_err(self) -> float:
        return max(self.layer_err)

    def layers(self, status: Any, counter: driver.UpdateCounter, steps: int) -> list[dict]:
        s, hooked, ran = self.shape, self.hooked, self.run_layers
        host = dict(status.host_path_layers)
        entries = status.device_entries if hooked else {}
        layers = [{"name": n, "path": "host", "reason": "the hook is not installed"}
                  if not hooked else
                  {"name": n, "path": "host" if n in host else "device", "reason": host.get(n)}
                  for n in self.names]
        for i, layer in enumerate(layers):
            if i not in ran:
                layer.update(path="not run", reason=(
                    "vLLM-Ascend's C8 path hands FIA one BNSD row per query token and one kv "
                    "length per request: with q_len > 1 too few kv lengths, an error torch_npu "
                    "documents" if i in s.c8_layers else
                    "vLLM-Ascend 0.23's update_graph_params updates a graph's FIAs all as FIA "
                    "v2 (sinks) or all as v1: it cannot update a graph that mixes both"))
        # updates per layer: each update's FIA reads its layer's query buffer
        starts = {q.data_ptr(): name for q, name in zip(self.queries, self.names)}
        per_layer = {name: 0 for name in self.names}
        for ptr in counter.queries:
            if ptr in starts:
                per_layer[starts[ptr]] += 1
        for i, (layer, cap) in enumerate(zip(layers, self.caps)):
            layer["updates_per_step"] = per_layer[layer["name"]] / max(steps, 1)
            layer["logits_soft_cap"] = cap
            layer["sinks"] = self.sinks[i] is not None
            layer["entry"] = entries.get(layer["name"])  # the vLLM-Ascend entry that captured it
            layer["max_rel_err"] = self.layer_err[i] if i in ran else None
            layer["sinks_distance"] = self.sinks_distance[i] if i in ran else None
            layer["sliding_window"] = self.windows[i]
            layer["window_distance"] = self.window_distance[i] if i in ran else None
            layer["steps_past_window"] = self.window_steps[i] if i in ran else None
            layer["kv_cache_dtype"] = "int8" if i in s.c8_layers else "auto"
            layer["scales_distance"] = self.scales_distance[i] if i in ran else None
            # how the caches were allocated (the release's runner's way): their shape, strides,
            # one allocation or two, V's offset from K
            layer["kv_cache"] = kv_caches.describe(*self.kv[i])
        return layers

    @staticmethod
    def report_fields(after: driver.Run, before: driver.Run | None,
                      counts: dict) -> tuple[dict, bool]:
        """Against the run without the hook: its updates and error; the updates the hooked
        run still has split into the device-path layers' (0 when the hook works) and those of
        the layers it left to vLLM-Ascend; the tilings per graph and their launches."""
        on_ours = counts["on_ours"]
        return {"model": after.model,
                "updates_per_step_before": before.updates_per_step,
                "updates_per_step_after": on_ours,
                "updates_per_step_host_layers": after.updates_per_step - on_ours,
                "max_rel_err_before": before.max_rel_err, "dtype": after.dtype,
                "tilings_per_graph": after.tilings_per_graph,
                "tiling_launches_per_step": after.tiling_launches_per_step}, True
