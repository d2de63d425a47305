"""Host tests of the AI-CPU entry points' argument plumbing (no CANN, no NPU).

Both wrappers in aicpu_kernels/aicpu/ -- the classic aicpu::CpuKernel "AicpuTilingPlan"
and the Ascend C entry aicpu_tiling_kernel(void *args) -- are compiled with g++
(-Wall -Wextra -Werror) against aicpu_kernels/cann_stub/, a declaration-compatible
stand-in for the public CANN headers (NOT CANN), and linked with aicpu_tiling.c into
the C++ driver aicpu_kernels/cann_stub/entry_driver.cc. The driver feeds each wrapper
host buffers and checks that it returns the expected code and writes exactly the bytes
a direct aicpu_tiling_plan() call writes (valid, padded, live-batch, invalid inputs,
invalid params, too-small buffers, missing tensors/attributes, bad argument blocks).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KDIR = ROOT / "aicpu_kernels"
AICPU = KDIR / "aicpu"
STUB = KDIR / "cann_stub"
WARN = ["-Wall", "-Wextra", "-Werror"]

CASES = [
    "registry",
    "decode",
    "mixed_causal",
    "non_causal",
    "sliding_window",
    "empty_batch",
    "invalid_input",
    "live_batch",
    "live_batch_out_of_range",
    "small_buffer",
    "bad_params",
    "classic_plumbing",
    "ascendc_plumbing",
]

pytestmark = pytest.mark.skipif(
    shutil.which("gcc") is None or shutil.which("g++") is None,
    reason="gcc and g++ are needed to build the AI-CPU entry points for the host",
)


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)


def _build(out: Path, extra=(), std="c++14", unity=False) -> Path:
    """Compile the wrappers + stub + driver (+ aicpu_tiling.c) into one host program.
    The translation units compile in parallel."""
    out.mkdir(parents=True, exist_ok=True)
    flags = [*WARN, "-O1", "-g", *extra]
    cxx = [f"-std={std}", f"-I{STUB}"]
    units = [
        ("g++", AICPU / "tiling_cpu_kernel.cc", cxx),
        ("g++", AICPU / "tiling_ascendc_aicpu.cpp",
         cxx + (["-DAICPU_TILING_UNITY_BUILD"] if unity else [])),
        ("g++", STUB / "cann_stub.cc", cxx),
        ("g++", STUB / "entry_driver.cc", cxx),
    ]
    if not unity:
        units.append(("gcc", KDIR / "aicpu_tiling.c", ["-std=c99", "-pedantic"]))
    jobs = []
    for compiler, src, args in units:
        obj = out / (src.name + ".o")
        cmd = [compiler, *args, *flags, "-c", str(src), "-o", str(obj)]
        jobs.append((src, obj, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True)))
    for src, _, proc in jobs:
        _, err = proc.communicate()
        assert proc.returncode == 0, f"compiling {src.name} failed:\n{err}"
    exe = out / "entry_driver"
    r = _run(["g++", *flags, *(str(o) for _, o, _ in jobs), "-o", str(exe)])
    assert r.returncode == 0, f"linking failed:\n{r.stderr}"
    return exe


@pytest.fixture(scope="module")
def driver(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("aicpu_entry"))


def _check(exe: Path, *args, timeout=300):
    r = _run([str(exe), *args], timeout=timeout)
    assert r.returncode == 0, f"{exe.name} {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    assert "FAIL" not in r.stdout
    return r.stdout


def test_case_list_matches(driver):
    r = _run([str(driver), "list"])
    assert r.returncode == 0
    assert r.stdout.split() == CASES


@pytest.mark.parametrize("case", CASES)
def test_entry_case(driver, case):
    out = _check(driver, case)
    assert f"PASS {case}" in out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_inputs_byte_identical(driver, seed):
    """Random valid and invalid inputs: both wrappers, with and without the live batch,
    write the same bytes and return the same class of code as the direct call."""
    out = _check(driver, "random", "3000", str(seed))
    m = re.search(r"random: (\d+) cases, (\d+) ok, (\d+) with an error status", out)
    assert m and int(m.group(2)) > 0 and int(m.group(3)) > 0


def test_unknown_case_is_an_error(driver):
    assert _run([str(driver), "no_such_case"]).returncode == 2


def test_builds_as_cxx17(tmp_path):
    """The device compilers may use a newer standard; the wrappers must not care."""
    exe = _build(tmp_path, std="c++17")
    _check(exe, "all")


def test_unity_build(tmp_path):
    """The Ascend C device build compiles aicpu_tiling.c into the entry's translation
    unit (AICPU_TILING_UNITY_BUILD); check that this compiles warning-free as C++ and
    behaves the same."""
    exe = _build(tmp_path, unity=True)
    _check(exe, "all")


def test_under_sanitizers(tmp_path):
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    probe = tmp_path / "probe.cc"
    probe.write_text("int main() { return 0; }\n")
    if _run(["g++", *san, str(probe), "-o", str(tmp_path / "probe")]).returncode != 0:
        pytest.skip("this compiler cannot link AddressSanitizer/UBSan programs")
    exe = _build(tmp_path / "san", extra=san)
    _check(exe, "all")
    _check(exe, "random", "3000", "11")


def test_op_info_json_matches_kernel():
    info = json.loads((AICPU / "aicpu_tiling_plan.json").read_text())
    assert list(info) == ["AicpuTilingPlan"]
    op = info["AicpuTilingPlan"]
    assert op["opInfo"]["opKernelLib"] == "CUSTAICPUKernel"
    assert op["opInfo"]["functionName"] == "RunCpuKernel"
    assert op["opInfo"]["engine"] == "DNN_VM_AICPU"
    # The op type registered in the kernel source equals the JSON key.
    src = (AICPU / "tiling_cpu_kernel.cc").read_text()
    m = re.search(r'kAicpuTilingPlan\s*=\s*"([^"]+)"', src)
    assert m and m.group(1) == "AicpuTilingPlan"
    assert "REGISTER_CPU_KERNEL(kAicpuTilingPlan, AicpuTilingPlanCpuKernel)" in src
    # The kernelSo is what CMake builds.
    so = op["opInfo"]["kernelSo"]
    assert so == "libaicpu_tiling_kernels.so"
    assert "add_library(aicpu_tiling_kernels SHARED" in (KDIR / "CMakeLists.txt").read_text()
    names = [op[k]["name"] for k in ("input0", "input1", "input2", "output0")]
    assert names == ["cu_seqlens_q", "seqlens_kv", "batch", "tiling"]
    assert all(op[k]["type"] == "DT_INT32" for k in ("input0", "input1", "input2", "output0"))


def test_stub_files_are_labelled_not_cann():
    files = sorted(p for p in STUB.iterdir() if p.suffix in {".h", ".cc"})
    assert files
    for p in files:
        head = p.read_text()[:400]
        assert head.startswith("/*") and "NOT CANN" in head, p.name


def test_build_script_fails_in_a_sentence_without_cann(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")}
    script = ROOT / "tools" / "build_aicpu_kernel.sh"
    r = _run(["bash", str(script), "all", str(tmp_path / "b")], env=env)
    assert r.returncode != 0
    msg = r.stderr.strip()
    assert "ASCEND_HOME_PATH" in msg and "set_env.sh" in msg and msg.endswith(".")
    # A directory without the AI-CPU toolchain is named as such.
    fake = tmp_path / "cann"
    fake.mkdir()
    r = _run(["bash", str(script), "classic", str(tmp_path / "b")],
             env={**env, "ASCEND_HOME_PATH": str(fake)})
    assert r.returncode != 0 and "aarch64-target-linux-gnu-g++" in r.stderr
    assert r.stderr.strip().endswith(".")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_host_stub_build(tmp_path):
    b = tmp_path / "build"
    r = _run(["cmake", "-S", str(KDIR), "-B", str(b), "-DAICPU_TILING_TARGET=host_stub"])
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run(["cmake", "--build", str(b), "-j", "4"])
    assert r.returncode == 0, r.stdout + r.stderr
    _check(b / "aicpu_entry_driver", "all")


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_cann_targets_fail_in_a_sentence_without_cann(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")}
    for target in ("classic", "ascendc"):
        r = _run(["cmake", "-S", str(KDIR), "-B", str(tmp_path / target),
                  f"-DAICPU_TILING_TARGET={target}"], env=env)
        assert r.returncode != 0
        assert "ASCEND_HOME_PATH" in r.stderr
