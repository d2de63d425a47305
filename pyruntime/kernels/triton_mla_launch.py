"""Launch the Triton MLA decode kernel (`triton_mla`) and its combine, on CPU tensors or an NPU.

:func:`launch_mla_attention` starts ``params.num_cores`` programs of
``triton_mla.mla_decode_kernel``. :func:`launch_mla_combine` launches the GQA combine kernel
(``triton_attention.attention_combine_kernel``) on :func:`reference_mla.latent_params`, the
params with ``head_dim = kv_lora_rank``: MLA partials and outputs are GQA ones of that width,
one kv head, group = heads (only its row tile is smaller for wide latents). The mode
(interpreter for CPU tensors, Triton-Ascend for ``npu`` tensors) and the compile-time
constants of the tiling ABI come from `triton_launch`, never typed twice.

Example (CPU, interpreted)::

    import torch
    from pyruntime import tiling
    from pyruntime.kernels import reference_mla as rm, triton_mla_launch as tm

    L, R, H = 32, 16, 4
    params = tiling.TilingParams(num_q_heads=H, num_kv_heads=1, head_dim=L + R,
                                 block_size=16, max_batch=2, max_tokens=4,
                                 max_blocks_per_req=4, num_cores=3)
    cu, kv = torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([40, 20], dtype=torch.int32)
    plan = torch.from_numpy(tiling.plan(params, cu.numpy(), kv.numpy()).buffer)
    q_nope, q_pe = torch.randn(4, H, L).half(), torch.randn(4, H, R).half()
    kv_c, k_pe = torch.randn(8, 16, 1, L).half(), torch.randn(8, 16, 1, R).half()
    bt = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    out = torch.empty(4, H, L, dtype=torch.float16)
    po, pl = rm.partial_buffers(params, L)
    epoch = torch.zeros(1, dtype=torch.int32)
    status = tm.launch_mla_attention(params, L, tiling_in=plan, step_epoch=epoch, q_nope=q_nope,
        q_pe=q_pe, kv_c_cache=kv_c, k_pe_cache=k_pe, block_table=bt, cu_seqlens_q=cu,
        seqlens_kv=kv, out=out, partial_out=po, partial_lse=pl, scale=(L + R) ** -0.5)
    tm.launch_mla_combine(params, L, tiling_in=plan, step_epoch=epoch, cu_seqlens_q=cu,
                          out=out, partial_out=po, partial_lse=pl)
    assert status.tolist() == [0, 0, 0]
"""

from __future__ import annotations

import importlib

import torch

from pyruntime.kernels import kv_quant, reference_mla, triton_launch

_KERNELS = "pyruntime.kernels.triton_mla"


def kernels(*, interpret: bool):
    """The MLA kernel module in the requested mode (`triton_launch.kernels` checks the mode
    and sets up the interpreter first; both modules share it).

    Raises:
        triton_launch.TritonUnavailableError: see `triton_launch.kernels`.
    """
    triton_launch.kernels(interpret=interpret)
    return importlib.import_module(_KERNELS)


def block_shapes(params, kv_lora_rank: int) -> dict[str, int]:
    """The tile shapes (compile-time) for MLA rows of ``kv_lora_rank + rope`` values.

    BLOCK_L and BLOCK_R cover the latent and rope parts (powers of two, at least 16, the
    ``tl.dot`` minimum). BLOCK_M is 16 rows (a TP-8 rank's 16 heads of one decode token) and
    BLOCK_N 32 kv tokens (the largest power of two dividing the cache block, at most 32) once
    the latent is 256 wide or more: the fp32 accumulator is BLOCK_M x BLOCK_L and the kv tile
    BLOCK_N x (BLOCK_L + BLOCK_R), so these keep DeepSeek-V3's 512 + 64 inside the A2's UB
    (docs/mla.md has the planned bytes); narrower latents take BLOCK_M up to 64 and BLOCK_N up
    to 64 as the GQA tiles do.
    """
    rope = int(params.head_dim) - int(kv_lora_rank)
    block_l = triton_launch._pow2_at_least(kv_lora_rank, 16)
    wide = block_l >= 256
    rows = int(params.q_tile) * int(params.num_q_heads)
    block_m = min(16 if wide else 64, triton_launch._pow2_at_least(rows, 16))
    block_n = int(params.block_size) & -int(params.block_size)
    block_n = min(block_n, 32 if wide else 64)
    return {"BLOCK_M": block_m, "BLOCK_N": max(block_n, 1), "BLOCK_L": block_l,
            "BLOCK_R": triton_launch._pow2_at_least(rope, 16)}


