"""A model of FlashMLA's ``get_mla_metadata`` partition, per head (our own code).

Follows deepseek-ai/FlashMLA: ``csrc/flash_api.cpp`` ``get_mla_metadata`` sizes the grid,
``csrc/kernels/get_mla_metadata.cu`` ``get_mla_metadata_kernel`` fills the parts:

* ``num_sm_parts = sm_count / num_heads_k / ceil(s_q * G / BLOCK_SIZE_M)``
  (``BLOCK_SIZE_M = 64``): the decode kernel's grid is
  ``(m_blocks, num_heads_k, num_sm_parts)``, so every (m block, kv head) runs the same
  partition of the requests over its own ``num_sm_parts`` SMs.
* ``T = sum over requests of (blocks + F)``, ``payload = max(ceil(T / parts) + F, 2 F)``;
  parts are filled in request order: a request whose remaining blocks plus ``F`` fit is
  taken whole, otherwise the part takes ``payload_left - F`` blocks of it (when positive)
  and closes, and the next part continues it. ``F = FIXED_OVERHEAD_NUM_BLOCKS = 5`` blocks
  of ``PAGE_BLOCK_SIZE = 64`` tokens.

Translation into our cost units: the walk runs on costs instead of block counts: a block of
ours costs ``w`` (one value per batch: decode and speculative-decode rows are uniform), the
mean ``ceil(T / P)`` is rounded up to whole blocks, and the overhead is ``F`` blocks of 64
tokens, ``F * w * 64 / block_size`` (``fixed_overhead``), or any cost given directly
(``overhead_cost``, e.g. our ``cost_segment``). When ``F`` is a whole number of blocks this is
the source's walk exactly; cuts fall on our block boundaries. The model needs one
query length for all requests, as the decode kernel does; it is not run on chunked-prefill
batches.

More than one m block (MLA geometry: ``s_q * G > 64``, e.g. 128 heads per rank, or 64 heads
with MTP). The dense decode kernel (``csrc/sm90/decode/dense/splitkv_mla.cuh``
``flash_fwd_splitkv_mla_kernel``, ``Config::BLOCK_SIZE_M = 64`` in
``csrc/sm90/decode/dense/config.h``; the same in the 2025-04 ``csrc/kernels/splitkv_mla.cu``)
packs the ``s_q x h_q / h_k`` query rows of a kv head token-major (``dense_decode.h``:
``q.view(b, s_q, h_k, G, d).transpose(2, 3)``, row ``= token * G + head``), runs the grid
``(ceil(s_q * G / 64), h_k, num_sm_parts)`` with ``blockIdx.x`` the m block, and every m block
runs the same part of the metadata over its own CTAs: its 64 rows, each of its requests' kv
blocks read again. Under the causal mask an m block stops at its last row's causal end
(``get_mask_len(.., BLOCK_SIZE_M - 1)`` trims ``end_block_idx``), so an m block of early
tokens can skip a last block; the walk itself is over each request's full
``ceil(seqlen_k / 64)`` blocks. Here an m block is a unit of its own: the partition runs on
an *m-block workload* (:func:`m_block_model`: ``G / 64`` virtual kv heads of 64 rows when 64
divides ``G``, ``64 / G``-token query tiles when ``G`` divides 64), charged by the same cost
model (a 64-row block costs ``w(64)``), and scored against the ideal of the caller's
workload (:attr:`Partition.baseline`), so the kv blocks FlashMLA reads once per m block count
as the extra work they are. Pieces an m block's causal trim leaves empty are dropped.
Geometries whose m blocks cut a query token's heads unevenly (``G`` neither a multiple nor a
divisor of 64) are not modelled. Since 2025-09 (FlashMLA ``c28eca9``, now
``csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu``) the payload has no
``2 F`` floor and ``num_sm_parts`` is at least 1; the floor is kept here (it binds only when
``ceil(T / P) < F``, i.e. a step of fewer than about ``P * F`` blocks).
"""

from __future__ import annotations

from dataclasses import replace

from .workload import CostModel, NotApplicableError, Partition, Segment, Workload, _ceil_div

FIXED_OVERHEAD_NUM_BLOCKS = 5
PAGE_BLOCK_SIZE = 64
BLOCK_SIZE_M = 64


