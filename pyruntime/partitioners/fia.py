"""Models of FIA's host-side split methods (``npu_fused_infer_attention_score``, IFA path).

Our own code, written from the public description in DESIGN.md section 1 and the rules
of IFA's public tiling source:

* ``fia_even``: ``SplitBN_V0``: the ``bn = B * N2`` (request, kv head) pairs are spread
  evenly over the cores in order, the first ``bn % P`` cores taking one pair more.
  No kv split.
* ``fia_weighted``: what FIA does by default.
  Flash decoding when ``bn < 0.4 * P`` and (no GQA or ``maxActualSeq >= 2048``):
  ``kvSplitPart = P // bn``, reduced while ``maxActualSeq / kvSplitPart < 512``; every
  pair's kv is cut in chunks of ``ceil(maxActualSeq / kvSplitPart)`` tokens (rounded up
  to whole blocks here), one chunk per core, so short requests use fewer cores.
  Otherwise, when ``bn <= P``, the even split. Otherwise the KV-length-weighted greedy
  split: each pair weighs its kv length (at least 1); a core takes pairs until its load
  reaches the running average of what is left (dropping the last pair when that lands
  closer to the average), then boundary pairs are moved between neighbours while that
  lowers the maximum load; the better of this and the even split is kept.

A pair with several query tiles (prefill) keeps its units together, as FIA handles a
request's whole query in one pass; its weight is the sum of its tiles' kv lengths.
"""

from __future__ import annotations

import itertools

from .workload import Partition, Segment, Workload, _ceil_div

FLASH_DECODING_MIN_KV = 512
FLASH_DECODING_BN_RATIO = 0.4
FLASH_DECODING_GQA_MIN_KV = 2048


def _pairs(workload: Workload) -> list[list[int]]:
    """Unit indices grouped by (request, kv head), in work order."""
    pairs: list[list[int]] = []
    last = None
    for u in range(workload.num_units):
        key = (int(workload.request[u]), int(workload.head[u]))
        if key != last:
            pairs.append([])
            last = key
        pairs[-1].append(u)
    return pairs


def _assign(workload: Workload, name: str, pairs: list[list[int]], starts: list[int]) -> Partition:
    """Core c takes pairs [starts[c], starts[c + 1]) whole."""
    bounds = list(starts) + [len(pairs)]
    cores = [
        [Segment(u, 0, int(workload.blocks[u])) for p in pairs[a:b] for u in p]
        for a, b in itertools.pairwise(bounds)
    ]
    return Partition(name, workload, cores)


def _even_starts(num_pairs: int, num_cores: int) -> list[int]:
    base, extra = divmod(num_pairs, num_cores)
    return [c * base + min(c, extra) for c in range(num_cores)]


def fia_even(workload: Workload) -> Partition:
    """Even split of (request, kv head) pairs over the cores (IFA SplitBN_V0)."""
    pairs = _pairs(workload)
    return _assign(workload, "fia_even", pairs, _even_starts(len(pairs), workload.model.num_cores))


def flash_decoding_parts(workload: Workload) -> int:
    """FIA's ``kvSplitPart``: kv pieces per pair; 1 when flash decoding is off."""
    bn = len(_pairs(workload))
    cores_n = workload.model.num_cores
    max_kv = max(workload.seqlens_kv, default=0)
    gqa_ok = workload.model.group == 1 or max_kv >= FLASH_DECODING_GQA_MIN_KV
    if bn == 0 or not bn < FLASH_DECODING_BN_RATIO * cores_n or not gqa_ok:
        return 1
    parts = cores_n // bn
    while parts > 1 and max_kv / parts < FLASH_DECODING_MIN_KV:
        parts -= 1
    return parts


def _loads(starts: list[int], weights: list[int]) -> list[int]:
    bounds = list(starts) + [len(weights)]
    return [sum(weights[a:b]) for a, b in itertools.pairwise(bounds)]


def _greedy_starts(weights: list[int], num_cores: int) -> list[int]:
    starts = [0]
    remaining = sum(weights)
    average = _ceil_div(remaining, num_cores)
    for c in range(1, num_cores):
        start = starts[-1]
        end, load = start, 0
        while load < average and end < len(weights):
            load += weights[end]
            end += 1
        if end > start + 1:
            if load - average > average - (load - weights[end - 1]):
                end -= 1
                load -= weights[end]
            remaining -= load
            average = _ceil_div(remaining, num_cores - c)
        starts.append(end)
    return starts


def _refine(starts: list[int], weights: list[int]) -> bool:
    """One pass each way moving boundary pairs; True when the maximum load fell."""
    n, cores_n = len(weights), len(starts)
    loads = _loads(starts, weights)
    before = max(loads)
    for c in range(1, cores_n):
        s = starts[c]
        if s == n:
            break
        if 0 < s and loads[c - 1] + weights[s] < before:
            loads[c - 1] += weights[s]
            loads[c] -= weights[s]
            starts[c] += 1
    mid = max(loads)
    for c in range(cores_n - 1, 0, -1):
        s = starts[c]
        if s <= starts[c - 1]:
            continue
        if loads[c] + weights[s - 1] < mid:
            loads[c - 1] -= weights[s - 1]
            loads[c] += weights[s - 1]
            starts[c] -= 1
    return max(loads) < before


def fia_weighted(workload: Workload) -> Partition:
    """FIA's default: flash decoding, the even split, or the KV-length-weighted split."""
    name = "fia_weighted"
    cores_n = workload.model.num_cores
    pairs = _pairs(workload)
    parts = flash_decoding_parts(workload)
    if parts > 1:
        max_blocks = _ceil_div(max(workload.seqlens_kv), workload.model.block_size)
        chunk = _ceil_div(max_blocks, parts)
        cores: list[list[Segment]] = [[] for _ in range(cores_n)]
        for i, pair in enumerate(pairs):
            for u in pair:
                blocks = int(workload.blocks[u])
                for j in range(_ceil_div(blocks, chunk)):
                    seg = Segment(u, j * chunk, min((j + 1) * chunk, blocks))
                    cores[(i * parts + j) % cores_n].append(seg)
        return Partition(name, workload, cores)
    even = _even_starts(len(pairs), cores_n)
    if len(pairs) <= cores_n:
        return _assign(workload, name, pairs, even)
    weights = [max(1, sum(int(workload.kv_tokens[u]) for u in p)) for p in pairs]
    tuned = _greedy_starts(weights, cores_n)
    for _ in range(len(pairs)):  # each productive pass lowers the maximum: bounded
        if not _refine(tuned, weights):
            break
    best = tuned if max(_loads(tuned, weights)) < max(_loads(even, weights)) else even
    return _assign(workload, name, pairs, best)
