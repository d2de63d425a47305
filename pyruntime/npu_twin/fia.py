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

Two more calls of vLLM-Ascend are modelled:

* C8 (int8 KV) decode, ``input_layout="BNSD"``: the query ``[B, N, 1, D]``, paged int8 caches
  in the NZ 5-D view ``[num_blocks, KV_N, D/32, block_size, 32]`` and per-channel
  ``key_antiquant_scale``/``value_antiquant_scale`` ``[KV_N, 1, D]`` (vllm-ascend 0.23/0.30
  ``vllm_ascend/attention/attention_v1.py``: ``AscendAttentionBackendImpl.full_graph_fia`` with
  ``enable_c8_quant`` and ``AscendC8AttentionBackendImpl._forward_c8_decode``): see `_c8_checked`.
* ``npu_fused_infer_attention_score_v2`` (+ ``.out`` and its ``_get_max_workspace``) with
  ``learnable_sink``, as ``full_graph_fia_v2`` calls it for layers with attention sinks:
  ``input_layout="TND"``, paged ND KV, ``sparse_mode`` 3 or 4: see `_v2_checked`.
"""

from __future__ import annotations

import numpy as np
import torch

from . import device as twin
from . import mla_ops
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

#: torch_npu 2.10.0.post4, ``_op_plugin_docs.py``: FIA v2, its ``.out`` and its workspace query
V2_SCHEMA = (
    "npu_fused_infer_attention_score_v2(Tensor query, Tensor key, Tensor value, *, Tensor? "
    "query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, Tensor? "
    "atten_mask=None, SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, "
    "Tensor? block_table=None, Tensor? dequant_scale_query=None, Tensor? "
    "dequant_scale_key=None, Tensor? dequant_offset_key=None, Tensor? "
    "dequant_scale_value=None, Tensor? dequant_offset_value=None, Tensor? "
    "dequant_scale_key_rope=None, Tensor? quant_scale_out=None, Tensor? "
    "quant_offset_out=None, Tensor? quant_scale_p=None, Tensor? learnable_sink=None, int "
    "num_query_heads=1, int num_key_value_heads=0, float softmax_scale=1.0, int "
    "pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", int "
    "sparse_mode=0, int block_size=0, int query_quant_mode=0, int key_quant_mode=0, int "
    "value_quant_mode=0, int inner_precise=0, bool return_softmax_lse=False, int? "
    "query_dtype=None, int? key_dtype=None, int? value_dtype=None, int? "
    "query_rope_dtype=None, int? key_rope_dtype=None, int? key_shared_prefix_dtype=None, "
    "int? value_shared_prefix_dtype=None, int? dequant_scale_query_dtype=None, int? "
    "dequant_scale_key_dtype=None, int? dequant_scale_value_dtype=None, int? "
    "dequant_scale_key_rope_dtype=None, int? out_dtype=None) -> (Tensor, Tensor)")
V2_OUT_SCHEMA = (
    "npu_fused_infer_attention_score_v2.out(Tensor query, Tensor key, Tensor value, *, "
    "Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, Tensor? "
    "atten_mask=None, SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, "
    "Tensor? block_table=None, Tensor? dequant_scale_query=None, Tensor? "
    "dequant_scale_key=None, Tensor? dequant_offset_key=None, Tensor? "
    "dequant_scale_value=None, Tensor? dequant_offset_value=None, Tensor? "
    "dequant_scale_key_rope=None, Tensor? quant_scale_out=None, Tensor? "
    "quant_offset_out=None, Tensor? quant_scale_p=None, Tensor? learnable_sink=None, int "
    "num_query_heads=1, int num_key_value_heads=0, float softmax_scale=1.0, int "
    "pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", int "
    "sparse_mode=0, int block_size=0, int query_quant_mode=0, int key_quant_mode=0, int "
    "value_quant_mode=0, int inner_precise=0, bool return_softmax_lse=False, int? "
    "query_dtype=None, int? key_dtype=None, int? value_dtype=None, int? "
    "query_rope_dtype=None, int? key_rope_dtype=None, int? key_shared_prefix_dtype=None, "
    "int? value_shared_prefix_dtype=None, int? dequant_scale_query_dtype=None, int? "
    "dequant_scale_key_dtype=None, int? dequant_scale_value_dtype=None, int? "
    "dequant_scale_key_rope_dtype=None, int? out_dtype=None, Tensor? workspace=None, "
    "Tensor(a!) attention_out, Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))")
V2_WORKSPACE_SCHEMA = (
    "_npu_fused_infer_attention_score_v2_get_max_workspace(Tensor query, Tensor key, Tensor"
    " value, *, Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, "
    "Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, SymInt[]? "
    "actual_seq_kvlen=None, Tensor? block_table=None, Tensor? dequant_scale_query=None, "
    "Tensor? dequant_scale_key=None, Tensor? dequant_offset_key=None, Tensor? "
    "dequant_scale_value=None, Tensor? dequant_offset_value=None, Tensor? "
    "dequant_scale_key_rope=None, Tensor? quant_scale_out=None, Tensor? "
    "quant_offset_out=None, Tensor? quant_scale_p=None, Tensor? learnable_sink=None, int "
    "num_query_heads=1, int num_key_value_heads=0, float softmax_scale=1.0, int "
    "pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", int "
    "sparse_mode=0, int block_size=0, int query_quant_mode=0, int key_quant_mode=0, int "
    "value_quant_mode=0, int inner_precise=0, bool return_softmax_lse=False, int? "
    "query_dtype=None, int? key_dtype=None, int? value_dtype=None, int? "
    "query_rope_dtype=None, int? key_rope_dtype=None, int? key_shared_prefix_dtype=None, "
    "int? value_shared_prefix_dtype=None, int? dequant_scale_query_dtype=None, int? "
    "dequant_scale_key_dtype=None, int? dequant_scale_value_dtype=None, int? "
    "dequant_scale_key_rope_dtype=None, int? out_dtype=None) -> Tensor")

_UNSUPPORTED = ("pse_shift", "dequant_scale1", "quant_scale1", "dequant_scale2",
                "quant_scale2", "quant_offset2", "antiquant_scale", "antiquant_offset",
                "query_padding_size", "kv_padding_size", "key_antiquant_scale",
                "key_antiquant_offset", "value_antiquant_scale", "value_antiquant_offset",
                "key_shared_prefix", "value_shared_prefix", "actual_shared_prefix_len",
                "query_rope", "key_rope", "key_rope_antiquant_scale")


def _attention(query, key_cache, value_cache, table, cu, kv, *, scale: float,
               causal: bool, band: tuple[int, int] | None = None,
               kv_scale: tuple[torch.Tensor, torch.Tensor] | None = None,
               sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged GQA attention in float32, request by request: ``[T, Hq, D]`` output (rows of no
    request zero) and ``[T, Hq, 1]`` log-sum-exp. ``band = (pre_tokens, next_tokens)``:
    sparse_mode 4, the query at kv position p sees the keys p - pre_tokens .. p + next_tokens
    (torch_npu's ``_op_plugin_docs.py``: the band between pre_tokens and next_tokens, counted
    from the bottom-right corner).

    ``kv_scale = (k_scale, v_scale)``, each float32 ``[Hkv, D]``: the caches are int8 and a
    stored x means ``x * scale`` (per-channel antiquant without offset), dequantised in fp32.
    ``sink``: float32 ``[Hq]``, one extra logit per query head in the softmax denominator that
    adds no value (``exp(sink - m)``; the lse includes it), as torch_npu's
    ``_op_plugin_docs.py`` defines a sink for ``npu_fusion_attention`` ("append one sink logit,
    apply softmax, then drop that column before multiplying by V"; the sink is not scaled)."""
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
        if kv_scale is not None:
            k, v = k * kv_scale[0], v * kv_scale[1]
        q = query[q0:q1].float().reshape(q1 - q0, kv_heads, group, head_dim)
        s = torch.einsum("qhgd,khd->hgqk", q, k) * scale
        pos = torch.arange(kv_len)[None, :]
        at = (kv_len - (q1 - q0) + torch.arange(q1 - q0))[:, None]  # each query's position
        if causal:
            s = s.masked_fill(pos > at, float("-inf"))
        if band is not None:
            s = s.masked_fill((pos < at - band[0]) | (pos > at + band[1]), float("-inf"))
        if sink is None:
            m = s.logsumexp(-1, keepdim=True)
        else:  # [Hkv, group, q, 1] sink logits beside the scores
            column = sink.reshape(kv_heads, group, 1, 1).expand(*s.shape[:3], 1)
            m = torch.cat([s, column], -1).logsumexp(-1, keepdim=True)
        o = torch.einsum("hgqk,khd->qhgd", (s - m).exp(), v)
        out[q0:q1] = o.reshape(q1 - q0, heads, head_dim)
        lse[q0:q1] = m.permute(2, 0, 1, 3).reshape(q1 - q0, heads, 1)
    return out, lse


