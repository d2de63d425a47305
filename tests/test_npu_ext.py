"""The torch_npu extension (aicpu_kernels/npu_ext/) without an NPU.

- Compiled against REAL headers only (``g++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror``,
  the wheels' headers as system headers so -Werror applies to our code): the launcher against
  the ACL headers shipped in the torch_npu 2.10.0.post4 wheel, and the op against torch
  2.10's headers (from the downloaded, never installed, aarch64 CPU wheel: torch_npu
  2.10.0.post4 pins torch 2.10) plus that torch_npu wheel's own headers (NPUStream.h,
  NPUGuard.h, NPUFunctions.h, OpCommand.h). ``tools/fetch_wheels.sh`` fetches both wheels;
  without them these checks skip, except under ``CI=true``, where they fail.
- The launcher's call sequence (load once: JSON + .so in CPU kernel mode 1, flag-0 stream,
  sync events; per launch: record, wait, aclrtLaunchKernelWithHostArgs, record, wait) and a
  capture/replay with fresh lengths run on the host against a recording runtime
  (cann_stub/npu, NOT CANN) that defines the ACL functions the real acl_rt.h declares; its
  launches run the host build of the entry point.
- The C++ kernel's parameters match the schema that pyruntime/kernels/custom_ops.py defines,
  and the whole extension, linked with host stand-ins for the few torch_npu functions it
  calls and the recording runtime, loads into the installed (CPU) torch and registers its
  PrivateUse1 kernel against that schema.
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

from tests.wheels import TORCH_NPU_WHEEL, TORCH_WHEEL, WHEEL_CACHE, cached_wheel

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "aicpu_kernels"
EXT = KERNELS / "npu_ext"
STUB = KERNELS / "cann_stub"
WARN = ["-Wall", "-Wextra", "-Werror"]
OP_INFO_JSON = "libaicpu_tiling_runtime.json"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("gcc") is None,
                                reason="gcc and g++ are needed to compile the extension's C++")


def torch_includes() -> list[str]:
    """The INSTALLED torch's headers (2.13): only for the link test below."""
    from torch.utils.cpp_extension import include_paths

    return [arg for path in include_paths() for arg in ("-isystem", path)]


def extracted(wheel: Path, prefix: str) -> Path:
    """The members of `wheel` under `prefix` (plus its METADATA), extracted once into the
    wheel cache; a half-finished extraction is never reused (it is renamed into place)."""
    root = WHEEL_CACHE / "extracted" / wheel.stem
    if not (root / prefix).is_dir():
        partial = root.with_name(f"{root.name}.partial.{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(partial, [n for n in z.namelist() if n.startswith(prefix)
                                   or n.endswith(".dist-info/METADATA")])
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
    return root


@pytest.fixture(scope="module")
def torch_npu_include() -> Path:
    """torch_npu/include of the torch_npu wheel: torch_npu/csrc/... and third_party/acl/inc."""
    include = extracted(cached_wheel(TORCH_NPU_WHEEL), "torch_npu/include/") / "torch_npu" / "include"
    assert (include / "third_party" / "acl" / "inc" / "acl" / "acl_rt.h").is_file()
    assert (include / "torch_npu" / "csrc" / "core" / "npu" / "NPUStream.h").is_file()
    return include


@pytest.fixture(scope="module")
def acl_include(torch_npu_include) -> Path:
    return torch_npu_include / "third_party" / "acl" / "inc"


@pytest.fixture(scope="module")
def torch210_include(torch_npu_include) -> Path:
    """torch/include of the torch wheel the torch_npu wheel pins (read, never installed)."""
    meta = next(torch_npu_include.parents[1].glob("*.dist-info/METADATA")).read_text()
    pin = re.search(r"Requires-Dist: torch ?==([\d.]+)", meta)
    assert pin is not None and pin.group(1) == "2.10.0", "fetch_wheels.sh's torch must match"
    include = extracted(cached_wheel(TORCH_WHEEL), "torch/include/") / "torch" / "include"
    assert (include / "torch" / "library.h").is_file()
    return include


def syntax_check(source: Path, system_includes: list[Path]) -> None:
    cmd = ["g++", "-std=c++17", "-fsyntax-only", *WARN,
           *[arg for path in system_includes for arg in ("-isystem", str(path))],
           f"-I{KERNELS / 'aicpu'}", f"-I{EXT}", str(source)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[:4000]}"
    assert r.stderr == "", r.stderr


def test_launcher_compiles_against_the_wheels_acl_headers(acl_include):
    syntax_check(EXT / "runtime_launcher.cpp", [acl_include])


