"""The Python boundary of the tiling kernel: the only module that imports the cffi ``lib``.

The kernel (``aicpu_kernels/aicpu_tiling.h`` documents it; that header is the ABI) turns
per-request lengths into a fixed-size tiling buffer: which AI Core does which part of the
attention work. This module validates static parameters, runs the kernel on the host,
decodes its buffer, and maps status codes to one exception family.

Example::

    >>> from pyruntime.tiling import TilingParams, plan
    >>> params = TilingParams(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=128,
    ...                       max_batch=4, max_tokens=8, max_blocks_per_req=64, num_cores=24)
    >>> tiling = plan(params, cu_seqlens_q=[0, 1, 2, 3], seqlens_kv=[700, 3000, 90])
    >>> tiling.status, tiling.num_tokens, len(tiling.buffer) == params.tiling_bytes
    (0, 3, True)
    >>> plan(params, [0, 1, 9], [5, 5]).error        # 9 > max_tokens: caught on the device
    QueryOverflowError('request 1: cu_seqlens_q runs past max_tokens (value 9, limit 8)')
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from pyruntime._native import ffi, lib

# The other kernels' wrappers (reference_attention) take the cffi module from here, so this
# stays the one module that imports it.
_ffi, _lib = ffi, lib

__all__ = [
    "BatchError",
    "CombineRecord",
    "CoreRange",
    "KvCapacityError",
    "KvEmptyError",
    "KvNegativeError",
    "KvShortError",
    "QueryDecreasingError",
    "QueryOverflowError",
    "QueryStartError",
    "Segment",
    "StaleTilingError",
    "Tiling",
    "TilingBufferError",
    "TilingError",
    "TilingInputError",
    "TilingParams",
    "TilingParamsError",
    "plan",
    "plan_into",
    "reference_plan",
    "strerror",
    "work_order_key",
]

# Constants from the C header, filled in by the compiler through cffi.
MAGIC: int = lib.AICPU_TILING_MAGIC
VERSION: int = lib.AICPU_TILING_VERSION
OK: int = lib.AICPU_TILING_OK
CAUSAL: int = lib.AICPU_TILING_CAUSAL
HEADER_WORDS: int = lib.AICPU_TILING_HDR_WORDS
#: header word that echoes the epoch the tiling was planned for
HDR_EPOCH: int = lib.AICPU_TILING_HDR_EPOCH
CORE_WORDS: int = lib.AICPU_TILING_CORE_WORDS
COMBINE_WORDS: int = lib.AICPU_TILING_COMB_WORDS
DEFAULT_COST_KV_LOAD: int = lib.AICPU_TILING_DEFAULT_COST_KV_LOAD
DEFAULT_COST_QK_TILE: int = lib.AICPU_TILING_DEFAULT_COST_QK_TILE
DEFAULT_COST_SEGMENT: int = lib.AICPU_TILING_DEFAULT_COST_SEGMENT
#: Rows (query tokens x GQA group) a default query tile aims at.
DEFAULT_TILE_ROWS = 128

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def is_lib_function(obj: Any) -> bool:
    """Whether `obj` is a function of our cffi ``lib`` (for counting the C calls a host step
    makes into it: `pyruntime.measurement.invariants`), without handing ``lib`` out."""
    return getattr(obj, "__self__", None) is _lib


def strerror(status: int) -> str:
    """The kernel's message for a status code."""
    return ffi.string(lib.aicpu_tiling_strerror(int(status))).decode()


# --------------------------------------------------------------------------- errors


class TilingError(Exception):
    """Base of every tiling failure; never raised directly.

    Attributes:
        code: the kernel status code.
        request: the first offending request, or -1 when the failure is not per request.
        value: the offending value (0 when not applicable).
        limit: the limit it broke (0 when not applicable).
    """

    code: int = -1

    def __init__(self, message: str, *, request: int = -1, value: int = 0, limit: int = 0):
        super().__init__(message)
        self.request = request
        self.value = value
        self.limit = limit


