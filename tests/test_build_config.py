"""The cffi build's pure logic: knobs from the environment, sources, declarations."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bindings"))
import build_config


def test_defaults_are_optimised_c99_with_warnings():
    compile_flags, link_flags = build_config.compile_args({})
    assert compile_flags == ["-std=c99", "-O3", "-Wall", "-Wextra"]
    assert link_flags == []


def test_debug_and_sanitizers():
    compile_flags, link_flags = build_config.compile_args(
        {"AICPU_TILING_DEBUG": "1", "AICPU_TILING_SANITIZE": "address, undefined"})
    assert "-DAICPU_TILING_DEBUG" in compile_flags and "-O0" in compile_flags
    assert "-fsanitize=address,undefined" in compile_flags
    assert link_flags == ["-fsanitize=address,undefined"]


@pytest.mark.parametrize("env, message", [
    ({"AICPU_TILING_OPT": "4"}, "AICPU_TILING_OPT is '4', but it must be one of"),
    ({"AICPU_TILING_DEBUG": "yes"}, "AICPU_TILING_DEBUG is 'yes', but it must be 0 or 1."),
    ({"AICPU_TILING_SANITIZE": "thread"}, "AICPU_TILING_SANITIZE names thread, but only"),
])
def test_bad_knobs_fail_with_a_full_sentence(env, message):
    with pytest.raises(build_config.BuildConfigError, match=message) as info:
        build_config.compile_args(env)
    assert isinstance(info.value, ValueError)
    assert str(info.value).endswith(".")


def test_every_component_exists_and_its_cdef_is_included():
    for cdef, header, source in build_config.COMPONENTS:
        assert (build_config.BINDINGS_DIR / cdef).is_file()
        assert (build_config.KERNEL_DIR / header).is_file()
        assert (build_config.KERNEL_DIR / source).is_file()
        assert f'#include "{header}"' in build_config.c_preamble()
    for source in build_config.EXTRA_SOURCES:
        assert (build_config.KERNEL_DIR / source).is_file()
        assert str(Path("aicpu_kernels") / source) in build_config.sources()
    assert "aicpu_tiling_plan" in build_config.cdef_source()
    assert all(not Path(s).is_absolute() for s in build_config.sources())