def test_op_compiles_against_torch_210_and_the_torch_npu_wheels_headers(torch_npu_include,
                                                                         acl_include,
                                                                         torch210_include):
    # torch_npu's headers include "third_party/acl/inc/acl/acl.h", the launcher "acl/acl.h":
    # the same files, from the same wheel.
    syntax_check(EXT / "plan_tiling_op.cpp",
                 [torch210_include, torch210_include / "torch" / "csrc" / "api" / "include",
                  torch_npu_include, acl_include])


def test_no_stand_in_for_a_real_header_is_left():
    """The compile checks above see only real headers: no stand-in ACL or rts header exists."""
    npu_stub = STUB / "npu"
    assert not (npu_stub / "acl").exists() and not (npu_stub / "runtime").exists()
    for source in (EXT / "runtime_launcher.h", EXT / "runtime_launcher.cpp"):
        assert not re.search(r"\brts[A-Z]\w*\(|runtime/rt\.h", source.read_text()), source


def test_launcher_sequence_and_capture_replay(tmp_path, acl_include):
    """launcher_driver.cc checks, against the recording runtime: the load is
    aclrtBinaryLoadFromFile(<dir>/libaicpu_tiling_runtime.json, CPU kernel mode 1),
    aclrtBinaryGetFunction("AicpuTilingKernel"), a flag-0 stream and two ACL_EVENT_SYNC
    events; each launch is record(caller), wait(AI-CPU stream), the launch, record(AI-CPU
    stream), wait(caller); Unload releases in reverse and the destructor calls no ACL."""
    obj = tmp_path / "aicpu_tiling.o"
    subprocess.run(["gcc", "-std=c99", *WARN, "-c", str(KERNELS / "aicpu_tiling.c"), "-o",
                    str(obj)], check=True)  # fmt: skip
    exe = tmp_path / "launcher_driver"
    # -rdynamic: the recording runtime is linked into the driver itself, and the launcher
    # looks aclrtLaunchKernelWithHostArgs up by name (dlsym), as in a shared libascendcl
    cmd = ["g++", "-std=c++17", *WARN, "-g", "-rdynamic", "-isystem", str(acl_include), f"-I{STUB}",
           f"-I{STUB / 'npu'}", f"-I{KERNELS / 'aicpu'}", f"-I{EXT}",
           str(EXT / "tests" / "launcher_driver.cc"),
           str(EXT / "runtime_launcher.cpp"), str(STUB / "npu" / "recording_runtime.cc"),
           str(KERNELS / "aicpu" / "tiling_ascendc_aicpu.cpp"), str(STUB / "cann_stub.cc"),
           str(obj), "-o", str(exe)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=False, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "FAIL" not in run.stdout
    for case in ("launch_before_load", "load", "launch", "bad_block", "capture_replay",
                 "launch_failure", "unload", "destructor", "load_failure"):
        assert f"PASS {case}\n" in run.stdout


def test_runtime_op_info_names_the_device_function_and_so():
    from pyruntime.aarch64 import toolchain

    info = json.loads((EXT / OP_INFO_JSON).read_text())
    route = (EXT / "launch_route.h").read_text()
    op_type = re.search(r'#define AICPU_TILING_RUNTIME_OP_TYPE "(\w+)"', route).group(1)
    # CPU kernel mode 1 loads "<JSON stem>.so" and the device stores it under that
    # basename, which the task names by kernelSo: all three must agree.
    assert re.search(r'#define AICPU_TILING_RUNTIME_JSON "([\w.]+)"', route).group(1) == OP_INFO_JSON
    assert list(info) == [op_type]
    op = info[op_type]["opInfo"]
    assert op["functionName"] == "aicpu_tiling_kernel"
    assert "aicpu_tiling_kernel(void *args)" in (KERNELS / "aicpu" /
                                                 "tiling_ascendc_aicpu.cpp").read_text()
    so = next(u.output for u in toolchain.cross_units() if u.output.endswith(".so"))
    assert op["kernelSo"] == so == Path(OP_INFO_JSON).with_suffix(".so").name


@pytest.mark.parametrize("op, kernel", [("plan_tiling", "PlanTilingNpu"),
                                        ("plan_tilings", "PlanTilingsNpu")])
def test_cpp_kernel_matches_the_python_schema(op, kernel):
    """The kernel's parameters are the schema's, in order, with matching C++ types."""
    from pyruntime.kernels import custom_ops

    schema = getattr(custom_ops.ops(), op).default._schema
    source = (EXT / "plan_tiling_op.cpp").read_text()
    params = re.search(rf"void {kernel}\(([^)]*)\)", source).group(1)
    cpp = [re.match(r"\s*(.*?)\s*&?\s*(\w+)\s*$", p.replace("&", " ")).groups()
           for p in params.split(",")]
    # SymInt[] prints as List[int]; the kernel takes concrete ints (IntArrayRef); a Tensor[]
    # (plan_tilings' tiling_outs) is an at::TensorList.
    kinds = {"Tensor": "const at::Tensor", "List[int]": "c10::IntArrayRef", "bool": "bool",
             "List[Tensor]": "at::TensorList"}
    want = [(kinds[str(a.type)], a.name) for a in schema.arguments]
    assert [(t.strip(), n) for t, n in cpp] == want
    assert f'm.impl("{op}", &{kernel})' in source


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
    assert json.loads((lib / OP_INFO_JSON).read_text())


def stand_in_cann(root: Path, acl_include: Path, *defines: str,
                  version: str | None = None) -> Path:
    """A directory shaped like CANN (NOT CANN): ``lib64/libascendcl.so``, the recording
    runtime (cann_stub/npu) built with `defines` (``RECORDING_RUNTIME_OLD_CANN``: no
    aclrtLaunchKernelWithHostArgs), and, with `version`, the
    ``share/info/runtime/version.info`` that CANN's version queries read."""
    lib = root / "lib64"
    lib.mkdir(parents=True)
    subprocess.run(["g++", "-std=c++17", "-fPIC", "-shared", *WARN, *[f"-D{d}" for d in defines],
                    "-isystem", str(acl_include), f"-I{STUB / 'npu'}",
                    str(STUB / "npu" / "recording_runtime.cc"), "-Wl,-soname,libascendcl.so",
                    "-o", str(lib / "libascendcl.so")], check=True)  # fmt: skip
    if version is not None:
        info = root / "share" / "info" / "runtime"
        info.mkdir(parents=True)
        (info / "version.info").write_text(f"Version={version}\nversion_dir=cann\n")
    return root


@pytest.fixture(scope="module")
def host_extension(tmp_path_factory, acl_include) -> tuple[Path, Path]:
    """The whole extension, linked with host stand-ins for torch_npu and against a stand-in
    CANN's ``libascendcl.so`` (the recording runtime: cann_stub/npu, NOT torch_npu, NOT CANN;
    the ACL declarations are the real ones from the torch_npu wheel), for the installed (CPU)
    torch. Returns the library and the stand-in CANN it was linked against; a child process
    picks the CANN it runs with by ``LD_LIBRARY_PATH``."""
    import torch

    tmp_path = tmp_path_factory.mktemp("host_extension")
    cann = stand_in_cann(tmp_path / "cann-9.1.0", acl_include, version="9.1.0")
    torch_dir = Path(torch.__file__).parent
    obj = tmp_path / "aicpu_tiling.o"
    subprocess.run(["gcc", "-std=c99", "-fPIC", *WARN, "-c", str(KERNELS / "aicpu_tiling.c"),
                    "-o", str(obj)], check=True)  # fmt: skip
    lib = tmp_path / "libaicpu_tiling_npu_host.so"
    cmd = ["g++", "-std=c++20", "-O0", "-fPIC", "-shared", *WARN, "-D_GLIBCXX_USE_CXX11_ABI=1",
           *torch_includes(), "-isystem", str(acl_include), f"-I{STUB}", f"-I{STUB / 'npu'}",
           f"-I{KERNELS / 'aicpu'}",
           f"-I{EXT}", str(EXT / "plan_tiling_op.cpp"), str(EXT / "runtime_launcher.cpp"),
           str(STUB / "npu" / "torch_npu_stub.cc"),
           str(KERNELS / "aicpu" / "tiling_ascendc_aicpu.cpp"), str(STUB / "cann_stub.cc"),
           str(obj), f"-L{torch_dir / 'lib'}", "-ltorch", "-ltorch_cpu", "-lc10",
           f"-L{cann / 'lib64'}", "-lascendcl", "-ldl", "-o", str(lib)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    return lib, cann


def run_with_cann(script: str, cann: Path, ascend_home: Path | None) -> subprocess.CompletedProcess:
    """`script` in a child process whose ``libascendcl.so`` is `cann`'s, with
    ``ASCEND_HOME_PATH`` set to `ascend_home` (unset when None)."""
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               LD_LIBRARY_PATH=os.pathsep.join([str(cann / "lib64"),
                                                os.environ.get("LD_LIBRARY_PATH", "")]),
               TORCH_SHOW_CPP_STACKTRACES="0")
    env.pop("ASCEND_HOME_PATH", None)
    if ascend_home is not None:
        env["ASCEND_HOME_PATH"] = str(ascend_home)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, check=False, timeout=300)


