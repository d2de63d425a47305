"""The hook inside vLLM-Ascend's own classes: capture, replay, compare (``aicpu-tiling
hook-dryrun``).

With vLLM and vLLM-Ascend importable, this installs the hook with the real engine (on the
NPU twin where no NPU is present: ``pyruntime.npu_twin``), then drives vLLM-Ascend's own
``AscendAttentionMetadataBuilder``, ``AscendAttentionBackendImpl`` and ``ACLGraphWrapper``
the way its model runner does under FULL_DECODE_ONLY: persistent length and block-table
buffers refilled each step, metadata built by the builder, one graph captured per token
bucket with ``forward_context.capturing`` set, then replayed with decode batches from the
bundled trace, uniform padding included, and vLLM-Ascend's own update call after each replay
(``update_full_graph_params`` up to 0.28; the ``UpdatableGraph`` update inside the replay
from 0.29). Every layer's output is compared with a float64 reference, and the twin counts
the graph task updates (``torch.npu.graph_task_update_begin``).

The layers have gpt-oss-20b's attention geometry (64 query heads, 8 KV heads, head_dim 64:
``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` of ``openai/gpt-oss-20b``'s
``config.json``, which vLLM's ``gpt_oss.py`` passes to ``Attention``), one geometry for the
whole graph as in a real model (one tiling per graph key). The last layer is a gpt-oss full
layer: learnable attention sinks and no window (vLLM ``gpt_oss.py``: ``sliding_window`` only on
even layers, ``sinks`` on every layer), which vLLM-Ascend captures through
``full_graph_fia_v2``. Without the hook vLLM-Ascend's path for it is FIA v2
(``learnable_sink``, modelled by the twin), run on 0.29+, which update each registered task
by its own kind; on 0.23 that layer is not run: its ``update_graph_params`` picks one FIA
branch for every layer of a graph (``_EXTRA_CTX.sinks``), so vLLM-Ascend itself cannot
host-update a graph that mixes layers with and without sinks, as this one does.
``forward_context.sinks`` is True only for a set whose every layer has sinks (gpt-oss), as
vLLM-Ascend's ``set_ascend_forward_context`` sets it for such a model.

Sliding windows take the device path too (the model's W keys; vLLM-Ascend's FIA keeps W + 1,
so a windowed layer's reference is the one of the path it took). Besides this mixed set
(``--model mixed``), three layer sets from real configs, every layer on the device path
(``--model``, :data:`MODELS`), with kv lengths past the window on most steps:

* ``gpt-oss``: gpt-oss-20b's geometry, window 128 on the even layers and none on the odd ones,
  sinks on every layer (vLLM ``gpt_oss.py``: ``sliding_window = config.sliding_window if
  self.layer_idx % 2 == 0 else None``, ``sinks`` on every layer; transformers
  ``GptOssConfig.sliding_window = 128``): one graph, two tilings planned by one launch.
* ``gemma2``: Gemma 2 (transformers ``Gemma2Config`` defaults, gemma-2-2b: 8 query heads, 4 KV
  heads, head_dim 256, ``query_pre_attn_scalar`` 256, ``sliding_window`` 4096 on the even
  layers, ``attn_logit_softcapping`` 50.0 on every layer; vLLM ``gemma2.py`` passes
  ``logits_soft_cap=config.attn_logit_softcapping`` and ``per_layer_sliding_window``), block
  size 128.
* ``gemma3``: Gemma 3 (transformers ``Gemma3TextConfig``: 8 / 4 / 256, ``sliding_window_pattern``
  6: layer i is sliding unless (i + 1) % 6 == 0, no soft cap; ``sliding_window`` 1024 as
  google/gemma-3-4b-it and -12b-it's ``config.json`` set it; vLLM ``gemma3.py``), block size 128.

* ``c8``: vLLM-Ascend's int8 KV cache (C8) on every layer, in bfloat16, with Qwen3-32B's
  attention geometry (64 query heads, 8 KV heads, head_dim 128: ``Qwen/Qwen3-32B``
  ``config.json``; vLLM-Ascend's ``AscendC8KVCacheAttentionMethod`` names Qwen3 as its model)
  and block size 128: a shape torch_npu documents for FIA's int8 NZ cache (bf16 query, D 128,
  block 128 or 512, heads (64, 8) among four pairs; the twin enforces it). The layers are
  vLLM-Ascend's own ``AscendC8AttentionBackendImpl`` under a config whose quant config has
  ``enable_c8_quant``; their int8 caches hold the NZ layout its ``_nz_5d_view`` reads, with
  per-channel bf16 scales on the layer (zero offsets: see `pyruntime.hook.vllm_ascend_c8`).
  Each capture follows an eager warm-up step (vLLM's warm-up), where the hook makes the fp32
  scales. Our kernels read the caches in place. Without the hook they run vLLM-Ascend's C8
  FIA call (BNSD, int8 NZ, antiquant; modelled by the twin) at q_len 1; at q_len > 1 they are
  not run (nor warmed up): that call hands FIA one batch row per query token and one kv
  length per request, which torch_npu documents as an error.

Gemma's geometry differs from gpt-oss's, so each set is its own run (one geometry per graph).

What stands in for vLLM's engine here: the model config (a namespace with the fields these
classes read: no model is loaded), the layers (namespaces with ``layer_name`` and unit KV
scales), the queries and the KV cache (random, written outside the graph, so
``reshape_and_cache`` is not called: key and value are None, as in vLLM-Ascend's decode-only
forward). The classes, the hook and the engine are the real ones.
"""