def num_sm_parts(cores: int, kv_heads: int, q_rows_per_head: int) -> int:
    """``num_sm_parts`` of ``get_mla_metadata`` (at least 1)."""
    return max(1, cores // kv_heads // _ceil_div(q_rows_per_head, BLOCK_SIZE_M))


def _walk(blocks: list[int], parts: int, block_cost: int, overhead: int, payload: int):
    out: list[list[tuple[int, int, int]]] = []
    request, block = 0, 0
    for _ in range(parts):
        part: list[tuple[int, int, int]] = []
        left = payload
        while request < len(blocks):
            remain = blocks[request] - block
            if left >= remain * block_cost + overhead:
                if remain:
                    part.append((request, block, blocks[request]))
                left -= remain * block_cost + overhead
                request, block = request + 1, 0
                continue
            take = (left - overhead) // block_cost
            if take > 0:
                part.append((request, block, block + take))
                block += take
            break
        out.append(part)
    return out, request == len(blocks)


def mla_parts(
    blocks: list[int], parts: int, block_cost: int, overhead: int
) -> list[list[tuple[int, int, int]]]:
    """``get_mla_metadata_kernel`` in cost units: per part, ``(request, begin, end)`` blocks.

    Args:
        blocks: kv blocks per request; parts: ``num_sm_parts``.
        block_cost: ``w`` (>= 1), the cost of one block; overhead: ``F`` in cost units.

    With ``F`` a whole number of blocks the source's payload always suffices (it asserts so);
    with a fraction of a block the parts can fall short by a block, and the payload is then
    raised a block at a time until every block is placed.
    """
    total = sum(b * block_cost + overhead for b in blocks)
    # ceil(T / P) in whole blocks, as the source's block units give it
    payload = max(_ceil_div(total, parts * block_cost) * block_cost + overhead, 2 * overhead)
    while True:
        out, done = _walk(blocks, parts, block_cost, overhead, payload)
        if done:
            return out
        payload += block_cost


def m_blocks(s_q: int, group: int) -> int:
    """``num_m_block`` of the decode kernel's grid: ``ceil(s_q * G / BLOCK_SIZE_M)``."""
    return _ceil_div(s_q * group, BLOCK_SIZE_M)


def m_block_model(model: CostModel) -> CostModel:
    """The geometry whose units are FlashMLA's m blocks (64 query rows each).

    ``G`` a multiple of 64: ``H * G / 64`` virtual kv heads of 64 query heads, one token per
    unit (m block ``t * G / 64 + c`` of a request's kv head ``h`` is virtual head
    ``h * G / 64 + c``, tile ``t``). ``G`` a divisor of 64: the same heads, ``64 / G`` tokens
    per unit (m block ``t`` is tile ``t``). Weights, block size, cores and mask are the model's.

    Raises:
        NotApplicableError: ``G`` is neither (an m block would hold part of a token's heads and
            part of the next token's).
    """
    group = model.group
    if group % BLOCK_SIZE_M == 0:
        kv_heads, q_tile = model.num_kv_heads * (group // BLOCK_SIZE_M), 1
    elif BLOCK_SIZE_M % group == 0:
        kv_heads, q_tile = model.num_kv_heads, BLOCK_SIZE_M // group
    else:
        raise NotApplicableError(
            f"FlashMLA's {BLOCK_SIZE_M}-row m blocks cut the {group} heads of a query token "
            "unevenly (not modelled)"
        )
    return replace(model, num_kv_heads=kv_heads, q_tile=q_tile)


def flashmla(
    workload: Workload, fixed_overhead: int = FIXED_OVERHEAD_NUM_BLOCKS, overhead_cost: int | None = None
) -> Partition:
    """FlashMLA's per-head partition of our units, or of its m blocks when there are several.

    Args:
        fixed_overhead: ``F`` in 64-token blocks (5 in FlashMLA).
        overhead_cost: ``F`` directly in our cost units; overrides ``fixed_overhead``.

    Returns:
        A partition of ``workload``'s units when one m block holds a unit (``s_q * G <= 64``
        and the query fits one of our tiles); otherwise a partition of the m-block workload
        (:func:`m_block_model`) whose ``baseline`` is ``workload``. Core
        ``m + M * (h + H * part)`` runs m block ``m`` of kv head ``h`` in ``part`` (the grid
        ``(M, H, num_sm_parts)``, x fastest).

    Raises:
        NotApplicableError: requests with different query lengths, m blocks that split a
            token's heads unevenly, fewer cores than kv heads, or more CTAs per part than
            cores (``M * H > cores``: the source's grid would run in waves, not modelled).
    """
    model = workload.model
    q_lens = {q for q in workload.q_lens if q}
    if len(q_lens) > 1:
        raise NotApplicableError("FlashMLA's decode kernel takes one query length for all requests")
    s_q = q_lens.pop() if q_lens else 1
    rows = s_q * model.group
    if rows > BLOCK_SIZE_M or s_q > model.q_tile:
        return _flashmla_m_blocks(workload, s_q, fixed_overhead, overhead_cost)
    if model.num_cores < model.num_kv_heads:
        raise NotApplicableError(
            f"{model.num_cores} cores cannot give each of {model.num_kv_heads} kv heads an SM part"
        )
    parts = num_sm_parts(model.num_cores, model.num_kv_heads, rows)
    block_cost = model.block_cost(rows)
    if overhead_cost is None:
        overhead_cost = fixed_overhead * block_cost * PAGE_BLOCK_SIZE // model.block_size
    blocks = [_ceil_div(kv, model.block_size) if q else 0
              for q, kv in zip(workload.q_lens, workload.seqlens_kv)]  # fmt: skip
    layout = mla_parts(blocks, parts, block_cost, overhead_cost)
    cores: list[list[Segment]] = [[] for _ in range(model.num_cores)]
    for part_index, part in enumerate(layout):
        for head in range(model.num_kv_heads):
            core = head + model.num_kv_heads * part_index  # grid (1, heads, parts), x fastest
            for request, begin, end in part:
                u = workload.unit_index(request, head, 0)
                cores[core].append(Segment(u, begin, min(end, int(workload.blocks[u]))))
    return Partition("flashmla", workload, cores)


def _flashmla_m_blocks(
    workload: Workload, s_q: int, fixed_overhead: int, overhead_cost: int | None
) -> Partition:
    """:func:`flashmla` with ``M = ceil(s_q * G / 64) > 1`` m blocks per kv head."""
    model = workload.model
    m_model = m_block_model(model)
    mw = Workload(m_model, workload.cu_seqlens_q, workload.seqlens_kv)
    n_m = m_blocks(s_q, model.group)
    ctas = n_m * model.num_kv_heads
    if ctas > model.num_cores:
        raise NotApplicableError(
            f"{n_m} m blocks x {model.num_kv_heads} kv heads = {ctas} CTAs per part exceed "
            f"{model.num_cores} cores"
        )
    parts = num_sm_parts(model.num_cores, model.num_kv_heads, s_q * model.group)
    # every m block of a full 64 rows costs the same per block: w(64)
    block_cost = m_model.block_cost(min(BLOCK_SIZE_M, s_q * model.group))
    if overhead_cost is None:
        overhead_cost = fixed_overhead * block_cost * PAGE_BLOCK_SIZE // model.block_size
    blocks = [_ceil_div(kv, model.block_size) if q else 0
              for q, kv in zip(workload.q_lens, workload.seqlens_kv)]  # fmt: skip
    layout = mla_parts(blocks, parts, block_cost, overhead_cost)
    split = m_model.num_kv_heads // model.num_kv_heads  # virtual heads per kv head
    tiles = _ceil_div(s_q, m_model.q_tile)
    cores: list[list[Segment]] = [[] for _ in range(model.num_cores)]
    for part_index, part in enumerate(layout):
        for head in range(model.num_kv_heads):
            for m in range(n_m):
                tile, sub = divmod(m, split)
                core = m + n_m * (head + model.num_kv_heads * part_index)
                for request, begin, end in part:
                    u = mw.unit_index(request, head * split + sub, tile)
                    end = min(end, int(mw.blocks[u]))  # the m block's causal trim
                    if begin < end:
                        cores[core].append(Segment(u, begin, end))
    assert tiles * split == n_m, (tiles, split, n_m)
    return Partition("flashmla", mw, cores, baseline=workload)
