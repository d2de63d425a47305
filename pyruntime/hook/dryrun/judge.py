"""The engine check's token judge: two greedy runs of one request (without and with the hook)
against an fp32 reference of the same weights (docs/hook-in-vllm-ascend.md, "The engine
check", derives the tolerance).

The tokens pass when they are identical, or when at their first divergence both tokens are
the top two of the fp32 reference's logits at that step (the reference fed the prompt and the
tokens both runs agreed on) and the reference's margin between them is under
`tolerance`: a near-tie that the model dtype's rounding can flip. Anything else fails.

Pure Python on sequences of floats: no torch, so it is unit-tested anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: machine epsilon (the distance from 1.0 to the next value: ``torch.finfo(dtype).eps``) of
#: the model dtypes the check runs
EPSILON = {"bfloat16": 2.0 ** -7, "float16": 2.0 ** -10, "float32": 2.0 ** -23}
#: the tolerance is TOLERANCE_FACTOR * eps * magnitude; see `tolerance`
TOLERANCE_FACTOR = 4.0


def tolerance(dtype: str, magnitude: float) -> float:
    """The largest fp32-reference margin between two tokens that a run in `dtype` may flip,
    for logits of absolute value up to `magnitude` (the larger of the two tokens' reference
    logits).

    Each run rounds the hidden state it feeds the LM head and the logits it returns to `dtype`:
    with the unit roundoff u = eps / 2 and a well-conditioned dot product, each logit moves by
    at most 2 u |l|, so one run's margin between two tokens moves by at most 4 u m, and two
    runs moving in opposite directions can swap the tokens when the reference margin is under
    8 u m = 4 eps m. Raises KeyError for a dtype not in `EPSILON`."""
    return TOLERANCE_FACTOR * EPSILON[dtype] * abs(magnitude)


@dataclass(frozen=True)
class Divergence:
    """The first token where two runs of one request differ, judged.

    `token`: its index among the generated tokens; `without` / `with_`: the two tokens;
    `margin`: the fp32 reference's logit of its best minus its second best (None when the two
    tokens are not its top two); `tolerance`: the `tolerance` at that step; `ok`: both tokens
    the reference's top two and the margin under the tolerance."""

    request: int
    token: int
    without: int
    with_: int
    margin: float | None
    tolerance: float
    ok: bool


def first_divergence(without: Sequence[int], with_: Sequence[int]) -> int | None:
    """The index of the first generated token where the two runs differ; None when they are
    identical. Runs of different lengths differ at the shorter one's end."""
    for i, (a, b) in enumerate(zip(without, with_)):
        if a != b:
            return i
    return None if len(without) == len(with_) else min(len(without), len(with_))


def judge_request(request: int, without: Sequence[int], with_: Sequence[int],
                  reference_logits: Callable[[int], Sequence[float]],
                  dtype: str) -> Divergence | None:
    """Judge one request's generated tokens from the run without the hook (`without`) and with
    it (`with_`). None: identical. Otherwise the `Divergence` at the first differing token,
    with `reference_logits(i)` the fp32 reference's logits (``[vocab]``) for generated token
    i, called only for that token."""
    i = first_divergence(without, with_)
    if i is None:
        return None
    if i >= min(len(without), len(with_)):  # one run stopped early: nothing to compare
        return Divergence(request, i, -1, -1, None, 0.0, False)
    a, b = without[i], with_[i]
    logits = list(reference_logits(i))
    # among the top two: at least the second-best value (so a tie with the best counts)
    second_best = sorted(logits, reverse=True)[1] if len(logits) > 1 else logits[0]
    tol = tolerance(dtype, max(abs(logits[a]), abs(logits[b])))
    if min(logits[a], logits[b]) < second_best:
        return Divergence(request, i, a, b, None, tol, False)
    margin = abs(logits[a] - logits[b])
    return Divergence(request, i, a, b, margin, tol, margin < tol)
