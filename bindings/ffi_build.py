"""cffi out-of-line API-mode build of the kernels. The built module exports ``ffi, lib`` only.

Used by ``setup.py`` through ``cffi_modules``; ``pip install -e .`` builds the module in place
as ``pyruntime/_native*.so``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cffi import FFI

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_config

ffibuilder = FFI()
ffibuilder.cdef(build_config.cdef_source())
_compile_args, _link_args = build_config.compile_args(os.environ)
ffibuilder.set_source(
    build_config.MODULE_NAME,
    build_config.c_preamble(),
    sources=build_config.sources(),
    include_dirs=[str(build_config.KERNEL_DIR.relative_to(build_config.ROOT))],
    extra_compile_args=_compile_args,
    extra_link_args=_link_args,
    libraries=build_config.LIBRARIES,
)
