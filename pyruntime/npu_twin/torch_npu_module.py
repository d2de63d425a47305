"""The ``torch_npu`` module on the twin: ``torch_npu.npu`` (the twin's ``torch.npu``),
``torch_npu._C._npu_getCurrentRawStream`` (Triton-Ascend's stream query), FIA (v1 and v2),
and a placeholder for every other name (vLLM-Ascend imports many at module top level): it exists
and raises `NotInTwinError` when called, never accepting anything."""

from __future__ import annotations

import importlib.machinery
import sys
import types

from . import device as twin
from . import fia, hccl, mla_ops, model_ops, moe_ops, npu_module, npugraph_ex, profiler, quant_ops
from .npu_module import placeholder

VERSION = "2.10.0.post4+npu-twin"


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{self.__name__}.{name}")


class _FiaPacket:
    """``torch_npu.npu_fused_infer_attention_score`` (and ``_v2``): the op packet, whose ``.out``
    also takes its two outputs as ``out=[attention_out, softmax_lse]``, the way torch_npu's own
    graph handler (``torch_npu/npu/_npugraph_handlers/ifa_handler.py``) and vLLM-Ascend 0.29+
    (``attention_v1.py``, ``register_task``) call it."""

    def __init__(self, packet) -> None:
        self._packet = packet
        overload = packet.out

        def out(*args, **kwargs):
            if "out" in kwargs:
                attention_out, softmax_lse = kwargs.pop("out")
                kwargs.update(attention_out=attention_out, softmax_lse=softmax_lse)
            return overload(*args, **kwargs)

        self.out = out

    def __call__(self, *args, **kwargs):
        return self._packet(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._packet, name)


