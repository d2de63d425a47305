"""The ops vLLM-Ascend's fused MoE layer calls at TP 1 (one device, no expert parallelism, no
quantisation, default settings), on the twin, for a gpt-oss-shaped MoE (router with bias,
softmax top-k renormalised, ``swigluoai`` activation, experts with bias) and a
DeepSeek-V3-shaped MoE (sigmoid scoring, grouped top-k with ``e_score_correction_bias``,
shared experts):

* ``torch_npu.npu_moe_init_routing_v2`` (`init_routing_v2`): the AllGather token dispatcher's
  permutation of the tokens into expert order (``TokenDispatcherWithAllGather.token_dispatch``
  through ``DeviceOperator.npu_moe_init_routing``) in 0.30.0rc2; 0.23.0.post1's A2/A3
  ``DeviceOperator`` calls vLLM-Ascend's own copy, ``_C_ascend.npu_moe_init_routing_custom``
  (`init_routing_custom`, same arguments and outputs);
* ``torch_npu.npu_grouped_matmul`` (`grouped_matmul`): the experts' gate-up and down
  projections, one weight tensor ``[E, K, N]``, groups along M, float32 bias
  (0.30.0rc2 ``ops/fused_moe/routed_experts.py`` ``apply_gmm1``/``apply_gmm2``;
  0.23.0.post1 ``ops/fused_moe/moe_mlp.py`` ``unquant_apply_mlp``);
* ``torch_npu.npu_moe_token_unpermute`` (`token_unpermute`): the dispatcher's combine,
  weighted by the router's top-k weights (``token_combine`` through
  ``DeviceOperator.npu_moe_token_unpermute``, ``sorted_indices=torch.abs(expanded_row_idx)``);
* ``torch.ops._C_ascend.moe_gating_top_k`` (`gating_top_k`, registered by `vllm_ascend_c`
  from the release's ``csrc/torch_binding.cpp`` schema): the router of both shapes
  (``DeviceOperator.moe_gating_top_k`` of ``BaseDeviceAdaptor``, A2/A3; 0.30.0rc2
  ``ops/fused_moe/router/fused_topk_router.py``, 0.23.0.post1
  ``ops/fused_moe/experts_selector.py::_select_experts_with_fusion_ops``).

Not here: ``npu_swiglu`` (the DeepSeek experts' and shared experts' ``silu`` activation) is a
dense op (`model_ops`); gpt-oss's ``swigluoai`` runs vLLM's ``SwigluOAIAndMul.forward_native``
(plain torch ops) in both releases (``AscendSwigluOAIAndMul.swiglu_oai_forward``).

Which dispatcher: ``select_moe_comm_method`` (``ascend_forward_context.py``, both releases)
returns ``MoECommType.ALLGATHER`` when ``not enable_expert_parallel or ep world size == 1``;
so at TP 1 on one device the layer uses ``AllGatherCommImpl`` (``TokenDispatcherWithAllGather``,
``PrepareAndFinalizeWithAllGather``, whose all-gathers are no-ops at world size 1), never MC2
or all-to-all.

Each op checks what torch_npu 2.10.0.post4's ``_op_plugin_docs.py`` states for it (cited at
each check), raises `NotInTwinError` for what the twin does not model (quantisation, drop-pad,
the key-value count mode, multi-tensor lists, ...), runs in float32 and casts to the output
dtype, and is queued as an AI Core task on the current stream of its tensors' device (captured
into a graph like any kernel). Index values that the real kernel would read or write out of
bounds with are refused when the task runs (a ``RuntimeError`` at the synchronize), never
used. The schemas are the registration strings in torch_npu 2.10.0.post4's
``torch_npu/lib/libtorch_npu.so`` (a test reads them out of the wheel).
"""

from __future__ import annotations

import itertools

import torch

from . import device as twin
from .device import op_refused as _fail
from .npu_module import NotInTwinError

#: torch_npu 2.10.0.post4, ``torch_npu/lib/libtorch_npu.so`` (the registered schemas, verbatim)
INIT_ROUTING_V2_SCHEMA = (
    "npu_moe_init_routing_v2(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? "
    "offset=None, int active_num=-1, int expert_capacity=-1, int expert_num=-1, int "
    "drop_pad_mode=0, int expert_tokens_num_type=0, bool expert_tokens_num_flag=False, int "
    "quant_mode=-1, int[2] active_expert_range=[], int row_idx_type=0, int? x_dtype=None) -> "
    "(Tensor, Tensor, Tensor, Tensor)")
GROUPED_MATMUL_SCHEMA = (
    "npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? "
    "scale=None, Tensor[]? offset=None, Tensor[]? antiquant_scale=None, Tensor[]? "
    "antiquant_offset=None, Tensor[]? per_token_scale=None, Tensor? group_list=None, "
    "Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, Tensor[]? "
    "activation_quant_offset=None, int? split_item=0, int? group_type=None, int? "
    "group_list_type=0, int? act_type=0, int[]? tuning_config=None, int? output_dtype=None, "
    "int? x_dtype=None, int? weight_dtype=None, int? scale_dtype=None, int? "
    "per_token_scale_dtype=None) -> Tensor[]")
TOKEN_UNPERMUTE_SCHEMA = (
    "npu_moe_token_unpermute(Tensor permuted_tokens, Tensor sorted_indices, Tensor? "
    "probs=None, bool padded_mode=False, int[]? restore_shape=None) -> Tensor")

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


