"""The AI Core kernels of one MLA decode step, as `Kernel`s, and their layer launch.

The AI-CPU tiling kernel is `step.TILING` unchanged: an MLA layer is planned as GQA with one
kv head, ``head_dim = kv_lora_rank + qk_rope_head_dim`` (`pyruntime.mla_attention`).

- ``MLA_ATTENTION`` (AI Core): each core runs its tiling range of absorbed MLA, reading the
  latent cache ``kv_c`` and the rope cache ``k_pe`` (`reference_mla.mla_core` on the CPU
  backend; ``triton_mla.mla_decode_kernel``, one launch of the whole grid, under
  ``aicore="triton"`` and on an NPU).
- ``MLA_COMBINE`` (AI Core, one core): merges split-KV partials and zeroes padding rows
  (`reference_mla.mla_finalize`; the GQA Triton combine at ``head_dim = kv_lora_rank``).

Both take ``step_epoch`` as `step` does: a tiling planned for another step is not used (no
work, every row zero) and the host's check raises `tiling.StaleTilingError`. Argument dicts
carry the MLA layer's extra static value ``kv_lora_rank`` beside the tiling ``params`` list.
On an NPU the bodies launch the Triton kernels directly on the current stream (the kernels'
``npu_op`` is not the torch custom op, so these launches are not visible to
``torch.compile``); this module hands the ``mla_attention`` / ``mla_combine`` custom ops
their bodies (`custom_ops.provide`).
"""

from __future__ import annotations

import functools

import torch

from pyruntime.kernels import custom_ops, reference_mla, step, triton_launch, triton_mla_launch
from pyruntime.kernels.kernel import AICORE, AttentionKernelError, Kernel


def _check(status: int, params, tiling_buf, what: str) -> None:
    """Raise for a status other than OK or the tiling's own (a bad tiling: outputs are zero
    and `check()` reports it), as `step` does for GQA."""
    if status == reference_mla.OK or status == step.tiling_status(params, tiling_buf).status:
        return
    raise AttentionKernelError(f"{what}: {reference_mla.strerror(status)}")


def mla_attention_body(core: int, *, q_nope, q_pe, kv_c_cache, k_pe_cache, block_table,
                       cu_seqlens_q, seqlens_kv, step_epoch, tiling_in, out, partial_out,
                       partial_lse, params, kv_lora_rank, scale, causal) -> None:
    """AI Core `core`: its share of one MLA layer (none if the tiling is stale)."""
    tiling_in, params = step._tensor(tiling_in), step.params_from(tuple(params))
    if step.is_stale(tiling_in, step_epoch):
        return
    status = reference_mla.mla_core(
        params, int(kv_lora_rank), tiling_in, core, q_nope=q_nope, q_pe=q_pe,
        kv_c_cache=kv_c_cache, k_pe_cache=k_pe_cache, block_table=block_table,
        cu_seqlens_q=step._tensor(cu_seqlens_q), seqlens_kv=step._tensor(seqlens_kv), out=out,
        partial_out=partial_out, partial_lse=partial_lse, scale=scale, causal=causal)
    _check(status, params, tiling_in, f"MLA attention core {core}")


def mla_combine_body(core: int, *, cu_seqlens_q, step_epoch, tiling_in, out, partial_out,
                     partial_lse, params, kv_lora_rank) -> None:
    """AI Core (one core): merge split partials, zero padding rows (every row if stale)."""
    tiling_in, params = step._tensor(tiling_in), step.params_from(tuple(params))
    if step.is_stale(tiling_in, step_epoch):
        out.zero_()
        return
    status = reference_mla.mla_finalize(params, int(kv_lora_rank), tiling_in,
                                        cu_seqlens_q=step._tensor(cu_seqlens_q), out=out,
                                        partial_out=partial_out, partial_lse=partial_lse)
    _check(status, params, tiling_in, "MLA combine")


def _check_all(statuses: torch.Tensor, params, tiling_in, what: str) -> None:
    words = triton_launch._words(step._tensor(tiling_in))
    for core, status in enumerate(statuses.tolist()):
        if status != triton_launch.E_STALE:  # outputs are zero; check() raises StaleTilingError
            _check(status, params, words, f"{what} {core}")


def _launch_attention(core_status=None, **args) -> torch.Tensor:
    params = step.params_from(tuple(args.pop("params")))
    for name in ("tiling_in", "step_epoch", "cu_seqlens_q", "seqlens_kv"):
        args[name] = step._tensor(args[name])
    return triton_mla_launch.launch_mla_attention(params, int(args.pop("kv_lora_rank")),
                                                  core_status=core_status, **args)


def _launch_combine(combine_status=None, **args) -> torch.Tensor:
    params = step.params_from(tuple(args.pop("params")))
    for name in ("tiling_in", "step_epoch", "cu_seqlens_q"):
        args[name] = step._tensor(args[name])
    return triton_mla_launch.launch_mla_combine(params, int(args.pop("kv_lora_rank")),
                                                combine_status=combine_status, **args)


