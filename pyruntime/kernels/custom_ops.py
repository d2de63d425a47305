"""The tiling and attention launches as torch custom ops (``torch.ops.aicpu_tiling.*``).

Registered with `torch.library.custom_op` so they can sit inside a captured torch graph
(``torch.compile`` traces them through their fake implementations, which only declare
that they mutate their output buffers). The CPU implementations run the kernels of
`step`. The AI Core ops also register their NPU implementation for the ``PrivateUse1`` key
(torch_npu's ``npu`` device): ``step.attention_npu`` / ``step.combine_npu``, one Triton launch
on the current stream. The AI-CPU tiling op's NPU build is not here.

- ``plan_tiling(cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_out, params, causal)``
- ``plan_tilings(cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_outs, params, causal)``:
  several tilings from the same lengths in one AI-CPU launch (one per distinct sliding
  window of a graph); ``params`` is each tiling's flat params list, concatenated
- ``paged_attention(query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv,
  step_epoch, tiling_in, out, partial_out, partial_lse, params, scale, causal,
  logits_soft_cap=None, sinks=None, sliding_window=None, k_scale=None, k_offset=None,
  v_scale=None, v_offset=None)`` (every core; ``logits_soft_cap``:
  None or C > 0, see `pyruntime.kernels.soft_cap`; ``sinks``: None or float32
  ``[num_q_heads]`` attention sinks; ``sliding_window``: None or W >= 1, see
  `pyruntime.kernels.sliding_window`; ``k_scale``, ``k_offset``, ``v_scale``, ``v_offset``:
  None, or the int8 caches' float32 ``[num_kv_heads, head_dim]`` scales and offsets, see
  `pyruntime.kernels.kv_quant`)
- ``attention_combine(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse,
  params, sinks=None)`` (the same sinks as the attention's)
- ``mla_attention`` and ``mla_combine``: MLA decode (`mla_step`), see `_register_mla`
"""

from __future__ import annotations

import functools

import torch

from . import step as kernels

NAMESPACE = "aicpu_tiling"
Tensor = torch.Tensor


@functools.cache
def ops():
    """Register the ops once; return ``torch.ops.aicpu_tiling``."""

    @torch.library.custom_op(f"{NAMESPACE}::plan_tiling", mutates_args=("tiling_out",))
    def plan_tiling(cu_seqlens_q: Tensor, seqlens_kv: Tensor, batch: Tensor, step_epoch: Tensor,
                    tiling_out: Tensor, params: list[int], causal: bool) -> None:
        kernels.tiling_body(cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv, batch=batch,
                            step_epoch=step_epoch, tiling_out=tiling_out, params=params,
                            causal=causal)

    @plan_tiling.register_fake
    def _(cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_out, params, causal) -> None:
        return None

    @torch.library.custom_op(f"{NAMESPACE}::plan_tilings", mutates_args=("tiling_outs",))
    def plan_tilings(cu_seqlens_q: Tensor, seqlens_kv: Tensor, batch: Tensor,
                     step_epoch: Tensor, tiling_outs: list[Tensor], params: list[int],
                     causal: bool) -> None:
        for out, one in zip(tiling_outs, kernels.split_params(params, len(tiling_outs)),
                            strict=True):
            kernels.tiling_body(cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv, batch=batch,
                                step_epoch=step_epoch, tiling_out=out, params=one,
                                causal=causal)

    @plan_tilings.register_fake
    def _(cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_outs, params, causal) -> None:
        return None

    @torch.library.custom_op(f"{NAMESPACE}::paged_attention",
                             mutates_args=("out", "partial_out", "partial_lse"))
    def paged_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor,
                        block_table: Tensor, cu_seqlens_q: Tensor, seqlens_kv: Tensor,
                        step_epoch: Tensor, tiling_in: Tensor, out: Tensor, partial_out: Tensor,
                        partial_lse: Tensor, params: list[int], scale: float,
                        causal: bool, logits_soft_cap: float | None = None,
                        sinks: Tensor | None = None,
                        sliding_window: int | None = None, k_scale: Tensor | None = None,
                        k_offset: Tensor | None = None, v_scale: Tensor | None = None,
                        v_offset: Tensor | None = None) -> None:
        for core in range(kernels.params_from(tuple(params)).num_cores):
            kernels.attention_body(
                core, query=query, key_cache=key_cache, value_cache=value_cache,
                block_table=block_table, cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv,
                step_epoch=step_epoch, tiling_in=tiling_in, out=out, partial_out=partial_out,
                partial_lse=partial_lse, params=params, scale=scale, causal=causal,
                logits_soft_cap=logits_soft_cap, sinks=sinks, sliding_window=sliding_window,
                k_scale=k_scale, k_offset=k_offset, v_scale=v_scale, v_offset=v_offset)

    paged_attention.register_kernel("privateuseone")(kernels.attention_npu)

    @paged_attention.register_fake
    def _(query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv, step_epoch,
          tiling_in, out, partial_out, partial_lse, params, scale, causal,
          logits_soft_cap=None, sinks=None, sliding_window=None, k_scale=None, k_offset=None,
          v_scale=None, v_offset=None) -> None:
        return None

    @torch.library.custom_op(f"{NAMESPACE}::attention_combine", mutates_args=("out",))
    def attention_combine(cu_seqlens_q: Tensor, step_epoch: Tensor, tiling_in: Tensor,
                          out: Tensor, partial_out: Tensor, partial_lse: Tensor,
                          params: list[int], sinks: Tensor | None = None) -> None:
        kernels.combine_body(0, cu_seqlens_q=cu_seqlens_q, step_epoch=step_epoch,
                             tiling_in=tiling_in, out=out, partial_out=partial_out,
                             partial_lse=partial_lse, params=params, sinks=sinks)

    attention_combine.register_kernel("privateuseone")(kernels.combine_npu)

    @attention_combine.register_fake
    def _(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse, params,
          sinks=None) -> None:
        return None

    _register_mla()
    return getattr(torch.ops, NAMESPACE)


