"""The three device kernels of one attention step, as `Kernel`s (`pyruntime.kernels.kernel`).

- ``TILING`` (AI-CPU): reads the step epoch, live batch and lengths from device memory
  and writes the tiling buffer (the C kernel through `pyruntime.tiling.plan_into`,
  zero-copy); the tiling header echoes the epoch.
- ``ATTENTION`` (AI Core): each core runs exactly the work its tiling range gives it
  (`pyruntime.kernels.reference_attention.attention_core`).
- ``COMBINE`` (AI Core, one core): merges split-KV partials and zeroes padding rows
  (`pyruntime.kernels.reference_attention.attention_finalize`); zeroes every row when the tiling
  is not OK.

``ATTENTION`` and ``COMBINE`` also have a Triton body (`pyruntime.kernels.triton_launch`, one
launch of the whole fixed grid): the CPU backend runs it interpreted when made with
``aicore="triton"``, and the NPU implementations of their custom ops (``attention_npu``,
``combine_npu``) launch the same kernels compiled by Triton-Ascend on the current stream.

Attention and combine also take ``step_epoch``, the epoch the host wrote beside this step's
lengths. A tiling whose header epoch differs was not planned for this step (a captured
AI-CPU task that replay did not re-run): attention then does no work and combine zeroes
every row, like a failed status, and the host's check raises `tiling.StaleTilingError`.

Attention takes ``logits_soft_cap`` too: None (off) or C > 0, each score ``s = scale * q . k``
becoming ``C * tanh(s / C)`` before the softmax (`pyruntime.kernels.soft_cap`), in both bodies;
combine is the same with or without it (it merges log-sum-exps of capped scores).
Attention and combine take ``sinks`` (None, or the layer's float32 ``[num_q_heads]``
attention-sink logits, the same tensor for both): whole units add the sink in attention,
split units in combine, so each row counts it once (``attention_ref.h``).

Argument dicts use the names of the torch custom ops in `custom_ops`, so the NPU backend
can call ``npu_op(**args)``; this module hands those ops their bodies (`custom_ops.provide`). By-value arguments (the host-update path passes its tiling
and host lengths inside the task, as FIA does) arrive as numpy arrays and are viewed as
tensors without a copy. A kernel status other than OK or the tiling's own status raises,
which the backend reports as a device task failure at the next synchronize.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pyruntime import tiling
from pyruntime.kernels import custom_ops, kv_quant, reference_attention, triton_launch
from pyruntime.kernels.kernel import AICORE, AICPU, AttentionKernelError, Kernel


@functools.lru_cache(maxsize=64)
def params_from(values: tuple[int, ...]) -> tiling.TilingParams:
    """`TilingParams` from the flat int list the kernels and custom ops carry (C words: a
    ``sliding_window`` of 0 is None)."""
    return tiling.params_from_words(values)


@functools.lru_cache(maxsize=64)
def params_list(params: tiling.TilingParams) -> list[int]:
    """The flat int list of `params` (the inverse of `params_from`); shared, do not mutate."""
    return list(params.as_dict().values())


def split_params(params: Sequence[int], count: int) -> list[list[int]]:
    """`count` flat params lists concatenated (``plan_tilings``' ``params``), split back.

    Raises:
        ValueError: ``params`` does not hold `count` lists of one params list's length.
    """
    width = len(tiling.TilingParams.__dataclass_fields__)
    if count < 1 or len(params) != count * width:
        raise ValueError(f"params has {len(params)} values for {count} tilings, expected "
                         f"{width} per tiling")
    return [list(params[i * width:(i + 1) * width]) for i in range(count)]


def _tensor(value: Any) -> torch.Tensor:
    return torch.from_numpy(value) if isinstance(value, np.ndarray) else value


_NO_LENGTHS = np.zeros(0, dtype=np.int32)


def tiling_status(params: tiling.TilingParams, tiling_buf: torch.Tensor) -> tiling.Tiling:
    """The decoded view of a tiling buffer (only its header is meaningful without lengths).

    A device buffer is copied to the host first (a synchronous read: never inside a capture).
    """
    host = tiling_buf.detach().cpu()  # no copy for a host tensor
    return tiling.Tiling(params, host.numpy().view(np.uint8), _NO_LENGTHS, _NO_LENGTHS, True)


def _check(status: int, params: tiling.TilingParams, tiling_buf: torch.Tensor, what: str):
    if status == reference_attention.OK:
        return
    if status == tiling_status(params, tiling_buf).status:
        return  # a bad tiling: outputs are zero and check() reports it
    raise AttentionKernelError(f"{what}: {reference_attention.strerror(status)}")


def tiling_body(*, cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_out, params,
                causal) -> None:
    """AI-CPU: plan into `tiling_out` from device-resident lengths, batch and epoch."""
    tiling.plan_into(params_from(tuple(params)), cu_seqlens_q, seqlens_kv, int(batch[0]),
                     tiling_out, causal=causal, epoch=int(step_epoch[0]))


def plan_tilings_body(*, cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_outs, params,
                      causal) -> None:
    """AI-CPU: several tilings from the same lengths (``params``: their lists concatenated)."""
    for out, one in zip(tiling_outs, split_params(params, len(tiling_outs)), strict=True):
        tiling_body(cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv, batch=batch,
                    step_epoch=step_epoch, tiling_out=out, params=one, causal=causal)


def is_stale(tiling_buf: torch.Tensor, step_epoch: Any) -> bool:
    """True when the tiling was planned for another step than `step_epoch[0]`."""
    words = _tensor(tiling_buf).view(torch.int32)
    return int(words[tiling.HDR_EPOCH]) != int(_tensor(step_epoch)[0])


def _kv_scales(k_scale, k_offset, v_scale, v_offset) -> tuple | None:
    """The int8 caches' ``(k_scale, k_offset, v_scale, v_offset)`` the consumers take, or None
    when the caches are not int8 (all four None). The ops take them as four arguments: a custom
    op's schema has no optional list of tensors."""
    scales = (k_scale, k_offset, v_scale, v_offset)
    return None if all(t is None for t in scales) else scales


def attention_body(core: int, *, query, key_cache, value_cache, block_table, cu_seqlens_q,
                   seqlens_kv, step_epoch, tiling_in, out, partial_out, partial_lse, params,
                   scale, causal, logits_soft_cap=None, sinks=None,
                   sliding_window=None, k_scale=None, k_offset=None, v_scale=None,
                   v_offset=None) -> None:
    """AI Core `core`: its share of one layer, as the tiling assigns it (none if stale).
    ``k_scale`` .. ``v_offset``: None, or the int8 caches' float32 ``[num_kv_heads, head_dim]``
    scales and offsets (`pyruntime.kernels.kv_quant`)."""
    tiling_in, params = _tensor(tiling_in), params_from(tuple(params))
    if is_stale(tiling_in, step_epoch):
        return  # combine zeroes the output; check() reports StaleTilingError
    status = reference_attention.attention_core(
        params, tiling_in, core, query=query, key_cache=key_cache,
        value_cache=value_cache, block_table=block_table, cu_seqlens_q=_tensor(cu_seqlens_q),
        seqlens_kv=_tensor(seqlens_kv), out=out, partial_out=partial_out,
        partial_lse=partial_lse, scale=scale, causal=causal, logits_soft_cap=logits_soft_cap,
        sinks=sinks, sliding_window=sliding_window,
        kv_scales=_kv_scales(k_scale, k_offset, v_scale, v_offset))
    _check(status, params, tiling_in, f"attention core {core}")


def combine_body(core: int, *, cu_seqlens_q, step_epoch, tiling_in, out, partial_out,
                 partial_lse, params, sinks=None) -> None:
    """AI Core (one core): merge split partials, zero padding rows (every row if stale)."""
    tiling_in, params = _tensor(tiling_in), params_from(tuple(params))
    if is_stale(tiling_in, step_epoch):
        out.zero_()
        return
    status = reference_attention.attention_finalize(
        params, tiling_in, cu_seqlens_q=_tensor(cu_seqlens_q), out=out,
        partial_out=partial_out, partial_lse=partial_lse, sinks=sinks)
    _check(status, params, tiling_in, "attention combine")


def _triton_attention_args(query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv,
                           step_epoch, tiling_in, out, partial_out, partial_lse, scale,
                           causal, logits_soft_cap, sinks, sliding_window=None,
                           kv_scales=None) -> dict:
    return {"tiling_in": _tensor(tiling_in), "step_epoch": _tensor(step_epoch),
            "query": query, "key_cache": key_cache,
            "value_cache": value_cache, "block_table": block_table,
            "cu_seqlens_q": _tensor(cu_seqlens_q), "seqlens_kv": _tensor(seqlens_kv),
            "out": out, "partial_out": partial_out, "partial_lse": partial_lse,
            "scale": scale, "causal": causal, "logits_soft_cap": logits_soft_cap,
            "sinks": sinks, "sliding_window": sliding_window, "kv_scales": kv_scales}


def _check_all(statuses: torch.Tensor, params, tiling_in, what: str) -> None:
    words = triton_launch._words(tiling_in)
    for core, status in enumerate(statuses.tolist()):
        if status != triton_launch.E_STALE:  # outputs are zero; check() raises StaleTilingError
            _check(status, params, words, f"{what} {core}")


def attention_triton(*, query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv,
                     step_epoch, tiling_in, out, partial_out, partial_lse, params, scale,
                     causal, logits_soft_cap=None, sinks=None, sliding_window=None,
                     k_scale=None, k_offset=None, v_scale=None, v_offset=None) -> None:
    """Every AI Core in one Triton launch (CPU tensors: interpreted); checks the statuses.

    The kernel itself compares the tiling's epoch with ``step_epoch`` (no work when stale)."""
    params = params_from(tuple(params))
    args = _triton_attention_args(query, key_cache, value_cache, block_table, cu_seqlens_q,
                                  seqlens_kv, step_epoch, tiling_in, out, partial_out,
                                  partial_lse, scale, causal, logits_soft_cap, sinks,
                                  sliding_window,
                                  _kv_scales(k_scale, k_offset, v_scale, v_offset))
    status = triton_launch.launch_attention(params, **args)
    _check_all(status, params, args["tiling_in"], "attention core")


def combine_triton(*, cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse,
                   params, sinks=None) -> None:
    """The combine grid in one Triton launch (every row zero when stale); checks statuses."""
    params, tiling_in = params_from(tuple(params)), _tensor(tiling_in)
    status = triton_launch.launch_combine(params, tiling_in=tiling_in,
                                          step_epoch=_tensor(step_epoch),
                                          cu_seqlens_q=_tensor(cu_seqlens_q), out=out,
                                          partial_out=partial_out, partial_lse=partial_lse,
                                          sinks=sinks)
    _check_all(status, params, tiling_in, "attention combine program")


_status_buffers: dict[tuple[str, str, int], torch.Tensor] = {}


def status_buffer(device: torch.device, kernel: str, size: int) -> torch.Tensor:
    """A persistent int32 ``[size]`` status buffer of ``kernel`` on ``device``.

    The NPU launches write their per-core status here instead of being checked at once:
    nothing may synchronize inside a capture. Read it after the stream has run.
    """
    key = (str(device), kernel, int(size))
    if key not in _status_buffers:
        _status_buffers[key] = torch.zeros(size, dtype=torch.int32, device=device)
    return _status_buffers[key]


def attention_npu(query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv,
                  step_epoch, tiling_in, out, partial_out, partial_lse, params, scale,
                  causal, logits_soft_cap=None, sinks=None, sliding_window=None,
                  k_scale=None, k_offset=None, v_scale=None, v_offset=None) -> None:
    """The NPU implementation of ``paged_attention``: one Triton launch on the current stream.

    Thin on purpose (a capture records the launch): the statuses go to `status_buffer`
    unchecked. On CPU tensors the same function runs the interpreter, which is how it is
    tested here.
    """
    params = params_from(tuple(params))
    triton_launch.launch_attention(
        params, **_triton_attention_args(query, key_cache, value_cache, block_table,
                                         cu_seqlens_q, seqlens_kv, step_epoch, tiling_in,
                                         out, partial_out, partial_lse, scale, causal,
                                         logits_soft_cap, sinks, sliding_window,
                                         _kv_scales(k_scale, k_offset, v_scale, v_offset)),
        core_status=status_buffer(out.device, "attention", params.num_cores))


def combine_npu(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse,
                params, sinks=None) -> None:
    """The NPU implementation of ``attention_combine``: one Triton launch, current stream."""
    params = params_from(tuple(params))
    triton_launch.launch_combine(
        params, tiling_in=_tensor(tiling_in), step_epoch=_tensor(step_epoch),
        cu_seqlens_q=_tensor(cu_seqlens_q), out=out,
        partial_out=partial_out, partial_lse=partial_lse, sinks=sinks,
        combine_status=status_buffer(out.device, "combine", params.num_cores))


#: FIA's compressed causal mask (sparse_mode 3): one [2048, 2048] upper-triangle, whatever
#: the sequence lengths (torch_npu's FIA documentation)
FIA_MASK_SIZE = 2048


def fia_host_lists_npu(*, query, key_cache, value_cache, block_table, out, softmax_lse,
                       atten_mask, cu_seqlens_q, seqlens_kv, params, scale, causal) -> None:
    """The host_update baseline's layer on an NPU: torch_npu's FIA (``.out``, into the
    layer's fixed output) with the lengths as host lists, as vLLM-Ascend's decode path
    calls it inside a task group (and re-issues it in the update every step).

    Args:
        query: ``[max_tokens, Hq, D]``; key_cache, value_cache ``[blocks, block_size, Hkv,
            D]`` (passed as FIA's ``[blocks, block_size, Hkv * D]``); block_table int32
            ``[max_batch, max_blocks_per_req]``; out like query; softmax_lse float32
            ``[max_tokens, Hq, 1]``; atten_mask uint8 ``[2048, 2048]`` (upper triangle).
        cu_seqlens_q, seqlens_kv: host int32 tensors (by value): FIA's
            ``actual_seq_lengths`` (cumulative ends, TND) and ``actual_seq_lengths_kv``.
    """
    import torch_npu

    p = params_from(tuple(params))
    flat = (key_cache.shape[0], p.block_size, p.num_kv_heads * p.head_dim)
    torch_npu.npu_fused_infer_attention_score.out(
        query, key_cache.view(flat), value_cache.view(flat), block_table=block_table,
        actual_seq_lengths=_tensor(cu_seqlens_q)[1:].tolist(),
        actual_seq_lengths_kv=_tensor(seqlens_kv).tolist(), num_heads=p.num_q_heads,
        num_key_value_heads=p.num_kv_heads, scale=scale, input_layout="TND",
        block_size=p.block_size, sparse_mode=3 if causal else 0,
        atten_mask=atten_mask if causal else None, workspace=None, attention_out=out,
        softmax_lse=softmax_lse)


def _fia_cpu(core, **args) -> None:
    raise AttentionKernelError("FIA runs only on an NPU; the CPU backend's host_update "
                               "emulates it with a host tiling and our attention")


def attention_every_core(**args) -> None:
    """Every AI Core's `attention_body`, one after another (the ``paged_attention`` op on CPU)."""
    for core in range(params_from(tuple(args["params"])).num_cores):
        attention_body(core, **args)


def _op(name: str):
    def call(**args):
        return getattr(custom_ops.ops(), name)(**args)  # registers the ops on first use
    return call


custom_ops.provide("plan_tiling", tiling_body)
custom_ops.provide("plan_tilings", plan_tilings_body)
custom_ops.provide("paged_attention", attention_every_core, attention_npu)
custom_ops.provide("attention_combine", functools.partial(combine_body, 0), combine_npu)


def launch_layer(backend, buffers, layer: int, *, stream, tiling_in, cu_seqlens_q, seqlens_kv,
                 step_epoch, causal: bool) -> None:
    """Launch one layer's attention (every core) and combine on `stream`.

    `tiling_in`, `cu_seqlens_q`, `seqlens_kv` and `step_epoch` (int32 ``[1]``) are device
    buffers (device tiling) or numpy arrays passed by value inside the tasks (host update).
    The layer's scale, logits soft cap, sinks, sliding window and int8 KV scales are the
    buffers' (`StaticBuffers`); the sinks (when there are any) go to both kernels, the window
    and the int8 scales (when there are any) to the attention only (an empty piece's lse is
    -inf, which the combine merges as it is), and each is passed only then, so a layer
    without them launches with exactly the arguments it had before.
    """
    key_cache, value_cache = buffers.kv_caches[layer]
    out, params = buffers.outputs[layer], params_list(buffers.params)
    workspace = {"partial_out": buffers.partial_out, "partial_lse": buffers.partial_lse}
    sinks = {} if buffers.sinks is None else {"sinks": buffers.sinks[layer]}
    window = getattr(buffers, "sliding_window", None)
    window = {} if window is None else {"sliding_window": window}
    kv_scales = getattr(buffers, "kv_scales", None)   # int8 caches: this layer's scales
    kv_scales = kv_quant.scale_kwargs(None if kv_scales is None else kv_scales[layer])
    backend.launch(ATTENTION, {
        "query": buffers.queries[layer], "key_cache": key_cache, "value_cache": value_cache,
        "block_table": buffers.block_table, "cu_seqlens_q": cu_seqlens_q,
        "seqlens_kv": seqlens_kv, "step_epoch": step_epoch, "tiling_in": tiling_in, "out": out,
        **workspace,
        "params": params, "scale": buffers.scale, "causal": causal,
        "logits_soft_cap": buffers.logits_soft_cap, **sinks, **window, **kv_scales,
    }, num_cores=buffers.params.num_cores, stream=stream)
    backend.launch(COMBINE, {"cu_seqlens_q": cu_seqlens_q, "step_epoch": step_epoch,
                             "tiling_in": tiling_in, "out": out, **workspace, "params": params,
                             **sinks},
                   num_cores=1, stream=stream)


TILING = Kernel("aicpu_tiling.plan", AICPU, tiling_body, _op("plan_tiling"))
FIA_HOST_LISTS = Kernel("npu_fused_infer_attention_score", AICORE, _fia_cpu,
                        fia_host_lists_npu)
ATTENTION = Kernel("aicpu_tiling.attention", AICORE, attention_body, _op("paged_attention"),
                   triton_impl=attention_triton)
COMBINE = Kernel("aicpu_tiling.combine", AICORE, combine_body, _op("attention_combine"),
                 triton_impl=combine_triton)