#: the kv antiquant options of C8's BNSD call (`_c8_checked` decides on them)
_C8_OPTIONS = ("key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale",
               "value_antiquant_offset")


def _check_modelled(options: dict) -> None:
    """Raise `NotInTwinError` for FIA options the twin does not model."""
    bnsd = options["input_layout"] == "BNSD"
    for name in _UNSUPPORTED:
        if options.get(name) is not None and not (bnsd and name in _C8_OPTIONS):
            raise NotInTwinError(f"npu_fused_infer_attention_score: {name} is not modelled by "
                                 "the NPU twin")
    layout, paged = options["input_layout"], options["block_table"] is not None
    if layout not in ("TND", "BNSD") or (layout == "BNSD" and not paged):
        raise NotInTwinError("the twin's FIA models input_layout='TND' with a paged KV cache "
                             "(block_table), as vLLM-Ascend's decode path calls it, or with "
                             "contiguous K/V (its prefill without a cache), and "
                             "input_layout='BNSD' with paged int8 NZ caches (its C8 decode) only")


#: NZ's last dim for int8: a 32-byte fractal (torch_npu's docs: "数据类型为int8时，输入参数key和
#: value的格式为[blockNum, KV_N, D/32, blockSize, 32]"; vLLM-Ascend's ``_nz_5d_view``)
_NZ_INT8 = 32

