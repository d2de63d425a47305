"""Static (graph-captured) absorbed-MLA decode attention over L layers (issue 20).

DeepSeek-V2/V3/R1 and Kimi-K2 decode with multi-head latent attention. In its absorbed form
it is attention with ONE latent kv head shared by all the rank's query heads: a cache row is
``[kv_c (kv_lora_rank) | k_pe (qk_rope_head_dim)]``, the key; its ``kv_c`` part is the value.
So the tiling kernel plans it unchanged, as GQA with ``num_kv_heads = 1``, ``group =
num_heads`` and ``head_dim = kv_lora_rank + qk_rope_head_dim``, and the same two modes and
placements as `pyruntime.attention.StaticAttention` apply, with the MLA AI Core kernels
(`pyruntime.kernels.mla_step`) in place of the GQA ones.

Example (runs on the CPU backend)::

    import torch
    from pyruntime import backends
    from pyruntime.mla_attention import StaticMLAAttention

    with StaticMLAAttention(backends.get("cpu"), num_layers=2, num_heads=16, kv_lora_rank=64,
                            qk_rope_head_dim=16, block_size=16, num_blocks=32, max_batch=4,
                            max_tokens=8, max_blocks_per_req=8, mode="device_tiling",
                            dtype=torch.bfloat16, softmax_scale=0.1,
                            owns_backend=True) as attn:
        for (q_nope, q_pe), (kv_c, k_pe) in zip(attn.queries, attn.kv_caches):
            q_nope.normal_(); q_pe.normal_(); kv_c.normal_(); k_pe.normal_()   # in place
        attn.capture()
        block_table = torch.arange(32, dtype=torch.int32).reshape(4, 8)
        outs = attn.step(block_table,
                         cu_seqlens_q=torch.tensor([0, 1, 4], dtype=torch.int32),  # MTP: 3
                         seqlens_kv=torch.tensor([50, 20], dtype=torch.int32))
        attn.check()
        outs[0].shape    # torch.Size([8, 16, 64]); rows 4..7 are padding, zero

Cost weights. The tiling's cost model (``aicpu_tiling.h``) charges ``cost_kv_load`` per 16 kv
tokens loaded and ``cost_qk_tile`` per 16 x 16 tile of scores; its defaults (4 : 1) are for
GQA at head_dim 128, where 16 tokens of K and V are 16 x 256 values and a score tile costs
16 x 16 x (128 + 128) multiply-adds. An MLA cache row is read once for K and V (576 values at
DeepSeek-V3 geometry: 2.25 times GQA's 256) while a score tile costs 16 x 16 x (576 + 512)
(4.25 times), so the load : tile ratio becomes 4 x 2.25 : 1 x 4.25, about 2 : 1:
``MLA_COST_KV_LOAD = 2``, ``MLA_COST_QK_TILE = 1``. The segment overhead follows FlashMLA's
``get_mla_metadata`` (deepseek-ai/FlashMLA ``csrc/kernels/get_mla_metadata.cu``:
``fixed_overhead_num_blocks = 5`` blocks of 64 tokens): 5 x 64 tokens at 16 rows (one TP-8
rank's decode token) cost 5 x 4 x (2 + 1) = 60 = ``MLA_COST_SEGMENT``.

Query tile. ``q_tile = max(1, 64 // num_heads)``: a unit holds at most 64 query rows, FlashMLA's
``BLOCK_SIZE_M`` (``s_q x G <= 64`` per m block): at 16 heads an MTP request of up to 4 tokens
is one unit that reads its kv once per row block; at 64 or 128 heads every token is a unit,
as FlashMLA's m blocks split them.

Cache layout. vLLM-Ascend keeps an MLA layer's cache as the pair (nope cache, rope cache):
``vllm_ascend/worker/model_runner_v1.py`` (0.30.0rc2) views the layer's raw tensors as
``k_shape = (num_blocks, block_size, num_kv_heads, kv_lora_rank)`` and ``v_shape =
(num_blocks, block_size, num_kv_heads, qk_rope_head_dim)`` with num_kv_heads = 1 ("k_cache:
nope_cache    v_cache: rope_cache"), and ``AscendMLAImpl._forward_decode`` (``attention/
mla_v1.py``) reads them as ``[num_blocks, 1, block_size, dim]`` views of the same memory (ND
layout; with ``enable_kv_nz`` the caches are in the NZ fractal layout instead, which these
kernels do not read). `kv_caches` here is that pair, so the hook can pass vLLM-Ascend's tensors
without a copy.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from pyruntime.attention import StaticAttention, check_mode
from pyruntime.backends import Backend
from pyruntime.graph_attention.buffers import StaticBuffers, check_dtype
from pyruntime.graph_attention.device_tiling import DeviceTilingPath, PreReplayTilingPath
from pyruntime.graph_attention.errors import AttentionInputError
from pyruntime.graph_attention.host_update import HostUpdatePath
from pyruntime.kernels import mla_step, reference_mla
from pyruntime.tiling import TilingParams

__all__ = ["MLA_COST_KV_LOAD", "MLA_COST_QK_TILE", "MLA_COST_SEGMENT", "MLABuffers",
           "StaticMLAAttention", "mla_tiling_params"]

MLA_COST_KV_LOAD = 2
MLA_COST_QK_TILE = 1
MLA_COST_SEGMENT = 60
#: query rows per unit: FlashMLA's BLOCK_SIZE_M (see the module docstring)
MLA_TILE_ROWS = 64


def mla_tiling_params(*, num_heads: int, kv_lora_rank: int, qk_rope_head_dim: int,
                      block_size: int, max_batch: int, max_tokens: int, max_blocks_per_req: int,
                      num_cores: int, q_tile: int | None = None) -> TilingParams:
    """The `TilingParams` of an MLA layer: one kv head, ``head_dim = kv_lora_rank +
    qk_rope_head_dim``, the MLA cost weights and q_tile of the module docstring.

    Raises:
        pyruntime.tiling.TilingParamsError: a value out of the tiling kernel's range.
    """
    return TilingParams(num_q_heads=num_heads, num_kv_heads=1,
                        head_dim=kv_lora_rank + qk_rope_head_dim, block_size=block_size,
                        max_batch=max_batch, max_tokens=max_tokens,
                        max_blocks_per_req=max_blocks_per_req, num_cores=num_cores,
                        q_tile=q_tile if q_tile is not None
                        else max(1, MLA_TILE_ROWS // max(1, int(num_heads))),
                        cost_kv_load=MLA_COST_KV_LOAD, cost_qk_tile=MLA_COST_QK_TILE,
                        cost_segment=MLA_COST_SEGMENT)


class MLABuffers(StaticBuffers):
    """The device buffers of one MLA bucket; `StaticBuffers`' step buffers and input checks.

    Attributes (device buffers):
        queries: ``num_layers`` x ``(q_nope [max_tokens, H, L], q_pe [max_tokens, H, R])``.
        kv_caches: ``num_layers`` x ``(kv_c [num_blocks, block_size, 1, L], k_pe [num_blocks,
            block_size, 1, R])``.
        outputs: ``num_layers`` x ``[max_tokens, H, L]``.
        block_table, lengths (and its views), tiling: as `StaticBuffers`.
        partial_out: float32 ``[max_partial_slots, q_tile, H, L]``; partial_lse: float32
            ``[max_partial_slots, q_tile, H]``.

    Attributes (layer constants): kv_lora_rank (L), qk_rope_head_dim (R), scale (the
    caller's softmax scale); logits_soft_cap and sinks are None (not MLA features here).
    """

    def __init__(self, backend: Backend, params: TilingParams, *, kv_lora_rank: int,
                 num_layers: int, num_blocks: int, dtype: torch.dtype, scale: float) -> None:
        # StaticBuffers.__init__ would allocate GQA queries and caches; this makes the MLA ones
        # between the same first and last steps (its checks, its step buffers)
        self._begin(backend, params, num_layers=num_layers, num_blocks=num_blocks, dtype=dtype)
        p, alloc, self.scale = params, self._alloc, scale
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, p.head_dim - kv_lora_rank
        self.logits_soft_cap, self.sinks = None, None
        lora, rope, heads = kv_lora_rank, self.qk_rope_head_dim, p.num_q_heads
        self.queries = [(alloc((p.max_tokens, heads, lora), dtype),
                         alloc((p.max_tokens, heads, rope), dtype)) for _ in range(num_layers)]
        self.kv_caches = [(alloc((num_blocks, p.block_size, 1, lora), dtype),
                           alloc((num_blocks, p.block_size, 1, rope), dtype))
                          for _ in range(num_layers)]
        self.outputs = [alloc((p.max_tokens, heads, lora), dtype) for _ in range(num_layers)]
        out_shape, lse_shape = reference_mla.partial_shapes(p, kv_lora_rank)
        self._alloc_step_buffers((max(1, out_shape[0]), *out_shape[1:]),
                                 (max(1, lse_shape[0]), *lse_shape[1:]))


class _MLALayers:
    """The device-tiling paths with MLA layers: the same graph, `mla_step.launch_layer`."""

    def _launch_layers(self) -> None:
        b = self.buffers
        for layer in range(len(b.queries)):
            mla_step.launch_layer(self.backend, b, layer, stream=self.stream,
                                  tiling_in=b.tiling, cu_seqlens_q=b.cu_seqlens_q,
                                  seqlens_kv=b.seqlens_kv, step_epoch=b.step_epoch,
                                  causal=self.causal)


class MLADeviceTilingPath(_MLALayers, DeviceTilingPath):
    """Device tiling, placement ``graph``, MLA layers."""


class MLAPreReplayTilingPath(_MLALayers, PreReplayTilingPath):
    """Device tiling, placement ``pre-replay``, MLA layers."""


class MLAHostUpdatePath(HostUpdatePath):
    """Host update (the vLLM-Ascend baseline's per-layer task-group updates), MLA layers: the
    emulated path's host tiling and our MLA kernels passed the host lengths by value."""

    def _launch_layer(self, layer: int, stream, cu: np.ndarray, kv: np.ndarray, epoch: int):
        be, b = self.backend, self.buffers
        host_tiling = be.plan_on_host(b.params, cu, kv, causal=self.causal, epoch=epoch)
        mla_step.launch_layer(be, b, layer, stream=stream, tiling_in=host_tiling.buffer,
                              cu_seqlens_q=cu, seqlens_kv=kv,
                              step_epoch=np.array([epoch], np.int32), causal=self.causal)
        return host_tiling


_DEVICE_PATHS = {"graph": MLADeviceTilingPath, "pre-replay": MLAPreReplayTilingPath}


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise AttentionInputError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class StaticMLAAttention(StaticAttention):
    """Absorbed-MLA decode over `num_layers` layers, captured once (see the module docstring).

    The life cycle is `StaticAttention`'s, which this class inherits: `capture()`, `step()`,
    `wait()`, `check()`, `close()` and ``with``; only the buffers and the AI Core kernels
    differ. Causal always (decode and MTP speculative decode: a request's query rows are the
    last q_len positions of its kv).

    Args:
        backend: from ``pyruntime.backends.get``.
        num_layers: MLA layers (each has its own queries, caches and output).
        num_heads: the rank's query heads H (128 / TP for DeepSeek-V3: 128, 64, 32 or 16).
        kv_lora_rank: L, the latent width (512 for DeepSeek-V3 and Kimi-K2).
        qk_rope_head_dim: R, the rope part of a key (64), at least 1.
        block_size, num_blocks: KV tokens per cache block, blocks per cache.
        max_batch, max_tokens, max_blocks_per_req: the capture bucket (as StaticAttention).
        mode: ``"device_tiling"`` or ``"host_update"``; placement: ``"graph"`` (default) or
            ``"pre-replay"``, device_tiling only.
        dtype: storage dtype of queries, caches and outputs: torch.float16 or torch.bfloat16,
            or torch.float32 (tests).
        softmax_scale: the caller's scale, a positive finite number (DeepSeek's is
            ``mscale**2 / sqrt(qk_nope_head_dim + qk_rope_head_dim)`` with YaRN).
        num_cores: AI Cores (default: the backend's); q_tile: query tokens per unit (default
            ``max(1, 64 // num_heads)``); owns_backend: as StaticAttention.

    Attributes:
        queries: per layer ``(q_nope [max_tokens, H, L], q_pe [max_tokens, H, R])`` static
            tensors, q_nope already absorbed (W_UK applied); fill them in place.
        kv_caches: per layer ``(kv_c [num_blocks, block_size, 1, L], k_pe [num_blocks,
            block_size, 1, R])``, vLLM-Ascend's MLA cache pair.
        outputs: per layer ``[max_tokens, H, L]`` (the latent output, before W_UV); padding
            rows zero. What `step` returns.
        params: the tiling's `TilingParams` (num_kv_heads 1, head_dim L + R).
        kv_lora_rank, qk_rope_head_dim, softmax_scale: as given.

    Raises:
        ValueError: unknown mode or placement, or a placement with host_update.
        AttentionInputError: a dtype, count or scale that is not valid (typed, before anything
            is allocated); host_update on a backend whose host path is torch_npu's FIA (the
            MLA FIA call is not modelled yet).
        pyruntime.tiling.TilingParamsError: shapes out of the tiling kernel's range.
    """

    _HOST_UPDATE_PATH = MLAHostUpdatePath
    _DEVICE_PATHS = _DEVICE_PATHS

    def __init__(self, backend: Backend, *, num_layers: int, num_heads: int, kv_lora_rank: int,
                 qk_rope_head_dim: int, block_size: int, num_blocks: int, max_batch: int,
                 max_tokens: int, max_blocks_per_req: int, mode: str, dtype: torch.dtype,
                 softmax_scale: float, placement: str | None = None,
                 num_cores: int | None = None, q_tile: int | None = None,
                 owns_backend: bool = False) -> None:
        # StaticAttention's construction path: its backend ownership and clean-up on failure,
        # its mode check; the MLA checks, buffers and paths (_HOST_UPDATE_PATH, _DEVICE_PATHS)
        with self._constructing(backend, owns_backend):
            placement = check_mode(mode, placement)
            if mode == "host_update" and backend.host_update_attention == "fia":
                raise AttentionInputError(
                    f"mode='host_update' on the {backend.name} backend: its host path is "
                    "torch_npu's FIA, whose MLA call (query_rope / key_rope) is not modelled "
                    "here yet; use mode='device_tiling'")
            check_dtype(dtype)
            for name, value in (("num_layers", num_layers), ("num_heads", num_heads),
                                ("kv_lora_rank", kv_lora_rank),
                                ("qk_rope_head_dim", qk_rope_head_dim),
                                ("num_blocks", num_blocks)):
                _positive_int(name, value)
            if (isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))
                    or not math.isfinite(softmax_scale) or softmax_scale <= 0):
                raise AttentionInputError(f"softmax_scale must be a positive finite number, "
                                          f"got {softmax_scale!r}")
            self.mode, self.causal, self.placement = mode, True, placement
            self.logits_soft_cap = None
            self.kv_lora_rank, self.qk_rope_head_dim = int(kv_lora_rank), int(qk_rope_head_dim)
            self.softmax_scale = float(softmax_scale)
            self.params = mla_tiling_params(
                num_heads=num_heads, kv_lora_rank=kv_lora_rank,
                qk_rope_head_dim=qk_rope_head_dim, block_size=block_size, max_batch=max_batch,
                max_tokens=max_tokens, max_blocks_per_req=max_blocks_per_req,
                num_cores=num_cores or backend.default_num_cores, q_tile=q_tile)
            self._start(MLABuffers(backend, self.params, kv_lora_rank=self.kv_lora_rank,
                                   num_layers=num_layers, num_blocks=num_blocks, dtype=dtype,
                                   scale=self.softmax_scale))
