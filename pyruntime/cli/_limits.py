"""Bounds on the sizes ``bench`` and ``profile`` run, checked before anything is allocated.

Two kinds: a range per flag (`Limit`: what the flag counts, its lowest and highest value and
why that highest), and the memory a run's captured attentions need (`attention_bytes`)
against what this machine has available (`available_bytes`). A flag out of range or a run
that would not fit is a one-line user error naming both numbers, raised before torch is
imported: ``--layers 100000`` used to grow past 1.4 GB with the bar at 0/2.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from ._common import CliError


@dataclass(frozen=True)
class Limit:
    """The range of a size: ``low <= value <= high``; `why` says where `high` comes from."""

    what: str
    low: int
    high: int
    why: str

    def check(self, flag: str, value: int | list[int] | None,
              implies: Callable[[int], str] | None = None) -> None:
        """Raise CliError unless ``value`` (each value of a list; None: not given) is within
        the range; the message names `flag`, the value, the bound and, with `implies`, what
        the value would cost (``implies(value)``, e.g. the memory it needs)."""
        for v in value if isinstance(value, list) else () if value is None else (value,):
            if v < self.low:
                raise CliError(f"{flag} {v}: {self.what} must be at least {self.low}")
            if v > self.high:
                cost = f"; {implies(v)}" if implies else ""
                raise CliError(f"{flag} {v}: at most {self.high:,} {self.what} "
                               f"({self.why}){cost}")


LAYERS = Limit("layers", 1, 512,
               "this bench's ceiling: DeepSeek-V3 has 61 decoder layers, Llama 3.1 405B 126")
BATCH = Limit("requests per step", 1, 4096,
              "this bench's ceiling: vLLM's largest default graph capture size is 512")
STEPS = Limit("measured steps", 1, 100_000,
               "this bench's ceiling: at L=61 that is more than a day here")
WARMUP = Limit("warm-up steps", 0, 10_000, "this bench's ceiling")
HEAD_DIM = Limit("elements per head", 1, 1024,
                 "AICPU_TILING_MAX_HEAD_DIM, the tiling kernel's limit")
HEADS = Limit("heads", 1, 1024, "AICPU_TILING_MAX_HEADS, the tiling kernel's limit")
MAX_KV = Limit("kv tokens per request", 1, 1 << 20,
               "this bench's ceiling: 1M tokens of context")

#: at most this share of the memory available now goes to one run's attention buffers
MEMORY_SHARE = 0.5

_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def max_tokens(source: str, batch: int) -> int:
    """Query tokens per step a capture reserves for `source` at `batch` (the measurement's
    `ContinuousBatch.max_tokens`, without reading the trace)."""
    from ..measurement.sources import ContinuousBatch

    if source == "chunked-prefill":
        return batch * ContinuousBatch.CHUNK
    return batch * (ContinuousBatch.SPEC_TOKENS if source == "spec-decode" else 1)


def attention_bytes_per_layer(geom, source: str, batch: int) -> int:
    """Bytes one layer of one captured attention allocates on the CPU backend: its query and
    output rows and its K and V caches (what `make_attention` builds for `geom`; the
    per-step buffers shared by all layers are small and not counted).

    Args:
        geom: a `pyruntime.measurement.abrun.Geometry` (GQA, or MLA when ``kv_lora_rank``).
        source, batch: the length source and batch, which set the query rows.
    """
    item = _ITEMSIZE[geom.dtype]
    tokens = max_tokens(source, batch)
    cache_rows = geom.num_blocks * geom.block_size
    if geom.kv_lora_rank > 0:  # StaticMLAAttention: queries (lora + rope), output (lora)
        width = geom.kv_lora_rank + geom.qk_rope_head_dim
        return item * (tokens * geom.num_q_heads * (width + geom.kv_lora_rank)
                       + cache_rows * width)
    row = tokens * geom.num_q_heads * geom.head_dim   # queries and outputs
    cache = cache_rows * geom.num_kv_heads * geom.head_dim   # K and V each
    return item * 2 * (row + cache)


def available_bytes() -> int | None:
    """Memory available now (Linux ``MemAvailable``; else free physical pages); None when
    unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def gib(n: float) -> str:
    """``1.5 GiB`` (``12 MiB`` below one GiB)."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_memory(runs: list[tuple[str, int, int, str, int]], geom, *,
                 available: int | None = None) -> None:
    """Refuse a run whose largest step of work would not fit in memory.

    Args:
        runs: ``(what, attentions, layers, source, batch)`` rows, each one set of captured
            attentions alive at the same time (a bench point: one per mode).
        geom: their Geometry.
        available: bytes available (default `available_bytes`); None: not checked.

    Raises:
        CliError: the largest row needs more than `MEMORY_SHARE` of what is available.
    """
    available = available_bytes() if available is None else available
    if not available:
        return
    budget = MEMORY_SHARE * available
    for what, attentions, layers, source, batch in runs:
        per_layer = attention_bytes_per_layer(geom, source, batch)
        need = attentions * layers * per_layer
        if need > budget:
            raise CliError(
                f"{what} needs about {gib(need)} of attention buffers ({attentions} captured "
                f"attentions x {layers} layers x {gib(per_layer)}: queries, outputs, K and V "
                f"caches), more than {MEMORY_SHARE:.0%} of the {gib(available)} this machine "
                "has available; use fewer layers or a smaller batch (nothing was run)")
