"""The vLLM-Ascend patch set: FIA full-graph decode reads a device tiling instead.

What changes, for supported layers only (plain GQA/MHA decoder attention on the FIA
full-graph path, main model):

* ``AscendAttentionMetadataBuilder.build`` hands each ``AscendMetadata`` the persistent
  device buffers its ``common_attn_metadata`` views (``query_start_loc``, ``seq_lens``,
  ``block_table_tensor``: the model runner refills them in place every step) as
  :class:`DeviceLengths`. The metadata's own ``query_start_loc`` is a fresh host-to-device
  copy each step and its ``seq_lens`` a CPU tensor (vllm-ascend 0.23.0-0.30.0rc2
  ``attention_v1.py``, ``build``), so neither may be captured.
* ``AscendAttentionBackendImpl.full_graph_fia`` captures the engine's tiling task (once
  per step and graph) and attention reading that device tiling over those buffers, instead
  of an ``ExternalEvent`` wait plus a task group holding FIA with frozen host lists.
* ``ACLGraphWrapper.__call__``: each graph it captures with device-tiled layers gets its
  ``replay`` wrapped to call the engine's ``before_replay(num_tokens)`` first (a new step
  epoch; under the ``pre-replay`` placement, the tiling task itself). The wrapper's own
  ``synchronize()`` has run by then, so the host never waits for the tiling task, and eager
  calls (which replay nothing) never launch it.
* ``AscendAttentionBackendImpl.update_graph_params`` and ``update_full_graph_params``
  (in ``acl_graph`` and in every module that imported it by name) skip graphs in which
  every FIA layer was captured this way; in a mixed graph the original update runs for
  the host-path layers only.

* ``AscendAttentionBackendImpl.__init__`` records the ``logits_soft_cap`` the layer was
  built with (vLLM's ``Attention`` hands it over, vLLM-Ascend 0.23.0-0.30.0rc2 accepts and
  drops it: its FIA path has no soft cap). A layer with a cap (Gemma 2: 50.0) takes the
  device path only when the engine applies it (``applies_logits_soft_cap``), and then the
  hook logs once for that layer that our path applies the cap vLLM-Ascend's ignores, so its
  outputs differ from vLLM-Ascend's on purpose; otherwise it keeps vLLM-Ascend's path. A layer
  built before the hook was installed has no record and is treated as uncapped, as
  vLLM-Ascend treats every layer.

* ``AscendAttentionBackendImpl.full_graph_fia_v2``: where vLLM-Ascend sends a layer with
  attention sinks while capturing (``forward_fused_infer_attention``: ``if self.sinks is not
  None``, FIA v2 with ``learnable_sink=self.sinks``; vLLM-Ascend 0.23.0.post1 and 0.30.0rc2
  ``attention_v1.py``). The same device capture as ``full_graph_fia``, the layer's own
  ``sinks`` tensor handed to our kernels (no copy), when the engine adds sinks
  (``applies_sinks``) and the tensor is one our kernels read (float32 ``[num_heads]``,
  contiguous, on the query's device); otherwise it keeps FIA v2. Its host update needs no
  patch of its own: 0.23-0.28 update FIA v2 layers in ``update_graph_params``' own branch
  (``elif _EXTRA_CTX.sinks``), which iterates the same forward context the wrapper below
  narrows to the host-path layers, and 0.29-0.30 update each ``register_task``'d task
  (``FIAV2ParamProvider``), which a device-path layer never registers.

* Sliding window (with or without sinks): vLLM-Ascend keeps the window on the
  implementation (``AscendAttentionBackendImpl.__init__``: ``self.sliding_window =
  sliding_window``) and hands FIA ``sparse_mode=4, pre_tokens=self.sliding_window,
  next_tokens=0`` in ``full_graph_fia`` and ``full_graph_fia_v2`` (vLLM-Ascend 0.23.0.post1
  and 0.30.0rc2 ``attention_v1.py``), whose band ``[p - W, p]`` holds W + 1 keys; and
  torch_npu documents ``pre_tokens`` and ``sparse_mode`` as having no effect at Q_S = 1
  (``_op_plugin_docs.py``), so at q_len 1 its decode sees the whole kv. A windowed
  layer takes the device path when the engine applies the window
  (``applies_sliding_window``), with the model's W keys (vLLM's FlashAttention path,
  ``window_size = (W - 1, 0)``; `pyruntime.kernels.sliding_window`), and the hook logs once
  for that layer that it keeps W keys where vLLM-Ascend's FIA keeps W + 1 (and, at q_len 1,
  by torch_npu's documentation, the whole kv). The patched
  ``__init__`` records every layer's window, so that the tiling task captured with a graph's
  first layer plans one tiling per distinct window (gpt-oss: none and 128). A windowed layer
  built before the hook was installed has no record and keeps vLLM-Ascend's path.

* C8 layers (vLLM-Ascend's int8 KV cache, ``AscendC8AttentionBackendImpl``, whose capture calls
  the patched ``full_graph_fia`` with its ``layer``): when the engine reads int8 caches
  (``applies_kv_int8``), our kernels read the layer's int8 caches in place in their NZ layout,
  dequantised as vLLM-Ascend's FIA does (scale only); see `vllm_ascend_c8`. The class's own
  ``forward`` is wrapped to make the fp32 scales our kernels read after an eager call.

Everything else keeps the original path: other KV-cache quantization (non-"auto" dtypes
besides C8's int8), C8 with a window or sinks, ALiBi, KV compression, non-decoder
attention, other subclasses (context parallel), speculative draft graphs, paged-attention
decode, MLA (a different implementation class: its patch is `vllm_ascend_mla`), and sinks our
kernels cannot read in place (not fp32/bf16/fp16, not ``[num_heads]``; see ``_sinks_reason``). Each such layer is
logged once with its reason.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from pyruntime.kernels import soft_cap as _soft_cap

from . import vllm_ascend_c8 as _c8
from . import vllm_ascend_targets as targets
from .engine import AttentionCapture, TilingEngine
from .patching import PatchLedger

log = logging.getLogger("pyruntime.hook")

#: ``impl.kv_cache_dtype`` values of an unquantized cache: the string vLLM passes (0.23-0.28)
#: or, from 0.29.0rc1, the torch dtype ``__init__`` resolves it to
#: (``kv_cache_dtype_str_to_dtype``; found by running 0.30.0rc2's own class on the twin)
SUPPORTED_KV_DTYPES = ("auto", "float16", "bfloat16", "half", "float32",
                       "torch.float16", "torch.bfloat16", "torch.float32")


@dataclass
class PatchState:
    """Mutable state shared by the patched functions of one installation."""

    engine: TilingEngine
    line: str
    ledger: PatchLedger = field(default_factory=PatchLedger)
    #: graph key -> names (or ids) of layers captured on the device-tiling path
    device_layers: dict[Hashable, set[str]] = field(default_factory=lambda: defaultdict(set))
    #: (layer, reason) pairs kept on the host-update path
    host_layers: set[tuple[str, str]] = field(default_factory=set)
    updates_skipped: int = 0
    update_wrapper: Any = None
    update_original: Any = None
    impl_cls: type | None = None
    graph_params_fn: Any = None
    patched_modules: list[str] = field(default_factory=list)
    #: (device, n) -> int32 [1] device tensor holding n (DeviceLengths.batch)
    batch_constants: dict = field(default_factory=dict)
    #: layers captured on the device path with a logits soft cap (each logged once)
    soft_capped_layers: set[str] = field(default_factory=set)
    #: device-path layer name -> the patched entry that captured it (the last one)
    device_entries: dict[str, str] = field(default_factory=dict)
    #: every distinct sliding window (None: none) of the layers built since installation
    windows: set = field(default_factory=set)
    #: layers captured on the device path with a sliding window (each logged once)
    windowed_layers: set[str] = field(default_factory=set)
    #: ``AscendMLAImpl`` once ``mla_v1`` is patched
    mla_impl_cls: type | None = None
    #: C8 layers whose non-zero offsets were logged (each once)
    c8_offsets_noted: set[str] = field(default_factory=set)
    #: layer name -> why our kernels' eager warm-up launch failed (it keeps the host path)
    warm_up_failures: dict[str, str] = field(default_factory=dict)

    def whole_graph_device_tiled(self, forward_context: Any, num_tokens: int) -> bool:
        """True when the graph replayed under ``forward_context`` (``num_tokens``, its batch
        descriptor) has device-tiled layers and no host-path FIA.

        False when vLLM-Ascend has no global graph params (its 0.29+ model runner sets them
        only under ``VLLM_COMPILE``: ``if self.use_aclgraph: set_graph_params(...)``,
        vllm-ascend 0.30.0rc2 ``worker/model_runner_v1.py`` ``_use_aclgraph`` and
        ``initialize_cudagraph_keys``), yet calls ``update_full_graph_params`` after every
        FULL forward that is not a capture (``_update_full_graph_params_if_needed``): then
        the original update runs, exactly as without the hook."""
        if not self.device_layers or self.graph_params_fn is None:
            return False  # nothing of ours captured: no need to read vLLM's forward context
        graph_params = self.graph_params_fn()
        if graph_params is None:
            return False
        if not self.device_layers.get(graph_key_of(graph_params, num_tokens, forward_context)):
            return False
        return not graph_params.attn_params.get(num_tokens)


#: The attribute the patched ``forward`` methods set: the vLLM layer name last seen.
LAYER_NAME_ATTR = "_aicpu_tiling_layer_name"


def record_layer_name(impl: Any, layer: Any) -> None:
    """Keep the vLLM layer's name on the implementation (for `layer_name`), when it has one."""
    name = getattr(layer, "layer_name", None)
    if name is not None:
        setattr(impl, LAYER_NAME_ATTR, name)