# ---- npu_moe_init_routing_v2 ------------------------------------------------------------------
def _expert_range(op: str, active_expert_range, expert_num: int) -> tuple[int, int]:
    """``[expert_start, expert_end)``; an empty list (the schema's default) is every expert."""
    bounds = [int(v) for v in (active_expert_range or [])]
    if not bounds:
        return 0, expert_num
    if len(bounds) != 2:
        raise _fail(op, f"active_expert_range must be [expert_start, expert_end], got {bounds}")
    start, end = bounds
    # "要求数组内的值大于等于0，并且expert_end不大于expert_num"
    if not 0 <= start < end <= expert_num:
        raise _fail(op, f"active_expert_range {bounds} must satisfy 0 <= expert_start < "
                    f"expert_end <= expert_num {expert_num}")
    return start, end


def check_init_routing_v2(x, expert_idx, options: dict, op: str = "npu_moe_init_routing_v2"
                          ) -> tuple[int, int]:
    """torch_npu 2.10.0.post4 ``_op_plugin_docs.py``, ``npu_moe_init_routing_v2``; returns the
    active expert range.

    "x ... 要求为2D的Tensor，shape为(NUM_ROWS, H) ... 数据类型支持float16、bfloat16、float32、
    int8"; "expert_idx ... 2D的Tensor，shape为(NUM_ROWS, K) ... 数据类型支持int32";
    "expert_num ... 要求大于0 ... 其他模式取值范围为(0, 10240]"; "drop_pad_mode ... 当前仅支持0";
    "expert_tokens_num_type ... 当前仅支持1和2"; "expert_tokens_num_flag ... 当前仅支持True";
    "quant_mode ... 当前仅支持-1和1"; "active_num ... 取值需大于等于-1". Modelled: the
    non-quantised dropless count mode with gather-type row indices (``row_idx_type`` 0), all
    rows active (``active_num`` -1, 0 or at least NUM_ROWS * K), no scale: what vLLM-Ascend's
    AllGather dispatcher passes. The rest raises `NotInTwinError`.
    """
    if options.get("x_dtype") is not None:
        raise NotInTwinError(f"{op}: x_dtype is not modelled by the NPU twin")
    if options.get("scale") is not None or options.get("offset") is not None:
        raise NotInTwinError(f"{op}: scale / offset (quantisation, or a scale carried along) "
                             "are not modelled by the NPU twin")
    quant_mode = int(options.get("quant_mode", -1))
    if quant_mode not in (-1, 1):
        raise _fail(op, f"quant_mode supports only -1 and 1, got {quant_mode}")
    if quant_mode != -1:
        raise NotInTwinError(f"{op}: quant_mode {quant_mode} (dynamic quantisation) is not "
                             "modelled by the NPU twin")
    if int(options.get("drop_pad_mode", 0)) != 0:
        raise _fail(op, f"drop_pad_mode supports only 0 (dropless), got "
                    f"{options.get('drop_pad_mode')}")
    count_type = int(options.get("expert_tokens_num_type", 0))
    if count_type not in (1, 2):
        raise _fail(op, f"expert_tokens_num_type supports only 1 (count) and 2 (key_value), "
                    f"got {count_type}")
    if count_type == 2:
        raise NotInTwinError(f"{op}: expert_tokens_num_type 2 (key_value) is not modelled by "
                             "the NPU twin")
    if not options.get("expert_tokens_num_flag", False):
        raise _fail(op, "expert_tokens_num_flag supports only True")
    if int(options.get("row_idx_type", 0)) != 0:
        raise NotInTwinError(f"{op}: row_idx_type {options.get('row_idx_type')} (scatter "
                             "indices) is not modelled by the NPU twin")
    if x.dim() != 2:
        raise _fail(op, f"x must be 2-D (NUM_ROWS, H), got {list(x.shape)}")
    if x.dtype not in _FLOATS:
        if x.dtype == torch.int8:
            raise NotInTwinError(f"{op}: an int8 x is not modelled by the NPU twin")
        raise _fail(op, f"x must be float16, bfloat16, float32 or int8, got {x.dtype}")
    if expert_idx.dim() != 2 or expert_idx.shape[0] != x.shape[0]:
        raise _fail(op, f"expert_idx must be 2-D (NUM_ROWS, K) with x's NUM_ROWS "
                    f"{x.shape[0]}, got {list(expert_idx.shape)}")
    if expert_idx.dtype != torch.int32:
        raise _fail(op, f"expert_idx must be int32, got {expert_idx.dtype}")
    expert_num = int(options.get("expert_num", -1))
    if not 0 < expert_num <= 10240:
        raise _fail(op, f"expert_num must lie in (0, 10240] in count mode, got {expert_num}")
    active_num = int(options.get("active_num", -1))
    if active_num < -1:
        raise _fail(op, f"active_num must be at least -1, got {active_num}")
    if 0 < active_num < expert_idx.numel():
        raise NotInTwinError(f"{op}: active_num {active_num} below NUM_ROWS * K "
                             f"{expert_idx.numel()} (the Active scenario) is not modelled by "
                             "the NPU twin")
    return _expert_range(op, options.get("active_expert_range"), expert_num)


