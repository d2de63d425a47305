"""The twin's quantisation ops (`pyruntime.npu_twin.quant_ops`), which vLLM-Ascend's fusion
patterns trace under vLLM's default compilation: their schemas against the torch_npu wheel,
numerics against float64 formulas written here, the documented refusals, the fake kernels
under FakeTensor (one twin subprocess, plain npu tensors)."""

from __future__ import annotations

import re
import zipfile

import pytest

from pyruntime.npu_twin import quant_ops
from tests.wheels import TORCH_NPU_WHEEL, cached_wheel


@pytest.fixture(scope="module")
def wheel_files() -> dict[str, bytes]:
    names = ("torch_npu/_op_plugin_docs.py", "torch_npu/lib/libtorch_npu.so")
    with zipfile.ZipFile(cached_wheel(TORCH_NPU_WHEEL)) as wheel:
        return {name.rsplit("/", 1)[1]: wheel.read(name) for name in names}


@pytest.mark.parametrize("name", sorted(quant_ops.SCHEMAS))
def test_schemas_are_the_ones_libtorch_npu_registers(name, wheel_files):
    assert quant_ops.SCHEMAS[name].encode() + b"\0" in wheel_files["libtorch_npu.so"]
    docs = wheel_files["_op_plugin_docs.py"].decode()
    assert re.search(rf"^torch_npu\.{name}\(", docs, re.MULTILINE), name