#: (num_heads, num_key_value_heads) that FIA takes with NZ int8 KV (the docs' list)
_NZ_HEADS = ((10, 1), (64, 8), (80, 8), (128, 16))


def _fail(message: str) -> RuntimeError:
    return RuntimeError(f"npu_fused_infer_attention_score: {message}")


def _c8_checked(query, key, value, options: dict):
    """The checks of C8's BNSD call; returns ``(batch, kv_heads, head_dim, block_size,
    kv_lens)`` (``kv_lens`` a list of B ints, or None when the lengths are not yet known).

    The rules are torch_npu 2.10.0.post4's ``_op_plugin_docs.py``. FIA v1's entry speaks of NZ
    only for MLA (query_rope, "[blockNum, KV_N, D/16, blockSize, 16]"); the int8 NZ case is
    documented under ``npu_fused_infer_attention_score_v2`` (the same aclnn operator),
    "GQA伪量化场景下KV为NZ格式时的参数约束": query bfloat16, key and value int8 ``[blockNum,
    KV_N, D/32, blockSize, 32]``, D only 128, query S 1-16, layouts BSH/BSND/BNSD, page
    attention only with blockSize 128 or 512, per-channel scales bfloat16 and for BNSD
    "必须传入[KV_N,1,D]", "仅支持高性能模式" (inner_precise 1), "当MTP等于0时，支持
    sparse_mode=0且不传mask", no offsets ("不支持配置dequant_offset_key和dequant_offset_value"),
    and (num_heads, num_key_value_heads) one of (10,1), (64,8), (80,8), (128,16). What those
    rules forbid raises RuntimeError; per-token modes, MTP (query S > 1) and the ND caches
    BNSD also takes raise `NotInTwinError`.
    """
    heads = options["num_heads"]
    kv_heads = options["num_key_value_heads"] or heads
    if query.dim() != 4:
        raise _fail(f"input_layout BNSD needs a 4-d query [B, N, S, D], got {list(query.shape)}")
    batch, q_heads, q_len, head_dim = query.shape
    if key.dtype != torch.int8 or key.dim() != 5:
        raise NotInTwinError("the twin's BNSD FIA models vLLM-Ascend's C8 call only: int8 "
                             "key and value in the NZ view [num_blocks, KV_N, D/32, "
                             f"block_size, 32] (got {key.dtype} {list(key.shape)})")
    if q_len != 1:
        raise NotInTwinError("BNSD FIA with a query S > 1 (MTP: sparse_mode 3 and a mask) is "
                             "not modelled by the NPU twin")
    if query.dtype != torch.bfloat16:
        raise _fail(f"int8 NZ KV needs a bfloat16 query, got {query.dtype}")
    if value.dtype != torch.int8 or tuple(value.shape) != tuple(key.shape):
        raise _fail("key and value must have the same shape (int8 NZ), got "
                    f"{list(key.shape)} {key.dtype} and {list(value.shape)} {value.dtype}")
    if q_heads != heads:
        raise _fail(f"num_heads {heads} must equal the query's N {q_heads} (BNSD)")
    if key.shape[1] != kv_heads:
        raise _fail(f"num_key_value_heads {kv_heads} must equal the key's N {key.shape[1]} "
                    "(BNSD)")
    if (heads, kv_heads) not in _NZ_HEADS:
        raise _fail(f"int8 NZ KV supports (num_heads, num_key_value_heads) in {_NZ_HEADS}, "
                    f"got {(heads, kv_heads)}")
    if key.shape[4] != _NZ_INT8 or key.shape[2] * _NZ_INT8 != head_dim or head_dim != 128:
        raise _fail(f"int8 NZ KV must be [num_blocks, KV_N, D/32, block_size, 32] with D 128 "
                    f"(the query's D {head_dim}), got {list(key.shape)}")
    block_size = options["block_size"]
    if block_size not in (128, 512) or key.shape[3] != block_size:
        raise _fail(f"int8 NZ KV needs block_size 128 or 512 matching the cache's "
                    f"{key.shape[3]}, got {block_size}")
    if options["inner_precise"] != 1:
        raise _fail("int8 NZ KV supports only the high-performance mode (inner_precise=1), "
                    f"got {options['inner_precise']}")
    if options["sparse_mode"] != 0 or options["atten_mask"] is not None:
        raise _fail("int8 NZ KV with a query S of 1 supports sparse_mode=0 without a mask")
    if options["antiquant_mode"] != 0:
        raise NotInTwinError("antiquant_mode (the combined antiquant_scale's mode) is not "
                             "modelled by the NPU twin")
    modes = (options["key_antiquant_mode"], options["value_antiquant_mode"])
    if modes != (0, 1) and modes[0] != modes[1]:
        # "除了key_antiquant_mode为0并且value_antiquant_mode为1的场景外, 需要与value_antiquant_mode一致"
        raise _fail(f"key_antiquant_mode and value_antiquant_mode must agree, got {modes}")
    if modes != (0, 0):
        raise NotInTwinError(f"kv antiquant modes {modes} are not modelled by the NPU twin "
                             "(only 0: per-channel)")
    scales = (options["key_antiquant_scale"], options["value_antiquant_scale"])
    if (scales[0] is None) != (scales[1] is None):
        # "key_antiquant_scale和value_antiquant_scale要么都为空, 要么都不为空"
        raise _fail("key_antiquant_scale and value_antiquant_scale must both be given or "
                    "neither")
    if scales[0] is None:
        raise NotInTwinError("int8 KV without key/value_antiquant_scale is not modelled by "
                             "the NPU twin")
    if options["key_antiquant_offset"] is not None or options["value_antiquant_offset"] is not None:
        raise _fail("int8 NZ KV does not support key/value_antiquant_offset")
    for name, t in zip(("key_antiquant_scale", "value_antiquant_scale"), scales):
        if t.dtype != torch.bfloat16 or tuple(t.shape) != (kv_heads, 1, head_dim):
            raise _fail(f"per-channel {name} with int8 NZ KV and BNSD must be bfloat16 "
                        f"[KV_N, 1, D] = {[kv_heads, 1, head_dim]}, got {t.dtype} "
                        f"{list(t.shape)}")
    table = options["block_table"]
    if table.dim() != 2 or table.dtype != torch.int32 or table.shape[0] != batch:
        # "block_table必须为二维, 第一维长度需等于B"; "block_table: 数据类型支持int32"
        raise _fail(f"block_table must be 2-d int32 with B = {batch} rows, got "
                    f"{table.dtype} {list(table.shape)}")
    # actual_seq_lengths: "Q_S为1时该参数无效" (vLLM-Ascend passes its TND query ends there;
    # they are ignored). actual_seq_lengths_kv: "page attention场景下, 必须传入", one per batch:
    # "传入长度为1时, 每个Batch使用相同seqlenKv; 传入长度大于等于Batch时取seqlenKv的前Batch个数.
    # 其他长度不支持", each "不大于KV_S"
    lens = options["actual_seq_lengths_kv"]
    if lens is None:
        raise _fail("page attention needs actual_seq_lengths_kv")
    lens = [int(n) for n in lens]
    if len(lens) == 1:
        lens = lens * batch
    elif len(lens) >= batch:
        lens = lens[:batch]
    else:
        raise _fail(f"actual_seq_lengths_kv has {len(lens)} entries for B = {batch}")
    capacity = table.shape[1] * block_size
    if any(n < 0 or n > capacity for n in lens):
        raise _fail(f"actual_seq_lengths_kv {lens} must lie in [0, {capacity}] (the "
                    "block_table's blocks)")
    return batch, kv_heads, head_dim, block_size, lens


