"""A model of the direct competitor: FIA v2's split computed on the AI-CPU by vLLM-Ascend's
``FusedInferAttentionScoreV2SinkMetadata`` operator (our own code, written from the public
source; nothing is copied).

vLLM-Ascend PRs #15215/#15336 add an AI-CPU operator that reads the per-step lengths on the
device and writes the core split of ``npu_fused_infer_attention_score_v2_sink`` into a
1024-word metadata tensor, so that the ACL graph holds no host tiling: the job this project
does for FIA. Sources read (vllm-project/vllm-ascend, as stored at the commits named):

* AI-CPU kernel, ``csrc/attention/fused_infer_attention_score_v2_sink_metadata/op_kernel_aicpu/
  fused_infer_attention_score_v2_sink_metadata_aicpu.cpp`` (commit 79e5f65; line numbers
  below are of that file): ``Compute`` (39-75) picks the GQA or MLA block sizes and calls its
  own ``SplitCore`` (1991-2034), a port of ops-transformer's ``split_core.cpp`` ("SplitCore
  isomorphic split" in the PR's design note).
* its header ``.../op_kernel_aicpu/fused_infer_attention_score_v2_sink_metadata_aicpu.h``
  (commit 223cd5f): ``FA_TOLERANCE_RATIO = 2`` (line 22), ``IsWithinTolerance`` is
  ``limit + tolerance >= value`` (79-82), member defaults ``mBaseSize_ = 256``,
  ``splitKVFlag_ = false`` (never set in the kernel).
* the Python caller ``vllm_ascend/ops/fia_v2_sink.py`` (commit 223cd5f)
  ``build_fia_v2_sink_metadata`` (23-72): ``sink_num=0, k_sink_num=0`` (62-63), the stream's
  cube and vector core counts (66-67), the caller's layout, sparse mode and pre/next tokens.

What is modelled, function by function of the kernel:

* **Block sizes** (:func:`sink_split_sizes`). ``CalcInnerSizeGqa`` (283-360) for the TND
  layout vLLM-Ascend passes: ``sInnerSize_ = 512`` (294), ``min(., 1024)`` under a
  compressed mask (339-341), rounded down to a multiple of a paged block size that does not
  divide it (344-349), capped at the longest kv length ``s2Size`` (354-356; ``GetS2Size``
  687-716 takes the max over every entry, padded ones included; ``Compute`` uses 1024 when it
  is 0, 46-54). ``CalcMBaseSizeGqa`` (362-398): ``mBaseSize_ = 512`` for TND (365). The
  sink-token branches (298-316, 368-375) need ``sink_num``/``k_sink_num`` > 0, which the
  caller never passes; batch-invariant mode (256 x 256, 289-291, 394-396) is not modelled.
* **MLA block sizes** (:func:`sink_split_sizes_mla`): ``CheckIsMla`` (803-850) takes the MLA
  path only for ``rope_head_dim = 64``, ``D = 512``, one kv head and ``G`` in
  ``{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128}`` (842); ``CalcInnerSizeMla``
  (124-184) is 512 (no flash-decode halving: ``splitKVFlag_`` is never set), rounded to the
  paged block, capped at ``s2Size``; ``CalcMBaseSizeMla`` (186-227) keeps 256 unless
  ``B * N2`` is not a multiple of the cores and every kv length is the same
  (``DealSameSeqEachBatch`` 269-281, with ``isSameActualseq`` from ``GetActualSeqInfo``
  759-796 over *every* entry, padded ones included): then ``S1 * G / (lcm(B * N2, cores) /
  (B * N2))`` when it divides exactly and lies in [128, 256].
* **Cost model**: ``CalcCost`` (1257-1264), ``6 * ceil(M / 16) + 10 * ceil(S2 / 64)`` per
  block of M rows x S2 kv tokens, and ``CalcCostTable`` (1266-1281): normal, row-tail,
  kv-tail and both; a row's last block is a kv tail block only when the row reaches the kv
  end (``CalcS1GCache`` 1437-1511). The same model as FIA V3 (:func:`.fia_v3.block_cost`).
* **Mask and window** (:func:`sink_rows`): ``GetPreNextToken`` (718-757) turns the sparse
  mode into pre/next tokens (mode 0 with both at INT_MAX means no mask; modes 2/3 have
  ``next = 0``; mode 4, the band vLLM-Ascend uses for a sliding window, keeps the caller's
  tokens), ``CalcPreTokenLeftUp``/``CalcNextTokenLeftUp`` (1227-1255) move them to the
  top-left corner, and ``CalcS2Range`` (1283-1344) gives each row tile (``mBaseSize`` rows
  of the token-major ``S1 x G`` axis, ``isS1G`` for TND) the kv blocks
  ``[floor(s2First / s2Base), floor(s2Last / s2Base) + 1)`` with ``s2First = s1First -
  preTokenLeftUp`` and ``s2Last = s1Last + nextTokenLeftUp`` clipped to the kv length: under
  a window a row starts at its first token's window start, on the absolute 512-token grid,
  so a 128-token window costs whole 512-token blocks in its cost model.
* **Padding**: a batch entry with no query or no kv tokens has no blocks and cost 0
  (``CalcBatchCost`` 1557-1584, 1568; ``CalcS2Range`` 1293-1295), and ``AssignByBatch``
  takes a zero-cost entry whole without charging it (1668): padded slots ride free.
* **The split** (``CalcSplitPlan`` 1875-1946, ``SplitCore`` 1991-2034): cores in order, core
  ``i`` limited to ``unassigned / (cores - i)`` (1911), then ``AssignByBatch`` (1658-1696),
  ``AssignByRow`` (1698-1727), ``AssignByBlock`` (1758-1792) within half the next piece's
  last block, ``ForceAssign`` (1794-1824) of one block for a core that got none, for every
  core count from ``round(sqrt(blocks))`` to ``min(cores, blocks)`` (2012-2015), keeping the
  cheapest busiest core. This is FIA V3's ``SplitCore`` step for step, so the plan is
  :func:`.fia_v3.plan_rows` on this kernel's rows (its ``AssignByRow`` has no bound at the
  last row, but reaching it there needs exactly the condition under which ``AssignByBatch``
  already took the rest of the entry, so the two agree). ``SplitFD`` (1948-1989) only places
  the flash-decode reductions on vector cores and does not move work between AI Cores.

Consequence: on causal TND batches without a window the split is FIA V3's (same sizes, same
rows, same plan), and at MLA geometry it is FIA MLA's except for the same-length test over
padded entries; it differs where it has its own handling: the band window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .fia_v3 import MLA_M_BASE, MLA_M_MIN, MLA_S2_BASE, _as_partition, _Row, block_cost, plan_rows
from .workload import NotApplicableError, Partition, Workload, _ceil_div

TOKENS_MAX = 2_147_483_647  # SPARSE_MODE_INT_MAX (GetPreNextToken): "no limit"
NO_MASK, RIGHT_DOWN_CAUSAL, BAND = 0, 3, 4  # the sparse modes vLLM-Ascend passes
MLA_GROUPS = frozenset({1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128})  # CheckIsMla
TND_S2_BASE, TND_M_BASE, MASK_S2_CAP, EMPTY_KV_S2_SIZE = 512, 512, 1024, 1024

__all__ = [
    "SinkMask",
    "fia_v2_sink_metadata",
    "fia_v2_sink_metadata_mla",
    "sink_rows",
    "sink_split_core",
    "sink_split_sizes",
    "sink_split_sizes_mla",
]


@dataclass(frozen=True)
class SinkMask:
    """The kernel's mask attributes as the caller passes them (``sparse_mode``,
    ``pre_tokens``, ``next_tokens``), resolved as ``GetPreNextToken`` does.

    Raises:
        ValueError: what the model does not take: a sparse mode other than vLLM-Ascend's
            (``attention_v1.py``: 0 without token limits, 3, or 4), or negative tokens (the
            kernel would then leave rows with no visible key, which no caller passes).
    """

    sparse_mode: int = RIGHT_DOWN_CAUSAL
    pre_tokens: int = TOKENS_MAX
    next_tokens: int = TOKENS_MAX

    def __post_init__(self) -> None:
        if self.sparse_mode not in (NO_MASK, RIGHT_DOWN_CAUSAL, BAND):
            raise ValueError(f"sparse mode {self.sparse_mode} is not modelled (0, 3 or 4)")
        if self.sparse_mode == NO_MASK and self.masked:
            raise ValueError("sparse mode 0 is modelled without token limits only")
        if min(self.pre_tokens, self.next_tokens) < 0:
            raise ValueError(f"pre/next tokens must be >= 0, got {self.pre_tokens}, "
                             f"{self.next_tokens}")  # fmt: skip

    @property
    def masked(self) -> bool:
        """``attenMaskFlag``: false only for mode 0 with both token limits at INT_MAX."""
        return not (self.sparse_mode == NO_MASK and self.pre_tokens == TOKENS_MAX
                    and self.next_tokens == TOKENS_MAX)  # fmt: skip

    def tokens(self) -> tuple[int, int]:
        """``(preToken, nextToken)`` after ``GetPreNextToken``: causal modes see everything
        before and nothing after; otherwise an INT_MAX limit reads as 0."""
        if self.sparse_mode == RIGHT_DOWN_CAUSAL:
            return TOKENS_MAX, 0
        pre = 0 if self.pre_tokens == TOKENS_MAX else self.pre_tokens
        nxt = 0 if self.next_tokens == TOKENS_MAX else self.next_tokens
        return pre, nxt

    def left_up(self, s1: int, s2: int) -> tuple[int, int]:
        """``(preTokenLeftUp, nextTokenLeftUp)`` of one batch entry: the band measured from
        the top-left corner of its ``s1 x s2`` score matrix."""
        pre, nxt = self.tokens()
        if self.sparse_mode == BAND:
            return s1 - s2 + pre, s2 - s1 + nxt
        if self.sparse_mode == RIGHT_DOWN_CAUSAL:
            return pre, s2 - s1
        return pre, nxt


def _fit_inner(inner: int, block_size: int, s2_size: int) -> int:
    """The paged-block rounding and the kv-length cap both size functions end with."""
    if block_size and inner > block_size and inner % block_size:
        inner = inner // block_size * block_size
    return min(inner, s2_size or EMPTY_KV_S2_SIZE)


def sink_split_sizes(
    s2_size: int, block_size: int = 0, mask: SinkMask = SinkMask()
) -> tuple[int, int]:
    """``(mBaseSize, sInnerSize)`` of the GQA path for the TND layout
    (``CalcInnerSizeGqa``/``CalcMBaseSizeGqa``, no sink tokens, not batch-invariant).

    Args:
        s2_size: the longest kv length of the step (every entry); 0 reads as 1024.
        block_size: paged block size, 0 when not paged.
        mask: the caller's mask attributes.
    """
    inner = TND_S2_BASE
    if mask.masked and mask.sparse_mode in (RIGHT_DOWN_CAUSAL, BAND):
        inner = min(inner, MASK_S2_CAP)
    return TND_M_BASE, _fit_inner(inner, block_size, s2_size)


def sink_split_sizes_mla(
    s2_size: int,
    block_size: int = 0,
    *,
    bn2: int = 0,
    s1g: int = 0,
    cores: int = 24,
    same_lengths: bool = False,
) -> tuple[int, int]:
    """``(mBaseSize, sInnerSize)`` of the MLA path (``CalcInnerSizeMla``/``CalcMBaseSizeMla``).

    Args:
        s2_size: the longest kv length (every entry; 0 reads as 1024).
        block_size: paged block size, 0 when not paged.
        bn2: ``B * N2`` with padded entries; s1g: the longest query times ``G``.
        cores: AI Cores; same_lengths: every kv length equal, padded entries included.
    """
    inner = _fit_inner(MLA_S2_BASE, block_size, s2_size)
    m_base = MLA_M_BASE
    if bn2 and cores and bn2 % cores and same_lengths:
        parts = cores // math.gcd(bn2, cores)  # lcm(B * N2, cores) / (B * N2)
        if s1g % parts == 0 and MLA_M_MIN <= s1g // parts <= m_base:
            m_base = s1g // parts
    return m_base, inner


def sink_rows(
    s1: int, s2: int, group: int, m_base: int, s2_base: int, mask: SinkMask
) -> list[_Row]:
    """The row tiles of one batch entry with their kv blocks and block costs
    (``CalcSplitInfo``, ``CalcCostTable``, ``CalcS2Range`` for the token-major TND rows).

    Returns:
        One :class:`~.fia_v3._Row` per row tile with blocks ``[s2_start, s2_end)`` on the
        absolute ``s2_base`` grid; ``[]`` for an entry with no query or no kv (padding).
    """
    if s1 == 0 or s2 == 0:
        return []
    rows_total = s1 * group
    m_tail, s2_tail = rows_total % m_base, s2 % s2_base
    s2_blocks = _ceil_div(s2, s2_base)
    pre_lu, next_lu = mask.left_up(s1, s2)
    out = []
    for r in range(_ceil_div(rows_total, m_base)):
        if mask.masked:
            first = r * m_base // group
            last = (min((r + 1) * m_base, rows_total) - 1) // group
            s2_first, s2_last = first - pre_lu, last + next_lu
            # (the kernel's "no valid token" case, 1330-1335, needs negative tokens or a
            # query longer than its kv, which SinkMask and Workload refuse)
            start = max(s2_first, 0) // s2_base
            end = min(s2_last, s2 - 1) // s2_base + 1
        else:
            start, end = 0, s2_blocks
        m = m_tail if (m_tail and r == _ceil_div(rows_total, m_base) - 1) else m_base
        normal = block_cost(m, s2_base)
        last_cost = block_cost(m, s2_tail) if (s2_tail and end == s2_blocks) else normal
        out.append(_Row(len(out), start, end, normal, last_cost))
    return out


def sink_split_core(
    workload: Workload, sizes: tuple[int, int], mask: SinkMask
) -> list[list[tuple[int, int, int, int]]]:
    """The kernel's ``SplitCore`` on a step's lengths with the given block sizes.

    Returns:
        Per used core, its pieces ``(pair = batch * kv_heads + head, row, s2_from, s2_to)``
        in the kernel's blocks (``[[]]`` when there is no block).
    """
    m_base, s2_base = sizes
    model = workload.model
    rows_of = [sink_rows(q, kv, model.group, m_base, s2_base, mask)
               for q, kv in zip(workload.q_lens, workload.seqlens_kv)]  # fmt: skip
    return plan_rows(rows_of, model.num_kv_heads, model.num_cores)


def _split(workload: Workload, sizes: tuple[int, int], mask: SinkMask) -> Partition:
    pieces = sink_split_core(workload, sizes, mask)
    return _as_partition("fia_v2_sink_metadata", workload, pieces, *sizes)


def default_mask(workload: Workload) -> SinkMask:
    """The mask vLLM-Ascend's ``attention_v1.py`` passes for this workload (633-635 in the
    0.30 tree: ``sparse_mode = 4 if sliding_window else 3 if causal else 0``), with the band's
    ``pre_tokens`` set to ``W - 1`` so that a row sees the same W keys as every other
    partitioner (vLLM-Ascend passes ``pre_tokens = W``, one key more)."""
    window = getattr(workload, "sliding_window", None)
    if window:
        return SinkMask(BAND, window - 1, 0)
    return SinkMask(RIGHT_DOWN_CAUSAL if workload.model.causal else NO_MASK)


def fia_v2_sink_metadata(workload: Workload, mask: SinkMask | None = None) -> Partition:
    """The metadata operator's GQA split of one step, as a partition of our units.

    Args:
        workload: the step (a :class:`~.windowed.WindowedWorkload` for a sliding window).
        mask: the caller's mask attributes (default :func:`default_mask`).

    Raises:
        ValueError: a row tile that is not a whole number of our query tiles.
    """
    mask = default_mask(workload) if mask is None else mask
    sizes = sink_split_sizes(max(workload.seqlens_kv, default=0), workload.model.block_size,
                             mask)  # fmt: skip
    return _split(workload, sizes, mask)


def fia_v2_sink_metadata_mla(workload: Workload, mask: SinkMask | None = None) -> Partition:
    """The metadata operator's MLA split (absorbed MLA: one latent kv head, ``D = 512`` and a
    64-wide rope part), as a partition of our units.

    Raises:
        NotApplicableError: ``CheckIsMla`` would not take the MLA path (more than one kv
            head, or ``G`` outside its list), or a row tile ``CalcMBaseSizeMla`` shrank is not
            a whole number of our query tiles.
    """
    model = workload.model
    if model.num_kv_heads != 1 or model.group not in MLA_GROUPS:
        raise NotApplicableError(f"the sink metadata kernel's MLA path takes one kv head and "
                                 f"G in {sorted(MLA_GROUPS)}, got {model.num_kv_heads} kv "
                                 f"heads, G = {model.group}")  # fmt: skip
    mask = default_mask(workload) if mask is None else mask
    kv = workload.seqlens_kv
    sizes = sink_split_sizes_mla(
        max(kv, default=0), model.block_size, bn2=workload.batch * model.num_kv_heads,
        s1g=max(workload.q_lens, default=0) * model.group, cores=model.num_cores,
        same_lengths=len(set(kv)) <= 1,
    )  # fmt: skip
    try:
        return _split(workload, sizes, mask)
    except ValueError as exc:
        raise NotApplicableError(str(exc)) from exc
