"""The torch_npu quantisation ops vLLM-Ascend's compiler runs while it registers its fusion
patterns, on a model that is not quantised (issue 28 item 7).

Who calls them: under vLLM's default compilation (VLLM_COMPILE, ``AscendCompiler``) the pass
manager builds ``AddRMSNormQuantFusionPass`` for every bf16/fp16 model on A2/A3
(``compilation/passes/norm_quant_fusion_pass.py``, 0.23.0.post1 and 0.30.0rc2), whose
patterns are traced by torch's ``register_replacement`` on npu example tensors of shape
``[2, 4]`` (``get_inputs``), so the ops of each search pattern run once:

* ``npu_dynamic_quant(out0)`` (``AddRMSNormDynamicQuantPattern`` and, with custom ops on,
  ``...PatternWithBias``): per-token symmetric int8 quantisation;
* ``torch.ops.vllm.quantize`` (``AddRMSNormQuantPattern``, custom ops on), whose body is
  ``torch_npu.npu_quantize(x, scale_reciprocal, offset, torch.qint8, -1, False)``
  (``ops/register_custom_ops.py`` ``_quantize_impl``).

A model's own forward calls neither here (the engine check's models are bf16, not W8A8), so
the patterns never match; but they must trace. Schemas: ``libtorch_npu.so`` of the torch_npu
2.10.0.post4 wheel, verbatim (tests/twin/test_quant_ops.py reads them there). Rules and
numerics: each op's ``_op_plugin_docs.py`` entry (cited at each check), computed in float32 on
the host; what the path above does not use (smooth scales per group, other output types,
other modes) raises `NotInTwinError`. Output shapes follow the wheel's meta kernels
(``op_plugin/meta/_meta_registrations.py``), which are the fake kernels here.
"""

from __future__ import annotations

import types

import torch

from .model_ops import _HALVES, _dtype, _fail, _on_device
from .npu_module import NotInTwinError

#: torch_npu 2.10.0.post4, the schemas ``libtorch_npu.so`` registers (namespace ``npu``)
SCHEMAS = {
    "npu_dynamic_quant": "npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, "
                         "Tensor? group_index=None, int? dst_type=None, str "
                         "quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)",
    "npu_quantize": "npu_quantize(Tensor input, Tensor scales, Tensor? zero_points, int dtype, "
                    "int axis=1, bool div_mode=True) -> Tensor",
}
#: torch_npu's dtype enum values (``TORCH_DTYPE_ENUM_VALUE_TO_SCALAR_TYPE_MAP`` of the meta
#: registrations: the ScalarType's index): int8 is 1, qint8 12
INT8 = 1
QINT8 = 12
INT8_MAX = 127.0


def _round_to_int8(values: torch.Tensor) -> torch.Tensor:
    """Round half to even (the AI Core's default rounding, torch's ``round``) and saturate
    to int8's range, as the quantising cast does."""
    return torch.round(values).clamp(-128.0, 127.0).to(torch.int8)