def layer_name(impl: Any) -> str:
    """A stable name for an attention implementation instance (vLLM layer name if seen)."""
    return (
        getattr(impl, LAYER_NAME_ATTR, None) or f"<{type(impl).__name__}@{id(impl):#x}>"
    )


@dataclass(frozen=True)
class DeviceLengths:
    """The persistent device buffers one step's attention metadata was built from.

    ``query_start_loc`` int32 ``[n + 1]`` and ``seq_lens`` int32 ``[n]`` view the model
    runner's buffers (``n`` = the padded request count of the graph's batch), refilled in
    place each step; padded slots carry kv_len 0 (tiling ABI v4: trailing padding).
    ``block_table`` int32 ``[n, max_blocks_per_req]`` views the block table's device buffer.
    ``batch`` int32 ``[1]`` holds ``n``, made once per ``(device, n)`` outside any capture.
    """

    query_start_loc: Any
    seq_lens: Any
    block_table: Any
    batch: Any


#: The attribute of ``AscendMetadata`` the patched ``build`` sets.
LENGTHS_ATTR = "_aicpu_tiling_lengths"
#: The attribute of ``AscendAttentionBackendImpl`` the patched ``__init__`` sets: the
#: ``logits_soft_cap`` argument as passed (vLLM-Ascend does not keep it).
SOFT_CAP_ATTR = "_aicpu_tiling_logits_soft_cap"