def _module(name: str) -> _PlaceholderModule:
    """A placeholder module with a spec, as an imported package has (``importlib.util
    .find_spec("torch_npu")`` returns it; transformers and vLLM probe for torch_npu so)."""
    module = _PlaceholderModule(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    return module


def build() -> types.ModuleType:
    """The stand-in module (not yet in ``sys.modules``)."""
    module = _module("torch_npu")
    module.__version__ = VERSION
    module.__file__ = __file__
    module.npu = npu_module
    c = _module("torch_npu._C")

    def current_raw_stream(device: int = 0) -> int:
        return twin.device().current_stream(device).id

    c._npu_getCurrentRawStream = current_raw_stream

    def weak_ref_tensor(tensor):
        """torch_npu's ``_weak_ref_tensor``: a tensor over the same device memory that does
        not own it (vLLM-Ascend keeps captured outputs and workspaces so). The twin's alias
        keeps the memory alive, which is more forgiving than the real one: using it after the
        owner is freed goes unflagged here."""
        if not twin.is_npu_tensor(tensor):
            raise TypeError("_weak_ref_tensor expects an npu tensor")
        return tensor.detach()

    c._weak_ref_tensor = weak_ref_tensor
    c._distributed_c10d = hccl.c10d_module(_module)
    module._C = c
    module.npu_fused_infer_attention_score = _FiaPacket(fia.register())
    module._npu_fused_infer_attention_score_get_max_workspace = fia.get_max_workspace
    module.npu_fused_infer_attention_score_v2 = _FiaPacket(fia.register_v2())
    module._npu_fused_infer_attention_score_v2_get_max_workspace = fia.get_max_workspace_v2
    module.npu_transpose_batchmatmul = transpose_batchmatmul
    mla_ops.install(module)
    model_ops.install(module, _module)  # a dense decoder's forward: norms, swiglu, rope, KV
    moe_ops.install(module)  # the fused-MoE path at TP 1: routing, grouped matmul, unpermute
    quant_ops.install(module)  # what vLLM-Ascend's fusion patterns trace under VLLM_COMPILE
    module.profiler = profiler.build()  # torch_npu.profiler: profile, its handler and config
    # torch_npu/profiler/dynamic_profile.py (init, step, start, set_state: msMonitor's dynamic
    # profiling). vLLM-Ascend's worker/worker.py imports it at module top (0.23.0.post1 line 29,
    # 0.30.0rc2 line 32) and calls dp.step() only under ascend_config.msmonitor_use_daemon
    # (off by default): the module exists, each of its names raises NotInTwinError if called
    module.profiler.dynamic_profile = _module("torch_npu.profiler.dynamic_profile")
    # torch_npu/_inductor/__init__.py registers torch_npu's Inductor backend for "npu" (device
    # op overrides, Triton scheduling, lowerings). vLLM-Ascend's NPUWorker._init_device
    # imports it when HAS_TRITON (0.23.0.post1 worker.py:456, 0.30.0rc2 worker.py:445): with
    # the twin's Triton-Ascend backend active it does. Inductor code generation for the twin's
    # device is not modelled: the module exists and does nothing on import, and each of its
    # names raises NotInTwinError if called; a torch.compile that reaches Inductor's npu
    # backend fails there (the engine check runs compilation mode NONE)
    module._inductor = _module("torch_npu._inductor")
    return module


def transpose_batchmatmul(input, weight, *, bias=None, scale=None, perm_x1=None,
                          perm_x2=None, perm_y=None, batch_split_factor=1):
    """``torch_npu.npu_transpose_batchmatmul(Tensor input, Tensor weight, *, Tensor?
    bias=None, Tensor? scale=None, int[]? perm_x1=None, int[]? perm_x2=None, int[]?
    perm_y=None, int? batch_split_factor=1)`` (torch_npu 2.10.0.post4 ``_op_plugin_docs.py``;
    ``perm_x1`` arranges input as [B, M, K], ``perm_x2`` weight as [B, K, N]): ``y =
    permute(permute(input, perm_x1) @ permute(weight, perm_x2), perm_y)``, as vLLM-Ascend's
    MLA up-projection calls it (``AscendMLAImpl._v_up_proj``: ``[N, B, L] @ [N, L, V]``,
    ``perm_y=(1, 0, 2)``). Only the permutations; bias, scale and batch_split_factor, which no
    caller here passes, are refused."""
    if bias is not None or scale is not None or batch_split_factor != 1:
        raise NotImplementedError("npu_transpose_batchmatmul on the twin: bias, scale and "
                                  "batch_split_factor are not modelled")
    for name, t in (("input", input), ("weight", weight)):
        if not twin.is_npu_tensor(t) or t.dim() != 3:
            raise TypeError(f"npu_transpose_batchmatmul: {name} must be a 3-d npu tensor")
    import torch

    same = (0, 1, 2)
    y = torch.bmm(input.permute(*(perm_x1 or same)), weight.permute(*(perm_x2 or same)))
    return y.permute(*(perm_y or same)).contiguous()


def install() -> types.ModuleType:
    module = build()
    sys.modules["torch_npu"] = module
    sys.modules["torch_npu._C"] = module._C
    sys.modules["torch_npu._C._distributed_c10d"] = module._C._distributed_c10d
    hccl.install()
    sys.modules["torch_npu.npu"] = npu_module
    sys.modules["torch_npu.profiler"] = module.profiler
    sys.modules["torch_npu.profiler.dynamic_profile"] = module.profiler.dynamic_profile
    sys.modules["torch_npu._inductor"] = module._inductor
    # torch_npu's import registers its graph compiler as the module npugraph_ex
    # (torch_npu/dynamo/__init__.py _get_npugraph_ex_backend); vLLM-Ascend's fusion passes
    # import it (pyruntime.npu_twin.npugraph_ex says which names are modelled)
    npugraph_ex.install()
    # ``torch.npu.memory`` is a module there (vLLM-Ascend imports names from it)
    sys.modules["torch_npu.npu.memory"] = npu_module.memory
    sys.modules["torch.npu.memory"] = npu_module.memory
    return module
