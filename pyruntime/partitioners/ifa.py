"""Models of IFA's core split (our own code, written from the public source).

The older decode path of ``npu_fused_infer_attention_score`` is IFA: ops-transformer
``attention/incre_flash_attention/op_host/incre_flash_attention_tiling.cpp`` (gitcode and its
GitHub mirrors). What is modelled, function by function:

* ``IFATiling::SetCoreNum``: the split runs over the vector cores (``aivNum``, 48 on a
  910B2) in the NORMAL perf mode and over the cube cores (``aicNum``, 24) in the
  ``CUBE_VIEW_MM*`` modes.
* ``IFATiling::IsFlashDecode`` / ``CheckCoreOkFlag``: no flash decoding with paged KV on
  910B when the longest kv is at most 1024, nor for GQA multi-token (MTP) queries;
  otherwise flash decoding when ``B * N2 <= 0.5 * cores`` (cube modes) or
  ``B * N2 < 0.4 * cores`` (NORMAL), and either no GQA or the longest kv >= 2048.
* ``IFATiling::SplitBNS`` (flash decoding): ``kvSplitPart = cores / (B * N2)``, lowered
  while ``maxActualSeq / kvSplitPart < 512``; pair ``i``'s kv is cut in chunks of
  ``ceil(maxActualSeq / kvSplitPart)`` tokens, chunk ``j`` on core ``i * kvSplitPart + j``.
* ``IFATiling::SplitBN``: ``SplitBN_V0`` (the first ``B*N2 % cores`` cores take one pair
  more) when ``B * N2 <= cores``; otherwise ``SetSparseStartIdx``: the better of a
  ``ceil(B*N2 / cores)``-pairs-per-core start and a greedy fill to the running average of
  what is left, refined by ``BalanceLoad`` passes; a pair weighs its kv length (1 when 0,
  ``InitSparseValidArray``).

``ifa_even`` always uses ``SplitBN_V0``; ``ifa_weighted`` is the full ``Split()`` above. With
48 vector cores the split is scored on the 24 AI Cores, vector cores ``2c`` and ``2c + 1``
on core ``c`` (the 1:2 cube:vector pairing of a mixed launch): a core's cost is the sum of
its two vector cores' work. IFA takes a fixed number of query tokens per request, so it is
run only on decode and speculative-decode batches; a pair keeps all its query tiles on one
core.
"""

from __future__ import annotations

import itertools

from .workload import NotApplicableError, Partition, Segment, Workload, _ceil_div

VECTOR_CORES_PER_CUBE = 2
FLASH_DECODING_MIN_CHUNK = 512
FLASH_DECODING_GQA_MIN_KV = 2048
PAGED_910B_NO_FD_MAX_KV = 1024


def _pairs(workload: Workload) -> list[list[int]]:
    """Unit indices grouped by (request, kv head), request-major (IFA's BN order); empty pairs
    included.

    Raises:
        NotApplicableError: requests with different query lengths (IFA takes one for all).
    """
    if len({q for q in workload.q_lens if q}) > 1:
        raise NotApplicableError("IFA takes one query length for all requests")
    pairs: list[list[int]] = [[] for _ in range(workload.batch * workload.model.num_kv_heads)]
    for u in range(workload.num_units):
        pairs[int(workload.request[u]) * workload.model.num_kv_heads + int(workload.head[u])].append(u)
    return pairs


def split_bn_v0(num_pairs: int, cores: int) -> list[int]:
    """``SplitBN_V0``: start pair of each core; the first ``num_pairs % cores`` take one more."""
    base, extra = divmod(num_pairs, cores)
    return [c * base + min(c, extra) for c in range(cores)]


def _loads(starts: list[int], weights: list[int]) -> list[int]:
    bounds = list(starts) + [len(weights)]
    return [sum(weights[a:b]) for a, b in itertools.pairwise(bounds)]


def _greedy_starts(weights: list[int], cores: int) -> list[int]:
    """The coarse pass of ``SetSparseStartIdx``: fill each core to the running average."""
    total = len(weights)
    starts = [0]
    remaining = sum(weights)
    average = _ceil_div(remaining, cores)
    for c in range(1, cores):
        start = starts[-1]
        end, load = start, 0
        while load < average and end < total:
            load += weights[end]
            end += 1
        if start + 1 < end:
            if load - average > average - (load - weights[end - 1]):
                end -= 1
                load -= weights[end]
            remaining -= load
            average = _ceil_div(remaining, cores - c)
        starts.append(end)
    return starts


def balance_load(starts: list[int], weights: list[int], loads: list[int]) -> bool:
    """One ``BalanceLoad`` pass (forward, then backward); True when the maximum load fell.

    ``starts`` and ``loads`` are updated in place. The source moves a boundary pair without
    checking that the core it leaves holds it; here such a move is skipped so that the ranges
    stay ordered.
    """
    total, cores = len(weights), len(starts)
    before = max(loads)
    for c in range(1, cores):
        s = starts[c]
        owns = s < (starts[c + 1] if c + 1 < cores else total)
        if 0 < s < total and owns and loads[c - 1] + weights[s] < before:
            loads[c - 1] += weights[s]
            loads[c] -= weights[s]
            starts[c] += 1
        elif s == total:
            break
    mid = max(loads)
    for c in range(cores - 1, 0, -1):
        s = starts[c]
        if s == total:
            if starts[c - 1] == total:
                continue
        elif s > 0:
            if loads[c] + weights[s - 1] >= mid or starts[c - 1] >= s:
                continue
        else:
            break
        loads[c - 1] -= weights[s - 1]
        loads[c] += weights[s - 1]
        starts[c] -= 1
    return max(loads) < before