def make_init(original: Any, windows: set | None = None) -> Any:
    """Wrap ``AscendAttentionBackendImpl.__init__``: run it, then record its
    ``logits_soft_cap`` argument as ``SOFT_CAP_ATTR`` and add the ``sliding_window`` it kept
    to ``windows`` (nothing else changes)."""
    sig = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            cap = sig.bind(self, *args, **kwargs).arguments.get("logits_soft_cap")
        except TypeError:  # the original accepted the call, so this never happens
            cap = None
        setattr(self, SOFT_CAP_ATTR, cap)
        if windows is not None:  # the window every release keeps: self.sliding_window
            windows.add(layer_window(self))

    return __init__


def layer_window(impl: Any) -> Any:
    """The layer's sliding window as vLLM-Ascend keeps it (``impl.sliding_window``), mapped
    to ours: None for none, W as is (vLLM's W is the model's W keys, as ours). vLLM's
    convention (None or 0, FlashAttention's ``window_size`` (-1, -1)) and vLLM-Ascend's
    (``pre_tokens = self.sliding_window or SWA_INT_MAX``) treat 0 as off, so vLLM's 0 is our
    None here (our API refuses 0: `pyruntime.kernels.sliding_window`)."""
    window = getattr(impl, "sliding_window", None)
    return None if window is None or (not isinstance(window, bool) and window == 0) else window


def layer_soft_cap(impl: Any) -> Any:
    """The layer's logits soft cap as vLLM passed it, or None for none: vLLM's convention
    (FlashAttention, FlashInfer) is that None and 0 mean no cap; a layer built before the hook
    was installed has no record and counts as uncapped (as on vLLM-Ascend's own path)."""
    cap = getattr(impl, SOFT_CAP_ATTR, None)
    return None if cap is None or (not isinstance(cap, bool) and cap == 0) else cap


def device_lengths(common: Any, batch_constants: dict) -> DeviceLengths | None:
    """:class:`DeviceLengths` of ``common_attn_metadata``, or None when its buffers are not
    all tensors of one device (then the layer keeps the host path). Where they must live is
    checked at capture: on the query's device."""
    import torch

    qsl = getattr(common, "query_start_loc", None)
    seq_lens = getattr(common, "seq_lens", None)
    table = getattr(common, "block_table_tensor", None)
    tensors = (qsl, seq_lens, table)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    device = qsl.device
    if any(t.device != device for t in tensors):
        return None
    n = min(int(seq_lens.numel()), int(qsl.numel()) - 1, int(table.shape[0]))
    key = (str(device), n)
    if key not in batch_constants:  # build() runs outside the graph capture
        batch_constants[key] = torch.full((1,), n, dtype=torch.int32, device=device)
    return DeviceLengths(qsl[: n + 1], seq_lens[:n], table[:n], batch_constants[key])


def make_build(original: Any, state: PatchState) -> Any:
    """Wrap ``AscendAttentionMetadataBuilder.build``: the metadata it returns carries the
    persistent buffers (:func:`device_lengths`) as ``LENGTHS_ATTR``."""
    sig = inspect.signature(original)

    @functools.wraps(original)
    def build(*args, **kwargs):
        metadata = original(*args, **kwargs)
        common = sig.bind(*args, **kwargs).arguments["common_attn_metadata"]
        setattr(metadata, LENGTHS_ATTR, device_lengths(common, state.batch_constants))
        return metadata

    return build


def unsupported_reason(impl: Any, impl_cls: type, extra_ctx: Any, attn_metadata: Any,
                       query_device: Any = None, *,
                       applies_soft_cap: bool = False,
                       applies_sinks: bool = False,
                       applies_sliding_window: bool = False,
                       c8_cls: type | None = None, layer: Any = None,
                       applies_kv_int8: bool = False) -> str | None:
    """Why this layer must keep the host-update path, or ``None`` if we handle it.

    ``applies_soft_cap``: the engine applies a layer's logits soft cap (a capped layer keeps
    the host path otherwise). ``applies_sinks``: the engine adds a layer's attention sinks
    (a layer with sinks keeps the host path otherwise). ``applies_sliding_window``: the engine
    applies a layer's sliding window (a windowed layer keeps the host path otherwise).
    ``c8_cls``: vLLM-Ascend's ``AscendC8AttentionBackendImpl`` (None: C8 layers are a subclass
    like any other); an instance of it is checked by `vllm_ascend_c8.c8_reason` with the vLLM
    ``layer`` ``full_graph_fia`` received and ``applies_kv_int8`` (the engine reads int8 NZ
    caches).

    The metadata is checked first: without the builder's persistent buffers nothing else
    matters (and an implementation that ``__init__`` did not build, as vLLM-Ascend's own unit
    tests make, is then never inspected). An attribute the checks need but the implementation
    lacks keeps the host path too, naming it.
    """
    lengths = getattr(attn_metadata, LENGTHS_ATTR, None)
    if lengths is None:
        return ("no persistent device length buffers (metadata not built by "
                "AscendAttentionMetadataBuilder.build, or its buffers are not on one device)")
    if query_device is not None and lengths.seq_lens.device != query_device:
        return (f"the length buffers are on {lengths.seq_lens.device}, the query on "
                f"{query_device}")
    is_c8 = c8_cls is not None and type(impl) is c8_cls
    if type(impl) is not impl_cls and not is_c8:
        return f"subclass {type(impl).__name__} (context parallel / C8) is not supported"
    if getattr(extra_ctx, "is_draft_model", False):
        return "speculative draft-model graphs are not supported"
    try:
        return ((_c8.c8_reason(impl, layer, applies_kv_int8) if is_c8 else None)
                or _impl_reason(impl, attn_metadata, c8=is_c8)
                or _window_reason(impl, applies_sliding_window)
                or _soft_cap_reason(impl, applies_soft_cap)
                or _sinks_reason(impl, query_device, applies_sinks))
    except AttributeError as exc:
        return f"the implementation has no attribute {exc.name!r} (not built by its __init__)"


