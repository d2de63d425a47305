"""The tiling and attention launches as torch custom ops (``torch.ops.aicpu_tiling.*``).

Registered with `torch.library.custom_op` so they can sit inside a captured torch graph
(``torch.compile`` traces them through their fake implementations, which only declare
that they mutate their output buffers). This module holds the schemas; the bodies are the
kernels', handed over with `provide` when their module is imported (`step` for GQA and the
tiling, `mla_step` for MLA), so neither kernel module and this one import each other. The CPU
implementations run those bodies. The AI Core ops also register an NPU implementation for the
``PrivateUse1`` key (torch_npu's ``npu`` device) that runs the provided one
(``step.attention_npu`` / ``step.combine_npu``, one Triton launch on the current stream). The
AI-CPU tiling op's NPU build is not here.

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
from collections.abc import Callable

import torch

NAMESPACE = "aicpu_tiling"
Tensor = torch.Tensor

#: op name -> (CPU body, NPU body or None), as the kernel modules hand them over (`provide`)
_bodies: dict[str, tuple[Callable[..., None], Callable[..., None] | None]] = {}
#: which module hands each op its bodies (for the error when it has not been imported)
_PROVIDERS = {"plan_tiling": "step", "plan_tilings": "step", "paged_attention": "step",
              "attention_combine": "step", "mla_attention": "mla_step",
              "mla_combine": "mla_step"}


def provide(op: str, cpu: Callable[..., None], npu: Callable[..., None] | None = None) -> None:
    """Hand op `op` its bodies: ``cpu(**args)`` runs the whole op (every core) on CPU tensors,
    ``npu(*args, **kwargs)`` (the op's arguments as the dispatcher passes them) on an NPU.
    `step` and `mla_step` call this when they are imported; calling it again replaces them.

    Raises:
        ValueError: `op` is not one of this module's ops.
    """
    if op not in _PROVIDERS:
        raise ValueError(f"{NAMESPACE}::{op} is not one of the ops this module defines "
                         f"({', '.join(_PROVIDERS)})")
    _bodies[op] = (cpu, npu)


def _body(op: str, npu: bool = False) -> Callable[..., None]:
    body = _bodies.get(op, (None, None))[npu]
    if body is None:
        raise RuntimeError(f"torch.ops.{NAMESPACE}.{op} has no {'NPU' if npu else 'CPU'} body: "
                           f"import pyruntime.kernels.{_PROVIDERS[op]}, which provides it")
    return body


def _npu(op: str) -> Callable[..., None]:
    """The ``PrivateUse1`` implementation of `op`: the provided NPU body, found at call time."""
    def call(*args, **kwargs) -> None:
        _body(op, npu=True)(*args, **kwargs)
    call.__name__ = f"{op}_npu"
    return call


@functools.cache
def ops():
    """Register the ops once; return ``torch.ops.aicpu_tiling``."""

    @torch.library.custom_op(f"{NAMESPACE}::plan_tiling", mutates_args=("tiling_out",))
    def plan_tiling(cu_seqlens_q: Tensor, seqlens_kv: Tensor, batch: Tensor, step_epoch: Tensor,
                    tiling_out: Tensor, params: list[int], causal: bool) -> None:
        _body("plan_tiling")(cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv, batch=batch,
                             step_epoch=step_epoch, tiling_out=tiling_out, params=params,
                             causal=causal)

    @plan_tiling.register_fake
    def _(cu_seqlens_q, seqlens_kv, batch, step_epoch, tiling_out, params, causal) -> None:
        return None

    @torch.library.custom_op(f"{NAMESPACE}::plan_tilings", mutates_args=("tiling_outs",))
    def plan_tilings(cu_seqlens_q: Tensor, seqlens_kv: Tensor, batch: Tensor,
                     step_epoch: Tensor, tiling_outs: list[Tensor], params: list[int],
                     causal: bool) -> None:
        _body("plan_tilings")(cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv, batch=batch,
                              step_epoch=step_epoch, tiling_outs=tiling_outs, params=params,
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
        _body("paged_attention")(
            query=query, key_cache=key_cache, value_cache=value_cache,
            block_table=block_table, cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv,
            step_epoch=step_epoch, tiling_in=tiling_in, out=out, partial_out=partial_out,
            partial_lse=partial_lse, params=params, scale=scale, causal=causal,
            logits_soft_cap=logits_soft_cap, sinks=sinks, sliding_window=sliding_window,
            k_scale=k_scale, k_offset=k_offset, v_scale=v_scale, v_offset=v_offset)

    paged_attention.register_kernel("privateuseone")(_npu("paged_attention"))

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
        _body("attention_combine")(cu_seqlens_q=cu_seqlens_q, step_epoch=step_epoch,
                                   tiling_in=tiling_in, out=out, partial_out=partial_out,
                                   partial_lse=partial_lse, params=params, sinks=sinks)

    attention_combine.register_kernel("privateuseone")(_npu("attention_combine"))

    @attention_combine.register_fake
    def _(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse, params,
          sinks=None) -> None:
        return None

    _register_mla()
    return getattr(torch.ops, NAMESPACE)


def _register_mla() -> None:
    """The MLA decode ops (bodies from `mla_step`): the same tiling, one latent kv head.

    - ``mla_attention(q_nope, q_pe, kv_c_cache, k_pe_cache, block_table, cu_seqlens_q,
      seqlens_kv, step_epoch, tiling_in, out, partial_out, partial_lse, params, kv_lora_rank,
      scale, causal)``: every core; shapes as `triton_mla_launch.launch_mla_attention`
    - ``mla_combine(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse, params,
      kv_lora_rank)``
    """
    @torch.library.custom_op(f"{NAMESPACE}::mla_attention",
                             mutates_args=("out", "partial_out", "partial_lse"))
    def mla_attention(q_nope: Tensor, q_pe: Tensor, kv_c_cache: Tensor, k_pe_cache: Tensor,
                      block_table: Tensor, cu_seqlens_q: Tensor, seqlens_kv: Tensor,
                      step_epoch: Tensor, tiling_in: Tensor, out: Tensor, partial_out: Tensor,
                      partial_lse: Tensor, params: list[int], kv_lora_rank: int, scale: float,
                      causal: bool) -> None:
        _body("mla_attention")(
            q_nope=q_nope, q_pe=q_pe, kv_c_cache=kv_c_cache, k_pe_cache=k_pe_cache,
            block_table=block_table, cu_seqlens_q=cu_seqlens_q, seqlens_kv=seqlens_kv,
            step_epoch=step_epoch, tiling_in=tiling_in, out=out, partial_out=partial_out,
            partial_lse=partial_lse, params=params, kv_lora_rank=kv_lora_rank, scale=scale,
            causal=causal)

    mla_attention.register_kernel("privateuseone")(_npu("mla_attention"))

    @mla_attention.register_fake
    def _(q_nope, q_pe, kv_c_cache, k_pe_cache, block_table, cu_seqlens_q, seqlens_kv,
          step_epoch, tiling_in, out, partial_out, partial_lse, params, kv_lora_rank, scale,
          causal) -> None:
        return None

    @torch.library.custom_op(f"{NAMESPACE}::mla_combine", mutates_args=("out",))
    def mla_combine(cu_seqlens_q: Tensor, step_epoch: Tensor, tiling_in: Tensor, out: Tensor,
                    partial_out: Tensor, partial_lse: Tensor, params: list[int],
                    kv_lora_rank: int) -> None:
        _body("mla_combine")(cu_seqlens_q=cu_seqlens_q, step_epoch=step_epoch,
                             tiling_in=tiling_in, out=out, partial_out=partial_out,
                             partial_lse=partial_lse, params=params, kv_lora_rank=kv_lora_rank)

    mla_combine.register_kernel("privateuseone")(_npu("mla_combine"))

    @mla_combine.register_fake
    def _(cu_seqlens_q, step_epoch, tiling_in, out, partial_out, partial_lse, params,
          kv_lora_rank) -> None:
        return None