def _register_mla() -> None:
    """The MLA decode ops (`mla_step`): the same tiling, one latent kv head.

    - ``mla_attention(q_nope, q_pe, kv_c_cache, k_pe_cache, block_table, cu_seqlens_q,
      seqlens_kv, step_epoch, tiling_in, out, partial_out, partial_lse, params, kv_lora_rank,
      scale, causal)``: every core; shapes as `triton_mla_launch.launch_mla_attention`
    - ``mla_combine(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse, params,
      kv_lora_rank)``
    """
    from . import mla_step

    @torch.library.custom_op(f"{NAMESPACE}::mla_attention",
                             mutates_args=("out", "partial_out", "partial_lse"))
    def mla_attention(q_nope: Tensor, q_pe: Tensor, kv_c_cache: Tensor, k_pe_cache: Tensor,
                      block_table: Tensor, cu_seqlens_q: Tensor, seqlens_kv: Tensor,
                      step_epoch: Tensor, tiling_in: Tensor, out: Tensor, partial_out: Tensor,
                      partial_lse: Tensor, params: list[int], kv_lora_rank: int, scale: float,
                      causal: bool) -> None:
        for core in range(kernels.params_from(tuple(params)).num_cores):
            mla_step.mla_attention_body(
                core, q_nope=q_nope, q_pe=q_pe, kv_c_cache=kv_c_cache, k_pe_cache=k_pe_cache,
                block_table=block_table, cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv,
                step_epoch=step_epoch, tiling_in=tiling_in, out=out, partial_out=partial_out,
                partial_lse=partial_lse, params=params, kv_lora_rank=kv_lora_rank, scale=scale,
                causal=causal)

    def mla_attention_npu(q_nope, q_pe, kv_c_cache, k_pe_cache, block_table, cu_seqlens_q,
                          seqlens_kv, step_epoch, tiling_in, out, partial_out, partial_lse,
                          params, kv_lora_rank, scale, causal) -> None:
        mla_step.mla_attention_npu(
            q_nope=q_nope, q_pe=q_pe, kv_c_cache=kv_c_cache, k_pe_cache=k_pe_cache,
            block_table=block_table, cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv,
            step_epoch=step_epoch, tiling_in=tiling_in, out=out, partial_out=partial_out,
            partial_lse=partial_lse, params=params, kv_lora_rank=kv_lora_rank, scale=scale,
            causal=causal)

    mla_attention.register_kernel("privateuseone")(mla_attention_npu)

    @mla_attention.register_fake
    def _(q_nope, q_pe, kv_c_cache, k_pe_cache, block_table, cu_seqlens_q, seqlens_kv,
          step_epoch, tiling_in, out, partial_out, partial_lse, params, kv_lora_rank, scale,
          causal) -> None:
        return None

    @torch.library.custom_op(f"{NAMESPACE}::mla_combine", mutates_args=("out",))
    def mla_combine(cu_seqlens_q: Tensor, step_epoch: Tensor, tiling_in: Tensor, out: Tensor,
                    partial_out: Tensor, partial_lse: Tensor, params: list[int],
                    kv_lora_rank: int) -> None:
        mla_step.mla_combine_body(0, cu_seqlens_q=cu_seqlens_q, step_epoch=step_epoch,
                                  tiling_in=tiling_in, out=out, partial_out=partial_out,
                                  partial_lse=partial_lse, params=params,
                                  kv_lora_rank=kv_lora_rank)

    def mla_combine_npu(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse,
                        params, kv_lora_rank) -> None:
        mla_step.mla_combine_npu(cu_seqlens_q=cu_seqlens_q, step_epoch=step_epoch,
                                 tiling_in=tiling_in, out=out, partial_out=partial_out,
                                 partial_lse=partial_lse, params=params,
                                 kv_lora_rank=kv_lora_rank)

    mla_combine.register_kernel("privateuseone")(mla_combine_npu)

    @mla_combine.register_fake
    def _(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse, params,
          kv_lora_rank) -> None:
        return None