def test_the_launch_symbol_is_not_linked(host_extension):
    """aclrtLaunchKernelWithHostArgs is looked up at run time: the extension does not import
    it (review 2 item 6), while it does import the ACL functions it links."""
    lib, _ = host_extension
    r = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True,
                       text=True, check=True)
    undefined = {line.split()[-1] for line in r.stdout.splitlines() if line.strip()}
    assert "aclrtBinaryLoadFromFile" in undefined
    assert "aclrtLaunchKernelWithHostArgs" not in undefined


@pytest.mark.parametrize("cann_kind, version, source", [
    ("aclsysGetCANNVersion", "8.2.RC1", "aclsysGetCANNVersion(ACL_PKG_NAME_RUNTIME)"),
    ("no version query", "8.2.RC1", "{home}/share/info/runtime/version.info"),
    ("nothing says", "", ("no aclsysGetVersionStr or aclsysGetCANNVersion, and no "
                          "$ASCEND_HOME_PATH/share/info/runtime/version.info")),
])
def test_a_cann_without_the_host_args_launch_gets_one_line_naming_its_version(
        tmp_path, acl_include, host_extension, cann_kind, version, source):
    """Review 2 item 6: the extension, built as above, runs with a stand-in CANN 8.2.RC1
    whose libascendcl has no aclrtLaunchKernelWithHostArgs. The library loads (linking the
    symbol made this an "undefined symbol" at load_library), and npu_load_tiling_kernel
    refuses in one line that names the CANN runtime version found, read by the CANN query the
    library has (aclsysGetCANNVersion) or from the version.info file both queries read, or
    says that nothing told it; the same line as the twin's (missing_launch_message). Nothing
    is named: a second call says the same."""
    from pyruntime.npu_twin.extension import missing_launch_message

    lib, _ = host_extension
    defines = ["RECORDING_RUNTIME_OLD_CANN"]
    if cann_kind != "aclsysGetCANNVersion":
        defines.append("RECORDING_RUNTIME_NO_VERSION_QUERY")
    cann = stand_in_cann(tmp_path / "cann-8.2", acl_include, *defines,
                         version="8.2.RC1" if version else None)
    script = f"""
import json, torch
from pyruntime.kernels import custom_ops
ops = custom_ops.ops()
torch.ops.load_library({str(lib)!r})
named = {str(tmp_path / OP_INFO_JSON)!r}
open(named, "w").write("{{}}")
said = []
for _ in range(2):
    try:
        ops.npu_load_tiling_kernel(named)
        said.append("loaded")
    except RuntimeError as exc:
        said.append(str(exc))
print(json.dumps(said))
"""
    run = run_with_cann(script, cann, cann if version else None)
    assert run.returncode == 0, run.stdout + run.stderr[-4000:]
    said = json.loads(run.stdout.strip().splitlines()[-1])
    want = "npu_load_tiling_kernel: " + missing_launch_message(
        version, source.format(home=cann))
    assert said == [want, want]
    assert "\n" not in want and (not version or "CANN runtime in this process (8.2.RC1" in want)


