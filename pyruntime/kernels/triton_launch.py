"""Launch the Triton AI Core kernels (`triton_attention`) on CPU tensors or on an NPU.

One launch runs the whole fixed grid: :func:`launch_attention` starts ``params.num_cores``
programs (one per AI Core, each walking its range of the tiling), :func:`launch_combine`
starts the combine grid. On CPU tensors the kernels run under Triton's interpreter (upstream
``triton``; this module sets ``TRITON_INTERPRET=1`` before it imports the kernels, because
``@triton.jit`` reads it at import); on ``npu`` tensors they run as compiled by Triton-Ascend,
which launches on the current stream, so a launch made inside ``torch.npu.graph`` capture is
recorded in the graph (vLLM-Ascend runs its Triton kernels inside full graphs this way). One
process uses one mode: upstream ``triton`` and ``triton-ascend`` both install the module
``triton``.

What Triton-Ascend's launcher does per launch (``triton/backends/ascend/driver.py`` of the
3.2.0 wheel; check on hardware under capture):

- the stream is ``driver.active.get_current_stream()``, i.e.
  ``torch_npu._C._npu_getCurrentRawStream(device)``: the capture stream inside a capture;
- a kernel whose metadata has ``workspace_size > 0`` gets ``at::empty(workspace_size *
  grid)`` bytes on the device at each launch, a torch allocation (from the graph's pool
  under capture). BiShengIR's ``infer_workspace_shape_function`` gives 74,016 bytes per
  program for the attention kernel at head_dim 128 with the default tiles, 24,672 with the
  decode tiles (``tools/ascend_compile.py [--q-tile 1]``);
- a kernel with ``lock_num > 0`` also gets a sync-block-lock buffer initialised by a
  synchronous ``rtMemcpy`` at each launch, which a capture cannot contain. Our HIVM modules
  take the lock argument but have no lock-count function and synchronise cube and vector
  with ``sync_block_set``/``wait`` only, so we expect ``lock_num == 0``; only the binary's
  metadata (after ``hivmc``) can confirm it.

Example (CPU, interpreted)::

    import torch
    from pyruntime import tiling
    from pyruntime.kernels import reference_attention as ra, triton_launch

    params = tiling.TilingParams(num_q_heads=8, num_kv_heads=2, head_dim=32, block_size=16,
                                 max_batch=2, max_tokens=4, max_blocks_per_req=4, num_cores=3)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    kv = torch.tensor([40, 20], dtype=torch.int32)
    plan = torch.from_numpy(tiling.plan(params, cu.numpy(), kv.numpy()).buffer)
    q = torch.randn(4, 8, 32, dtype=torch.float16)
    k, v = torch.randn(8, 16, 2, 32).half(), torch.randn(8, 16, 2, 32).half()
    bt = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    out = torch.empty_like(q)
    po, pl = ra.partial_buffers(params)
    epoch = torch.zeros(1, dtype=torch.int32)                    # plan()'s default epoch
    status = triton_launch.launch_attention(params, tiling_in=plan, step_epoch=epoch, query=q,
        key_cache=k, value_cache=v, block_table=bt, cu_seqlens_q=cu, seqlens_kv=kv, out=out,
        partial_out=po, partial_lse=pl, scale=32**-0.5, causal=True)
    triton_launch.launch_combine(params, tiling_in=plan, step_epoch=epoch, cu_seqlens_q=cu,
                                 out=out, partial_out=po, partial_lse=pl, causal=True)
    assert status.tolist() == [0, 0, 0]        # rows 3.. of out are zero
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
import threading
from typing import Any

import torch

from pyruntime import tiling as _tiling
from pyruntime.kernels import kv_quant as _kv_quant
from pyruntime.kernels import sliding_window as _sliding_window
from pyruntime.kernels import soft_cap as _soft_cap
from pyruntime.kernels.reference_attention import SINK_DTYPES

_KERNELS = "pyruntime.kernels.triton_attention"
_lib = _tiling.lib

#: Storage dtypes the kernels accept (fp32 accumulation always).
DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: Status a program reports when the tiling was planned for another step than ``step_epoch``
#: (it then does nothing, and the combine zeroes every row). The C reference has no epoch
#: (the CPU body checks it in Python, ``step.is_stale``), so this code is the Triton kernels'
#: own: 64, above the tiling's codes (0..10) and the C reference's (32 and up, which grow:
#: ``attention_ref.h``); a test checks that no C code equals it.
E_STALE: int = 64


#: Interpreted launches run one at a time: Triton's interpreter patches triton.language's
#: functions process-wide while a kernel runs and restores them after
#: (``triton/runtime/interpreter.py``, ``_LangPatchScope``), so two overlapping launches (two
#: CPU-backend streams) could restore each other's patches mid-kernel.
_INTERPRETER_LOCK = threading.Lock()


def _launch_lock(device: torch.device):
    return _INTERPRETER_LOCK if device.type == "cpu" else contextlib.nullcontext()


class TritonUnavailableError(RuntimeError):
    """Triton is not installed, or the kernels were built for the other mode in this process."""


def available() -> str | None:
    """None when ``triton`` is installed, else the reason it is not (imports nothing)."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed; pip install 'aicpu-tiling[test]'"
    return None