from __future__ import annotations

import importlib.util
import os
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "aicpu-tiling/hook-dryrun"
#: float32 attention against a float64 reference
TOLERANCE = 1e-4
#: per model dtype: the largest relative error against float64 a run may have (bfloat16: one
#: rounding of the output and of P and V before the dot, a few 1e-3 measured)
TOLERANCES = {"float32": TOLERANCE, "bfloat16": 1e-2}
REPO = Path(__file__).resolve().parents[2]


class DryRunError(RuntimeError):
    """The dry run cannot start here (says why)."""


@dataclass
class Shape:
    """A small decoder: ``num_layers`` GQA layers in float32 with gpt-oss-20b's attention
    geometry; the layers at ``windowed_layers`` have a sliding window, which the device path
    applies with the model's W keys (vLLM-Ascend's path keeps W + 1); the layers at ``soft_capped_layers`` have a
    logits soft cap, which vLLM-Ascend's path ignores and the device path applies; the layers
    at ``sink_layers`` have attention sinks (``[num_heads]`` in ``sink_dtype``), which
    vLLM-Ascend captures through FIA v2."""

    num_layers: int = 5
    windowed_layers: tuple[int, ...] = (1,)
    sliding_window: int = 24
    soft_capped_layers: tuple[int, ...] = (2,)
    #: small enough to move N(0, 1) scores well past the tolerance if it were not applied
    logits_soft_cap: float = 2.0
    sink_layers: tuple[int, ...] = (4,)
    #: the sinks are drawn uniformly from this range: large enough that the answer without
    #: them is far outside the tolerance at every step (reported as ``sinks_distance``)
    sink_range: tuple[float, float] = (1.0, 4.0)
    #: bfloat16, as a served gpt-oss holds them: vLLM makes ``sinks`` a parameter of the model
    #: dtype (``gpt_oss.py``, built under ``set_default_torch_dtype``) and FIA v2 takes
    #: ``learnable_sink`` in bfloat16 only; our kernels read them in place, widened on load
    sink_dtype: str = "bfloat16"
    #: gpt-oss-20b: num_attention_heads 64, num_key_value_heads 8, head_dim 64
    num_heads: int = 64
    num_kv_heads: int = 8
    head_size: int = 64
    block_size: int = 16
    num_blocks: int = 96
    max_reqs: int = 8
    max_blocks_per_req: int = 8
    buckets: tuple[int, ...] = (4, 8)
    #: speculative decode (MTP): every request verifies 1 + spec_tokens query tokens
    spec_tokens: int = 0
    #: the layer set (:data:`MODELS`; "mixed" is this default one)
    model: str = "mixed"
    #: the trace's kv lengths are folded into [kv_min, capacity]; above 1 down from the capacity
    #: (past the window on most steps)
    kv_min: int = 1
    #: the layers with an int8 KV cache (vLLM-Ascend's C8: ``AscendC8AttentionBackendImpl``,
    #: int8 caches in the NZ layout, per-channel scales drawn from `c8_scale_range`)
    c8_layers: tuple[int, ...] = ()
    #: a K or V value of N(0, 1) quantised with scale s spans +-127 s: 3 to 5 sigma
    c8_scale_range: tuple[float, float] = (0.025, 0.04)
    #: the model dtype (queries, outputs, unquantized caches, C8 scales): a key of TOLERANCES
    dtype: str = "float32"

    @property
    def tolerance(self) -> float:
        return TOLERANCES[self.dtype]

    @property
    def q_len(self) -> int:
        return 1 + self.spec_tokens

    @classmethod
    def of(cls, model: str = "mixed", spec_tokens: int = 0) -> Shape:
        """The layer set `model` (:data:`MODELS`).

        Raises:
            DryRunError: an unknown model.
        """
        if model not in MODELS:
            raise DryRunError(f"unknown --model {model!r}; choose from {', '.join(MODELS)}")
        return cls(spec_tokens=spec_tokens, model=model, **MODELS[model])


def _gemma3_windowed(num_layers: int) -> tuple[int, ...]:
    # transformers Gemma3TextConfig: "sliding_attention" if (i + 1) % pattern, pattern 6
    return tuple(i for i in range(num_layers) if (i + 1) % 6)


