"""The twin's device memory accounting: torch_npu's caching allocator as its callers see it
(``torch.npu.memory_allocated / memory_reserved / max_memory_allocated / memory_stats /
reset_peak_memory_stats / empty_cache / mem_get_info``).

vLLM's memory profiling (``vllm/utils/mem_utils.py`` ``MemorySnapshot.measure``, reached from
vLLM-Ascend's ``NPUWorker.determine_available_memory``) reads ``allocated_bytes.all.peak``,
``allocated_bytes.all.current``, ``reserved_bytes.all.current`` and the free / total pair of
``mem_get_info``, and asserts that free memory decreased while the model loaded; so the twin
counts what its device tensors hold, live.

The model (torch_npu 2.10.0.post4, ``torch_npu/npu/memory.py`` and the caching allocator it
fronts):

* every block is rounded up to 512 bytes (the allocator's ``kMinBlockSize``); a 0-byte
  tensor takes no block;
* *allocated* is what live tensors hold; a block is freed when the last tensor over its
  storage goes (the allocator frees at storage release);
* *reserved* is what the caching allocator holds from the device: it grows to cover
  *allocated* and keeps freed blocks cached until ``empty_cache()``, which gives back all
  that is not allocated (a caching allocator without fragmentation: the twin does not model
  segment sizes or splits);
* free memory (``mem_get_info``) is the device size less *reserved*; an allocation that would
  take *reserved* past the device size first empties the cache, then raises
  ``torch.OutOfMemoryError`` with torch_npu's text ("NPU out of memory. Tried to allocate",
  in ``libtorch_npu.so``).

The device size is `TOTAL_ENV` (bytes, or a number with a ``KiB`` / ``MiB`` / ``GiB`` suffix);
by default 64 GiB, the HBM of the Ascend 910B3 the twin reports.
"""

from __future__ import annotations

import collections
import os
import re
import threading

#: the device size the twin reports (``mem_get_info()[1]``, ``total_memory``)
TOTAL_ENV = "AICPU_TILING_TWIN_DEVICE_MEMORY"
DEFAULT_TOTAL = 64 * 2**30
#: torch_npu's caching allocator rounds every block up to this (kMinBlockSize)
BLOCK_ROUND = 512
_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def total_from_env() -> int:
    """The device size in bytes from `TOTAL_ENV` (`DEFAULT_TOTAL` when unset).

    Raises:
        ValueError: a value that is not a positive size (the message names the variable).
    """
    text = os.environ.get(TOTAL_ENV, "").strip()
    if not text:
        return DEFAULT_TOTAL
    match = re.fullmatch(r"(\d+)\s*([KMG]iB|B)?", text, flags=re.IGNORECASE)
    if match is None or int(match.group(1)) <= 0:
        raise ValueError(f"{TOTAL_ENV}={text!r}: give the twin's device size as a positive "
                         "number of bytes, or with a KiB, MiB or GiB suffix (e.g. 16GiB)")
    return int(match.group(1)) * _UNITS[(match.group(2) or "").upper()]


def _size(nbytes: int) -> str:
    """A byte count as torch's caching allocators print it (``format_size``)."""
    if nbytes < 2**10:
        return f"{nbytes} bytes"
    for unit, scale in (("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30)):
        if nbytes < scale * 2**10 or unit == "GiB":
            return f"{nbytes / scale:.2f} {unit}"
    raise AssertionError("unreachable")


class DeviceMemory:
    """One device's allocated / reserved bytes, their peaks, and the allocator's counters."""

    def __init__(self, total: int, index: int = 0) -> None:
        self.total, self.index = total, index
        # only integer updates happen under the lock (a release runs from a finalizer, in
        # whichever thread drops the last reference)
        self._lock = threading.Lock()
        self.allocated = self.peak_allocated = 0
        self.reserved = self.peak_reserved = 0
        self.blocks = self.peak_blocks = 0
        self.allocations = self.frees = 0
        self.allocated_total = self.freed_total = 0
        self.num_ooms = 0

    @staticmethod
    def block_size(nbytes: int) -> int:
        """The bytes a request of `nbytes` takes (0 for 0)."""
        return -(-nbytes // BLOCK_ROUND) * BLOCK_ROUND

    def allocate(self, nbytes: int) -> int:
        """Account a new block for `nbytes`; returns its size (give it back to `release`).

        Raises:
            torch.OutOfMemoryError: the block does not fit in the device after emptying the
                cache (nothing is accounted then).
        """
        size = self.block_size(nbytes)
        with self._lock:
            allocated = self.allocated + size
            reserved = max(self.reserved, allocated)
            if reserved > self.total:
                reserved = allocated  # the allocator frees its cache and retries
            fits = reserved <= self.total
            if fits:
                self.allocated, self.reserved = allocated, reserved
                self.peak_allocated = max(self.peak_allocated, allocated)
                self.peak_reserved = max(self.peak_reserved, reserved)
                self.blocks += 1
                self.peak_blocks = max(self.peak_blocks, self.blocks)
                self.allocations += 1
                self.allocated_total += size
            else:
                self.num_ooms += 1
                free = self.total - self.reserved
        if not fits:
            import torch

            raise torch.OutOfMemoryError(
                f"NPU out of memory. Tried to allocate {_size(size)} (NPU {self.index}; "
                f"{_size(self.total)} total capacity; {_size(self.allocated)} already "
                f"allocated; {_size(free)} free; {_size(self.reserved)} reserved in total by "
                f"PyTorch) "
                f"(npu-twin: device size from {TOTAL_ENV})")
        return size

    def release(self, size: int) -> None:
        """A block of `size` (from `allocate`) is freed; it stays reserved (cached)."""
        with self._lock:
            self.allocated -= size
            self.blocks -= 1
            self.frees += 1
            self.freed_total += size

    def empty_cache(self) -> None:
        """``torch.npu.empty_cache()``: the cached (reserved, not allocated) bytes go back."""
        with self._lock:
            self.reserved = self.allocated

    def reset_peak(self) -> None:
        """``torch.npu.reset_peak_memory_stats()``: peaks restart from the current values."""
        with self._lock:
            self.peak_allocated, self.peak_reserved = self.allocated, self.reserved
            self.peak_blocks = self.blocks

    def free_bytes(self) -> int:
        return self.total - self.reserved

    def stats(self) -> collections.OrderedDict:
        """``torch.npu.memory_stats()``: torch_npu's flat keys, sorted; only the byte counts
        (``allocated_bytes``, ``active_bytes``, ``reserved_bytes``, pool ``all``) and the two
        event counters (``large_pool`` / ``small_pool``, block counts and segments are not
        modelled and absent)."""
        with self._lock:
            flat = {
                "allocated_bytes.all.current": self.allocated,
                "allocated_bytes.all.peak": self.peak_allocated,
                "allocated_bytes.all.allocated": self.allocated_total,
                "allocated_bytes.all.freed": self.freed_total,
                "active_bytes.all.current": self.allocated,
                "active_bytes.all.peak": self.peak_allocated,
                "reserved_bytes.all.current": self.reserved,
                "reserved_bytes.all.peak": self.peak_reserved,
                "num_alloc_retries": 0,
                "num_ooms": self.num_ooms,
            }
        return collections.OrderedDict(sorted(flat.items()))