def _nz_to_nd(cache: torch.Tensor) -> torch.Tensor:
    """``[num_blocks, KV_N, D/32, block_size, 32]`` -> ``[num_blocks, block_size, KV_N, D]``:
    element (b, h, d1, s, d0) is dim ``d1 * 32 + d0`` of token s, head h."""
    blocks, kv_heads, tiles, block_size, nz = cache.shape
    return cache.permute(0, 3, 1, 2, 4).reshape(blocks, block_size, kv_heads, tiles * nz)


def _reference_c8(query, key, value, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """C8's BNSD call: ``[B, N, 1, D]`` output and ``[B, N, 1, 1]`` lse; batch b's one query
    sees its first ``actual_seq_lengths_kv[b]`` keys, dequantised ``stored * scale`` in fp32."""
    batch, kv_heads, head_dim, _, lens = _c8_checked(query, key, value, options)
    scale = tuple(t.float().reshape(kv_heads, head_dim)
                  for t in (options["key_antiquant_scale"], options["value_antiquant_scale"]))
    out, lse = _attention(query.reshape(batch, -1, head_dim), _nz_to_nd(key), _nz_to_nd(value),
                          options["block_table"].numpy(), np.arange(batch + 1),
                          np.asarray(lens, np.int64), scale=options["scale"], causal=False,
                          kv_scale=scale)
    return out.reshape(query.shape), lse.reshape(query.shape[:3] + (1,))


def _reference(query, key, value, options: dict, sink: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """FIA's result: ``[T, num_heads, D]`` output and ``[T, num_heads, 1]`` lse (BNSD:
    `_reference_c8`; with query_rope, vLLM-Ascend's MLA prefill: `mla_ops.prefill_reference`).
    ``sink``: FIA v2's learnable_sink in float32 (`_attention`)."""
    if mla_ops.is_mla_call(options):
        return mla_ops.prefill_reference(query, key, value, options, _DEFAULTS)
    _check_modelled(options)
    if options["input_layout"] == "BNSD":
        return _reference_c8(query, key, value, options)
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
    if band is not None and len(cu) > 1 and int(np.diff(cu).max()) <= 1:
        # torch_npu 2.10.0.post4 _op_plugin_docs.py, npu_fused_infer_attention_score:
        # pre_tokens / next_tokens "Q_S为1时该参数无效" and sparse_mode "Q_S为1且不带rope输入时该参数
        # 无效": with every request's query one row (TND decode; read as the longest request's
        # query length), the band is not applied and each row sees its whole kv (for one row
        # at the end of its kv, what causal gives too)
        band = None
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
    if options["block_table"] is None:
        return _attention_contiguous(query, key, value, cu, kv, kv_heads, scale=options["scale"],
                                     causal=mode == 3, band=band, sink=sink)
    return _attention(query, key.reshape(cache), value.reshape(cache),
                      options["block_table"].numpy(), cu, kv, scale=options["scale"],
                      causal=mode == 3, band=band, sink=sink)


def _attention_contiguous(query, key, value, cu, kv_ends, kv_heads: int, *, scale: float,
                          causal: bool, band, sink) -> tuple[torch.Tensor, torch.Tensor]:
    """FIA in TND with contiguous K/V (vLLM-Ascend's prefill without a cache,
    ``AscendAttentionState.PrefillNoCache``: ``block_table=None``, key and value ``[T_kv, KV_N,
    D]``, ``actual_seq_lengths_kv`` the cumulative kv ends, sparse_mode 3): `_attention` over
    the rows of each request, read as a cache of one-row blocks.

    Rules, torch_npu 2.10.0.post4 ``_op_plugin_docs.py``, ``npu_fused_infer_attention_score``:
    with TND, actual_seq_lengths and actual_seq_lengths_kv "必须传入", one entry per batch, each
    "当前Batch与之前所有Batch的seqlen和, 因此后一个元素的值必须大于等于前一个元素的值, 且不能出现负
    值" (RuntimeError); key and value must be 3-D ``[T_kv, KV_N, D]`` with the query's D and one
    shape (the same entry's TND limits, "N ... Q_N、K_N、V_N相等", "Q_D、K_D等于192", "数据类型仅
    支持BFLOAT16", and sparse 3's "actual_seq_lengths < actual_seq_lengths_kv", are not enforced,
    as for the paged call: vLLM-Ascend calls this with GQA, D 128 and equal lengths; a V head
    dim other than the query's raises `NotInTwinError`)."""
    name = "npu_fused_infer_attention_score"
    head_dim = query.shape[-1]
    if key.dim() != 3 or key.shape[1] != kv_heads:
        raise RuntimeError(f"{name}: TND key without a block_table must be [T_kv, KV_N="
                           f"{kv_heads}, D], got {list(key.shape)}")
    if tuple(value.shape) != tuple(key.shape) or key.shape[2] != head_dim:
        raise NotInTwinError(f"{name}: key {list(key.shape)} and value {list(value.shape)} "
                             f"with a query D of {head_dim} (different head dims) are not "
                             "modelled by the NPU twin")
    ends = np.concatenate([[0], kv_ends])
    for label, lens in (("actual_seq_lengths", cu), ("actual_seq_lengths_kv", ends)):
        if (np.diff(lens) < 0).any() or (lens < 0).any():
            raise RuntimeError(f"{name}: {label} {lens[1:].tolist()} must be cumulative "
                               "(non-decreasing, non-negative) with input_layout TND")
    if ends[-1] > key.shape[0]:
        raise RuntimeError(f"{name}: actual_seq_lengths_kv ends at {int(ends[-1])}, past the "
                           f"key's {key.shape[0]} rows")
    lengths = np.diff(ends)
    table = np.zeros((len(lengths), max(1, int(lengths.max(initial=0)))), np.int64)
    for r, (start, n) in enumerate(zip(ends[:-1], lengths)):
        table[r, :n] = np.arange(start, start + n)
    rows = (key.shape[0], 1, kv_heads, head_dim)
    return _attention(query, key.reshape(rows), value.reshape(rows), table, cu, lengths,
                      scale=scale, causal=causal, band=band, sink=sink)


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


def _int_lists(options: dict, schema: str) -> dict:
    """The options with each ``SymInt[]`` given as a tensor read as a list of ints, as the
    dispatcher reads one for a schema op (vLLM-Ascend 0.30's ``full_graph_fia_v2`` passes the
    host ``seq_lens`` tensor as ``actual_seq_kvlen``); the workspace queries are plain
    functions here, so they convert it themselves."""
    import re

    names = set(re.findall(r"SymInt\[\]\? (\w+)=", schema))
    return {k: v.tolist() if k in names and isinstance(v, torch.Tensor) else v
            for k, v in options.items()}


def _frozen(options: dict) -> dict:
    """The options as the op sees them when it is issued: device tensors' memory, host lists
    copied (the real op reads them on the host when it is called)."""
    inner = {k: twin.inner(v) for k, v in options.items()}
    return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in inner.items()}


def _issue(query, key, value, options, attention_out, softmax_lse, *,
           op: str = "npu_fused_infer_attention_score", defaults: dict | None = None,
           reference=None) -> None:
    """Queue FIA (``op``) as an AI Core task on the current stream. The options the caller
    passed are checked now, on the host, as the real op's tiling does (C8's and v2's rules;
    the data-dependent ones again when the task runs)."""
    options = {**(_DEFAULTS if defaults is None else defaults), **options}
    reference = _reference if reference is None else reference
    twin.refuse_host_tensors(op, query, key, value, *options.values())
    frozen = _frozen(options)
    q, k, v = twin.inner(query), twin.inner(key), twin.inner(value)
    _precheck(op, q, k, v, frozen)
    out_i, lse_i = twin.inner(attention_out), twin.inner(softmax_lse)

    def run() -> None:
        out, lse = reference(q, k, v, frozen)
        out_i.copy_(out.reshape(out_i.shape))
        if lse_i.numel() == lse.numel():
            lse_i.copy_(lse.reshape(lse_i.shape))
    twin.device().enqueue_aicore(op, run, index=twin.index_of(query))


def _precheck(op: str, query, key, value, options: dict) -> None:
    """The host-side checks of an FIA call (before it is queued)."""
    if op.startswith("npu_fused_infer_attention_score_v2"):
        _v2_checked(query, key, value, options)
        return
    if mla_ops.is_mla_call(options):
        mla_ops.prefill_checked(query, key, value, options, _DEFAULTS)
        return
    _check_modelled(options)
    if options["input_layout"] == "BNSD":
        _c8_checked(query, key, value, options)


def fia(query, key, value, **options):
    if mla_ops.is_mla_call(options):
        # TND with contiguous K/V: the output's D is value's (query_rope holds the rope part)
        attention_out = torch.empty(query.shape[:-1] + value.shape[-1:], dtype=query.dtype,
                                    device=query.device)
    else:
        attention_out = torch.empty_like(query)
    # (T, N, 1) for TND, (B, N, S, 1) for BNSD
    softmax_lse = torch.empty(query.shape[:-1] + (1,), dtype=torch.float32, device=query.device)
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
    options = _int_lists({**_DEFAULTS, **options}, SCHEMA)
    twin.refuse_host_tensors("_npu_fused_infer_attention_score_get_max_workspace", query, key,
                             value, *options.values())
    _precheck("npu_fused_infer_attention_score", twin.inner(query), twin.inner(key),
              twin.inner(value), _frozen(options))
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=query.device)