def _impl_reason(impl: Any, attn_metadata: Any, c8: bool = False) -> str | None:
    # a C8 layer's int8 cache is checked by c8_reason; any other quantized cache keeps the host
    if not c8 and (getattr(impl, "enable_c8_quant", False)
                   or str(impl.kv_cache_dtype) not in SUPPORTED_KV_DTYPES):
        return f"KV-cache quantization (kv_cache_dtype={impl.kv_cache_dtype!r}) is not supported"
    if impl.alibi_slopes is not None:
        return "ALiBi is not supported"
    # not in IMPL_ATTRIBUTES: 0.26 dropped ``enable_hamming_sparse`` (the conformance test
    # found this), so a line without it has no KV compression
    if getattr(impl, "enable_hamming_sparse", False):
        return "KV compression (hamming sparse) is not supported"
    if str(impl.attn_type).lower() not in ("decoder", "attentiontype.decoder"):
        return f"attention type {impl.attn_type!r} is not supported"
    if not getattr(attn_metadata, "causal", True):
        return "non-causal attention is not supported"
    return None


def _window_reason(impl: Any, applies_sliding_window: bool) -> str | None:
    """Why the layer's sliding window keeps it on the host path, or None (no window, or one
    the engine applies over a tiling the graph's task plans)."""
    from pyruntime.kernels import sliding_window as _window

    # read as an attribute: an implementation without it keeps the host path, named
    window = None if impl.sliding_window is None else layer_window(impl)
    if window is None:
        return None
    # gpt-oss's windowed layers have sinks too: the sinks alone would not keep them here
    also = " (with attention sinks)" if impl.sinks is not None else ""
    try:
        _window.check(window)
    except ValueError:
        return f"sliding_window={window!r}{also} is not an int >= 1"
    if not applies_sliding_window:
        return (f"sliding window ({window}){also}: the tiling engine does not apply it (no "
                "applies_sliding_window), so the layer keeps vLLM-Ascend's path")
    if not hasattr(impl, SOFT_CAP_ATTR):
        return (f"sliding window ({window}){also}: the layer was built before the hook was "
                "installed, so the graphs' tiling task does not plan its window")
    return None


def _soft_cap_reason(impl: Any, applies_soft_cap: bool) -> str | None:
    cap = layer_soft_cap(impl)
    if cap is None:
        return None
    try:
        _soft_cap.check(cap)
    except ValueError:
        return f"logits_soft_cap={cap!r} is not a positive finite number"
    if not applies_soft_cap:
        return (f"logits soft cap {cap}: the tiling engine does not apply it (no "
                "applies_logits_soft_cap), so the layer keeps vLLM-Ascend's path, which ignores it")
    return None


def _sinks_reason(impl: Any, query_device: Any, applies_sinks: bool) -> str | None:
    """Why the layer's sinks keep it on the host path, or None (no sinks, or sinks our
    kernels read as they are). The kernels read the layer's own tensor at every replay, so it
    must already be what they take: a contiguous ``[num_heads]`` tensor on the query's
    device, float32 or a model dtype (`pyruntime.kernels.reference_attention.SINK_DTYPES`;
    the kernels widen each sink to fp32 as they load it). gpt-oss's sinks are a parameter of
    the model dtype (vLLM ``gpt_oss.py``: ``torch.empty(num_attention_heads // tp_size)``,
    built under ``set_default_torch_dtype(model_config.dtype)``,
    ``model_loader/base_loader.py``), and vLLM-Ascend's FIA v2 takes ``learnable_sink`` in
    bfloat16 only (torch_npu ``_op_plugin_docs.py``): a bf16 model's sinks are read in place."""
    import torch

    sinks = impl.sinks
    if sinks is None:
        return None
    if not applies_sinks:
        return ("attention sinks: the tiling engine does not add them (no applies_sinks), so "
                "the layer keeps vLLM-Ascend's FIA v2 path")
    if not isinstance(sinks, torch.Tensor):
        return f"attention sinks of type {type(sinks).__name__} are not a tensor"
    from pyruntime.kernels.reference_attention import SINK_DTYPES

    if sinks.dtype not in SINK_DTYPES:
        return (f"attention sinks in {sinks.dtype}: our kernels read float32, bfloat16 or "
                "float16 sinks and the hook hands them the layer's own tensor, never a copy")
    if tuple(sinks.shape) != (impl.num_heads,) or not sinks.is_contiguous():
        return (f"attention sinks of shape {list(sinks.shape)} (contiguous: "
                f"{sinks.is_contiguous()}): our kernels read a contiguous [{impl.num_heads}]")
    if query_device is not None and sinks.device != query_device:
        return f"the attention sinks are on {sinks.device}, the query on {query_device}"
    return None


