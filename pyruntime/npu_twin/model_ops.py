"""The torch_npu ops a dense decoder's forward calls on vLLM-Ascend (a Qwen3-shaped model: q/k
RMSNorm, GQA, SwiGLU MLP, rope), at TP 1 without our hook, on 0.23.0.post1 and 0.30.0rc2.

Which op each release calls (read from the releases' sources, ``vllm_ascend/`` of each
vLLM environment; docs/npu-twin.md has the table):

* ``npu_rms_norm`` (``ops/layernorm.py``, ``AscendRMSNorm.forward_oot`` without a residual:
  the input/post-attention norms' first call and Qwen3's q/k norms on ``[T, heads, D]``), both.
* ``npu_add_rms_norm`` (the same, with a residual, when ``enable_custom_op()`` is false: 0.23's
  path without ``vllm_ascend_C``; 0.30 imports ``vllm_ascend_C`` and calls ``_C_ascend
  .npu_add_rms_norm_bias`` instead: an op of the ``vllm_ascend_C`` twin, not of torch_npu).
* ``npu_swiglu`` (``ops/activation.py``, ``AscendSiluAndMul``), both.
* rope (``ops/rotary_embedding.py``, ``rope_forward_oot``): with Triton it is vLLM-Ascend's own
  Triton kernel (no torch_npu op); without it 0.23 calls the ATB op ``_npu_rotary_embedding``
  (in place) and 0.30 ``npu_mrope`` (``mrope_section=[0, 0, 0]``, ``cache_mode="default"``).
* the KV write (``device/device_op.py``, ``BaseDeviceAdaptor.reshape_and_cache``): 0.23 calls
  the ATB op ``_npu_reshape_and_cache``, 0.30 ``npu_scatter_pa_kv_cache(cache_mode="Norm")``
  on caches that are block-strided views (docs/hook-in-vllm-ascend.md, "Which KV caches arrive
  strided").
* ``_npu_matmul_add_fp32`` (``worker/worker.py``, ``NPUWorker._warm_up_atb``), both.

Schemas: the ones the torch_npu 2.10.0.post4 wheel registers, verbatim: ``npu::`` ops from the
strings of ``torch_npu/lib/libtorch_npu.so`` (``_op_plugin_docs.py`` documents the same
prototypes, naming the first argument ``self`` where the library says ``input``), ATB ops
(``torch.ops.atb``, which ``torch_npu/op_plugin/atb/_atb_ops.py`` sets on ``torch_npu``) from
``torch_npu/lib/libop_plugin_atb.so``; tests/twin/test_model_ops.py reads both from the wheel.
Rules: the ``_op_plugin_docs.py`` entry of each op (cited at each check); the ATB ops have no
entry there (``_atb_api_docs.py`` documents none of the three), so only their C++ signatures
(``op_plugin/include/AtbOpsInterface.h`` in the wheel) and shape consistency are checked, and
what the twin cannot tell raises `NotInTwinError`. Output shapes follow the wheel's meta
kernels (``torch_npu/op_plugin/meta/_meta_registrations.py``), which are also the fake kernels
here (``torch.library.register_fake``), so FakeTensor and Dynamo can trace the ops.

Numerics: each op is computed in float32 on the host and cast to its output dtype. Each runs as
one AI Core task on the current stream of its tensors' device (queued, captured, replayed like
any kernel; `pyruntime.npu_twin.fia`'s pattern), with its shape and dtype checks on the host
when it is issued and its data-dependent checks (positions, slots) when the task runs, where
the device would fault (the error surfaces at the next synchronisation).
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch

from . import device as twin
from .npu_module import NotInTwinError

#: torch_npu 2.10.0.post4, the schemas ``libtorch_npu.so`` registers (namespace ``npu``)
NPU_SCHEMAS = {
    "npu_rms_norm": "npu_rms_norm(Tensor input, Tensor gamma, float epsilon=1e-06) -> "
                    "(Tensor, Tensor)",
    "npu_add_rms_norm": "npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float "
                        "epsilon=1e-06) -> (Tensor, Tensor, Tensor)",
    "npu_swiglu": "npu_swiglu(Tensor input, int dim=-1) -> Tensor",
    "npu_mrope": "npu_mrope(Tensor positions, Tensor query, Tensor key, Tensor cos_sin_cache, "
                 "int head_size, *, int[]? mrope_section=None, str? rotary_mode='half', str? "
                 "cache_mode='default') -> (Tensor, Tensor)",
    "npu_scatter_pa_kv_cache": "npu_scatter_pa_kv_cache(Tensor key, Tensor value, Tensor(a!) "
                               "key_cache, Tensor(b!) value_cache, Tensor slot_mapping, *, "
                               "Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, "
                               "Tensor? seq_lens=None, str? cache_mode='PA_NZ') -> ()",
}
#: torch_npu 2.10.0.post4, the schemas ``libop_plugin_atb.so`` registers (namespace ``atb``)
ATB_SCHEMAS = {
    "_npu_rotary_embedding": "_npu_rotary_embedding(Tensor positions, Tensor(a!) query, "
                             "Tensor(b!) key, int head_size, Tensor cos_sin_cache, bool "
                             "is_neox_style) -> ()",
    "_npu_reshape_and_cache": "_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) "
                              "key_cache, Tensor(b!) value_cache, Tensor slot_indices) -> ()",
    "_npu_matmul_add_fp32": "_npu_matmul_add_fp32(Tensor x, Tensor weight, Tensor(a!) C) -> ()",
}

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
_HALVES = (torch.float16, torch.bfloat16)


class ModelOpError(RuntimeError):
    """A call that torch_npu's documented rules refuse (the message names the op and rule)."""


