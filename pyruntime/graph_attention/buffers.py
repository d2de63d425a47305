"""Static buffers of one capture bucket, and validation of the per-step inputs.

Everything a captured graph reads lives here, allocated once on the backend and filled
in place (`copy_h2d`) before each replay, never rebound.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from pyruntime.backends import Backend
from pyruntime.kernels import kv_quant as _kv_quant
from pyruntime.kernels import sliding_window as _sliding_window
from pyruntime.kernels import soft_cap
from pyruntime.tiling import TilingParams

from .errors import AttentionInputError, FrozenSizeError

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """Validated host inputs of one step (numpy int32, contiguous)."""

    block_table: np.ndarray  # [max_batch, max_blocks_per_req]
    cu_seqlens_q: np.ndarray  # [live_batch + 1]
    seqlens_kv: np.ndarray  # [live_batch]
    epoch: int  # this step's epoch, new for every step (see pyruntime.tiling.StaleTilingError)

    @property
    def live_batch(self) -> int:
        return int(self.seqlens_kv.shape[0])


def _int32_array(name: str, value: Any, ndim: int) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise AttentionInputError(f"{name} must be a host (CPU) tensor, got {value.device}")
        value = value.detach().numpy()
    if not isinstance(value, np.ndarray):
        raise AttentionInputError(f"{name} must be an int32 torch tensor or numpy array, "
                                  f"got {type(value).__name__}")
    if value.dtype != np.int32:
        raise AttentionInputError(f"{name} must be int32, got {value.dtype}")
    if value.ndim != ndim:
        raise AttentionInputError(f"{name} must have {ndim} dimension(s), got shape "
                                  f"{tuple(value.shape)}")
    return np.ascontiguousarray(value)


def check_dtype(dtype: torch.dtype) -> torch.dtype:
    """`dtype` if it is a storage dtype of the attentions (`DTYPES`), else AttentionInputError."""
    if dtype not in DTYPES:
        raise AttentionInputError(f"dtype must be one of {DTYPES}, got {dtype}")
    return dtype


class StaticBuffers:
    """The device buffers of one bucket, shared by every layer.

    Attributes (device buffers):
        queries: ``num_layers`` x ``[max_tokens, num_q_heads, head_dim]`` dtype.
        kv_caches: ``num_layers`` x ``(k, v)``, each ``[num_blocks, block_size,
            num_kv_heads, head_dim]`` dtype (int8 with ``kv_cache_dtype="int8"``).
        outputs: ``num_layers`` x ``[max_tokens, num_q_heads, head_dim]`` dtype.
        block_table: int32 ``[max_batch, max_blocks_per_req]``.
        lengths: int32 ``[2 + (max_batch + 1) + max_batch]``: step epoch, live batch,
            cu_seqlens_q, seqlens_kv, packed so one copy refreshes them; `step_epoch`,
            `batch`, `cu_seqlens_q` and `seqlens_kv` are views into it. The tiling echoes the
            epoch, so attention can tell a tiling planned for this step from a stale one.
        tiling: uint8 ``[params.tiling_bytes]``.
        partial_out: float32 ``[max_partial_slots, q_tile, group, head_dim]``.
        partial_lse: float32 ``[max_partial_slots, q_tile, group]``.

        sinks: ``num_layers`` x float32 ``[num_q_heads]`` attention-sink logits (zeros until
            the caller fills them in place), or None when made with ``sinks=False``.
        kv_scales: with ``kv_cache_dtype="int8"``, ``num_layers`` x ``(k_scale, k_offset,
            v_scale, v_offset)``, each float32 ``[num_kv_heads, head_dim]`` (scales 1 and
            offsets 0 until the caller fills them in place; a stored x means
            ``(x - offset) * scale``, `pyruntime.kernels.kv_quant`); None with ``"auto"``.

    Attributes (layer constants every launch passes): scale (``1 / sqrt(head_dim)``),
    logits_soft_cap (None or C > 0, see `pyruntime.kernels.soft_cap`) and sliding_window
    (None or W >= 1, see `pyruntime.kernels.sliding_window`).

    Subclasses with other layer buffers (`pyruntime.mla_attention.MLABuffers`) build on the
    same three steps: `_begin` (checks, allocation ledger), their layer buffers through
    `_alloc`, then `_alloc_step_buffers`.
    """

    def __init__(self, backend: Backend, params: TilingParams, *, num_layers: int,
                 num_blocks: int, dtype: torch.dtype,
                 logits_soft_cap: float | None = None, sinks: bool = False,
                 sliding_window: int | None = None, kv_cache_dtype: str = "auto") -> None:
        self.logits_soft_cap = soft_cap.check(logits_soft_cap, error=AttentionInputError)
        self.kv_cache_dtype = _kv_quant.check(kv_cache_dtype, error=AttentionInputError)
        self.sliding_window = _sliding_window.check(sliding_window, error=AttentionInputError)
        self._begin(backend, params, num_layers=num_layers, num_blocks=num_blocks, dtype=dtype)
        p, alloc = params, self._alloc
        self.scale = 1.0 / math.sqrt(p.head_dim)
        row = (p.max_tokens, p.num_q_heads, p.head_dim)
        cache = (num_blocks, p.block_size, p.num_kv_heads, p.head_dim)
        self.queries = [alloc(row, dtype) for _ in range(num_layers)]
        cache_dtype = torch.int8 if self.kv_cache_dtype == "int8" else dtype
        self.kv_caches = [(alloc(cache, cache_dtype), alloc(cache, cache_dtype))
                          for _ in range(num_layers)]
        self.kv_scales = None
        if self.kv_cache_dtype == "int8":
            channels = (p.num_kv_heads, p.head_dim)
            self.kv_scales = [tuple(alloc(channels, torch.float32) for _ in range(4))
                              for _ in range(num_layers)]
            for k_scale, _, v_scale, _ in self.kv_scales:   # the identity until filled
                k_scale.fill_(1.0)
                v_scale.fill_(1.0)
        self.outputs = [alloc(row, dtype) for _ in range(num_layers)]
        self.sinks = ([alloc((p.num_q_heads,), torch.float32) for _ in range(num_layers)]
                      if sinks else None)
        slots = max(1, p.max_partial_slots)
        self._alloc_step_buffers((slots, p.q_tile, p.group, p.head_dim),
                                 (slots, p.q_tile, p.group))

    def _begin(self, backend: Backend, params: TilingParams, *, num_layers: int,
               num_blocks: int, dtype: torch.dtype) -> None:
        """Check the storage dtype and the counts, and start the ledger of what `free` gives
        back. Raises AttentionInputError before anything is allocated."""
        check_dtype(dtype)
        if num_layers < 1 or num_blocks < 1:
            raise AttentionInputError(f"num_layers ({num_layers}) and num_blocks "
                                      f"({num_blocks}) must be at least 1")
        self._allocated: list[torch.Tensor] = []
        self._backend, self.params, self.num_blocks, self.dtype = backend, params, num_blocks, dtype

    def _alloc(self, shape, dtype) -> torch.Tensor:
        buf = self._backend.alloc(shape, dtype)
        self._allocated.append(buf)  # what `free` gives back (views excluded)
        return buf

    def _alloc_step_buffers(self, partial_out_shape: tuple[int, ...],
                            partial_lse_shape: tuple[int, ...]) -> None:
        """The buffers every layer of the bucket shares: block table, packed lengths (and
        their views), tiling, float32 split-KV partials of the given shapes; and the host
        staging of the lengths."""
        p, alloc = self.params, self._alloc
        self.block_table = alloc((p.max_batch, p.max_blocks_per_req), torch.int32)
        self.lengths = alloc((2 * p.max_batch + 3,), torch.int32)
        self.step_epoch = self.lengths[0:1]
        self.batch = self.lengths[1:2]
        self.cu_seqlens_q = self.lengths[2 : p.max_batch + 3]
        self.seqlens_kv = self.lengths[p.max_batch + 3 :]
        self.tiling = alloc((p.tiling_bytes,), torch.uint8)
        self.partial_out = alloc(partial_out_shape, torch.float32)
        self.partial_lse = alloc(partial_lse_shape, torch.float32)
        self._staging = np.zeros(2 * p.max_batch + 3, dtype=np.int32)
        self._epoch = 0  # the device buffers start zeroed: epoch 0 is "no step yet"

    def free(self) -> None:
        """Free every buffer on the backend and drop this object's references to them.

        Idempotent. Tensors a caller still holds stay valid host memory on the CPU backend,
        but are no longer live device buffers (a graph using them cannot be replayed).
        """
        for buf in self._allocated:
            if self._backend.is_live(buf):  # the caller may have freed one already
                self._backend.free(buf)
        self._allocated.clear()
        self.queries, self.kv_caches, self.outputs = [], [], []
        self.sinks = None if self.sinks is None else []
        # getattr: a subclass (MLABuffers) may not run this __init__ and have no scales
        self.kv_scales = None if getattr(self, "kv_scales", None) is None else []
        self.block_table = self.lengths = self.tiling = None
        self.step_epoch = self.batch = self.cu_seqlens_q = self.seqlens_kv = None
        self.partial_out = self.partial_lse = None

    def validate(self, block_table: Any, cu_seqlens_q: Any, seqlens_kv: Any) -> StepInputs:
        """Check types, dtypes and frozen sizes; values are the tiling's business.

        Raises:
            AttentionInputError: wrong type, dtype or rank.
            FrozenSizeError: a size beyond what the capture froze.
        """
        p = self.params
        bt = _int32_array("block_table", block_table, 2)
        cu = _int32_array("cu_seqlens_q", cu_seqlens_q, 1)
        kv = _int32_array("seqlens_kv", seqlens_kv, 1)
        if bt.shape[0] != p.max_batch:
            raise FrozenSizeError("max_batch", p.max_batch, bt.shape[0], "block_table's rows")
        if bt.shape[1] != p.max_blocks_per_req:
            raise FrozenSizeError("max_blocks_per_req", p.max_blocks_per_req, bt.shape[1],
                                  "block_table's columns")
        if kv.shape[0] > p.max_batch:
            raise FrozenSizeError("max_batch", p.max_batch, kv.shape[0], "the live batch")
        if cu.shape[0] != kv.shape[0] + 1:
            raise AttentionInputError(f"cu_seqlens_q must have len(seqlens_kv) + 1 = "
                                      f"{kv.shape[0] + 1} entries, got {cu.shape[0]}")
        self._epoch = self._epoch % _INT32_MAX + 1  # 1..INT32_MAX, never 0
        return StepInputs(bt, cu, kv, self._epoch)

    def stage_lengths(self, inputs: StepInputs) -> np.ndarray:
        """The packed host image of `lengths` for this step (reused host memory)."""
        n, staging, first_kv = inputs.live_batch, self._staging, self.params.max_batch + 3
        staging[0], staging[1] = inputs.epoch, n
        staging[2 : n + 3] = inputs.cu_seqlens_q
        staging[first_kv : first_kv + n] = inputs.seqlens_kv
        return staging