def _note_soft_cap(state: PatchState, impl: Any, cap: float) -> None:
    name = layer_name(impl)
    if name not in state.soft_capped_layers:
        state.soft_capped_layers.add(name)
        log.info("aicpu-tiling: layer %s takes the device path with logits_soft_cap=%g, which "
                 "our kernels apply and vLLM-Ascend's own path ignores: its outputs differ from "
                 "vLLM-Ascend's on purpose", name, cap)


def _note_window(state: PatchState, impl: Any, window: int) -> None:
    name = layer_name(impl)
    if name not in state.windowed_layers:
        state.windowed_layers.add(name)
        log.info("aicpu-tiling: layer %s takes the device path with sliding_window=%d: each "
                 "query sees its last %d keys (the model's window), where vLLM-Ascend's FIA "
                 "(pre_tokens=%d) keeps %d, and at q_len 1 its whole kv (torch_npu documents "
                 "pre_tokens as having no effect at Q_S = 1)", name, window, window, window,
                 window + 1)


def _note_host_path(state: PatchState, impl: Any, reason: str) -> None:
    key = (layer_name(impl), reason)
    if key not in state.host_layers:
        state.host_layers.add(key)
        log.info("aicpu-tiling: layer %s keeps the host-update path: %s", key[0], reason)


def _graph_params(source: ModuleType, extra_ctx: Any) -> Any:
    """The ``GraphParams`` vLLM-Ascend's own code would use now, through ``source``'s
    bindings (attention_v1 imports the getters by name in 0.23-0.28; acl_graph otherwise)."""
    if getattr(extra_ctx, "is_draft_model", False):
        if getattr(extra_ctx, "is_draft_model_prefill", False):
            return source.get_draft_graph_prefill_params()
        return source.get_draft_graph_params()
    return source.get_graph_params()


def current_forward_context(acl_graph: ModuleType) -> Any:
    """vLLM's forward context through ``acl_graph``'s own binding (``from vllm.forward_context
    import BatchDescriptor, get_forward_context``, vllm-ascend 0.23.0.post1 and 0.30.0rc2
    ``compilation/acl_graph.py``: what its ``ACLGraphWrapper.__call__`` reads); None where the
    module has no such binding."""
    getter = getattr(acl_graph, "get_forward_context", None)
    return getter() if getter is not None else None


def batch_descriptor(forward_context: Any) -> Hashable | None:
    """The batch descriptor of vLLM's forward context (None when it has none).

    vLLM-Ascend's ``ACLGraphWrapper.__call__`` keys the graphs it captures by exactly this
    object (``forward_context.batch_descriptor``, its ``concrete_aclgraph_entries``;
    vllm-ascend 0.23.0.post1 and 0.30.0rc2 ``compilation/acl_graph.py``), and vLLM's
    ``BatchDescriptor`` (a frozen dataclass: ``num_tokens``, ``num_reqs``, ``uniform``,
    ``has_lora``, ``num_active_loras``; vLLM 0.23.0 and 0.30.0 ``forward_context.py``) is
    what tells two graphs of one token count apart: with LoRA, vLLM captures one FULL graph
    per size and LoRA case (``cudagraph_specialize_lora`` defaults to True,
    ``config/compilation.py``; ``CudagraphDispatcher._get_lora_cases``,
    ``v1/cudagraph_dispatcher.py``)."""
    return getattr(forward_context, "batch_descriptor", None)


def graph_key_of(graph_params: Any, num_tokens: int, forward_context: Any) -> Hashable:
    """The hook's key of the graph being captured or replayed: ``(id(graph_params),
    num_tokens, batch descriptor)``, one key per graph vLLM-Ascend's wrapper captures (the
    token count first, as `pyruntime.hook.npu_engine` reads it)."""
    return (id(graph_params), int(num_tokens), batch_descriptor(forward_context))


def lora_reason(forward_context: Any, lora_configured: Any) -> str | None:
    """Why the layers of this graph keep the host path for LoRA, or None.

    With LoRA, vLLM captures several FULL graphs of one token count; the hook tells them
    apart by the batch descriptor's LoRA fields (:func:`batch_descriptor`). Where the
    forward context carries no descriptor with them, two such graphs would share one key:
    the second would capture no tiling task and replay a stale tiling. ``lora_configured``:
    a callable, True when vLLM's config has a ``lora_config``."""
    descriptor = batch_descriptor(forward_context)
    if descriptor is not None and hasattr(descriptor, "has_lora"):
        return None
    if not lora_configured():
        return None
    return ("LoRA: vLLM captures a graph per LoRA case of one token count, and this forward "
            "context has no batch descriptor with has_lora to tell them apart")


def vllm_lora_configured() -> bool:
    """True when vLLM's current config has a ``lora_config`` (``get_current_vllm_config_or_none``,
    vLLM 0.23.0 and 0.30.0 ``config/vllm.py``; False where there is none to read)."""
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:
        return False
    config = get_current_vllm_config_or_none()
    return getattr(config, "lora_config", None) is not None