#: the layer sets of ``--model`` besides "mixed" (the Shape defaults): see the module docstring
MODELS: dict[str, dict] = {
    "mixed": {},
    "gpt-oss": {"num_layers": 4, "windowed_layers": (0, 2), "sliding_window": 128,
                "soft_capped_layers": (), "sink_layers": (0, 1, 2, 3),
                "max_blocks_per_req": 24, "num_blocks": 200, "kv_min": 64},
    "gemma2": {"num_layers": 2, "windowed_layers": (0,), "sliding_window": 4096,
               "soft_capped_layers": (0, 1), "logits_soft_cap": 50.0, "sink_layers": (),
               "num_heads": 8, "num_kv_heads": 4, "head_size": 256, "block_size": 128,
               "max_blocks_per_req": 36, "num_blocks": 148, "max_reqs": 4, "buckets": (2, 4),
               "kv_min": 3584},
    "gemma3": {"num_layers": 6, "windowed_layers": _gemma3_windowed(6), "sliding_window": 1024,
               "soft_capped_layers": (), "sink_layers": (), "num_heads": 8, "num_kv_heads": 4,
               "head_size": 256, "block_size": 128, "max_blocks_per_req": 12, "num_blocks": 52,
               "max_reqs": 4, "buckets": (2, 4), "kv_min": 512},
    "c8": {"num_layers": 3, "windowed_layers": (), "soft_capped_layers": (), "sink_layers": (),
           "c8_layers": (0, 1, 2), "num_heads": 64, "num_kv_heads": 8, "head_size": 128,
           "block_size": 128, "max_blocks_per_req": 8, "num_blocks": 40, "max_reqs": 4,
           "buckets": (2, 4), "dtype": "bfloat16"},
}


@dataclass
class Run:
    """One run in one process: with the hook (``hooked``) or vLLM-Ascend's own path."""

    hooked: bool
    vllm_ascend: str
    device: str
    placement: str
    spec_tokens: int = 0
    model: str = "mixed"
    layers: list[dict] = field(default_factory=list)
    steps: int = 0
    updates_per_step: float = 0.0
    max_rel_err: float = float("nan")
    seconds: float = 0.0
    #: replayed steps whose tiling split a unit over cores, so that the combine merged its
    #: pieces (and added the sinks of those rows); None without the hook or the NPU engine
    steps_with_split_units: int | None = None
    #: the most tilings a graph key holds (one per distinct window of its layers) and the
    #: AI-CPU launches per replayed step that plan them (pre-replay: counted at each step;
    #: graph: captured per key, each replay runs them); None without the NPU engine
    tilings_per_graph: int | None = None
    tiling_launches_per_step: float | None = None
    #: update calls the hook skipped (its graphs' layers all ours); the MLA run reports it
    updates_skipped: int | None = None
    #: the model dtype and the largest relative error against float64 it allows
    dtype: str = "float32"
    tolerance: float = TOLERANCE


def report(before: Run, after: Run) -> dict:
    """What ``hook-dryrun --json`` prints: the run without the hook against the run with it.

    ``ok`` holds when at least one layer moved to the device path, no layer of ours was
    host-updated, and the hooked outputs (the host-path layers' included) match the float64
    reference within the run's tolerance (`TOLERANCES` of its dtype).
    """
    device_layers = sum(1 for layer in after.layers if layer["path"] == "device")
    # "after" counts the updates on the layers the hook took over (0 when it works); the
    # layers it leaves keep vLLM-Ascend's updates (updates_per_step_host_layers)
    on_ours = sum(layer["updates_per_step"] for layer in after.layers
                  if layer["path"] == "device")
    out = {"schema": SCHEMA, "vllm_ascend": after.vllm_ascend, "device": after.device,
           "placement": after.placement, "spec_tokens": after.spec_tokens,
           "model": after.model, "layers": after.layers,
           "device_layers": device_layers, "steps": after.steps,
           "updates_per_step_before": before.updates_per_step,
           "updates_per_step_after": on_ours,
           "updates_per_step_host_layers": after.updates_per_step - on_ours,
           "max_rel_err": after.max_rel_err, "max_rel_err_before": before.max_rel_err,
           "tolerance": after.tolerance, "dtype": after.dtype, "seconds": round(before.seconds + after.seconds, 1),
           "steps_with_split_units": after.steps_with_split_units,
           "tilings_per_graph": after.tilings_per_graph,
           "tiling_launches_per_step": after.tiling_launches_per_step}
    out["ok"] = bool(device_layers > 0 and on_ours == 0 and after.max_rel_err <= after.tolerance)
    return out