#: FIA v2's options the twin models beside the tensors (the rest must keep their defaults)
_V2_MODELLED = ("atten_mask", "actual_seq_qlen", "actual_seq_kvlen", "block_table",
                "learnable_sink", "num_query_heads", "num_key_value_heads", "softmax_scale",
                "pre_tokens", "next_tokens", "input_layout", "sparse_mode", "block_size",
                "inner_precise", "return_softmax_lse")


def _v2_checked(query, key, value, options: dict) -> dict:
    """FIA v2's options as FIA v1's (what `_reference` reads), after v2's own rules.

    torch_npu 2.10.0.post4 ``_op_plugin_docs.py``, ``npu_fused_infer_attention_score_v2``:
    ``learnable_sink`` "数据类型支持bfloat16 ... shape输入为(Q_N,)", and "learnable_sink的参数约束
    如下：仅支持TND、NTD_TND；仅支持value的d小于等于128" (RuntimeError). The TND shape rules
    of the same entry (D 128 or 192, bfloat16 only, ``actual_seq_qlen < actual_seq_kvlen`` per
    batch under sparse 3) are not enforced, as for FIA v1: vLLM-Ascend calls it with gpt-oss's
    D 64 and pads a graph batch with requests of q 1 and kv 0 or 1. Every option the twin does
    not model (quantisation, rope, pse, dtypes, inner_precise's row-invalid bit) raises
    `NotInTwinError`, and so does ``return_softmax_lse`` with a sink (whether the lse counts
    the sink is not documented). A call with query_rope / key_rope (vLLM-Ascend's MLA
    decode) is checked by `mla_ops.decode_checked` and returns None."""
    name = "npu_fused_infer_attention_score_v2"
    if mla_ops.is_mla_call(options):
        mla_ops.decode_checked(query, key, value, options, _V2_DEFAULTS)
        return None
    for key_name, default in _V2_DEFAULTS.items():
        if key_name not in _V2_MODELLED and options.get(key_name, default) != default:
            raise NotInTwinError(f"{name}: {key_name} is not modelled by the NPU twin")
    if options["inner_precise"] not in (0, 1):
        raise NotInTwinError(f"{name}: inner_precise {options['inner_precise']} (row-invalid "
                             "correction) is not modelled by the NPU twin")
    sink = options["learnable_sink"]
    if sink is not None:
        if options["input_layout"] not in ("TND", "NTD_TND"):
            raise RuntimeError(f"{name}: learnable_sink needs input_layout TND or NTD_TND, "
                               f"got {options['input_layout']!r}")
        if sink.dtype != torch.bfloat16 or tuple(sink.shape) != (options["num_query_heads"],):
            raise RuntimeError(f"{name}: learnable_sink must be bfloat16 of shape (Q_N,) = "
                               f"({options['num_query_heads']},), got {sink.dtype} "
                               f"{list(sink.shape)}")
        # value's d: its last dim, but a paged 3-D cache is [blocks, block_size, KV_N * D]
        # (vLLM-Ascend's TND call hands that view), so there d is the last dim / KV_N
        kv_heads = options["num_key_value_heads"] or options["num_query_heads"]
        paged_3d = options["block_table"] is not None and value.dim() == 3
        value_d = value.shape[-1] // kv_heads if paged_3d else value.shape[-1]
        if value_d > 128:
            raise RuntimeError(f"{name}: learnable_sink needs value's D <= 128, got {value_d}")
        if options["return_softmax_lse"]:
            raise NotInTwinError(f"{name}: return_softmax_lse with learnable_sink is not "
                                 "modelled by the NPU twin")
    v1 = {**_DEFAULTS, "atten_mask": options["atten_mask"],
          "actual_seq_lengths": options["actual_seq_qlen"],
          "actual_seq_lengths_kv": options["actual_seq_kvlen"],
          "block_table": options["block_table"], "num_heads": options["num_query_heads"],
          "num_key_value_heads": options["num_key_value_heads"],
          "scale": options["softmax_scale"], "pre_tokens": options["pre_tokens"],
          "next_tokens": options["next_tokens"], "input_layout": options["input_layout"],
          "sparse_mode": options["sparse_mode"], "block_size": options["block_size"],
          "inner_precise": options["inner_precise"],
          "softmax_lse_flag": options["return_softmax_lse"]}
    if v1["input_layout"] != "TND":  # C8's BNSD is v1's; v2 is modelled for sinks' TND
        raise NotInTwinError(f"{name}: the twin models input_layout='TND' with a paged KV "
                             "cache only (vLLM-Ascend's full_graph_fia_v2)")
    _check_modelled(v1)
    return v1


