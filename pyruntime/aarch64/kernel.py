"""The tiling kernel and its Ascend C entry point, run as AArch64 code in the emulator.

`EmulatedKernel.plan` calls ``aicpu_tiling_plan()`` of the static AArch64 build on the same
inputs the host build (`pyruntime.tiling.plan`) takes and returns the buffer bytes, the
status and the instruction count. `EmulatedKernel.launch_entry` does the same through the
Ascend C entry ``aicpu_tiling_kernel(void *args)`` (the function the runtime launch route
ships as ``libaicpu_tiling_runtime.so``), with the argument block of
``aicpu_kernels/aicpu/tiling_kernel_args.h`` laid out in emulated memory.

The output buffer starts filled with `FILL` bytes, so a word the kernel forgot to write
shows up against the host build's zero-filled buffer.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import toolchain
from .emulator import Machine

FILL = 0xA5
#: Layout of ``aicpu_tiling_kernel_args`` (tiling_kernel_args.h), version 1: args_bytes,
#: args_version, flags, batch, then the device addresses cu_seqlens_q, seqlens_kv,
#: live_batch, buffer and buffer_bytes, then the 16-word params. A test compiles the header
#: on the host and compares every offset, so a change there fails loudly here.
ARGS_LAYOUT = (
    ("args_bytes", "I"), ("args_version", "I"), ("flags", "I"), ("batch", "i"),
    ("cu_seqlens_q", "Q"), ("seqlens_kv", "Q"), ("live_batch", "Q"), ("buffer", "Q"),
    ("buffer_bytes", "Q"), ("params", "16i"),
)  # fmt: skip
ARGS_FORMAT = "<" + "".join(fmt for _, fmt in ARGS_LAYOUT)
ARGS_VERSION = 1


def header_args_version() -> int:
    """AICPU_TILING_KERNEL_ARGS_VERSION as written in tiling_kernel_args.h."""
    text = (toolchain.AICPU / "tiling_kernel_args.h").read_text()
    return int(re.search(r"#define AICPU_TILING_KERNEL_ARGS_VERSION (\d+)", text).group(1))


@dataclass(frozen=True)
class EmulatedPlan:
    """One emulated call.

    Attributes:
        status: ``aicpu_tiling_plan()``'s return value (or the entry's, for launch_entry).
        buffer: the whole output buffer after the call, ``buffer_bytes`` bytes.
        instructions: AArch64 instructions the call executed.
        stack_bytes: its deepest stack use.
    """

    status: int
    buffer: bytes
    instructions: int
    stack_bytes: int


def params_words(params) -> list[int]:
    """The 16 int32 words of ``aicpu_tiling_params`` for a TilingParams or raw ints.

    Raw sequences of 12 to 16 ints are padded with zero reserved words; they may be invalid
    (for the E_PARAMS cases TilingParams refuses to build).
    """
    if hasattr(params, "as_dict"):
        words = list(params.as_dict().values())
    else:
        words = [int(v) for v in params]
    if not 12 <= len(words) <= 16:
        raise ValueError(f"params has {len(words)} words, expected 12 to 16")
    return words + [0] * (16 - len(words))


def _int32_bytes(name: str, values) -> bytes:
    array = np.asarray(values)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{name} must be a 1-D integer sequence")
    return array.astype("<i4").tobytes()


class EmulatedKernel:
    """The AArch64 builds of the kernel and of its Ascend C entry, ready to call.

    Args:
        build_dir: where the static images are cached (see `toolchain.build_image`).

    Raises:
        toolchain.ToolchainError: ziglang is missing or the cross-compile failed.
        ImportError: unicorn or pyelftools is missing.

    Example::

        k = EmulatedKernel()
        run = k.plan(params, [0, 1, 2], [700, 3000])
        assert run.buffer == pyruntime.tiling.plan(params, [0, 1, 2], [700, 3000]).buffer.tobytes()
    """

    def __init__(self, build_dir: Path | None = None):
        self._build_dir = build_dir
        self.kernel = Machine(toolchain.build_image("kernel", build_dir))
        self._entry: Machine | None = None

    @property
    def entry(self) -> Machine:
        """The machine holding the entry image (built on first use)."""
        if self._entry is None:
            self._entry = Machine(toolchain.build_image("entry", self._build_dir))
        return self._entry

    def plan(self, params, cu_seqlens_q: Sequence[int], seqlens_kv: Sequence[int],
             batch: int | None = None, *, causal: bool = True, buffer_bytes: int | None = None,
             exact_count: bool = False) -> EmulatedPlan:
        """``aicpu_tiling_plan(params, cu, kv, batch, flags, buffer, buffer_bytes)``.

        Args:
            params: TilingParams, or 12-16 raw int32 words (may be invalid).
            cu_seqlens_q: int32 values, placed exactly (the kernel may read no further).
            seqlens_kv: int32 values, placed exactly.
            batch: the batch argument; default ``len(seqlens_kv)``.
            causal: passes AICPU_TILING_CAUSAL.
            buffer_bytes: the output buffer's size; default ``params.tiling_bytes`` (or 64
                for raw params).
            exact_count: also count instructions one by one (see `Machine.call`).
        """
        m = self.kernel
        words = params_words(params)
        size = buffer_bytes if buffer_bytes is not None else getattr(params, "tiling_bytes", 64)
        kv = _int32_bytes("seqlens_kv", seqlens_kv)
        try:
            args = [
                m.place(struct.pack("<16i", *words)),
                m.place(_int32_bytes("cu_seqlens_q", cu_seqlens_q)),
                m.place(kv),
                len(kv) // 4 if batch is None else batch,
                1 if causal else 0,
                m.place(bytes([FILL]) * size),
                size,
            ]
            result = m.call("aicpu_tiling_plan", args, int32_args=(3, 4), exact_count=exact_count)
            status = struct.unpack("<i", struct.pack("<I", result.x0 & 0xFFFF_FFFF))[0]
            return EmulatedPlan(status, m.read(args[5], size), result.instructions
                                if not exact_count else result.stepped_instructions,
                                result.stack_bytes)  # fmt: skip
        finally:
            m.release()

    def launch_entry(self, params, cu_seqlens_q: Sequence[int], seqlens_kv: Sequence[int],
                     batch: int, *, live_batch: int | None = None, causal: bool = True,
                     buffer_bytes: int | None = None) -> EmulatedPlan:
        """``aicpu_tiling_kernel(&args)``: the Ascend C / runtime-route entry point.

        Args:
            params, cu_seqlens_q, seqlens_kv, causal, buffer_bytes: as :meth:`plan`.
            batch: the block's ``batch`` field.
            live_batch: when given, the int32 the block's ``live_batch`` address points at.

        Returns:
            An EmulatedPlan whose status is the entry's return value
            (AICPU_TILING_KERNEL_OK or _INVALID); the header has the kernel's status.
        """
        if header_args_version() != ARGS_VERSION:
            raise RuntimeError(
                f"tiling_kernel_args.h is at version {header_args_version()}, but "
                f"pyruntime/aarch64/kernel.py lays out version {ARGS_VERSION}: update ARGS_LAYOUT")
        m = self.entry
        size = buffer_bytes if buffer_bytes is not None else getattr(params, "tiling_bytes", 64)
        try:
            buffer = m.place(bytes([FILL]) * size)
            live = 0 if live_batch is None else m.place(struct.pack("<i", live_batch))
            block = struct.pack(
                ARGS_FORMAT, struct.calcsize(ARGS_FORMAT), ARGS_VERSION, 1 if causal else 0,
                batch, m.place(_int32_bytes("cu_seqlens_q", cu_seqlens_q)),
                m.place(_int32_bytes("seqlens_kv", seqlens_kv)), live, buffer, size,
                *params_words(params))
            result = m.call("aicpu_tiling_kernel", [m.place(block)])
            return EmulatedPlan(result.x0 & 0xFFFF_FFFF, m.read(buffer, size),
                                result.instructions, result.stack_bytes)
        finally:
            m.release()
