"""The dry run's layer sets (``--model``), as data: one shape per set, and the geometry (GQA
or MLA) whose runner builds it.

GQA (`pyruntime.hook.dryrun.gqa`), every set float32 unless it says otherwise:

* ``mixed`` (the `Shape` defaults): gpt-oss-20b's attention geometry (64 query heads, 8 KV
  heads, head_dim 64: ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` of
  ``openai/gpt-oss-20b``'s ``config.json``, which vLLM's ``gpt_oss.py`` passes to
  ``Attention``), one geometry for the whole graph as in a real model (one tiling per graph
  key): a plain layer, a windowed one (W 24), a soft-capped one (cap 2.0), a plain one, and
  last a gpt-oss full layer: learnable attention sinks and no window (vLLM ``gpt_oss.py``:
  ``sliding_window`` only on even layers, ``sinks`` on every layer), which vLLM-Ascend
  captures through ``full_graph_fia_v2``. Without the hook vLLM-Ascend's path for it is FIA v2
  (``learnable_sink``, modelled by the twin), run on 0.29+, which update each registered task
  by its own kind; on 0.23 that layer is not run: its ``update_graph_params`` picks one FIA
  branch for every layer of a graph (``_EXTRA_CTX.sinks``), so vLLM-Ascend itself cannot
  host-update a graph that mixes layers with and without sinks, as this one does.
  ``forward_context.sinks`` is True only for a set whose every layer has sinks (gpt-oss), as
  vLLM-Ascend's ``set_ascend_forward_context`` sets it for such a model.

Sliding windows take the device path too (the model's W keys; vLLM-Ascend's FIA keeps W + 1,
so a windowed layer's reference is the one of the path it took). Besides the mixed set, layer
sets from real configs, every layer on the device path, with kv lengths past the window on
most steps:

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

MLA (`pyruntime.hook.dryrun.mla`):

* ``mla`` (the `MLAShape` defaults): DeepSeek-V3's geometry at one rank of TP 8: 16 heads,
  ``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64, ``v_head_dim`` 128 (DeepSeek-V3's
  ``config.json``: ``num_attention_heads`` 128, ``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64,
  ``v_head_dim`` 128), cache block 128 (``AscendMLABackend.get_supported_kernel_block_sizes``),
  float32, three layers. Hooked run only (the twin does not model vLLM-Ascend's FIA v2 MLA
  call).

Each set is its own run (one geometry per graph).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

#: float32 attention against a float64 reference
TOLERANCE = 1e-4
#: per model dtype: the largest relative error against float64 a run may have (bfloat16: one
#: rounding of the output and of P and V before the dot, a few 1e-3 measured)
TOLERANCES = {"float32": TOLERANCE, "bfloat16": 1e-2}


class DryRunError(RuntimeError):
    """The dry run cannot start here (says why)."""


@dataclass
class Shape:
    """A small decoder: ``num_layers`` GQA layers in float32 with gpt-oss-20b's attention
    geometry; the layers at ``windowed_layers`` have a sliding window, which the device path
    applies with the model's W keys (vLLM-Ascend's path keeps W + 1); the layers at
    ``soft_capped_layers`` have a logits soft cap, which vLLM-Ascend's path ignores and the
    device path applies; the layers at ``sink_layers`` have attention sinks (``[num_heads]``
    in ``sink_dtype``), which vLLM-Ascend captures through FIA v2."""

    #: the runner module (`pyruntime.hook.dryrun.gqa`) and the steps a child runs by default
    geometry: ClassVar[str] = "gqa"
    default_steps: ClassVar[int] = 6

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


@dataclass
class MLAShape:
    """A small MLA decoder at one TP-8 rank of DeepSeek-V3 (the module docstring)."""

    geometry: ClassVar[str] = "mla"
    default_steps: ClassVar[int] = 4

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
    model: str = "mla"
    #: the shared trace folding (`driver.trace_steps`): kv lengths in [kv_min, capacity]; 1
    #: keeps the trace's own lengths (MLA has no window to reach past)
    kv_min: int = 1
    #: DeepSeek-V3's softmax scale before YaRN's mscale: (qk_nope + rope) ** -0.5
    scale: float = 192 ** -0.5
    #: an engine fault for the negative test: "drop-rope" zeroes q_pe before our kernels
    fault: str | None = None
    #: layers built with ``enable_kv_nz`` (the NZ cache layout), which the hook leaves on
    #: vLLM-Ascend's path: a mixed graph. Their FIA v2 call goes to `mla.FiaV2Recorder` (the
    #: twin does not model it), so their outputs are not checked, only their task updates
    host_layers: tuple[int, ...] = ()
    dtype: str = "float32"

    @property
    def tolerance(self) -> float:
        return TOLERANCES[self.dtype]

    @property
    def q_len(self) -> int:
        return 1 + self.spec_tokens


def _gemma3_windowed(num_layers: int) -> tuple[int, ...]:
    # transformers Gemma3TextConfig: "sliding_attention" if (i + 1) % pattern, pattern 6
    return tuple(i for i in range(num_layers) if (i + 1) % 6)


#: the layer sets of ``--model``: name -> (its shape class, the fields besides the class
#: defaults); see the module docstring
MODELS: dict[str, tuple[type, dict]] = {
    "mixed": (Shape, {}),
    "gpt-oss": (Shape, {"num_layers": 4, "windowed_layers": (0, 2), "sliding_window": 128,
                        "soft_capped_layers": (), "sink_layers": (0, 1, 2, 3),
                        "max_blocks_per_req": 24, "num_blocks": 200, "kv_min": 64}),
    "gemma2": (Shape, {"num_layers": 2, "windowed_layers": (0,), "sliding_window": 4096,
                       "soft_capped_layers": (0, 1), "logits_soft_cap": 50.0,
                       "sink_layers": (), "num_heads": 8, "num_kv_heads": 4,
                       "head_size": 256, "block_size": 128, "max_blocks_per_req": 36,
                       "num_blocks": 148, "max_reqs": 4, "buckets": (2, 4), "kv_min": 3584}),
    "gemma3": (Shape, {"num_layers": 6, "windowed_layers": _gemma3_windowed(6),
                       "sliding_window": 1024, "soft_capped_layers": (), "sink_layers": (),
                       "num_heads": 8, "num_kv_heads": 4, "head_size": 256, "block_size": 128,
                       "max_blocks_per_req": 12, "num_blocks": 52, "max_reqs": 4,
                       "buckets": (2, 4), "kv_min": 512}),
    "c8": (Shape, {"num_layers": 3, "windowed_layers": (), "soft_capped_layers": (),
                   "sink_layers": (), "c8_layers": (0, 1, 2), "num_heads": 64,
                   "num_kv_heads": 8, "head_size": 128, "block_size": 128,
                   "max_blocks_per_req": 8, "num_blocks": 40, "max_reqs": 4,
                   "buckets": (2, 4), "dtype": "bfloat16"}),
    "mla": (MLAShape, {}),
    # two plain small layers: the cheapest set, for counting host work per step against the
    # number of captured graphs (``--captured-sizes``)
    "plain": (Shape, {"num_layers": 2, "windowed_layers": (), "soft_capped_layers": (),
                      "sink_layers": (), "num_heads": 8, "num_kv_heads": 2, "head_size": 64}),
}


def with_captured_sizes(shape: Any, count: int) -> Any:
    """`shape` capturing `count` graphs, one per token bucket ``q_len * (1..count)`` (the
    requests and cache blocks grown to fill the largest), for counting per-step host work
    against the number of captured graphs.

    Raises:
        DryRunError: `count` < 1.
    """
    if count < 1:
        raise DryRunError(f"--captured-sizes must be >= 1, got {count}")
    return dataclasses.replace(
        shape, buckets=tuple(shape.q_len * n for n in range(1, count + 1)),
        max_reqs=max(shape.max_reqs, count),
        num_blocks=max(shape.num_blocks, count * shape.max_blocks_per_req))


def shape_of(model: str = "mixed", **fields) -> Shape | MLAShape:
    """The layer set `model` (:data:`MODELS`), with `fields` (``spec_tokens``, and the MLA
    run's ``fault`` / ``host_layers`` / ``num_heads``) over its own.

    Raises:
        DryRunError: an unknown model, or a field its shape does not have.
    """
    if model not in MODELS:
        raise DryRunError(f"unknown --model {model!r}; choose from {', '.join(MODELS)}")
    cls, own = MODELS[model]
    try:
        return cls(model=model, **{**own, **fields})
    except TypeError as exc:
        raise DryRunError(f"--model {model}: {exc}") from exc