def patch_attention(module: ModuleType, state: PatchState, acl_graph: ModuleType) -> None:
    """Patch ``AscendAttentionBackendImpl`` in ``attention_v1`` (see module docstring)."""
    impl_cls = getattr(module, targets.IMPL)
    ledger = state.ledger

    # Read at call time, as the original methods do (module globals that vLLM-Ascend's own
    # unit tests replace: _EXTRA_CTX and the graph-params getters)
    def extra_ctx() -> Any:
        return module._EXTRA_CTX

    def graph_params() -> Any:
        source = module if hasattr(module, "get_graph_params") else acl_graph
        return _graph_params(source, module._EXTRA_CTX)

    def forward_context() -> Any:
        return current_forward_context(acl_graph)

    _, _, orig_fia = ledger.resolve(module, f"{targets.IMPL}.full_graph_fia")
    _, _, orig_fia_v2 = ledger.resolve(module, f"{targets.IMPL}.full_graph_fia_v2")
    _, _, orig_pa = ledger.resolve(module, f"{targets.IMPL}.full_graph_pa")
    _, _, orig_forward = ledger.resolve(module, f"{targets.IMPL}.forward")
    _, _, orig_update_sm = ledger.resolve(module, f"{targets.IMPL}.update_graph_params")
    orig_update = orig_update_sm.__func__
    update_sig = inspect.signature(orig_update)

    @functools.wraps(orig_forward)
    def forward(self, layer, *args, **kwargs):
        record_layer_name(self, layer)
        result = orig_forward(self, layer, *args, **kwargs)
        warm_up_after_eager(self, layer, args, kwargs)
        return result

    applies_soft_cap = bool(getattr(state.engine, "applies_logits_soft_cap", False))
    applies_sinks = bool(getattr(state.engine, "applies_sinks", False))
    applies_window = bool(getattr(state.engine, "applies_sliding_window", False))
    applies_kv_int8 = bool(getattr(state.engine, "applies_kv_int8", False))
    c8_cls = _c8.c8_class(module)

    def describe(self, query, key, value, attn_metadata, output, layer, *, capturing: bool):
        """``(reason, capture)``: why the layer keeps the host path (and None), or (None and)
        the `AttentionCapture` `device_capture` hands the engine; ``capturing`` False (the
        eager warm-up) logs nothing and keys nothing."""
        context = forward_context()
        reason = (state.warm_up_failures.get(layer_name(self))
                  or lora_reason(context, vllm_lora_configured)
                  or unsupported_reason(self, impl_cls, extra_ctx(), attn_metadata, query.device,
                                        applies_soft_cap=applies_soft_cap,
                                        applies_sinks=applies_sinks,
                                        applies_sliding_window=applies_window,
                                        c8_cls=c8_cls, layer=layer,
                                        applies_kv_int8=applies_kv_int8))
        if reason is not None:
            return reason, None
        lengths: DeviceLengths = getattr(attn_metadata, LENGTHS_ATTR)
        num_tokens = int(attn_metadata.actual_seq_lengths_q[-1])
        graph_key = graph_key_of(graph_params(), num_tokens, context) if capturing else None
        kv_scales = None
        if c8_cls is not None and type(self) is c8_cls:
            # the int8 NZ caches in place, with the fp32 scales and zero offsets (made before
            # the capture by the eager forward, or here: see vllm_ascend_c8)
            key_cache, value_cache, block_size = _c8.nz_caches(self)
            kv_scales = _c8.kv_scales(self, layer, graph_key=graph_key)
        else:
            key_cache, value_cache, block_size, _, _ = self._get_fia_params(
                key, value, attn_metadata
            )
        cap = layer_soft_cap(self)  # checked by unsupported_reason: None or C > 0, finite
        window = layer_window(self)  # checked by unsupported_reason: None or W >= 1, recorded
        if capturing and cap is not None:
            _note_soft_cap(state, self, float(cap))
        if capturing and window is not None:
            _note_window(state, self, int(window))
        return None, AttentionCapture(
            graph_key=graph_key,
            layer_name=layer_name(self),
            query=query,
            key_cache=key_cache,
            value_cache=value_cache,
            block_table=lengths.block_table,
            query_start_loc=lengths.query_start_loc,
            seq_lens=lengths.seq_lens,
            batch=lengths.batch,
            output=output,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            block_size=int(block_size),
            scale=float(self.scale),
            causal=bool(attn_metadata.causal),
            logits_soft_cap=None if cap is None else float(cap),
            sinks=self.sinks,  # checked by unsupported_reason: None or what our kernels read
            sliding_window=None if window is None else int(window),
            graph_windows=tuple(sorted({int(w) if w else None for w in state.windows},
                                       key=lambda w: w or 0)),
            kv_scales=kv_scales,
        )

    def device_capture(self, entry, query, key, value, attn_metadata, output, layer=None):
        """Capture the layer on the device path and return what vLLM-Ascend's entry returns,
        ``(output, num_tokens)``; or None (noted once) when it keeps the host path."""
        record_layer_name(self, layer)  # C8's own forward does not pass the patched one
        reason, capture = describe(self, query, key, value, attn_metadata, output, layer,
                                   capturing=True)
        if reason is not None:
            _note_host_path(state, self, reason)
            return None
        state.engine.capture_attention(capture)
        state.device_layers[capture.graph_key].add(layer_name(self))
        state.device_entries[layer_name(self)] = entry
        return output, int(attn_metadata.actual_seq_lengths_q[-1])  # as 0.23-0.30 return it

    warm_up = getattr(state.engine, "warm_up", None)
    forward_sig = inspect.signature(orig_forward)

    def warm_up_after_eager(self, layer, args, kwargs) -> None:
        """After an eager forward in vLLM's capture phase (its warm-up run before each
        capture): our kernels for this layer launched once now, outside the capture
        (`eager_warm_up`)."""
        try:
            a = forward_sig.bind(self, layer, *args, **kwargs).arguments
        except TypeError:  # the original accepted the call, so this never happens
            return
        eager_warm_up(state, warm_up, extra_ctx(), self, a.get("attn_metadata"), layer,
                      lambda: describe(self, a.get("query"), a.get("key"), a.get("value"),
                                       a.get("attn_metadata"), a.get("output"), layer,
                                       capturing=False))

    @functools.wraps(orig_fia)
    def full_graph_fia(self, query, key, value, attn_metadata, output, layer=None):
        captured = device_capture(self, "full_graph_fia", query, key, value, attn_metadata,
                                  output, layer)
        if captured is None:
            return orig_fia(self, query, key, value, attn_metadata, output, layer)
        return captured

    @functools.wraps(orig_fia_v2)
    def full_graph_fia_v2(self, query, key, value, attn_metadata, output):
        # vLLM-Ascend's entry for the layers with sinks (forward_fused_infer_attention)
        captured = device_capture(self, "full_graph_fia_v2", query, key, value, attn_metadata,
                                  output)
        if captured is None:
            return orig_fia_v2(self, query, key, value, attn_metadata, output)
        return captured

    def passthrough(original, reason):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            _note_host_path(state, self, reason)
            return original(self, *args, **kwargs)

        return wrapper

    @functools.wraps(orig_update)
    def update_graph_params(*args, **kwargs):
        bound = update_sig.bind(*args, **kwargs)
        forward_context = bound.arguments["forward_context"]
        num_tokens = bound.arguments["num_tokens"]
        if state.whole_graph_device_tiled(forward_context, num_tokens):
            state.updates_skipped += 1
            return None
        params = graph_params()
        device = params is not None and state.device_layers and state.device_layers.get(
            graph_key_of(params, num_tokens, forward_context))
        if not device:  # no graph params (see whole_graph_device_tiled), or none of ours
            return orig_update(*args, **kwargs)
        bound.arguments["forward_context"] = _HostLayersView(forward_context, device)
        return orig_update(*bound.args, **bound.kwargs)

    builder_cls = getattr(module, targets.BUILDER)
    _, _, orig_build = ledger.resolve(module, f"{targets.BUILDER}.build")
    _, _, orig_init = ledger.resolve(module, f"{targets.IMPL}.__init__")
    ledger.replace(builder_cls, "build", make_build(orig_build, state))
    state.impl_cls = impl_cls
    state.graph_params_fn = graph_params
    ledger.replace(impl_cls, "__init__", make_init(orig_init, state.windows))
    ledger.replace(impl_cls, "forward", forward)
    ledger.replace(impl_cls, "full_graph_fia", full_graph_fia)
    ledger.replace(impl_cls, "full_graph_fia_v2", full_graph_fia_v2)
    ledger.replace(
        impl_cls, "full_graph_pa", passthrough(orig_pa, "paged-attention decode is not supported")
    )
    ledger.replace(impl_cls, "update_graph_params", staticmethod(update_graph_params))
    if c8_cls is not None:
        _, _, orig_c8_forward = ledger.resolve(module, f"{_c8.C8_IMPL}.forward")

        @functools.wraps(orig_c8_forward)
        def c8_forward(self, layer, *args, **kwargs):
            import torch

            result = orig_c8_forward(self, layer, *args, **kwargs)
            if applies_kv_int8 and not torch.npu.is_current_stream_capturing():
                _c8.prepare_eager(self, layer, state.c8_offsets_noted)
                warm_up_after_eager(self, layer, args, kwargs)
            return result

        ledger.replace(c8_cls, "forward", c8_forward)