def _fail(op: str, message: str) -> ModelOpError:
    return ModelOpError(f"{op}: {message}")


# ---- issuing -------------------------------------------------------------------------------
def _on_device(op: str, **tensors: torch.Tensor | None) -> int:
    """The device index of the op's tensors; a host tensor is refused as a pointer the AI Core
    cannot read (`twin.HostPointerError`), tensors of two devices as torch refuses them."""
    found = set()
    for name, t in tensors.items():
        if t is None:
            continue
        if t.device.type != "npu":
            raise twin.HostPointerError(f"{op}: {name} is a {t.device.type} tensor; every "
                                        "tensor must be on the NPU")
        found.add(t.device.index or 0)
    if len(found) > 1:
        raise RuntimeError(f"{op}: Expected all tensors to be on the same device, but found "
                           f"at least two devices, npu:{min(found)} and npu:{max(found)}!")
    return found.pop()


def _dtype(op: str, name: str, t: torch.Tensor, allowed: tuple) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise _fail(op, f"{name} must be one of {names}, got {t.dtype}")


# ---- RMSNorm ---------------------------------------------------------------------------------
def _rstd_shape(x: torch.Tensor, gamma: torch.Tensor) -> list[int]:
    """The wheel's meta kernel: x's leading dims, 1 for each dim gamma normalises over."""
    lead = x.dim() - gamma.dim()
    return [n if i < lead else 1 for i, n in enumerate(x.shape)]


def _check_norm(op: str, gamma: torch.Tensor, **xs: torch.Tensor) -> None:
    """torch_npu 2.10.0.post4 ``_op_plugin_docs.py``, ``npu_rms_norm``: "self: ... 支持float16、
    bfloat16、float32，输入shape支持2-8维" and "gamma: 数据类型需要和self保持一致 ... 通常为self
    的最后一维" (the meta kernel normalises over gamma's dims, the trailing dims of x). The
    same entry's "gamma ... 输入shape支持2-8维" is not enforced: it contradicts "通常为self的最后
    一维", and vLLM-Ascend passes a 1-D weight."""
    for name, x in xs.items():
        _dtype(op, name, x, _FLOATS)
        if not 2 <= x.dim() <= 8:
            raise _fail(op, f"{name} must have 2 to 8 dims, got {list(x.shape)}")
        if gamma.dtype != x.dtype:
            raise _fail(op, f"gamma must have {name}'s dtype {x.dtype}, got {gamma.dtype}")
        if gamma.dim() > x.dim() or tuple(x.shape[x.dim() - gamma.dim():]) != tuple(gamma.shape):
            raise _fail(op, f"gamma {list(gamma.shape)} must be the trailing dims of {name} "
                        f"{list(x.shape)}")
    shapes = {tuple(x.shape) for x in xs.values()}
    if len(shapes) > 1:
        raise _fail(op, f"{' and '.join(xs)} must have one shape, got {sorted(shapes)}")