def dynamic_quant_reference(x: torch.Tensor, smooth_scales: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y, scale)`` in the docs' formula, float32: ``scale = rowMax(|x * smooth|) / 127``
    over the last dim (scale has x's shape without it), ``y = round(x * smooth / scale)``."""
    xf = x.float() * (smooth_scales.float() if smooth_scales is not None else 1.0)
    scale = xf.abs().amax(dim=-1) / INT8_MAX
    # a row of zeros: scale 0 and y 0 (nothing to divide)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    return _round_to_int8(xf / safe.unsqueeze(-1)), scale


def npu_dynamic_quant(input: torch.Tensor, *, smooth_scales: torch.Tensor | None = None,
                      group_index: torch.Tensor | None = None, dst_type: int | None = None,
                      quant_mode: str = "pertoken", dst_type_max: float = 0.0):
    """``torch_npu.npu_dynamic_quant``: ``(y, scale)``, y int8 of input's shape, scale float32
    of input's shape without the last dim (per-token symmetric quantisation,
    `dynamic_quant_reference`). ``_op_plugin_docs.py``: x float16 or bfloat16 with more than
    one dim; smooth_scales 1-D of x's last dim and x's dtype; dst_type None is int8."""
    op = "npu_dynamic_quant"
    if group_index is not None or quant_mode != "pertoken" or dst_type not in (None, INT8) \
            or dst_type_max != 0.0:
        raise NotInTwinError(f"{op} on the twin: only per-token int8 without group_index "
                             "(the fusion patterns' call) is modelled")
    index = _on_device(op, input=input, smooth_scales=smooth_scales)
    _dtype(op, "x", input, _HALVES)  # "数据类型支持torch.float16、torch.bfloat16"
    if input.dim() < 2:  # "输入x的维度必须大于1"
        raise _fail(op, f"x must have more than 1 dim, got {list(input.shape)}")
    if smooth_scales is not None and (
            smooth_scales.dim() != 1 or smooth_scales.shape[0] != input.shape[-1]
            or smooth_scales.dtype != input.dtype):  # "shape必须是1维, 和x的最后一维相等"
        raise _fail(op, f"smooth_scales must be 1-D of x's last dim {input.shape[-1]} and "
                    f"x's dtype {input.dtype}, got {list(smooth_scales.shape)} "
                    f"{smooth_scales.dtype}")
    y = torch.empty(input.shape, dtype=torch.int8, device=input.device)
    scale = torch.empty(input.shape[:-1], dtype=torch.float32, device=input.device)
    from . import device as twin

    x_i, y_i, s_i = (twin.inner(t) for t in (input, y, scale))
    m_i = twin.inner(smooth_scales) if smooth_scales is not None else None

    def run() -> None:
        out, s = dynamic_quant_reference(x_i, m_i)
        y_i.copy_(out)
        s_i.copy_(s)
    twin.device().enqueue_aicore(op, run, index=index, writes=(y, scale))
    return y, scale


def quantize_reference(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                       axis: int) -> torch.Tensor:
    """``round(x * scales + zero_points)`` to int8 in float32 (div_mode False), scales and
    zero_points along `axis` (-2: the second-to-last dim; any other: the last) and broadcast
    over the other dims."""
    dim = x.dim() - 2 if axis == -2 else x.dim() - 1
    shape = [1] * x.dim()
    shape[dim] = -1
    values = x.float() * scales.float().reshape(shape)
    if zero_points is not None:
        values = values + zero_points.float().reshape(shape)
    return _round_to_int8(values)


def npu_quantize(input: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor | None,
                 dtype: int, axis: int = 1, div_mode: bool = True) -> torch.Tensor:
    """``torch_npu.npu_quantize``: ``y = round(input * scales + zero_points)`` (div_mode
    False), int8 of input's shape for dtype ``torch.qint8``. ``_op_plugin_docs.py``: input
    float, float16 or bfloat16; with div_mode False scales 1-D of the size of input's `axis`
    dim (or 1), ``axis`` at least -2 (-2: the second-to-last dim, larger: the last), and
    zero_points of scales' shape and dtype. div_mode True and other output types raise
    `NotInTwinError` (the fusion pattern's call is div_mode False, qint8)."""
    op = "npu_quantize"
    if div_mode or dtype != QINT8:
        raise NotInTwinError(f"{op} on the twin: only div_mode=False to torch.qint8 (the "
                             "fusion pattern's call) is modelled")
    index = _on_device(op, input=input, scales=scales, zero_points=zero_points)
    _dtype(op, "input", input, (torch.float32, *_HALVES))
    _dtype(op, "scales", scales, (torch.float32, *_HALVES))
    if axis < -2 or axis >= input.dim():  # "axis取值范围是[-2, +∞)且指定的轴不能超过输入input的维度数"
        raise _fail(op, f"axis must be in [-2, {input.dim()}), got {axis}")
    size = input.shape[-2 if axis == -2 else -1]
    if scales.dim() != 1 or scales.shape[0] not in (size, 1):
        raise _fail(op, f"scales must be 1-D of {size} (or 1) elements, got "
                    f"{list(scales.shape)}")
    if zero_points is not None and (zero_points.shape != scales.shape
                                    or zero_points.dtype != scales.dtype):
        raise _fail(op, "zero_points must have scales' shape and dtype, got "
                    f"{list(zero_points.shape)} {zero_points.dtype}")
    y = torch.empty(input.shape, dtype=torch.int8, device=input.device)
    from . import device as twin

    x_i, s_i, y_i = (twin.inner(t) for t in (input, scales, y))
    z_i = twin.inner(zero_points) if zero_points is not None else None

    def run() -> None:
        y_i.copy_(quantize_reference(x_i, s_i.expand(size) if s_i.numel() == 1 else s_i,
                                     None if z_i is None else (
                                         z_i.expand(size) if z_i.numel() == 1 else z_i), axis))
    twin.device().enqueue_aicore(op, run, index=index, writes=(y,))
    return y


def _fake_dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None,
                        quant_mode="pertoken", dst_type_max=0.0):
    return (input.new_empty(input.shape, dtype=torch.int8),
            input.new_empty(input.shape[:-1], dtype=torch.float32))


def _fake_quantize(input, scales, zero_points, dtype, axis=1, div_mode=True):
    return input.new_empty(input.shape, dtype=torch.int8)


OPS = {"npu_dynamic_quant": (npu_dynamic_quant, _fake_dynamic_quant),
       "npu_quantize": (npu_quantize, _fake_quantize)}

_library: list[torch.library.Library] = []


def register() -> None:
    """Define `OPS` in ``torch.ops.npu`` with their PrivateUse1 and fake kernels (once)."""
    if _library:
        return
    lib = torch.library.Library("npu", "FRAGMENT")
    for name, (impl, fake) in OPS.items():
        lib.define(SCHEMAS[name])
        lib.impl(name, impl, "PrivateUse1")
        torch.library.register_fake(f"npu::{name}", fake, lib=lib)
    _library.append(lib)


def install(module: types.ModuleType) -> None:
    """Register the ops and set them on the torch_npu stand-in `module`."""
    register()
    for name in OPS:
        setattr(module, name, getattr(torch.ops.npu, name))