def vllm_capture_phase() -> bool:
    """True unless vLLM says its graph captures are over: ``cudagraph_capturing_enabled`` of
    ``vllm.compilation.monitor`` (True at import; ``capture_model`` sets it True, runs each
    size's eager warm-up and capture, then sets it False: vLLM 0.23.0 and 0.30.0
    ``v1/worker/gpu_model_runner.py``), so that later eager steps (prefills) never warm up."""
    try:
        from vllm.compilation import monitor
    except ImportError:
        return True
    return bool(getattr(monitor, "cudagraph_capturing_enabled", True))


def eager_warm_up(state: PatchState, warm_up: Any, extra_ctx: Any, impl: Any,
                  attn_metadata: Any, layer: Any, describe: Any,
                  name: str | None = None) -> None:
    """Launch our kernels for this layer once, eagerly, before vLLM captures it (review 2 item
    5: otherwise Triton compiles each variant and geometry inside the capture).

    vLLM runs one eager forward of each capture size right before capturing it
    (``_warmup_and_capture``: ``cudagraph_num_of_warmups`` dummy runs with
    ``CUDAGraphMode.NONE`` and ``force_attention``, the same ``num_tokens``, ``uniform`` and
    LoRA case; vLLM-Ascend sets ``cudagraph_num_of_warmups = 1``, ``platform.py`` of
    0.23.0.post1 and 0.30.0rc2). After that forward the hook describes the layer as its
    capture will (`describe`: same geometry, dtypes, switches) and calls the engine's
    ``warm_up``, which launches each variant once. Nothing happens outside vLLM's capture
    phase (:func:`vllm_capture_phase`), in its profile run, without an engine ``warm_up``, for
    a layer that keeps the host path or metadata without the builder's device buffers, or
    for a prefill without cache (no cache to read). Where the engine's launch raises, the
    layer keeps vLLM-Ascend's path (its capture would raise the same), logged under `name`
    (default `layer_name`; the MLA patch passes its own, `vllm_ascend_mla.mla_layer_name`),
    the key its describe reads `PatchState.warm_up_failures` by."""
    import torch

    if (warm_up is None or getattr(extra_ctx, "capturing", False)
            or getattr(extra_ctx, "in_profile_run", False)
            or getattr(attn_metadata, LENGTHS_ATTR, None) is None
            or getattr(getattr(attn_metadata, "attn_state", None), "name", "") == "PrefillNoCache"
            or not vllm_capture_phase()):
        return
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_current_stream_capturing():
        return
    reason, capture = describe()
    if reason is not None:
        return
    name = name or layer_name(impl)
    try:
        warm_up(capture)
    except Exception as exc:  # noqa: BLE001 - the layer keeps vLLM-Ascend's path, logged
        state.warm_up_failures[name] = (
            f"our kernels failed their eager launch before the capture: "
            f"{type(exc).__name__}: {exc}")
        log.warning("aicpu-tiling: layer %s: %s", name, state.warm_up_failures[name])