def rms_norm_reference(x: torch.Tensor, gamma: torch.Tensor, epsilon: float
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, rstd)`` in float32: ``rstd = 1 / sqrt(mean(x^2) + epsilon)`` over gamma's dims
    (shape `_rstd_shape`), ``y = x * rstd * gamma``."""
    xf = x.float()
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(xf.square().mean(dim=dims, keepdim=True) + epsilon)
    return xf * rstd * gamma.float(), rstd


def npu_rms_norm(input: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-06):
    """``torch_npu.npu_rms_norm``: ``(y, rstd)``; y in input's dtype and shape ([..., D] with
    gamma [D] for vLLM-Ascend's norms, [T, heads, D] for Qwen3's q/k norms), rstd float32 of
    `_rstd_shape`."""
    op = "npu_rms_norm"
    index = _on_device(op, input=input, gamma=gamma)
    _check_norm(op, gamma, input=input)
    y = torch.empty(input.shape, dtype=input.dtype, device=input.device)
    rstd = torch.empty(_rstd_shape(input, gamma), dtype=torch.float32, device=input.device)
    x_i, g_i, y_i, r_i = (twin.inner(t) for t in (input, gamma, y, rstd))

    def run() -> None:
        out, r = rms_norm_reference(x_i, g_i, epsilon)
        y_i.copy_(out)
        r_i.copy_(r)
    twin.device().enqueue_aicore(op, run, index=index, writes=(y, rstd))
    return y, rstd


def npu_add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                     epsilon: float = 1e-06):
    """``torch_npu.npu_add_rms_norm``: ``(y, rstd, x)`` with ``x = x1 + x2`` (the new residual,
    in x1's dtype) and ``(y, rstd) = npu_rms_norm(x, gamma)``; the sum is kept in float32 for
    the norm (fp32 reference), and rounded once for the residual output. Shapes as the
    wheel's meta kernel: y and x like x1, rstd float32 of `_rstd_shape`. The rules are
    npu_rms_norm's (the wheel documents no entry of its own; the meta kernel and vLLM-Ascend's
    call have x1, x2 of one shape and dtype)."""
    op = "npu_add_rms_norm"
    index = _on_device(op, x1=x1, x2=x2, gamma=gamma)
    _check_norm(op, gamma, x1=x1, x2=x2)
    if x2.dtype != x1.dtype:
        raise _fail(op, f"x1 and x2 must have one dtype, got {x1.dtype} and {x2.dtype}")
    y = torch.empty(x1.shape, dtype=x1.dtype, device=x1.device)
    rstd = torch.empty(_rstd_shape(x1, gamma), dtype=torch.float32, device=x1.device)
    x = torch.empty(x1.shape, dtype=x1.dtype, device=x1.device)
    a_i, b_i, g_i, y_i, r_i, x_i = (twin.inner(t) for t in (x1, x2, gamma, y, rstd, x))

    def run() -> None:
        total = a_i.float() + b_i.float()
        out, r = rms_norm_reference(total, g_i, epsilon)
        y_i.copy_(out)
        r_i.copy_(r)
        x_i.copy_(total)
    twin.device().enqueue_aicore(op, run, index=index, writes=(y, rstd, x))
    return y, rstd, x


# ---- SwiGLU ----------------------------------------------------------------------------------
def npu_swiglu(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``torch_npu.npu_swiglu``: ``silu(A) * B`` where A, B are the first and second halves of
    input along `dim` (vLLM's SiluAndMul: gate then up); output in input's dtype, dim halved.

    torch_npu 2.10.0.post4 ``_op_plugin_docs.py``: "x: shape支持1-8维，dtype支持FP32、FP16或
    BF16"; "A和B是x沿dim维度切分的Tensor" (an odd length cannot be split in two halves: refused,
    as ``npu_geglu``'s meta kernel refuses it; the swiglu meta kernel floors it)."""
    op = "npu_swiglu"
    index = _on_device(op, input=input)
    _dtype(op, "input", input, _FLOATS)
    if not 1 <= input.dim() <= 8:
        raise _fail(op, f"input must have 1 to 8 dims, got {list(input.shape)}")
    if not -input.dim() <= dim < input.dim():
        raise _fail(op, f"dim {dim} is out of range for {input.dim()} dims")
    if input.shape[dim] % 2:
        raise _fail(op, f"input's dim {dim} ({input.shape[dim]}) must split in two halves")
    shape = list(input.shape)
    shape[dim] //= 2
    out = torch.empty(shape, dtype=input.dtype, device=input.device)
    x_i, o_i = twin.inner(input), twin.inner(out)

    def run() -> None:
        a, b = x_i.float().chunk(2, dim=dim)
        o_i.copy_(torch.nn.functional.silu(a) * b)
    twin.device().enqueue_aicore(op, run, index=index, writes=(out,))
    return out


# ---- rope ------------------------------------------------------------------------------------
def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int,
                   neox: bool) -> torch.Tensor:
    """Rope of ``x [T, heads * head_size]`` in float32: the first ``rotary_dim = 2 *
    cos.shape[-1]`` dims of each head rotate (cos, sin ``[T, rotary_dim / 2]``), the rest pass.
    ``neox``: rotate_half (pairs ``(i, i + rotary_dim / 2)``), else rotate_interleaved (pairs
    ``(2i, 2i + 1)``)."""
    tokens = x.shape[0]
    half = cos.shape[-1]
    heads = x.float().reshape(tokens, -1, head_size).clone()
    rot = heads[..., : 2 * half]
    c, s = cos.float()[:, None, :], sin.float()[:, None, :]
    if neox:
        a, b = rot[..., :half].clone(), rot[..., half:].clone()
        rot[..., :half], rot[..., half:] = a * c - b * s, b * c + a * s
    else:
        a, b = rot[..., 0::2].clone(), rot[..., 1::2].clone()
        rot[..., 0::2], rot[..., 1::2] = a * c - b * s, b * c + a * s
    return heads.reshape(x.shape)


def _cos_sin(op: str, cache: torch.Tensor, positions: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows `positions` of a ``[max_seq_len, rotary_dim]`` cache laid out ``[cos | sin]``;
    a position outside the cache is the device fault "当输入tensor positions中值域超过
    cosSinCache的0维maxSeqLen，会有越界报错" (npu_mrope's docs), raised when the task runs."""
    pos = positions.long()
    if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= cache.shape[0]):
        raise _fail(op, f"positions range [{int(pos.min())}, {int(pos.max())}] is out of the "
                    f"cos_sin_cache's {cache.shape[0]} rows (an out-of-bounds read on the "
                    "device)")
    rows = cache.float()[pos]
    half = cache.shape[-1] // 2
    return rows[:, :half], rows[:, half:]