class TilingParamsError(TilingError, ValueError):
    """Static parameters out of range."""

    code = lib.AICPU_TILING_E_PARAMS


class TilingBufferError(TilingError, ValueError):
    """A tiling buffer or input array that the kernel cannot use."""

    code = lib.AICPU_TILING_E_BUFFER


class StaleTilingError(TilingError, RuntimeError):
    """The tiling a step read was planned for another step (its epoch does not match).

    The host writes a new epoch beside each step's lengths and the tiling kernel echoes the
    epoch it read into the tiling header; attention that finds them different does no work
    and writes zeros. Seeing this means the tiling task did not run for this step, e.g. a
    captured AI-CPU task that a graph replay did not re-run: use ``placement="pre-replay"``.

    Attributes:
        tiling_epoch: the epoch in the tiling header (``value``).
        step_epoch: the epoch of the step's lengths (``limit``).
    """

    def __init__(self, tiling_epoch: int, step_epoch: int) -> None:
        super().__init__(
            f"stale tiling: the tiling buffer was planned for step epoch {tiling_epoch}, but "
            f"this step's lengths carry epoch {step_epoch}; the tiling task did not run for "
            "this step (a captured AI-CPU task that graph replay did not re-run?), so every "
            "output row was written as zero; with placement='graph' on such a device use "
            "placement='pre-replay' (`aicpu-tiling selfcheck` tells which one it needs)",
            value=tiling_epoch, limit=step_epoch)
        self.tiling_epoch, self.step_epoch = tiling_epoch, step_epoch


class TilingInputError(TilingError, ValueError):
    """Base of the per-step input errors the kernel reports through the tiling's status."""


class BatchError(TilingInputError):
    code = lib.AICPU_TILING_E_BATCH


class QueryStartError(TilingInputError):
    code = lib.AICPU_TILING_E_QUERY_START


class QueryDecreasingError(TilingInputError):
    code = lib.AICPU_TILING_E_QUERY_DECREASING


class QueryOverflowError(TilingInputError):
    code = lib.AICPU_TILING_E_QUERY_OVERFLOW


class KvNegativeError(TilingInputError):
    code = lib.AICPU_TILING_E_KV_NEGATIVE


class KvShortError(TilingInputError):
    code = lib.AICPU_TILING_E_KV_SHORT


class KvCapacityError(TilingInputError):
    code = lib.AICPU_TILING_E_KV_CAPACITY


class KvEmptyError(TilingInputError):
    code = lib.AICPU_TILING_E_KV_EMPTY


_ERROR_BY_CODE: dict[int, type[TilingError]] = {
    cls.code: cls
    for cls in (
        TilingParamsError,
        TilingBufferError,
        BatchError,
        QueryStartError,
        QueryDecreasingError,
        QueryOverflowError,
        KvNegativeError,
        KvShortError,
        KvCapacityError,
        KvEmptyError,
    )
}
assert len(_ERROR_BY_CODE) == lib.AICPU_TILING_NUM_STATUS - 1, "an error class per status"


def error_for_status(status: int, *, request: int = -1, value: int = 0, limit: int = 0):
    """The exception instance for a non-zero status (not raised), or None for OK."""
    if status == OK:
        return None
    cls = _ERROR_BY_CODE.get(int(status))
    if cls is None:
        return TilingBufferError(f"unknown tiling status {status}")
    where = f"request {request}: " if request >= 0 else ""
    detail = f" (value {value}, limit {limit})" if cls is not TilingParamsError else ""
    return cls(f"{where}{strerror(status)}{detail}", request=request, value=value, limit=limit)


# --------------------------------------------------------------------------- params

_FIELDS = (
    "num_q_heads",
    "num_kv_heads",
    "head_dim",
    "block_size",
    "max_batch",
    "max_tokens",
    "max_blocks_per_req",
    "num_cores",
    "q_tile",
    "cost_kv_load",
    "cost_qk_tile",
    "cost_segment",
    "sliding_window",
)