def _reference_v2(query, key, value, options: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """FIA v2's result (TND): `_reference` with the learnable sink in float32; MLA decode:
    `mla_ops.decode_reference`."""
    if mla_ops.is_mla_call(options):
        return mla_ops.decode_reference(query, key, value, options, _V2_DEFAULTS)
    v1 = _v2_checked(query, key, value, options)
    sink = options["learnable_sink"]
    return _reference(query, key, value, v1, sink=None if sink is None else sink.float())


def fia_v2(query, key, value, **options):
    """``torch_npu.npu_fused_infer_attention_score_v2`` (`V2_SCHEMA`): ``(attention_out
    [T, Q_N, D] in the query's dtype, softmax_lse float32 [T, Q_N, 1])``; MLA decode
    (query_rope): the output in the layout's order (`mla_ops.decode_out_shape`), the lse
    ``[B, N, S, 1]`` with ``return_softmax_lse``, else empty (torch_npu's meta kernel)."""
    if mla_ops.is_mla_call(options):
        attention_out = torch.empty(mla_ops.decode_out_shape(query, options),
                                    dtype=query.dtype, device=query.device)
        lse_shape = query.shape[:-1] + (1,) if options.get("return_softmax_lse") else (0,)
        softmax_lse = torch.empty(lse_shape, dtype=torch.float32, device=query.device)
    else:
        attention_out = torch.empty_like(query)
        softmax_lse = torch.empty(query.shape[:-1] + (1,), dtype=torch.float32,
                                  device=query.device)
    _issue(query, key, value, options, attention_out, softmax_lse, op=_V2,
           defaults=_V2_DEFAULTS, reference=_reference_v2)
    return attention_out, softmax_lse


def fia_v2_out(query, key, value, *, workspace=None, attention_out, softmax_lse, **options):
    """``npu_fused_infer_attention_score_v2.out`` (`V2_OUT_SCHEMA`): writes the two outputs
    (the workspace is not read: the twin needs none)."""
    _issue(query, key, value, options, attention_out, softmax_lse, op=_V2 + ".out",
           defaults=_V2_DEFAULTS, reference=_reference_v2)
    return attention_out, softmax_lse


def get_max_workspace_v2(query, key, value, **options):
    """``torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace``
    (`V2_WORKSPACE_SCHEMA`): a device workspace for v2's ``.out``, its options checked as v2
    checks them, on the host.

    Raises:
        TypeError: an option the schema does not have.
    """
    unknown = sorted(set(options) - set(_V2_DEFAULTS))
    if unknown:
        raise TypeError(f"_npu_fused_infer_attention_score_v2_get_max_workspace() got "
                        f"unexpected keyword arguments {unknown}")
    options = _int_lists({**_V2_DEFAULTS, **options}, V2_SCHEMA)
    twin.refuse_host_tensors("_npu_fused_infer_attention_score_v2_get_max_workspace", query,
                             key, value, *options.values())
    _v2_checked(twin.inner(query), twin.inner(key), twin.inner(value), _frozen(options))
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=query.device)


