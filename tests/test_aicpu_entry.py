"""Host tests of the AI-CPU entry points' argument plumbing (no CANN, no NPU).

Both wrappers in aicpu_kernels/aicpu/ -- the classic aicpu::CpuKernel "AicpuTilingPlan"
and the Ascend C entry aicpu_tiling_kernel(void *args) -- are compiled with g++
(-Wall -Wextra -Werror) against aicpu_kernels/cann_stub/, a declaration-compatible
stand-in for the public CANN headers (NOT CANN), and linked with aicpu_tiling.c into
the C++ driver aicpu_kernels/cann_stub/entry_driver.cc. The driver feeds each wrapper
host buffers and checks that it returns the expected code and writes exactly the bytes
a direct aicpu_tiling_plan() call writes (valid, padded, live-batch, invalid inputs,
invalid params, too-small buffers, missing tensors/attributes, bad argument blocks).
The classic operator plans several tilings per launch (a dynamic output list and the
`params` list attribute); `entry_driver classic_io` runs one such launch for the tests
below, which compare each tiling with `pyruntime.tiling.plan_into` and the pure-Python
oracle.
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
    "multi_plan",
    "multi_one_tiling",
    "multi_errors",
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
    m = re.search(r"random: (\d+) cases, (\d+) ok, (\d+) with an error status, "
                  r"(\d+) multi-tiling", out)
    assert m and int(m.group(2)) > 0 and int(m.group(3)) > 0 and int(m.group(4)) > 0


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
    # a classic launch of the most tilings, through the Python-facing mode
    tiling, _ = _tiling_imports()
    plans = _gpt_oss_pair(tiling)
    from pyruntime.aarch64.kernel import max_plans

    plans = (plans * max_plans())[:max_plans()]
    status, outs = _classic_io(exe, _params_list(plans), [0, 1, 3], [500, 9],
                               [p.tiling_bytes for p in plans], live=2, epoch=5)
    assert status == 1  # live batch: the arrays hold 2 requests, under max_batch 8
    assert all(w == SENTINEL for out in outs for w in out)
    status, outs = _classic_io(exe, _params_list(plans), [0, 1, 3], [500, 9],
                               [p.tiling_bytes for p in plans], epoch=5)
    assert status == 0
    for p, got in zip(plans, outs, strict=True):
        assert got == _expected(tiling, p, [0, 1, 3], [500, 9], 2, causal=True, epoch=5)


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
    # The tilings are one dynamic output list (CANN's "dynamic_output<i>" key, as
    # hicann/ops-math conversion/split_v/op_kernel_aicpu/split_v.json declares it).
    keys = ("input0", "input1", "input2", "input3", "dynamic_output0")
    assert [k for k in op if k != "opInfo"] == list(keys)
    names = [op[k]["name"] for k in keys]
    assert names == ["cu_seqlens_q", "seqlens_kv", "batch", "step_epoch", "tiling"]
    assert all(op[k]["type"] == "DT_INT32" for k in keys)


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


# ------------------------------------------------ the classic operator, several tilings


def _tiling_imports():
    """pyruntime's tiling modules (they need the built extension, imported here so the
    build-only tests above run without it)."""
    from pyruntime import tiling, tiling_oracle

    return tiling, tiling_oracle


def _params_list(plans) -> list[int]:
    """The tilings' flat params lists concatenated: ``plan_tilings``' ``params`` (what
    ``pyruntime.kernels.step.split_params`` splits; step imports torch, this does not)."""
    return [int(v) for p in plans for v in p.as_dict().values()]


SENTINEL = -1515870811  # 0xA5A5A5A5 as int32: the driver's fill of every output


def _classic_io(exe: Path, params: list[int], cu, kv, sizes, *, causal=True, live=-1,
                epoch=-1):
    """One classic launch through `entry_driver classic_io`: (status, [int32 words per
    output])."""
    words = [int(causal), live, epoch, len(cu), *cu, len(kv), *kv, len(params), *params,
             len(sizes), *sizes]
    r = _run([str(exe), "classic_io"], input=" ".join(map(str, words)), timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    status = int(lines[0].split()[1])
    outs = []
    for k, line in enumerate(lines[1:]):
        head, index, *values = line.split()
        assert (head, int(index)) == ("tiling", k)
        outs.append([int(v) for v in values])
    assert len(outs) == len(sizes)
    return status, outs


def _gpt_oss_pair(tiling, **over):
    """gpt-oss-20b's attention shapes (64 q / 8 kv heads, head_dim 64) with no window and
    its 128-token window: the two tilings a gpt-oss graph plans per step."""
    base = {"num_q_heads": 64, "num_kv_heads": 8, "head_dim": 64, "block_size": 16,
            "max_batch": 8, "max_tokens": 32, "max_blocks_per_req": 64, "num_cores": 24, **over}
    full = tiling.TilingParams(**base)
    return [full, tiling.TilingParams(**{**base, "sliding_window": 128})]


def _expected(tiling, params, cu, kv, batch, *, causal, epoch):
    """plan_into's buffer for one tiling, as int32 words."""
    import numpy as np

    out = np.zeros(params.tiling_bytes // 4, dtype=np.int32)
    tiling.plan_into(params, np.asarray(cu, dtype=np.int32), np.asarray(kv, dtype=np.int32),
                     batch, out, causal=causal, epoch=epoch)
    return out.tolist()


def _as_bytes(words):
    import numpy as np

    return np.asarray(words, dtype=np.int32).view(np.uint8)


@pytest.mark.parametrize("live", [False, True])
def test_classic_plans_each_window_like_plan_into_and_the_oracle(driver, live):
    """gpt-oss's no-window and 128-window tilings from one classic launch: each buffer is
    byte for byte what plan_into and the pure-Python oracle plan for its own params, and
    the two differ (the windowed layers' kv lengths pass 128)."""
    tiling, tiling_oracle = _tiling_imports()
    plans = _gpt_oss_pair(tiling)
    cu, kv = [0, 1, 2, 9, 10, 30], [700, 129, 300, 1, 1024]
    batch = len(kv)
    if live:  # arrays padded to max_batch, the live batch in its own input
        cu, kv = cu + [cu[-1]] * 3, kv + [0] * 3
    params = _params_list(plans)
    status, outs = _classic_io(driver, params, cu, kv, [p.tiling_bytes for p in plans],
                               live=batch if live else -1, epoch=41)
    assert status == 0
    for p, got in zip(plans, outs, strict=True):
        want = _expected(tiling, p, cu, kv, batch, causal=True, epoch=41)
        assert got == want
        assert got == tiling_oracle.oracle_plan(p, cu, kv, batch, True, epoch=41).tolist()
        assert tiling.Tiling(p, _as_bytes(got), cu, kv, True).status == tiling.OK
    assert outs[0][24:] != outs[1][24:]


@pytest.mark.parametrize("seed", range(4))
def test_classic_random_launches_match_plan_into(driver, seed):
    """Random launches of 1 .. MAX_PLANS tilings (random windows, cores and q tiles over
    random mixed batches, causal or not): each buffer equals plan_into's for its params."""
    import numpy as np

    from pyruntime.aarch64.kernel import max_plans

    tiling, tiling_oracle = _tiling_imports()
    rng = np.random.default_rng(seed)
    for _ in range(6):
        count = int(rng.integers(1, max_plans() + 1))
        causal = bool(rng.random() < 0.8)
        base = {"num_q_heads": 8, "num_kv_heads": 2, "head_dim": 128, "block_size": 16,
                "max_batch": int(rng.integers(1, 12)), "max_tokens": 64,
                "max_blocks_per_req": 32}
        plans = [tiling.TilingParams(**{
            **base, "num_cores": int(rng.integers(1, 25)), "q_tile": int(rng.integers(1, 9)),
            "sliding_window": int(rng.integers(1, 100)) if causal and rng.random() < 0.6
            else None}) for _ in range(count)]
        batch = int(rng.integers(0, base["max_batch"] + 1))
        q = rng.integers(0, 6, size=batch)
        cu = [0, *np.cumsum(q).tolist()]
        kv = [int(x) + int(rng.integers(0, 400)) for x in q]
        params = _params_list(plans)
        epoch = int(rng.integers(0, 1 << 20))  # -1 would leave the input out
        status, outs = _classic_io(driver, params, cu, kv, [p.tiling_bytes for p in plans],
                                   causal=causal, epoch=epoch)
        assert status == 0
        for p, got in zip(plans, outs, strict=True):
            assert got == _expected(tiling, p, cu, kv, batch, causal=causal, epoch=epoch)
            if batch <= 4:
                assert got == tiling_oracle.oracle_plan(p, cu, kv, batch, causal,
                                                        epoch=epoch).tolist()


def test_classic_refuses_bad_launches_writing_nothing(driver):
    """Count mismatch, params not a whole number of groups, more than MAX_PLANS tilings,
    a buffer too small: the op's error status (KERNEL_STATUS_PARAM_INVALID = 1), no
    output written."""
    from pyruntime.aarch64.kernel import max_plans

    tiling, _ = _tiling_imports()
    plans = _gpt_oss_pair(tiling)
    one = _params_list(plans[:1])
    two = _params_list(plans)
    size = plans[0].tiling_bytes
    cu, kv = [0, 1, 2], [300, 40]
    cases = {
        "two params groups, one output": (two, [size]),
        "one params group, two outputs": (one, [size, size]),
        "params one value short": (two[:-1], [size, size]),
        "params one value over": (one + [0], [size]),
        "more than MAX_PLANS": (one * (max_plans() + 1), [size] * (max_plans() + 1)),
        "the second buffer too small": (two, [size, size - 4]),
    }
    for what, (params, sizes) in cases.items():
        status, outs = _classic_io(driver, params, cu, kv, sizes, epoch=3)
        assert status == 1, what
        assert all(w == SENTINEL for out in outs for w in out), what
    # the most one launch plans is fine
    status, outs = _classic_io(driver, one * max_plans(), cu, kv, [size] * max_plans())
    assert status == 0 and all(out == outs[0] for out in outs)


def test_classic_params_fields_are_tiling_params_fields():
    """The kernel reads each `params` group in TilingParams' field order (what
    plan_tilings and step.split_params use)."""
    tiling, _ = _tiling_imports()
    src = (AICPU / "tiling_cpu_kernel.cc").read_text()
    table = re.findall(r'\{"(\w+)", &aicpu_tiling_params::(\w+),', src)
    assert [a for a, b in table if a == b] == [a for a, _ in table]
    assert [a for a, _ in table] == list(tiling.TilingParams.__dataclass_fields__)