def init_routing_v2_reference(x: torch.Tensor, expert_idx: torch.Tensor, expert_range
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routing on host tensors: ``(expanded_x [NUM_ROWS*K, H], expanded_row_idx
    [NUM_ROWS*K] int32, counts [end - start] int64)``.

    The (row, k) pairs, flattened row-major, are sorted by expert id (stable: within an expert
    in flat order); those with an expert in ``[start, end)`` fill the first rows of
    ``expanded_x`` with their token's row of ``x``; the remaining rows are zero (the doc
    leaves them undefined). ``expanded_row_idx`` is indexed by the flat (row, k) position and
    holds the ``expanded_x`` row it landed in, -1 for a pair outside the range (the doc's
    gather type, "有效元素与无效元素共存，其中无效元素由-1填充"; vLLM-Ascend 0.30.0rc2's
    ``lora/fused_moe.py::_recover_moe_lora_routing_allgather`` states the same direction,
    "indexed by the ORIGINAL flat (token, k) position and gives where that pair landed").
    ``counts[e - start]`` is expert e's number of pairs.
    """
    start, end = expert_range
    k = expert_idx.shape[1]
    flat = expert_idx.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices
    active = (flat[order] >= start) & (flat[order] < end)
    order = order[active]
    expanded = torch.zeros((flat.numel(), x.shape[1]), dtype=x.dtype)
    expanded[: order.numel()] = x[order // k]
    row_idx = torch.full((flat.numel(),), -1, dtype=torch.int32)
    row_idx[order] = torch.arange(order.numel(), dtype=torch.int32)
    counts = torch.bincount(flat[order] - start, minlength=end - start).to(torch.int64)
    return expanded, row_idx, counts


def _init_routing(op: str, x, expert_idx, options: dict):
    twin.refuse_host_tensors(op, x, expert_idx, options.get("scale"), options.get("offset"))
    start, end = check_init_routing_v2(x, expert_idx, options, op)
    expert_num = int(options["expert_num"])
    rows = expert_idx.numel()
    expanded = torch.empty((rows, x.shape[1]), dtype=x.dtype, device=x.device)
    row_idx = torch.empty((rows,), dtype=torch.int32, device=x.device)
    counts = torch.empty((end - start,), dtype=torch.int64, device=x.device)
    expanded_scale = torch.empty((rows,), dtype=torch.float32, device=x.device)
    xi, ei, exi, ri, ci, si = (twin.inner(t) for t in (x, expert_idx, expanded, row_idx,
                                                        counts, expanded_scale))

    def run() -> None:
        if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= expert_num):
            raise RuntimeError(f"{op}: expert_idx holds ids outside [0, expert_num "
                               f"{expert_num}): [{int(ei.min())}, {int(ei.max())}]")
        got = init_routing_v2_reference(xi, ei, (start, end))
        for out, value in zip((exi, ri, ci), got):
            out.copy_(value)
        si.zero_()
    twin.device().enqueue_aicore(op, run, index=twin.index_of(x), writes=(exi, ri, ci, si))
    return expanded, row_idx, counts, expanded_scale


def init_routing_v2(x, expert_idx, *, scale=None, offset=None, active_num=-1,
                    expert_capacity=-1, expert_num=-1, drop_pad_mode=0,
                    expert_tokens_num_type=0, expert_tokens_num_flag=False, quant_mode=-1,
                    active_expert_range=(), row_idx_type=0, x_dtype=None):
    """``torch_npu.npu_moe_init_routing_v2`` (`INIT_ROUTING_V2_SCHEMA`; vLLM-Ascend
    0.30.0rc2's AllGather dispatcher): ``x [NUM_ROWS, H]`` float16/bfloat16/float32,
    ``expert_idx [NUM_ROWS, K]`` int32. Returns ``(expanded_x [NUM_ROWS*K, H] x's dtype,
    expanded_row_idx [NUM_ROWS*K] int32, expert_token_count [expert_end - expert_start]
    int64, expanded_scale [NUM_ROWS*K] float32)`` (`init_routing_v2_reference`;
    expanded_scale is undefined without ``scale``, as the doc says: zeros here).

    Raises:
        RuntimeError: what the doc forbids (`check_init_routing_v2`), at the call; an expert id
            outside ``[0, expert_num)`` when the task runs ("专家id不能超过专家数").
        NotInTwinError: quantisation, key-value counts, scatter indices, the Active scenario.
    """
    return _init_routing("npu_moe_init_routing_v2", x, expert_idx, {
        "scale": scale, "offset": offset, "active_num": active_num, "expert_num": expert_num,
        "drop_pad_mode": drop_pad_mode, "expert_tokens_num_type": expert_tokens_num_type,
        "expert_tokens_num_flag": expert_tokens_num_flag, "quant_mode": quant_mode,
        "active_expert_range": active_expert_range, "row_idx_type": row_idx_type,
        "x_dtype": x_dtype})


def init_routing_custom(x, expert_idx, *, scale=None, offset=None, active_num=-1,
                        expert_capacity=-1, expert_num=-1, drop_pad_mode=0,
                        expert_tokens_num_type=0, expert_tokens_num_flag=False, quant_mode=0,
                        active_expert_range=(), row_idx_type=0):
    """``torch.ops._C_ascend.npu_moe_init_routing_custom`` (schema from the release's
    ``csrc/torch_binding.cpp``): vLLM-Ascend 0.23.0.post1's AllGather dispatcher calls this
    one on A2/A3 (``BaseDeviceAdaptor.npu_moe_init_routing``) with the arguments 0.30.0rc2
    passes to ``npu_moe_init_routing_v2``. Its adapter
    (``csrc/moe/moe_init_routing_custom/moe_init_routing_custom_torch_adpt.h``) takes the same
    arguments and makes the same outputs (``[bs*k, h]`` dropless, int32 ``[bs*k]`` row
    indices, int64 ``[end - start]`` counts, float32 ``[bs*k]`` scales; an empty range is
    ``[0, expert_num]``); the twin holds it to `init_routing_v2`'s rules and formula."""
    return _init_routing("_C_ascend::npu_moe_init_routing_custom", x, expert_idx, {
        "scale": scale, "offset": offset, "active_num": active_num, "expert_num": expert_num,
        "drop_pad_mode": drop_pad_mode, "expert_tokens_num_type": expert_tokens_num_type,
        "expert_tokens_num_flag": expert_tokens_num_flag, "quant_mode": quant_mode,
        "active_expert_range": active_expert_range, "row_idx_type": row_idx_type})


def init_routing_custom_meta(x, expert_idx, *, scale=None, offset=None, active_num=-1,
                             expert_capacity=-1, expert_num=-1, drop_pad_mode=0,
                             expert_tokens_num_type=0, expert_tokens_num_flag=False,
                             quant_mode=0, active_expert_range=(), row_idx_type=0):
    """The adapter's dropless shapes (`init_routing_custom`)."""
    return _init_routing_v2_fake(x, expert_idx, active_expert_range=active_expert_range,
                                 expert_num=expert_num)


def _init_routing_v2_fake(x, expert_idx, *, scale=None, offset=None, active_num=-1,
                          expert_capacity=-1, expert_num=-1, drop_pad_mode=0,
                          expert_tokens_num_type=0, expert_tokens_num_flag=False,
                          quant_mode=-1, active_expert_range=(), row_idx_type=0, x_dtype=None):
    rows = expert_idx.shape[0] * expert_idx.shape[1]
    bounds = list(active_expert_range or [0, expert_num])
    return (x.new_empty((rows, x.shape[1])), x.new_empty((rows,), dtype=torch.int32),
            x.new_empty((bounds[1] - bounds[0],), dtype=torch.int64),
            x.new_empty((rows,), dtype=torch.float32))


# ---- npu_grouped_matmul -----------------------------------------------------------------------
#: x's dtype -> bias's dtype, torch_npu 2.10.0.post4 ``_op_plugin_docs.py``,
#: ``npu_grouped_matmul``, "group_list输入类型为torch.Tensor时 ... 非量化 x: torch.float16,
#: torch.bfloat16, torch.float32 ... bias: torch.float16, torch.float32, torch.float32"
_GMM_BIAS_DTYPE = {torch.float16: torch.float16, torch.bfloat16: torch.float32,
                   torch.float32: torch.float32}
#: keyword options of the quantised / activation forms: None only on the twin
_GMM_UNMODELLED = ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale",
                   "activation_input", "activation_quant_scale", "activation_quant_offset",
                   "x_dtype", "weight_dtype", "scale_dtype", "per_token_scale_dtype")