#: npu_mrope's rotary_mode values (``_op_plugin_docs.py``: "'half'表示rotate_half(GPT-NeoX
#: style)计算模式，'interleave'表示rotate_interleaved(GPT-J style)计算模式")
_MROPE_MODES = {"half": True, "interleave": False}


def npu_mrope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
              cos_sin_cache: torch.Tensor, head_size: int, *, mrope_section=None,
              rotary_mode: str | None = "half", cache_mode: str | None = "default"):
    """``torch_npu.npu_mrope`` in rope mode (positions 1-D): ``(query_out, key_out)``, new
    tensors of query's and key's shape and dtype (the wheel's meta kernel), each head's first
    ``rotary_dim = cos_sin_cache.shape[-1]`` dims rotated, the rest passed through.

    Args:
        positions: int32/int64 ``[T]``.
        query: ``[T, heads_q * head_size]``; key: ``[T, heads_k * head_size]``.
        cos_sin_cache: ``[max_seq_len, rotary_dim]``, each row ``[cos | sin]``
            (cache_mode ``'default'``, "三段式拼接").

    Rules, torch_npu 2.10.0.post4 ``_op_plugin_docs.py``, ``npu_mrope``: positions "维度为1D
    或2D ... 数据类型支持INT32、INT64"; query, key, cos_sin_cache "只支持2维shape输入", dtypes
    "BFLOAT16、FLOAT16、FLOAT32"; "当输入是BFLOAT16或FLOAT16时，rotary_dim要求是32的倍数，当输入
    是FLOAT32时，rotary_dim要求是16的倍数"; rotary_mode 'half' or 'interleave'. The mrope mode
    (positions ``[3, T]`` with a non-zero mrope_section) and cache_mode ``'interleave'`` are not
    modelled (`NotInTwinError`); vLLM-Ascend passes ``mrope_section=[0, 0, 0]``, "默认值为不使能
    mrope模式(即rope模式)输入为[0, 0, 0]".
    """
    op = "npu_mrope"
    index = _on_device(op, positions=positions, query=query, key=key,
                       cos_sin_cache=cos_sin_cache)
    _dtype(op, "positions", positions, (torch.int32, torch.int64))
    if positions.dim() == 2 or any(mrope_section or ()):
        raise NotInTwinError(f"{op}: the mrope mode (positions [3, T], a non-zero "
                             "mrope_section) is not modelled by the NPU twin")
    if positions.dim() != 1:
        raise _fail(op, f"positions must be 1-D or 2-D, got {list(positions.shape)}")
    if cache_mode not in (None, "default"):
        raise NotInTwinError(f"{op}: cache_mode {cache_mode!r} is not modelled by the NPU twin "
                             "(only 'default')")
    if rotary_mode not in _MROPE_MODES:
        raise _fail(op, f"rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    for name, t in (("query", query), ("key", key), ("cos_sin_cache", cos_sin_cache)):
        _dtype(op, name, t, _FLOATS)
        if t.dim() != 2:
            raise _fail(op, f"{name} must be 2-D, got {list(t.shape)}")
    if key.dtype != query.dtype or cos_sin_cache.dtype != query.dtype:
        raise _fail(op, f"query, key and cos_sin_cache must have one dtype, got {query.dtype}, "
                    f"{key.dtype} and {cos_sin_cache.dtype}")
    rotary_dim = cos_sin_cache.shape[1]
    multiple = 32 if query.dtype in _HALVES else 16
    if rotary_dim % multiple:
        raise _fail(op, f"rotary_dim (cos_sin_cache's last dim, {rotary_dim}) must be a "
                    f"multiple of {multiple} for {query.dtype}")
    if head_size <= 0 or rotary_dim > head_size:
        raise _fail(op, f"head_size {head_size} must hold the rotary_dim {rotary_dim}")
    for name, t in (("query", query), ("key", key)):
        if t.shape[0] != positions.shape[0] or t.shape[1] % head_size:
            raise _fail(op, f"{name} must be [numTokens={positions.shape[0]}, heads * "
                        f"head_size={head_size}], got {list(t.shape)}")
    q_out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    k_out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
    p_i, q_i, k_i, c_i, qo_i, ko_i = (twin.inner(t) for t in
                                      (positions, query, key, cos_sin_cache, q_out, k_out))
    neox = _MROPE_MODES[rotary_mode]

    def run() -> None:
        cos, sin = _cos_sin(op, c_i, p_i)
        qo_i.copy_(rope_reference(q_i, cos, sin, head_size, neox))
        ko_i.copy_(rope_reference(k_i, cos, sin, head_size, neox))
    twin.device().enqueue_aicore(op, run, index=index, writes=(q_out, k_out))
    return q_out, k_out


def npu_rotary_embedding_atb(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                             head_size: int, cos_sin_cache: torch.Tensor,
                             is_neox_style: bool) -> None:
    """``torch_npu._npu_rotary_embedding`` (ATB, ``torch.ops.atb``): rope of query ``[T,
    heads_q * head_size]`` and key ``[T, heads_k * head_size]`` in place, as vLLM-Ascend 0.23's
    ``rope_forward_oot`` calls it without Triton (the whole head rotates: for a partial rotary
    dim it passes the rotary slices with ``head_size=rotary_dim``).

    The wheel documents no rule for ATB ops; checked here: npu tensors, query and key 2-D of
    one float dtype with cos_sin_cache's ``[max_seq_len, head_size]`` (the cache's rotary dim
    equal to head_size, the only call vLLM-Ascend makes: other widths raise `NotInTwinError`),
    positions int32/int64 ``[T]``; out-of-range positions fault when the task runs."""
    op = "_npu_rotary_embedding"
    index = _on_device(op, positions=positions, query=query, key=key,
                       cos_sin_cache=cos_sin_cache)
    _dtype(op, "positions", positions, (torch.int32, torch.int64))
    for name, t in (("query", query), ("key", key), ("cos_sin_cache", cos_sin_cache)):
        _dtype(op, name, t, _FLOATS)
        if t.dim() != 2:
            raise _fail(op, f"{name} must be 2-D, got {list(t.shape)}")
    if key.dtype != query.dtype or cos_sin_cache.dtype != query.dtype:
        raise _fail(op, f"query, key and cos_sin_cache must have one dtype, got {query.dtype}, "
                    f"{key.dtype} and {cos_sin_cache.dtype}")
    if cos_sin_cache.shape[1] != head_size:
        raise NotInTwinError(f"{op}: a cos_sin_cache of rotary dim {cos_sin_cache.shape[1]} "
                             f"with head_size {head_size} is not modelled by the NPU twin")
    if positions.dim() != 1:
        raise _fail(op, f"positions must be 1-D [T], got {list(positions.shape)}")
    for name, t in (("query", query), ("key", key)):
        if t.shape[0] != positions.shape[0] or t.shape[1] % head_size:
            raise _fail(op, f"{name} must be [T={positions.shape[0]}, heads * head_size="
                        f"{head_size}], got {list(t.shape)}")
        if not t.is_contiguous():
            raise NotInTwinError(f"{op}: a non-contiguous {name} (written in place) is not "
                                 "modelled by the NPU twin")
    p_i, q_i, k_i, c_i = (twin.inner(t) for t in (positions, query, key, cos_sin_cache))

    def run() -> None:
        cos, sin = _cos_sin(op, c_i, p_i)
        q_new = rope_reference(q_i, cos, sin, head_size, bool(is_neox_style))
        k_new = rope_reference(k_i, cos, sin, head_size, bool(is_neox_style))
        q_i.copy_(q_new)
        k_i.copy_(k_new)
    twin.device().enqueue_aicore(op, run, index=index, writes=(query, key))


# ---- KV cache writes -----------------------------------------------------------------------
def _page_dense(cache: torch.Tensor) -> bool:
    """Each block of a ``[blocks, block_size, heads, D]`` cache is one dense page (the blocks
    themselves may be strided: vLLM-Ascend 0.30's K and V pages side by side)."""
    _, block_size, heads, dim = cache.shape
    want = (heads * dim, dim, 1)
    return all(n == 1 or s == w for n, s, w in zip(cache.shape[1:], cache.stride()[1:], want)) \
        and (cache.shape[0] == 1 or cache.stride(0) >= block_size * heads * dim)


def _check_kv_write(op: str, key, value, key_cache, value_cache, slots, slot_name: str) -> None:
    """The shared rules of the Norm (ND) KV writes: key and value ``[T, heads, D]`` (D may
    differ between them), caches ``[blocks, block_size, heads, D]`` of their dtype, slots
    int32/int64 ``[T]``; torch_npu 2.10.0.post4 ``_op_plugin_docs.py``,
    ``npu_scatter_pa_kv_cache``: "key、value、key_cache、value_cache的数据类型必须一致", "当key和
    value都是3维，则key和value的前两维shape必须相同", "key_cache ... 只支持4维", slot_mapping
    "数据类型支持int32和int64"."""
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3:
            raise _fail(op, f"{name} must be 3-D [T, heads, D], got {list(t.shape)}")
    for name, t in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype != key.dtype:
            raise _fail(op, f"key, value, key_cache and value_cache must have one dtype, got "
                        f"key {key.dtype} and {name} {t.dtype}")
    if key.shape[:2] != value.shape[:2]:
        raise _fail(op, f"key and value must agree in their first two dims, got "
                    f"{list(key.shape)} and {list(value.shape)}")
    for name, cache, src in (("key_cache", key_cache, key), ("value_cache", value_cache, value)):
        if cache.dim() != 4:
            raise _fail(op, f"{name} must be 4-D [blocks, block_size, heads, D], got "
                        f"{list(cache.shape)}")
        if tuple(cache.shape[2:]) != tuple(src.shape[1:]):
            raise _fail(op, f"{name} {list(cache.shape)} must hold rows of "
                        f"{list(src.shape[1:])}")
    if key_cache.shape[:2] != value_cache.shape[:2]:
        raise _fail(op, f"key_cache and value_cache must have one [blocks, block_size], got "
                    f"{list(key_cache.shape)} and {list(value_cache.shape)}")
    _dtype(op, slot_name, slots, (torch.int32, torch.int64))
    if slots.dim() != 1 or slots.shape[0] != key.shape[0]:
        raise _fail(op, f"{slot_name} must be 1-D with one slot per token ({key.shape[0]}), "
                    f"got {list(slots.shape)}")


def _write_slots(op: str, key, value, key_cache, value_cache, slots,
                 skip_negative: bool = False) -> None:
    """``cache[slot // block_size, slot % block_size] = row`` through the caches' own strides
    (inner tensors). With `skip_negative` a negative slot writes nothing (vLLM's padding slot
    -1: what the kernels of ``npu_scatter_pa_kv_cache`` and ATB's ``_npu_reshape_and_cache``
    do, see there). A slot past ``blocks *
    block_size - 1`` ("slot_mapping的值范围[0,num_blocks*block_size-1]"), or a negative one
    without `skip_negative`, is an out-of-bounds write on the device: raised here."""
    blocks, block_size = key_cache.shape[:2]
    slot = slots.long()
    if skip_negative:
        kept = slot >= 0
        slot, key, value = slot[kept], key[kept], value[kept]
    if slot.numel() and (int(slot.min()) < 0 or int(slot.max()) >= blocks * block_size):
        raise _fail(op, f"slots range [{int(slot.min())}, {int(slot.max())}] is outside "
                    f"[0, {blocks * block_size - 1}] (an out-of-bounds write on the device)")
    block, row = slot // block_size, slot % block_size
    key_cache[block, row] = key
    value_cache[block, row] = value


def npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *,
                            compress_lens=None, compress_seq_offsets=None, seq_lens=None,
                            cache_mode: str | None = "PA_NZ") -> None:
    """``torch_npu.npu_scatter_pa_kv_cache`` with ``cache_mode="Norm"`` (场景二, vLLM-Ascend
    0.30's ``BaseDeviceAdaptor.reshape_and_cache``): writes key/value ``[T, heads, D]`` into
    ``[blocks, block_size, heads, D]`` caches at ``slot_mapping`` (int32/int64 ``[T]``), in
    place.

    The docs say "输入参数不支持非连续"; vLLM-Ascend 0.30 hands block-strided cache views (each
    block a dense page, K and V pages side by side in one allocation), which the twin writes
    through their strides (the write lands where a contiguous page-by-page kernel would put it;
    hardware has not confirmed it). Other non-contiguous caches and non-contiguous key, value
    or slot_mapping are refused. ``'PA_NZ'`` (the default, NZ caches) and the compress
    arguments (场景三) are not modelled (`NotInTwinError`)."""
    op = "npu_scatter_pa_kv_cache"
    index = _on_device(op, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                       slot_mapping=slot_mapping, compress_lens=compress_lens,
                       compress_seq_offsets=compress_seq_offsets, seq_lens=seq_lens)
    if cache_mode not in (None, "Norm"):
        raise NotInTwinError(f"{op}: cache_mode {cache_mode!r} (NZ caches) is not modelled by "
                             "the NPU twin; only 'Norm' (ND caches)")
    if any(t is not None for t in (compress_lens, compress_seq_offsets, seq_lens)):
        raise NotInTwinError(f"{op}: compress_lens / compress_seq_offsets / seq_lens (the "
                             "compressed cache) are not modelled by the NPU twin")
    _check_kv_write(op, key, value, key_cache, value_cache, slot_mapping, "slot_mapping")
    for name, t in (("key", key), ("value", value), ("slot_mapping", slot_mapping)):
        if not t.is_contiguous():
            raise _fail(op, f"{name} must be contiguous (\"输入参数不支持非连续\")")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if not _page_dense(t):
            raise _fail(op, f"{name} must be contiguous or block-strided with dense pages, got "
                        f"stride {list(t.stride())} for {list(t.shape)}")
    tensors = [twin.inner(t) for t in (key, value, key_cache, value_cache, slot_mapping)]
    # a negative slot is skipped: CANN ops-transformer attention/scatter_pa_kv_cache/op_kernel/
    # scatter_pa_kv_cache_normal_siso.h (Process, ProcessFullyLoad): "if (slotValue < 0)
    # { continue; }" per token. vLLM pads slot_mapping with PAD_SLOT_ID -1, and vLLM-Ascend
    # 0.30's reshape_and_cache (attention_v1.py) writes the padded tokens of the dummy batches
    # it warms up and captures (num_actual_tokens is the padded count there)
    twin.device().enqueue_aicore(
        op, lambda: _write_slots(op, *tensors, skip_negative=True), index=index,
        writes=(key_cache, value_cache))


