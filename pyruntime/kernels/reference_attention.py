"""The reference attention (the AI Core role) on CPU torch tensors.

A thin, checked wrapper over ``aicpu_kernels/attention_ref.h``: :func:`attention_core` runs
what one AI Core does with its range of a tiling, :func:`attention_finalize` merges split-KV
pieces by log-sum-exp and zeroes the padding rows. Running ``attention_core`` for every core
(in any order, or concurrently: the C call releases the GIL) and then ``attention_finalize``
computes one attention layer::

    import torch
    from pyruntime import tiling
    from pyruntime.kernels import reference_attention as ra

    params = tiling.TilingParams(num_q_heads=8, num_kv_heads=2, head_dim=64, block_size=16,
                                 max_batch=4, max_tokens=8, max_blocks_per_req=8, num_cores=4)
    cu = torch.tensor([0, 1, 4], dtype=torch.int32)            # 2 live requests: 1 + 3 tokens
    kv = torch.tensor([40, 20], dtype=torch.int32)             # kv lengths incl. these tokens
    plan = tiling.plan(params, cu.numpy(), kv.numpy(), causal=True)
    block_table = torch.arange(32, dtype=torch.int32).reshape(4, 8)      # [max_batch, blocks]
    q = torch.randn(8, 8, 64, dtype=torch.bfloat16)                      # [max_tokens, Hq, D]
    k = torch.randn(32, 16, 2, 64, dtype=torch.bfloat16)                 # [blocks, bs, Hkv, D]
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    po, pl = ra.partial_buffers(params)                                  # float32 workspace
    for core in range(params.num_cores):
        ra.attention_core(params, plan, core, query=q, key_cache=k, value_cache=v,
                          block_table=block_table, cu_seqlens_q=cu, seqlens_kv=kv, out=out,
                          partial_out=po, partial_lse=pl, scale=64**-0.5, causal=True)
    assert ra.attention_finalize(params, plan, cu_seqlens_q=cu, out=out, partial_out=po,
                                 partial_lse=pl) == ra.OK              # rows 4..7 are zero

``logits_soft_cap=C`` (every entry point; None, the default, is off) caps each score
``s = scale * q . k`` to ``C * tanh(s / C)`` before the softmax (`pyruntime.kernels.soft_cap`);
with it off the C code runs exactly as it does without the argument. ``sinks`` (None, the
default, is off) is a float32 ``[num_q_heads]`` tensor of attention-sink logits (gpt-oss): pass
the same tensor to the cores and to :func:`attention_finalize` (attention_ref.h, WHAT A ROW
COMPUTES). ``sliding_window=W`` (every core entry point; None, the default, is off, 0 is
refused; causal only) lets the query at position p see only the keys ``p - W < j <= p``
(`pyruntime.kernels.sliding_window`); the cores read no kv block below a unit's window, whatever
blocks the tiling gives them, and :class:`BlockLog` records the blocks they read.
``kv_scales=(k_scale, k_offset, v_scale, v_offset)`` (every core entry point; None, the
default, is off) makes the caches int8, a stored x meaning ``(x - offset) * scale`` per kv head
and dim (`pyruntime.kernels.kv_quant`, vLLM-Ascend's C8); the cores dequantise in fp32. int8
caches may be 4-D ND or 5-D NZ ``[num_blocks, num_kv_heads, head_dim // 32, block_size, 32]``
(vLLM-Ascend's C8 layout; the rank tells, `kv_quant.cache_layout`), with bit-identical results.

For graph mode, :class:`BoundAttention` checks the static buffers once and then launches
each core or the combine step with a single C call (a few microseconds of Python).

When ``num_cores`` is a multiple of ``num_kv_heads`` the tiling cuts every kv head alike, and
:func:`attention_core_siblings` / :meth:`BoundAttention.core_siblings` run a head-0 core and
its copies for the other heads in one call that reads each token's K and V of all heads
together (faster on CPU); running sets ``0 .. num_sibling_sets(params) - 1`` runs every core.
For any P and H, :meth:`BoundAttention.core_span` runs a span of consecutive cores in one call
that reads each token's K and V of the span's heads together.

The inner kernels run in the best instruction-set variant the CPU supports ("avx512",
"avx2" or "portable", chosen at import); set ``AICPU_TILING_ATTENTION_ISA`` to force one, or
call :func:`select_isa`. :func:`isa_variants` reports the active and the supported ones.

Both functions return the C status (an int) instead of raising, because in the graph runtime
they run as device tasks whose failures surface later through ``check()``: ``OK`` (0), the
tiling's own status when the tiling is not OK (the core did nothing; finalize zeroed every
row), or one of :data:`E_TILING`, :data:`E_BLOCK_ID`. Python-side misuse (wrong type, dtype,
shape, device, contiguity) raises ``TypeError`` / ``ValueError`` before any C code runs.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from pyruntime import tiling as _tiling
from pyruntime.kernels import kv_quant as _kv_quant
from pyruntime.kernels import sliding_window as _sliding_window
from pyruntime.kernels import soft_cap as _soft_cap

# pyruntime.tiling is the one importer of the cffi module; take ffi/lib from it.
_ffi = getattr(_tiling, "_ffi", None) or _tiling.ffi
_lib = getattr(_tiling, "_lib", None) or _tiling.lib

OK: int = 0
E_ARGS: int = _lib.AICPU_ATTENTION_E_ARGS
E_TILING: int = _lib.AICPU_ATTENTION_E_TILING
E_BLOCK_ID: int = _lib.AICPU_ATTENTION_E_BLOCK_ID

#: Storage dtype -> the C dtype code. Accumulation is always float32.
#: the sink dtypes both consumers take: float32, or the model dtypes gpt-oss keeps its sinks in
#: (vLLM builds the model under set_default_torch_dtype, so a bf16 model has bf16 sinks)
SINK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: _lib.AICPU_ATTENTION_FP32,
    torch.float16: _lib.AICPU_ATTENTION_FP16,
    torch.bfloat16: _lib.AICPU_ATTENTION_BF16,
}

#: Environment variable read at import: forces an instruction-set variant by name.
ISA_ENV = "AICPU_TILING_ATTENTION_ISA"
#: Every variant name the C code knows, in order of preference from last to first.
ISA_NAMES: tuple[str, ...] = tuple(
    _ffi.string(_lib.aicpu_attention_isa_name(i)).decode()
    for i in range(_lib.AICPU_ATTENTION_NUM_ISA)
)


class AttentionIsaError(ValueError):
    """An instruction-set variant is unknown, or this build and CPU cannot run it."""


def isa_variants() -> dict[str, object]:
    """The variants: ``{"active": name, "best": name, "supported": [names]}``."""
    return {
        "active": ISA_NAMES[_lib.aicpu_attention_isa_active()],
        "best": ISA_NAMES[_lib.aicpu_attention_isa_best()],
        "supported": [n for i, n in enumerate(ISA_NAMES) if _lib.aicpu_attention_isa_supported(i)],
    }


def select_isa(name: str | None = None) -> str:
    """Run the inner kernels in variant ``name`` from the next core call on; returns it.

    ``None`` means ``$AICPU_TILING_ATTENTION_ISA`` when set (and not empty), else the best
    variant this CPU supports. Process-wide: call it before starting concurrent cores.

    Raises:
        AttentionIsaError: ``name`` is not one of :data:`ISA_NAMES`, or this CPU (or build)
            cannot run it; the active variant is unchanged.
    """
    source = "select_isa()"
    if name is None:
        name = os.environ.get(ISA_ENV, "").strip() or None
        source = ISA_ENV
    if name is None:
        isa = _lib.aicpu_attention_isa_best()
    elif name in ISA_NAMES:
        isa = ISA_NAMES.index(name)
    else:
        raise AttentionIsaError(
            f"{source} names the attention variant {name!r}, but the known variants are "
            f"{', '.join(ISA_NAMES)}."
        )
    if _lib.aicpu_attention_set_isa(isa) != OK:
        supported = ", ".join(isa_variants()["supported"])
        raise AttentionIsaError(
            f"{source} names the attention variant {name!r}, which this CPU or build cannot "
            f"run; supported here: {supported}."
        )
    return ISA_NAMES[isa]


select_isa()

_HDR_STATUS = _lib.AICPU_TILING_HDR_STATUS
_HDR_BATCH = _lib.AICPU_TILING_HDR_BATCH


def strerror(status: int) -> str:
    """The C message for any status the two functions return."""
    return _ffi.string(_lib.aicpu_attention_strerror(int(status))).decode()


def max_partial_slots(params) -> int:
    """Partial slots a tiling for ``params`` may use: 2 * (num_cores - 1)."""
    return int(_lib.aicpu_tiling_max_slots(params._c_params()))


def partial_shapes(params) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of (partial_out, partial_lse): [slots, q_tile, group, head_dim], [.., group]."""
    group = int(params.num_q_heads) // int(params.num_kv_heads)
    lse = (max_partial_slots(params), int(params.q_tile), group)
    return (*lse, int(params.head_dim)), lse


