"""The torch_npu ops vLLM-Ascend's MLA attention (``vllm_ascend/attention/mla_v1.py``,
``AscendMLAImpl``) calls on its default path, on the twin, for a DeepSeek-V3-shaped decoder
(``kv_lora_rank`` 512, ``qk_rope_head_dim`` 64, ``qk_nope_head_dim`` = ``v_head_dim`` 128):

* ``npu_interleave_rope`` (``rope_single``: the query's rope part, decode and prefill);
* ``npu_kv_rmsnorm_rope_cache`` (``exec_kv_decode`` / ``exec_kv_prefill``, ``cache_mode="PA"``:
  RMSNorm of the latent, interleaved RoPE of the key's rope part, both scattered into the
  paged caches);
* ``npu_format_cast`` to ND (``process_weights_after_loading`` on ``kv_b_proj``);
* FIA's MLA calls, the same ops as `fia`'s (fia.py routes a call with ``query_rope`` here):
  decode through ``npu_fused_infer_attention_score_v2`` (+ ``.out`` and its workspace query)
  with ``input_layout="BNSD_NBSD"``, paged latent and rope caches (`decode_checked`), and
  prefill through ``npu_fused_infer_attention_score`` with ``input_layout="TND"``, contiguous
  K/V, ``sparse_mode=3`` (`prefill_checked`).

The default path is the same in vLLM-Ascend 0.23.0.post1 and 0.30.0rc2 (no MLAPO: it needs a
KV-consumer instance or quantised weights, ``enabling_mlapo`` in ``attention/utils.py``; no
``enable_kv_nz``; no FA quantisation; no speculative decoding, whose ``TND_NTD`` call is not
modelled). Each op checks what its documentation states, raises ``NotInTwinError`` for what the
twin does not model, runs in float32 and casts to the output dtype, and is queued as an AI Core
task on the current stream of its tensors' device (captured into a graph like any kernel).

Sources: the schemas are the registration strings in torch_npu 2.10.0.post4's
``torch_npu/lib/libtorch_npu.so`` (``npu_interleave_rope`` and ``npu_kv_rmsnorm_rope_cache``
are not in its ``_op_plugin_docs.py``; a test reads them out of the wheel); the rules of those
two are Ascend/op-plugin ``docs/context/torch_npu-npu_interleave_rope.md`` and
``docs/context/torch_npu-npu_kv_rmsnorm_rope_cache.md``, the formula and the slot rule of the
kernel CANN's ops-transformer ``posembedding/kv_rms_norm_rope_cache/op_kernel/
kv_rms_norm_rope_cache_b16_pa.h``; FIA's MLA rules are torch_npu's ``_op_plugin_docs.py``
(``npu_fused_infer_attention_score_v2``: "query_rope和key_rope输入时即为MLA场景").
"""

from __future__ import annotations

import torch

from . import device as twin
from .device import op_refused as _fail
from .npu_module import NotInTwinError

#: torch_npu 2.10.0.post4, ``torch_npu/lib/libtorch_npu.so`` (the registered schemas, verbatim)
INTERLEAVE_ROPE_SCHEMA = "npu_interleave_rope(Tensor x, Tensor cos, Tensor sin) -> Tensor"
KV_RMSNORM_ROPE_CACHE_SCHEMA = (
    "npu_kv_rmsnorm_rope_cache(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, "
    "Tensor k_cache, Tensor ckv_cache, *, Tensor? k_rope_scale=None, Tensor? c_kv_scale=None, "
    "Tensor? k_rope_offset=None, Tensor? c_kv_offset=None, Tensor? v=None, float "
    "epsilon=1e-5, str cache_mode='Norm', bool is_output_kv=False) -> (Tensor, Tensor, "
    "Tensor, Tensor)")
FORMAT_CAST_SCHEMA = ("npu_format_cast(Tensor input, int acl_format, *, int? "
                      "customize_dtype=None, int? input_dtype=None) -> Tensor")

#: the dims the MLA kernels take (op-plugin's npu_kv_rmsnorm_rope_cache doc: "rms_size ...
#: 取值仅支持512", "rope_size ... 取值仅支持64"; npu_interleave_rope: "D维度均必须等于64")
RMS_SIZE = 512
ROPE_SIZE = 64
_HALF = (torch.float16, torch.bfloat16)

#: ``aclFormat`` ACL_FORMAT_ND (CANN ``acl_base.h``), the only format a twin tensor has
ACL_FORMAT_ND = 2