def kernels(*, interpret: bool):
    """The kernel module, imported in the requested mode (interpreted for CPU tensors).

    Raises:
        TritonUnavailableError: triton is missing, or the module was already imported in the
            other mode in this process.
    """
    reason = available()
    if reason is not None:
        raise TritonUnavailableError(reason)
    if interpret and "triton" not in sys.modules:
        # @triton.jit reads TRITON_INTERPRET when it runs, at import: for our kernels and for
        # triton.language's own jit helpers (tl.cdiv, ...), so it must be set before triton
        # is first imported
        os.environ["TRITON_INTERPRET"] = "1"
    module = importlib.import_module(_KERNELS)
    standard = importlib.import_module("triton.language.standard")
    is_interpreted = all(type(fn).__name__ == "InterpretedFunction"
                         for fn in (module.paged_attention_kernel, standard.cdiv))
    if is_interpreted != interpret:
        have = "interpreted" if is_interpreted else "compiled"
        raise TritonUnavailableError(
            f"triton was imported {have} in this process; CPU tensors need the interpreter: "
            "set TRITON_INTERPRET=1 before anything imports triton (torch imports it too, "
            "e.g. FakeTensorMode); device tensors need it unset")
    return module


def _layout() -> dict[str, int]:
    """The tiling ABI's indices and codes, from `pyruntime.tiling` (never typed twice)."""
    names = {
        "MAGIC": "AICPU_TILING_MAGIC", "VERSION": "AICPU_TILING_VERSION",
        "OK": "AICPU_TILING_OK", "E_TILING": "AICPU_ATTENTION_E_TILING",
        "E_BLOCK_ID": "AICPU_ATTENTION_E_BLOCK_ID",
        "HDR_MAGIC": "AICPU_TILING_HDR_MAGIC", "HDR_VERSION": "AICPU_TILING_HDR_VERSION",
        "HDR_STATUS": "AICPU_TILING_HDR_STATUS", "HDR_BATCH": "AICPU_TILING_HDR_BATCH",
        "HDR_NUM_TOKENS": "AICPU_TILING_HDR_NUM_TOKENS",
        "HDR_NUM_CORES": "AICPU_TILING_HDR_NUM_CORES",
        "HDR_NUM_COMBINE": "AICPU_TILING_HDR_NUM_COMBINE", "HDR_FLAGS": "AICPU_TILING_HDR_FLAGS",
        "HDR_EPOCH": "AICPU_TILING_HDR_EPOCH",
        "HEADER_WORDS": "AICPU_TILING_HDR_WORDS", "CORE_WORDS": "AICPU_TILING_CORE_WORDS",
        "CORE_BEGIN": "AICPU_TILING_CORE_BEGIN", "CORE_END": "AICPU_TILING_CORE_END",
        "CORE_FIRST_SLOT": "AICPU_TILING_CORE_FIRST_SLOT",
        "CORE_LAST_SLOT": "AICPU_TILING_CORE_LAST_SLOT",
        "CORE_NUM_SEGMENTS": "AICPU_TILING_CORE_NUM_SEGMENTS",
        "COMB_WORDS": "AICPU_TILING_COMB_WORDS", "COMB_REQUEST": "AICPU_TILING_COMB_REQUEST",
        "COMB_KV_HEAD": "AICPU_TILING_COMB_KV_HEAD", "COMB_Q_TILE": "AICPU_TILING_COMB_Q_TILE",
        "COMB_FIRST_SLOT": "AICPU_TILING_COMB_FIRST_SLOT",
        "COMB_NUM_PIECES": "AICPU_TILING_COMB_NUM_PIECES",
    }
    return {**{key: int(getattr(_lib, name)) for key, name in names.items()},
            "E_STALE": E_STALE}


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, int(n) - 1).bit_length())