def partial_buffers(params) -> tuple[torch.Tensor, torch.Tensor]:
    """Freshly allocated float32 (partial_out, partial_lse) workspace for ``params``."""
    out_shape, lse_shape = partial_shapes(params)
    return torch.zeros(out_shape, dtype=torch.float32), torch.zeros(lse_shape, dtype=torch.float32)


def _tensor(name: str, t, dtype=None, shape=None, dtypes=None,
            contiguous: bool = True) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} must be on the CPU, got device {t.device}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have one of the dtypes {allowed}, got {t.dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")
    return t


def _ptr(ctype: str, t: torch.Tensor | None):
    if t is None or t.numel() == 0:
        return _ffi.NULL
    return _ffi.cast(ctype, t.data_ptr())


def _tiling_ptr(params, c_params, buf):
    if hasattr(buf, "buffer") and not isinstance(buf, (torch.Tensor, np.ndarray)):
        buf = buf.buffer  # a pyruntime.tiling.Tiling
    if isinstance(buf, np.ndarray):
        if buf.dtype not in (np.int32, np.uint8) or not buf.flags.c_contiguous:
            raise TypeError("a numpy tiling_buffer must be a C-contiguous int32 or uint8 array")
        have, address = buf.nbytes, buf.ctypes.data
    else:
        _tensor("tiling_buffer", buf, dtypes=(torch.int32, torch.uint8))
        have, address = buf.numel() * buf.element_size(), buf.data_ptr()
    need = int(_lib.aicpu_tiling_bytes(c_params))
    if need == 0:
        raise ValueError("params are invalid (aicpu_tiling_bytes returned 0)")
    if have < need:
        raise ValueError(f"tiling_buffer holds {have} bytes but these params need {need}")
    if address % 4:
        raise ValueError("tiling_buffer must be 4-byte aligned")
    return _ffi.cast("const int32_t *", address)


def _partials(params, partial_out, partial_lse):
    out_shape, lse_shape = partial_shapes(params)
    if partial_out is not None:
        _tensor("partial_out", partial_out, torch.float32, out_shape)
    if partial_lse is not None:
        _tensor("partial_lse", partial_lse, torch.float32, lse_shape)
    return _ptr("float *", partial_out), _ptr("float *", partial_lse)


class BoundAttention:
    """The arguments of one attention layer, checked and converted to C pointers once.

    In graph mode every buffer is static, so the checks and pointer casts belong at capture;
    :meth:`core` and :meth:`finalize` then cost one C call each (plus reading the tiling's
    live batch), however many layers and cores run per step. The tensors are referenced, not
    copied: they must stay alive and keep their storage while the object is in use (fill them
    in place with ``copy_``, never rebind or resize them). Arguments are as for
    :func:`attention_core`; ``query``, the caches and ``seqlens_kv`` may be None for an object
    used only for :meth:`finalize`.

    Raises:
        TypeError, ValueError: as for :func:`attention_core`.
    """

    def __init__(
        self,
        params,
        tiling_buffer,
        *,
        query: torch.Tensor | None,
        key_cache: torch.Tensor | None,
        value_cache: torch.Tensor | None,
        block_table: torch.Tensor | None,
        cu_seqlens_q: torch.Tensor,
        seqlens_kv: torch.Tensor | None,
        out: torch.Tensor,
        partial_out: torch.Tensor | None,
        partial_lse: torch.Tensor | None,
        scale: float | None = None,
        causal: bool = True,
        logits_soft_cap: float | None = None,
        sinks: torch.Tensor | None = None,
        sliding_window: int | None = None,
        kv_scales: tuple[torch.Tensor, ...] | None = None,
    ) -> None:
        self._c_params = params._c_params()
        self._tiling = _tiling_ptr(params, self._c_params, tiling_buffer)
        self._keep = (
            tiling_buffer,
            query,
            key_cache,
            value_cache,
            block_table,
            cu_seqlens_q,
            seqlens_kv,
            out,
            partial_out,
            partial_lse,
            sinks,
            kv_scales,
        )
        self.num_cores = int(params.num_cores)
        #: Sibling sets (see :meth:`core_siblings`): P / H when P % H == 0, else P.
        self.num_sibling_sets = int(_lib.aicpu_attention_num_sibling_sets(self._c_params))
        hq, hkv, d = int(params.num_q_heads), int(params.num_kv_heads), int(params.head_dim)
        shape = (int(params.max_tokens), hq, d)
        _tensor("out", out, shape=shape, dtypes=tuple(DTYPE_CODES))
        self._dtype = DTYPE_CODES[out.dtype]
        _tensor("cu_seqlens_q", cu_seqlens_q, torch.int32)
        if cu_seqlens_q.dim() != 1:
            raise ValueError(f"cu_seqlens_q must be 1-D, got shape {list(cu_seqlens_q.shape)}")
        self._cu_len = cu_seqlens_q.numel()
        self._kv_len = None
        self._po, self._pl = _partials(params, partial_out, partial_lse)
        self._cu = _ptr("const int32_t *", cu_seqlens_q)
        self._out = _ptr("void *", out)
        if sinks is not None:
            _tensor("sinks", sinks, shape=(hq,), dtypes=SINK_DTYPES)
            # The C code reads fp32; a bf16/fp16 sink vector (num_q_heads values) is widened
            # here, at each call, so it is never stale (the Triton kernels widen on load).
            sinks = sinks.float()
        self._sinks_f32 = sinks  # keeps the widened copy alive while the pointer is in use
        self._sinks = _ptr("const float *", sinks)
        self._core_args = None
        if query is None:
            return
        _tensor("query", query, out.dtype, shape)
        kv_dtype = out.dtype if kv_scales is None else torch.int8
        self._kv_int8 = _ffi.NULL
        if kv_scales is not None:
            kv_scales = _kv_quant.check_scales(kv_scales, hkv, d, device=torch.device("cpu"))
        # the caches may be page-strided views (vLLM-Ascend 0.30's K and V pages side by side):
        # read in place, each block at its page stride (kv_quant.page_strides checks the rest)
        _tensor("key_cache", key_cache, kv_dtype, contiguous=False)
        _tensor("value_cache", value_cache, kv_dtype, contiguous=False)
        # ND (4-D) or, int8 only, vLLM-Ascend's NZ (5-D): told by the rank
        layout = _kv_quant.cache_layout(key_cache, value_cache, block_size=int(params.block_size),
                                        num_kv_heads=hkv, head_dim=d,
                                        int8=kv_scales is not None)
        if kv_scales is not None:
            # the C struct holds the four pointers; _keep holds the tensors
            self._kv_int8 = _ffi.new("aicpu_attention_kv_int8 *", {
                **{name: _ptr("const float *", t) for name, t in
                   zip(_kv_quant.SCALE_NAMES, kv_scales)},
                "layout": _lib.AICPU_ATTENTION_KV_NZ if layout == _kv_quant.NZ
                else _lib.AICPU_ATTENTION_KV_ND})
        if key_cache.shape[0] >= 2**31:
            raise ValueError("key_cache has more than 2**31 - 1 blocks")
        key_stride, value_stride = _kv_quant.page_strides(key_cache, value_cache)
        bt_shape = (int(params.max_batch), int(params.max_blocks_per_req))
        _tensor("block_table", block_table, torch.int32, bt_shape)
        _tensor("seqlens_kv", seqlens_kv, torch.int32)
        if seqlens_kv.dim() != 1:
            raise ValueError(f"seqlens_kv must be 1-D, got shape {list(seqlens_kv.shape)}")
        self._kv_len = seqlens_kv.numel()
        flags = _lib.AICPU_TILING_CAUSAL if causal else 0
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        window = _sliding_window.kernel_arg(sliding_window, causal=causal)
        self._core_args = (
            flags,
            self._dtype,
            scale,
            _soft_cap.kernel_arg(logits_soft_cap),
            self._sinks,
            window,
            self._kv_int8,
            _ptr("const void *", query),
            _ptr("const void *", key_cache),
            _ptr("const void *", value_cache),
            int(key_cache.shape[0]),
            key_stride,
            value_stride,
            _ptr("const int32_t *", block_table),
            self._cu,
            _ptr("const int32_t *", seqlens_kv),
            self._out,
            self._po,
            self._pl,
        )

    def _check_lengths(self, need_kv: bool) -> None:
        """The length arrays must cover the tiling's live batch (read now: it is dynamic)."""
        if self._tiling[_HDR_STATUS] != OK:
            return  # the C call does nothing with the lengths
        batch = int(self._tiling[_HDR_BATCH])
        if self._cu_len < batch + 1:
            raise ValueError(
                f"cu_seqlens_q has {self._cu_len} entries but the tiling's batch needs {batch + 1}"
            )
        if need_kv and self._kv_len < batch:
            raise ValueError(
                f"seqlens_kv has {self._kv_len} entries but the tiling's batch needs {batch}"
            )

    def core(self, core: int) -> int:
        """Run AI Core ``core`` (see :func:`attention_core`); returns the C status."""
        if self._core_args is None:
            raise ValueError("bound without query and caches: only finalize() is available")
        if not 0 <= core < self.num_cores:
            raise ValueError(f"core must be in [0, {self.num_cores}), got {core}")
        self._check_lengths(need_kv=True)
        return int(_lib.aicpu_attention_core(self._c_params, self._tiling, core, *self._core_args))

    def sibling_cores(self, first_core: int) -> range:
        """The cores sibling set ``first_core`` runs: ``first_core, first_core + Q, ...``.

        Q is :attr:`num_sibling_sets`; when P % H != 0 (Q = P) that is ``first_core`` alone.
        """
        self._check_sibling_set(first_core)
        return range(first_core, self.num_cores, self.num_sibling_sets)

    def _check_sibling_set(self, first_core: int) -> None:
        if not 0 <= first_core < self.num_sibling_sets:
            raise ValueError(
                f"first_core must be in [0, {self.num_sibling_sets}), got {first_core}"
            )

    def core_siblings(self, first_core: int) -> int:
        """Run every core of sibling set ``first_core`` in one C call; returns the C status.

        When P is a multiple of H and the tiling cuts every head alike (checked in C), cores
        ``first_core + h * Q`` (h < H, Q = P / H) are run as one walk of core ``first_core``'s
        range that reads each kv token's K and V of all H heads together; otherwise each core of
        the set runs as :meth:`core` would, in order. Outputs equal running :meth:`core` on
        each core of :meth:`sibling_cores` up to fp32 rounding; the status is the first non-OK
        one of those calls (``aicpu_attention_core_siblings`` in attention_ref.h).
        Calling it for every ``first_core`` in ``range(num_sibling_sets)`` runs every core once.

        Raises:
            ValueError: bound without query and caches, first_core out of range, or length
                arrays shorter than the tiling's live batch.
        """
        if self._core_args is None:
            raise ValueError("bound without query and caches: only finalize() is available")
        self._check_sibling_set(first_core)
        self._check_lengths(need_kv=True)
        return int(
            _lib.aicpu_attention_core_siblings(
                self._c_params, self._tiling, first_core, *self._core_args
            )
        )

    def core_span(self, first_core: int, num_cores: int) -> int:
        """Run cores ``first_core .. first_core + num_cores - 1`` in one C call; returns the C
        status.

        Consecutive cores hold consecutive ranges of the head-major work order, so a span of
        them covers several kv heads of each request. When the tiling checks out and the
        ranges join up (checked in C), the whole units of single-tile requests (decode) run
        request by request with the span's kv heads together, reading each kv token's K and V
        of those heads as one run; pieces and multi-tile units run as :meth:`core` would.
        Otherwise each core runs as :meth:`core` would, in order. Outputs equal running
        :meth:`core` on each core of the span up to fp32 rounding; the status is the first
        non-OK one of those calls (``aicpu_attention_core_span`` in attention_ref.h). Spans
        that together hold every core once run every core. Works for any P and H; it is the
        fused path when P % H != 0, where sibling sets are single cores.

        Raises:
            ValueError: bound without query and caches, a span that is empty or reaches outside
                ``[0, num_cores)``, or length arrays shorter than the tiling's live batch.
        """
        if self._core_args is None:
            raise ValueError("bound without query and caches: only finalize() is available")
        if num_cores < 1 or not 0 <= first_core <= self.num_cores - num_cores:
            raise ValueError(
                f"span of {num_cores} cores from {first_core} must be non-empty and inside "
                f"[0, {self.num_cores})"
            )
        self._check_lengths(need_kv=True)
        return int(
            _lib.aicpu_attention_core_span(
                self._c_params, self._tiling, first_core, num_cores, *self._core_args
            )
        )

    def finalize(self) -> int:
        """The combine step (see :func:`attention_finalize`); returns the C status."""
        self._check_lengths(need_kv=False)
        return int(
            _lib.aicpu_attention_finalize(
                self._c_params,
                self._tiling,
                self._dtype,
                self._cu,
                self._out,
                self._po,
                self._pl,
                self._sinks,
            )
        )


def _bind_checked(params, tiling_buffer, *, query, out, **arrays) -> BoundAttention:
    """A BoundAttention after the type checks the one-call entry points promise (query a
    tensor of a supported dtype and shape, out of query's dtype)."""
    if not isinstance(query, torch.Tensor):
        raise TypeError(f"query must be a torch.Tensor, got {type(query).__name__}")
    if query.dtype not in DTYPE_CODES:
        allowed = ", ".join(str(d) for d in DTYPE_CODES)
        raise TypeError(f"query must have one of the dtypes {allowed}, got {query.dtype}")
    _tensor("query", query, shape=(params.max_tokens, params.num_q_heads, params.head_dim))
    _tensor("out", out, query.dtype)
    return BoundAttention(params, tiling_buffer, query=query, out=out, **arrays)


def attention_core(
    params,
    tiling_buffer: torch.Tensor,
    core: int,
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqlens_kv: torch.Tensor,
    out: torch.Tensor,
    partial_out: torch.Tensor | None,
    partial_lse: torch.Tensor | None,
    scale: float | None = None,
    causal: bool = True,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
    kv_scales: tuple[torch.Tensor, ...] | None = None,
) -> int:
    """Run AI Core ``core``'s share of one attention layer, as the tiling assigns it.

    Checks every argument on each call; :class:`BoundAttention` checks once for many calls.

    Args:
        params: ``pyruntime.tiling.TilingParams`` the tiling was planned with.
        tiling_buffer: the tiling: an int32 or uint8 CPU tensor or numpy array of at least
            ``params.tiling_bytes`` bytes, or a ``pyruntime.tiling.Tiling`` (its buffer).
        core: 0 <= core < params.num_cores.
        query: [max_tokens, num_q_heads, head_dim], float32, float16 or bfloat16.
        key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim], query's dtype,
            or int8 with ``kv_scales``, then also (both alike) 5-D NZ [num_blocks, num_kv_heads,
            head_dim // 32, block_size, 32] when head_dim % 32 == 0 (`kv_quant.cache_layout`).
            Each may be a page-strided view, its blocks (dim 0) apart and each block dense, as
            vLLM-Ascend 0.30 hands them (`kv_quant.page_strides`): read in place.
        block_table: int32 [max_batch, max_blocks_per_req]; only rows of live requests are read.
        cu_seqlens_q: int32, 1-D, at least batch + 1 entries (batch = the tiling's live batch).
        seqlens_kv: int32, 1-D, at least batch entries.
        out: [max_tokens, num_q_heads, head_dim], query's dtype; this core's whole units are
            written here.
        partial_out: float32 [max_slots, q_tile, group, head_dim] (see :func:`partial_shapes`);
            None only if the tiling never gives this core a piece of a split unit.
        partial_lse: float32 [max_slots, q_tile, group]; same rule.
        scale: softmax scale; default 1 / sqrt(head_dim).
        causal: must equal the causal flag the tiling was planned with.
        logits_soft_cap: None (off, the default) or C > 0, finite: every score
            ``s = scale * q . k`` becomes ``C * tanh(s / C)`` before the softmax (a Python
            float, applied in fp32; `pyruntime.kernels.soft_cap`).
        sinks: None (off, the default) or float32 ``[num_q_heads]`` attention-sink logits
            (gpt-oss): query head h's softmax denominator gains ``exp(sinks[h] - m)`` (the sink
            adds no value). Whole units add it here; split units add it in
            :func:`attention_finalize`, which must be given the same tensor.
        sliding_window: None (off, the default), or W >= 1 (needs ``causal``; 0 is refused):
            the query at kv position p sees only the keys ``p - W < j <= p``. No kv block below
            a unit's window is read or checked, whatever blocks the tiling gives the core (a
            tiling that knows no window gives a unit all its blocks; a piece left with none
            writes an empty partial, which the finalize merges with weight 0).
        kv_scales: None (the caches have query's dtype, the default) or the int8 KV cache's
            ``(k_scale, k_offset, v_scale, v_offset)``, float32 ``[num_kv_heads, head_dim]``
            each: the caches are int8 and a stored x means ``(x - offset) * scale`` per kv
            head and dim (vLLM-Ascend's C8; `pyruntime.kernels.kv_quant`), dequantised in fp32.

    Returns:
        The C status: OK, the tiling's status if it is not OK (nothing was done), E_TILING
        (the buffer or the lengths do not match) or E_BLOCK_ID (a block id out of range; the
        affected rows are zero).

    Raises:
        TypeError: a tensor argument has the wrong type or dtype.
        ValueError: a wrong shape (a 5-D cache that is not int8, an NZ head_dim not a
            multiple of 32, caches in different layouts), device, contiguity (the caches:
            `kv_quant.CacheStrideError`, a ValueError, for anything but dense blocks at a page
            stride of at least a block), core index or
            buffer size, a soft cap that is not None or a positive finite number, or a sliding
            window that is not None or an int >= 1 (0 included), or is given without ``causal``.
    """
    bound = _bind_checked(params, tiling_buffer, query=query, key_cache=key_cache,
                          value_cache=value_cache, block_table=block_table,
                          cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv, out=out,
                          partial_out=partial_out, partial_lse=partial_lse, scale=scale,
                          causal=causal, logits_soft_cap=logits_soft_cap, sinks=sinks,
                          sliding_window=sliding_window, kv_scales=kv_scales)
    return bound.core(int(core))


class BlockLog:
    """Records the kv blocks the C cores read, for tests (``aicpu_attention_set_block_log``).

    Within ``with BlockLog() as log:`` every kv block a core, sibling or span call reads is
    logged as ``(request, kv_head, q_tile, block)`` (block: the block-table column); a call
    that fuses kv heads logs the block once per head. Process-wide and not thread-safe: run
    the cores one at a time inside the block, and do not nest logs.

    Attributes (after the block ends):
        count: int, every read (also those past ``capacity``).
        reads: int64 numpy array ``[min(count, capacity), 4]``.
    """

    def __init__(self, capacity: int = 1 << 16) -> None:
        self.capacity = int(capacity)
        self._log = _ffi.new("int32_t[]", 4 * self.capacity)
        self._count = _ffi.new("int32_t *", 0)
        self.count = 0
        self.reads = np.zeros((0, 4), dtype=np.int64)

    def __enter__(self):  # returns self (typing.Self needs Python 3.11)
        self._count[0] = 0
        _lib.aicpu_attention_set_block_log(self._log, self.capacity, self._count)
        return self

    def __exit__(self, *exc) -> None:
        _lib.aicpu_attention_set_block_log(_ffi.NULL, 0, _ffi.NULL)
        self.count = int(self._count[0])
        n = min(self.count, self.capacity)
        flat = np.frombuffer(_ffi.buffer(self._log, 4 * 4 * n), dtype=np.int32)
        self.reads = flat.reshape(n, 4).astype(np.int64)


def num_sibling_sets(params) -> int:
    """Q = num_cores / num_kv_heads when that divides, else num_cores (see
    :func:`attention_core_siblings`); the sets 0..Q-1 hold every core once."""
    return int(_lib.aicpu_attention_num_sibling_sets(params._c_params()))


def attention_core_siblings(
    params,
    tiling_buffer: torch.Tensor,
    first_core: int,
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqlens_kv: torch.Tensor,
    out: torch.Tensor,
    partial_out: torch.Tensor | None,
    partial_lse: torch.Tensor | None,
    scale: float | None = None,
    causal: bool = True,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    sliding_window: int | None = None,
    kv_scales: tuple[torch.Tensor, ...] | None = None,
) -> int:
    """Run the cores ``first_core, first_core + Q, ...`` (Q = :func:`num_sibling_sets`) in one
    C call, fusing the kv heads when the tiling cuts every head alike.

    Arguments, return value and errors are those of :func:`attention_core`, except that
    ``first_core`` must be in ``[0, Q)``; see :meth:`BoundAttention.core_siblings`.
    """
    bound = _bind_checked(params, tiling_buffer, query=query, key_cache=key_cache,
                          value_cache=value_cache, block_table=block_table,
                          cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv, out=out,
                          partial_out=partial_out, partial_lse=partial_lse, scale=scale,
                          causal=causal, logits_soft_cap=logits_soft_cap, sinks=sinks,
                          sliding_window=sliding_window, kv_scales=kv_scales)
    return bound.core_siblings(int(first_core))


def attention_finalize(
    params,
    tiling_buffer: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    out: torch.Tensor,
    partial_out: torch.Tensor | None,
    partial_lse: torch.Tensor | None,
    sinks: torch.Tensor | None = None,
) -> int:
    """Merge the split pieces into ``out`` and zero its padding rows; run after every core.

    Args:
        params, tiling_buffer: as for :func:`attention_core`.
        cu_seqlens_q: int32, 1-D, at least batch + 1 entries: locates each split unit's rows.
        out: [max_tokens, num_q_heads, head_dim], float32, float16 or bfloat16.
        partial_out, partial_lse: the workspace the cores wrote (None only if the tiling has
            no split unit).
        sinks: None or the float32 ``[num_q_heads]`` attention sinks the cores were given: each
            merged row's denominator gains its head's sink, once.

    Returns:
        OK; or, after writing zeros to every row, the tiling's status when it is not OK, or
        E_TILING when the buffer is not a consistent tiling for ``params``.

    Raises:
        TypeError, ValueError: as for :func:`attention_core`.
    """
    bound = BoundAttention(
        params,
        tiling_buffer,
        query=None,
        key_cache=None,
        value_cache=None,
        block_table=None,
        cu_seqlens_q=cu_seqlens_q,
        seqlens_kv=None,
        out=out,
        partial_out=partial_out,
        partial_lse=partial_lse,
        sinks=sinks,
    )
    return bound.finalize()
