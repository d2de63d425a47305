"""The sliding window: what it means and the one check of its value, for every consumer.

With ``sliding_window=W`` (Gemma 2/3, Mistral, gpt-oss's windowed layers; vLLM's
``sliding_window``) the query at absolute kv position p sees only the keys j with
``p - W < j <= p``: its last W positions, itself included (fewer when p < W - 1). That is the
model's definition: Hugging Face's sliding-window causal mask and vLLM's FlashAttention path,
which passes ``window_size = (W - 1, 0)`` (``vllm/v1/attention/backends/flash_attn.py``). It
applies to causal attention only.

vLLM-Ascend's host path differs by one key: it passes FIA ``pre_tokens = W``, and FIA's band
``[p - pre_tokens, p + next_tokens]`` then holds W + 1 keys (the float64 reference models that
band separately, ``reference_attention(band=(W, 0))``).

``None`` and 0 are off everywhere in Python (the consumers then run exactly the unwindowed
code); the kernels receive ``0`` for off (:func:`kernel_arg`).
"""

from __future__ import annotations

import numbers


def check(value: object, *, causal: bool = True, name: str = "sliding_window",
          error: type[Exception] = ValueError) -> int | None:
    """``None`` (off; 0 is off too), or ``value`` as an int when it is an integer >= 1.

    Raises:
        error (ValueError unless told otherwise): a bool, a non-integer, a negative value, or a
            window with ``causal=False`` (the window is defined for causal attention only).
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be None (off) or an int >= 1, got "
                    f"{type(value).__name__} {value!r}")
    window = int(value)
    if window < 0:
        raise error(f"{name} must be None (off) or an int >= 1, got {window}")
    if window == 0:
        return None
    if window >= 2**31:
        raise error(f"{name} must be below 2**31, got {window}")
    if not causal:
        raise error(f"{name}={window} needs causal attention: a window is defined over the "
                    "keys before each query; use causal=True or sliding_window=None")
    return window


def kernel_arg(value: int | None, *, causal: bool = True) -> int:
    """The int32 the kernels take: the checked window, or 0 for off (:func:`check`)."""
    window = check(value, causal=causal)
    return 0 if window is None else window


def first_block(kv_len: int, q_len: int, row: int, window: int | None, block_size: int) -> int:
    """The first kv block a row (and the rows after it) can see: the block of
    ``max(0, kv_len - q_len + row - W + 1)``; 0 without a window."""
    if not window:
        return 0
    return max(0, kv_len - q_len + row - window + 1) // block_size