def npu_reshape_and_cache_atb(key, value, key_cache, value_cache, slot_indices) -> None:
    """``torch_npu._npu_reshape_and_cache`` (ATB, ``torch.ops.atb``): vLLM-Ascend 0.23's KV write
    (``BaseDeviceAdaptor.reshape_and_cache``; its caches are contiguous). The wheel documents no
    rule for it; the twin checks `_check_kv_write`'s shapes and dtypes (ATB's ReshapeAndCache
    takes int32 slots: int64 raises `NotInTwinError`) and writes as `npu_scatter_pa_kv_cache`
    does, refusing caches that are not dense pages."""
    op = "_npu_reshape_and_cache"
    index = _on_device(op, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                       slot_indices=slot_indices)
    _check_kv_write(op, key, value, key_cache, value_cache, slot_indices, "slot_indices")
    if slot_indices.dtype != torch.int32:
        raise NotInTwinError(f"{op}: slot_indices of {slot_indices.dtype} is not modelled by the "
                             "NPU twin (vLLM-Ascend passes int32)")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if not _page_dense(t):
            raise _fail(op, f"{name} must be contiguous or block-strided with dense pages")
    tensors = [twin.inner(t) for t in (key, value, key_cache, value_cache, slot_indices)]
    # a negative slot is skipped, as by npu_scatter_pa_kv_cache: ATB's kernel
    # (hicann/ascend-transformer-boost src/kernels/mixkernels/reshape_and_cache/op_kernel/
    # reshape_and_cache_nd.cpp, ProcessKVEqual / ProcessKVUnequalIncrement: "if (slotValue < 0)
    # continue;"); vLLM-Ascend 0.23's capture warm-up writes padded slots -1 through it
    twin.device().enqueue_aicore(
        op, lambda: _write_slots(op, *tensors, skip_negative=True), index=index,
        writes=(key_cache, value_cache))