def _explain_params(p: TilingParams) -> str:
    """Why the kernel rejects these params, in one sentence (the C check is the authority)."""
    positive = (
        ("num_q_heads", lib.AICPU_TILING_MAX_HEADS),
        ("num_kv_heads", p.num_q_heads),
        ("head_dim", lib.AICPU_TILING_MAX_HEAD_DIM),
        ("block_size", lib.AICPU_TILING_MAX_BLOCK_SIZE),
        ("max_batch", lib.AICPU_TILING_MAX_BATCH),
        ("max_tokens", lib.AICPU_TILING_MAX_TOKENS),
        ("max_blocks_per_req", lib.AICPU_TILING_MAX_KV_TOKENS),
        ("num_cores", lib.AICPU_TILING_MAX_CORES),
        ("q_tile", lib.AICPU_TILING_MAX_TILE_ROWS),
    )
    for name, upper in positive:
        value = getattr(p, name)
        if not 1 <= value <= upper:
            return f"{name} is {value}, but it must be between 1 and {upper}"
    if p.num_q_heads % p.num_kv_heads:
        return (
            f"num_q_heads ({p.num_q_heads}) must be a multiple of num_kv_heads "
            f"({p.num_kv_heads})"
        )
    if p.max_blocks_per_req * p.block_size > lib.AICPU_TILING_MAX_KV_TOKENS:
        return (
            f"max_blocks_per_req * block_size is {p.max_blocks_per_req * p.block_size}, "
            f"above the kernel's limit of {lib.AICPU_TILING_MAX_KV_TOKENS} kv tokens"
        )
    if p.q_tile * p.group > lib.AICPU_TILING_MAX_TILE_ROWS:
        return (
            f"q_tile * group is {p.q_tile * p.group} rows, above the limit of "
            f"{lib.AICPU_TILING_MAX_TILE_ROWS}"
        )
    for name in ("cost_kv_load", "cost_qk_tile", "cost_segment"):
        value = getattr(p, name)
        if not 0 <= value <= lib.AICPU_TILING_MAX_COST_WEIGHT:
            return f"{name} is {value}, but it must be between 0 and {lib.AICPU_TILING_MAX_COST_WEIGHT}"
    if p.cost_kv_load + p.cost_qk_tile < 1:
        return "cost_kv_load + cost_qk_tile must be at least 1"
    if p.sliding_window is not None and not 1 <= p.sliding_window <= lib.AICPU_TILING_MAX_KV_TOKENS:
        return (f"sliding_window is {p.sliding_window}, but it must be None (no window) or "
                f"between 1 and {lib.AICPU_TILING_MAX_KV_TOKENS}")
    return "the worst-case total cost of these shapes would overflow the kernel's cost range"


#: What a sliding-window value means in Python and how to get it from a peer's: named by every
#: refusal of 0 (`TilingParams`, `pyruntime.kernels.sliding_window.check`, the CLI). Only the C
#: words keep 0 for none.
WINDOW_CONVENTION = ("None is no window; W >= 1 is the model's window of W keys, the query "
                     "itself included (vLLM's sliding_window; FlashInfer window_left + 1; "
                     "FlashAttention window_size left + 1; so a one-key window is 1)")


def window_zero_refusal(name: str = "sliding_window") -> str:
    """The message that refuses a window of 0 (:data:`WINDOW_CONVENTION`)."""
    return f"{name}=0 is refused: {WINDOW_CONVENTION}"

