"""The reference attention in C on its own: strict builds, and every instruction-set variant
against the portable one (aicpu_kernels/tests/attention_variants.c, the logits soft cap and
attention sinks off and on), plainly and under AddressSanitizer + UndefinedBehaviorSanitizer."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pyruntime.kernels import reference_attention as ra

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "aicpu_kernels"
STRICT = ["-Wall", "-Wextra", "-Werror"]
SOURCES = [KERNELS / "tests" / "attention_variants.c", KERNELS / "attention_ref.c",
           KERNELS / "attention_x86.c", KERNELS / "aicpu_tiling.c"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def compile_c(out: Path, sources: list[Path], flags: list[str]) -> Path:
    cmd = ["gcc", *flags, "-I", str(KERNELS), *map(str, sources), "-lm", "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    assert result.stderr == "", result.stderr
    return out


def skip_without_sanitizers(tmp_path: Path) -> None:
    """Skip the calling test when gcc cannot link an AddressSanitizer + UBSan program here."""
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    if subprocess.run(["gcc", *SANITIZE, str(probe), "-o", str(tmp_path / "probe")],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("this compiler cannot link AddressSanitizer/UBSan programs")


@pytest.mark.parametrize("source", ["attention_ref.c", "attention_x86.c"])
@pytest.mark.parametrize(
    "flags",
    [["-std=c99", "-pedantic", "-O3"], ["-std=c99", "-O0", "-g"], ["-std=c11", "-O2"]],
    ids=["c99-pedantic-O3", "c99-O0", "c11-O2"],
)
def test_sources_build_warning_free(tmp_path, source, flags):
    compile_c(tmp_path / "a.o", [KERNELS / source], ["-c", *flags, *STRICT])


def run_variants(binary: Path) -> tuple[list[str], int]:
    result = subprocess.run([str(binary)], capture_output=True, text=True, check=False,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"variants: ([a-z0-9 ]+); (\d+) problems", result.stdout)
    assert match, result.stdout
    return match.group(1).split(), int(match.group(2))


def test_every_variant_matches_the_portable_one(tmp_path):
    binary = compile_c(tmp_path / "variants", SOURCES, ["-std=c99", "-pedantic", "-O2", *STRICT])
    names, problems = run_variants(binary)
    # the C program and the Python module see the same variants on this machine
    assert names == ra.isa_variants()["supported"]
    # 4 head dims x 3 groups x 2 core counts x 4 settings (off, soft cap, sinks, both) x 3 dtypes
    assert problems == 288 * (len(names) - 1)


def test_variants_under_address_and_undefined_sanitizers(tmp_path):
    skip_without_sanitizers(tmp_path)
    binary = compile_c(tmp_path / "variants_asan", SOURCES,
                       ["-std=c99", "-O1", "-g", *STRICT, *SANITIZE])
    names, problems = run_variants(binary)
    assert problems == 288 * (len(names) - 1)


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                    reason="needs the aarch64-linux-gnu-gcc cross compiler")
def test_aarch64_build_has_only_the_portable_variant(tmp_path):
    # the x86 file compiles to the stub that reports no table, warning-free
    for source in ("attention_ref.c", "attention_x86.c"):
        cmd = ["aarch64-linux-gnu-gcc", "-std=c99", "-pedantic", "-O2", *STRICT, "-I",
               str(KERNELS), "-c", str(KERNELS / source), "-o", str(tmp_path / f"{source}.o")]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert result.returncode == 0 and result.stderr == "", result.stderr
    symbols = subprocess.run(["aarch64-linux-gnu-nm", str(tmp_path / "attention_x86.c.o")],
                             capture_output=True, text=True, check=False).stdout.split()
    assert symbols == ["0000000000000000", "T", "attention_x86_kernels"]