SCRIPT = """
import numpy as np
import torch_npu
from torch._subclasses.fake_tensor import FakeTensorMode
from pyruntime.npu_twin.model_ops import ModelOpError
from pyruntime.npu_twin.npu_module import NotInTwinError
from pyruntime.npu_twin.device import HostPointerError
from pyruntime.npu_twin.quant_ops import QINT8

gen = torch.Generator().manual_seed(0)


def int8_round(values):
    # round half to even, saturate (numpy's rint is half-to-even)
    return np.clip(np.rint(values), -128, 127).astype(np.int8)


def dynamic_quant_numerics():
    for dtype in (torch.bfloat16, torch.float16):
        x = (torch.randn(3, 5, 16, generator=gen) * 3).to(dtype)
        y, scale = torch_npu.npu_dynamic_quant(x.to("npu"))
        eq((y.dtype, list(y.shape), scale.dtype, list(scale.shape)),
           (torch.int8, [3, 5, 16], torch.float32, [3, 5]))
        ref = x.double().numpy()
        want_scale = np.abs(ref).max(axis=-1) / 127.0
        eq(np.allclose(scale.cpu().numpy(), want_scale, rtol=1e-6), True)
        want = int8_round(ref / want_scale[..., None])
        got = y.cpu().numpy().astype(np.int32)
        # float32 vs float64 division may move a value sitting on .5 by one step
        eq(int(np.abs(got - want.astype(np.int32)).max()) <= 1, True)
        eq(float((got == want).mean()) > 0.99, True)
        eq(int(np.abs(got).max()), 127)       # each row's largest magnitude maps to 127


def dynamic_quant_smooth_scales():
    x = torch.randn(4, 8, generator=gen).to(torch.bfloat16)
    smooth = (torch.rand(8, generator=gen) + 0.5).to(torch.bfloat16)
    y, scale = torch_npu.npu_dynamic_quant(x.to("npu"), smooth_scales=smooth.to("npu"))
    prod = x.double().numpy() * smooth.double().numpy()
    eq(np.allclose(scale.cpu().numpy(), np.abs(prod).max(-1) / 127.0, rtol=1e-6), True)


def dynamic_quant_refusals():
    npu = lambda *shape, dtype=torch.bfloat16: torch.randn(*shape, generator=gen).to(dtype).to("npu")
    expect(ModelOpError, "x must have more than 1 dim",
           lambda: torch_npu.npu_dynamic_quant(npu(8)))
    expect(ModelOpError, "x must be one of float16, bfloat16",
           lambda: torch_npu.npu_dynamic_quant(npu(2, 8, dtype=torch.float32)))
    expect(ModelOpError, "smooth_scales must be 1-D of x's last dim 8",
           lambda: torch_npu.npu_dynamic_quant(npu(2, 8), smooth_scales=npu(4)))
    expect(NotInTwinError, "only per-token int8",
           lambda: torch_npu.npu_dynamic_quant(npu(2, 8), dst_type=29))
    expect(HostPointerError, "smooth_scales is a cpu tensor",
           lambda: torch_npu.npu_dynamic_quant(npu(2, 8), smooth_scales=torch.ones(
               8, dtype=torch.bfloat16)))


def quantize_numerics():
    x = (torch.randn(6, 8, generator=gen) * 4).to(torch.bfloat16)
    scales = (torch.rand(8, generator=gen) + 0.5).to(torch.bfloat16)
    offsets = torch.randn(8, generator=gen).to(torch.bfloat16)
    # vLLM-Ascend's _quantize_impl call: torch.qint8 as the int dtype, axis -1, multiply
    y = torch_npu.npu_quantize(x.to("npu"), scales.to("npu"), offsets.to("npu"), torch.qint8,
                               -1, False)
    eq((y.dtype, list(y.shape)), (torch.int8, [6, 8]))
    want = int8_round(x.double().numpy() * scales.double().numpy() + offsets.double().numpy())
    got = y.cpu().numpy().astype(np.int32)
    eq(int(np.abs(got - want.astype(np.int32)).max()) <= 1, True)
    # axis -2: along the second-to-last dim
    rows = (torch.rand(6, generator=gen) + 0.5).to(torch.bfloat16)
    y = torch_npu.npu_quantize(x.to("npu"), rows.to("npu"), None, torch.qint8, -2, False)
    want = int8_round(x.double().numpy() * rows.double().numpy()[:, None])
    eq(int(np.abs(y.cpu().numpy().astype(np.int32) - want.astype(np.int32)).max()) <= 1, True)


def quantize_refusals():
    x = torch.randn(6, 8, generator=gen).to(torch.bfloat16).to("npu")
    s = torch.ones(8, dtype=torch.bfloat16, device="npu")
    expect(ModelOpError, "scales must be 1-D of 8",
           lambda: torch_npu.npu_quantize(x, torch.ones(5, dtype=torch.bfloat16,
                                                        device="npu"), None, torch.qint8, -1,
                                          False))
    expect(ModelOpError, "axis must be in [-2, 2)",
           lambda: torch_npu.npu_quantize(x, s, None, torch.qint8, -3, False))
    expect(ModelOpError, "zero_points must have scales' shape and dtype",
           lambda: torch_npu.npu_quantize(x, s, torch.zeros(8, device="npu"), torch.qint8, -1,
                                          False))
    expect(NotInTwinError, "only div_mode=False",
           lambda: torch_npu.npu_quantize(x, s, None, torch.qint8, -1, True))


def fake_kernels():
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        x = mode.from_tensor(torch.empty(2, 3, 4, dtype=torch.bfloat16, device="npu"))
        y, scale = torch.ops.npu.npu_dynamic_quant(x)
        eq((y.dtype, list(y.shape), scale.dtype, list(scale.shape)),
           (torch.int8, [2, 3, 4], torch.float32, [2, 3]))
        s = mode.from_tensor(torch.empty(4, dtype=torch.bfloat16, device="npu"))
        q = torch.ops.npu.npu_quantize(x, s, None, QINT8, -1, False)
        eq((q.dtype, list(q.shape)), (torch.int8, [2, 3, 4]))


check("dynamic_quant_numerics", dynamic_quant_numerics)
check("dynamic_quant_smooth_scales", dynamic_quant_smooth_scales)
check("dynamic_quant_refusals", dynamic_quant_refusals)
check("quantize_numerics", quantize_numerics)
check("quantize_refusals", quantize_refusals)
check("fake_kernels", fake_kernels)
"""

RULES = ("dynamic_quant_numerics", "dynamic_quant_smooth_scales", "dynamic_quant_refusals",
         "quantize_numerics", "quantize_refusals", "fake_kernels")


@pytest.fixture(scope="module")
def outcomes(run_twin):
    proc = run_twin(SCRIPT, env={"AICPU_TILING_TWIN_TENSORS": "plain"}, timeout=300)
    return run_twin.rules(proc)


@pytest.mark.parametrize("rule", RULES)
def test_quant_ops_on_the_twin(outcomes, rule):
    assert outcomes.get(rule) == "ok", outcomes