# ---- ATB warm-up matmul ----------------------------------------------------------------------
def npu_matmul_add_fp32_atb(x: torch.Tensor, weight: torch.Tensor, C: torch.Tensor) -> None:
    """``torch_npu._npu_matmul_add_fp32`` (ATB): ``C += x^T @ weight`` in float32, in place
    (x ``[k, m]``, weight ``[k, n]`` float16/bfloat16 of one dtype, C float32 ``[m, n]``), as
    ``NPUWorker._warm_up_atb`` calls it (x, weight ``[2, 4]`` float16, C ``[4, 4]`` float32)."""
    op = "_npu_matmul_add_fp32"
    index = _on_device(op, x=x, weight=weight, C=C)
    _dtype(op, "x", x, _HALVES)
    if weight.dtype != x.dtype:
        raise _fail(op, f"x and weight must have one dtype, got {x.dtype} and {weight.dtype}")
    _dtype(op, "C", C, (torch.float32,))
    if x.dim() != 2 or weight.dim() != 2 or C.dim() != 2 or x.shape[0] != weight.shape[0] \
            or tuple(C.shape) != (x.shape[1], weight.shape[1]):
        raise _fail(op, f"x [k, m], weight [k, n] and C [m, n] do not fit: {list(x.shape)}, "
                    f"{list(weight.shape)}, {list(C.shape)}")
    x_i, w_i, c_i = (twin.inner(t) for t in (x, weight, C))

    def run() -> None:
        c_i.add_(x_i.float().t() @ w_i.float())
    twin.device().enqueue_aicore(op, run, index=index, writes=(C,))


