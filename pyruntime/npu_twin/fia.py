"""A stand-in for torch_npu's FIA (``npu_fused_infer_attention_score`` and its ``.out``
overload) with the wheel's schemas and real numerics, for the host_update baseline.

The schemas are the ones torch_npu 2.10.0.post4 documents in ``torch_npu/_op_plugin_docs.py``
(a test compares them with the wheel). The numerics cover what vLLM-Ascend's decode path
passes (``input_layout="TND"``, paged KV ``[num_blocks, block_size, kv_heads * head_dim]``,
``actual_seq_lengths`` the cumulative query ends, ``actual_seq_lengths_kv`` per request,
``sparse_mode`` 0 with no mask, or 3: causal aligned to the end of each request's KV), in
float32 (fp32 accumulation, like the AI Core); anything else raises `NotInTwinError`. The op runs
as an AI Core task on the current stream: captured, task-group members and updatable like
any kernel, with its host lists frozen when it is issued.
"""

from __future__ import annotations

import numpy as np
import torch

from . import device as twin
from .npu_module import NotInTwinError

#: torch_npu 2.10.0.post4, ``_op_plugin_docs.py`` (the prototypes, verbatim but for the name)
SCHEMA = (
    "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? "
    "pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? "
    "actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, Tensor? quant_scale1=None, "
    "Tensor? dequant_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, "
    "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? block_table=None, "
    "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? "
    "key_antiquant_scale=None, Tensor? key_antiquant_offset=None, Tensor? "
    "value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? "
    "key_shared_prefix=None, Tensor? value_shared_prefix=None, Tensor? "
    "actual_shared_prefix_len=None,Tensor? query_rope=None, Tensor? key_rope=None, Tensor? "
    "key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, int "
    "pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", int "
    "num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, int "
    "antiquant_mode=0, bool softmax_lse_flag=False, int key_antiquant_mode=0, int "
    "value_antiquant_mode=0) -> (Tensor, Tensor)")
OUT_SCHEMA = (
    "npu_fused_infer_attention_score.out(Tensor query, Tensor key, Tensor value, *, Tensor? "
    "pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? "
    "actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, Tensor? quant_scale1=None, "
    "Tensor? dequant_scale2=None, Tensor? quant_scale2=None, Tensor? quant_offset2=None, "
    "Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, Tensor? "
    "key_antiquant_scale=None, Tensor? key_antiquant_offset=None, Tensor? "
    "value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? "
    "block_table=None, Tensor? query_padding_size=None, Tensor? kv_padding_size=None, "
    "Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, SymInt[]? "
    "actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, Tensor? "
    "key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, int "
    "pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", int "
    "num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, int "
    "antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, bool "
    "softmax_lse_flag=False, Tensor? workspace=None, Tensor(a!) attention_out, Tensor(b!) "
    "softmax_lse) -> (Tensor(a!), Tensor(b!))")

_UNSUPPORTED = ("pse_shift", "dequant_scale1", "quant_scale1", "dequant_scale2",
                "quant_scale2", "quant_offset2", "antiquant_scale", "antiquant_offset",
                "query_padding_size", "kv_padding_size", "key_antiquant_scale",
                "key_antiquant_offset", "value_antiquant_scale", "value_antiquant_offset",
                "key_shared_prefix", "value_shared_prefix", "actual_shared_prefix_len",
                "query_rope", "key_rope", "key_rope_antiquant_scale")


