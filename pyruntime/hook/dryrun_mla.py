"""The MLA dry run (``aicpu-tiling hook-dryrun --model mla``): vLLM-Ascend's own
``AscendMLAImpl`` captured on the device path, replayed, compared with float64 absorbed MLA.

A decoder of ``num_layers`` MLA layers at DeepSeek-V3's geometry at one rank of TP 8: 16 heads,
``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64, ``v_head_dim`` 128 (DeepSeek-V3's
``config.json``: ``num_attention_heads`` 128, ``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64,
``v_head_dim`` 128), cache block 128 (``AscendMLABackend.get_supported_kernel_block_sizes``),
float32. vLLM-Ascend's own ``AscendMLAImpl`` (built by its ``__init__``) runs its own
``_forward_decode`` and ``_v_up_proj`` (``W_UV``, random here), under its own
``ACLGraphWrapper`` with ``forward_context.capturing`` as the model runner sets it, and
``update_full_graph_params(AscendMLABackend, ...)`` after each replay, which calls the MLA
``update_graph_params`` (both releases: ``AscendMLABackend`` is not an ``AscendAttentionBackend``,
so 0.30's ``use_updatable_graph`` is False for it).

What stands in, besides what `dryrun` lists: the MLA metadata. ``AscendMLAMetadataBuilder``
needs the model's rotary embedding (``get_cos_and_sin_mla``) and the model runner's
positions, so the metadata is a namespace with the fields ``_forward_decode`` reads
(``attn_state``, ``causal``, ``decode.block_table`` / ``seq_lens_list`` /
``actual_seq_lengths_q`` / ``attn_mask``), and the persistent device buffers are attached by
the same function the patched ``build`` calls (`vllm_ascend_patches.device_lengths`). The
queries (``ql_nope``, already absorbed, and ``q_pe``) and the cache pair are random, written
outside the graph. Without the hook nothing is run: vLLM-Ascend's MLA path is FIA v2 with
``query_rope``/``key_rope``, which the NPU twin does not model; the run reports the task
updates the hooked run removed as the FIA tasks vLLM-Ascend would have registered (one per
MLA layer per step: ``update_graph_params`` zips its layers with ``attn_params[num_tokens]``).
"""

from __future__ import annotations

import importlib
import os
import time
import types
from dataclasses import dataclass

from .dryrun import DryRunError, Run, _start_device, _trace_steps, check_real_vllm_ascend

#: float32 absorbed MLA against float64 (576-long dot products, 16 heads)
TOLERANCE = 1e-4


