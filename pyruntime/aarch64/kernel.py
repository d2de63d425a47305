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
_C_FORMATS = {"uint32_t": "I", "int32_t": "i", "uint64_t": "Q", "int64_t": "q",
              "aicpu_tiling_params": "16i",
              "aicpu_tiling_kernel_plan": "QQ16i"}  # fmt: skip


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)


def plan_signature() -> list[tuple[str, str]]:
    """(C type, name) of each parameter of ``aicpu_tiling_plan()``, read from
    aicpu_tiling.h, so the emulated call follows the header's ABI (order and types)."""
    text = _strip_comments((toolchain.KERNELS / "aicpu_tiling.h").read_text())
    params = re.search(r"int aicpu_tiling_plan\(([^)]*)\);", text).group(1)
    out = []
    for param in params.split(","):
        m = re.match(r"\s*(.*?)\s*\b(\w+)\s*$", param.replace("*", " * "))
        out.append((" ".join(m.group(1).split()), m.group(2)))
    return out


def args_layout() -> tuple[tuple[str, str], ...]:
    """(name, struct format) of each field of ``aicpu_tiling_kernel_args``, in order, read
    from tiling_kernel_args.h (every field is a fixed-width integer or the params struct,
    with no implicit padding: the header pins it). A test compares the offsets with the
    host compiler's offsetof()."""
    text = _strip_comments((toolchain.AICPU / "tiling_kernel_args.h").read_text())
    body = re.search(r"typedef struct aicpu_tiling_kernel_args \{(.*?)\}", text, re.DOTALL)
    fields = re.findall(r"(\w+)\s+(\w+)\s*(?:\[([^\]]*)\])?\s*;", body.group(1))
    # an array field (``more[AICPU_TILING_KERNEL_MAX_PLANS - 1]``): its format repeated
    return tuple((name, _C_FORMATS[ctype] * (_array_length(text, size) if size else 1))
                 for ctype, name, size in fields)


def _array_length(text: str, expression: str) -> int:
    """An array size of the header: ``MACRO``, a number, or ``MACRO - n``."""
    def value(token: str) -> int:
        token = token.strip()
        if token.isdigit():
            return int(token)
        return int(re.search(rf"#define {token} (\d+)", text).group(1))

    first, minus, rest = expression.partition("-")
    return value(first) - (value(rest) if minus else 0)


def max_plans() -> int:
    """AICPU_TILING_KERNEL_MAX_PLANS as written in tiling_kernel_args.h: the tilings one
    launch of the entry plans (the block's own and ``more``)."""
    text = (toolchain.AICPU / "tiling_kernel_args.h").read_text()
    return _array_length(text, "AICPU_TILING_KERNEL_MAX_PLANS")


def args_format() -> str:
    """The struct format of the whole argument block (little-endian, no padding)."""
    return "<" + "".join(fmt for _, fmt in args_layout())


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
    #: launch_entry with ``more``: each further plan's whole buffer after the call
    more_buffers: tuple[bytes, ...] = ()