def block_shapes(params) -> dict[str, int]:
    """The tile shapes (compile-time): BLOCK_M rows, BLOCK_N kv tokens, BLOCK_D >= head_dim.

    BLOCK_M covers a decode unit's group rows (at least 16, ``tl.dot``'s minimum) and at most
    64 rows of a prefill tile; BLOCK_N is the largest power of two dividing the cache block,
    at most 128 (64 when BLOCK_M is 64), so one chunk never crosses a cache block. At head_dim
    128 this planned to at most 180 KiB of the A2's 192 KB UB (``tools/ascend_compile.py``).
    """
    group = params.num_q_heads // params.num_kv_heads
    block_m = min(64, _pow2_at_least(params.q_tile * group, 16))
    block_n = params.block_size & -params.block_size
    block_n = min(block_n, 128 if block_m <= 16 else 64)
    return {"BLOCK_M": block_m, "BLOCK_N": max(block_n, 1),
            "BLOCK_D": _pow2_at_least(params.head_dim, 16)}


@functools.lru_cache(maxsize=64)
def constants(params, causal: bool) -> dict[str, Any]:
    """Every compile-time constant of both kernels for ``params`` (a frozen TilingParams)."""
    return {
        "NUM_Q_HEADS": params.num_q_heads, "NUM_KV_HEADS": params.num_kv_heads,
        "HEAD_DIM": params.head_dim, "BLOCK_SIZE": params.block_size,
        "MAX_BATCH": params.max_batch, "MAX_TOKENS": params.max_tokens,
        "MAX_BLOCKS_PER_REQ": params.max_blocks_per_req, "NUM_CORES": params.num_cores,
        "Q_TILE": params.q_tile, "MAX_SLOTS": int(_lib.aicpu_tiling_max_slots(params._c_params())),
        "CAUSAL": int(_lib.AICPU_TILING_CAUSAL) if causal else 0,
        **_layout(),
    }


def _words(tiling_in) -> torch.Tensor:
    """The tiling as int32 words (it may arrive as uint8 bytes or by value as numpy)."""
    if not isinstance(tiling_in, torch.Tensor):
        tiling_in = torch.from_numpy(tiling_in)
    if tiling_in.dtype == torch.uint8:
        tiling_in = tiling_in.view(torch.int32)
    if tiling_in.dtype != torch.int32 or not tiling_in.is_contiguous():
        raise TypeError(f"tiling_in must be contiguous int32 or uint8, got {tiling_in.dtype}")
    return tiling_in


