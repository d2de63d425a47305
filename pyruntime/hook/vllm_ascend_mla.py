"""The vLLM-Ascend MLA patch set: ``AscendMLAImpl``'s full-graph decode reads a device tiling.

vLLM-Ascend's MLA decode (``vllm_ascend/attention/mla_v1.py``, 0.23.0.post1 and 0.30.0rc2,
``AscendMLAImpl._forward_decode``) runs FIA v2 with ``query_rope``/``key_rope`` on the
absorbed query (``ql_nope``: ``W_UK`` applied in ``_q_proj_and_k_up_proj``) and the layer's
cache pair, with host lists ``actual_seq_kvlen`` (``decode.seq_lens_list``) and
``actual_seq_qlen``. While capturing (``_EXTRA_CTX.capturing``) it allocates the head-major
output ``attn_output`` (``[Hp, T, 1, L]`` under ``BNSD_NBSD``, ``[Hp, T, L]`` under
``TND_NTD`` when a speculative config is set; ``Hp`` the heads padded to a power of two),
waits on an ``ExternalEvent`` and records the FIA call in a task group whose arguments
``AscendMLAImpl.update_graph_params`` rewrites after every replay, one task update per MLA
layer; the result goes through ``_v_up_proj`` (``W_UV``) and ``o_proj``.

What changes, for supported layers only:

* ``AscendMLAMetadataBuilder.build`` hands the metadata the persistent device buffers its
  ``common_attn_metadata`` views (``query_start_loc``, ``seq_lens``, ``block_table_tensor``),
  as the GQA builder's patch does (`vllm_ascend_patches.make_build`).
* ``AscendMLAImpl._forward_decode``, while capturing: the engine's tiling task (once per step
  and graph, shared by the graph's MLA layers) and our MLA kernels reading that tiling, the
  layer's own cache tensors (``k_nope`` ``[blocks, block_size, 1, L]``, ``k_pe`` ``[...,
  R]``, viewed, never copied) and the query the original path hands FIA (``ql_nope`` made
  contiguous, as the original does; ``q_pe``), into a token-major ``[T, H, L]`` buffer that
  one captured copy moves into ``attn_output`` of the original's shape and dtype. The method
  then returns ``self._v_up_proj(attn_output[:H])`` exactly as the original does, so the
  up-projection and ``o_proj`` are unchanged. No ``ExternalEvent``, no task group.
* ``AscendMLAImpl.update_graph_params`` skips graphs whose MLA layers are all ours; in a mixed
  graph it runs for the host-path layers only (its ``zip(attn_keys, attn_params[num_tokens],
  ...)`` pairs layer names with the captured FIA tasks in order, so our layers, which add no
  task, are removed from ``attn_keys`` through the forward context).
* ``AscendMLAImpl._forward_decode``, eager, in vLLM's capture phase (its warm-up forward of
  each capture size, right before the capture): after the original, the engine's
  ``warm_up_mla`` launches the tiling task and our MLA kernels once for this layer's variant
  and geometry, on scratch tiling and output buffers, so Triton compiles them here and not
  inside the capture (review 2 item 5, as the GQA patch does: `gqa.eager_warm_up`). A layer
  whose eager launch raises keeps vLLM-Ascend's path, logged.

Everything else keeps the original path, each layer logged once with its reason
(:func:`mla_unsupported_reason`): the NZ cache layout (``enable_kv_nz``), FA quantization
(``fa_quant_layer``: int8/fp8 caches, ``dequant_scale_q_nope``), cache dtypes other than
fp16/bf16/fp32, MLA without rope (``qk_rope_head_dim == 0``: vLLM-Ascend pads a zero rope of
64), context parallel (``pcp_enabled``, decode sharding, subclasses), speculative draft-model
graphs, non-causal decode (K3's DSpark draft block), and metadata without the builder's
device buffers. Eager (non-capturing) calls keep the original FIA call: no graph, no update
(only the warm-up above runs beside it).
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from . import vllm_ascend_patches as gqa

log = logging.getLogger("pyruntime.hook")

MODULE = "vllm_ascend.attention.mla_v1"
IMPL = "AscendMLAImpl"
BUILDER = "AscendMLAMetadataBuilder"

#: ``_forward_decode``'s parameters per signature (0.30.0rc2; 0.23.0.post1), a prefix
FORWARD_DECODE_PARAMS = (("self", "decode_preprocess_res", "block_size", "attn_metadata"),
                         ("self", "q_nope", "q_pe", "k_nope", "k_pe", "block_size",
                          "attn_metadata"))
#: ``update_graph_params``' leading parameters (a staticmethod in every release)
UPDATE_PARAMS = ("update_stream", "forward_context", "num_tokens")
#: ``self.<name>`` attributes of ``AscendMLAImpl`` read without a default (assigned in its
#: ``__init__``); ``fa_quant_layer``, ``pcp_enabled``, ``is_pcp_decode_sharded`` and
#: ``num_heads_padded`` are read with one, since not every release has them
IMPL_ATTRIBUTES = ("num_heads", "num_kv_heads", "scale", "kv_lora_rank", "qk_rope_head_dim",
                   "enable_kv_nz", "speculative_config")
#: module globals of ``mla_v1`` the patch reads
MODULE_GLOBALS = ("_EXTRA_CTX", IMPL, BUILDER, "AscendMLABackend")

#: dtypes our MLA kernels store (`pyruntime.kernels.triton_launch.DTYPES`)
_DTYPES = ("torch.float16", "torch.bfloat16", "torch.float32")


@dataclass(frozen=True)
class MLACapture:
    """One MLA layer's decode, as the patched ``_forward_decode`` sees it at capture.

    ``q_nope`` ``[T, H, L]`` (absorbed: ``W_UK`` applied) and ``q_pe`` ``[T, H, R]``,
    contiguous; ``kv_c_cache`` ``[num_blocks, block_size, 1, L]`` and ``k_pe_cache``
    ``[num_blocks, block_size, 1, R]``, views of the layer's own cache (no copy); ``output``
    ``[T, H, L]`` contiguous, written by the kernels (padding rows zero); ``block_table``,
    ``query_start_loc``, ``seq_lens``, ``batch``: as `pyruntime.hook.engine.AttentionCapture`
    (per request: with MTP a request has ``1 + spec`` query rows). One storage dtype.
    """

    graph_key: Any
    layer_name: str | None
    q_nope: Any
    q_pe: Any
    kv_c_cache: Any
    k_pe_cache: Any
    block_table: Any
    query_start_loc: Any
    seq_lens: Any
    batch: Any
    output: Any
    num_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    block_size: int
    scale: float


def mla_unsupported_reason(impl: Any, impl_cls: type, extra_ctx: Any, attn_metadata: Any,
                           tensors: dict, query_device: Any = None) -> str | None:
    """Why this MLA layer keeps vLLM-Ascend's host-update path, or None if we take it.

    ``tensors``: ``q_nope``, ``q_pe``, ``k_nope``, ``k_pe`` and ``dequant_scale_q_nope`` as
    ``_forward_decode`` received them. The rules follow ``AscendMLAImpl._forward_decode``
    (0.23.0.post1, 0.30.0rc2): the branches it takes for ``fa_quant_layer`` and
    ``enable_kv_nz`` read other layouts and dtypes; ``qk_rope_head_dim == 0`` pads a zero
    rope; ``attn_metadata.causal`` False (0.30) is bidirectional.
    """
    import torch

    lengths = getattr(attn_metadata, gqa.LENGTHS_ATTR, None)
    if lengths is None:
        return ("no persistent device length buffers (metadata not built by "
                "AscendMLAMetadataBuilder.build, or its buffers are not on one device)")
    if query_device is not None and lengths.seq_lens.device != query_device:
        return f"the length buffers are on {lengths.seq_lens.device}, the query on {query_device}"
    if type(impl) is not impl_cls:
        return f"subclass {type(impl).__name__} (context parallel) is not supported"
    if getattr(extra_ctx, "is_draft_model", False):
        return "speculative draft-model graphs are not supported"
    try:
        if impl.enable_kv_nz:
            return "the NZ cache layout (enable_kv_nz) is not read by our MLA kernels"
        if getattr(impl, "fa_quant_layer", False) or tensors.get("dequant_scale_q_nope") is not None:
            return "FA quantization (int8/fp8 MLA cache) is not supported"
        if getattr(impl, "pcp_enabled", False) or getattr(impl, "is_pcp_decode_sharded", False):
            return "context parallel (PCP/DCP) is not supported"
        if int(impl.qk_rope_head_dim) == 0:
            return "MLA without rope (qk_rope_head_dim 0) is not supported"
        if int(impl.num_kv_heads) != 1:
            return f"num_kv_heads {impl.num_kv_heads}: MLA's latent cache has one kv head"
    except AttributeError as exc:
        return f"the implementation has no attribute {exc.name!r} (not built by its __init__)"
    if not getattr(attn_metadata, "causal", True):
        return "non-causal decode (a bidirectional draft block) is not supported"
    dtype = tensors["q_pe"].dtype
    for name in ("q_nope", "q_pe", "k_nope", "k_pe"):
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            return f"{name} is not a tensor"
        if str(t.dtype) not in _DTYPES or t.dtype != dtype:
            return f"{name} in {t.dtype}: our MLA kernels read fp16/bf16/fp32, one dtype"
        if query_device is not None and t.device != query_device:
            return f"{name} is on {t.device}, the query on {query_device}"
    for name in ("k_nope", "k_pe"):
        if not tensors[name].is_contiguous():
            return f"the {name} cache is not contiguous: our kernels read it in place"
    return None


def mla_layer_name(impl: Any) -> str:
    """The layer's name as the forward context's ``attn_metadata`` keys it (what
    ``update_graph_params`` zips): the ``layer_name`` the last ``forward`` call received (the
    patched ``forward`` records it), else ``AscendMLAImpl``'s own ``self.layer_name``
    (``kwargs.get("layer_name")`` in ``__init__``, None when vLLM does not pass it), else a
    name made from the instance."""
    recorded = getattr(impl, gqa.LAYER_NAME_ATTR, None)
    own = getattr(impl, "layer_name", None)
    return recorded or (own if isinstance(own, str) and own else gqa.layer_name(impl))


def _note_host_path(state: Any, impl: Any, reason: str) -> None:
    name = mla_layer_name(impl)
    if getattr(impl, gqa.LAYER_NAME_ATTR, None) is None:
        setattr(impl, gqa.LAYER_NAME_ATTR, name)  # the GQA helper logs under this name
    gqa._note_host_path(state, impl, reason)


def _decode_args(sig: inspect.Signature, args: tuple, kwargs: dict) -> tuple[Any, dict, Any, Any]:
    """``(self, tensors, block_size, attn_metadata)`` of a ``_forward_decode`` call in either
    signature: 0.30.0rc2 ``(self, decode_preprocess_res, block_size, attn_metadata)``,
    0.23.0.post1 ``(self, q_nope, q_pe, k_nope, k_pe, block_size, attn_metadata,
    dequant_scale_q_nope=None)``."""
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if "decode_preprocess_res" in a:
        res = a["decode_preprocess_res"]
        tensors = {"q_nope": res.ql_nope, "q_pe": res.q_pe, "k_nope": res.k_nope,
                   "k_pe": res.k_pe,
                   "dequant_scale_q_nope": getattr(res, "dequant_scale_q_nope", None)}
    else:
        tensors = {name: a.get(name) for name in ("q_nope", "q_pe", "k_nope", "k_pe",
                                                  "dequant_scale_q_nope")}
    return a["self"], tensors, a["block_size"], a["attn_metadata"]


def patch_mla(module: ModuleType, state: Any, acl_graph: ModuleType) -> None:
    """Patch ``AscendMLAMetadataBuilder.build``, ``AscendMLAImpl._forward_decode`` and
    ``AscendMLAImpl.update_graph_params`` in ``mla_v1`` (see the module docstring)."""
    import torch

    impl_cls = getattr(module, IMPL)
    builder_cls = getattr(module, BUILDER)
    ledger = state.ledger
    _, _, orig_decode = ledger.resolve(module, f"{IMPL}._forward_decode")
    _, _, orig_update_sm = ledger.resolve(module, f"{IMPL}.update_graph_params")
    _, _, orig_build = ledger.resolve(module, f"{BUILDER}.build")
    _, _, orig_forward = ledger.resolve(module, f"{IMPL}.forward")
    orig_update = getattr(orig_update_sm, "__func__", orig_update_sm)
    decode_sig = inspect.signature(orig_decode)
    update_sig = inspect.signature(orig_update)

    def graph_params() -> Any:
        source = module if hasattr(module, "get_graph_params") else acl_graph
        return gqa._graph_params(source, module._EXTRA_CTX)

    def describe(self, tensors, block_size, attn_metadata, *, capturing: bool) -> tuple:
        """``(reason, None)`` when the layer keeps the host path, else ``(None, capture)``: the
        `MLACapture` `capture` hands the engine; ``capturing`` False (the eager warm-up) keys
        nothing (``graph_key`` None)."""
        q_pe = tensors["q_pe"]
        context = gqa.current_forward_context(acl_graph)
        reason = (state.warm_up_failures.get(mla_layer_name(self))
                  or gqa.lora_reason(context, gqa.vllm_lora_configured)
                  or mla_unsupported_reason(self, impl_cls, module._EXTRA_CTX, attn_metadata,
                                            tensors, q_pe.device if q_pe is not None else None))
        if reason is not None:
            return reason, None
        h, lora, rope = int(self.num_heads), int(self.kv_lora_rank), int(self.qk_rope_head_dim)
        num_tokens = int(tensors["q_nope"].size(0))
        # the query views the original hands FIA (its `.contiguous()` on q_nope included)
        q_nope = tensors["q_nope"].view(num_tokens, h, -1).contiguous()
        q_pe = q_pe.view(num_tokens, h, -1).contiguous()
        kv_c = tensors["k_nope"].view(-1, int(block_size), 1, lora)
        k_pe = tensors["k_pe"].view(-1, int(block_size), 1, rope)
        ours = torch.empty((num_tokens, h, lora), dtype=q_pe.dtype, device=q_pe.device)
        lengths = getattr(attn_metadata, gqa.LENGTHS_ATTR)
        key = gqa.graph_key_of(graph_params(), num_tokens, context) if capturing else None
        return None, MLACapture(
            graph_key=key, layer_name=mla_layer_name(self), q_nope=q_nope, q_pe=q_pe,
            kv_c_cache=kv_c, k_pe_cache=k_pe, block_table=lengths.block_table,
            query_start_loc=lengths.query_start_loc, seq_lens=lengths.seq_lens,
            batch=lengths.batch, output=ours, num_heads=h, kv_lora_rank=lora,
            qk_rope_head_dim=rope, block_size=int(block_size), scale=float(self.scale))

    def capture(self, tensors, block_size, attn_metadata) -> Any:
        """Capture the layer on the device path; returns what the original returns, or None
        (noted once) when the layer keeps the host path."""
        reason, c = describe(self, tensors, block_size, attn_metadata, capturing=True)
        if reason is not None:
            _note_host_path(state, self, reason)
            return None
        h, num_tokens, lora = c.num_heads, int(c.q_nope.shape[0]), c.kv_lora_rank
        speculative = (self.speculative_config is not None
                       and str(getattr(attn_metadata.attn_state, "name", "")) in
                       ("SpecDecoding", "ChunkedPrefill", "DecodeOnly", "PrefillNoCache"))
        padded = int(getattr(self, "num_heads_padded", h))
        shape = (padded, num_tokens, lora) if speculative else (padded, num_tokens, 1, lora)
        attn_output = torch.empty(shape, dtype=c.q_pe.dtype, device=c.q_pe.device)
        state.engine.capture_mla(c)
        # head-major, as FIA's NBSD / NTD output: one captured copy (the up-projection reads it)
        attn_output[:h].view(h, num_tokens, lora).copy_(c.output.transpose(0, 1))
        state.device_layers[c.graph_key].add(c.layer_name)
        state.device_entries[c.layer_name] = "_forward_decode"
        out = attn_output[:h] if padded > h else attn_output
        return self._v_up_proj(out)

    warm_up = getattr(state.engine, "warm_up_mla", None)

    def warm_up_after_eager(self, tensors, block_size, attn_metadata) -> None:
        """After an eager decode in vLLM's capture phase (its warm-up run before each
        capture): our MLA kernels for this layer launched once now, outside the capture, with
        the tiling task (`gqa.eager_warm_up`, the engine's ``warm_up_mla``)."""
        gqa.eager_warm_up(state, warm_up, module._EXTRA_CTX, self, attn_metadata, None,
                          lambda: describe(self, tensors, block_size, attn_metadata,
                                           capturing=False),
                          name=mla_layer_name(self))

    @functools.wraps(orig_forward)
    def forward(self, layer_name, *args, **kwargs):
        # forward(self, layer_name, hidden_states, kv_cache, attn_metadata, output) in both
        # releases: the name the forward context's attn_metadata is keyed by
        if isinstance(layer_name, str):
            setattr(self, gqa.LAYER_NAME_ATTR, layer_name)
        return orig_forward(self, layer_name, *args, **kwargs)

    @functools.wraps(orig_decode)
    def _forward_decode(*args, **kwargs):
        if not getattr(module._EXTRA_CTX, "capturing", False):
            result = orig_decode(*args, **kwargs)  # eager: no graph, no task update
            warm_up_after_eager(*_decode_args(decode_sig, args, kwargs))
            return result
        self, tensors, block_size, attn_metadata = _decode_args(decode_sig, args, kwargs)
        result = capture(self, tensors, block_size, attn_metadata)
        return orig_decode(*args, **kwargs) if result is None else result

    @functools.wraps(orig_update)
    def update_graph_params(*args, **kwargs):
        bound = update_sig.bind(*args, **kwargs)
        num_tokens = bound.arguments["num_tokens"]
        forward_context = bound.arguments["forward_context"]
        params = graph_params()
        if params is None:  # no global graph params: what the original does (see
            return orig_update(*args, **kwargs)  # PatchState.whole_graph_device_tiled)
        device = state.device_layers.get(gqa.graph_key_of(params, num_tokens, forward_context))
        if not device:
            return orig_update(*args, **kwargs)
        if not params.attn_params.get(num_tokens):
            state.updates_skipped += 1  # every MLA layer of this graph is ours
            return None
        bound.arguments["forward_context"] = gqa._HostLayersView(forward_context, device)
        return orig_update(*bound.args, **bound.kwargs)

    ledger.replace(builder_cls, "build", gqa.make_build(orig_build, state))
    ledger.replace(impl_cls, "forward", forward)
    ledger.replace(impl_cls, "_forward_decode", _forward_decode)
    ledger.replace(impl_cls, "update_graph_params", staticmethod(update_graph_params))
    state.mla_impl_cls = impl_cls