def _check_shapes(params, kv_lora_rank, q_nope, q_pe, kv_c_cache, k_pe_cache, out) -> None:
    heads, lora = int(params.num_q_heads), int(kv_lora_rank)
    rope, rows = int(params.head_dim) - lora, int(params.max_tokens)
    if out.dtype not in triton_launch.DTYPES:
        raise TypeError(f"out must have one of the dtypes {triton_launch.DTYPES}, got {out.dtype}")
    expected = {"out": (out, (rows, heads, lora)), "q_nope": (q_nope, (rows, heads, lora)),
                "q_pe": (q_pe, (rows, heads, rope))}
    blocks = int(kv_c_cache.shape[0]) if kv_c_cache.dim() == 4 else -1
    expected["kv_c_cache"] = (kv_c_cache, (blocks, int(params.block_size), 1, lora))
    expected["k_pe_cache"] = (k_pe_cache, (blocks, int(params.block_size), 1, rope))
    for name, (t, shape) in expected.items():
        cache = name.endswith("_cache")
        if t.dtype != out.dtype or (not cache and not t.is_contiguous()):
            raise TypeError(f"{name} must be contiguous {out.dtype}, got {t.dtype}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
        if cache:
            kv_quant.contiguous_cache(name, t, kv_quant.MLA_CONTIGUOUS_WHY)


def launch_mla_attention(params, kv_lora_rank: int, *, tiling_in, step_epoch, q_nope, q_pe,
                         kv_c_cache, k_pe_cache, block_table, cu_seqlens_q, seqlens_kv, out,
                         partial_out, partial_lse, scale: float,
                         causal: bool = True,
                         core_status: torch.Tensor | None = None) -> torch.Tensor:
    """Launch the MLA grid (``params.num_cores`` programs) once; returns core_status.

    Args:
        params: the MLA TilingParams the tiling was planned with (one kv head, ``head_dim =
            kv_lora_rank + rope``); kv_lora_rank: L.
        tiling_in, step_epoch, block_table, cu_seqlens_q, seqlens_kv, causal, core_status: as
            for `triton_launch.launch_attention`.
        q_nope ``[max_tokens, H, L]``, q_pe ``[max_tokens, H, R]``, kv_c_cache ``[num_blocks,
        block_size, 1, L]``, k_pe_cache ``[num_blocks, block_size, 1, R]``, out ``[max_tokens,
        H, L]``: one storage dtype; partial_out float32 ``[slots, q_tile, H, L]``,
        partial_lse ``[slots, q_tile, H]`` (`reference_mla.partial_buffers`).
        scale: the softmax scale.

    Raises:
        TypeError, ValueError: wrong dtypes, shapes or params, checked before launching.
        triton_launch.TritonUnavailableError: see :func:`kernels`.
    """
    reference_mla.check_params(params, kv_lora_rank)
    _check_shapes(params, kv_lora_rank, q_nope, q_pe, kv_c_cache, k_pe_cache, out)
    words = triton_launch._words(tiling_in)
    cu_seqlens_q = triton_launch._int32("cu_seqlens_q", cu_seqlens_q)
    seqlens_kv = triton_launch._int32("seqlens_kv", seqlens_kv)
    triton_launch._check_lengths(words, cu_seqlens_q, seqlens_kv)
    module = kernels(interpret=out.device.type == "cpu")
    if core_status is None:
        core_status = torch.empty(params.num_cores, dtype=torch.int32, device=out.device)
    upcast = out.dtype == torch.bfloat16 and out.device.type == "cpu"  # interpreter bf16 dot
    with triton_launch._launch_lock(out.device):
        module.mla_decode_kernel[(params.num_cores,)](
            words, triton_launch._int32("step_epoch", step_epoch), q_nope, q_pe, kv_c_cache,
            k_pe_cache, triton_launch._int32("block_table", block_table), cu_seqlens_q,
            seqlens_kv, out, partial_out, partial_lse, core_status, float(scale),
            int(kv_c_cache.shape[0]), **triton_launch.constants(params, bool(causal)),
            KV_LORA_RANK=int(kv_lora_rank), **block_shapes(params, kv_lora_rank),
            UPCAST_DOT=upcast)
    return core_status


def combine_block_m(params, kv_lora_rank: int) -> int:
    """Rows per combine tile: `triton_launch.block_shapes`' BLOCK_M at ``head_dim =
    kv_lora_rank``, but 16 once the latent is 256 wide or more. At DeepSeek-V3's 512 the GQA
    choice (64 rows for 4 MTP tokens x 16 heads) needs 390 KiB of UB, twice the A2's 192 KB
    (bishengir-compile: "ub overflow, requires 3191040 bits"); 16 rows plan within it
    (docs/mla.md)."""
    block_m = triton_launch.block_shapes(reference_mla.latent_params(params, kv_lora_rank))
    wide = triton_launch._pow2_at_least(kv_lora_rank, 16) >= 256
    return min(block_m["BLOCK_M"], 16) if wide else block_m["BLOCK_M"]


def launch_mla_combine(params, kv_lora_rank: int, *, tiling_in, step_epoch, cu_seqlens_q, out,
                       partial_out, partial_lse, causal: bool = True,
                       combine_status: torch.Tensor | None = None) -> torch.Tensor:
    """The MLA combine: ``triton_attention.attention_combine_kernel`` (no sinks) at
    ``HEAD_DIM = kv_lora_rank``, one program per core, with :func:`combine_block_m` rows per
    tile; merges split units into ``out`` ``[max_tokens, H, L]``, zeroes padding rows, every
    row when the tiling is not OK or stale (as `triton_launch.launch_combine`, whose checks it
    runs); returns combine_status (int32 ``[num_cores]``)."""
    reference_mla.check_params(params, kv_lora_rank)
    latent = reference_mla.latent_params(params, kv_lora_rank)
    triton_launch._check_shapes(latent, None, None, None, out)
    words = triton_launch._words(tiling_in)
    cu_seqlens_q = triton_launch._int32("cu_seqlens_q", cu_seqlens_q)
    triton_launch._check_lengths(words, cu_seqlens_q, None)
    module = kernels(interpret=out.device.type == "cpu")
    if combine_status is None:
        combine_status = torch.empty(params.num_cores, dtype=torch.int32, device=out.device)
    with triton_launch._launch_lock(out.device):
        module.attention_combine_kernel[(params.num_cores,)](
            words, triton_launch._int32("step_epoch", step_epoch), cu_seqlens_q, out,
            partial_out, partial_lse, combine_status, partial_lse,   # sinks: off, never read
            **triton_launch.constants(latent, bool(causal)),
            BLOCK_M=combine_block_m(params, kv_lora_rank),
            BLOCK_D=triton_launch._pow2_at_least(kv_lora_rank, 16),
            BLOCK_Z=min(1024, triton_launch._pow2_at_least(latent.num_q_heads * kv_lora_rank,
                                                           16)),
            USE_SINKS=False)
    return combine_status
