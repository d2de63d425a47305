"""The twin of vLLM-Ascend's C extension ``vllm_ascend.vllm_ascend_C`` (its torch library
``_C_ascend``), so that vLLM-Ascend runs with its custom ops ON, as on hardware.

How vLLM-Ascend decides (``vllm_ascend/utils.py`` ``enable_custom_op``, 0.23.0.post1 and
0.30.0rc2): custom ops are on unless ``VLLM_BATCH_INVARIANT`` is set or the device is an A5
(0.30: its hardware profile lacks ``RUNTIME_CUSTOM_OPS``), and ``import
vllm_ascend.vllm_ascend_C`` (then ``vllm_ascend.meta_registration``) succeeds; an ImportError
turns them off. The twin reports an Ascend 910B3 (an A2), so once `install` has put the
twin's module in place the import succeeds and ``_CUSTOM_OP_ENABLED`` is True, as on hardware.
0.30's ``AscendRMSNorm.forward_oot`` imports the module unconditionally for a residual norm.

What the import registers: every op that the release's ``csrc/torch_binding.cpp`` defines in
``TORCH_LIBRARY_EXPAND(CONCAT(_C, _ascend), ops)`` for the twin's SoC, with that file's
schema (`SCHEMAS`, made from the sdists by ``tools/vllm_ascend_c_schemas.py`` with
`read_torch_binding`; ``tests/twin/test_vllm_ascend_c.py`` checks them against the sdists).
The SoC decides the build (the release's ``CMakeLists.txt``: ``ASCEND_PLATFORM_310P`` for
``ascend310p*``, ``VLLM_ENABLE_ATB_AND_DIRECT_KERNELS`` unless ``ascend310p*`` or
``ascend950``, ``VLLM_ASCEND_ENABLE_SPARSE_KV_OFFLOAD`` (0.30) for ``ascend910_93*`` only):
`BUILD_DEFINES` is the 910B3's.

The ops that the paths the twin runs call get a body (`BODIES`): the checks of the real op,
fp32 reference numerics cast to the output dtype, queued as an AI Core task on the current
stream of the tensors' device (captured and replayed like any kernel), and a fake (Meta)
kernel with the shapes of the release's ``csrc/torch_binding_meta.cpp``, so that Dynamo can
trace it. Every other op exists with its schema and raises `NotInTwinError` when called, on
any device (never a silent no-op). Which ops vLLM-Ascend calls, per release and path:
``docs/npu-twin.md`` ("vLLM-Ascend's custom ops").
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import re
import sys
import types

import torch

from . import device as twin
from . import moe_ops
from .npu_module import NotInTwinError
from .vllm_ascend_c_schemas import SCHEMAS

#: the module vLLM-Ascend imports and the torch library its import registers
MODULE = "vllm_ascend.vllm_ascend_C"
NAMESPACE = "_C_ascend"
#: the preprocessor macros of the build for the twin's SoC (Ascend910B3, CMake SOC_VERSION
#: ascend910b3): the release's CMakeLists.txt defines VLLM_ENABLE_ATB_AND_DIRECT_KERNELS for
#: every SoC but ascend310p* and ascend950, and CANN_MEMCPY_BATCH_ASYNC /
#: CANN_DEVICE_ID_MAPPING when CANN's headers have the calls (CANN 9.1, which both releases
#: require, has them; neither guards an op definition); ASCEND_PLATFORM_310P and
#: VLLM_ASCEND_ENABLE_SPARSE_KV_OFFLOAD (ascend910_93* only) are not defined
BUILD_DEFINES = frozenset({"VLLM_ENABLE_ATB_AND_DIRECT_KERNELS", "CANN_MEMCPY_BATCH_ASYNC",
                           "CANN_DEVICE_ID_MAPPING"})


# ---- reading csrc/torch_binding.cpp ---------------------------------------------------------

def _condition(expression: str, defines: frozenset[str]) -> bool:
    """A ``#if`` / ``#elif`` condition made of ``defined(X)``, ``!``, ``&&``, ``||`` and
    parentheses (what torch_binding.cpp uses); anything else raises ValueError."""
    text = re.sub(r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)",
                  lambda m: str((m.group(1) or m.group(2)) in defines), expression)
    text = text.replace("||", " or ").replace("&&", " and ").replace("!", " not ")
    if set(re.findall(r"\w+", text)) - {"True", "False", "or", "and", "not"} or \
            not re.fullmatch(r"[\sA-Za-z()]*", text):
        raise ValueError(f"torch_binding.cpp: cannot evaluate #if {expression!r}")
    return bool(eval(text, {"__builtins__": {}}))  # only True/False/and/or/not/parentheses


def _preprocess(text: str, defines: frozenset[str]) -> str:
    """The source as the compiler sees it for `defines`: spliced lines, no comments, only the
    lines of taken conditional branches (macros are not expanded)."""
    text = text.replace("\\\n", "")
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    text = re.sub(r"//[^\n]*", "", text)
    kept, stack = [], []  # stack: [this branch taken, some branch of this #if taken]
    for line in text.splitlines():
        directive = re.match(r"\s*#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)", line)
        if directive is None:
            if all(taken for taken, _ in stack):
                kept.append(line)
            continue
        keyword, rest = directive.group(1), directive.group(2).strip()
        if keyword in ("ifdef", "ifndef", "if"):
            taken = (rest in defines if keyword == "ifdef" else rest not in defines
                     if keyword == "ifndef" else _condition(rest, defines))
            stack.append([taken, taken])
        elif keyword == "elif":
            taken = not stack[-1][1] and _condition(rest, defines)
            stack[-1] = [taken, stack[-1][1] or taken]
        elif keyword == "else":
            stack[-1] = [not stack[-1][1], True]
        else:
            stack.pop()
    return "\n".join(kept)


def read_torch_binding(text: str, defines: frozenset[str] = BUILD_DEFINES) -> dict[str, str]:
    """The ``_C_ascend`` op schemas a vLLM-Ascend release's ``csrc/torch_binding.cpp``
    defines when built with `defines`: op name -> schema (the ``ops.def`` string literals
    joined, C escapes undone, whitespace runs made one space), in definition order.

    Raises:
        ValueError: a ``#if`` it cannot evaluate, an ``ops.def`` that is not string literals
            (a macro), or an op defined twice.
    """
    source = _preprocess(text, defines)
    found: dict[str, str] = {}
    for block in re.finditer(r"TORCH_LIBRARY_EXPAND\(\s*CONCAT\(\s*_C\s*,\s*_ascend\s*\)\s*,"
                             r"\s*ops\s*\)\s*\{", source):
        end, depth = block.end(), 1
        while depth:
            depth += {"{": 1, "}": -1}.get(source[end], 0)
            end += 1
        body = source[block.end():end]
        definitions = list(re.finditer(r"ops\.def\(\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+)\)", body))
        if len(definitions) != body.count("ops.def("):
            raise ValueError("torch_binding.cpp: an ops.def(...) that is not string literals")
        for match in definitions:
            literal = "".join(re.findall(r"\"((?:[^\"\\]|\\.)*)\"", match.group(1)))
            schema = " ".join(literal.replace('\\"', '"').replace("\\\\", "\\").split())
            name = schema.split("(", 1)[0].strip()
            if name in found:
                raise ValueError(f"torch_binding.cpp: {name} is defined twice")
            found[name] = schema
    return found


# ---- the ops with a body --------------------------------------------------------------------

#: aclnnAddRmsNormBias's dtypes (``csrc/moe/add_rms_norm_bias/op_host/add_rms_norm_bias_def.cpp``
#: of both releases: x1, x2, gamma, beta, y and x one of float16 / float / bfloat16 in each
#: combination, all the same; rstd float)
_NORM_DTYPES = (torch.float16, torch.float32, torch.bfloat16)


def _on_one_device(op: str, tensors: dict) -> int:
    """The device index of `tensors` (None values skipped): each must be an npu tensor, all
    on one device (a host tensor handed to a kernel is a host pointer on the device)."""
    indices = set()
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.device.type != "npu":
            where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
            raise twin.HostPointerError(f"{op}: {name} must be an npu tensor, got {where}")
        indices.add(t.device.index)
    if len(indices) > 1:
        raise RuntimeError(f"{op}: Expected all tensors to be on the same device, but found "
                           f"at least two devices, npu:{min(indices)} and npu:{max(indices)}!")
    return indices.pop()


def _rstd_shape(x1: torch.Tensor, gamma: torch.Tensor) -> list[int]:
    """``npu_add_rms_norm_bias``'s rstd shape (``add_rms_norm_bias_torch_adpt.h`` and
    ``torch_binding_meta.cpp``): x1's leading dims, then a 1 for each of gamma's dims."""
    lead = x1.dim() - gamma.dim()
    return list(x1.shape[:lead]) + [1] * gamma.dim() if lead > 0 else [1] * x1.dim()


def _check_add_rms_norm_bias(x1, x2, gamma, beta) -> None:
    """aclnnAddRmsNormBias's rules (``add_rms_norm_bias_def.cpp``: one dtype of `_NORM_DTYPES`
    for all; x2 the shape of x1, gamma (and beta) the shape of x1's trailing dims)."""
    op = "_C_ascend::npu_add_rms_norm_bias"
    named = {"x1": x1, "x2": x2, "gamma": gamma, "beta": beta}
    for name, t in named.items():
        if t is not None and t.dtype not in _NORM_DTYPES:
            raise RuntimeError(f"{op}: {name} is {t.dtype}; aclnnAddRmsNormBias takes float16, "
                               "float32 or bfloat16")
    dtypes = {name: t.dtype for name, t in named.items() if t is not None}
    if len(set(dtypes.values())) != 1:
        raise RuntimeError(f"{op}: x1, x2, gamma and beta must have one dtype, got {dtypes}")
    if x2.shape != x1.shape:
        raise RuntimeError(f"{op}: x2 {list(x2.shape)} must have the shape of x1 "
                           f"{list(x1.shape)}")
    if gamma.dim() > x1.dim() or x1.shape[x1.dim() - gamma.dim():] != gamma.shape:
        raise RuntimeError(f"{op}: gamma {list(gamma.shape)} must be x1's trailing dims "
                           f"({list(x1.shape)})")
    if beta is not None and beta.shape != gamma.shape:
        raise RuntimeError(f"{op}: beta {list(beta.shape)} must have gamma's shape "
                           f"{list(gamma.shape)}")