def check_grouped_matmul(x, weight, bias, group_list, options: dict) -> None:
    """torch_npu 2.10.0.post4 ``_op_plugin_docs.py``, ``npu_grouped_matmul``, the
    non-quantised form with a tensor ``group_list``: x float16/bfloat16/float32, weight of x's
    dtype, bias (per x dtype) float16/float32/float32 ("非量化" table), "split_item ... 2/3:
    输出为单个张量", "其他情况下, 张量仅支持2维输入" (x 2-D), weight 2-D or 3-D,
    "group_type ... 0代表m轴分组", "group_list_type ... 可取值0或1", group_list "数据类型支持
    torch.int64 ... 长度与weight列表长度相同" (one entry per expert of the single weight),
    "每一组tensor的最后一维大小都应小于InnerLimit" (65536). Modelled: one x, one weight
    ``[E, K, N]`` (any strides: vLLM-Ascend passes ``w.transpose(1, 2)``), an optional bias
    ``[E, N]``, split_item 2 or 3, group_type 0, act_type 0, no output_dtype: vLLM-Ascend's
    unquantised experts. Lists of several tensors, the quantised forms, activations and
    group_type -1 raise `NotInTwinError`.
    """
    op = "npu_grouped_matmul"
    for name in _GMM_UNMODELLED:
        if options.get(name) is not None:
            raise NotInTwinError(f"{op}: {name} (a quantised or activation form) is not "
                                 "modelled by the NPU twin")
    if options.get("output_dtype") is not None:
        raise NotInTwinError(f"{op}: output_dtype is not modelled by the NPU twin (the output "
                             "has x's dtype)")
    split_item = options.get("split_item", 0)
    if split_item not in (0, 1, 2, 3):
        raise _fail(op, f"split_item must be 0, 1, 2 or 3, got {split_item}")
    if split_item not in (2, 3):
        raise NotInTwinError(f"{op}: split_item {split_item} (one output per weight) is not "
                             "modelled by the NPU twin")
    if options.get("act_type", 0) not in (0, None):
        raise NotInTwinError(f"{op}: act_type {options.get('act_type')} is not modelled by the "
                             "NPU twin")
    if len(x) != 1 or len(weight) != 1 or (bias is not None and len(bias) != 1):
        raise NotInTwinError(f"{op}: lists of several x / weight / bias tensors are not "
                             "modelled by the NPU twin (one of each: vLLM-Ascend's experts)")
    group_type = options.get("group_type")
    if group_list is None or group_type != 0:
        raise NotInTwinError(f"{op}: group_type {group_type} with group_list "
                             f"{'None' if group_list is None else 'given'} is not modelled by "
                             "the NPU twin (group_type 0, a tensor group_list)")
    list_type = options.get("group_list_type", 0)
    if list_type not in (0, 1):
        raise _fail(op, f"group_list_type must be 0 (cumsum) or 1 (count), got {list_type}")
    x0, w0 = x[0], weight[0]
    if x0.dim() != 2:
        raise _fail(op, f"x must be 2-D with split_item {split_item}, got {list(x0.shape)}")
    if x0.dtype not in _FLOATS:
        raise NotInTwinError(f"{op}: an x of {x0.dtype} (quantised) is not modelled by the "
                             "NPU twin")
    if w0.dtype != x0.dtype:
        raise _fail(op, f"weight must have x's dtype {x0.dtype} (non-quantised), got "
                    f"{w0.dtype}")
    if w0.dim() != 3:
        raise NotInTwinError(f"{op}: a {w0.dim()}-D weight is not modelled by the NPU twin "
                             "(one [E, K, N] weight)")
    experts, k_dim, n_dim = w0.shape
    if x0.shape[1] != k_dim:
        raise _fail(op, f"x's K {x0.shape[1]} must equal weight's K {k_dim}")
    if max(k_dim, n_dim) >= 65536:
        raise _fail(op, f"the last dims of x and weight must be below InnerLimit 65536, got "
                    f"K {k_dim}, N {n_dim}")
    if group_list.dim() != 1 or group_list.dtype != torch.int64 \
            or group_list.shape[0] != experts:
        raise _fail(op, f"group_list must be 1-D int64 with one entry per weight group "
                    f"({experts}), got {group_list.dtype} {list(group_list.shape)}")
    if list_type == 1 and experts == 1:
        raise _fail(op, "group_list with group_list_type 1 must not have length 1")
    if bias is not None:
        b0 = bias[0]
        if tuple(b0.shape) != (experts, n_dim):
            raise _fail(op, f"bias must be [E, N] = {[experts, n_dim]}, got {list(b0.shape)}")
        if b0.dtype != _GMM_BIAS_DTYPE[x0.dtype]:
            raise _fail(op, f"bias must be {_GMM_BIAS_DTYPE[x0.dtype]} for an x of "
                        f"{x0.dtype}, got {b0.dtype}")