class _HostLayersView:
    """A forward context whose ``attn_metadata`` omits the device-tiled layers."""

    def __init__(self, forward_context: Any, exclude: set[str]) -> None:
        self._ctx = forward_context
        metadata = forward_context.attn_metadata
        self.attn_metadata = {k: v for k, v in metadata.items() if k not in exclude}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def make_update_full_graph_params(original: Any, state: PatchState) -> Any:
    """Wrap ``update_full_graph_params``: skip it when the whole graph is device-tiled."""
    sig = inspect.signature(original)

    @functools.wraps(original)
    def update_full_graph_params(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        backend = bound.arguments["attn_backend"]
        if (
            state.impl_cls is not None
            and backend.get_impl_cls() is state.impl_cls
            and state.whole_graph_device_tiled(bound.arguments["forward_context"],
                                               bound.arguments["num_tokens"])
        ):
            state.updates_skipped += 1
            return None
        return original(*args, **kwargs)

    return update_full_graph_params


def _wrap_replay(graph: Any, before: Any, num_tokens: int | None) -> None:
    """Make ``graph.replay()`` call ``before(num_tokens)`` first (an instance attribute, so
    only this graph changes)."""
    replay = graph.replay

    @functools.wraps(replay)
    def replay_after_planning(*args, **kwargs):
        before(num_tokens)
        return replay(*args, **kwargs)

    graph.replay = replay_after_planning


def make_graph_call(original: Any, state: PatchState) -> Any:
    """Wrap ``ACLGraphWrapper.__call__``: a graph it captures with device-tiled layers gets
    its ``replay`` wrapped (:func:`_wrap_replay`) to run the engine's ``before_replay``."""

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        keys_before = len(state.device_layers)  # it only grows, in insertion order
        result = original(self, *args, **kwargs)
        entries = getattr(self, "concrete_aclgraph_entries", {})
        if (len(entries) == getattr(self, "_aicpu_tiling_entries", 0)
                and len(state.device_layers) == keys_before):
            return result  # a replay or an eager call: nothing new (every step: O(1))
        self._aicpu_tiling_entries = len(entries)
        captured = list(state.device_layers)[keys_before:]
        new_graphs = []
        for entry in entries.values():
            graph = getattr(entry, "aclgraph", None)
            if graph is not None and not getattr(graph, "_aicpu_tiling_seen", False):
                graph._aicpu_tiling_seen = True
                new_graphs.append(graph)
        if captured:
            # the keys this call captured name the graph's token bucket (None: plan them all)
            buckets = {key[1] for key in captured}
            tokens = buckets.pop() if len(buckets) == 1 else None
            for graph in new_graphs:
                _wrap_replay(graph, state.engine.before_replay, tokens)
        return result

    return __call__


def patch_acl_graph(module: ModuleType, state: PatchState) -> None:
    """Replace ``acl_graph.update_full_graph_params`` with the skipping wrapper, and
    ``ACLGraphWrapper.__call__`` with one that wraps the replay of the graphs it captures."""
    original = module.update_full_graph_params
    wrapper = make_update_full_graph_params(original, state)
    state.update_original, state.update_wrapper = original, wrapper
    state.ledger.replace(module, "update_full_graph_params", wrapper)
    if hasattr(state.engine, "before_replay"):
        _, _, call = state.ledger.resolve(module, "ACLGraphWrapper.__call__")
        state.ledger.replace(module.ACLGraphWrapper, "__call__", make_graph_call(call, state))


def patch_importer(module: ModuleType, state: PatchState) -> None:
    """Rebind an importer's ``update_full_graph_params`` to the wrapper (either way round)."""
    current = vars(module).get("update_full_graph_params")
    if current is None or state.update_wrapper is None:
        return
    if current is state.update_original:
        state.ledger.replace(module, "update_full_graph_params", state.update_wrapper)
    elif current is state.update_wrapper and not state.ledger.patched(
        module, "update_full_graph_params"
    ):
        # Imported after acl_graph was patched: record how to restore the original.
        state.ledger.replace(
            module, "update_full_graph_params", state.update_wrapper, original=state.update_original
        )