@dataclasses.dataclass(frozen=True)
class TilingParams:
    """Static tiling parameters, fixed at graph capture. Validated on construction.

    Args:
        num_q_heads: query heads; a multiple of ``num_kv_heads`` (GQA group = the ratio).
        num_kv_heads: kv heads.
        head_dim: head dimension.
        block_size: kv tokens per paged-cache block.
        max_batch: requests the static buffers hold (the capture bucket's batch).
        max_tokens: query rows T (query dim 0) of the capture bucket.
        max_blocks_per_req: block-table columns; kv capacity = this * block_size.
        num_cores: AI Cores the attention kernel is launched on (24 on a 910B2).
        q_tile: query tokens per work unit; default ``max(1, 128 // group)``.
        cost_kv_load, cost_qk_tile, cost_segment: cost-model weights (see the C header).
        sliding_window: None (the default) for no window, or W >= 1 (ABI v5): a query row at
            position p sees the keys j with p - W < j <= p (the model's W keys: FlashInfer's
            ``window_left + 1``, FlashAttention's ``left + 1``), and each unit's cost and
            blocks count only the block-table columns its rows' windows touch. 0 is refused
            (a peer's 0 is a one-key window, which is 1 here). The C word keeps 0 for none
            (:meth:`as_dict`, the cffi struct). A window needs causal planning:
            ``plan(..., causal=False)`` with a window fails with the E_PARAMS status.

    Raises:
        TilingParamsError (a ValueError): a field is out of the kernel's range, or
            ``sliding_window`` is 0.
    """

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    max_batch: int
    max_tokens: int
    max_blocks_per_req: int
    num_cores: int
    q_tile: int | None = None
    cost_kv_load: int = DEFAULT_COST_KV_LOAD
    cost_qk_tile: int = DEFAULT_COST_QK_TILE
    cost_segment: int = DEFAULT_COST_SEGMENT
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        for name in _FIELDS:
            value = getattr(self, name)
            if name in ("q_tile", "sliding_window") and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TilingParamsError(f"{name} must be an int, not {type(value).__name__}")
            if not _INT32_MIN <= value <= _INT32_MAX:
                raise TilingParamsError(f"{name} is {value}, outside the int32 range")
            object.__setattr__(self, name, int(value))
        if self.sliding_window == 0:  # the C word's none; here a one-key window is 1
            raise TilingParamsError(window_zero_refusal())
        if self.num_kv_heads < 1 or self.num_q_heads < 1:
            raise TilingParamsError(_explain_params(self))
        if self.q_tile is None:
            object.__setattr__(self, "q_tile", max(1, DEFAULT_TILE_ROWS // self.group))
        c_params = ffi.new("aicpu_tiling_params *", self.as_dict())
        if lib.aicpu_tiling_params_check(c_params) != OK:
            raise TilingParamsError(f"invalid tiling params: {_explain_params(self)}")
        object.__setattr__(self, "_c", c_params)

    @property
    def group(self) -> int:
        """Query heads per kv head."""
        return max(1, self.num_q_heads // max(1, self.num_kv_heads))

    @property
    def kv_capacity(self) -> int:
        """Largest kv length a request may have: max_blocks_per_req * block_size."""
        return self.max_blocks_per_req * self.block_size

    @property
    def tiling_bytes(self) -> int:
        """Size of the tiling buffer in bytes (a multiple of 64)."""
        return int(lib.aicpu_tiling_bytes(self._c))

    @property
    def max_partial_slots(self) -> int:
        """Partial slots the split workspace holds: 2 * (num_cores - 1)."""
        return int(lib.aicpu_tiling_max_slots(self._c))

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the split partials workspace (float32 partial_out then partial_lse)."""
        return int(lib.aicpu_tiling_workspace_bytes(self._c))

    def _c_params(self) -> Any:
        """The cffi ``aicpu_tiling_params *`` (for the other kernels' wrappers)."""
        return self._c

    def as_dict(self) -> dict[str, int]:
        """The thirteen C fields (every field but ``reserved``) as a dict of the C words:
        ``sliding_window`` is 0 for none there (:func:`params_from_words` is the inverse)."""
        words = {name: getattr(self, name) for name in _FIELDS}
        words["sliding_window"] = words["sliding_window"] or 0
        return words


def params_from_words(words: Mapping[str, int] | Sequence[int]) -> TilingParams:
    """The :class:`TilingParams` of the C words: a dict (:meth:`TilingParams.as_dict`, a golden
    file's ``params``) or the flat list the kernels carry, in field order. The word
    ``sliding_window`` 0 is no window (None): only here, at the boundary with the C words,
    does 0 mean none (``TilingParams(sliding_window=0)`` is refused).

    Raises:
        TilingParamsError: as :class:`TilingParams`; TypeError: more than thirteen words.
    """
    if not isinstance(words, Mapping):
        words = list(words)
        if len(words) > len(_FIELDS):
            raise TypeError(f"{len(words)} tiling params words, at most {len(_FIELDS)}")
        words = dict(zip(_FIELDS, words))
    window = words.get("sliding_window")
    if (isinstance(window, (int, np.integer)) and not isinstance(window, bool)
            and window == 0):
        words = {**words, "sliding_window": None}
    return TilingParams(**words)


# --------------------------------------------------------------------------- decoded views


class Segment(NamedTuple):
    """One contiguous piece of work on one core.

    ``q_start:q_end`` are query-row offsets within the request (``[0, q_len)``),
    ``kv_start:kv_end`` token offsets within its kv (``[0, kv_len)``; ``kv_start`` is
    ``block_start * block_size``, ``kv_end`` is clipped to the unit's causal end); ``split``
    is the partial slot of a piece of a split unit, or -1 when the segment writes its output.
    ``block_start:block_end`` are the absolute block-table columns the segment reads (ABI v5):
    with a sliding window a unit's first column is ``floor(kv_begin / block_size)``, where
    ``kv_begin`` is the window start of its first row, and the attention kernel masks the keys
    of those blocks outside each row's window.
    """

    core: int
    request: int
    kv_head: int
    q_start: int
    q_end: int
    kv_start: int
    kv_end: int
    split: int
    block_start: int
    block_end: int


class CoreRange(NamedTuple):
    """One core record: positions are (request, kv head, query tile, kv block), the kv block
    an absolute block-table column (ABI v5; a unit starts at its first column, 0 without a
    sliding window).

    Positions compare in the head-major work order, that is as (kv head, request, query tile,
    kv block) (:func:`work_order_key`); the end of the work is ``(0, num_kv_heads, 0, 0)``.
    """

    begin: tuple[int, int, int, int]
    end: tuple[int, int, int, int]
    first_slot: int
    last_slot: int
    num_segments: int
    cost: int


class CombineRecord(NamedTuple):
    """A split unit the combine step merges: slots first_slot .. first_slot+num_pieces-1."""

    request: int
    kv_head: int
    q_tile: int
    first_slot: int
    num_pieces: int


def _as_int32(name: str, values: Any) -> np.ndarray:
    """A contiguous int32 copy of a sequence, numpy array or CPU tensor; checks the range."""
    if hasattr(values, "detach"):  # torch.Tensor, without importing torch here
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise TilingBufferError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise TilingBufferError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.size and (array.min() < _INT32_MIN or array.max() > _INT32_MAX):
        raise TilingBufferError(f"{name} has values outside the int32 range")
    return np.ascontiguousarray(array, dtype=np.int32)


class Tiling:
    """A tiling buffer and the inputs it was planned from, with decoders.

    Attributes:
        params: the TilingParams.
        buffer: the raw tiling, ``numpy.uint8`` of length ``params.tiling_bytes``.
        words: the same memory viewed as int32.
    """

    def __init__(self, params: TilingParams, buffer: np.ndarray, cu_seqlens_q: np.ndarray,
                 seqlens_kv: np.ndarray, causal: bool):
        self.params = params
        self.buffer = buffer
        self.words = buffer.view(np.int32)
        self.cu_seqlens_q = cu_seqlens_q
        self.seqlens_kv = seqlens_kv
        self.causal = causal

    def _header(self, index: int) -> int:
        return int(self.words[index])

    @property
    def status(self) -> int:
        """0 when the tiling is valid, else the status code of the first offence."""
        return self._header(lib.AICPU_TILING_HDR_STATUS)

    @property
    def error(self) -> TilingError | None:
        """None, or the typed error (not raised) naming the request, value and limit."""
        return error_for_status(
            self.status,
            request=self._header(lib.AICPU_TILING_HDR_BAD_REQUEST),
            value=self._header(lib.AICPU_TILING_HDR_BAD_VALUE),
            limit=self._header(lib.AICPU_TILING_HDR_BAD_LIMIT),
        )

    def raise_for_status(self) -> None:
        """Raise ``self.error`` when the status is not OK."""
        error = self.error
        if error is not None:
            raise error

    batch = property(lambda self: self._header(lib.AICPU_TILING_HDR_BATCH), doc="Live batch.")
    epoch = property(lambda self: self._header(lib.AICPU_TILING_HDR_EPOCH),
                     doc="The epoch given to the kernel, echoed (see StaleTilingError).")
    num_tokens = property(lambda self: self._header(lib.AICPU_TILING_HDR_NUM_TOKENS),
                          doc="Real query tokens (cu_seqlens_q[batch]).")
    num_units = property(lambda self: self._header(lib.AICPU_TILING_HDR_NUM_UNITS),
                         doc="(request, kv head, query tile) units.")
    num_segments = property(lambda self: self._header(lib.AICPU_TILING_HDR_NUM_SEGMENTS),
                            doc="Segments over all cores.")
    num_slots = property(lambda self: self._header(lib.AICPU_TILING_HDR_NUM_SLOTS),
                         doc="Partial slots used by split units.")
    max_core_cost = property(lambda self: self._header(lib.AICPU_TILING_HDR_MAX_CORE_COST),
                             doc="Modelled cost of the busiest core.")
    total_cost = property(lambda self: self._header(lib.AICPU_TILING_HDR_TOTAL_COST),
                          doc="Modelled total cost W (one segment per unit).")

    def cores(self) -> list[CoreRange]:
        """The core table, one record per core."""
        table = self.words[HEADER_WORDS : HEADER_WORDS + CORE_WORDS * self.params.num_cores]
        records = []
        for rec in table.reshape(self.params.num_cores, CORE_WORDS).tolist():
            records.append(CoreRange(tuple(rec[0:4]), tuple(rec[4:8]), *rec[8:12]))
        return records

    def combine_records(self) -> list[CombineRecord]:
        """The split units, in (head-major) work order; the table follows the core table."""
        start = HEADER_WORDS + CORE_WORDS * self.params.num_cores
        count = self._header(lib.AICPU_TILING_HDR_NUM_COMBINE)
        rows = self.words[start : start + COMBINE_WORDS * count].reshape(count, COMBINE_WORDS)
        return [CombineRecord(*row[:5]) for row in rows.tolist()]

    def segments(self) -> list[Segment]:
        """Every core's segments in its execution order (empty when the status is not OK)."""
        if self.status != OK:
            return []
        return decode_segments(self.params, self.cores(), self.cu_seqlens_q, self.seqlens_kv,
                               self.causal)

    def __repr__(self) -> str:
        return (f"Tiling(status={self.status}, batch={self.batch}, tokens={self.num_tokens}, "
                f"segments={self.num_segments}, max_core_cost={self.max_core_cost})")


def work_order_key(position: Sequence[int]) -> tuple[int, int, int, int]:
    """A position's sort key in the head-major work order.

    Args:
        position: ``(request, kv head, query tile, kv block)`` as a core record stores it.

    Returns:
        ``(kv head, request, query tile, kv block)``: positions compare as these tuples.
    """
    r, h, t, k = (int(x) for x in position)
    return h, r, t, k


def decode_segments(params: TilingParams, cores: Sequence[CoreRange], cu_seqlens_q: Sequence[int],
                    seqlens_kv: Sequence[int], causal: bool) -> list[Segment]:
    """Walk each core's range in the head-major work order the way the attention kernel does.

    Args:
        params: the static params the tiling was planned with (block_size, q_tile,
            num_kv_heads and sliding_window are read).
        cores: the core table (:meth:`Tiling.cores`).
        cu_seqlens_q: ``[batch + 1]`` query offsets; seqlens_kv: ``[batch]`` kv lengths.
        causal: the flag the tiling was planned with.

    Returns:
        Every core's segments in its execution order, block ranges as absolute block-table
        columns. A core's last segment stops inside its unit when the core's end names that
        unit, else it runs to the unit's last column; later units start at their first
        column. The walk reads positions as absolute columns, so it serves ABI v4 tilings too
        (there every unit starts at column 0).
    """
    batch = len(seqlens_kv)
    q_tile, block = params.q_tile, params.block_size
    window = params.sliding_window or 0
    q_lens = [int(cu_seqlens_q[r + 1]) - int(cu_seqlens_q[r]) for r in range(batch)]

    def unit_kv_end(r: int, t: int) -> int:
        if not causal:
            return int(seqlens_kv[r])
        return int(seqlens_kv[r]) - q_lens[r] + min((t + 1) * q_tile, q_lens[r])

    def unit_first_column(r: int, t: int) -> int:
        # floor(kv_begin / block_size), kv_begin the window start of the tile's first row
        if not window:
            return 0
        return max(0, int(seqlens_kv[r]) - q_lens[r] + t * q_tile - window + 1) // block

    live = [r for r in range(batch) if q_lens[r] > 0]
    next_live = dict(itertools.pairwise(live))

    def next_unit(r: int, h: int, t: int) -> tuple[int, int, int]:
        # the next query tile, else the next live request under this head, else the first
        # live request under the next head, else the end of the work (0, num_kv_heads, 0)
        if (t + 1) * q_tile < q_lens[r]:
            return r, h, t + 1
        if r in next_live:
            return next_live[r], h, 0
        if h + 1 < params.num_kv_heads:
            return live[0], h + 1, 0
        return 0, params.num_kv_heads, 0

    out: list[Segment] = []
    for core, rec in enumerate(cores):
        r, h, t = rec.begin[:3]
        first_block = rec.begin[3]
        for index in range(rec.num_segments):
            kv_end = unit_kv_end(r, t)
            blocks = -(-kv_end // block)
            last = index == rec.num_segments - 1
            # the end names this unit exactly when the core stops inside it
            stop_block = rec.end[3] if last and tuple(rec.end[:3]) == (r, h, t) else blocks
            if index == 0:
                split = rec.first_slot
            else:
                split = rec.last_slot if last else -1
            out.append(Segment(core, r, h, t * q_tile, min((t + 1) * q_tile, q_lens[r]),
                               first_block * block, min(stop_block * block, kv_end), split,
                               first_block, stop_block))
            r, h, t = next_unit(r, h, t)
            if h < params.num_kv_heads:
                first_block = unit_first_column(r, t)
    return out


# --------------------------------------------------------------------------- planning


def _pointer(array: Any, ctype: str) -> Any:
    """A cffi pointer to a contiguous numpy array or CPU torch tensor (no copy)."""
    if hasattr(array, "data_ptr"):
        if not array.is_contiguous():
            raise TilingBufferError("tensors passed to the kernel must be contiguous")
        return ffi.cast(ctype, array.data_ptr())
    if not array.flags.c_contiguous:
        raise TilingBufferError("arrays passed to the kernel must be C-contiguous")
    return ffi.cast(ctype, array.ctypes.data)


def _nbytes(array: Any) -> int:
    if hasattr(array, "data_ptr"):
        return array.numel() * array.element_size()
    return array.nbytes


def plan_into(params: TilingParams, cu_seqlens_q: Any, seqlens_kv: Any, batch: int,
              out_buffer: Any, *, causal: bool = True, epoch: int = 0) -> int:
    """Run the kernel on caller-owned memory, the way the AI-CPU task does. No copies.

    Args:
        params: static parameters.
        cu_seqlens_q: int32 ``[>= batch + 1]`` contiguous numpy array or CPU tensor.
        seqlens_kv: int32 ``[>= batch]`` likewise.
        batch: live requests (``0 <= batch <= params.max_batch``, else the status says so).
        out_buffer: contiguous numpy array or CPU tensor of at least ``params.tiling_bytes``.
        causal: causal attention with a KV cache.
        epoch: int32 step epoch, echoed in the header (`Tiling.epoch`).

    Returns:
        The kernel status (0 is OK); the buffer's header holds the details.

    Raises:
        TilingBufferError: an input is not int32, too short, or the buffer too small.
    """
    for name, array, need in (("cu_seqlens_q", cu_seqlens_q, batch + 1),
                              ("seqlens_kv", seqlens_kv, batch)):
        dtype = str(getattr(array, "dtype", ""))
        if "int32" not in dtype:
            raise TilingBufferError(f"{name} must be int32, got {dtype or type(array).__name__}")
        if 0 <= batch <= params.max_batch and _nbytes(array) < 4 * need:
            raise TilingBufferError(f"{name} holds {_nbytes(array) // 4} values, need {need}")
    size = _nbytes(out_buffer)
    if size < params.tiling_bytes:
        raise TilingBufferError(f"tiling buffer has {size} bytes, need {params.tiling_bytes}")
    return lib.aicpu_tiling_plan(
        params._c, _pointer(cu_seqlens_q, "int32_t *"), _pointer(seqlens_kv, "int32_t *"),
        int(batch), _int32_scalar("epoch", epoch), CAUSAL if causal else 0,
        _pointer(out_buffer, "void *"), size)


def _int32_scalar(name: str, value: Any) -> int:
    value = int(value)
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise TilingBufferError(f"{name} must fit in int32, got {value}")
    return value


def _host_inputs(params: TilingParams, cu_seqlens_q: Any, seqlens_kv: Any):
    cu = _as_int32("cu_seqlens_q", cu_seqlens_q)
    kv = _as_int32("seqlens_kv", seqlens_kv)
    if cu.size != kv.size + 1:
        raise TilingBufferError(
            f"cu_seqlens_q must have len(seqlens_kv) + 1 = {kv.size + 1} entries, got {cu.size}")
    return cu, kv


def plan(params: TilingParams, cu_seqlens_q: Any, seqlens_kv: Any, *,
         causal: bool = True, epoch: int = 0) -> Tiling:
    """Run the C kernel on the host.

    Args:
        params: static parameters.
        cu_seqlens_q: ``[batch + 1]`` query offsets (query_start_loc), ints.
        seqlens_kv: ``[batch]`` kv lengths including this step's tokens, ints.
        causal: causal attention with a KV cache (query rows are the last q_len positions).
        epoch: int32 step epoch, echoed in the header (`Tiling.epoch`).

    Returns:
        A Tiling. Bad lengths do not raise here: like on the device, they set the tiling's
        status; call ``raise_for_status()`` or read ``.error``.

    Raises:
        TilingBufferError: the inputs are not 1-D integer sequences of matching lengths.
    """
    cu, kv = _host_inputs(params, cu_seqlens_q, seqlens_kv)
    buffer = np.zeros(params.tiling_bytes, dtype=np.uint8)
    plan_into(params, cu, kv, kv.size, buffer, causal=causal, epoch=epoch)
    return Tiling(params, buffer, cu, kv, causal)


def reference_plan(params: TilingParams, cu_seqlens_q: Any, seqlens_kv: Any, *,
                   causal: bool = True, epoch: int = 0) -> Tiling:
    """Same as :func:`plan`, computed by the slow pure-Python oracle."""
    from pyruntime import tiling_oracle

    cu, kv = _host_inputs(params, cu_seqlens_q, seqlens_kv)
    words = tiling_oracle.oracle_plan(params, cu.tolist(), kv.tolist(), kv.size, causal,
                                      epoch=_int32_scalar("epoch", epoch))
    buffer = np.zeros(params.tiling_bytes, dtype=np.uint8)
    buffer.view(np.int32)[: len(words)] = words
    return Tiling(params, buffer, cu, kv, causal)