def set_sparse_start_idx(weights: list[int], cores: int) -> list[int]:
    """``SetSparseStartIdx``: core start pairs for ``B*N2 > cores`` pairs of these weights."""
    total = len(weights)
    factor = _ceil_div(total, cores)
    initial = [min(c * factor, total) for c in range(cores)]
    tuned = _greedy_starts(weights, cores)
    tuned_loads = _loads(tuned, weights)
    while balance_load(tuned, weights, tuned_loads):
        pass
    if max(_loads(initial, weights)) > max(tuned_loads):
        return tuned
    return initial


def _kv_weights(workload: Workload) -> list[int]:
    """``InitSparseValidArray``: each pair weighs its request's kv length, 1 when empty."""
    heads = workload.model.num_kv_heads
    return [max(kv, 1) for kv in workload.seqlens_kv for _ in range(heads)]


def flash_decoding_parts(workload: Workload, cores: int, cube_mode: bool, paged: bool = True) -> int:
    """``kvSplitPart`` of ``SplitBNS``; 1 when ``IsFlashDecode`` says no.

    Args:
        cores: the core count of the perf mode (``SetCoreNum``).
        cube_mode: a ``CUBE_VIEW_MM*`` perf mode (ratio 0.5, ``<=``) or NORMAL (0.4, ``<``).
        paged: paged KV on a 910B.
    """
    model = workload.model
    bn = workload.batch * model.num_kv_heads
    max_kv = max(workload.seqlens_kv, default=0)
    q_lens = set(workload.q_lens)
    if paged and max_kv <= PAGED_910B_NO_FD_MAX_KV:
        return 1
    if model.group > 1 and q_lens - {0, 1}:  # gqaMtpFlag: flash decoding not implemented
        return 1
    fits = bn <= 0.5 * cores if cube_mode else bn < 0.4 * cores
    if bn == 0 or not fits or not (model.group == 1 or max_kv >= FLASH_DECODING_GQA_MIN_KV):
        return 1
    parts = cores // bn
    while max_kv // parts < FLASH_DECODING_MIN_CHUNK and parts > 1:
        parts -= 1
    return parts


def _to_cube_cores(workload: Workload, slots: list[list[Segment]]) -> list[list[Segment]]:
    """Vector-core slots onto AI Cores (``2c``, ``2c + 1`` on core ``c``) when there are more."""
    cores_n = workload.model.num_cores
    if len(slots) <= cores_n:
        return slots + [[] for _ in range(cores_n - len(slots))]
    ratio = _ceil_div(len(slots), cores_n)
    return [[s for slot in slots[c * ratio:(c + 1) * ratio] for s in slot] for c in range(cores_n)]


def _whole_pairs(workload: Workload, pairs: list[list[int]], starts: list[int]) -> list[list[Segment]]:
    bounds = list(starts) + [len(pairs)]
    return [
        [Segment(u, 0, int(workload.blocks[u])) for p in pairs[a:b] for u in p]
        for a, b in itertools.pairwise(bounds)
    ]


def _split_cores(workload: Workload, vector_cores: bool) -> int:
    return workload.model.num_cores * (VECTOR_CORES_PER_CUBE if vector_cores else 1)


def ifa_even(workload: Workload, vector_cores: bool = True) -> Partition:
    """``SplitBN_V0`` over the perf mode's cores, no kv split."""
    cores = _split_cores(workload, vector_cores)
    pairs = _pairs(workload)
    slots = _whole_pairs(workload, pairs, split_bn_v0(len(pairs), cores))
    name = "ifa_even_" + ("aiv" if vector_cores else "aic")
    return Partition(name, workload, _to_cube_cores(workload, slots))


def ifa_weighted(workload: Workload, vector_cores: bool = True, paged: bool = True) -> Partition:
    """IFA's ``Split()``: flash decoding (``SplitBNS``) or ``SplitBN``."""
    name = "ifa_weighted_" + ("aiv" if vector_cores else "aic")
    cores = _split_cores(workload, vector_cores)
    pairs = _pairs(workload)
    parts = flash_decoding_parts(workload, cores, cube_mode=not vector_cores, paged=paged)
    if parts > 1:
        chunk = _ceil_div(max(workload.seqlens_kv), parts)  # sInnerLoopSize, in tokens
        slots: list[list[Segment]] = [[] for _ in range(cores)]
        for i, pair in enumerate(pairs):
            if not pair:
                continue
            request, head = divmod(i, workload.model.num_kv_heads)
            q_len = workload.q_lens[request]
            for j in range(parts):
                span = (j * chunk, (j + 1) * chunk)
                slots[i * parts + j] += workload.piece_segments(request, head, (0, q_len), span)
        return Partition(name, workload, _to_cube_cores(workload, slots))
    if len(pairs) <= cores:
        starts = split_bn_v0(len(pairs), cores)
    else:
        starts = set_sparse_start_idx(_kv_weights(workload), cores)
    slots = _whole_pairs(workload, pairs, starts)
    return Partition(name, workload, _to_cube_cores(workload, slots))
