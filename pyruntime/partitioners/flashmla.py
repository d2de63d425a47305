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
query length for all requests and ``s_q * G <= 64`` (one m block), as the decode kernel does;
it is not run on chunked-prefill batches.
"""

from __future__ import annotations

from .workload import NotApplicableError, Partition, Segment, Workload, _ceil_div

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


def flashmla(
    workload: Workload, fixed_overhead: int = FIXED_OVERHEAD_NUM_BLOCKS, overhead_cost: int | None = None
) -> Partition:
    """FlashMLA's per-head partition of our units.

    Args:
        fixed_overhead: ``F`` in 64-token blocks (5 in FlashMLA).
        overhead_cost: ``F`` directly in our cost units; overrides ``fixed_overhead``.

    Raises:
        NotApplicableError: requests with different query lengths, more than one m block, or
            fewer cores than kv heads (``num_sm_parts`` would be 0).
    """
    model = workload.model
    q_lens = {q for q in workload.q_lens if q}
    if len(q_lens) > 1:
        raise NotApplicableError("FlashMLA's decode kernel takes one query length for all requests")
    s_q = q_lens.pop() if q_lens else 1
    rows = s_q * model.group
    if rows > BLOCK_SIZE_M or s_q > model.q_tile:
        raise NotApplicableError(f"{rows} query rows per kv head span more than one m block")
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