def group_ends(group_list: torch.Tensor, list_type: int, rows: int, op: str) -> list[int]:
    """The end row of each group from ``group_list`` (cumsum or counts). Raises RuntimeError
    for a negative count, a decreasing cumsum or groups past x's rows (the doc: "必须为非负
    单调非递减数列" / "必须为非负数列"): the kernel would read past x."""
    values = [int(v) for v in group_list.tolist()]
    if list_type == 1:
        if any(v < 0 for v in values):
            raise RuntimeError(f"{op}: group_list counts must be non-negative, got {values}")
        ends, total = [], 0
        for v in values:
            total += v
            ends.append(total)
    else:
        ends = values
        if any(v < 0 for v in ends) or any(b < a for a, b in itertools.pairwise(ends)):
            raise RuntimeError(f"{op}: a cumsum group_list must be non-negative and "
                               f"non-decreasing, got {ends}")
    if ends and ends[-1] > rows:
        raise RuntimeError(f"{op}: group_list covers {ends[-1]} rows, x has {rows}")
    return ends


def grouped_matmul_reference(x: torch.Tensor, weight: torch.Tensor, bias, ends: list[int]
                             ) -> torch.Tensor:
    """``y[rows of group e] = x[rows] @ weight[e] + bias[e]`` in float32, in x's dtype; rows
    past the last group are zero (the doc leaves them undefined)."""
    out = torch.zeros((x.shape[0], weight.shape[2]), dtype=torch.float32)
    for e, (r0, r1) in enumerate(zip([0] + ends, ends)):
        if r1 > r0:
            out[r0:r1] = x[r0:r1].float() @ weight[e].float()
            if bias is not None:
                out[r0:r1] += bias[e].float()
    return out.to(x.dtype)


def grouped_matmul(x, weight, *, bias=None, scale=None, offset=None, antiquant_scale=None,
                   antiquant_offset=None, per_token_scale=None, group_list=None,
                   activation_input=None, activation_quant_scale=None,
                   activation_quant_offset=None, split_item=0, group_type=None,
                   group_list_type=0, act_type=0, tuning_config=None, output_dtype=None,
                   x_dtype=None, weight_dtype=None, scale_dtype=None,
                   per_token_scale_dtype=None):
    """``torch_npu.npu_grouped_matmul`` (`GROUPED_MATMUL_SCHEMA`), grouped along M: ``x =
    [x0 [M, K]]``, ``weight = [w [E, K, N]]``, ``bias = [b [E, N]]`` or None, ``group_list
    [E]`` int64 (cumsum or counts per ``group_list_type``). Returns ``[y [M, N]]`` of x's
    dtype (`grouped_matmul_reference`).

    Raises:
        RuntimeError: what the doc forbids (`check_grouped_matmul`) at the call; a group list
            past x's rows when the task runs (`group_ends`).
        NotInTwinError: quantised, multi-tensor, activation and other group forms.
    """
    op = "npu_grouped_matmul"
    options = {"scale": scale, "offset": offset, "antiquant_scale": antiquant_scale,
               "antiquant_offset": antiquant_offset, "per_token_scale": per_token_scale,
               "activation_input": activation_input,
               "activation_quant_scale": activation_quant_scale,
               "activation_quant_offset": activation_quant_offset, "split_item": split_item,
               "group_type": group_type, "group_list_type": group_list_type,
               "act_type": act_type, "output_dtype": output_dtype, "x_dtype": x_dtype,
               "weight_dtype": weight_dtype, "scale_dtype": scale_dtype,
               "per_token_scale_dtype": per_token_scale_dtype}
    twin.refuse_host_tensors(op, *x, *weight, *(bias or ()), group_list)
    check_grouped_matmul(x, weight, bias, group_list, options)
    x0, w0 = x[0], weight[0]
    out = torch.empty((x0.shape[0], w0.shape[2]), dtype=x0.dtype, device=x0.device)
    xi, wi, gi, oi = (twin.inner(t) for t in (x0, w0, group_list, out))
    bi = twin.inner(bias[0]) if bias is not None else None
    rows = x0.shape[0]

    def run() -> None:
        ends = group_ends(gi, group_list_type, rows, op)
        oi.copy_(grouped_matmul_reference(xi, wi, bi, ends))
    twin.device().enqueue_aicore(op, run, index=twin.index_of(x0), writes=(oi,))
    return [out]