def add_rms_norm_bias_reference(x1, x2, gamma, beta, epsilon: float):
    """``npu_add_rms_norm_bias``'s result in float32 from host tensors: ``x = x1 + x2``,
    ``rstd = 1 / sqrt(mean(x**2 over gamma's dims) + epsilon)``, ``y = x * rstd * gamma +
    beta``; returns (y, rstd, x) in float32, rstd of `_rstd_shape`."""
    x = x1.float() + x2.float()
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = x * rstd * gamma.float()
    if beta is not None:
        y = y + beta.float()
    return y, rstd.reshape(_rstd_shape(x1, gamma)), x


def npu_add_rms_norm_bias(x1, x2, gamma, beta=None, epsilon=1e-6):
    """``_C_ascend::npu_add_rms_norm_bias(Tensor x1, Tensor x2, Tensor gamma, Tensor?
    beta=None, float epsilon=1e-6) -> (Tensor y, Tensor rstd, Tensor x)`` on the NPU: the
    residual add and RMSNorm of vLLM-Ascend's ``AscendRMSNorm.forward_oot`` (x1 the hidden
    states ``[T, H]``, x2 the residual ``[T, H]``, gamma ``[H]``, all float16 / float32 /
    bfloat16): y and x in x1's dtype and shape, rstd float32 `_rstd_shape`."""
    op = "_C_ascend::npu_add_rms_norm_bias"
    index = _on_one_device(op, {"x1": x1, "x2": x2, "gamma": gamma, "beta": beta})
    _check_add_rms_norm_bias(x1, x2, gamma, beta)
    y = torch.empty(x1.shape, dtype=x1.dtype, device=x1.device)
    rstd = torch.empty(_rstd_shape(x1, gamma), dtype=torch.float32, device=x1.device)
    x = torch.empty(x1.shape, dtype=x1.dtype, device=x1.device)
    inputs = [twin.inner(t) for t in (x1, x2, gamma, beta)]
    outputs = [twin.inner(t) for t in (y, rstd, x)]
    eps = float(epsilon)

    def run() -> None:
        for out, value in zip(outputs, add_rms_norm_bias_reference(*inputs, eps), strict=True):
            out.copy_(value.to(out.dtype))
    twin.device().enqueue_aicore(op, run, index=index, writes=tuple(outputs))
    return y, rstd, x


