"""The MLA geometry of the dry run (``aicpu-tiling hook-dryrun --model mla``): vLLM-Ascend's
own ``AscendMLAImpl`` captured on the device path, replayed, compared with float64 absorbed
MLA, driven by `pyruntime.hook.dryrun.driver`.

The layers are DeepSeek-V3's at one TP-8 rank (`pyruntime.hook.dryrun.models.MLAShape`).
vLLM-Ascend's own ``AscendMLAImpl`` (built by its ``__init__``) runs its own
``_forward_decode`` and ``_v_up_proj`` (``W_UV``, random here), under its own
``ACLGraphWrapper`` with ``forward_context.capturing`` as the model runner sets it, and
``update_full_graph_params(AscendMLABackend, ...)`` after each replay, which calls the MLA
``update_graph_params`` (both releases: ``AscendMLABackend`` is not an ``AscendAttentionBackend``,
so 0.30's ``use_updatable_graph`` is False for it).

What stands in, besides what the driver lists: the MLA metadata. ``AscendMLAMetadataBuilder``
needs the model's rotary embedding (``get_cos_and_sin_mla``) and the model runner's
positions, so the metadata is a namespace with the fields ``_forward_decode`` reads
(``attn_state``, ``causal``, ``decode.block_table`` / ``seq_lens_list`` /
``actual_seq_lengths_q`` / ``attn_mask``), and the persistent device buffers are attached by
the same function the patched ``build`` calls (`vllm_ascend_patches.device_lengths`). The
queries (``ql_nope``, already absorbed, and ``q_pe``) and the cache pair are random, written
outside the graph. Without the hook nothing is run here: vLLM-Ascend's MLA path is FIA v2
with ``query_rope``/``key_rope``, which the twin did not model when this run was written (it
does since issue 28; ``tools/vllm_ascend_mla_paths.py`` runs that path); the run reports the task
updates the hooked run removed as the FIA tasks vLLM-Ascend would have registered (one per
MLA layer per step: ``update_graph_params`` zips its layers with ``attn_params[num_tokens]``).
"""

from __future__ import annotations

import os
import types
from typing import Any

from . import driver
from .models import TOLERANCE