def _attention(query, key_cache, value_cache, table, cu, kv, *, scale: float,
               causal: bool, band: tuple[int, int] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged GQA attention in float32, request by request: ``[T, Hq, D]`` output (rows of no
    request zero) and ``[T, Hq, 1]`` log-sum-exp. ``band = (pre_tokens, next_tokens)``:
    sparse_mode 4, the query at kv position p sees the keys p - pre_tokens .. p + next_tokens
    (torch_npu's ``_op_plugin_docs.py``: the band between pre_tokens and next_tokens, counted
    from the bottom-right corner)."""
    _, block_size, kv_heads, head_dim = key_cache.shape
    heads = query.shape[1]
    group = heads // kv_heads
    out = torch.zeros(query.shape, dtype=torch.float32)
    lse = torch.zeros(query.shape[:2] + (1,), dtype=torch.float32)
    for r in range(len(kv)):
        q0, q1, kv_len = int(cu[r]), int(cu[r + 1]), int(kv[r])
        if q1 == q0 or kv_len == 0:
            continue
        blocks = torch.from_numpy(np.ascontiguousarray(table[r, : -(-kv_len // block_size)]))
        k = key_cache[blocks].reshape(-1, kv_heads, head_dim)[:kv_len].float()
        v = value_cache[blocks].reshape(-1, kv_heads, head_dim)[:kv_len].float()
        q = query[q0:q1].float().reshape(q1 - q0, kv_heads, group, head_dim)
        s = torch.einsum("qhgd,khd->hgqk", q, k) * scale
        pos = torch.arange(kv_len)[None, :]
        at = (kv_len - (q1 - q0) + torch.arange(q1 - q0))[:, None]  # each query's position
        if causal:
            s = s.masked_fill(pos > at, float("-inf"))
        if band is not None:
            s = s.masked_fill((pos < at - band[0]) | (pos > at + band[1]), float("-inf"))
        m = s.logsumexp(-1, keepdim=True)
        o = torch.einsum("hgqk,khd->qhgd", (s - m).exp(), v)
        out[q0:q1] = o.reshape(q1 - q0, heads, head_dim)
        lse[q0:q1] = m.permute(2, 0, 1, 3).reshape(q1 - q0, heads, 1)
    return out, lse


def _check_modelled(options: dict) -> None:
    """Raise `NotInTwinError` for FIA options the twin does not model."""
    for name in _UNSUPPORTED:
        if options.get(name) is not None:
            raise NotInTwinError(f"npu_fused_infer_attention_score: {name} is not modelled by "
                                 "the NPU twin")
    if options["input_layout"] != "TND" or options["block_table"] is None:
        raise NotInTwinError("the twin's FIA models input_layout='TND' with a paged KV cache "
                             "(block_table) only, as vLLM-Ascend's decode path calls it")


def _check_on_device(op: str, query, key, value, options: dict) -> None:
    for t in (query, key, value, options.get("block_table")):
        if t is not None and not isinstance(t, twin.NpuTensor):
            raise twin.HostPointerError(f"{op}: every tensor must be on the NPU")


def _reference(query, key, value, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """FIA's result: ``[T, num_heads, D]`` output and ``[T, num_heads, 1]`` lse."""
    _check_modelled(options)
    mode = options["sparse_mode"]
    if mode not in (0, 3, 4):
        raise NotInTwinError(f"sparse_mode {mode} is not modelled")
    mask = options["atten_mask"]
    if mode in (3, 4) and (mask is None or tuple(mask.shape) != (2048, 2048)):
        raise RuntimeError(f"npu_fused_infer_attention_score: sparse_mode {mode} needs the "
                           "compressed causal atten_mask of shape (2048, 2048)")
    band = None
    if mode == 4:
        band = (int(options["pre_tokens"]), int(options["next_tokens"]))
        if band[0] + band[1] < 0:
            raise RuntimeError("npu_fused_infer_attention_score: sparse_mode 4 needs "
                               "pre_tokens and next_tokens to intersect")
    if options["sparse_mode"] == 0 and mask is not None:
        raise NotInTwinError("an explicit atten_mask with sparse_mode 0 is not modelled")
    heads, kv_heads = options["num_heads"], options["num_key_value_heads"] or options["num_heads"]
    block_size = options["block_size"]
    cu = np.concatenate([[0], np.asarray(options["actual_seq_lengths"], np.int64)])
    kv = np.asarray(options["actual_seq_lengths_kv"], np.int64)
    if len(kv) != len(cu) - 1:
        raise RuntimeError("npu_fused_infer_attention_score: actual_seq_lengths and "
                           "actual_seq_lengths_kv must have one entry per request")
    head_dim = query.shape[-1]
    cache = (key.shape[0], block_size, kv_heads, head_dim)
    if heads % kv_heads or query.shape[1] != heads:
        raise RuntimeError(f"npu_fused_infer_attention_score: num_heads {heads} and "
                           f"num_key_value_heads {kv_heads} do not fit the query {query.shape}")
    if cu[-1] > query.shape[0]:
        raise RuntimeError("npu_fused_infer_attention_score: actual_seq_lengths ends past the "
                           "query's T rows")
    return _attention(query, key.reshape(cache), value.reshape(cache),
                      options["block_table"].numpy(), cu, kv, scale=options["scale"],
                      causal=mode == 3, band=band)


def _defaults(schema: str) -> dict:
    """The keyword defaults of a schema (the dispatcher hands a Python kernel only the
    keywords the caller passed)."""
    import re

    out = {}
    for name, value in re.findall(r"(\w+)=([^,)]+)", schema):
        value = value.strip()
        out[name] = (None if value == "None" else value.strip('"') if value.startswith('"')
                     else value == "True" if value in ("True", "False")
                     else float(value) if "." in value else int(value))
    return out


def _issue(query, key, value, options, attention_out, softmax_lse) -> None:
    dev = twin.device()
    options = {**_DEFAULTS, **options}
    _check_on_device("npu_fused_infer_attention_score", query, key, value, options)
    inner = {k: twin.inner(v) for k, v in options.items()}
    frozen = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in inner.items()}
    q, k, v = twin.inner(query), twin.inner(key), twin.inner(value)
    out_i, lse_i = twin.inner(attention_out), twin.inner(softmax_lse)

    def run() -> None:
        out, lse = _reference(q, k, v, frozen)
        out_i.copy_(out.reshape(out_i.shape))
        if lse_i.numel() == lse.numel():
            lse_i.copy_(lse.reshape(lse_i.shape))
    dev.enqueue(twin.Work("aicore", "npu_fused_infer_attention_score", run))