# ---- npu_interleave_rope --------------------------------------------------------------------
def _rope_f32(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved RoPE in float32 on ``[..., 64]``: the pairs (x[2i], x[2i+1]) are first
    de-interleaved into halves, ``q = cat(x[..., ::2], x[..., 1::2])``, then rotated as
    rotate-half RoPE, ``q * cos + cat(-q2, q1) * sin`` (ops-transformer
    ``kv_rms_norm_rope_cache_b16_pa.h``, ``RoPE``: real/imag gathered by GatherMask, ``y0 =
    (real, imag) * cos``, ``y1 = (-imag, real) * sin``; the same formula in op-plugin's
    npu_interleave_rope doc)."""
    x = x.float()
    q = torch.cat((x[..., ::2], x[..., 1::2]), dim=-1)
    half = q.shape[-1] // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return q * cos.float() + rotated * sin.float()


def check_interleave_rope(x, cos, sin) -> None:
    """op-plugin ``docs/context/torch_npu-npu_interleave_rope.md``: x 4-D ``(B, N, S, D)``,
    bfloat16 or float16; cos 4-D ``(B, N, S, D)`` with N 1 and S 1 or x's S, the dtype of x;
    sin as cos; "输入x、cos、sin的D维度均必须等于64"; "cos、sin的N维度必须等于1". The doc
    also says no non-contiguous tensor is supported; vLLM-Ascend passes a strided slice of
    the query (``rope_single`` views ``q_pe``) and torch_npu's aclnn path makes such an input
    contiguous before the kernel, so the twin reads any strides."""
    op = "npu_interleave_rope"
    if x.dim() != 4:
        raise _fail(op, f"x must be 4-D (B, N, S, D), got {list(x.shape)}")
    if x.dtype not in _HALF:
        raise _fail(op, f"x must be bfloat16 or float16, got {x.dtype}")
    batch, _, seq, dim = x.shape
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dim() != 4 or t.dtype != x.dtype:
            raise _fail(op, f"{name} must be 4-D of x's dtype {x.dtype}, got {t.dtype} "
                        f"{list(t.shape)}")
        if t.shape[0] != batch or t.shape[1] != 1 or t.shape[2] not in (1, seq) \
                or t.shape[3] != dim:
            raise _fail(op, f"{name} must be (B, 1, 1 or S, D) = ({batch}, 1, 1 or {seq}, "
                        f"{dim}), got {list(t.shape)}")
    if tuple(cos.shape) != tuple(sin.shape):
        raise _fail(op, f"sin must have cos's shape {list(cos.shape)}, got {list(sin.shape)}")
    if dim != ROPE_SIZE:
        raise _fail(op, f"the D of x, cos and sin must be {ROPE_SIZE}, got {dim}")


def interleave_rope(x, cos, sin):
    """``torch_npu.npu_interleave_rope`` (`INTERLEAVE_ROPE_SCHEMA`): ``x`` ``[B, N, S, 64]``
    bfloat16/float16, ``cos``/``sin`` ``[B, 1, 1 or S, 64]`` of its dtype; returns a new
    ``[B, N, S, 64]`` tensor of x's dtype (float32 math, `_rope_f32`).

    Raises:
        RuntimeError: what the doc forbids (`check_interleave_rope`), at the call.
    """
    op = "npu_interleave_rope"
    twin.refuse_host_tensors(op, x, cos, sin)
    check_interleave_rope(x, cos, sin)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    xi, ci, si, oi = (twin.inner(t) for t in (x, cos, sin, out))

    def run() -> None:
        oi.copy_(_rope_f32(xi, ci, si).to(oi.dtype))
    twin.device().enqueue_aicore(op, run, index=twin.index_of(x), writes=(oi,))
    return out


def _interleave_rope_fake(x, cos, sin):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# ---- npu_kv_rmsnorm_rope_cache --------------------------------------------------------------
#: cache modes the twin models: PA (and its alias PA_BNSD), ``[block_num, block_size, 1, D]``
#: ND caches addressed by a global slot per token (op-plugin's doc, cache_mode table)
_PA_MODES = ("PA", "PA_BNSD")


def check_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache,
                                options: dict) -> None:
    """op-plugin ``docs/context/torch_npu-npu_kv_rmsnorm_rope_cache.md``: kv 4-D ``[B, 1, S,
    576]`` bfloat16/float16; gamma 1-D ``[512]``; cos/sin 4-D ``[B, 1, S, 64]`` (all of kv's
    dtype); index int64; PA modes: ``k_cache [block_num, block_size, 1, 64]``, ``ckv_cache
    [block_num, block_size, 1, 512]``, index ``[B * S]``, "非量化模式 ... k_cache和ckv_cache的
    dtype为bfloat16或float16" (kv's here: the kernel copies kv's dtype into them). The
    quantised mode (``k_rope_scale``/``c_kv_scale``/offsets), the Norm, NZ and block-index
    modes and torch_npu 2.10's ``v`` raise `NotInTwinError`."""
    op = "npu_kv_rmsnorm_rope_cache"
    for name in ("k_rope_scale", "c_kv_scale", "k_rope_offset", "c_kv_offset", "v"):
        if options.get(name) is not None:
            raise NotInTwinError(f"{op}: {name} (the quantised mode, or a separate v) is not "
                                 "modelled by the NPU twin")
    mode = options.get("cache_mode", "Norm")
    if mode not in _PA_MODES:
        raise NotInTwinError(f"{op}: cache_mode {mode!r} is not modelled by the NPU twin "
                             f"(only {_PA_MODES}: vLLM-Ascend's MLA without enable_kv_nz)")
    if kv.dim() != 4 or kv.shape[1] != 1 or kv.shape[3] != RMS_SIZE + ROPE_SIZE:
        raise _fail(op, f"kv must be [batch_size, 1, seq_len, {RMS_SIZE + ROPE_SIZE}], got "
                    f"{list(kv.shape)}")
    if kv.dtype not in _HALF:
        raise _fail(op, f"kv must be bfloat16 or float16, got {kv.dtype}")
    batch, _, seq, _ = kv.shape
    if gamma.dim() != 1 or gamma.shape[0] != RMS_SIZE or gamma.dtype != kv.dtype:
        raise _fail(op, f"gamma must be [{RMS_SIZE}] of kv's dtype {kv.dtype}, got "
                    f"{gamma.dtype} {list(gamma.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (batch, 1, seq, ROPE_SIZE) or t.dtype != kv.dtype:
            raise _fail(op, f"{name} must be [batch_size, 1, seq_len, {ROPE_SIZE}] = "
                        f"{[batch, 1, seq, ROPE_SIZE]} of kv's dtype, got {t.dtype} "
                        f"{list(t.shape)}")
    if index.dtype != torch.int64 or tuple(index.shape) != (batch * seq,):
        raise _fail(op, f"index must be int64 [batch_size * seq_len] = [{batch * seq}] in "
                    f"cache_mode {mode!r}, got {index.dtype} {list(index.shape)}")
    for name, t, size in (("k_cache", k_cache, ROPE_SIZE), ("ckv_cache", ckv_cache, RMS_SIZE)):
        if t.dim() != 4 or t.shape[2] != 1 or t.shape[3] != size:
            raise _fail(op, f"{name} must be [block_num, block_size, 1, {size}] in cache_mode "
                        f"{mode!r}, got {list(t.shape)}")
        if t.dtype != kv.dtype:
            raise _fail(op, f"{name} must be {kv.dtype} (kv's dtype, the non-quantised mode), "
                        f"got {t.dtype}")
    if tuple(k_cache.shape[:2]) != tuple(ckv_cache.shape[:2]):
        raise _fail(op, f"k_cache and ckv_cache must have the same [block_num, block_size], "
                    f"got {list(k_cache.shape[:2])} and {list(ckv_cache.shape[:2])}")


def _rms_norm_f32(x: torch.Tensor, gamma: torch.Tensor, epsilon: float) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * gamma`` in float32 (the kernel's ``RmsNorm``)."""
    x = x.float()
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + epsilon) * gamma.float()


def _scatter(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """Write ``rows[i]`` at global slot ``slots[i]`` of a ``[block_num, block_size, 1, D]``
    cache; a negative slot writes nothing (the kernel's ``if (offset >= 0)``: vLLM's padding
    slot -1). Slots past the cache are the caller's error: the real kernel writes out of
    bounds; the twin refuses them when the task runs."""
    keep = slots >= 0
    slots, rows = slots[keep], rows[keep]
    capacity = cache.shape[0] * cache.shape[1]
    if slots.numel() and int(slots.max()) >= capacity:
        raise RuntimeError(f"npu_kv_rmsnorm_rope_cache: index {int(slots.max())} is past the "
                           f"cache's {capacity} slots")
    block_size = cache.shape[1]
    cache[slots // block_size, slots % block_size, 0] = rows.to(cache.dtype)


def kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, **options):
    """``torch_npu.npu_kv_rmsnorm_rope_cache`` (`KV_RMSNORM_ROPE_CACHE_SCHEMA`), cache modes
    PA / PA_BNSD.

    ``kv [B, 1, S, 576]`` splits into the latent ``[..., :512]`` (RMSNorm with ``gamma`` and
    ``epsilon``) and the rope part ``[..., 512:]`` (interleaved RoPE with ``cos``/``sin``
    ``[B, 1, S, 64]``, `_rope_f32`); token t's rows go to global slot ``index[t]`` of
    ``ckv_cache`` / ``k_cache`` (``[block_num, block_size, 1, 512 / 64]``), negative slots
    skipped. Returns ``(k_cache, ckv_cache, k_embed_out [B, 1, S, 64], y_out [B, 1, S, 512])``:
    the two caches updated in place (the doc: "本质in-place更新") and, with ``is_output_kv``,
    the rope and normed rows in kv's dtype (unwritten otherwise, as the kernel leaves them).
    """
    op = "npu_kv_rmsnorm_rope_cache"
    twin.refuse_host_tensors(op, kv, gamma, cos, sin, index, k_cache, ckv_cache,
                             *(v for v in options.values() if isinstance(v, torch.Tensor)))
    check_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, options)
    epsilon = float(options.get("epsilon", 1e-5))
    output_kv = bool(options.get("is_output_kv", False))
    batch, _, seq, _ = kv.shape
    k_embed = torch.empty((batch, 1, seq, ROPE_SIZE), dtype=kv.dtype, device=kv.device)
    y_out = torch.empty((batch, 1, seq, RMS_SIZE), dtype=kv.dtype, device=kv.device)
    kvi, gi, ci, si, ii, kci, cci, kei, yi = (
        twin.inner(t) for t in (kv, gamma, cos, sin, index, k_cache, ckv_cache, k_embed, y_out))

    def run() -> None:
        normed = _rms_norm_f32(kvi[..., :RMS_SIZE], gi, epsilon).to(kvi.dtype)
        roped = _rope_f32(kvi[..., RMS_SIZE:], ci, si).to(kvi.dtype)
        slots = ii.reshape(-1).long()
        _scatter(kci, slots, roped.reshape(-1, ROPE_SIZE))
        _scatter(cci, slots, normed.reshape(-1, RMS_SIZE))
        if output_kv:
            kei.copy_(roped)
            yi.copy_(normed)
    twin.device().enqueue_aicore(op, run, index=twin.index_of(kv), writes=(kci, cci, kei, yi))
    return k_cache, ckv_cache, k_embed, y_out


def _kv_rmsnorm_rope_cache_fake(kv, gamma, cos, sin, index, k_cache, ckv_cache, **options):
    """torch_npu's own meta kernel (``op_plugin/meta/_meta_registrations.py``): the caches'
    shapes, ``[*kv.shape[:3], cos.size(3)]`` and ``[*kv.shape[:3], gamma.size(0)]``."""
    lead = list(kv.shape[:3])
    return (torch.empty_like(k_cache), torch.empty_like(ckv_cache),
            kv.new_empty(lead + [cos.shape[3]]), kv.new_empty(lead + [gamma.shape[0]]))


# ---- npu_format_cast --------------------------------------------------------------------------
def format_cast(input, acl_format, *, customize_dtype=None, input_dtype=None):
    """``torch_npu.npu_format_cast`` (`FORMAT_CAST_SCHEMA`) to ``ACL_FORMAT_ND`` (2): a twin
    tensor is always ND, and torch_npu returns its input unchanged when it already has the
    format asked for (op-plugin ``FormatCastKernelNpu.cpp``: "if the format is the same,
    return the input"). vLLM-Ascend's MLA calls it so on ``kv_b_proj``'s weight; any other
    format (NZ: 29) raises `NotInTwinError`."""
    if not isinstance(input, torch.Tensor) or input.device.type != "npu":
        raise TypeError("npu_format_cast expects an npu tensor")
    if customize_dtype is not None or input_dtype is not None:
        raise NotInTwinError("npu_format_cast: customize_dtype / input_dtype are not modelled "
                             "by the NPU twin")
    if int(acl_format) != ACL_FORMAT_ND:
        raise NotInTwinError(f"npu_format_cast to acl_format {acl_format} is not modelled by "
                             "the NPU twin (its tensors are ND, format 2, only)")
    return input


# ---- FIA's MLA calls ------------------------------------------------------------------------
#: FIA v2's options an MLA decode call may set (the rest must keep their defaults)
_DECODE_OPTIONS = ("query_rope", "key_rope", "atten_mask", "actual_seq_qlen",
                   "actual_seq_kvlen", "block_table", "num_query_heads",
                   "num_key_value_heads", "softmax_scale", "pre_tokens", "next_tokens",
                   "input_layout", "sparse_mode", "block_size", "inner_precise",
                   "return_softmax_lse")
#: layouts of the MLA decode the twin models: the query BNSD, the output BNSD or NBSD
_DECODE_LAYOUTS = ("BNSD", "BNSD_NBSD")
#: query N the doc allows with rope and D 512 ("n为1/2/4/8/16/32/64/128")
_MLA_HEADS = (1, 2, 4, 8, 16, 32, 64, 128)


def _fia_fail(name: str, message: str) -> RuntimeError:
    return RuntimeError(f"{name}: {message}")


def _same_dtype(name: str, what: str, t: torch.Tensor, like: torch.Tensor, of: str) -> None:
    if t.dtype != like.dtype:
        # "query_rope的数据类型、数据格式与query一致。key_rope的数据类型、数据格式与key一致。"
        raise _fia_fail(name, f"{what} must have {of}'s dtype {like.dtype}, got {t.dtype}")


def decode_checked(query, key, value, options: dict, defaults: dict) -> list[int]:
    """The rules of FIA v2's MLA decode call; returns the per-batch kv lengths.

    torch_npu 2.10.0.post4 ``_op_plugin_docs.py``, ``npu_fused_infer_attention_score_v2``,
    MLA with query D 512: query_rope and key_rope both given or neither, each of its
    tensor's dtype; "query的s为1-16、n为1/2/4/8/16/32/64/128，query_rope的shape中d为64";
    "key的n为1，d为512，keyRope的shape中d为64"; "必须开启PageAttention，此时block_size支持
    16、128"; "Q_S等于1时只支持sparse=0且不传mask". What those forbid raises RuntimeError.
    Modelled: ``input_layout`` BNSD or BNSD_NBSD (vLLM-Ascend's call without enable_kv_nz),
    query S 1, paged ND caches ``[block_num, 1, block_size, D]`` (the BNSD view vLLM-Ascend
    makes), float16/bfloat16; the rest (S > 1, NZ caches, TND, quantisation, other options)
    raises `NotInTwinError`.
    """
    name = "npu_fused_infer_attention_score_v2"
    for key_name, default in defaults.items():
        if key_name not in _DECODE_OPTIONS and options.get(key_name, default) != default:
            raise NotInTwinError(f"{name}: {key_name} with query_rope (MLA) is not modelled "
                                 "by the NPU twin")
    q_rope, k_rope = options["query_rope"], options["key_rope"]
    if (q_rope is None) != (k_rope is None):
        raise _fia_fail(name, "query_rope and key_rope must be given together or not at all")
    layout = options["input_layout"]
    if layout not in _DECODE_LAYOUTS:
        raise NotInTwinError(f"{name}: MLA with input_layout {layout!r} is not modelled by "
                             f"the NPU twin (only {_DECODE_LAYOUTS}: vLLM-Ascend's decode "
                             "without enable_kv_nz or speculative decoding)")
    if options["inner_precise"] not in (0, 1):
        raise NotInTwinError(f"{name}: inner_precise {options['inner_precise']} is not "
                             "modelled by the NPU twin")
    if query.dim() != 4:
        raise _fia_fail(name, f"input_layout {layout} needs a 4-d query [B, N, S, D], got "
                        f"{list(query.shape)}")
    batch, heads, q_len, dim = query.shape
    if query.dtype not in _HALF:
        raise NotInTwinError(f"{name}: an MLA query of {query.dtype} (quantised) is not "
                             "modelled by the NPU twin")
    if dim != RMS_SIZE:
        raise NotInTwinError(f"{name}: MLA decode with query D {dim} is not modelled (D 512: "
                             "vLLM-Ascend's absorbed decode)")
    if q_len != 1:
        raise NotInTwinError(f"{name}: MLA with a query S of {q_len} (MTP: sparse_mode 3 and a "
                             "mask) is not modelled by the NPU twin")
    if heads not in _MLA_HEADS or options["num_query_heads"] != heads:
        raise _fia_fail(name, f"num_query_heads {options['num_query_heads']} must equal the "
                        f"query's N {heads}, one of {_MLA_HEADS}")
    _same_dtype(name, "query_rope", q_rope, query, "query")
    if tuple(q_rope.shape) != (batch, heads, q_len, ROPE_SIZE):
        raise _fia_fail(name, f"query_rope must be {[batch, heads, q_len, ROPE_SIZE]} (query's "
                        f"B, N, S and D 64), got {list(q_rope.shape)}")
    if key.dim() != 4 or key.shape[1] != 1 or key.shape[3] != RMS_SIZE:
        if key.dim() == 5:
            raise NotInTwinError(f"{name}: MLA with NZ caches [blockNum, KV_N, D/16, "
                                 "blockSize, 16] is not modelled by the NPU twin")
        raise _fia_fail(name, f"key must be the paged cache [block_num, 1, block_size, "
                        f"{RMS_SIZE}] (KV_N 1, D 512), got {list(key.shape)}")
    if tuple(value.shape) != tuple(key.shape) or value.dtype != key.dtype:
        raise _fia_fail(name, f"value must have key's shape and dtype {list(key.shape)} "
                        f"{key.dtype}, got {list(value.shape)} {value.dtype}")
    if key.dtype != query.dtype:
        raise NotInTwinError(f"{name}: a {key.dtype} cache with a {query.dtype} query is not "
                             "modelled by the NPU twin")
    _same_dtype(name, "key_rope", k_rope, key, "key")
    if tuple(k_rope.shape) != tuple(key.shape[:3]) + (ROPE_SIZE,):
        raise _fia_fail(name, f"key_rope must be {list(key.shape[:3]) + [ROPE_SIZE]} (key's "
                        f"dims and D 64), got {list(k_rope.shape)}")
    if (options["num_key_value_heads"] or heads) != 1:
        raise _fia_fail(name, f"MLA needs num_key_value_heads 1, got "
                        f"{options['num_key_value_heads']}")
    table = options["block_table"]
    if table is None:
        raise _fia_fail(name, "MLA with query D 512 must use page attention (block_table)")
    block_size = options["block_size"]
    if block_size not in (16, 128) or key.shape[2] != block_size:
        raise _fia_fail(name, f"MLA page attention needs block_size 16 or 128 matching the "
                        f"cache's {key.shape[2]}, got {block_size}")
    if table.dim() != 2 or table.dtype != torch.int32 or table.shape[0] < batch:
        raise _fia_fail(name, f"block_table must be 2-d int32 with at least B = {batch} rows, "
                        f"got {table.dtype} {list(table.shape)}")
    if options["sparse_mode"] != 0 or options["atten_mask"] is not None:
        raise _fia_fail(name, "MLA with a query S of 1 supports only sparse_mode=0 without a "
                        "mask")
    lens = options["actual_seq_kvlen"]
    if lens is None:
        raise _fia_fail(name, "page attention needs actual_seq_kvlen")
    lens = [int(n) for n in lens]
    if len(lens) == 1:
        lens = lens * batch
    elif len(lens) >= batch:
        lens = lens[:batch]
    else:
        raise _fia_fail(name, f"actual_seq_kvlen has {len(lens)} entries for B = {batch}")
    capacity = table.shape[1] * block_size
    if any(n < 0 or n > capacity for n in lens):
        raise _fia_fail(name, f"actual_seq_kvlen {lens} must lie in [0, {capacity}] (the "
                        "block_table's blocks)")
    return lens


def decode_out_shape(query, options: dict) -> tuple[int, ...]:
    """The attention output's shape: ``[B, N, S, D]`` for BNSD, ``[N, B, S, D]`` for
    BNSD_NBSD (torch_npu's meta kernel: the layout after the underscore)."""
    batch, heads, q_len, dim = query.shape
    if options.get("input_layout") == "BNSD_NBSD":
        return heads, batch, q_len, dim
    return batch, heads, q_len, dim


def decode_reference(query, key, value, options: dict, defaults: dict
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decode in float32: batch b's query row sees its first ``actual_seq_kvlen[b]``
    cache rows through ``block_table[b]``; ``score = (q . k + q_rope . k_rope) * scale``,
    output ``softmax(score) @ value`` (zeros for a batch with no keys). Returns the output in
    the call's layout (`decode_out_shape`) and the lse ``[B, N, S, 1]`` (empty unless
    ``return_softmax_lse``)."""
    lens = decode_checked(query, key, value, options, defaults)
    batch, heads, _, dim = query.shape
    block_size = key.shape[2]
    table = options["block_table"]
    out = torch.zeros(batch, heads, 1, dim, dtype=torch.float32)
    lse = torch.zeros(batch, heads, 1, 1, dtype=torch.float32)
    for b, kv_len in enumerate(lens):
        if kv_len == 0:
            continue
        blocks = table[b, : -(-kv_len // block_size)].long()
        k = key[blocks, 0].reshape(-1, dim)[:kv_len].float()
        v = value[blocks, 0].reshape(-1, dim)[:kv_len].float()
        kr = options["key_rope"][blocks, 0].reshape(-1, ROPE_SIZE)[:kv_len].float()
        q, qr = query[b, :, 0].float(), options["query_rope"][b, :, 0].float()
        score = (q @ k.T + qr @ kr.T) * float(options["softmax_scale"])
        m = score.logsumexp(-1, keepdim=True)
        out[b, :, 0] = (score - m).exp() @ v
        lse[b, :, 0] = m
    if options["input_layout"] == "BNSD_NBSD":
        out = out.permute(1, 0, 2, 3)
    if not options["return_softmax_lse"]:
        lse = torch.empty(0)
    return out.to(query.dtype).contiguous(), lse


#: FIA v1 options an MLA prefill call may set beside the tensors
_PREFILL_OPTIONS = ("query_rope", "key_rope", "atten_mask", "actual_seq_lengths",
                    "actual_seq_lengths_kv", "block_table", "num_heads", "num_key_value_heads",
                    "scale", "pre_tokens", "next_tokens", "input_layout", "sparse_mode",
                    "block_size", "inner_precise", "softmax_lse_flag", "antiquant_mode")


def _cumulative(name: str, what: str, values, rows: int) -> list[int]:
    if values is None:
        raise _fia_fail(name, f"TND needs {what} (cumulative per batch)")
    ends = [int(n) for n in values]
    if any(b < a for a, b in zip([0] + ends, ends)) or (ends and ends[-1] > rows):
        raise _fia_fail(name, f"{what} {ends} must be non-decreasing cumulative lengths within "
                        f"the {rows} rows (each entry the sum of the batches so far)")
    return ends


def prefill_checked(query, key, value, options: dict, defaults: dict
                    ) -> tuple[list[int], list[int]]:
    """The rules of FIA v1's MLA prefill call (TND, contiguous K/V, query_rope/key_rope);
    returns the cumulative query and kv ends.

    torch_npu 2.10.0.post4 ``_op_plugin_docs.py``: query_rope and key_rope together, each of
    its tensor's dtype; for FIA v2 (the same aclnn operator) with rope and a query D of 128:
    "inputLayout：TND、NTD_TND", "query_rope的shape中d为64，其余维度与query一致",
    "keyRope的shape中d为64，其余维度与key一致", "不支持...page attention", and the TND rules:
    "Q_D、K_D、V_D等于128" with rope, "K_N、V_N相等，Q_N整除K_N，Q_N与K_N的比值不能大于64",
    "数据类型仅支持BFLOAT16", "sparse模式仅支持sparse=0且不传mask，或sparse=3且传入mask",
    "actual_seq_qlen和actual_seq_kvlen必须传入 ... 后一个元素的值必须大于等于前一个元素的值".
    The doc's "sparse=3时，要求每个batch单独的actual_seq_qlen<actual_seq_kvlen" is not
    enforced: vLLM-Ascend's prefill passes equal query and kv lengths (as for FIA's TND decode
    in fia.py). Options the twin does not model raise `NotInTwinError`.
    """
    name = "npu_fused_infer_attention_score"
    for key_name, default in defaults.items():
        if key_name not in _PREFILL_OPTIONS and options.get(key_name, default) != default:
            raise NotInTwinError(f"{name}: {key_name} with query_rope (MLA) is not modelled by "
                                 "the NPU twin")
    if options["antiquant_mode"] != 0 or options["inner_precise"] not in (0, 1):
        raise NotInTwinError(f"{name}: antiquant_mode / inner_precise with query_rope are not "
                             "modelled by the NPU twin")
    q_rope, k_rope = options["query_rope"], options["key_rope"]
    if (q_rope is None) != (k_rope is None):
        raise _fia_fail(name, "query_rope and key_rope must be given together or not at all")
    if options["input_layout"] != "TND" or options["block_table"] is not None:
        raise NotInTwinError(f"{name}: MLA with input_layout {options['input_layout']!r} or "
                             "page attention is not modelled by the NPU twin (TND with "
                             "contiguous K/V: vLLM-Ascend's MLA prefill; decode is FIA v2)")
    for what, t in (("query", query), ("key", key), ("value", value), ("query_rope", q_rope),
                    ("key_rope", k_rope)):
        if t.dim() != 3:
            raise _fia_fail(name, f"TND needs a 3-d {what} [T, N, D], got {list(t.shape)}")
        if t.dtype != torch.bfloat16:
            raise _fia_fail(name, f"TND supports bfloat16 only, got {what} {t.dtype}")
    rows, heads, dim = query.shape
    if dim != 128 or key.shape[2] != 128 or value.shape[2] != 128:
        raise _fia_fail(name, f"TND with query_rope needs Q_D, K_D and V_D 128, got "
                        f"{dim}, {key.shape[2]}, {value.shape[2]}")
    if key.shape[:2] != value.shape[:2]:
        raise _fia_fail(name, f"key and value must have the same T and N, got "
                        f"{list(key.shape)} and {list(value.shape)}")
    kv_heads = options["num_key_value_heads"] or options["num_heads"]
    if options["num_heads"] != heads or key.shape[1] != kv_heads:
        raise _fia_fail(name, f"num_heads {options['num_heads']} and num_key_value_heads "
                        f"{kv_heads} must be the query's and key's N {heads}, {key.shape[1]}")
    if heads % kv_heads or heads // kv_heads > 64:
        raise _fia_fail(name, f"Q_N {heads} must be a multiple of K_N {kv_heads}, at most 64 "
                        "times it")
    if tuple(q_rope.shape) != (rows, heads, ROPE_SIZE):
        raise _fia_fail(name, f"query_rope must be {[rows, heads, ROPE_SIZE]}, got "
                        f"{list(q_rope.shape)}")
    if tuple(k_rope.shape) != tuple(key.shape[:2]) + (ROPE_SIZE,):
        raise _fia_fail(name, f"key_rope must be {list(key.shape[:2]) + [ROPE_SIZE]}, got "
                        f"{list(k_rope.shape)}")
    mode, mask = options["sparse_mode"], options["atten_mask"]
    if mode not in (0, 3) or (mode == 0) != (mask is None):
        raise _fia_fail(name, f"TND supports sparse_mode 0 without a mask or 3 with one, got "
                        f"sparse_mode {mode} {'with' if mask is not None else 'without'} a mask")
    if mode == 3 and tuple(mask.shape) != (2048, 2048):
        raise _fia_fail(name, "sparse_mode 3 needs the compressed causal atten_mask of shape "
                        "(2048, 2048)")
    q_ends = _cumulative(name, "actual_seq_lengths", options["actual_seq_lengths"], rows)
    kv_ends = _cumulative(name, "actual_seq_lengths_kv", options["actual_seq_lengths_kv"],
                          key.shape[0])
    if len(q_ends) != len(kv_ends):
        raise _fia_fail(name, f"actual_seq_lengths and actual_seq_lengths_kv must have one "
                        f"entry per batch, got {len(q_ends)} and {len(kv_ends)}")
    return q_ends, kv_ends


def prefill_reference(query, key, value, options: dict, defaults: dict
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA prefill in float32: request r's query rows ``q_ends[r-1]:q_ends[r]`` attend to
    its kv rows ``kv_ends[r-1]:kv_ends[r]`` with ``score = (q . k + q_rope . k_rope) *
    scale`` per query head (grouped over the kv heads), causal aligned to the end of the kv
    under sparse_mode 3. Returns ``[T, N, D]`` in the query's dtype (rows of no request zero)
    and the lse ``[T, N, 1]`` float32."""
    q_ends, kv_ends = prefill_checked(query, key, value, options, defaults)
    rows, heads, _ = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = float(options["scale"])
    out = torch.zeros(rows, heads, value.shape[2], dtype=torch.float32)
    lse = torch.zeros(rows, heads, 1, dtype=torch.float32)
    for q0, q1, k0, k1 in zip([0] + q_ends, q_ends, [0] + kv_ends, kv_ends):
        if q1 == q0 or k1 == k0:
            continue
        q = query[q0:q1].float().reshape(q1 - q0, kv_heads, group, -1)
        qr = options["query_rope"][q0:q1].float().reshape(q1 - q0, kv_heads, group, -1)
        k, kr = key[k0:k1].float(), options["key_rope"][k0:k1].float()
        s = (torch.einsum("qhgd,khd->hgqk", q, k) +
             torch.einsum("qhgd,khd->hgqk", qr, kr)) * scale
        if options["sparse_mode"] == 3:
            at = (k1 - k0) - (q1 - q0) + torch.arange(q1 - q0)  # each query's kv position
            s = s.masked_fill(torch.arange(k1 - k0)[None, :] > at[:, None], float("-inf"))
        m = s.logsumexp(-1, keepdim=True)
        p = (s - m).exp().nan_to_num(0.0)  # a row that sees no key: zeros
        o = torch.einsum("hgqk,khd->qhgd", p, value[k0:k1].float())
        out[q0:q1] = o.reshape(q1 - q0, heads, -1)
        lse[q0:q1] = m.permute(2, 0, 1, 3).reshape(q1 - q0, heads, 1)
    return out.to(query.dtype), lse


def is_mla_call(options: dict) -> bool:
    """An FIA call with rope inputs: vLLM-Ascend's MLA (handled here, not by fia.py)."""
    return options.get("query_rope") is not None or options.get("key_rope") is not None


# ---- registration -------------------------------------------------------------------------
_library: torch.library.Library | None = None


def register() -> None:
    """Define ``torch.ops.npu.npu_interleave_rope`` and ``npu_kv_rmsnorm_rope_cache`` (once):
    the twin's kernels for PrivateUse1 and fake kernels for Dynamo."""
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("npu", "FRAGMENT")
    lib.define(INTERLEAVE_ROPE_SCHEMA)
    lib.define(KV_RMSNORM_ROPE_CACHE_SCHEMA)
    lib.impl("npu_interleave_rope", interleave_rope, "PrivateUse1")
    lib.impl("npu_kv_rmsnorm_rope_cache", kv_rmsnorm_rope_cache, "PrivateUse1")
    torch.library.register_fake("npu::npu_interleave_rope", _interleave_rope_fake, lib=lib)
    torch.library.register_fake("npu::npu_kv_rmsnorm_rope_cache", _kv_rmsnorm_rope_cache_fake,
                                lib=lib)
    _library = lib


def install(module) -> None:
    """Expose the MLA ops on the torch_npu stand-in ``module``."""
    register()
    module.npu_interleave_rope = torch.ops.npu.npu_interleave_rope
    module.npu_kv_rmsnorm_rope_cache = torch.ops.npu.npu_kv_rmsnorm_rope_cache
    module.npu_format_cast = format_cast