# ---- fake kernels (the wheel's meta kernels) ----------------------------------------------
def _fake_rms_norm(input, gamma, epsilon=1e-06):
    return (torch.empty_like(input),
            input.new_empty(_rstd_shape(input, gamma), dtype=torch.float32))


def _fake_add_rms_norm(x1, x2, gamma, epsilon=1e-06):
    return (torch.empty_like(x1), x1.new_empty(_rstd_shape(x1, gamma), dtype=torch.float32),
            torch.empty_like(x1))


def _fake_swiglu(input, dim=-1):
    shape = list(input.shape)
    shape[dim] //= 2
    return input.new_empty(shape)


def _fake_mrope(positions, query, key, cos_sin_cache, head_size, *, mrope_section=None,
                rotary_mode="half", cache_mode="default"):
    return torch.empty_like(query), torch.empty_like(key)


def _fake_in_place(*args, **kwargs) -> None:
    return None


#: op name -> (namespace, implementation, fake kernel)
OPS: dict[str, tuple[str, Callable, Callable]] = {
    "npu_rms_norm": ("npu", npu_rms_norm, _fake_rms_norm),
    "npu_add_rms_norm": ("npu", npu_add_rms_norm, _fake_add_rms_norm),
    "npu_swiglu": ("npu", npu_swiglu, _fake_swiglu),
    "npu_mrope": ("npu", npu_mrope, _fake_mrope),
    "npu_scatter_pa_kv_cache": ("npu", npu_scatter_pa_kv_cache, _fake_in_place),
    "_npu_rotary_embedding": ("atb", npu_rotary_embedding_atb, _fake_in_place),
    "_npu_reshape_and_cache": ("atb", npu_reshape_and_cache_atb, _fake_in_place),
    "_npu_matmul_add_fp32": ("atb", npu_matmul_add_fp32_atb, _fake_in_place),
}