def check_real_vllm_ascend() -> Path:
    """The real vLLM-Ascend's ``vllm_ascend/__init__.py``; raises `DryRunError` otherwise."""
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is None or spec.origin is None:
        raise DryRunError("vllm_ascend is not importable: run it where vLLM-Ascend is "
                          "installed (or tools/vllm_env.sh RELEASE makes such an environment)")
    origin = Path(spec.origin).resolve()
    if (REPO / "tests" / "fixtures") in origin.parents:
        raise DryRunError(f"vllm_ascend resolves to the test fixture package ({origin}); the "
                          "dry run needs the real vLLM-Ascend")
    if importlib.util.find_spec("vllm") is None:
        raise DryRunError("vllm is not importable")
    return origin


def _start_device(placement: str) -> str:
    """The device the run uses: an NPU when torch_npu is installed, else the twin."""
    os.environ["AICPU_TILING_PLACEMENT"] = placement  # the engine reads it (pyruntime.placement)
    if importlib.util.find_spec("torch_npu") is not None:
        return "npu"
    from pyruntime import npu_twin

    # the C reference body of our AI Core ops: the Triton bodies are checked elsewhere
    os.environ.setdefault(npu_twin.AICORE_ENV, "reference")
    npu_twin.activate()
    return "npu-twin"


class _UpdateCounter:
    """Counts graph task updates (``torch.npu.graph_task_update_begin``) and which query
    buffer each one's FIA reads (``torch_npu.npu_fused_infer_attention_score.out`` issued
    between update begin and end), so updates can be told apart per layer."""

    def __init__(self, torch: Any) -> None:
        import torch_npu

        self.count = 0
        self.queries: list[int] = []  # data_ptr of the query of each update's FIA
        self._updating = False
        begin, end = torch.npu.graph_task_update_begin, torch.npu.graph_task_update_end

        def counted_begin(*args, **kwargs):
            self.count += 1
            self._updating = True
            return begin(*args, **kwargs)

        def counted_end(*args, **kwargs):
            self._updating = False
            return end(*args, **kwargs)

        for module in (torch.npu, torch_npu.npu):
            if getattr(module, "graph_task_update_begin", None) is begin:
                module.graph_task_update_begin = counted_begin
                module.graph_task_update_end = counted_end
        packet = torch_npu.npu_fused_infer_attention_score
        out = packet.out

        def out_seen(*args, **kwargs):
            if self._updating:
                query = kwargs.get("query", args[0] if args else None)
                self.queries.append(query.data_ptr())
            return out(*args, **kwargs)

        class _Packet:  # the packet, its .out counted; vLLM-Ascend looks it up when it calls
            def __call__(self, *args, **kwargs):
                return packet(*args, **kwargs)

            def __getattr__(self, name):
                return out_seen if name == "out" else getattr(packet, name)

        torch_npu.npu_fused_infer_attention_score = _Packet()

    def reset(self) -> None:
        self.count, self.queries = 0, []


def _split_this_step(engine: Any) -> bool:
    """True when a tiling the NPU engine planned for its current step split a unit (read
    back from the device after the step, outside any capture)."""
    from pyruntime import tiling
    from pyruntime.kernels.step import tiling_status

    for key in engine.keys.values():
        planned = tiling_status(key.params, key.tiling)
        if (planned.epoch == engine.epoch and planned.status == tiling.OK
                and planned.num_slots > 0):
            return True
    return False


