"""Pure build logic for the cffi extension, kept apart from cffi so it can be tested.

Build knobs are environment variables with the ``AICPU_TILING_`` prefix:

``AICPU_TILING_DEBUG``
    ``1`` compiles the kernels with their debug asserts (``-DAICPU_TILING_DEBUG -O0 -g``).
``AICPU_TILING_SANITIZE``
    A comma-separated subset of ``address,undefined``: builds the extension with those
    sanitizers (the interpreter must then be run with the runtime preloaded).
``AICPU_TILING_OPT``
    The optimisation level, one of ``0 1 2 3 s``; default ``3``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL_DIR = ROOT / "aicpu_kernels"
BINDINGS_DIR = ROOT / "bindings"
MODULE_NAME = "pyruntime._native"

# (cdef file in bindings/, header to #include, C source in aicpu_kernels/)
COMPONENTS = (
    ("aicpu_tiling.cdef.h", "aicpu_tiling.h", "aicpu_tiling.c"),
    ("attention_ref.cdef.h", "attention_ref.h", "attention_ref.c"),
    ("attention_mla_ref.cdef.h", "attention_mla_ref.h", "attention_mla_ref.c"),
)
#: Sources with no header or cdef of their own: the x86 SIMD variants of the reference
#: attention's inner kernels (per-function target attributes; empty off x86-64).
EXTRA_SOURCES = ("attention_x86.c",)
#: The reference attention uses expf/logf (it is a host emulation, not freestanding).
LIBRARIES = ["m"]

_SANITIZERS = ("address", "undefined")
_OPT_LEVELS = ("0", "1", "2", "3", "s")


class BuildConfigError(ValueError):
    """A build knob has a value the build cannot use."""


def cdef_source() -> str:
    """The concatenated cffi declarations of every component."""
    return "\n".join((BINDINGS_DIR / cdef).read_text() for cdef, _, _ in COMPONENTS)


def c_preamble() -> str:
    """The C code cffi compiles the wrappers against: the real headers."""
    return "\n".join(f'#include "{header}"' for _, header, _ in COMPONENTS)


def sources() -> list[str]:
    """Kernel sources linked into the extension, relative to the repository root."""
    names = [source for _, _, source in COMPONENTS] + list(EXTRA_SOURCES)
    return [str((KERNEL_DIR / source).relative_to(ROOT)) for source in names]


def compile_args(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(extra_compile_args, extra_link_args) from the AICPU_TILING_* environment."""
    opt = env.get("AICPU_TILING_OPT", "3").strip()
    if opt not in _OPT_LEVELS:
        raise BuildConfigError(
            f"AICPU_TILING_OPT is {opt!r}, but it must be one of {', '.join(_OPT_LEVELS)}."
        )
    compile_flags = ["-std=c99", f"-O{opt}", "-Wall", "-Wextra"]
    link_flags: list[str] = []
    debug = env.get("AICPU_TILING_DEBUG", "0").strip()
    if debug not in ("0", "1"):
        raise BuildConfigError(f"AICPU_TILING_DEBUG is {debug!r}, but it must be 0 or 1.")
    if debug == "1":
        compile_flags += ["-DAICPU_TILING_DEBUG", "-O0", "-g"]
    wanted = [s.strip() for s in env.get("AICPU_TILING_SANITIZE", "").split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(_SANITIZERS))
    if unknown:
        raise BuildConfigError(
            f"AICPU_TILING_SANITIZE names {', '.join(unknown)}, but only "
            f"{', '.join(_SANITIZERS)} are supported."
        )
    if wanted:
        flag = "-fsanitize=" + ",".join(wanted)
        compile_flags += [flag, "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"]
        link_flags.append(flag)
    return compile_flags, link_flags