# ---- arange: the rope cache a model builds on the device ------------------------------------
def arange(start, end=None, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``aten::arange`` (its three functional overloads) on the NPU: vLLM builds each rotary
    layer's ``cos_sin_cache`` with ``torch.arange`` while the model is created under ``with
    torch.device("npu")`` (the engine probe's step 15). torch's composite kernel allocates an
    empty tensor and resizes it in ``arange.start_out``, which the wrapper twin does not model
    (it sizes device memory when it allocates); here the size and values come from the host
    scalars, as torch_npu's ``arange`` kernel computes its output size on the host, and the
    values are written by one AI Core task on the current stream (frozen scalars at capture,
    re-written at every replay)."""
    values = torch.arange(start, end, step, dtype=dtype) if end is not None \
        else torch.arange(start, dtype=dtype)
    out = torch.empty(values.shape, dtype=values.dtype, device=device or "npu")
    target = twin.inner(out)
    twin.device().enqueue_aicore("aten::arange", lambda: target.copy_(values),
                                 index=out.device.index or 0, writes=(out,), kind="op")
    return out


def _arange_end(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(end, dtype=dtype, layout=layout, device=device, pin_memory=pin_memory)


#: aten overload -> PrivateUse1 kernel
ARANGE_OVERLOADS = {"arange": _arange_end, "arange.start": arange, "arange.start_step": arange}

_libraries: dict[str, torch.library.Library] = {}


def register() -> None:
    """Define every op of `OPS` (``torch.ops.npu.*``, ``torch.ops.atb.*``) with its PrivateUse1
    kernel and its fake kernel (once per process)."""
    if _libraries:
        return
    libraries = {ns: torch.library.Library(ns, "FRAGMENT") for ns in ("npu", "atb")}
    for name, (namespace, impl, fake) in OPS.items():
        lib = libraries[namespace]
        lib.define((NPU_SCHEMAS if namespace == "npu" else ATB_SCHEMAS)[name])
        lib.impl(name, impl, "PrivateUse1")
        torch.library.register_fake(f"{namespace}::{name}", fake, lib=lib)
    # aten's arange, unless a tensor layer registers its own (the plain layer's fallback)
    aten = torch.library.Library("aten", "IMPL")
    for overload, kernel in ARANGE_OVERLOADS.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{overload}",
                                                               "PrivateUse1"):
            aten.impl(overload, kernel, "PrivateUse1")
    libraries["aten"] = aten
    _libraries.update(libraries)


def register_atb_extensions() -> None:
    """``torch_npu.op_plugin.atb._atb_ops._register_atb_extensions`` (vLLM-Ascend's
    ``NPUWorker.__init__`` calls it; ``worker/worker.py`` imports it at module top): torch_npu
    loads ``libop_plugin_atb.so`` and sets the ATB ops on ``torch_npu`` from ``torch.ops.atb``
    (``_patch_atb_ops``), once (``lru_cache``). On the twin the ops are registered when it
    activates, so this registers nothing new; it sets the same names again."""
    import sys

    register()
    module = sys.modules.get("torch_npu")
    for name, (namespace, _, _) in OPS.items():
        if namespace == "atb" and module is not None:
            setattr(module, name, getattr(torch.ops.atb, name))


def install(module: types.ModuleType,
            package: Callable[[str], types.ModuleType] | None = None) -> None:
    """Register the ops and set them on the torch_npu stand-in `module` as torch_npu has them:
    ``torch_npu.npu_*`` the ``torch.ops.npu`` packets, ``torch_npu._npu_*`` (ATB) the
    ``torch.ops.atb`` packets (``_atb_ops.py``'s ``_patch_atb_ops``).

    With `package` (the stand-in's placeholder-module factory), also the package
    ``torch_npu.op_plugin.atb._atb_ops`` with `register_atb_extensions` (every other name of
    it a placeholder), set on `module` and in ``sys.modules`` so that ``from
    torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions`` imports."""
    import sys

    register()
    for name, (namespace, _, _) in OPS.items():
        setattr(module, name, getattr(getattr(torch.ops, namespace), name))
    if package is None:
        return
    chain = [package(f"{module.__name__}.op_plugin"),
             package(f"{module.__name__}.op_plugin.atb"),
             package(f"{module.__name__}.op_plugin.atb._atb_ops")]
    chain[-1]._register_atb_extensions = register_atb_extensions
    parent = module
    for child in chain:
        setattr(parent, child.__name__.rsplit(".", 1)[1], child)
        sys.modules[child.__name__] = child
        parent = child
