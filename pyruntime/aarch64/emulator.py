"""A small AArch64 machine: load a static ELF, call a function, count its instructions.

Built on ``unicorn`` (the QEMU CPU core as a library) and ``pyelftools``. The images it
runs are freestanding (``toolchain.emulator_images``): no libc, no system calls, no
relocations, so loading is copying each ``PT_LOAD`` segment to its address.

Memory safety is checked the cheap way: every argument buffer gets its own mapping and
ends exactly at a page boundary followed by an unmapped page, so a read or write past its
end stops the emulation with :class:`EmulationError` (unicorn reports the unmapped access).
Instructions are counted with a basic-block hook (every AArch64 instruction is 4 bytes, so
a block of ``size`` bytes is ``size // 4`` instructions); ``exact_count=True`` uses a
per-instruction hook instead, slower, for the test that the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PAGE = 4096
STACK_TOP = 0x7000_0000
STACK_BYTES = 256 * 1024
#: Where the called function returns to: a mapped page the emulation stops at.
RETURN_ADDRESS = 0x6000_0000
ARENA_BASE = 0x1_0000_0000
#: Upper halves of 32-bit argument registers are unspecified in AAPCS64 (the callee must
#: not read them); they are filled with this so a kernel that does is caught.
UPPER_JUNK = 0xDEAD_BEEF << 32
STACK_FILL = 0xA5


class EmulationError(RuntimeError):
    """The emulated code faulted (unmapped or misaligned access, bad instruction, timeout)."""


@dataclass(frozen=True)
class CallResult:
    """What one emulated call returned.

    Attributes:
        x0: the 64-bit return register (mask with 0xFFFFFFFF for an int32/uint32 result).
        instructions: AArch64 instructions executed, from entry to the final ``ret``.
        stack_bytes: deepest stack use in bytes (found by a fill pattern, 16-byte grain).
        stepped_instructions: the same count from a per-instruction hook, when the call
            asked for it (``exact_count=True``), else None.
    """

    x0: int
    instructions: int
    stack_bytes: int
    stepped_instructions: int | None = None


def _round_up(n: int, to: int = PAGE) -> int:
    return (n + to - 1) // to * to


class Machine:
    """An AArch64 CPU with one static ELF image loaded.

    Args:
        elf_path: a static, position-dependent AArch64 ELF (``toolchain.build_image``).

    Raises:
        EmulationError: the file is not a static little-endian AArch64 executable.
        ImportError: unicorn or pyelftools is not installed.

    Example::

        m = Machine(toolchain.build_image("kernel"))
        args = [m.place(params_bytes), m.place(cu.tobytes()), ...]
        result = m.call("aicpu_tiling_plan", args)
    """

    def __init__(self, elf_path: Path):
        import unicorn
        from elftools.elf.elffile import ELFFile

        self._uc_mod = unicorn
        self._arm64 = unicorn.arm64_const
        with open(elf_path, "rb") as f:
            elf = ELFFile(f)
            if elf["e_machine"] != "EM_AARCH64" or not elf.little_endian:
                raise EmulationError(f"{elf_path} is not a little-endian AArch64 ELF")
            if elf["e_type"] != "ET_EXEC":
                raise EmulationError(f"{elf_path} is not a static executable")
            segments = [(s["p_vaddr"], s["p_memsz"], s.data()) for s in elf.iter_segments()
                        if s["p_type"] == "PT_LOAD"]  # fmt: skip
            symtab = elf.get_section_by_name(".symtab")
            self.symbols = {sym.name: sym["st_value"] for sym in symtab.iter_symbols()
                            if sym["st_info"]["type"] == "STT_FUNC"}  # fmt: skip
        self.uc = unicorn.Uc(unicorn.UC_ARCH_ARM64, unicorn.UC_MODE_ARM)
        self._map_segments(segments)
        self.uc.mem_map(STACK_TOP - STACK_BYTES, STACK_BYTES)
        self.uc.mem_map(RETURN_ADDRESS, PAGE)
        self._placed: list[tuple[int, int]] = []
        self._next = ARENA_BASE
        self._count = 0
        self._stepped = 0
        self.uc.hook_add(unicorn.UC_HOOK_BLOCK, self._on_block)

    def _map_segments(self, segments) -> None:
        pages: dict[int, None] = {}
        for vaddr, memsz, _ in segments:
            for page in range(vaddr // PAGE * PAGE, _round_up(vaddr + memsz), PAGE):
                pages[page] = None
        for page in sorted(pages):
            self.uc.mem_map(page, PAGE)
        for vaddr, _, data in segments:
            self.uc.mem_write(vaddr, data)  # bss (memsz > filesz) stays zero

    def _on_block(self, uc, address, size, user_data) -> None:
        self._count += size // 4

    def _on_instruction(self, uc, address, size, user_data) -> None:
        self._stepped += 1

    # ------------------------------------------------------------------ memory

    def place(self, data: bytes, *, capacity: int | None = None) -> int:
        """Copy `data` into a fresh mapping that ends at a page boundary; its address.

        Args:
            data: the initial bytes.
            capacity: bytes the callee may touch (default ``len(data)``); the buffer is
                ``capacity`` bytes long, `data` at its start and the rest zero.
        """
        size = len(data) if capacity is None else capacity
        if size < len(data):
            raise ValueError(f"capacity {size} is smaller than the data ({len(data)} bytes)")
        span = _round_up(max(size, 1))
        base = self._next
        self.uc.mem_map(base, span)
        self._next = base + span + PAGE  # the page after stays unmapped: the guard
        self._placed.append((base, span))
        address = base + span - size
        if data:
            self.uc.mem_write(address, bytes(data))
        return address

    def read(self, address: int, size: int) -> bytes:
        """`size` bytes of emulated memory at `address`."""
        return bytes(self.uc.mem_read(address, size))

    def release(self) -> None:
        """Unmap every placed buffer (call between independent calls)."""
        for base, span in self._placed:
            self.uc.mem_unmap(base, span)
        self._placed.clear()
        self._next = ARENA_BASE

    # ------------------------------------------------------------------ calls

    def call(self, symbol: str, args: list[int], *, int32_args: tuple[int, ...] = (),
             exact_count: bool = False, max_instructions: int = 50_000_000) -> CallResult:
        """Call `symbol` with integer/pointer `args` in x0..x7 (AAPCS64).

        Args:
            symbol: a function of the image.
            args: at most 8 register arguments, as Python ints (addresses or values).
            int32_args: indices of 32-bit arguments: their value is passed sign-less in
                the low half and junk in the upper half, as the ABI allows.
            exact_count: count with a per-instruction hook (slow) instead of per block.
            max_instructions: give up after this many (a runaway loop is an error).

        Raises:
            EmulationError: the code faulted or ran past `max_instructions`.
        """
        a64, uc = self._arm64, self.uc
        if len(args) > 8:
            raise ValueError("only register arguments (at most 8) are supported")
        uc.mem_write(STACK_TOP - STACK_BYTES, bytes([STACK_FILL]) * STACK_BYTES)
        registers = [getattr(a64, f"UC_ARM64_REG_X{i}") for i in range(31)]
        for reg in registers:  # no stale state from an earlier call
            uc.reg_write(reg, 0)
        for i, value in enumerate(args):
            if i in int32_args:
                value = (value & 0xFFFF_FFFF) | UPPER_JUNK
            uc.reg_write(registers[i], value & 0xFFFF_FFFF_FFFF_FFFF)
        uc.reg_write(a64.UC_ARM64_REG_SP, STACK_TOP - 64)
        uc.reg_write(a64.UC_ARM64_REG_LR, RETURN_ADDRESS)
        self._count = self._stepped = 0
        hook = None
        if exact_count:
            hook = uc.hook_add(self._uc_mod.UC_HOOK_CODE, self._on_instruction)
            uc.ctl_flush_tb()  # code translated before the hook existed would skip it
        entry = self.symbols[symbol]
        try:
            uc.emu_start(entry, RETURN_ADDRESS, count=max_instructions)
        except self._uc_mod.UcError as exc:
            pc = uc.reg_read(a64.UC_ARM64_REG_PC)
            raise EmulationError(f"{symbol} faulted at pc={pc:#x}: {exc}") from exc
        finally:
            if hook is not None:
                uc.hook_del(hook)
                uc.ctl_flush_tb()
        pc = uc.reg_read(a64.UC_ARM64_REG_PC)
        if pc != RETURN_ADDRESS:
            raise EmulationError(f"{symbol} did not return within {max_instructions} "
                                 f"instructions (pc={pc:#x})")  # fmt: skip
        return CallResult(uc.reg_read(a64.UC_ARM64_REG_X0), self._count, self._stack_used(),
                          self._stepped if exact_count else None)

    def _stack_used(self) -> int:
        low = STACK_TOP - STACK_BYTES
        stack = self.uc.mem_read(low, STACK_BYTES)
        fill = bytes([STACK_FILL]) * 16
        for offset in range(0, STACK_BYTES, 16):
            if stack[offset:offset + 16] != fill:
                return STACK_TOP - 64 - (low + offset)
        return 0