_V2 = "npu_fused_infer_attention_score_v2"
_library: torch.library.Library | None = None
_DEFAULTS = {k: v for k, v in _defaults(SCHEMA).items() if k != "workspace"}
_V2_DEFAULTS = _defaults(V2_SCHEMA)


def register() -> torch._ops.OpOverloadPacket:
    """Define ``torch.ops.npu.npu_fused_infer_attention_score`` and ``..._v2`` (once)."""
    global _library
    if _library is None:
        lib = torch.library.Library("npu", "DEF")
        lib.define(SCHEMA)
        lib.define(OUT_SCHEMA)
        lib.impl("npu_fused_infer_attention_score", fia, "PrivateUse1")
        lib.impl("npu_fused_infer_attention_score.out", fia_out, "PrivateUse1")
        lib.define(V2_SCHEMA)
        lib.define(V2_OUT_SCHEMA)
        lib.impl(_V2, fia_v2, "PrivateUse1")
        lib.impl(_V2 + ".out", fia_v2_out, "PrivateUse1")
        _library = lib
    return torch.ops.npu.npu_fused_infer_attention_score


def register_v2() -> torch._ops.OpOverloadPacket:
    """``torch.ops.npu.npu_fused_infer_attention_score_v2`` (defined by `register`)."""
    register()
    return torch.ops.npu.npu_fused_infer_attention_score_v2
