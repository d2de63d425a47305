"""A model of FIA V3's core split, ``SplitCore`` (our own code, written from the public source).

GQA fp16/bf16 ``npu_fused_infer_attention_score`` calls now route to FIA V3 (ops-transformer
``RouteToFia``), whose host tiling ``FiaTilingNonQuant::Split()``
(``attention/common/op_host/arch32/fia_tiling_nonquant.cpp``) picks its block sizes with
``CalcInnerSize`` / ``CalcMBaseSize`` and calls ``SplitCore``
(``attention/common/op_host/split_core.cpp``, ops-transformer on gitcode / its GitHub mirrors).
What is modelled, function by function:

* ``CalcInnerSize`` / ``CalcMBaseSize`` (:func:`split_sizes`): the kv block ``s2BaseSize``
  and the row tile ``mBaseSize`` (rows of the packed ``S1 x G`` axis). TND/NTD layouts (what
  vLLM-Ascend's ``attention_v1.py`` passes) use 512 and 512; decode layouts with ``S1 <= 16``
  pick 8192/4096/2048 by ``G / 5`` and an M tile from the aligned kv block.
* ``CalcCost``: a block of ``M`` rows and ``S2`` kv tokens costs
  ``6 * ceil(M / 16) + 10 * ceil(S2 / 64)``; ``CalcCostTable`` prices normal and tail
  blocks; ``CalcS2Range`` gives each row's kv blocks under the right-down causal mask
  (sparse mode 3, what vLLM-Ascend uses).
* ``CalcSplitPlan``: cores are filled in order; core ``i`` gets the limit
  ``unassigned / (cores - i)`` and takes, in turn, whole (batch, kv head) pairs
  (``AssignByBatch``), whole rows (``AssignByRow``) and single blocks (``AssignByBlock``)
  while the cost stays within the limit plus half the next piece's last block
  (``IsWithinTolerance``, ``FA_TOLERANCE_RATIO = 2``); a core that got nothing takes one
  block (``ForceAssign``).
* ``SplitCore``: plans for every core count from ``round(sqrt(blocks))`` to
  ``min(cores, blocks)`` and keeps the plan with the smallest busiest core (a plan is
  abandoned as soon as it exceeds the best so far).

FIA's MLA template (:func:`fia_mla`, ``FiaTilingNonQuantMla``) calls the same ``SplitCore``
with its own sizes (:func:`split_sizes_mla`: 256-row tiles, 512-token kv blocks).

The partition is returned as segments of our units: a row tile spans ``mBaseSize / G`` query
tokens (whole query tiles of ours) and a kv block ``s2BaseSize`` tokens (whole blocks of ours).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .workload import NotApplicableError, Partition, Segment, Workload, _ceil_div

FA_TOLERANCE_RATIO = 2
M_ALIGN, S2_ALIGN = 16, 64
M_WEIGHT, S2_WEIGHT = 6, 10


def block_cost(rows: int, kv_tokens: int) -> int:
    """``CalcCost``: ``6 * ceil(rows / 16) + 10 * ceil(kv_tokens / 64)``."""
    return M_WEIGHT * _ceil_div(rows, M_ALIGN) + S2_WEIGHT * _ceil_div(kv_tokens, S2_ALIGN)


def split_sizes(
    layout: str, s1_max: int, group: int, s2_max: int, block_size: int = 0, masked: bool = True
) -> tuple[int, int]:
    """``(mBaseSize, s2BaseSize)`` as ``CalcInnerSize`` then ``CalcMBaseSize`` choose them.

    Args:
        layout: query layout, ``"TND"``/``"NTD"`` or another (``"BSND"``, ``"BNSD"``, ...).
        s1_max: the largest query length (``s1Size``); group: query heads per kv head.
        s2_max: the kv length the tiling is sized for (``s2Size``).
        block_size: paged-KV block size, 0 when not paged.
        masked: a compressed causal mask (sparse mode 2, 3 or 4) is given.
    """
    if layout in ("TND", "NTD"):
        inner = 512
    elif s1_max <= 16:
        inner = (8192, 4096, 2048)[min(group // 5, 2)]
    else:
        inner = 512
    if masked:
        inner = min(inner, 1024)
    if block_size and inner > block_size and inner % block_size:
        inner = inner // block_size * block_size
    inner = min(inner, max(s2_max, 1))
    aligned = _ceil_div(inner, 16) * 16  # Align(sInnerSize, BYTE_BLOCK) in elements
    if layout in ("TND", "NTD") or s1_max > 16:
        m_base = 512
    else:
        m_base = next((m for limit, m in ((512, 512), (1024, 256), (2048, 128), (4096, 64))
                       if aligned <= limit), 32)  # fmt: skip
    return m_base, inner


@dataclass
class _Row:
    """One row tile of a (batch, kv head) pair: its kv blocks and their costs."""

    index: int
    s2_start: int
    s2_end: int
    normal: int  # cost of a full-length block of this row
    last: int  # cost of the row's last block (a kv tail block or a normal one)

    @property
    def blocks(self) -> int:
        return self.s2_end - self.s2_start

    def cost(self, s2_from: int) -> int:
        """Cost of blocks ``[s2_from, s2_end)``."""
        n = self.s2_end - s2_from
        return 0 if n <= 0 else (n - 1) * self.normal + self.last


def _batch_rows(s1: int, s2: int, group: int, m_base: int, s2_base: int) -> list[_Row]:
    """``CalcS1GCache`` for every row of one batch (right-down causal mask)."""
    if s1 == 0 or s2 == 0:
        return []
    rows_total = s1 * group
    n_rows = _ceil_div(rows_total, m_base)
    m_tail = rows_total % m_base
    s2_blocks = _ceil_div(s2, s2_base)
    s2_tail = s2 % s2_base
    out = []
    for r in range(n_rows):
        first = r * m_base
        last_row = min(first + m_base, rows_total) - 1
        s2_last = min(last_row // group + (s2 - s1), s2 - 1)  # nextTokenLeftUp = s2 - s1
        end = s2_last // s2_base + 1
        m = m_tail if (r == n_rows - 1 and m_tail) else m_base
        normal = block_cost(m, s2_base)
        tail = s2_tail and end == s2_blocks
        out.append(_Row(r, 0, end, normal, block_cost(m, s2_tail) if tail else normal))
    return out


class _Plan:
    """``CalcSplitPlan`` for one core count; ``pieces[c]`` lists (pair, row, s2_from, s2_to)."""

    def __init__(self, rows_of: list[list[_Row]], kv_heads: int, cores: int, cost_limit: float):
        self.rows_of, self.kv_heads = rows_of, kv_heads
        pair_cost = [sum(r.cost(r.s2_start) for r in rows) for rows in rows_of]
        pair_last = [rows[-1].last if rows else 0 for rows in rows_of]
        n_pairs = len(rows_of) * kv_heads
        self.pieces: list[list[tuple[int, int, int, int]]] = []
        self.max_cost = 0
        unassigned = sum(pair_cost) * kv_heads
        pair, row, s2 = 0, 0, self._start(0, 0)
        pair_left = pair_cost[0] if rows_of else 0
        finished = n_pairs == 0
        for i in range(cores):
            if self.max_cost > cost_limit:
                self.max_cost = math.inf
                return
            if finished or unassigned <= 0:
                break
            limit = unassigned // (cores - i)
            cost, blocks, mine = 0, 0, []
            # AssignByBatch: the rest of the current pair, then whole pairs
            while pair_left == 0 or limit + pair_last[pair // kv_heads] // FA_TOLERANCE_RATIO >= (
                cost + pair_left
            ):
                rest = self._rest_of_pair(pair, row, s2)
                mine += rest
                cost += pair_left
                blocks += sum(b - a for _, _, a, b in rest)
                pair += 1
                if pair == n_pairs:
                    finished = True
                    break
                row, s2 = 0, self._start(pair, 0)
                pair_left = pair_cost[pair // kv_heads]
            if not finished:
                rows = rows_of[pair // kv_heads]
                # AssignByRow: the rest of the current row, then whole rows
                while row < len(rows) - 1:
                    r = rows[row]
                    row_left = r.cost(s2)
                    if limit + r.last // FA_TOLERANCE_RATIO < cost + row_left:
                        break
                    mine.append((pair, row, s2, r.s2_end))
                    cost += row_left
                    pair_left -= row_left
                    blocks += r.s2_end - s2
                    row += 1
                    s2 = rows[row].s2_start
                # AssignByBlock: single blocks, priced as the block under the cursor
                r = rows[row]
                step = r.last if s2 == r.s2_end - 1 else r.normal
                first = s2
                while s2 < r.s2_end - 1 and limit + step // FA_TOLERANCE_RATIO >= cost + step:
                    cost += step
                    pair_left -= step
                    blocks += 1
                    s2 += 1
                if s2 > first:
                    mine.append((pair, row, first, s2))
                if blocks == 0:  # ForceAssign: one block, then UpdateCursor
                    step = r.last if s2 == r.s2_end - 1 else r.normal
                    mine.append((pair, row, s2, s2 + 1))
                    cost += step
                    pair_left -= step
                    s2 += 1
                    if s2 >= r.s2_end:
                        row += 1
                        if row == len(rows):
                            pair += 1
                            finished = pair == n_pairs
                            row = 0
                            # UpdateCursor reloads the pair's cost only when the batch changes:
                            # the next kv head of the same batch keeps the old remainder (0).
                            if not finished and pair % kv_heads == 0:
                                pair_left = pair_cost[pair // kv_heads]
                        if not finished:
                            s2 = self._start(pair, row)
            self.pieces.append(mine)
            self.max_cost = max(self.max_cost, cost)
            unassigned -= cost
        if not finished and self.pieces:
            # Work the plan's own accounting lost (see UpdateCursor above): the source's
            # last core range stops short of it; here the last core takes it so that the
            # partition stays complete.
            self.pieces[-1] += [p for q in range(pair, n_pairs)
                                for p in self._rest_of_pair(q, row if q == pair else 0,
                                                            s2 if q == pair else 0)]  # fmt: skip

    def _start(self, pair: int, row: int) -> int:
        rows = self.rows_of[pair // self.kv_heads] if self.rows_of else []
        return rows[row].s2_start if row < len(rows) else 0

    def _rest_of_pair(self, pair: int, row: int, s2: int) -> list[tuple[int, int, int, int]]:
        rows = self.rows_of[pair // self.kv_heads]
        out = []
        for r in rows[row:]:
            begin = s2 if r.index == row else r.s2_start
            if begin < r.s2_end:
                out.append((pair, r.index, begin, r.s2_end))
        return out


def split_core(
    workload: Workload, layout: str = "TND", sizes: tuple[int, int] | None = None
) -> tuple[list[list[tuple[int, int, int, int]]], int, int]:
    """``SplitCore`` on a workload's lengths.

    Args:
        sizes: ``(mBaseSize, s2BaseSize)`` chosen by the caller's tiling (MLA:
            :func:`split_sizes_mla`); default :func:`split_sizes` (FIA V3 GQA).

    Returns:
        ``(pieces, m_base, s2_base)``: per used core, its pieces
        ``(pair = batch * kv_heads + head, row, s2_from, s2_to)`` in FIA blocks.
    """
    model = workload.model
    q_lens = workload.q_lens
    s1_max = max(q_lens, default=0)
    s2_max = max(workload.seqlens_kv, default=0)
    if sizes is None:
        sizes = split_sizes(layout, s1_max, model.group, s2_max, model.block_size)
    m_base, s2_base = sizes
    rows_of = [
        _batch_rows(q, kv, model.group, m_base, s2_base)
        for q, kv in zip(q_lens, workload.seqlens_kv)
    ]
    return plan_rows(rows_of, model.num_kv_heads, model.num_cores), m_base, s2_base


def plan_rows(
    rows_of: list[list[_Row]], kv_heads: int, num_cores: int
) -> list[list[tuple[int, int, int, int]]]:
    """``SplitCore``'s search over core counts for rows already priced: a :class:`_Plan` for
    every count from ``round(sqrt(blocks))`` to ``min(cores, blocks)``, the one with the
    cheapest busiest core kept (shared with the FIA v2 sink metadata model, whose AI-CPU
    kernel runs the same search on its own rows).

    Args:
        rows_of: per batch entry, its row tiles (the same for every kv head).
        kv_heads: kv heads (``N2``); num_cores: AI Cores.

    Returns:
        Per used core, its pieces ``(pair = batch * kv_heads + head, row, s2_from, s2_to)``;
        ``[[]]`` when there is no block at all.
    """
    total_blocks = sum(r.blocks for rows in rows_of for r in rows) * kv_heads
    if total_blocks == 0:
        return [[]]
    max_core = min(num_cores, total_blocks)
    min_core = min(int(math.sqrt(total_blocks + 0.25) + 0.5), max_core)
    best: _Plan | None = None
    for cores in range(min_core, max_core + 1):
        plan = _Plan(rows_of, kv_heads, cores, best.max_cost if best else math.inf)
        if best is None or plan.max_cost < best.max_cost:
            best = plan
    assert best is not None
    return best.pieces


def fia_v3(workload: Workload, layout: str = "TND") -> Partition:
    """FIA V3 ``SplitCore`` as a partition of our units (cores it leaves unused stay empty)."""
    pieces, m_base, s2_base = split_core(workload, layout)
    return _as_partition("fia_v3", workload, pieces, m_base, s2_base)


def _as_partition(name: str, workload: Workload, pieces, m_base: int, s2_base: int) -> Partition:
    """``SplitCore``'s pieces as segments of our units.

    Raises:
        ValueError: a row tile is not a whole number of our query tiles.
    """
    model = workload.model
    if m_base % model.group or (m_base // model.group) % model.q_tile:
        raise ValueError(
            f"FIA row tile of {m_base} rows is not a whole number of {model.q_tile}-token "
            f"query tiles at group {model.group}"
        )
    row_tokens = m_base // model.group
    cores: list[list[Segment]] = [[] for _ in range(model.num_cores)]
    for c, core_pieces in enumerate(pieces):
        for pair, row, s2_from, s2_to in core_pieces:
            request, head = divmod(pair, model.num_kv_heads)
            q_len = workload.q_lens[request]
            q_span = (row * row_tokens, min((row + 1) * row_tokens, q_len))
            kv_span = (s2_from * s2_base, s2_to * s2_base)
            cores[c] += workload.piece_segments(request, head, q_span, kv_span)
    return Partition(name, workload, cores)


# ---------------------------------------------------------------- MLA (FiaTilingNonQuantMla)

MLA_M_BASE, MLA_S2_BASE, MLA_M_MIN = 256, 512, 128


def split_sizes_mla(
    s2_max: int,
    block_size: int = 0,
    *,
    bn2: int = 0,
    s1g: int = 0,
    cores: int = 24,
    same_lengths: bool = False,
) -> tuple[int, int]:
    """``(mBaseSize, s2BaseSize)`` of FIA's MLA tiling, ``FiaTilingNonQuantMla``
    (ops-transformer ``attention/common/op_host/arch32/fia_tiling_nonquant_mla.{h,cpp}``).

    ``CalcInnerSize``: ``sInnerSize_ = 512``; the flash-decode halving does not apply (it needs
    ``splitKVFlag_``, which ``Split()`` sets only after ``SplitCore``; and never in TND);
    rounded down to a multiple of a paged block size that does not divide it; capped at the
    kv length. ``CalcMBaseSize``: ``mBaseSize_ = 256`` (the header's default) unless
    ``B * N2`` is not a multiple of the cores and every request has the same kv length
    (``DealSameSeqEachBatch``): then ``S1 * G / (lcm(B * N2, cores) / (B * N2))`` when that
    divides ``S1 * G`` exactly and lies in ``[128, 256]``.

    Args:
        s2_max: the kv length the tiling is sized for; block_size: paged block, 0 if not paged.
        bn2: ``B * N2``; s1g: ``S1 * G`` (the longest query times the group); cores: AI Cores.
        same_lengths: every request has the same kv length.
    """
    inner = MLA_S2_BASE
    if block_size and inner > block_size and inner % block_size:
        inner = inner // block_size * block_size
    inner = min(inner, max(s2_max, 1))
    m_base = MLA_M_BASE
    if bn2 and cores and bn2 % cores and same_lengths:
        split = cores // math.gcd(bn2, cores)  # lcm(bn2, cores) / bn2
        if s1g % split == 0 and MLA_M_MIN <= s1g // split <= m_base:
            m_base = s1g // split
    return m_base, inner


def fia_mla(workload: Workload) -> Partition:
    """FIA's MLA split as a partition of our units: ``FiaTilingNonQuantMla::Split()`` calls the
    same ``SplitCore`` as FIA V3 (:class:`_Plan`, ``CalcCost`` unchanged) with the sizes of
    :func:`split_sizes_mla`.

    vLLM-Ascend's MLA decode (``vllm_ascend/attention/mla_v1.py``) passes ``BNSD_NBSD`` with
    one query token per batch entry and no mask, or, with speculative decoding,
    ``TND_NTD`` with ``sparse_mode = 3``: the query rows are packed token-major (``isS1G``)
    under the right-down causal mask, which is what :func:`_batch_rows` models (with one token
    the two layouts and the mask make no difference).

    Raises:
        NotApplicableError: a row tile that ``CalcMBaseSize`` shrank is not a whole number of
            our query tiles (only when every request has the same kv length).
    """
    model = workload.model
    kv = workload.seqlens_kv
    live = [k for q, k in zip(workload.q_lens, kv) if q]
    sizes = split_sizes_mla(
        max(kv, default=0), model.block_size,
        bn2=workload.batch * model.num_kv_heads,
        s1g=max(workload.q_lens, default=0) * model.group, cores=model.num_cores,
        same_lengths=len(set(live)) <= 1,
    )  # fmt: skip
    pieces, m_base, s2_base = split_core(workload, "TND", sizes)
    try:
        return _as_partition("fia_mla", workload, pieces, m_base, s2_base)
    except ValueError as exc:
        raise NotApplicableError(str(exc)) from exc