class _Runner:
    """vLLM-Ascend's model runner, reduced to what FULL_DECODE_ONLY attention needs."""

    def __init__(self, shape: Shape, seed: int, hooked: bool = True) -> None:
        import torch
        import vllm_ascend.attention.attention_v1 as attention
        from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm_ascend.ascend_config import init_ascend_config
        from vllm_ascend.compilation import acl_graph

        self.torch, self.attention, self.acl_graph = torch, attention, acl_graph
        self.shape = shape
        self.dtype = getattr(torch, shape.dtype)
        self.mode = CUDAGraphMode
        self.set_current_vllm_config = set_current_vllm_config
        s = shape
        self.device = torch.device("npu", 0)
        cfg = VllmConfig()
        cfg.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
        if s.spec_tokens:  # the fields of vLLM's SpeculativeConfig these classes read
            cfg.speculative_config = types.SimpleNamespace(
                method="mtp", num_speculative_tokens=s.spec_tokens, parallel_drafting=False,
                num_speculative_tokens_per_batch_size=None, draft_model_config=None)
        if s.c8_layers:  # the flag a C8 recipe's quant config carries (kv_c8.py, modelslim)
            cfg.quant_config = types.SimpleNamespace(enable_c8_quant=True)
        cfg.model_config = types.SimpleNamespace(
            max_model_len=s.max_blocks_per_req * s.block_size, runner_type="generate",
            dtype=self.dtype, use_mla=False, hf_text_config=None, is_hybrid=False,
            enforce_eager=False, quantization=None, is_deepseek_mla=False,
            hf_config=types.SimpleNamespace(model_type="llama",
                                            architectures=["LlamaForCausalLM"]))
        self.cfg = cfg
        init_ascend_config(cfg)
        self.names = [f"model.layers.{i}.self_attn.attn" for i in range(s.num_layers)]
        spec = FullAttentionSpec(block_size=s.block_size, num_kv_heads=s.num_kv_heads,
                                 head_size=s.head_size, dtype=self.dtype)
        with set_current_vllm_config(cfg):
            self.builder = attention.AscendAttentionMetadataBuilder(spec, self.names, cfg,
                                                                    self.device)
            self.windows = [s.sliding_window if i in s.windowed_layers else None
                            for i in range(s.num_layers)]
            self.caps = [s.logits_soft_cap if i in s.soft_capped_layers else None
                         for i in range(s.num_layers)]
        gen = torch.Generator().manual_seed(seed)
        self.gen = gen
        low, high = s.sink_range
        # vLLM's gpt_oss.py: a [num_heads] parameter of the model dtype on the device, filled
        # by the weight loader before the graphs are captured
        sink_dtype = getattr(torch, s.sink_dtype)
        self.sinks = [torch.nn.Parameter((low + (high - low) * torch.rand(
            s.num_heads, generator=gen)).to(self.device, sink_dtype), requires_grad=False)
            if i in s.sink_layers else None for i in range(s.num_layers)]
        with set_current_vllm_config(cfg):
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
        #: them, nor the C8 layers at q_len > 1 (see the module docstring)
        self.run_layers = [i for i in range(s.num_layers)
                           if hooked or ((self.sinks[i] is None or self.sinks_host_updatable)
                                         and (i not in s.c8_layers or self.c8_eager))]
        cache = (s.num_blocks, s.block_size, s.num_kv_heads, s.head_size)
        dev = self.device
        self.kv = [(torch.randn(cache, generator=gen).to(dev, self.dtype),
                    torch.randn(cache, generator=gen).to(dev, self.dtype)) for _ in self.names]
        self.layers = [types.SimpleNamespace(layer_name=n, _k_scale_float=1.0,
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
        # vLLM's Attention layer hands the implementation [T, num_heads, head_size] views
        self.outputs = [torch.zeros(t, s.num_heads, s.head_size, device=dev, dtype=self.dtype)
                        for _ in self.names]
        i32 = torch.int32
        self.qsl_cpu = torch.zeros(s.max_reqs + 2, dtype=i32)
        self.qsl = torch.zeros(s.max_reqs + 2, dtype=i32, device=dev)
        self.seq_lens_cpu = torch.zeros(s.max_reqs, dtype=i32)
        self.seq_lens = torch.zeros(s.max_reqs, dtype=i32, device=dev)
        self.table_cpu = torch.zeros(s.max_reqs, s.max_blocks_per_req, dtype=i32)
        self.table = torch.zeros(s.max_reqs, s.max_blocks_per_req, dtype=i32, device=dev)
        self.slots = torch.zeros(t, dtype=torch.int64, device=dev)
        acl_graph.set_graph_params(list(s.buckets))
        self.update_stream = torch.npu.Stream()
        options = {"update_stream": self.update_stream} if self.updatable else {}
        self.wrapper = acl_graph.ACLGraphWrapper(self._forward, cfg, CUDAGraphMode.FULL,
                                                 **options)
        if self.updatable:
            self.wrapper.set_attn_backend(attention.AscendAttentionBackend)

    def _make_c8(self, i: int, gen) -> None:
        """Layer i's C8 state as vLLM-Ascend leaves it before capture: the layer's scale and
        offset parameters (``create_weights`` + ``process_weights_after_loading``: flat, the
        model dtype; symmetric, zero offsets), and int8 caches of vLLM-Ascend's allocated shape
        ``[num_blocks, block_size, num_kv_heads, head_size]`` whose memory holds the NZ layout
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
        layer, caches, ref, unscaled = self.layers[i], [], [], []
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
            caches.append(memory.view(nd).to(dev))
            ref.append((stored.double() * per_channel.double()).float())
            unscaled.append(stored.float())
        self.impls[i].key_cache, self.impls[i].value_cache = caches
        self.kv[i], self.kv_ref[i] = tuple(caches), tuple(ref)
        self.kv_unscaled[i] = tuple(unscaled)

    def _forward(self, metas: dict, num_tokens: int):
        for i in self.run_layers:
            self.impls[i].forward(self.layers[i], self.queries[i][:num_tokens], None, None,
                                  self.kv[i], metas[self.names[i]],
                                  self.outputs[i][:num_tokens])
        return self.outputs[0]

    def _common(self, q_lens: list[int], kv_lens: list[int], table, bucket: int):
        """Fill the persistent buffers as the model runner does (uniform decode padding:
        q_len 1, kv_len 0, a -1 tail) and make ``common_attn_metadata``."""
        from vllm_ascend.attention.utils import AscendCommonAttentionMetadata

        q = self.shape.q_len
        torch, n, padded = self.torch, len(q_lens), bucket // q
        cu = self.qsl_cpu
        cu.fill_(-1)
        cu[0] = 0
        cu[1: n + 1] = torch.tensor(q_lens).cumsum(0)
        cu[n + 1: padded + 1] = cu[n] + torch.arange(1, padded - n + 1) * q
        self.seq_lens_cpu.zero_()
        self.seq_lens_cpu[:n] = torch.tensor(kv_lens)
        self.table_cpu.zero_()
        self.table_cpu[:n, : table.shape[1]] = table
        for device_buffer, host in ((self.qsl, cu), (self.seq_lens, self.seq_lens_cpu),
                                    (self.table, self.table_cpu)):
            device_buffer.copy_(host.pin_memory(), non_blocking=True)
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
        return AscendCommonAttentionMetadata(**fields)

    def step(self, q_lens: list[int], kv_lens: list[int], table, eager: bool = False) -> list:
        """One decode step in the bucket that holds it; returns each layer's output rows.
        ``eager``: run without a graph (cudagraph mode NONE), as vLLM's warm-up runs do."""
        from vllm.forward_context import BatchDescriptor, get_forward_context, set_forward_context

        bucket = next(b for b in self.shape.buckets if b >= sum(q_lens))
        metas = dict.fromkeys(self.names, self.builder.build(0, self._common(
            q_lens, kv_lens, table, bucket)))
        descriptor = BatchDescriptor(num_tokens=bucket, num_reqs=bucket // self.shape.q_len,
                                     uniform=True)
        mode = self.mode.NONE if eager else self.mode.FULL
        with self.set_current_vllm_config(self.cfg), set_forward_context(
                metas, self.cfg, num_tokens=bucket, cudagraph_runtime_mode=mode,
                batch_descriptor=descriptor):
            context = get_forward_context()
            # the fields vLLM-Ascend's set_ascend_forward_context sets that attention reads
            # (the rest of it sets up MoE communication, which needs a distributed group)
            for name, value in (("capturing", False), ("is_draft_model", False),
                                ("is_draft_model_prefill", False), ("sinks", self.all_sinks),
                                ("in_profile_run", False), ("num_tokens", bucket)):
                setattr(context, name, value)
            self.wrapper(metas, bucket)
            # the model runner's update after the replay, never after a capture (its
            # _update_full_graph_params_if_needed checks forward_context.capturing: an update
            # then would record the ExternalEvent that the next replay's wait consumes early)
            if not self.updatable and not context.capturing and not eager:
                self.acl_graph.update_full_graph_params(
                    self.attention.AscendAttentionBackend, self.update_stream, context, bucket,
                    self.cfg, self.cfg.speculative_config)
        self.torch.npu.synchronize()
        return [o.cpu() for o in self.outputs]

    def capture(self) -> None:
        """One capture per bucket with a dummy uniform batch, as capture_model does; with C8
        layers, after an eager warm-up step per bucket (vLLM's warm-up runs before each
        capture), in which the hook makes their fp32 scales outside the graph."""
        torch, q = self.torch, self.shape.q_len
        for bucket in self.shape.buckets:
            n = bucket // q
            if self.shape.c8_layers and self.c8_eager:
                self.step([q] * n, [q] * n, torch.zeros(n, 1, dtype=torch.int32), eager=True)
            self.step([q] * n, [q] * n, torch.zeros(n, 1, dtype=torch.int32))


def _trace_steps(shape: Shape, steps: int, seed: int):
    """Decode batches (q_len 1) of random size whose kv lengths are the bundled trace's
    context lengths folded into the dry run's small cache (1 + (context - 1) mod capacity;
    with ``kv_min`` > 1, capacity - (context - 1) mod (capacity - kv_min + 1))."""
    import numpy as np

    from pyruntime.workload.trace import load_trace

    rng = np.random.default_rng(seed)
    cap, q = shape.max_blocks_per_req * shape.block_size, shape.q_len
    low, span = max(1, shape.kv_min), cap - max(1, shape.kv_min) + 1
    # with a kv_min (the model sets) folded down from the capacity, so that the trace's mostly
    # short contexts land past the window
    lengths = [max(q, (low + offset) if low == 1 else (cap - offset))
               for offset in ((max(r.context_tokens, 1) - 1) % span
                              for r in load_trace(limit=500))]
    most = min(shape.max_reqs, max(shape.buckets) // q)
    for _ in range(steps):
        n = int(rng.integers(1, most + 1))
        yield [q] * n, [int(x) for x in rng.choice(lengths, n)]


def run(*, placement: str = "graph", steps: int = 6, seed: int = 0,
        shape: Shape | None = None, hooked: bool = True) -> Run:
    """One run in this process (once per process: the twin and the hook stay installed).

    Raises:
        DryRunError: vLLM or the real vLLM-Ascend is not importable, or (``hooked``) the hook
            did not become active (its reason).
    """
    started = time.perf_counter()
    check_real_vllm_ascend()
    device = _start_device(placement)
    import numpy as np
    import torch

    from pyruntime import hook
    from pyruntime.workload.reference import reference_attention, relative_error

    if hooked:
        installed = hook.install()
        if installed.state not in ("waiting", "active"):
            raise DryRunError(f"the hook did not install: {installed.reason}")
    shape = shape or Shape()
    counter = _UpdateCounter(torch)
    # in this order: vLLM-Ascend's custom ops first, as its worker loads them before any
    # model module (in 0.23 importing attention_v1 first is a circular import through
    # device_op); the hook patches attention_v1 and acl_graph as they import
    for module in ("vllm_ascend.ops", "vllm_ascend.attention.attention_v1",
                   "vllm_ascend.compilation.acl_graph"):
        importlib.import_module(module)

    status = hook.status()
    if hooked and status.state != "active":
        raise DryRunError(f"the hook is not active: {status.reason}")
    from importlib import metadata

    version = metadata.version("vllm-ascend")
    runner = _Runner(shape, seed=seed, hooked=hooked)
    runner.capture()
    counter.reset()
    # a soft cap acts only on the device path: vLLM-Ascend's own path ignores it
    on_host = dict(hook.status().host_path_layers) if hooked else {}
    applied_caps = [cap if hooked and name not in on_host else None
                    for cap, name in zip(runner.caps, runner.names)]
    done = 0
    from . import activation

    engine = activation._state.engine if hooked and activation._state is not None else None
    split_steps = 0 if hasattr(engine, "keys") else None  # the NPU engine's per-key buffers
    launches_before = getattr(engine, "tiling_launches", 0)
    layer_err = [0.0] * shape.num_layers
    #: per sink layer, the smallest distance over the steps of the answer without the sinks
    sinks_distance = [None if sinks is None else float("inf") for sinks in runner.sinks]
    #: per windowed layer, the largest distance over the steps of the answer without the
    #: window, and the steps in which some kv length passed the window (it bit)
    window_distance = [None if w is None else 0.0 for w in runner.windows]
    #: per C8 layer, the smallest distance over the steps of the answer read without scales
    scales_distance = [float("inf") if i in shape.c8_layers else None
                       for i in range(shape.num_layers)]
    window_steps = [None if w is None else 0 for w in runner.windows]
    for q_lens, kv_lens in _trace_steps(shape, steps, seed):
        for q in runner.queries:
            q.copy_(torch.randn(q.shape, generator=runner.gen))
        blocks = -(-max(kv_lens) // shape.block_size)
        table = torch.randperm(shape.num_blocks, generator=runner.gen)[
            : len(q_lens) * blocks].view(len(q_lens), blocks).int()
        outs = runner.step(q_lens, kv_lens, table)
        if split_steps is not None:
            split_steps += _split_this_step(engine)
        cu = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        rows = int(cu[-1])
        for i in runner.run_layers:
            k, v = runner.kv_ref[i]
            # a windowed layer: the model's W keys on the device path; on vLLM-Ascend's path
            window = runner.windows[i]
            on_device = hooked and runner.names[i] not in on_host
            # FIA's band [p - W, p] (W + 1 keys), which torch_npu documents as having no
            # effect at Q_S = 1: at q_len 1 vLLM-Ascend's windowed decode sees the whole kv
            fia_band = shape.q_len > 1 and window is not None and not on_device
            options = {"scale": shape.head_size ** -0.5, "logits_soft_cap": applied_caps[i],
                       "band": (window, 0) if fia_band else None,
                       "sliding_window": window if on_device else None}
            inputs = (runner.queries[i].cpu(), k.cpu(), v.cpu(), table.numpy(), cu,
                      np.array(kv_lens, np.int32))
            sinks = None if runner.sinks[i] is None else runner.sinks[i].detach().cpu().float()
            expected = reference_attention(*inputs, **options, sinks=sinks)[:rows]
            got = outs[i].view(-1, shape.num_heads, shape.head_size)[:rows]
            layer_err[i] = max(layer_err[i], relative_error(got, expected))
            if sinks is not None:  # what an engine that dropped the sinks would be off by
                without = torch.from_numpy(reference_attention(*inputs, **options)[:rows])
                sinks_distance[i] = min(sinks_distance[i], relative_error(without, expected))
            if i in runner.kv_unscaled:  # what an engine that dropped the C8 scales would be
                without = torch.from_numpy(reference_attention(
                    inputs[0], *runner.kv_unscaled[i], *inputs[3:], **options)[:rows])
                scales_distance[i] = min(scales_distance[i], relative_error(without, expected))
            if window is not None:  # what an engine that dropped the window would be off by
                unwindowed = {**options, "band": None, "sliding_window": None}
                without = torch.from_numpy(
                    reference_attention(*inputs, **unwindowed, sinks=sinks)[:rows])
                window_distance[i] = max(window_distance[i], relative_error(without, expected))
                window_steps[i] += max(kv_lens) > window
        done += 1
    max_err = max(layer_err)
    tilings_per_graph = launches_per_step = None
    if split_steps is not None and engine.keys:
        tilings_per_graph = max(len(key.tilings) for key in engine.keys.values())
        launches_per_step = (engine.tiling_launches / len(engine.keys)
                             if placement == "graph"
                             else (engine.tiling_launches - launches_before) / max(done, 1))
    status = hook.status()
    if hooked and status.engine != f"npu-{placement}":
        raise DryRunError(f"the hook captured into engine {status.engine}, not npu-{placement}")
    host = dict(status.host_path_layers)
    entries = status.device_entries if hooked else {}
    layers = [{"name": n, "path": "host", "reason": "the hook is not installed"}
              if not hooked else
              {"name": n, "path": "host" if n in host else "device", "reason": host.get(n)}
              for n in runner.names]
    for i, layer in enumerate(layers):
        if i not in runner.run_layers:
            layer.update(path="not run", reason=(
                "vLLM-Ascend's C8 path hands FIA one BNSD row per query token and one kv "
                "length per request: with q_len > 1 too few kv lengths, an error torch_npu "
                "documents" if i in shape.c8_layers else
                "vLLM-Ascend 0.23's update_graph_params updates a graph's FIAs all as FIA v2 "
                "(sinks) or all as v1: it cannot update a graph that mixes both"))
    # updates per layer: each update's FIA reads its layer's query buffer
    starts = {q.data_ptr(): name for q, name in zip(runner.queries, runner.names)}
    per_layer = {name: 0 for name in runner.names}
    for ptr in counter.queries:
        if ptr in starts:
            per_layer[starts[ptr]] += 1
    for i, (layer, cap) in enumerate(zip(layers, runner.caps)):
        layer["updates_per_step"] = per_layer[layer["name"]] / max(done, 1)
        layer["logits_soft_cap"] = cap
        layer["sinks"] = runner.sinks[i] is not None
        layer["entry"] = entries.get(layer["name"])  # the vLLM-Ascend entry that captured it
        layer["max_rel_err"] = layer_err[i] if i in runner.run_layers else None
        layer["sinks_distance"] = sinks_distance[i] if i in runner.run_layers else None
        layer["sliding_window"] = runner.windows[i]
        layer["window_distance"] = window_distance[i] if i in runner.run_layers else None
        layer["steps_past_window"] = window_steps[i] if i in runner.run_layers else None
        layer["kv_cache_dtype"] = "int8" if i in shape.c8_layers else "auto"
        layer["scales_distance"] = scales_distance[i] if i in runner.run_layers else None
    return Run(hooked=hooked, vllm_ascend=version, device=device, placement=placement,
               spec_tokens=shape.spec_tokens, model=shape.model, layers=layers, steps=done,
               updates_per_step=counter.count / max(done, 1),
               max_rel_err=max_err, seconds=round(time.perf_counter() - started, 1),
               steps_with_split_units=split_steps, tilings_per_graph=tilings_per_graph,
               tiling_launches_per_step=launches_per_step, dtype=shape.dtype,
               tolerance=shape.tolerance)


def run_in_child(*, hooked: bool, placement: str, steps: int, spec_tokens: int = 0,
                 model: str = "mixed", timeout_s: float = 600) -> Run:
    """`run` in a fresh interpreter (the twin and the hook are once per process)."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "AICPU_TILING"}  # no autostart hook
    cmd = [sys.executable, "-m", "pyruntime.hook.dryrun", "--placement", placement,
           "--steps", str(steps), "--spec-tokens", str(spec_tokens), "--model", model,
           *([] if hooked else ["--no-hook"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s,
                          check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DryRunError(f"the {'hooked' if hooked else 'unhooked'} run failed: {tail}")
    return Run(**json.loads(lines[-1]))


def main(argv: list[str] | None = None) -> int:
    """The child process: one `run`, its `Run` as one JSON line on stdout."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m pyruntime.hook.dryrun")
    parser.add_argument("--placement", default="graph", choices=("graph", "pre-replay"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--spec-tokens", type=int, default=0)
    parser.add_argument("--model", default="mixed", choices=tuple(MODELS))
    parser.add_argument("--no-hook", action="store_true")
    args = parser.parse_args(argv)
    result = run(placement=args.placement, steps=args.steps, hooked=not args.no_hook,
                 shape=Shape.of(args.model, spec_tokens=args.spec_tokens))
    print(json.dumps(result.__dict__))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