def mla_attention_triton(**args) -> None:
    """Every AI Core in one Triton launch (CPU tensors: interpreted); checks the statuses."""
    status = _launch_attention(**args)
    _check_all(status, step.params_from(tuple(args["params"])), args["tiling_in"],
               "MLA attention core")


def mla_combine_triton(**args) -> None:
    """The combine grid in one Triton launch (every row zero when stale); checks statuses."""
    status = _launch_combine(**args)
    _check_all(status, step.params_from(tuple(args["params"])), args["tiling_in"],
               "MLA combine program")


def mla_attention_npu(**args) -> None:
    """NPU: one Triton launch on the current stream, statuses to `step.status_buffer` unread
    (nothing may synchronize inside a capture)."""
    params = step.params_from(tuple(args["params"]))
    _launch_attention(core_status=step.status_buffer(args["out"].device, "mla_attention",
                                                     params.num_cores), **args)


def mla_combine_npu(**args) -> None:
    """NPU: the combine grid, one Triton launch on the current stream."""
    params = step.params_from(tuple(args["params"]))
    _launch_combine(combine_status=step.status_buffer(args["out"].device, "mla_combine",
                                                      params.num_cores), **args)


def launch_layer(backend, buffers, layer: int, *, stream, tiling_in, cu_seqlens_q, seqlens_kv,
                 step_epoch, causal: bool) -> None:
    """Launch one MLA layer's attention (every core) and combine on `stream`.

    As `step.launch_layer`: `tiling_in`, `cu_seqlens_q`, `seqlens_kv` and `step_epoch` are
    device buffers (device tiling) or numpy arrays passed by value (host update); the
    layer's tensors, scale and ``kv_lora_rank`` come from `buffers`
    (`pyruntime.mla_attention.MLABuffers`).
    """
    q_nope, q_pe = buffers.queries[layer]
    kv_c_cache, k_pe_cache = buffers.kv_caches[layer]
    out, params = buffers.outputs[layer], step.params_list(buffers.params)
    common = {"step_epoch": step_epoch, "tiling_in": tiling_in, "out": out,
              "partial_out": buffers.partial_out, "partial_lse": buffers.partial_lse,
              "params": params, "kv_lora_rank": buffers.kv_lora_rank}
    backend.launch(MLA_ATTENTION, {
        "q_nope": q_nope, "q_pe": q_pe, "kv_c_cache": kv_c_cache, "k_pe_cache": k_pe_cache,
        "block_table": buffers.block_table, "cu_seqlens_q": cu_seqlens_q,
        "seqlens_kv": seqlens_kv, **common, "scale": buffers.scale, "causal": causal,
    }, num_cores=buffers.params.num_cores, stream=stream)
    backend.launch(MLA_COMBINE, {"cu_seqlens_q": cu_seqlens_q, **common}, num_cores=1,
                   stream=stream)


def _every_core(**args) -> None:
    """Every AI Core's `mla_attention_body` (the ``mla_attention`` op on CPU)."""
    for core in range(step.params_from(tuple(args["params"])).num_cores):
        mla_attention_body(core, **args)


def _attention_op_npu(q_nope, q_pe, kv_c_cache, k_pe_cache, block_table, cu_seqlens_q,
                      seqlens_kv, step_epoch, tiling_in, out, partial_out, partial_lse, params,
                      kv_lora_rank, scale, causal) -> None:
    """``mla_attention``'s NPU implementation (the op's arguments in schema order)."""
    mla_attention_npu(q_nope=q_nope, q_pe=q_pe, kv_c_cache=kv_c_cache, k_pe_cache=k_pe_cache,
                      block_table=block_table, cu_seqlens_q=cu_seqlens_q,
                      seqlens_kv=seqlens_kv, step_epoch=step_epoch, tiling_in=tiling_in,
                      out=out, partial_out=partial_out, partial_lse=partial_lse, params=params,
                      kv_lora_rank=kv_lora_rank, scale=scale, causal=causal)


def _combine_op_npu(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse, params,
                    kv_lora_rank) -> None:
    """``mla_combine``'s NPU implementation (the op's arguments in schema order)."""
    mla_combine_npu(cu_seqlens_q=cu_seqlens_q, step_epoch=step_epoch, tiling_in=tiling_in,
                    out=out, partial_out=partial_out, partial_lse=partial_lse, params=params,
                    kv_lora_rank=kv_lora_rank)


custom_ops.provide("mla_attention", _every_core, _attention_op_npu)
custom_ops.provide("mla_combine", functools.partial(mla_combine_body, 0), _combine_op_npu)

MLA_ATTENTION = Kernel("aicpu_tiling.mla_attention", AICORE, mla_attention_body,
                       mla_attention_npu, triton_impl=mla_attention_triton)
MLA_COMBINE = Kernel("aicpu_tiling.mla_combine", AICORE, mla_combine_body, mla_combine_npu,
                     triton_impl=mla_combine_triton)
