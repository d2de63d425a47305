"""Triton-Ascend on the NPU twin (issue 28, item 6): the registered ``ascend`` backend and its
active driver, the device properties vLLM-Ascend reads, the ``triton.language.extra.cann``
extension ops against NumPy, and vLLM-Ascend's own Triton kernels of the dense decode path
launched on twin npu tensors in the vLLM environments (`pyruntime.npu_twin.triton_driver`,
`pyruntime.npu_twin.triton_extension`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from pyruntime.npu_twin import pth
from tests.twin.test_processes_in_vllm import _venv_with_the_pth
from tests.wheels import vllm_env

pytest.importorskip("triton", reason="Triton-Ascend's seam on the twin needs triton")

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROBE = HERE / "vllm_ascend_triton_probe.py"
RELEASES = ("0.23.0.post1", "0.30.0rc2")

DRIVER = r'''
import triton, torch_npu
from triton.backends import backends
from pyruntime.npu_twin.npu_module import NotInTwinError

driver = triton.runtime.driver.active
check("only_the_ascend_backend_is_active", lambda: eq(
    sorted(name for name, b in backends.items() if b.driver.is_active()), ["ascend"]))
check("the_active_driver_is_the_twins", lambda: eq(type(driver).__name__, "TwinNPUDriver"))
check("device_properties_as_triton_ascend_reports_them", lambda: eq(
    [driver.utils.get_device_properties(0), driver.utils.get_device_properties(torch.device("npu", 0)),
     driver.utils.get_device_properties("npu")],
    [{"max_shared_mem": 1, "num_aicore": 20, "num_vectorcore": 40}] * 3))
check("target_is_npu_and_the_soc", lambda: eq(
    (driver.get_current_target().backend, driver.get_current_target().arch), ("npu", "Ascend910B3")))
side = torch.npu.Stream()
def stream_follows_torch_npu():
    base = driver.get_current_stream()
    with torch.npu.stream(side):
        inside = driver.get_current_stream()
        raw = torch_npu._C._npu_getCurrentRawStream(0)
    eq((inside != base, inside, driver.get_current_stream()), (True, raw, base))
check("current_stream_follows_torch_npu_stream", stream_follows_torch_npu)
def device_follows_set_device():
    driver.set_current_device(1)
    try:
        eq((torch.npu.current_device(), driver.get_current_device(),
            driver.get_active_torch_device()), (1, 1, torch.device("npu", 1)))
    finally:
        torch.npu.set_device(0)
check("set_current_device_is_torch_npu_set_device", device_follows_set_device)
check("benchmarker_is_not_in_twin", lambda: expect(
    NotInTwinError, "get_benchmarker", driver.get_benchmarker))

import triton.language as tl
import sys
sys.path.insert(0, {here!r})
from triton_ascend_kernels import copy_n, scalars_only

check("a_launch_without_tensors_is_not_compiled", lambda: expect(
    NotInTwinError, "compiles no kernel", lambda: scalars_only[(1,)](3)))

from pyruntime.npu_twin import device as twin
check("a_launch_with_only_cpu_tensors_is_a_host_pointer", lambda: expect(
    twin.HostPointerError, "argument on cpu",
    lambda: copy_n[(1,)](torch.ones(6), torch.zeros(6), N=6)))
def non_power_of_two_runs_and_the_stock_rule_returns():
    y = torch.zeros(6, device="npu")
    copy_n[(1,)](torch.arange(6.0).npu(), y, N=6)
    eq(y.cpu().tolist(), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    import triton.language.core as core
    expect(ValueError, "power of 2", lambda: core.block_type(tl.int32, [6]))
check("arange_of_six_runs_as_on_triton_ascend_and_the_patch_is_scoped",
      non_power_of_two_runs_and_the_stock_rule_returns)

from triton_ascend_kernels import bf16_math
def bf16_is_arithmetic_on_values():
    gen = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(40, generator=gen).to(torch.bfloat16) for _ in range(3))
    x = torch.randn(40, generator=gen) * 3
    outs = [torch.empty(40, dtype=torch.bfloat16, device="npu") for _ in range(2)]
    lt = torch.empty(40, dtype=torch.int8, device="npu")
    cast = torch.empty(40, dtype=torch.bfloat16, device="npu")
    red = torch.empty(3, dtype=torch.bfloat16, device="npu")
    bf16_math[(1,)](a.npu(), b.npu(), c.npu(), x.npu(), outs[0], outs[1], lt, cast, red, N=40)
    # torch's bf16 ops on the CPU round each result to nearest even
    eq(outs[0].cpu().view(torch.int16).tolist(), (a * b - c).view(torch.int16).tolist())
    eq(outs[1].cpu().tolist(), (-a).tolist())
    eq(lt.cpu().tolist(), (a < b).to(torch.int8).tolist())
    eq(cast.cpu().view(torch.int16).tolist(), x.to(torch.bfloat16).view(torch.int16).tolist())
    # a bf16 sum accumulates in fp32 and rounds once; min and max compare values
    eq(red.cpu().tolist(), [a.float().sum().to(torch.bfloat16).item(), a.min().item(),
                            a.max().item()])
check("bf16_arithmetic_rounds_like_torch", bf16_is_arithmetic_on_values)

from triton_ascend_kernels import bf16_dot
def bf16_dot_multiplies_values():
    gen = torch.Generator().manual_seed(5)
    x, a = (torch.randn(16, 16, generator=gen).to(torch.bfloat16) for _ in range(2))
    out = torch.empty(16, 16, device="npu")
    bf16_dot[(1,)](x.npu(), a.npu(), out, M=16, K=16, N=16)
    # exact bf16 products summed in float32: only the summation order differs
    torch.testing.assert_close(out.cpu(), x.float() @ a.float().T, atol=1e-5, rtol=1e-5)
check("bf16_dot_multiplies_values_into_fp32", bf16_dot_multiplies_values)

import triton.language.extra.cann.extension as extension
import triton.language.extra.cann.libdevice as libdevice
check("sort_is_not_in_twin", lambda: expect(NotInTwinError, "sort", extension.sort))
check("libdevice_isnan_is_not_in_twin", lambda: expect(NotInTwinError, "isnan", libdevice.isnan))
check("a_name_triton_ascend_lacks_is_missing", lambda: eq(
    getattr(extension, "no_such_op", None), None))
check("tl_extra_cann_is_the_module", lambda: eq(tl.extra.cann.extension is extension, True))
'''

OPS = r'''
import json
import sys
sys.path.insert(0, {here!r})
from triton_ascend_kernels import bool_element, misuse, slices

out = {}
for name, dtype in (("float32", torch.float32), ("int32", torch.int32), ("float16", torch.float16)):
    x = (torch.arange(24) * 3 - 7).to(dtype).reshape(4, 6)
    ext = torch.zeros(2, 3, dtype=dtype, device="npu")
    ins = torch.zeros(4, 6, dtype=dtype, device="npu")
    elem = torch.zeros(1, dtype=dtype, device="npu")
    slices[(1,)](x.npu(), torch.tensor([1], dtype=torch.int32).npu(), ext, ins, elem, R=4, C=6)
    out[name] = {"x": x.tolist(), "ext": ext.cpu().tolist(), "ins": ins.cpu().tolist(),
                 "elem": elem.cpu().tolist()}
print("OPS " + json.dumps(out))

from pyruntime.npu_twin.triton_extension import ExtensionOpError
def refused(case, fragment):
    def run():
        x = torch.arange(16.0).npu()
        y = torch.tensor([3.0]).npu()
        misuse[(1,)](x, y, CASE=case)
        y.cpu()  # the failing task raises when the host waits for it
    def cause():
        try:
            run()
        except Exception as exc:
            raise exc.__cause__ if exc.__cause__ is not None else exc
    expect(ExtensionOpError, fragment, cause)
for case, rule, fragment in (
        (0, "extract_slice_past_the_end", "leaves ful of shape (4, 4) in dimension 0"),
        (1, "insert_slice_sub_not_of_shape_sizes", "sub has shape (2, 2), sizes are (2, 3)"),
        (2, "insert_slice_of_another_dtype", "sub is int32, ful is fp32"),
        (3, "extract_slice_offsets_not_one_per_dim", "must have one entry per dimension"),
        (4, "extract_slice_negative_stride", "every entry of strides must be >= 0"),
        (5, "get_element_rank_mismatch", "Indice's rank must be equal to src tensor's rank"),
        (6, "get_element_outside", "index (4, 0) is outside src of shape (4, 4)"),
        (7, "extract_slice_sizes_not_constexpr", "sizes must be compile-time ints"),
        (8, "extract_slice_of_bool", "bool tensor"),
        (9, "insert_slice_past_the_end_dynamic", "leaves ful of shape (4, 4) in dimension 1")):
    check(rule, lambda case=case, fragment=fragment: refused(case, fragment))

# a bool element, as vLLM-Ascend's greedy rejection sampler reads its is_greedy_mask (the
# module docstring of pyruntime.npu_twin.triton_extension says why it is not refused)
def bool_element_reads_the_mask():
    x = torch.tensor([3.0, -1.0, 0.0, 2.0, -5.0, 7.0, 1.0, -2.0])
    flags = torch.zeros(8, dtype=torch.int32, device="npu")
    bool_element[(1,)](x.npu(), flags, N=8)
    eq(flags.cpu().tolist(), (x > 0).int().tolist())
check("get_element_of_a_bool_mask", bool_element_reads_the_mask)
'''


def test_the_twin_registers_triton_ascends_backend_and_driver(run_twin):
    proc = run_twin(DRIVER.replace("{here!r}", repr(str(HERE))), timeout=300)
    results = run_twin.rules(proc)
    failed = {rule: outcome for rule, outcome in results.items() if outcome != "ok"}
    assert len(results) == 16 and not failed, failed or results


def test_extension_ops_against_numpy_and_their_rules(run_twin):
    proc = run_twin(OPS.replace("{here!r}", repr(str(HERE))), timeout=300)
    results = run_twin.rules(proc)
    failed = {rule: outcome for rule, outcome in results.items() if outcome != "ok"}
    assert len(results) == 11 and not failed, failed or results
    got = json.loads(proc.stdout.split("OPS ")[1].splitlines()[0])
    for name, run in got.items():
        x = np.array(run["x"])
        offset = 1
        ext = x[offset:offset + 2, 1:1 + 3 * 2:2]
        ins = x.copy()
        ins[0:4:2, 0:3] = ext * 10
        np.testing.assert_array_equal(np.array(run["ext"]), ext, err_msg=name)
        np.testing.assert_array_equal(np.array(run["ins"]), ins, err_msg=name)
        assert run["elem"] == [x[offset, 5]], name


# ---- vLLM-Ascend's kernels in the vLLM environments ------------------------------------------
_probed: dict[str, dict] = {}


def _probe(release: str) -> dict:
    """Run the probe once per release in the release's venv with the twin on."""
    if release in _probed:
        return _probed[release]
    env_dir = vllm_env(release)
    python = _venv_with_the_pth(release)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AICPU_TILING", "VLLM_", "TRITON_")) and k != "PYTHONHOME"}
    env.update({"PYTHONPATH": os.pathsep.join([str(REPO), str(env_dir / "vllm-ascend")]),
                pth.ENV_VAR: "1"})
    proc = subprocess.run([str(python), str(PROBE), release], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _probed[release] = json.loads(proc.stdout.split("PROBE ")[-1])
    return _probed[release]


def _bf16(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _neox_rope(x: torch.Tensor, cos_sin_cache: torch.Tensor, positions: list[int]):
    """fp32 NeoX RoPE: x (tokens, heads, dim), the cache rows [cos | sin] per position."""
    half = x.shape[-1] // 2
    cos = cos_sin_cache[positions, :half][:, None, :]
    sin = cos_sin_cache[positions, half:][:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@pytest.mark.parametrize("release", RELEASES)
def test_vllm_decides_has_triton_itself_with_the_twin(release):
    facts = _probe(release)["triton"]
    assert facts["torch_npu_module"] == "pyruntime.npu_twin.npu_module", facts
    assert facts["HAS_TRITON"] is True, facts
    assert facts["active_backends"] == ["ascend"] and facts["driver"] == "TwinNPUDriver", facts
    assert facts["target"] == ["npu", "Ascend910B3"], facts
    assert facts["properties"] == {"max_shared_mem": 1, "num_aicore": 20, "num_vectorcore": 40}
    assert (facts["aicore_num"], facts["vectorcore_num"]) == (20, 40), facts
    assert set(facts["extension_ops"].values()) == {"pyruntime.npu_twin.triton_extension"}


def test_compute_slot_mapping_kernel_of_0_30_on_npu_tensors():
    run = _probe("0.30.0rc2")["slot_mapping"]
    table, block_size = run["block_table"], run["block_size"]
    starts = run["query_start_loc"]
    want = []
    for req in range(len(starts) - 1):
        for pos in run["positions"][starts[req]:starts[req + 1]]:
            want.append(table[req][pos // block_size] * block_size + pos % block_size)
    slots = run["slot_mapping"]
    assert slots[:len(want)] == want
    assert slots[len(want):] == [run["pad"]] * (len(slots) - len(want))


@pytest.mark.parametrize("release", RELEASES)
def test_rope_forward_triton_on_npu_tensors(release):
    run = _probe(release)["rope"]
    cache = _bf16(run["cos_sin_cache"])
    for name in ("q", "k"):
        want = _neox_rope(_bf16(run[name]), cache, run["positions"])
        torch.testing.assert_close(_bf16(run[f"{name}_out"]), want, atol=0.04, rtol=0.02)


@pytest.mark.parametrize("release", RELEASES)
def test_split_qkv_rmsnorm_rope_kernel_on_npu_tensors(release):
    """The kernel that calls ``insert_slice``, ``extract_slice`` and ``get_element``."""
    run = _probe(release)["qkv_rmsnorm_rope"]
    q_heads, kv_heads, dim = run["heads"]
    qkv = _bf16(run["qkv"])
    tokens = qkv.shape[0]
    q, k, v = qkv.split([q_heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    cache = _bf16(run["cos_sin_cache"])

    def norm_rope(x, heads, weight):
        x = x.reshape(tokens, heads, dim)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + run["eps"]) * _bf16(weight)
        return _neox_rope(x, cache, run["positions"]).reshape(tokens, heads * dim)

    torch.testing.assert_close(_bf16(run["q"]), norm_rope(q, q_heads, run["q_weight"]),
                               atol=0.06, rtol=0.03)
    torch.testing.assert_close(_bf16(run["k"]), norm_rope(k, kv_heads, run["k_weight"]),
                               atol=0.06, rtol=0.03)
    torch.testing.assert_close(_bf16(run["v"]), v, atol=0, rtol=0)