@dataclass
class MLAShape:
    """A small MLA decoder at one TP-8 rank of DeepSeek-V3 (see the module docstring)."""

    num_layers: int = 3
    num_heads: int = 16
    kv_lora_rank: int = 512
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    block_size: int = 128
    num_blocks: int = 24
    max_reqs: int = 8
    max_blocks_per_req: int = 3
    buckets: tuple[int, ...] = (4, 8)
    spec_tokens: int = 0
    #: the shared trace folding (`dryrun`): kv lengths in [kv_min, capacity]; 1 keeps the
    #: trace's own lengths (MLA has no window to reach past)
    kv_min: int = 1
    #: DeepSeek-V3's softmax scale before YaRN's mscale: (qk_nope + rope) ** -0.5
    scale: float = 192 ** -0.5
    #: an engine fault for the negative test: "drop-rope" zeroes q_pe before our kernels
    fault: str | None = None
    #: layers built with ``enable_kv_nz`` (the NZ cache layout), which the hook leaves on
    #: vLLM-Ascend's path: a mixed graph. Their FIA v2 call goes to `FiaV2Recorder` (the twin
    #: does not model it), so their outputs are not checked, only their task updates
    host_layers: tuple[int, ...] = ()

    @property
    def q_len(self) -> int:
        return 1 + self.spec_tokens

    # what _trace_steps reads
    @property
    def sink_layers(self) -> tuple:
        return ()


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
    query) in a mixed-graph run: each call is one AI Core task on the current stream that
    writes zeros (no numerics: the twin does not model FIA v2), so vLLM-Ascend's own capture
    and ``update_graph_params`` run their task-group and task-update protocol around it, and
    the twin checks it. It records the query buffer each task-update call reads."""

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
                raise NotImplementedError("eager FIA v2 is not needed by the dry run")

            @staticmethod
            def out(query, key, value, *, workspace=None, out, **options):
                issue(query, out)
                return out

        torch_npu.npu_fused_infer_attention_score_v2 = _Packet()
        torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace = (
            lambda query, *args, **kwargs: torch.empty(1024, dtype=torch.uint8,
                                                       device=query.device))


class _MLARunner:
    """vLLM-Ascend's model runner, reduced to the MLA decode of FULL_DECODE_ONLY."""

    def __init__(self, shape: MLAShape, seed: int) -> None:
        import torch
        import vllm_ascend.attention.mla_v1 as mla
        from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config
        from vllm_ascend.ascend_config import init_ascend_config
        from vllm_ascend.compilation import acl_graph

        self.torch, self.mla, self.acl_graph, self.shape = torch, mla, acl_graph, shape
        self.mode, self.set_current_vllm_config = CUDAGraphMode, set_current_vllm_config
        s = shape
        self.device = torch.device("npu", 0)
        cfg = VllmConfig()
        cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
        if s.spec_tokens:
            cfg.speculative_config = types.SimpleNamespace(
                method="mtp", num_speculative_tokens=s.spec_tokens, parallel_drafting=False,
                num_speculative_tokens_per_batch_size=None, draft_model_config=None,
                use_eagle=lambda: False, disable_padded_drafter_batch=False)
        cfg.model_config = types.SimpleNamespace(
            max_model_len=s.max_blocks_per_req * s.block_size, runner_type="generate",
            dtype=torch.float32, use_mla=True, hf_text_config=None, is_hybrid=False,
            enforce_eager=False, quantization=None, is_deepseek_mla=True,
            hf_config=types.SimpleNamespace(model_type="deepseek_v3",
                                            architectures=["DeepseekV3ForCausalLM"]))
        self.cfg = cfg
        init_ascend_config(cfg)
        self.names = [f"model.layers.{i}.self_attn.attn" for i in range(s.num_layers)]
        gen = self.gen = torch.Generator().manual_seed(seed)
        dev = self.device
        head = s.kv_lora_rank + s.qk_rope_head_dim
        with set_current_vllm_config(cfg):
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
        # vLLM-Ascend's MLA cache pair (model_runner_v1: nope then rope, num_kv_heads 1)
        self.kv = [(torch.randn(s.num_blocks, s.block_size, 1, s.kv_lora_rank,
                                generator=gen).to(dev),
                    torch.randn(s.num_blocks, s.block_size, 1, s.qk_rope_head_dim,
                                generator=gen).to(dev)) for _ in self.names]
        t = max(s.buckets)
        self.q_nope = [torch.zeros(t, s.num_heads, s.kv_lora_rank, device=dev)
                       for _ in self.names]
        self.q_pe = [torch.zeros(t, s.num_heads, s.qk_rope_head_dim, device=dev)
                     for _ in self.names]
        self.outputs = [torch.zeros(t, s.num_heads * s.v_head_dim, device=dev)
                        for _ in self.names]
        i32 = torch.int32
        self.qsl_cpu = torch.zeros(s.max_reqs + 1, dtype=i32)
        self.qsl = torch.zeros(s.max_reqs + 1, dtype=i32, device=dev)
        self.seq_lens_cpu = torch.zeros(s.max_reqs, dtype=i32)
        self.seq_lens = torch.zeros(s.max_reqs, dtype=i32, device=dev)
        self.table_cpu = torch.zeros(s.max_reqs, s.max_blocks_per_req, dtype=i32)
        self.table = torch.zeros(s.max_reqs, s.max_blocks_per_req, dtype=i32, device=dev)
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

    def _metadata(self, q_lens, kv_lens, table, bucket: int):
        """Fill the persistent buffers (uniform padding: q_len q, kv_len 0) and make the
        metadata ``_forward_decode`` reads, with the device buffers attached."""
        from . import vllm_ascend_patches as gqa

        torch, q, n = self.torch, self.shape.q_len, len(q_lens)
        padded = bucket // q
        cu = self.qsl_cpu
        cu.zero_()
        cu[1: n + 1] = torch.tensor(q_lens).cumsum(0)
        cu[n + 1: padded + 1] = cu[n] + torch.arange(1, padded - n + 1) * q
        self.seq_lens_cpu.zero_()
        self.seq_lens_cpu[:n] = torch.tensor(kv_lens)
        self.table_cpu.zero_()
        self.table_cpu[:n, : table.shape[1]] = table
        for device_buffer, host in ((self.qsl, cu), (self.seq_lens, self.seq_lens_cpu),
                                    (self.table, self.table_cpu)):
            device_buffer.copy_(host.pin_memory(), non_blocking=True)
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

    def step(self, q_lens, kv_lens, table) -> list:
        from vllm.forward_context import BatchDescriptor, get_forward_context, set_forward_context

        bucket = next(b for b in self.shape.buckets if b >= sum(q_lens))
        metas = dict.fromkeys(self.names, self._metadata(q_lens, kv_lens, table, bucket))
        descriptor = BatchDescriptor(num_tokens=bucket, num_reqs=bucket // self.shape.q_len,
                                     uniform=True)
        with self.set_current_vllm_config(self.cfg), set_forward_context(
                metas, self.cfg, num_tokens=bucket, cudagraph_runtime_mode=self.mode.FULL,
                batch_descriptor=descriptor):
            context = get_forward_context()
            for name, value in (("capturing", False), ("is_draft_model", False),
                                ("is_draft_model_prefill", False), ("sinks", False),
                                ("in_profile_run", False), ("num_tokens", bucket)):
                setattr(context, name, value)
            self.wrapper(metas, bucket)
            if not context.capturing:
                self.acl_graph.update_full_graph_params(
                    self.mla.AscendMLABackend, self.update_stream, context, bucket, self.cfg,
                    self.cfg.speculative_config)
        self.torch.npu.synchronize()
        return [o.cpu() for o in self.outputs]

    def capture(self) -> None:
        torch, q = self.torch, self.shape.q_len
        for bucket in self.shape.buckets:
            n = bucket // q
            self.step([q] * n, [q] * n, torch.zeros(n, 1, dtype=torch.int32))


