"""The logits soft cap: what it means and the one check of its value, for every consumer.

With a soft cap C (Gemma 2's ``attn_logit_softcapping``, vLLM's ``logits_soft_cap``) each
attention score ``s = scale * q . k`` becomes ``C * tanh(s / C)`` before the causal mask and
the softmax: the cap applies after the scale, as vLLM's FlashAttention, FlashInfer and Triton
paths define it (``vllm/v1/attention/ops/triton_unified_attention.py``: ``S = scale *
dot(Q, K)``, then ``apply_softcap(S, softcap)``, then the mask). Scores stay inside
``(-C, C)``; small scores are almost unchanged (``C tanh(s / C) = s - s^3 / (3 C^2) + ...``).

``None`` is off everywhere in Python (the consumers then run exactly the uncapped code); the
kernels receive ``0.0`` for off (:func:`kernel_arg`), which the C reference and the Triton
kernels treat as off. The cap is a float64 Python number on the host; the kernels compute with
it in fp32, like the scores.
"""

from __future__ import annotations

import math
import numbers


def check(value: object, *, name: str = "logits_soft_cap",
          error: type[Exception] = ValueError) -> float | None:
    """``None`` (off), or ``value`` as a float when it is a real, finite number > 0.

    Raises:
        error (ValueError unless told otherwise): a bool, a non-number, NaN, an infinity, zero
            or a negative value (the message names the value and what is accepted).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be None (off) or a positive finite float, got "
                    f"{type(value).__name__} {value!r}")
    cap = float(value)
    if not math.isfinite(cap) or cap <= 0.0:
        raise error(f"{name} must be None (off) or a positive finite float, got {cap!r}; "
                    "pass None to turn the soft cap off")
    return cap


def kernel_arg(value: float | None) -> float:
    """The fp32 scalar the kernels take: the checked cap, or 0.0 for off (:func:`check`)."""
    cap = check(value)
    return 0.0 if cap is None else cap