def test_op_library_links_and_registers_in_cpu_torch(tmp_path, host_extension):
    """The whole extension (`host_extension`) loads into the installed torch after the Python
    schema, with the stand-in CANN 9.1.0 (which has the host-args launch): the PrivateUse1
    kernel registers against the SymInt[] schema, the load op works once and refuses a second
    path, and the NPU kernel refuses tensors not on the NPU."""
    lib, cann = host_extension
    # Loaded in a child process: torch cannot unload a library, and this one must not
    # leave its ops behind in the test session.
    script = f"""
import pytest, torch
from pyruntime.kernels import custom_ops
ops = custom_ops.ops()  # the Python schema first, as in the package
torch.ops.load_library({str(lib)!r})
assert torch._C._dispatch_has_kernel_for_dispatch_key("aicpu_tiling::plan_tiling", "PrivateUse1")
with pytest.raises(RuntimeError, match="cannot read /opt/k/{OP_INFO_JSON}"):
    ops.npu_load_tiling_kernel("/opt/k/{OP_INFO_JSON}")
named = {str(tmp_path / OP_INFO_JSON)!r}
open(named, "w").write("{{}}")
ops.npu_load_tiling_kernel(named)  # names it: nothing is loaded on a device yet
ops.npu_load_tiling_kernel(named)  # idempotent
ops.npu_load_tiling_kernel(named, 0)  # loads device 0's launcher now (recording runtime)
with pytest.raises(RuntimeError, match="already loaded"):
    ops.npu_load_tiling_kernel("/elsewhere.json")
i32 = {{"dtype": torch.int32}}
args = (torch.zeros(5, **i32), torch.zeros(4, **i32), torch.zeros(1, **i32),
        torch.zeros(1, **i32), torch.zeros(16384, dtype=torch.uint8),  # bytes, as callers pass
        [32, 8, 128, 128, 4, 16, 64, 6, 16, 4, 1, 32, 0], True)  # 13 fields (ABI v5)
npu_only = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
with pytest.raises(RuntimeError, match="cu_seqlens_q must be on the NPU"):
    ops.plan_tiling.default.redispatch(npu_only, *args)
print("OK")
"""
    run = run_with_cann(script, cann, cann)
    assert run.returncode == 0 and run.stdout.strip() == "OK", run.stdout + run.stderr[-4000:]