def _drop_rope(engine) -> None:
    """The negative test's engine fault: our kernels get a zero ``q_pe`` (the rope part of
    the scores dropped); the dry run must catch it."""
    original = engine.capture_mla

    def capture_mla(capture):
        import dataclasses

        original(dataclasses.replace(capture, q_pe=capture.q_pe.mul(0)))

    engine.capture_mla = capture_mla


def run(*, placement: str = "graph", steps: int = 4, seed: int = 0,
        shape: MLAShape | None = None) -> Run:
    """One hooked MLA run in this process (once per process).

    Raises:
        DryRunError: vLLM or the real vLLM-Ascend is not importable, or the hook is not
            active.
    """
    started = time.perf_counter()
    check_real_vllm_ascend()
    device = _start_device(placement)
    import numpy as np
    import torch

    from pyruntime import hook

    from . import activation
    from .dryrun import _split_this_step, _UpdateCounter

    installed = hook.install()
    if installed.state not in ("waiting", "active"):
        raise DryRunError(f"the hook did not install: {installed.reason}")
    shape = shape or MLAShape()
    counter = _UpdateCounter(torch)
    recorder = FiaV2Recorder()
    if shape.host_layers:
        recorder.install()
    for module in ("vllm_ascend.ops", "vllm_ascend.attention.attention_v1",
                   "vllm_ascend.compilation.acl_graph", "vllm_ascend.attention.mla_v1"):
        importlib.import_module(module)
    status = hook.status()
    if status.state != "active":
        raise DryRunError(f"the hook is not active: {status.reason}")
    engine = activation._state.engine
    if shape.fault == "drop-rope":
        _drop_rope(engine)
    from importlib import metadata

    runner = _MLARunner(shape, seed)
    runner.capture()
    counter.reset()
    recorder.updated_queries.clear()
    split_steps = 0
    errors = [0.0] * shape.num_layers
    rope_distance = float("inf")
    done = 0
    for q_lens, kv_lens in _trace_steps(shape, steps, seed):
        for tensors in (runner.q_nope, runner.q_pe):
            for t in tensors:
                t.copy_(torch.randn(t.shape, generator=runner.gen))
        blocks = -(-max(kv_lens) // shape.block_size)
        table = torch.randperm(shape.num_blocks, generator=runner.gen)[
            : len(q_lens) * blocks].view(len(q_lens), blocks).int()
        outs = runner.step(q_lens, kv_lens, table)
        split_steps += _split_this_step(engine)
        rows = int(np.sum(q_lens))
        for i in range(shape.num_layers):
            if i in shape.host_layers:
                continue  # its FIA v2 is the recorder's: nothing to compare
            k_nope, k_pe = (t.cpu() for t in runner.kv[i])
            q_nope, q_pe = runner.q_nope[i].cpu(), runner.q_pe[i].cpu()
            latent = reference(q_nope, q_pe, k_nope[:, :, 0], k_pe[:, :, 0], table, q_lens,
                               kv_lens, shape.scale)
            w_uv = runner.impls[i].W_UV.cpu().double()
            expected = torch.einsum("thl,hlv->thv", latent, w_uv).reshape(rows, -1)
            got = outs[i][:rows].double()
            scale = float(expected.abs().max())
            errors[i] = max(errors[i], float((got - expected).abs().max()) / scale)
            without = reference(q_nope, q_pe.mul(0), k_nope[:, :, 0], k_pe[:, :, 0], table,
                                q_lens, kv_lens, shape.scale)
            without = torch.einsum("thl,hlv->thv", without, w_uv).reshape(rows, -1)
            rope_distance = min(rope_distance,
                                float((without - expected).abs().max()) / scale)
        done += 1
    status = hook.status()
    if status.engine != f"npu-{placement}":
        raise DryRunError(f"the hook captured into engine {status.engine}, not npu-{placement}")
    host = dict(status.host_path_layers)
    entries = status.device_entries
    updated = [sum(ptr == q.data_ptr() for ptr in recorder.updated_queries) / max(done, 1)
               for q in runner.q_nope]
    layers = [{"name": n, "path": "device" if n in entries else "host" if n in host else
               "not captured", "reason": host.get(n),
               "entry": entries.get(n),
               "max_rel_err": None if i in shape.host_layers else errors[i],
               "rope_distance": rope_distance,
               "updates_per_step": updated[i] if shape.host_layers else None,
               "num_heads": shape.num_heads,
               "num_heads_padded": int(getattr(runner.impls[i], "num_heads_padded",
                                               shape.num_heads))}
              for i, n in enumerate(runner.names)]
    return Run(hooked=True, vllm_ascend=metadata.version("vllm-ascend"), device=device,
               placement=placement, spec_tokens=shape.spec_tokens, layers=layers, steps=done,
               updates_per_step=counter.count / max(done, 1), max_rel_err=max(errors),
               seconds=round(time.perf_counter() - started, 1),
               steps_with_split_units=split_steps, updates_skipped=status.updates_skipped)


def report(after: Run) -> dict:
    """What ``hook-dryrun --model mla --json`` prints. ``ok``: every MLA layer on the device
    path, zero task updates per step, the outputs within `TOLERANCE` of float64, and the
    reference without the rope part farther than that from it (the check can fail)."""
    device_layers = sum(1 for layer in after.layers if layer["path"] == "device")
    host_layers = sum(1 for layer in after.layers if layer["path"] == "host")
    distance = min((layer["rope_distance"] for layer in after.layers), default=0.0)
    # in a mixed graph: the task updates fall on the host-path layers only, one each a step
    on_ours = sum(layer["updates_per_step"] or 0 for layer in after.layers
                  if layer["path"] == "device")
    out = {"schema": "aicpu-tiling/hook-dryrun-mla", "vllm_ascend": after.vllm_ascend,
           "device": after.device, "placement": after.placement,
           # the twin's AI Core bodies: "reference" (C, the default here) or "triton"
           "aicore_body": os.environ.get("AICPU_TILING_TWIN_AICORE"),
           "spec_tokens": after.spec_tokens, "layers": after.layers,
           "device_layers": device_layers, "steps": after.steps,
           "host_layers": host_layers,
           # on the device-path layers (every update is the host-path layers' otherwise)
           "updates_per_step_after": on_ours if host_layers else after.updates_per_step,
           "updates_per_step_all": after.updates_per_step,
           "updates_skipped": after.updates_skipped,
           "max_rel_err": after.max_rel_err, "rope_distance": distance,
           "tolerance": TOLERANCE, "seconds": after.seconds,
           "steps_with_split_units": after.steps_with_split_units}
    host_updates = [layer["updates_per_step"] for layer in after.layers
                    if layer["path"] == "host"]
    out["ok"] = bool(device_layers + host_layers == len(after.layers) and device_layers > 0
                     and after.updates_per_step == host_layers and on_ours == 0
                     and all(u == 1 for u in host_updates)
                     and (after.updates_skipped > 0 or host_layers > 0)
                     and after.max_rel_err <= TOLERANCE and distance > TOLERANCE)
    return out


def run_in_child(*, placement: str, steps: int, spec_tokens: int = 0, fault: str | None = None,
                 env: dict | None = None, timeout_s: float = 600) -> dict:
    """`run` in a fresh interpreter (the twin and the hook are once per process); returns
    its :func:`report`.

    Raises:
        DryRunError: the child failed (its last line of stderr).
    """
    import json
    import subprocess
    import sys

    env = env or {k: v for k, v in os.environ.items() if k != "AICPU_TILING"}
    cmd = [sys.executable, "-m", "pyruntime.hook.dryrun_mla", "--placement", placement,
           "--steps", str(steps), "--spec-tokens", str(spec_tokens),
           *(["--fault", fault] if fault else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s,
                          check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DryRunError(f"the MLA run failed: {tail}")
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    """``python -m pyruntime.hook.dryrun_mla``: one run, its report as one JSON line."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m pyruntime.hook.dryrun_mla")
    parser.add_argument("--placement", default="graph", choices=("graph", "pre-replay"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--spec-tokens", type=int, default=0)
    parser.add_argument("--fault", choices=("drop-rope",), default=None)
    parser.add_argument("--host-layers", default="",
                        help="comma-separated layer indices built with enable_kv_nz (a mixed "
                             "graph)")
    parser.add_argument("--num-heads", type=int, default=16,
                        help="query heads per rank (default 16: DeepSeek-V3 at TP 8); one "
                             "that is not a power of two takes vLLM-Ascend's head padding")
    args = parser.parse_args(argv)
    host = tuple(int(i) for i in args.host_layers.split(",") if i)
    result = run(placement=args.placement, steps=args.steps,
                 shape=MLAShape(spec_tokens=args.spec_tokens, fault=args.fault,
                                host_layers=host, num_heads=args.num_heads))
    print(json.dumps(report(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