def fia(query, key, value, **options):
    attention_out = torch.empty_like(query)
    softmax_lse = torch.empty(query.shape[:2] + (1,), dtype=torch.float32, device=query.device)
    _issue(query, key, value, options, attention_out, softmax_lse)
    return attention_out, softmax_lse


def fia_out(query, key, value, *, workspace=None, attention_out, softmax_lse, **options):
    _issue(query, key, value, options, attention_out, softmax_lse)
    return attention_out, softmax_lse


#: bytes of the workspace the twin hands out (it models no workspace size: FIA's twin needs
#: none, and ``.out`` accepts any)
WORKSPACE_BYTES = 1024


def get_max_workspace(query, key, value, **options):
    """``torch_npu._npu_fused_infer_attention_score_get_max_workspace`` (schema in the
    wheel's ``_op_plugin_docs.py``): a device workspace for FIA's ``.out`` under graph
    capture. The options are checked as FIA checks them (what the twin does not model
    raises ``NotInTwinError``), on the host, since the real op sizes the workspace from
    them when it is called."""
    options = {**_DEFAULTS, **options}
    _check_on_device("_npu_fused_infer_attention_score_get_max_workspace", query, key, value,
                     options)
    _check_modelled(options)
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=query.device)


_library: torch.library.Library | None = None
_DEFAULTS = {k: v for k, v in _defaults(SCHEMA).items() if k != "workspace"}


def register() -> torch._ops.OpOverloadPacket:
    """Define ``torch.ops.npu.npu_fused_infer_attention_score`` (once)."""
    global _library
    if _library is None:
        lib = torch.library.Library("npu", "DEF")
        lib.define(SCHEMA)
        lib.define(OUT_SCHEMA)
        lib.impl("npu_fused_infer_attention_score", fia, "PrivateUse1")
        lib.impl("npu_fused_infer_attention_score.out", fia_out, "PrivateUse1")
        _library = lib
    return torch.ops.npu.npu_fused_infer_attention_score