def npu_add_rms_norm_bias_meta(x1, x2, gamma, beta=None, epsilon=1e-6):
    """The fake kernel (``torch_binding_meta.cpp`` ``npu_add_rms_norm_bias_meta``)."""
    return (x1.new_empty(x1.shape), x1.new_empty(_rstd_shape(x1, gamma), dtype=torch.float32),
            x1.new_empty(x1.shape))


# ---- LoRA: vLLM-Ascend's punica ops (vllm_ascend/lora/lora_ops.py) -------------------------
# The wrappers of both releases' torch_binding.cpp (bgmv_shrink, bgmv_expand, sgmv_shrink,
# sgmv_expand: identical in 0.23.0.post1 and 0.30.0rc2) check what `_check_punica` checks, with
# their messages; the kernels (csrc/kernels/{b,s}gmv_{shrink,expand}.cpp) fix the rest: shrink
# reads x and weight in x's dtype and writes y as float (Y_T = float), expand reads x as float
# (X_T = float) and weight in y's dtype, and adds into y in place; every index is int64; a
# token whose LoRA index is negative is skipped (its y row is left as it was); sgmv finds a
# token's sequence by walking seq_len (a token past their sum has index -1).

def _check_punica(op: str, x, weight, y, *, shrink: bool, slice_offset: int = 0,
                  slice_size: int = 0) -> None:
    """The TORCH_CHECKs of the punica wrappers, then the kernels' dtype and layout needs."""
    scalar = x.dtype if shrink else y.dtype
    if scalar not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"{op}: only support half and bf16")
    if x.dim() != 2:
        raise RuntimeError(f"{op}: x should be [batch_size, hidden_in]")
    if weight.dim() not in (3, 4):
        raise RuntimeError(f"{op}: weight should be [num_loras, hidden_out, hidden_in] or "
                           "[num_loras, 1, hidden_out, hidden_in]")
    if y.dim() != 2:
        raise RuntimeError(f"{op}: y should be [batch_size, hidden_out]")
    if shrink and x.size(1) <= y.size(1):
        raise RuntimeError(f"{op}: hidden in should be greater than hidden out")
    if not shrink:
        if x.size(1) > slice_size:
            raise RuntimeError(f"{op}: hidden in should be smaller than hidden out")
        if slice_offset < 0:
            raise RuntimeError(f"{op}: slice offset should be no smaller than 0")
        if slice_size + slice_offset > y.size(1):
            raise RuntimeError(f"{op}: slice_size + slice_offset should be smaller than the "
                               "second dimension of y")
    # the kernels' types and the weight layout they index (beyond the wrappers' checks: a
    # mismatch there is garbage on the device, refused here)
    want = {"x": scalar if shrink else torch.float32, "weight": scalar,
            "y": torch.float32 if shrink else scalar}
    for name, t in (("x", x), ("weight", weight), ("y", y)):
        if t.dtype != want[name]:
            raise RuntimeError(f"{op}: the kernel reads {name} as {want[name]}, got {t.dtype}")
    rows, cols = (y.size(1), x.size(1)) if shrink else (slice_size, x.size(1))
    if tuple(weight.shape[-2:]) != (rows, cols) or (weight.dim() == 4 and weight.size(1) != 1):
        raise RuntimeError(f"{op}: weight {list(weight.shape)} must be [num_loras, {rows}, "
                           f"{cols}] (or with a 1 as dim 1)")
    for name, t in (("x", x), ("weight", weight), ("y", y)):
        if not t.is_contiguous():
            raise RuntimeError(f"{op}: {name} must be contiguous (the kernel indexes it densely)")