def _grouped_matmul_fake(x, weight, *, bias=None, scale=None, offset=None,
                         antiquant_scale=None, antiquant_offset=None, per_token_scale=None,
                         group_list=None, activation_input=None, activation_quant_scale=None,
                         activation_quant_offset=None, split_item=0, group_type=None,
                         group_list_type=0, act_type=0, tuning_config=None, output_dtype=None,
                         x_dtype=None, weight_dtype=None, scale_dtype=None,
                         per_token_scale_dtype=None):
    return [x[0].new_empty((x[0].shape[0], weight[0].shape[-1]))]


# ---- npu_moe_token_unpermute ------------------------------------------------------------------
def check_token_unpermute(permuted_tokens, sorted_indices, probs, padded_mode) -> int:
    """torch_npu 2.10.0.post4 ``_op_plugin_docs.py``, ``npu_moe_token_unpermute``; returns
    topK. "permuted_tokens ... 2维Tensor, shape为(num_tokens*topK，hidden_size），数据类型
    torch.bfloat16"; "sorted_indices ... 1维Tensor，shape为（num_tokens*topK）"; "probs ...
    shape为（num_tokens，topK），支持的数据类型BFLOAT16", "当probs不传时，topK=1";
    "目前仅支持padded_mode为False". The doc states int64 indices and its own example passes
    int32, as vLLM-Ascend does (``torch.abs`` of init_routing's int32 ``expanded_row_idx``):
    both are taken."""
    op = "npu_moe_token_unpermute"
    if padded_mode:
        raise _fail(op, "padded_mode supports only False")
    if permuted_tokens.dim() != 2 or permuted_tokens.dtype != torch.bfloat16:
        raise _fail(op, f"permuted_tokens must be 2-D (num_tokens*topK, hidden_size) "
                    f"bfloat16, got {permuted_tokens.dtype} {list(permuted_tokens.shape)}")
    if sorted_indices.dim() != 1 or sorted_indices.dtype not in (torch.int32, torch.int64):
        raise _fail(op, f"sorted_indices must be 1-D int64 (or int32), got "
                    f"{sorted_indices.dtype} {list(sorted_indices.shape)}")
    rows = sorted_indices.shape[0]
    if permuted_tokens.shape[0] != rows:
        raise _fail(op, f"permuted_tokens must have num_tokens*topK = {rows} rows (one per "
                    f"sorted index), got {permuted_tokens.shape[0]}")
    if probs is None:
        return 1
    if probs.dim() != 2 or probs.dtype != torch.bfloat16:
        raise _fail(op, f"probs must be 2-D (num_tokens, topK) bfloat16, got {probs.dtype} "
                    f"{list(probs.shape)}")
    if probs.numel() != rows:
        raise _fail(op, f"probs (num_tokens, topK) {list(probs.shape)} must hold one weight "
                    f"per sorted index ({rows})")
    return probs.shape[1]


def token_unpermute_reference(permuted: torch.Tensor, indices: torch.Tensor, probs, top_k: int
                              ) -> torch.Tensor:
    """``out[t] = sum_k permuted[indices[t*topK + k]] * probs[t, k]`` in float32, in
    permuted's dtype (the doc: "根据sorted_indices存储的下标，获取permuted_tokens中存储的
    输入数据；如果存在probs数据，permuted_tokens会与probs相乘；最后进行累加求和"). Raises
    RuntimeError for an index outside ``permuted``'s rows (the kernel would read past it)."""
    rows = permuted.shape[0]
    idx = indices.long()
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= rows):
        raise RuntimeError(f"npu_moe_token_unpermute: sorted_indices hold rows outside "
                           f"[0, {rows}): [{int(idx.min())}, {int(idx.max())}]")
    gathered = permuted.float()[idx].reshape(-1, top_k, permuted.shape[1])
    if probs is not None:
        gathered = gathered * probs.float().reshape(-1, top_k, 1)
    return gathered.sum(1).to(permuted.dtype)


def token_unpermute(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
                    restore_shape=None):
    """``torch_npu.npu_moe_token_unpermute`` (`TOKEN_UNPERMUTE_SCHEMA`): ``permuted_tokens
    [num_tokens*topK, H]`` bfloat16, ``sorted_indices [num_tokens*topK]`` int64/int32 (flat
    (token, k) position -> permuted row), ``probs [num_tokens, topK]`` bfloat16 or None
    (topK 1). Returns ``[num_tokens, H]`` bfloat16 (`token_unpermute_reference`).

    Raises:
        RuntimeError: what the doc forbids (`check_token_unpermute`) at the call; an index
            outside the permuted rows when the task runs.
    """
    op = "npu_moe_token_unpermute"
    twin.refuse_host_tensors(op, permuted_tokens, sorted_indices, probs)
    top_k = check_token_unpermute(permuted_tokens, sorted_indices, probs, padded_mode)
    tokens = sorted_indices.shape[0] // top_k
    out = torch.empty((tokens, permuted_tokens.shape[1]), dtype=permuted_tokens.dtype,
                      device=permuted_tokens.device)
    pi, ii, oi = (twin.inner(t) for t in (permuted_tokens, sorted_indices, out))
    qi = twin.inner(probs) if probs is not None else None

    def run() -> None:
        oi.copy_(token_unpermute_reference(pi, ii, qi, top_k))
    twin.device().enqueue_aicore(op, run, index=twin.index_of(permuted_tokens), writes=(oi,))
    return out


