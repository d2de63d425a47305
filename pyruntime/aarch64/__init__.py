"""The tiling kernel built for the AI-CPU's architecture (AArch64) and run in an emulator.

Nothing here needs an NPU. Three parts, one concept each:

- `toolchain`: the cross-compile commands (``python -m ziglang cc/c++``, from PyPI) for the
  tiling kernel and the AI-CPU entry points, and the static freestanding ELF the emulator
  runs. The one place the AArch64 build flags live; ``tools/build_aicpu_kernel.sh cross``
  calls it.
- `emulator`: a small AArch64 machine (``unicorn`` + ``pyelftools``) that loads a static
  ELF, calls one of its functions with the AAPCS64 convention and counts the instructions
  it executed.
- `kernel`: ``aicpu_tiling_plan()`` and the Ascend C entry ``aicpu_tiling_kernel()`` run
  in that machine on numpy inputs, returning the buffer bytes, the status and the
  instruction count (the noise-free AI-CPU cost figure of ``aicpu-tiling bench tiling``).

Command line: ``python -m pyruntime.cli.aarch64 build [DIR]`` cross-compiles everything and
``python -m pyruntime.cli.aarch64 count`` prints instruction counts per call.
"""

from __future__ import annotations

from .toolchain import ToolchainError, missing_tools

__all__ = ["ToolchainError", "missing_tools"]
