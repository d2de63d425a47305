"""The C kernel on its own: strict builds, freestanding, and the fuzzer under the sanitizers.

The fuzzer (aicpu_kernels/tests/fuzz_tiling.c) checks every result against an independent C
checker (tiling_check.c): status class, offending request, the coverage invariant walked in
head-major work order up to the end position (0, num_kv_heads, 0, 0), slots and combine
records in work order, costs, the balance bound, the per-head layout when num_cores is a
multiple of num_kv_heads, the min-max certificate (greedy filling with one less than the
busiest core must not fit), idle cores and zero tables on input errors, the size against
AICPU_TILING_BYTES_BOUND(num_cores), full and deterministic writes, and no write past the
buffer.
CI runs AICPU_TILING_FUZZ_CASES cases (default 100,000); the 10^6 run is

    AICPU_TILING_FUZZ_CASES=1000000 python -m pytest tests/test_tiling_c.py -k fuzz
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "aicpu_kernels"
STRICT = ["-Wall", "-Wextra", "-Werror"]
FUZZ_CASES = int(os.environ.get("AICPU_TILING_FUZZ_CASES", "100000"))

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def compile_c(out: Path, sources: list[Path], flags: list[str]) -> Path:
    cmd = ["gcc", *flags, "-I", str(KERNELS), *map(str, sources), "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    assert result.stderr == "", result.stderr
    return out


@pytest.mark.parametrize(
    "flags",
    [
        ["-std=c99", "-pedantic", *STRICT],
        ["-std=c99", "-pedantic", "-ffreestanding", *STRICT],
        ["-std=c11", "-O3", *STRICT, "-Wconversion", "-Wshadow"],
        ["-std=c99", "-DAICPU_TILING_DEBUG", *STRICT],
    ],
    ids=["c99-pedantic", "freestanding", "c11-O3-conversion", "debug-asserts"],
)
def test_kernel_builds_warning_free(tmp_path, flags):
    compile_c(tmp_path / "tiling.o", [KERNELS / "aicpu_tiling.c"], ["-c", *flags])


def test_freestanding_object_calls_no_library_function(tmp_path):
    obj = compile_c(tmp_path / "tiling.o", [KERNELS / "aicpu_tiling.c"],
                    ["-c", "-std=c99", "-ffreestanding", "-O2", *STRICT])
    symbols = subprocess.run(["nm", "-u", str(obj)], capture_output=True, text=True,
                             check=False).stdout
    undefined = [line.split()[-1] for line in symbols.splitlines() if line.strip()]
    assert undefined == [], f"the kernel needs {undefined}"


def run_fuzz(binary: Path, cases: int, seed: int) -> dict[int, int]:
    result = subprocess.run([str(binary), str(cases), str(seed)], capture_output=True, check=False,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"fuzz: (\d+) cases, (\d+) ok, (\d+) errors; by status:([\d ]+)",
                      result.stdout)
    assert match, result.stdout
    assert int(match.group(1)) == cases
    return dict(enumerate(int(x) for x in match.group(4).split()))


FUZZ_SOURCES = [KERNELS / "aicpu_tiling.c", KERNELS / "tests" / "tiling_check.c",
                KERNELS / "tests" / "fuzz_tiling.c"]


def test_fuzz_plain_build_sees_every_input_class(tmp_path):
    binary = compile_c(tmp_path / "fuzz", FUZZ_SOURCES, ["-std=c99", "-O2", *STRICT])
    by_status = run_fuzz(binary, FUZZ_CASES, seed=1)
    # Every per-step input class is generated and classified (params/buffer are host-side).
    for status in [0, *range(3, 11)]:
        assert by_status[status] > 0, f"status {status} never produced"


def test_fuzz_under_address_and_undefined_sanitizers(tmp_path):
    sanitize = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                "-fno-omit-frame-pointer"]
    binary = compile_c(tmp_path / "fuzz_asan", FUZZ_SOURCES, ["-std=c99", "-O1", "-g",
                                                              *STRICT, *sanitize])
    by_status = run_fuzz(binary, max(FUZZ_CASES // 2, 1000), seed=2)
    assert by_status[0] > 0
