"""AArch64 cross-compile of the tiling kernel and its AI-CPU entry points, with ``ziglang``.

The AI-CPU is an AArch64 Linux CPU (CANN cross-compiles for it with
``aarch64-target-linux-gnu-g++``). Zig's clang, installed from PyPI as ``ziglang``, targets
it from any host: ``python -m ziglang cc -target aarch64-linux-gnu``. The commands here are
the one definition of the AArch64 build; ``tools/build_aicpu_kernel.sh cross`` and the tests
call them.

Two kinds of output:

- Objects and a shared object for ``aarch64-linux-gnu`` (:func:`cross_units`): the kernel
  (``-std=c99 -pedantic -ffreestanding``), the classic ``aicpu::CpuKernel`` and the Ascend C
  entry against ``aicpu_kernels/cann_stub/`` (the project's stand-in for CANN's
  declarations, NOT CANN), and ``libaicpu_tiling_runtime.so``: the Ascend C entry built as a
  plain .so for the runtime launch route (``aicpu_kernels/npu_ext/launch_route.h``). All
  with ``-Wall -Wextra -Werror``.
- Static freestanding executables (:func:`emulator_images`) the emulator loads: no libc,
  no relocation, entry = the function called. ``kernel``: ``aicpu_tiling.c`` alone;
  ``entry``: the Ascend C entry unity-built with the kernel and the runtime route's device
  header (``aicpu_kernels/npu_ext/device/aicpu_api.h``), so the code the runtime route
  ships is the code that runs in the emulator.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "aicpu_kernels"
AICPU = KERNELS / "aicpu"
CANN_STUB = KERNELS / "cann_stub"
DEVICE_HEADERS = KERNELS / "npu_ext" / "device"

ZIG = (sys.executable, "-m", "ziglang")
#: The AI-CPU's Linux target (glibc); its libc is never linked: the kernel calls no library.
TARGET = "aarch64-linux-gnu"
#: Static images for the emulator: musl's target links without a dynamic loader.
STATIC_TARGET = "aarch64-linux-musl"
WARNINGS = ("-Wall", "-Wextra", "-Werror")
C_FLAGS = ("-std=c99", "-pedantic", "-ffreestanding", "-O2", *WARNINGS)
CXX_FLAGS = ("-std=c++14", "-O2", *WARNINGS)
#: No exceptions or RTTI in the entry's .so: it must not need libstdc++ on the AI-CPU.
DEVICE_CXX_FLAGS = (*CXX_FLAGS, "-ffreestanding", "-fno-exceptions", "-fno-rtti")
STATIC_LINK = ("-nostdlib", "-static", "-fno-pic")


class ToolchainError(RuntimeError):
    """The AArch64 toolchain is missing or a cross-compile failed; the message says which."""


def missing_tools() -> list[str]:
    """The Python packages this module and the emulator need that are not installed."""
    return [name for name, module in (("ziglang", "ziglang"), ("unicorn", "unicorn"),
                                      ("pyelftools", "elftools"))
            if importlib.util.find_spec(module) is None]  # fmt: skip


@dataclass(frozen=True)
class Unit:
    """One cross-compile step: `argv` writes `output` (relative to the build directory)."""

    name: str
    output: str
    argv: tuple[str, ...]


def cross_units() -> list[Unit]:
    """The ``aarch64-linux-gnu`` builds CI checks (compile, or link the runtime .so)."""
    stub = f"-I{CANN_STUB}"
    return [
        Unit("kernel", "aicpu_tiling.o",
             (*ZIG, "cc", "-target", TARGET, *C_FLAGS, "-c", str(KERNELS / "aicpu_tiling.c"))),
        Unit("classic entry", "tiling_cpu_kernel.o",
             (*ZIG, "c++", "-target", TARGET, *CXX_FLAGS, "-fPIC", stub,
              "-c", str(AICPU / "tiling_cpu_kernel.cc"))),
        Unit("Ascend C entry", "tiling_ascendc_aicpu.o",
             (*ZIG, "c++", "-target", TARGET, *CXX_FLAGS, "-fPIC", stub,
              "-c", str(AICPU / "tiling_ascendc_aicpu.cpp"))),
        Unit("Ascend C entry, unity", "tiling_ascendc_aicpu_unity.o",
             (*ZIG, "c++", "-target", TARGET, *CXX_FLAGS, "-fPIC", stub,
              "-DAICPU_TILING_UNITY_BUILD", "-c", str(AICPU / "tiling_ascendc_aicpu.cpp"))),
        Unit("runtime-route .so", "libaicpu_tiling_runtime.so",
             (*ZIG, "c++", "-target", TARGET, *DEVICE_CXX_FLAGS, "-fPIC", "-shared",
              "-nostdlib", f"-I{DEVICE_HEADERS}", "-DAICPU_TILING_UNITY_BUILD",
              "-Wl,-z,noexecstack", str(AICPU / "tiling_ascendc_aicpu.cpp"))),
    ]  # fmt: skip


def emulator_images() -> list[Unit]:
    """The static ELF images the emulator runs, named by what their entry point is."""
    return [
        Unit("kernel", "aicpu_tiling_plan.elf",
             (*ZIG, "cc", "-target", STATIC_TARGET, *C_FLAGS, *STATIC_LINK,
              "-Wl,-e,aicpu_tiling_plan", str(KERNELS / "aicpu_tiling.c"))),
        Unit("entry", "aicpu_tiling_kernel.elf",
             (*ZIG, "c++", "-target", STATIC_TARGET, *DEVICE_CXX_FLAGS, *STATIC_LINK,
              f"-I{DEVICE_HEADERS}", "-DAICPU_TILING_UNITY_BUILD",
              "-Wl,-e,aicpu_tiling_kernel", str(AICPU / "tiling_ascendc_aicpu.cpp"))),
    ]  # fmt: skip


def _sources_digest(unit: Unit) -> str:
    """A hash of the command and every source or header it can read."""
    digest = hashlib.sha256("\0".join(unit.argv[len(ZIG):]).encode())
    for folder in (KERNELS, AICPU, CANN_STUB, DEVICE_HEADERS):
        for path in sorted(folder.glob("*")):
            if path.suffix in (".c", ".cc", ".cpp", ".h"):
                digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def run_unit(unit: Unit, out_dir: Path, *, timeout: float = 300.0) -> Path:
    """Run one step into `out_dir`; the output's path.

    Raises:
        ToolchainError: ziglang is not installed, or the compiler failed (its first lines
            of diagnostics are in the message).
    """
    if importlib.util.find_spec("ziglang") is None:
        raise ToolchainError("the AArch64 cross-compile needs ziglang: pip install ziglang")
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / unit.output
    proc = subprocess.run([*unit.argv, "-o", str(output)], capture_output=True, text=True,
                          check=False, timeout=timeout, cwd=REPO)  # fmt: skip
    if proc.returncode != 0:
        detail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[:20])
        raise ToolchainError(f"cross-compiling the {unit.name} failed:\n{detail}")
    return output


def build_image(name: str, build_dir: Path | None = None) -> Path:
    """The emulator image `name` (``kernel`` or ``entry``), built once per source hash.

    Args:
        name: which image of :func:`emulator_images`.
        build_dir: where images are cached; default ``$AICPU_TILING_BUILD_DIR/aarch64`` or
            ``<repo>/build/aarch64``.

    Raises:
        ToolchainError: as :func:`run_unit`; KeyError for an unknown name.
    """
    unit = {u.name: u for u in emulator_images()}[name]
    if not (KERNELS / "aicpu_tiling.c").is_file():
        raise ToolchainError(f"the kernel sources are not at {KERNELS}: the AArch64 build "
                             "runs from a clone of the repository, not from an installed wheel")
    root = build_dir or Path(os.environ.get("AICPU_TILING_BUILD_DIR", REPO / "build")) / "aarch64"
    cached = root / f"{Path(unit.output).stem}-{_sources_digest(unit)}.elf"
    if not cached.exists():
        built = run_unit(unit, root / f"tmp-{os.getpid()}")
        os.replace(built, cached)
    return cached