def params_words(params) -> list[int]:
    """The 16 int32 words of ``aicpu_tiling_params`` for a TilingParams or raw ints.

    Raw sequences of 12 to 16 ints are padded with zero words (the 13th is sliding_window,
    ABI v5, then the reserved words); they may be invalid (for the E_PARAMS cases
    TilingParams refuses to build).
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
             batch: int | None = None, *, causal: bool = True, epoch: int = 0,
             buffer_bytes: int | None = None, exact_count: bool = False,
             **scalars: int) -> EmulatedPlan:
        """``aicpu_tiling_plan(params, cu, kv, batch, flags, buffer, buffer_bytes, ...)``,
        arguments placed by name in the order aicpu_tiling.h declares them.

        Args:
            params: TilingParams, or 12-16 raw int32 words (may be invalid).
            cu_seqlens_q: int32 values, placed exactly (the kernel may read no further).
            seqlens_kv: int32 values, placed exactly.
            batch: the batch argument; default ``len(seqlens_kv)``.
            causal: passes AICPU_TILING_CAUSAL.
            epoch: the step epoch the kernel echoes in the header (int32).
            buffer_bytes: the output buffer's size; default ``params.tiling_bytes`` (or 64
                for raw params).
            exact_count: also count instructions one by one (see `Machine.call`).
            scalars: any further integer parameter of the prototype, by name (default 0).

        Raises:
            ValueError: the prototype has a pointer parameter this function does not know.
        """
        m = self.kernel
        words = params_words(params)
        size = buffer_bytes if buffer_bytes is not None else getattr(params, "tiling_bytes", 64)
        kv = _int32_bytes("seqlens_kv", seqlens_kv)
        try:
            buffer = m.place(bytes([FILL]) * size)
            known = {
                "params": lambda: m.place(struct.pack("<16i", *words)),
                "cu_seqlens_q": lambda: m.place(_int32_bytes("cu_seqlens_q", cu_seqlens_q)),
                "seqlens_kv": lambda: m.place(kv),
                "batch": lambda: len(kv) // 4 if batch is None else batch,
                "flags": lambda: 1 if causal else 0,
                "epoch": lambda: epoch,
                "buffer": lambda: buffer,
                "buffer_bytes": lambda: size,
            }
            args, narrow = [], []
            for i, (ctype, name) in enumerate(plan_signature()):
                if name in known:
                    args.append(known[name]())
                elif "*" not in ctype:
                    args.append(int(scalars.get(name, 0)))
                else:
                    raise ValueError(f"aicpu_tiling_plan() has a pointer parameter {name!r} "
                                     "pyruntime/aarch64/kernel.py does not know")
                if ctype in ("int32_t", "uint32_t", "int"):
                    narrow.append(i)
            result = m.call("aicpu_tiling_plan", args, int32_args=tuple(narrow),
                            exact_count=exact_count)
            status = struct.unpack("<i", struct.pack("<I", result.x0 & 0xFFFF_FFFF))[0]
            count = result.stepped_instructions if exact_count else result.instructions
            return EmulatedPlan(status, m.read(buffer, size), count, result.stack_bytes)
        finally:
            m.release()

    def launch_entry(self, params, cu_seqlens_q: Sequence[int], seqlens_kv: Sequence[int],
                     batch: int, *, live_batch: int | None = None,
                     step_epoch: int | None = None, causal: bool = True,
                     buffer_bytes: int | None = None, more: Sequence = (),
                     num_more: int | None = None, **int32_buffers: int) -> EmulatedPlan:
        """``aicpu_tiling_kernel(&args)``: the Ascend C / runtime-route entry point.

        Args:
            params, cu_seqlens_q, seqlens_kv, causal, buffer_bytes: as :meth:`plan`.
            batch: the block's ``batch`` field.
            live_batch: when given, the int32 the block's ``live_batch`` address points at.
            step_epoch: when given, the int32 the block's ``step_epoch`` address points at
                (the kernel then echoes it; without it the epoch is 0).
            more: further plans of the same launch (ABI v3's ``more[]``), each a TilingParams
                or ``(params, buffer_bytes)``: their buffers come back in ``more_buffers``.
                More than the block holds raises ValueError.
            num_more: the block's ``num_more`` field (default: ``len(more)``; another value
                tests the entry's checks).
            int32_buffers: further address fields of the block, by name: each gets a fresh
                one-int32 buffer holding the value (fields not given stay 0).

        Returns:
            An EmulatedPlan whose status is the entry's return value
            (AICPU_TILING_KERNEL_OK or _INVALID); the header has the kernel's status.
        """
        m = self.entry
        size = buffer_bytes if buffer_bytes is not None else getattr(params, "tiling_bytes", 64)
        try:
            buffer = m.place(bytes([FILL]) * size)
            fields = {
                "args_bytes": struct.calcsize(args_format()),
                "args_version": header_args_version(),
                "flags": 1 if causal else 0,
                "batch": batch,
                "cu_seqlens_q": m.place(_int32_bytes("cu_seqlens_q", cu_seqlens_q)),
                "seqlens_kv": m.place(_int32_bytes("seqlens_kv", seqlens_kv)),
                "live_batch": 0 if live_batch is None else m.place(struct.pack("<i", live_batch)),
                "step_epoch": 0 if step_epoch is None else m.place(struct.pack("<i", step_epoch)),
                "buffer": buffer,
                "buffer_bytes": size,
            }
            for name, value in int32_buffers.items():  # further device addresses, by name
                fields[name] = m.place(struct.pack("<i", value))
            slots = max_plans() - 1
            if len(more) > slots:
                raise ValueError(f"{len(more)} further plans: the block holds {slots}")
            placed = []  # (address, size) of each further plan's buffer
            plan_words = []
            for entry in more:
                more_params, more_size = entry if isinstance(entry, tuple) else (entry, None)
                more_size = (more_size if more_size is not None
                             else getattr(more_params, "tiling_bytes", 64))
                placed.append((m.place(bytes([FILL]) * more_size), more_size))
                plan_words.append([*placed[-1], *params_words(more_params)])
            plan_words += [[0] * 18] * (slots - len(more))
            fields["num_more"] = len(more) if num_more is None else num_more
            values = []
            for name, _ in args_layout():
                if name == "params":
                    values.extend(params_words(params))
                elif name == "more":
                    values.extend(v for words in plan_words for v in words)
                else:
                    values.append(fields.get(name, 0))
            block = struct.pack(args_format(), *values)
            result = m.call("aicpu_tiling_kernel", [m.place(block)])
            return EmulatedPlan(result.x0 & 0xFFFF_FFFF, m.read(buffer, size),
                                result.instructions, result.stack_bytes,
                                tuple(m.read(a, n) for a, n in placed))
        finally:
            m.release()
