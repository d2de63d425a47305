"""The torch_npu extension (aicpu_kernels/npu_ext/) without an NPU.

- The op's C++ compiles (``-fsyntax-only``, -Wall -Wextra -Werror, torch's headers as system
  headers) against the installed torch and the CANN / torch_npu declarations of
  ``aicpu_kernels/cann_stub/npu/`` (NOT CANN, NOT torch_npu).
- The launcher compiles against the real ACL headers shipped in the torch_npu wheel (from
  ``tools/fetch_wheels.sh``). The whole op against the wheel's torch_npu headers is tried
  only when the wheel was built for the installed torch's version: torch_npu 2.10's headers
  use named-tensor types (at::Dimname) that torch 2.13 no longer has.
- The launcher's call sequence (load once: JSON + .so, flag-0 stream, sync events; per
  launch: record, wait, rtsLaunchCpuKernel, record, wait) and a capture/replay with fresh
  lengths run on the host against a recording stand-in runtime (cann_stub/npu, NOT CANN)
  whose launches run the host build of the entry point.
- The C++ kernel's parameters match the schema that pyruntime/kernels/custom_ops.py defines,
  and the whole extension, linked with host stand-ins for torch_npu and the runtime, loads
  into the installed (CPU) torch and registers its PrivateUse1 kernel against that schema.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "aicpu_kernels"
EXT = KERNELS / "npu_ext"
STUB = KERNELS / "cann_stub"
WARN = ["-Wall", "-Wextra", "-Werror"]
WHEEL_CACHE = Path(os.environ.get("AICPU_TILING_WHEEL_CACHE",
                                  Path.home() / ".cache" / "aicpu-tiling" / "wheels"))

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None,
                                reason="gcc and g++ are needed to compile the extension's C++")


def torch_includes() -> list[str]:
    from torch.utils.cpp_extension import include_paths

    return [arg for path in include_paths() for arg in ("-isystem", path)]


def syntax_check(source: Path, includes: list[str], std: str = "c++20") -> None:
    cmd = ["g++", f"-std={std}", "-fsyntax-only", *WARN, "-D_GLIBCXX_USE_CXX11_ABI=1",
           *includes, f"-I{KERNELS / 'aicpu'}", f"-I{EXT}", str(source)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[:4000]}"
    assert r.stderr == "", r.stderr


def test_op_compiles_against_torch_and_the_stub():
    syntax_check(EXT / "plan_tiling_op.cpp", [*torch_includes(), f"-I{STUB / 'npu'}"])


def test_launcher_compiles_against_the_stub_cxx14():
    syntax_check(EXT / "runtime_launcher.cpp", [f"-I{STUB / 'npu'}"], std="c++14")


@pytest.fixture(scope="module")
def wheel_include(tmp_path_factory) -> Path:
    wheels = sorted(WHEEL_CACHE.glob("torch_npu-*.whl"))
    if not wheels:
        pytest.skip(f"no torch_npu wheel in {WHEEL_CACHE} (run tools/fetch_wheels.sh)")
    out = tmp_path_factory.mktemp("torch_npu_wheel")
    with zipfile.ZipFile(wheels[-1]) as z:
        names = [n for n in z.namelist() if n.startswith("torch_npu/include/")
                 or n.endswith(".dist-info/METADATA")]
        z.extractall(out, names)
    return out


def rts_only(tmp: Path, *extra: str) -> Path:
    """An include root with only the stand-ins the wheel lacks (runtime/rt.h, ...)."""
    root = tmp / "stub_subset"
    for rel in ("runtime/rt.h", *extra):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(STUB / "npu" / rel, root / rel)
    return root


def test_launcher_compiles_against_the_wheels_acl_headers(wheel_include, tmp_path):
    acl = wheel_include / "torch_npu" / "include" / "third_party" / "acl" / "inc"
    assert (acl / "acl" / "acl_rt.h").is_file()
    syntax_check(EXT / "runtime_launcher.cpp",
                 ["-isystem", str(acl), f"-I{rts_only(tmp_path)}"], std="c++14")


def test_op_against_the_wheels_torch_npu_headers(wheel_include, tmp_path):
    import torch

    meta = next(wheel_include.glob("*.dist-info/METADATA")).read_text()
    pin = re.search(r"Requires-Dist: torch ?==([\d.]+)", meta)
    installed = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if pin is None or not pin.group(1).startswith(installed + "."):
        pytest.skip(f"the torch_npu wheel's headers need torch {pin.group(1) if pin else '?'}, "
                    f"torch {torch.__version__} is installed (they use at::Dimname, gone in 2.13)")
    include = wheel_include / "torch_npu" / "include"
    syntax_check(EXT / "plan_tiling_op.cpp",
                 [*torch_includes(), "-isystem", str(include), "-isystem",
                  str(include / "third_party" / "acl" / "inc"), f"-I{rts_only(tmp_path)}"])


def test_launcher_sequence_and_capture_replay(tmp_path):
    obj = tmp_path / "aicpu_tiling.o"
    subprocess.run(["gcc", "-std=c99", *WARN, "-c", str(KERNELS / "aicpu_tiling.c"), "-o",
                    str(obj)], check=True)  # fmt: skip
    exe = tmp_path / "launcher_driver"
    cmd = ["g++", "-std=c++14", *WARN, "-g", f"-I{STUB}", f"-I{STUB / 'npu'}",
           f"-I{KERNELS / 'aicpu'}", f"-I{EXT}", str(EXT / "tests" / "launcher_driver.cc"),
           str(EXT / "runtime_launcher.cpp"), str(STUB / "npu" / "recording_runtime.cc"),
           str(KERNELS / "aicpu" / "tiling_ascendc_aicpu.cpp"), str(STUB / "cann_stub.cc"),
           str(obj), "-o", str(exe)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=False, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "FAIL" not in run.stdout
    for case in ("launch_before_load", "load", "launch", "bad_block", "capture_replay",
                 "launch_failure", "load_failure"):
        assert f"PASS {case}\n" in run.stdout


def test_runtime_op_info_names_the_device_function_and_so():
    from pyruntime.aarch64 import toolchain

    info = json.loads((EXT / "aicpu_tiling_runtime.json").read_text())
    route = (EXT / "launch_route.h").read_text()
    op_type = re.search(r'#define AICPU_TILING_RUNTIME_OP_TYPE "(\w+)"', route).group(1)
    assert list(info) == [op_type]
    op = info[op_type]["opInfo"]
    assert op["functionName"] == "aicpu_tiling_kernel"
    assert "aicpu_tiling_kernel(void *args)" in (KERNELS / "aicpu" /
                                                 "tiling_ascendc_aicpu.cpp").read_text()
    so = next(u.output for u in toolchain.cross_units() if u.output.endswith(".so"))
    assert op["kernelSo"] == so


def test_cpp_kernel_matches_the_python_schema():
    """PlanTilingNpu's parameters are the schema's, in order, with matching C++ types."""
    from pyruntime.kernels import custom_ops

    schema = custom_ops.ops().plan_tiling.default._schema
    source = (EXT / "plan_tiling_op.cpp").read_text()
    params = re.search(r"void PlanTilingNpu\(([^)]*)\)", source).group(1)
    cpp = [re.match(r"\s*(.*?)\s*&?\s*(\w+)\s*$", p.replace("&", " ")).groups()
           for p in params.split(",")]
    # SymInt[] prints as List[int]; the kernel takes concrete ints (IntArrayRef).
    kinds = {"Tensor": "const at::Tensor", "List[int]": "c10::IntArrayRef", "bool": "bool"}
    want = [(kinds[str(a.type)], a.name) for a in schema.arguments]
    assert [(t.strip(), n) for t, n in cpp] == want
    assert 'm.impl("plan_tiling", &PlanTilingNpu)' in source


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("AICPU_TILING_CMAKE_CROSS") != "1",
                    reason="minutes long (CMake probes ziglang as a compiler): set "
                           "AICPU_TILING_CMAKE_CROSS=1 to run it")
def test_cmake_runtime_target_with_a_ziglang_cann(tmp_path):
    """The CANN build recipe's `runtime` target, with a directory shaped like CANN whose
    AI-CPU cross compiler is ziglang: configures, builds and installs the .so and its JSON."""
    import sys

    if shutil.which("cmake") is None:
        pytest.skip("needs cmake")
    pytest.importorskip("ziglang")
    bin_dir = tmp_path / "cann" / "toolkit" / "toolchain" / "hcc" / "bin"
    bin_dir.mkdir(parents=True)
    for tool, mode in (("gcc", "cc"), ("g++", "c++")):
        wrapper = bin_dir / f"aarch64-target-linux-gnu-{tool}"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m ziglang {mode} '
                           f'-target aarch64-linux-gnu "$@"\n')
        wrapper.chmod(0o755)
    env = dict(os.environ, ASCEND_HOME_PATH=str(tmp_path / "cann"))
    build = tmp_path / "build"
    for cmd in (["cmake", "-S", str(KERNELS), "-B", str(build), "-DAICPU_TILING_TARGET=runtime",
                 "-DCMAKE_TRY_COMPILE_TARGET_TYPE=STATIC_LIBRARY",
                 f"-DCMAKE_INSTALL_PREFIX={build / 'install'}"],
                ["cmake", "--build", str(build)], ["cmake", "--install", str(build)]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lib = build / "install" / "lib"
    assert (lib / "libaicpu_tiling_runtime.so").stat().st_size > 0
    assert json.loads((lib / "aicpu_tiling_runtime.json").read_text())


def test_op_library_links_and_registers_in_cpu_torch(tmp_path):
    """The whole extension, linked with host stand-ins for torch_npu and the runtime
    (cann_stub/npu, NOT torch_npu, NOT CANN), loads into the installed torch after the Python
    schema: the PrivateUse1 kernel registers against the SymInt[] schema, the load op works
    once and refuses a second path, and the NPU kernel refuses tensors not on the NPU."""
    import sys

    import torch

    torch_dir = Path(torch.__file__).parent
    obj = tmp_path / "aicpu_tiling.o"
    subprocess.run(["gcc", "-std=c99", "-fPIC", *WARN, "-c", str(KERNELS / "aicpu_tiling.c"),
                    "-o", str(obj)], check=True)  # fmt: skip
    lib = tmp_path / "libaicpu_tiling_npu_host.so"
    cmd = ["g++", "-std=c++20", "-O0", "-fPIC", "-shared", *WARN, "-D_GLIBCXX_USE_CXX11_ABI=1",
           *torch_includes(), f"-I{STUB}", f"-I{STUB / 'npu'}", f"-I{KERNELS / 'aicpu'}",
           f"-I{EXT}", str(EXT / "plan_tiling_op.cpp"), str(EXT / "runtime_launcher.cpp"),
           str(STUB / "npu" / "recording_runtime.cc"), str(STUB / "npu" / "torch_npu_stub.cc"),
           str(KERNELS / "aicpu" / "tiling_ascendc_aicpu.cpp"), str(STUB / "cann_stub.cc"),
           str(obj), f"-L{torch_dir / 'lib'}", "-ltorch", "-ltorch_cpu", "-lc10",
           "-o", str(lib)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    # Loaded in a child process: torch cannot unload a library, and this one must not
    # leave its ops behind in the test session.
    script = f"""
import pytest, torch
from pyruntime.kernels import custom_ops
ops = custom_ops.ops()  # the Python schema first, as in the package
torch.ops.load_library({str(lib)!r})
assert torch._C._dispatch_has_kernel_for_dispatch_key("aicpu_tiling::plan_tiling", "PrivateUse1")
ops.npu_load_tiling_kernel("/opt/k/aicpu_tiling_runtime.json")
ops.npu_load_tiling_kernel("/opt/k/aicpu_tiling_runtime.json")  # idempotent
with pytest.raises(RuntimeError, match="already loaded"):
    ops.npu_load_tiling_kernel("/elsewhere.json")
i32 = {{"dtype": torch.int32}}
args = (torch.zeros(5, **i32), torch.zeros(4, **i32), torch.zeros(1, **i32),
        torch.zeros(1, **i32), torch.zeros(4096, **i32),
        [32, 8, 128, 128, 4, 16, 64, 6, 16, 4, 1, 32], True)
npu_only = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
with pytest.raises(RuntimeError, match="cu_seqlens_q must be on the NPU"):
    ops.plan_tiling.default.redispatch(npu_only, *args)
print("OK")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, check=False, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "OK", run.stdout + run.stderr[-4000:]