def reference(q_nope, q_pe, kv_c, k_pe, table, q_lens, kv_lens, scale):
    """float64 absorbed MLA (`pyruntime.kernels.reference_mla` semantics, causal), token-major
    ``[rows, H, L]``: query token i of a request sees kv positions ``[0, kv - q + i + 1)``."""
    import torch

    rows = []
    start = 0
    block = kv_c.shape[1]
    for r, (q, kv) in enumerate(zip(q_lens, kv_lens)):
        blocks = table[r, : -(-kv // block)].long()
        c = kv_c[blocks].reshape(-1, kv_c.shape[-1])[:kv].double()
        p = k_pe[blocks].reshape(-1, k_pe.shape[-1])[:kv].double()
        for i in range(q):
            t = start + i
            visible = kv - q + i + 1
            s = (q_nope[t].double() @ c[:visible].T + q_pe[t].double() @ p[:visible].T) * scale
            rows.append(torch.softmax(s, dim=-1) @ c[:visible])
        start += q
    return torch.stack(rows)


class FiaV2Recorder:
    """Stands in for ``torch_npu.npu_fused_infer_attention_score_v2`` (and its workspace
    query): each call is one AI Core task on the current stream that writes zeros (no
    numerics: the run was written before the twin modelled FIA v2 with query_rope; the
    hooked layers' checks never read it). In a mixed-graph run vLLM-Ascend's own capture
    and ``update_graph_params`` run their task-group and task-update protocol around its
    ``.out``, and the twin checks it; it records the query buffer each task-update call reads.
    Its eager call serves vLLM-Ascend's eager ``_forward_decode`` in the warm-up step before
    each capture, whose output no check reads."""

    LABEL = "npu_fused_infer_attention_score_v2 (recorder)"

    def __init__(self) -> None:
        self.updated_queries: list[int] = []

    def install(self) -> None:
        import torch
        import torch_npu

        from pyruntime.npu_twin import device as twin

        def issue(query, out):
            dev = twin.device()
            if dev.current_stream().updating is not None:
                self.updated_queries.append(query.data_ptr())
            targets = [twin.inner(t) for t in out]

            def run() -> None:
                for t in targets:
                    t.zero_()
            dev.enqueue(twin.Work("aicore", self.LABEL, run))

        class _Packet:
            def __call__(self, query, key, value, **options):
                # eager: (attention_out, softmax_lse), the output head-major as the layouts
                # vLLM-Ascend's MLA decode passes say (BNSD_NBSD: [B, N, S, D] -> [N, B, S,
                # D]; BSND_NBSD, the NZ cache's: [B, S, N, D] -> [N, B, S, D]; TND_NTD:
                # [T, N, D] -> [N, T, D])
                layout, q = options.get("input_layout"), query.shape
                if layout in ("BNSD_NBSD", "TND_NTD"):
                    shape = (q[1], q[0], *q[2:])
                elif layout == "BSND_NBSD":
                    shape = (q[2], q[0], q[1], q[3])
                else:
                    raise NotImplementedError(f"the dry run's eager FIA v2 stand-in takes the "
                                              f"layouts of MLA decode, not {layout!r}")
                out = torch.empty(shape, dtype=query.dtype, device=query.device)
                lse = torch.empty(query.shape[0], dtype=query.dtype, device=query.device)
                issue(query, [out, lse])
                return out, lse

            @staticmethod
            def out(query, key, value, *, workspace=None, out, **options):
                issue(query, out)
                return out

        torch_npu.npu_fused_infer_attention_score_v2 = _Packet()
        torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace = (
            lambda query, *args, **kwargs: torch.empty(1024, dtype=torch.uint8,
                                                       device=query.device))


def _drop_rope(engine) -> None:
    """The negative test's engine fault: our kernels get a zero ``q_pe`` (the rope part of
    the scores dropped); the dry run must catch it."""
    original = engine.capture_mla

    def capture_mla(capture):
        import dataclasses

        original(dataclasses.replace(capture, q_pe=capture.q_pe.mul(0)))

    engine.capture_mla = capture_mla


class Runner(driver.Runner):
    """vLLM-Ascend's model runner, reduced to the MLA decode of FULL_DECODE_ONLY."""

    modules = (*driver.Runner.modules, "vllm_ascend.attention.mla_v1")
    runs_unhooked = False
    schema = "aicpu-tiling/hook-dryrun-mla"
    spec_fields = {"use_eagle": lambda: False, "disable_padded_drafter_batch": False}

    #: an eager warm-up step per bucket before its capture, as vLLM's capture_model runs one
    #: (``_warmup_and_capture``; vLLM-Ascend's ``cudagraph_num_of_warmups = 1``): the hook
    #: launches our MLA kernels once there, outside the capture; vLLM-Ascend's own eager FIA
    #: v2 call in it is the recorder's
    warm_up = True

    def before_import(self) -> None:
        self.recorder = FiaV2Recorder()
        self.recorder.install()

    def use_engine(self, engine: Any) -> None:
        if self.shape.fault == "drop-rope":
            _drop_rope(engine)

    def build(self) -> None:
        import torch
        import vllm_ascend.attention.mla_v1 as mla
        from vllm.config import CUDAGraphMode
        from vllm_ascend.compilation import acl_graph

        self.mla, self.acl_graph = mla, acl_graph
        self.backend = mla.AscendMLABackend
        s = self.shape
        cfg = self.cfg = self._config(
            dtype=torch.float32, use_mla=True, is_deepseek_mla=True,
            hf_config=types.SimpleNamespace(model_type="deepseek_v3",
                                            architectures=["DeepseekV3ForCausalLM"]))
        gen = self.gen = torch.Generator().manual_seed(self.seed)
        dev = self.device
        head = s.kv_lora_rank + s.qk_rope_head_dim
        with self.set_current_vllm_config(cfg):
            self.impls = [mla.AscendMLAImpl(
                s.num_heads, head, s.scale, 1, None, None, "auto", None, "decoder", None,
                q_lora_rank=1536, kv_lora_rank=s.kv_lora_rank,
                qk_nope_head_dim=s.qk_nope_head_dim, qk_rope_head_dim=s.qk_rope_head_dim,
                qk_head_dim=s.qk_nope_head_dim + s.qk_rope_head_dim, v_head_dim=s.v_head_dim,
                rotary_emb=None, q_b_proj=None, q_proj=None, kv_b_proj=None, o_proj=None,
                layer_name=name) for name in self.names]
        for i in s.host_layers:  # ascend_config.enable_kv_nz, as __init__ reads it
            self.impls[i].enable_kv_nz = True
        for impl in self.impls:  # process_weights_after_loading's W_UV: [N, L, V]
            impl.W_UV = torch.randn(s.num_heads, s.kv_lora_rank, s.v_head_dim,
                                    generator=gen).div_(s.kv_lora_rank ** 0.5).to(dev)
        # vLLM-Ascend's MLA cache pair (model_runner_v1: nope then rope, num_kv_heads 1), two
        # contiguous allocations on both releases: AscendMLAAttentionSpec is never exactly
        # FullAttentionSpec, so 0.30.0rc2 does not page-stride it (model_runner_v1.py:5297-5322
        # allocates, 5855-5860 views; `kv_caches` has the rule the GQA layers follow)
        self.kv = [(torch.randn(s.num_blocks, s.block_size, 1, s.kv_lora_rank,
                                generator=gen).to(dev),
                    torch.randn(s.num_blocks, s.block_size, 1, s.qk_rope_head_dim,
                                generator=gen).to(dev)) for _ in self.names]
        t = max(s.buckets)
        self.q_nope = [torch.zeros(t, s.num_heads, s.kv_lora_rank, device=dev)
                       for _ in self.names]
        self.q_pe = [torch.zeros(t, s.num_heads, s.qk_rope_head_dim, device=dev)
                     for _ in self.names]
        self.inputs = [*self.q_nope, *self.q_pe]
        self.outputs = [torch.zeros(t, s.num_heads * s.v_head_dim, device=dev)
                        for _ in self.names]
        self._buffers(s.max_reqs + 1)
        self.batch_constants: dict = {}
        acl_graph.set_graph_params(list(s.buckets))
        self.update_stream = torch.npu.Stream()
        self.wrapper = acl_graph.ACLGraphWrapper(self._forward, cfg, CUDAGraphMode.FULL)
        if hasattr(self.wrapper, "set_attn_backend"):
            self.wrapper.set_attn_backend(mla.AscendMLABackend)
        self.new_api = "decode_preprocess_res" in __import__("inspect").signature(
            mla.AscendMLAImpl._forward_decode).parameters

    def _forward(self, metas: dict, num_tokens: int):
        for i, impl in enumerate(self.impls):
            k_nope, k_pe = self.kv[i]
            q_nope, q_pe = self.q_nope[i][:num_tokens], self.q_pe[i][:num_tokens]
            meta = metas[self.names[i]]
            if self.new_api:
                res = self.mla.DecodeMLAPreprocessResult(q_nope, q_pe, k_nope, k_pe)
                out = impl._forward_decode(res, self.shape.block_size, meta)
            else:
                out = impl._forward_decode(q_nope, q_pe, k_nope, k_pe, self.shape.block_size,
                                           meta)
            self.outputs[i][:num_tokens].copy_(out)  # forward(): o_proj_input[:n] = ...
        return self.outputs[0]

    def metadata(self, q_lens, kv_lens, table, bucket: int):
        """The persistent buffers filled (zeros past the padded batch) and the metadata
        ``_forward_decode`` reads, with the device buffers attached."""
        from pyruntime.hook import vllm_ascend_patches as gqa

        q, padded = self.shape.q_len, bucket // self.shape.q_len
        cu = self._fill(q_lens, kv_lens, table, bucket, pad=0)
        common = types.SimpleNamespace(query_start_loc=self.qsl[: padded + 1],
                                       seq_lens=self.seq_lens[:padded],
                                       block_table_tensor=self.table[:padded])
        state = self.mla.AscendAttentionState.SpecDecoding if q > 1 else \
            self.mla.AscendAttentionState.DecodeOnly
        decode = types.SimpleNamespace(
            block_table=self.table[:padded], seq_lens_list=self.seq_lens_cpu[:padded].tolist(),
            actual_seq_lengths_q=cu[1: padded + 1].tolist(), attn_mask=None, cos=None,
            sin=None, nope_zero_rope_cache=None)
        meta = types.SimpleNamespace(attn_state=state, causal=True, decode=decode,
                                     num_decode_tokens=bucket, num_decodes=padded)
        setattr(meta, gqa.LENGTHS_ATTR, gqa.device_lengths(common, self.batch_constants))
        return meta

    def begin(self, on_host: dict) -> None:
        self.recorder.updated_queries.clear()
        self.errors = [0.0] * self.shape.num_layers
        self.rope_distance = float("inf")

    def check(self, q_lens, kv_lens, table, outs: list) -> None:
        import numpy as np
        import torch

        s = self.shape
        rows = int(np.sum(q_lens))
        for i in range(s.num_layers):
            if i in s.host_layers:
                continue  # its FIA v2 is the recorder's: nothing to compare
            k_nope, k_pe = (t.cpu() for t in self.kv[i])
            q_nope, q_pe = self.q_nope[i].cpu(), self.q_pe[i].cpu()
            latent = reference(q_nope, q_pe, k_nope[:, :, 0], k_pe[:, :, 0], table, q_lens,
                               kv_lens, s.scale)
            w_uv = self.impls[i].W_UV.cpu().double()
            expected = torch.einsum("thl,hlv->thv", latent, w_uv).reshape(rows, -1)
            got = outs[i][:rows].double()
            scale = float(expected.abs().max())
            self.errors[i] = max(self.errors[i], float((got - expected).abs().max()) / scale)
            without = reference(q_nope, q_pe.mul(0), k_nope[:, :, 0], k_pe[:, :, 0], table,
                                q_lens, kv_lens, s.scale)
            without = torch.einsum("thl,hlv->thv", without, w_uv).reshape(rows, -1)
            self.rope_distance = min(self.rope_distance,
                                     float((without - expected).abs().max()) / scale)

    @property
    def max_rel_err(self) -> float:
        return max(self.errors)

    def layers(self, status: Any, counter: driver.UpdateCounter, steps: int) -> list[dict]:
        s = self.shape
        host = dict(status.host_path_layers)
        entries = status.device_entries
        updated = [sum(ptr == q.data_ptr() for ptr in self.recorder.updated_queries)
                   / max(steps, 1) for q in self.q_nope]
        return [{"name": n, "path": "device" if n in entries else "host" if n in host else
                 "not captured", "reason": host.get(n),
                 "entry": entries.get(n),
                 "max_rel_err": None if i in s.host_layers else self.errors[i],
                 "rope_distance": self.rope_distance,
                 "updates_per_step": updated[i] if s.host_layers else None,
                 "num_heads": s.num_heads,
                 "num_heads_padded": int(getattr(self.impls[i], "num_heads_padded",
                                                 s.num_heads))}
                for i, n in enumerate(self.names)]

    def run_fields(self, status: Any) -> dict:
        return {"updates_skipped": status.updates_skipped}

    @staticmethod
    def report_fields(after: driver.Run, before: driver.Run | None,
                      counts: dict) -> tuple[dict, bool]:
        """The hooked run alone. Its verdict adds: every MLA layer on the device path or
        (built with ``enable_kv_nz``) on vLLM-Ascend's, each of those updated once a step and
        no other update, the MLA update call skipped where no layer needs it, and the
        reference without the rope part farther than `TOLERANCE` from it (the check can
        fail)."""
        device_layers, host_layers = counts["device_layers"], counts["host_layers"]
        distance = min((layer["rope_distance"] for layer in after.layers), default=0.0)
        host_updates = [layer["updates_per_step"] for layer in after.layers
                        if layer["path"] == "host"]
        fields = {
            # the twin's AI Core bodies: "reference" (C, the default here) or "triton"
            "aicore_body": os.environ.get("AICPU_TILING_TWIN_AICORE"),
            "host_layers": host_layers,
            # on the device-path layers (every update is the host-path layers' otherwise)
            "updates_per_step_after": counts["on_ours"] if host_layers
            else after.updates_per_step,
            "updates_per_step_all": after.updates_per_step,
            "updates_skipped": after.updates_skipped, "rope_distance": distance}
        verdict = (device_layers + host_layers == len(after.layers)
                   and after.updates_per_step == host_layers
                   and all(u == 1 for u in host_updates)
                   and (after.updates_skipped > 0 or host_layers > 0)
                   and distance > TOLERANCE)
        return fields, verdict
