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

``None`` is no window everywhere in Python (the consumers then run exactly the unwindowed
code), and 0 is refused: the peers' 0 is a one-key window (FlashInfer ``window_left = 0``,
FlashAttention ``window_size = (0, 0)``), ours is W keys, so a peer's value passed through as
is would be one key short, and its one-key window would turn into none. Ours is FlashInfer's
``window_left + 1`` and FlashAttention's ``left + 1`` (:data:`CONVENTION`). Only the C words
keep 0 for none (the tiling params' ``sliding_window`` and the kernels' int32,
:func:`kernel_arg`), converted at the Python boundary.
"""

from __future__ import annotations

import numbers

from pyruntime.tiling import WINDOW_CONVENTION as CONVENTION
from pyruntime.tiling import window_zero_refusal as zero_refusal

__all__ = ["CONVENTION", "check", "kernel_arg", "zero_refusal"]

def check(value: object, *, causal: bool = True, name: str = "sliding_window",
          error: type[Exception] = ValueError) -> int | None:
    """``None`` (no window), or ``value`` as an int when it is an integer >= 1.

    Raises:
        error (ValueError unless told otherwise): a bool, a non-integer, 0 (refused, naming the
            convention: :data:`CONVENTION`), a negative value, or a window with
            ``causal=False`` (the window is defined for causal attention only).
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
        raise error(zero_refusal(name))
    if window >= 2**31:
        raise error(f"{name} must be below 2**31, got {window}")
    if not causal:
        raise error(f"{name}={window} needs causal attention: a window is defined over the "
                    "keys before each query; use causal=True or sliding_window=None")
    return window


def kernel_arg(value: int | None, *, causal: bool = True) -> int:
    """The int32 the kernels take: the checked window, or 0 for None (:func:`check`)."""
    window = check(value, causal=causal)
    return 0 if window is None else window


def first_block(kv_len: int, q_len: int, row: int, window: int | None, block_size: int) -> int:
    """The first kv block a row (and the rows after it) can see: the block of
    ``max(0, kv_len - q_len + row - W + 1)``; 0 without a window."""
    if not window:
        return 0
    return max(0, kv_len - q_len + row - window + 1) // block_size