def _check_indices(op: str, **indices) -> None:
    for name, t in indices.items():
        if t.dtype != torch.int64 or t.dim() != 1:
            raise RuntimeError(f"{op}: {name} must be a 1-d int64 tensor (the kernel reads "
                               f"int64), got {t.dtype} {list(t.shape)}")


def token_lora_indices(num_tokens: int, lora_indices: torch.Tensor,
                       seq_len: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's LoRA index (host int64 ``[num_tokens]``): bgmv's ``indices`` as they are;
    sgmv's ``lora_indices`` repeated ``seq_len`` times, -1 past their sum (the kernels'
    ``CopyInIndex``)."""
    if seq_len is None:
        return lora_indices.to(torch.int64)
    out = torch.full((num_tokens,), -1, dtype=torch.int64)
    start = 0
    for index, length in zip(lora_indices.tolist(), seq_len.tolist(), strict=True):
        stop = min(num_tokens, start + max(int(length), 0))
        out[start:stop] = index
        start = stop
    return out


def punica_reference(x, weight, y, token_indices, *, shrink: bool, scale: float = 1.0,
                     slice_offset: int = 0, slice_size: int = 0) -> torch.Tensor:
    """The punica kernels' result from host tensors in float32: a new y (float32) with each
    token of a non-negative LoRA index l rewritten: shrink ``y[t] = scale * x[t] @ W[l].T``,
    expand ``y[t, offset:offset + size] += x[t] @ W[l].T``.

    Raises:
        twin.TwinError: an index past the weights (the kernel would read out of bounds: an
            AI Core exception on the device).
    """
    w = weight.reshape(weight.size(0), *weight.shape[-2:]).float()
    out = y.float().clone()
    for t, lora in enumerate(token_indices.tolist()):
        if lora < 0:
            continue
        if lora >= w.size(0):
            raise twin.TwinError(f"a punica kernel read LoRA {lora} of {w.size(0)}: out of "
                                 "bounds on the device (an AI Core exception)")
        z = w[lora] @ x[t].float()
        if shrink:
            out[t] = z * scale
        else:
            out[t, slice_offset:slice_offset + slice_size] += z
    return out


def _queue_punica(op: str, x, weight, y, lora_indices, seq_len, *, shrink: bool,
                  scale: float = 1.0, slice_offset: int = 0, slice_size: int = 0) -> None:
    tensors = {"x": x, "weight": weight, "y": y, "indices": lora_indices, "seq_len": seq_len}
    index = _on_one_device(op, tensors)
    _check_punica(op, x, weight, y, shrink=shrink, slice_offset=slice_offset,
                  slice_size=slice_size)
    if seq_len is None:
        _check_indices(op, indices=lora_indices)
        if not x.size(0) == y.size(0) == lora_indices.size(0):
            raise RuntimeError(f"{op}: the first dimension of x, y, indices should be same")
    else:
        _check_indices(op, lora_indices=lora_indices, seq_len=seq_len)
        if x.size(0) != y.size(0) or lora_indices.size(0) != seq_len.size(0):
            raise RuntimeError(f"{op}: x and y need one row per token, lora_indices and "
                               "seq_len one entry per sequence")
    x_i, w_i, y_i, ind_i = (twin.inner(t) for t in (x, weight, y, lora_indices))
    seq_i = None if seq_len is None else twin.inner(seq_len)

    def run() -> None:
        tokens = token_lora_indices(x_i.size(0), ind_i, seq_i)
        y_i.copy_(punica_reference(x_i, w_i, y_i, tokens, shrink=shrink, scale=scale,
                                   slice_offset=slice_offset, slice_size=slice_size))
    twin.device().enqueue_aicore(op, run, index=index, writes=(y_i,))


def bgmv_shrink(x, weight, indices, y, scale):
    """``_C_ascend::bgmv_shrink(Tensor! x, Tensor! weight, Tensor! indices, Tensor! y, float
    scale) -> ()``: LoRA A for one token a row (decode): x ``[B, H_in]`` float16/bfloat16,
    weight ``[L, R, H_in]`` in x's dtype, indices int64 ``[B]``, y float32 ``[B, R]``
    overwritten with ``scale * x @ W[index].T`` (rows of a negative index untouched)."""
    _queue_punica("_C_ascend::bgmv_shrink", x, weight, y, indices, None, shrink=True,
                  scale=float(scale))


def bgmv_expand(x, weight, indices, y, slice_offset, slice_size):
    """``_C_ascend::bgmv_expand(Tensor! x, Tensor! weight, Tensor! indices, Tensor! y, int
    slice_offset, int slice_size) -> Tensor``: LoRA B, one token a row: x float32 ``[B, R]``,
    weight ``[L, slice_size, R]`` in y's dtype, y float16/bfloat16 ``[B, H_out]``, ``y[:,
    offset:offset + size] += x @ W[index].T`` in place; returns y."""
    _queue_punica("_C_ascend::bgmv_expand", x, weight, y, indices, None, shrink=False,
                  slice_offset=int(slice_offset), slice_size=int(slice_size))
    return y


def sgmv_shrink(x, weight, lora_indices, seq_len, y, scale):
    """``_C_ascend::sgmv_shrink(Tensor! x, Tensor! weight, Tensor! lora_indices, Tensor!
    seq_len, Tensor! y, float scale) -> ()``: `bgmv_shrink` with one LoRA index per sequence
    (``lora_indices`` and ``seq_len`` int64 ``[num_seqs]``, the tokens in sequence order)."""
    _queue_punica("_C_ascend::sgmv_shrink", x, weight, y, lora_indices, seq_len, shrink=True,
                  scale=float(scale))


def sgmv_expand(x, weight, lora_indices, seq_len, y, slice_offset, slice_size):
    """``_C_ascend::sgmv_expand(Tensor! x, Tensor! weight, Tensor! lora_indices, Tensor!
    seq_len, Tensor! y, int slice_offset, int slice_size) -> Tensor``: `bgmv_expand` with one
    LoRA index per sequence; returns y."""
    _queue_punica("_C_ascend::sgmv_expand", x, weight, y, lora_indices, seq_len,
                  shrink=False, slice_offset=int(slice_offset), slice_size=int(slice_size))
    return y


def _shrink_meta(*args) -> None:
    return None


def _bgmv_expand_meta(x, weight, indices, y, slice_offset, slice_size):
    # torch_binding_meta.cpp bgmv_expand_meta (and meta_registration.py): empty_like(y)
    return torch.empty_like(y)


def _sgmv_expand_meta(x, weight, lora_indices, seq_len, y, slice_offset, slice_size):
    return torch.empty_like(y)


# ---- speculative decoding: npu_copy_and_expand_eagle_inputs -----------------------------------
# vllm_ascend/spec_decode/llm_base_proposer.py (both releases) calls it when the drafter needs
# extra input slots (parallel drafting). The wrapper (torch_binding.cpp) allocates zeroed
# int32 outputs (int8 masks) and runs aclnnCopyAndExpandEagleInputs, whose OpDef takes int32
# inputs only (csrc/moe/copy_and_expand_eagle_inputs/op_host/..._def.cpp); the body follows
# the AscendC kernel (op_kernel/copy_and_expand_eagle_inputs.cpp), identical in both
# releases, quirks included (see `copy_and_expand_eagle_inputs_reference`).

_EAGLE_OP = "_C_ascend::npu_copy_and_expand_eagle_inputs"


def copy_and_expand_eagle_inputs_reference(target_token_ids, target_positions, next_token_ids,
                                           query_start_loc, query_end_loc,
                                           padding_token_id: int,
                                           parallel_drafting_token_id: int,
                                           num_padding_slots_per_request: int,
                                           shift_input_ids: bool, total_draft_tokens: int):
    """The kernel's six outputs from host int32 tensors: per request r with ``qs, nqs =
    query_start_loc[r:r + 2]`` and ``qe = query_end_loc[r]``, ``valid = qe - qs + 1`` tokens
    (``qe - qs`` and read from ``qs + 1`` when ``shift_input_ids``), then the bonus token
    ``next_token_ids[r]``, ``slots - 1`` parallel-drafting tokens (masked) and ``nqs - qe - 1``
    rejected slots (padding, position 0), written from ``qs + r * slots`` (``r * (slots - 1)``
    when shifting); positions count on from ``target_positions[qs]``; the new-token indices
    are ``r * slots + k -> start + valid + k``; when shifting, ``hidden_state_mapping[qs + j] =
    start + j`` for the request's input tokens, and a request whose ``nqs == qe`` (not the
    last) writes one slot less, as the kernel does.

    Raises:
        twin.TwinError: a write or read outside its tensor (out of bounds on the device).
    """
    ids, pos, bonus = (t.tolist() for t in (target_token_ids, target_positions, next_token_ids))
    starts, ends = query_start_loc.tolist(), query_end_loc.tolist()
    total_in, slots, num_reqs = len(ids), int(num_padding_slots_per_request), len(starts) - 1
    out = {name: [0] * size for name, size in (
        ("ids", total_draft_tokens), ("pos", total_draft_tokens),
        ("rej", total_draft_tokens), ("msk", total_draft_tokens),
        ("nti", num_reqs * slots), ("hsm", total_in))}

    def oob(what: str) -> twin.TwinError:
        return twin.TwinError(f"{_EAGLE_OP}: {what} is out of bounds on the device (an AI Core "
                              "exception)")

    def write(name: str, at: int, values: list[int]) -> None:
        if values and (at < 0 or at + len(values) > len(out[name])):
            raise oob(f"writing {name}[{at}:{at + len(values)}] of {len(out[name])}")
        out[name][at:at + len(values)] = values

    for r in range(num_reqs):
        qs, nqs, qe = starts[r], starts[r + 1], ends[r]
        rejected, n_in = max(nqs - qe - 1, 0), nqs - qs
        if not 0 <= qs < total_in or r >= len(bonus):
            raise oob(f"request {r}'s first token {qs} or bonus token")
        if shift_input_ids:
            valid, start = max(qe - qs, 0), qs + r * (slots - 1)
            count = max(min(valid, total_in - (qs + 1)), 0)
            source = [ids[qs + 1 + min(j, count - 1)] if count else 0 for j in range(valid)]
        else:
            valid, start = max(qe - qs + 1, 0), qs + r * slots
            if valid and n_in <= 0:
                raise oob(f"request {r}'s input tokens (none for {valid} valid)")
            source = [ids[qs + min(j, n_in - 1)] for j in range(valid)]
        first = pos[qs]
        length = valid + slots + rejected
        local = {name: [0] * max(length, valid + 1) for name in ("ids", "pos", "rej", "msk")}
        for j in range(valid):
            local["ids"][j], local["pos"][j] = source[j], first + j
        local["ids"][valid], local["pos"][valid] = bonus[r], first + valid
        for k in range(1, slots):
            j = valid + k
            local["ids"][j], local["pos"][j], local["msk"][j] = parallel_drafting_token_id, \
                first + j, 1
        for k in range(rejected):
            j = valid + slots + k
            local["ids"][j], local["pos"][j], local["rej"][j], local["msk"][j] = \
                padding_token_id, 0, 1, 0
        count = length - 1 if shift_input_ids and nqs == qe and r + 1 < num_reqs else length
        for name in ("ids", "pos", "rej", "msk"):
            write(name, start, local[name][:count])
        write("nti", r * slots, [start + valid + k for k in range(slots)])
        if shift_input_ids:
            write("hsm", qs, [start + j for j in range(max(n_in, 0))])
    int32, int8 = torch.int32, torch.int8
    return tuple(torch.tensor(out[name], dtype=dtype) for name, dtype in (
        ("ids", int32), ("pos", int32), ("rej", int8), ("msk", int8), ("nti", int32),
        ("hsm", int32)))


def _eagle_shapes(target_token_ids, query_start_loc, num_padding_slots_per_request,
                  total_draft_tokens):
    num_reqs = query_start_loc.size(0) - 1
    return ([total_draft_tokens], [total_draft_tokens], [total_draft_tokens],
            [total_draft_tokens], [num_reqs * num_padding_slots_per_request],
            [target_token_ids.size(0)])


def npu_copy_and_expand_eagle_inputs(target_token_ids, target_positions, next_token_ids,
                                     query_start_loc, query_end_loc, padding_token_id,
                                     parallel_drafting_token_id, num_padding_slots_per_request,
                                     shift_input_ids, total_draft_tokens):
    """``_C_ascend::npu_copy_and_expand_eagle_inputs(...) -> (out_input_ids, out_positions,
    out_is_rejected_token_mask, out_is_masked_token_mask, out_new_token_indices,
    out_hidden_state_mapping)``: the drafter's inputs with extra slots per request. Inputs
    int32 1-d npu tensors (``target_token_ids``, ``target_positions`` ``[T]``,
    ``next_token_ids`` ``[R]``, ``query_start_loc`` ``[R + 1]``, ``query_end_loc`` ``[R]``);
    outputs int32 ``[total_draft_tokens]`` (masks int8), ``[R * slots]`` and ``[T]``,
    zero where the kernel writes nothing (`copy_and_expand_eagle_inputs_reference`)."""
    named = {"target_token_ids": target_token_ids, "target_positions": target_positions,
             "next_token_ids": next_token_ids, "query_start_loc": query_start_loc,
             "query_end_loc": query_end_loc}
    index = _on_one_device(_EAGLE_OP, named)
    for name, t in named.items():
        if t.dtype != torch.int32:
            raise RuntimeError(f"{_EAGLE_OP}: {name} must be int32 (aclnnCopyAndExpandEagleInputs"
                               f"'s OpDef), got {t.dtype}")
        if t.dim() != 1:
            raise NotInTwinError(f"{_EAGLE_OP}: the twin models 1-d {name}, got "
                                 f"{list(t.shape)}")
    num_reqs = query_start_loc.size(0) - 1
    if num_reqs < 0 or query_end_loc.size(0) != num_reqs or next_token_ids.size(0) < num_reqs:
        raise RuntimeError(f"{_EAGLE_OP}: query_start_loc [R + 1], query_end_loc [R] and "
                           f"next_token_ids [>= R] disagree: {query_start_loc.size(0)}, "
                           f"{query_end_loc.size(0)}, {next_token_ids.size(0)}")
    if target_positions.size(0) != target_token_ids.size(0):
        raise RuntimeError(f"{_EAGLE_OP}: target_positions must have one entry per target token")
    if total_draft_tokens < 0 or num_padding_slots_per_request < 0:
        raise RuntimeError(f"{_EAGLE_OP}: total_draft_tokens and num_padding_slots_per_request "
                           "must not be negative")
    shapes = _eagle_shapes(target_token_ids, query_start_loc, int(num_padding_slots_per_request),
                           int(total_draft_tokens))
    dtypes = (torch.int32, torch.int32, torch.int8, torch.int8, torch.int32, torch.int32)
    outputs = tuple(torch.zeros(shape, dtype=dtype, device=target_token_ids.device)
                    for shape, dtype in zip(shapes, dtypes, strict=True))
    inputs = [twin.inner(t) for t in named.values()]
    outs_i = [twin.inner(t) for t in outputs]
    scalars = (int(padding_token_id), int(parallel_drafting_token_id),
               int(num_padding_slots_per_request), bool(shift_input_ids),
               int(total_draft_tokens))

    def run() -> None:
        for out, value in zip(outs_i, copy_and_expand_eagle_inputs_reference(*inputs, *scalars),
                              strict=True):
            out.copy_(value)
    twin.device().enqueue_aicore(_EAGLE_OP, run, index=index, writes=tuple(outs_i))
    return outputs


def npu_copy_and_expand_eagle_inputs_meta(target_token_ids, target_positions, next_token_ids,
                                          query_start_loc, query_end_loc, padding_token_id,
                                          parallel_drafting_token_id,
                                          num_padding_slots_per_request, shift_input_ids,
                                          total_draft_tokens):
    """``torch_binding_meta.cpp``: target_token_ids' dtype for the ids, positions and
    indices, int8 for the masks."""
    shapes = _eagle_shapes(target_token_ids, query_start_loc, num_padding_slots_per_request,
                           total_draft_tokens)
    dtypes = (None, None, torch.int8, torch.int8, None, None)
    return tuple(target_token_ids.new_empty(shape, dtype=dtype or target_token_ids.dtype)
                 for shape, dtype in zip(shapes, dtypes, strict=True))


#: op name -> (NPU kernel, fake kernel): the ops given a body, in every release defining them.
#: The shrinks' fakes return nothing (their schema returns ()); the releases register no
#: Meta kernel for them (torch_binding_meta.cpp), the twin does so that a trace reaches them
BODIES = {
    "npu_add_rms_norm_bias": (npu_add_rms_norm_bias, npu_add_rms_norm_bias_meta),
    "bgmv_shrink": (bgmv_shrink, _shrink_meta),
    "bgmv_expand": (bgmv_expand, _bgmv_expand_meta),
    "sgmv_shrink": (sgmv_shrink, _shrink_meta),
    "sgmv_expand": (sgmv_expand, _sgmv_expand_meta),
    "npu_copy_and_expand_eagle_inputs": (npu_copy_and_expand_eagle_inputs,
                                         npu_copy_and_expand_eagle_inputs_meta),
    # the MoE router of both releases (A2/A3 ``DeviceOperator.moe_gating_top_k``)
    "moe_gating_top_k": (moe_ops.gating_top_k, moe_ops.gating_top_k_meta),
    # 0.23.0.post1's AllGather dispatcher (A2/A3 ``DeviceOperator.npu_moe_init_routing``)
    "npu_moe_init_routing_custom": (moe_ops.init_routing_custom,
                                    moe_ops.init_routing_custom_meta),
}
#: ops of `BODIES` only some releases define (0.30.0rc2's ``csrc/torch_binding.cpp`` no longer
#: has ``npu_moe_init_routing_custom``: its dispatcher calls torch_npu's v2): op -> releases
RELEASE_ONLY_BODIES = {"npu_moe_init_routing_custom": ("0.23.0.post1",)}


# ---- registration and the import -------------------------------------------------------------

def _not_in_twin(name: str):
    def call(*args, **kwargs):
        raise NotInTwinError(f"torch.ops._C_ascend.{name} (vLLM-Ascend's vllm_ascend_C) is not "
                             "implemented by the NPU twin (only the ops the paths it runs call "
                             "are); add it to pyruntime/npu_twin/vllm_ascend_c.py with the "
                             "rules of the real one")
    call.__name__ = call.__qualname__ = name
    return call


_library: torch.library.Library | None = None
_registered: str | None = None


def register(release: str) -> None:
    """Define every ``_C_ascend`` op of vLLM-Ascend `release` (a key of `SCHEMAS`) with its
    schema: the ops of `BODIES` with their NPU and fake kernels, the rest raising
    `NotInTwinError` on every device (once per process).

    Raises:
        ImportError: `release` is not one the twin has schemas for, or the process already
            registered another release's ops.
    """
    global _library, _registered
    if _registered is not None:
        if _registered != release:
            raise ImportError(f"{MODULE}: the NPU twin registered vLLM-Ascend {_registered}'s "
                              f"_C_ascend ops in this process; cannot register {release}'s")
        return
    schemas = SCHEMAS.get(release)
    if schemas is None:
        raise ImportError(f"{MODULE}: the NPU twin has the _C_ascend schemas of vLLM-Ascend "
                          f"{', '.join(sorted(SCHEMAS))}, not {release} (add them with "
                          "tools/vllm_ascend_c_schemas.py)")
    library = torch.library.Library(NAMESPACE, "DEF")
    for name, schema in schemas.items():
        library.define(schema)
        if name in BODIES:
            kernel, fake = BODIES[name]
            library.impl(name, kernel, "PrivateUse1")
            library.impl(name, fake, "Meta")
        else:  # PrivateUse1 named too: the twin dispatches a custom op to that key
            library.impl(name, _not_in_twin(name), "PrivateUse1")
            library.impl(name, _not_in_twin(name), "CompositeExplicitAutograd")
    _library, _registered = library, release


def _release() -> str:
    """The vLLM-Ascend release being imported (its ``vllm_ascend/_version.py``, which its
    sdist and every install carry)."""
    try:
        return importlib.import_module("vllm_ascend._version").version
    except (ImportError, AttributeError) as exc:
        raise ImportError(f"{MODULE}: the NPU twin cannot tell which vLLM-Ascend release this "
                          f"is (vllm_ascend._version: {exc})") from exc


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # a plain module

    def exec_module(self, module: types.ModuleType) -> None:
        register(_release())
        module.__file__ = __file__


class _Finder(importlib.abc.MetaPathFinder):
    """Finds `MODULE` (and nothing else) before any other finder: on the twin the extension is
    this module's, whether or not a compiled one is installed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), origin="npu-twin")


_finder = _Finder()


def install() -> None:
    """Make ``import vllm_ascend.vllm_ascend_C`` the twin's (idempotent)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