def _token_unpermute_fake(permuted_tokens, sorted_indices, probs=None, padded_mode=False,
                          restore_shape=None):
    top_k = probs.shape[1] if probs is not None else 1
    return permuted_tokens.new_empty((sorted_indices.shape[0] // top_k,
                                      permuted_tokens.shape[1]))


# ---- _C_ascend.moe_gating_top_k ----------------------------------------------------------------
#: the limits of vLLM-Ascend's ``csrc/moe/moe_gating_top_k/op_host/moe_gating_top_k_tiling.cpp``
#: (the same file in 0.23.0.post1 and 0.30.0rc2): ``MAX_EXPERT_COUNT``, the sort's 32-element
#: alignment (``op_kernel/common.h`` ``ONE_REPEAT_SORT_NUM``)
GATING_MAX_EXPERTS = 2048
_SORT_ALIGN = 32


def check_gating_top_k(x, k, k_group, group_count, group_select_mode, renorm, norm_type,
                       bias) -> None:
    """The rules of ``_C_ascend::moe_gating_top_k``: its torch adapter
    (``csrc/moe/moe_gating_top_k/moe_gating_top_k_torch_adpt.h``: "The x should be 2D",
    float16/float32/bfloat16, bias 1-D ``[E]`` of x's dtype) and its tiling's checks
    (``op_host/moe_gating_top_k_tiling.cpp``, ``CheckInputShape``/``CheckAttr``): ``0 < k <=
    E``, ``E <= 2048``, ``0 < k_group <= group_count``, ``E % group_count == 0``,
    ``norm_type`` 0 (softmax) or 1 (sigmoid), ``group_select_mode`` 0 (max) or 1 (top-2
    sum, which needs at least 2 experts a group), ``renorm`` 0 or 1, ``k <= k_group * E /
    group_count``, and ``group_count * align32(E / group_count) <= 2048`` unless the groups
    are trivial (1 or E groups, or every group kept)."""
    op = "_C_ascend::moe_gating_top_k"
    if x.dim() != 2:
        raise _fail(op, f"The x should be 2D, got {list(x.shape)}")
    if x.dtype not in _FLOATS:
        raise _fail(op, f"float16, float32 or bfloat16 tensor expected but got {x.dtype}")
    experts = x.shape[1]
    if bias is not None:
        if bias.dtype != x.dtype:
            raise _fail(op, f"The dtype of x and bias should be same, got {x.dtype} and "
                        f"{bias.dtype}")
        if bias.dim() != 1 or bias.shape[0] != experts:
            raise _fail(op, f"The bias should be 1D [{experts}] (x's second dim), got "
                        f"{list(bias.shape)}")
    if not 0 < k <= experts:
        raise _fail(op, f"k is {k}; it must lie in (0, expert num {experts}]")
    if experts > GATING_MAX_EXPERTS:
        raise _fail(op, f"expert count {experts} must not exceed {GATING_MAX_EXPERTS}")
    if group_count <= 0 or not 0 < k_group <= group_count:
        raise _fail(op, f"k_group {k_group} and group_count {group_count} must satisfy "
                    "0 < k_group <= group_count")
    if norm_type not in (0, 1):
        raise _fail(op, f"norm type {norm_type}: only 0 (softmax) and 1 (sigmoid)")
    if group_select_mode not in (0, 1):
        raise _fail(op, f"group select mode {group_select_mode}: only 0 (max) and 1 (top-2 "
                    "sum)")
    if renorm not in (0, 1):
        raise _fail(op, f"renorm {renorm}: only 0 and 1")
    if experts % group_count:
        raise _fail(op, f"Expert count {experts} is not divisible by group_count "
                    f"{group_count}")
    per_group = experts // group_count
    if group_select_mode == 1 and per_group < 2:
        raise _fail(op, f"group select mode 1 (top-2 sum) needs at least 2 experts a group, "
                    f"got {per_group}")
    if k > k_group * per_group:
        raise _fail(op, f"k {k} must not exceed k_group * experts a group = "
                    f"{k_group * per_group}")
    aligned = -(-per_group // _SORT_ALIGN) * _SORT_ALIGN
    if group_count not in (1, experts) and k_group != group_count \
            and group_count * aligned > GATING_MAX_EXPERTS:
        raise _fail(op, f"group count * group expert count align {group_count * aligned} "
                    f"must not exceed {GATING_MAX_EXPERTS}")


def gating_top_k_reference(x: torch.Tensor, k: int, k_group: int, group_count: int,
                           group_select_mode: int, renorm: int, norm_type: int,
                           routed_scaling_factor: float, eps: float, bias
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's routing in float32 (``op_kernel/moe_gating_top_k_generalized.h``): ``norm
    = softmax(x)`` (norm_type 0) or ``sigmoid(x)`` (1) over the experts; the selection score
    ``norm + bias``; with groups, each group's score (its max, or the sum of its top two) picks
    ``k_group`` groups and the others' experts are out; the top ``k`` experts by score
    (descending); their weights ``norm`` (without the bias), divided by ``sum + eps`` for
    sigmoid or for softmax with ``renorm`` 1 (``SelectTopKExpertScore``: "needRenorm"), times
    ``routed_scaling_factor``. Returns ``(y [rows, k] x's dtype, expert_idx [rows, k] int32,
    norm [rows, E] float32)``."""
    xf = x.float()
    norm = torch.softmax(xf, -1) if norm_type == 0 else torch.sigmoid(xf)
    score = norm + bias.float() if bias is not None else norm.clone()
    rows, experts = score.shape
    if group_count > 1 and k_group < group_count:
        grouped = score.view(rows, group_count, experts // group_count)
        if group_select_mode == 1:
            group_score = grouped.topk(2, dim=-1).values.sum(-1)
        else:
            group_score = grouped.max(-1).values
        keep = group_score.topk(k_group, dim=-1).indices
        mask = torch.zeros(rows, group_count, dtype=torch.bool)
        mask.scatter_(1, keep, True)
        score = grouped.masked_fill(~mask[..., None], float("-inf")).view(rows, experts)
    ids = score.topk(k, dim=-1).indices
    weights = norm.gather(1, ids)
    if norm_type == 1 or renorm == 1:
        weights = weights / (weights.sum(-1, keepdim=True) + eps)
    weights = weights * routed_scaling_factor
    return weights.to(x.dtype), ids.to(torch.int32), norm


def gating_top_k(x, k, k_group, group_count, group_select_mode, renorm, norm_type, out_flag,
                 routed_scaling_factor, eps, bias_opt=None):
    """``torch.ops._C_ascend.moe_gating_top_k`` (schema from the release's
    ``csrc/torch_binding.cpp``, `vllm_ascend_c`): router logits ``x [rows, E]``
    float16/bfloat16/float32, ``bias_opt [E]`` of x's dtype or None. Returns ``(y [rows, k]``
    x's dtype, ``expert_idx [rows, k]`` int32, ``out [rows, E]`` float32``)``
    (`gating_top_k_reference`); ``out`` holds the normalised scores with ``out_flag``, zeros
    otherwise (the kernel leaves it unwritten).

    Raises:
        RuntimeError: what the adapter and the tiling refuse (`check_gating_top_k`).
    """
    op = "_C_ascend::moe_gating_top_k"
    twin.refuse_host_tensors(op, x, bias_opt)
    check_gating_top_k(x, k, k_group, group_count, group_select_mode, renorm, norm_type,
                       bias_opt)
    rows, experts = x.shape
    y = torch.empty((rows, k), dtype=x.dtype, device=x.device)
    idx = torch.empty((rows, k), dtype=torch.int32, device=x.device)
    out = torch.empty((rows, experts), dtype=torch.float32, device=x.device)
    xi, yi, ii, oi = (twin.inner(t) for t in (x, y, idx, out))
    bi = twin.inner(bias_opt) if bias_opt is not None else None

    def run() -> None:
        weights, ids, norm = gating_top_k_reference(
            xi, k, k_group, group_count, group_select_mode, renorm, norm_type,
            float(routed_scaling_factor), float(eps), bi)
        yi.copy_(weights)
        ii.copy_(ids)
        oi.copy_(norm) if out_flag else oi.zero_()
    twin.device().enqueue_aicore(op, run, index=twin.index_of(x), writes=(yi, ii, oi))
    return y, idx, out


def gating_top_k_meta(x, k, k_group, group_count, group_select_mode, renorm, norm_type,
                      out_flag, routed_scaling_factor, eps, bias_opt=None):
    """The adapter's output shapes: ``[rows, k]`` x's dtype, ``[rows, k]`` int32, ``[rows,
    E]`` float32."""
    rows, experts = x.shape
    return (x.new_empty((rows, k)), x.new_empty((rows, k), dtype=torch.int32),
            x.new_empty((rows, experts), dtype=torch.float32))


# ---- registration -------------------------------------------------------------------------
_library: torch.library.Library | None = None


def register() -> None:
    """Define ``torch.ops.npu.npu_moe_init_routing_v2``, ``npu_grouped_matmul`` and
    ``npu_moe_token_unpermute`` (once): the twin's kernels for PrivateUse1 and fake kernels
    for Dynamo."""
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("npu", "FRAGMENT")
    for schema, name, kernel, fake in (
            (INIT_ROUTING_V2_SCHEMA, "npu_moe_init_routing_v2", init_routing_v2,
             _init_routing_v2_fake),
            (GROUPED_MATMUL_SCHEMA, "npu_grouped_matmul", grouped_matmul, _grouped_matmul_fake),
            (TOKEN_UNPERMUTE_SCHEMA, "npu_moe_token_unpermute", token_unpermute,
             _token_unpermute_fake)):
        lib.define(schema)
        lib.impl(name, kernel, "PrivateUse1")
        torch.library.register_fake(f"npu::{name}", fake, lib=lib)
    _library = lib


def install(module) -> None:
    """Expose the MoE ops on the torch_npu stand-in ``module``."""
    register()
    module.npu_moe_init_routing_v2 = torch.ops.npu.npu_moe_init_routing_v2
    module.npu_grouped_matmul = torch.ops.npu.npu_grouped_matmul
    module.npu_moe_token_unpermute = torch.ops.npu.npu_moe_token_unpermute