def _int32(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        value = torch.from_numpy(value)
    if value.dtype != torch.int32 or not value.is_contiguous():
        raise TypeError(f"{name} must be a contiguous int32 tensor, got {value.dtype}")
    return value


def _check_shapes(params, query, key_cache, value_cache, out, kv_int8: bool = False) -> str:
    """Checks the tensors' dtypes, shapes and memory layout; the caches' layout
    (`kv_quant.cache_layout`: ND, or NZ for int8 caches of rank 5), ND when there are no
    caches. The caches may be page-strided views (`kv_quant.page_strides`, checked by the
    caller, which passes the strides to the kernel); query and out must be contiguous."""
    shape = (params.max_tokens, params.num_q_heads, params.head_dim)
    if out.dtype not in DTYPES:
        raise TypeError(f"out must have one of the dtypes {DTYPES}, got {out.dtype}")
    if tuple(out.shape) != shape or not out.is_contiguous():
        raise ValueError(f"out must be contiguous with shape {list(shape)}, "
                         f"got {list(out.shape)}")
    if query is None:
        return _kv_quant.ND
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        want = out.dtype if name == "query" or not kv_int8 else torch.int8
        if t.dtype != want or (name == "query" and not t.is_contiguous()):
            raise TypeError(f"{name} must be {'contiguous ' if name == 'query' else ''}{want}, "
                            f"got {t.dtype}")
    if tuple(query.shape) != shape:
        raise ValueError(f"query must have shape {list(shape)}, got {list(query.shape)}")
    return _kv_quant.cache_layout(key_cache, value_cache, block_size=params.block_size,
                                  num_kv_heads=params.num_kv_heads, head_dim=params.head_dim,
                                  int8=kv_int8)


def _check_lengths(words: torch.Tensor, cu_seqlens_q: torch.Tensor,
                   seqlens_kv: torch.Tensor | None) -> None:
    """On the host (CPU tensors) the length arrays must cover the tiling's live batch, as the
    C wrapper checks; on a device the buffers are sized for max_batch at capture and the
    kernel cannot be asked to read a smaller one without a host sync, so this is skipped."""
    if words.device.type != "cpu" or int(words[_lib.AICPU_TILING_HDR_STATUS]) != 0:
        return
    batch = int(words[_lib.AICPU_TILING_HDR_BATCH])
    if not 0 <= batch <= 2**31 - 2:
        return  # the kernels report E_TILING
    if cu_seqlens_q.numel() < batch + 1:
        raise ValueError(f"cu_seqlens_q has {cu_seqlens_q.numel()} entries but the tiling's "
                         f"batch needs {batch + 1}")
    if seqlens_kv is not None and seqlens_kv.numel() < batch:
        raise ValueError(f"seqlens_kv has {seqlens_kv.numel()} entries but the tiling's batch "
                         f"needs {batch}")


def _sinks_arg(params, sinks, out, placeholder):
    """The tensor the kernels get as ``sinks``: the checked sinks, or (off: never read, the
    kernel compiled without USE_SINKS) ``placeholder``, an fp32 tensor on the same device."""
    if sinks is None:
        return placeholder
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor or None, got {type(sinks).__name__}")
    if sinks.dtype not in SINK_DTYPES:
        raise TypeError(f"sinks must have dtype {' or '.join(map(str, SINK_DTYPES))}, got "
                        f"{sinks.dtype}")
    if tuple(sinks.shape) != (params.num_q_heads,) or not sinks.is_contiguous():
        raise ValueError(f"sinks must be a contiguous [{params.num_q_heads}] tensor, got shape "
                         f"{list(sinks.shape)}")
    if sinks.device != out.device:
        raise ValueError(f"sinks must be on {out.device}, got {sinks.device}")
    return sinks


def launch_attention(params, *, tiling_in, step_epoch, query, key_cache, value_cache,
                     block_table, cu_seqlens_q, seqlens_kv, out, partial_out, partial_lse,
                     scale: float, causal: bool, logits_soft_cap: float | None = None,
                     sinks: torch.Tensor | None = None,
                     sliding_window: int | None = None,
                     kv_scales: tuple[torch.Tensor, ...] | None = None,
                     core_status: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the attention grid (``params.num_cores`` programs) once; returns core_status.

    Args:
        params: the TilingParams the tiling was planned with.
        tiling_in: the tiling, int32 or uint8 (``params.tiling_bytes`` bytes).
        step_epoch: int32 ``[1]``, the epoch the host wrote beside this step's lengths; a
            tiling whose header epoch differs is stale: no program does any work.
        query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv, out,
        partial_out, partial_lse: as for ``reference_attention.attention_core`` (all on one
            device; partials float32 ``[max_slots, q_tile, group, head_dim]`` / ``[.., group]``).
        scale: softmax scale; causal: the flag the tiling was planned with.
        logits_soft_cap: None (off: the kernel compiled without the cap) or C > 0, finite:
            scores ``s = scale * q . k`` become ``C * tanh(s / C)`` before the softmax (the
            kernel compiled with ``USE_SOFT_CAP``, C passed as an fp32 runtime scalar).
        sinks: None (off: the kernel compiled without sinks) or float32 ``[num_q_heads]``
            attention-sink logits on the output's device (the kernel compiled with
            ``USE_SINKS``): whole units add them to their rows' denominators; pass the same
            tensor to :func:`launch_combine`, which adds them to split units' rows.
        sliding_window: None (off: the kernel compiled without the window) or W >= 1
            with ``causal``: the query at kv position p sees only the keys ``p - W < j <= p``
            (compiled with ``USE_WINDOW``, W passed as an int32 runtime scalar). No kv block
            below a unit's window is read or checked, whatever blocks the tiling gives it; the
            combine needs no window (an empty piece has lse -inf).
        kv_scales: None (off: the caches have the query's dtype, the kernel compiled without
            int8) or ``(k_scale, k_offset, v_scale, v_offset)``, float32 ``[num_kv_heads,
            head_dim]`` each on the output's device: the caches are int8 and a stored x means
            ``(x - offset) * scale`` (`pyruntime.kernels.kv_quant`; compiled with ``KV_INT8``).
            int8 caches may then be 5-D, vLLM-Ascend's NZ layout ``[num_blocks, num_kv_heads,
            head_dim // 32, block_size, 32]`` (both alike, head_dim % 32 == 0; compiled with
            ``KV_NZ``), told by their rank (`kv_quant.cache_layout`).
            The combine needs nothing.
            Either cache may be a page-strided view, its blocks (dim 0) apart and each block
            dense, as vLLM-Ascend 0.30 hands a full-attention layer its K and V pages side by
            side (`kv_quant.page_strides`): the kernel reads it in place at that stride.
        core_status: int32 ``[num_cores]`` the programs write their status to (OK, the
            tiling's status, E_TILING or E_BLOCK_ID, the C reference's codes, or E_STALE);
            allocated when None. Device side: read it only after the stream has run.

    Raises:
        TypeError, ValueError: wrong dtypes or shapes, caches whose blocks are not dense or
            overlap (`kv_quant.CacheStrideError`), (CPU tensors) length arrays shorter
            than the tiling's live batch, a soft cap that is not None or a positive finite
            number, or a sliding window that is not None or an int >= 1 (0 included), or is
            given without ``causal``; checked before launching.
        TritonUnavailableError: see :func:`kernels`.
    """
    layout = _check_shapes(params, query, key_cache, value_cache, out,
                           kv_int8=kv_scales is not None)
    # read in place at each cache's page stride (vLLM-Ascend 0.30: K and V pages side by side)
    key_stride, value_stride = _kv_quant.page_strides(key_cache, value_cache)
    if kv_scales is None:   # never read: the kernel is compiled without KV_INT8
        kv_scales = (partial_lse,) * 4
        kv_int8 = False
    else:
        kv_scales = _kv_quant.check_scales(kv_scales, params.num_kv_heads, params.head_dim,
                                           device=out.device)
        kv_int8 = True
    soft_cap = _soft_cap.kernel_arg(logits_soft_cap)
    window = _sliding_window.kernel_arg(sliding_window, causal=bool(causal))
    sinks_ptr = _sinks_arg(params, sinks, out, partial_lse)
    words = _words(tiling_in)
    cu_seqlens_q, seqlens_kv = _int32("cu_seqlens_q", cu_seqlens_q), _int32("seqlens_kv",
                                                                           seqlens_kv)
    _check_lengths(words, cu_seqlens_q, seqlens_kv)
    module = kernels(interpret=out.device.type == "cpu")
    if core_status is None:
        core_status = torch.empty(params.num_cores, dtype=torch.int32, device=out.device)
    upcast = out.dtype == torch.bfloat16 and out.device.type == "cpu"  # interpreter bf16 dot
    with _launch_lock(out.device):
        module.paged_attention_kernel[(params.num_cores,)](
            words, _int32("step_epoch", step_epoch), query, key_cache, value_cache,
            _int32("block_table", block_table), cu_seqlens_q, seqlens_kv, out,
            partial_out, partial_lse, core_status, float(scale), soft_cap, sinks_ptr, window,
            int(key_cache.shape[0]), *kv_scales, key_stride, value_stride,
            **constants(params, bool(causal)),
            **block_shapes(params), UPCAST_DOT=upcast, USE_SOFT_CAP=soft_cap > 0.0,
            USE_SINKS=sinks is not None, USE_WINDOW=window > 0, KV_INT8=kv_int8,
            KV_NZ=layout == _kv_quant.NZ)
    return core_status


def launch_combine(params, *, tiling_in, step_epoch, cu_seqlens_q, out, partial_out,
                   partial_lse, causal: bool = True, combine_status: torch.Tensor | None = None,
                   num_programs: int | None = None,
                   sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the combine grid once; returns combine_status (int32 ``[num_programs]``).

    ``num_programs`` (default ``params.num_cores``) is fixed at capture like the attention
    grid; program i merges combine records i, i + n, ... and zeroes its share of the
    padding rows. On a tiling that is not OK, or stale (its epoch differs from
    ``step_epoch[0]``), every row of ``out`` becomes zero. ``sinks``: None or the float32
    ``[num_q_heads]`` attention sinks given to :func:`launch_attention` (compiled with
    ``USE_SINKS``: each merged row's denominator gains its q head's sink, once).
    """
    _check_shapes(params, None, None, None, out)
    sinks_ptr = _sinks_arg(params, sinks, out, partial_lse)
    words = _words(tiling_in)
    cu_seqlens_q = _int32("cu_seqlens_q", cu_seqlens_q)
    _check_lengths(words, cu_seqlens_q, None)
    module = kernels(interpret=out.device.type == "cpu")
    programs = int(num_programs or params.num_cores)
    if combine_status is None:
        combine_status = torch.empty(programs, dtype=torch.int32, device=out.device)
    shapes = block_shapes(params)
    with _launch_lock(out.device):
        module.attention_combine_kernel[(programs,)](
            words, _int32("step_epoch", step_epoch), cu_seqlens_q, out, partial_out,
            partial_lse, combine_status, sinks_ptr, **constants(params, bool(causal)),
            BLOCK_M=shapes["BLOCK_M"], BLOCK_D=shapes["BLOCK_D"],
            BLOCK_Z=min(1024, _pow2_at_least(params.num_q_heads * params.head_dim, 16)),
            USE_SINKS=sinks is not None)
    return combine_status
