"""The AI Core attention kernels in Triton, driven by the device tiling (one source, two places).

``paged_attention_kernel`` is what each AI Core does with its range of a tiling
(``aicpu_kernels/aicpu_tiling.h``); ``attention_combine_kernel`` merges split-KV pieces and
zeroes padding rows. The walk over a core's units and their kv splits is ``_walk_core``, written
once for both attention kernels: this one passes it ``_segment`` (the GQA rows of one unit over
a kv range), ``triton_mla.mla_decode_kernel`` its MLA segment. They compute what the C
reference does (``aicpu_kernels/attention_ref.h``: same row order, same partial layout
``[slot][token in tile][group member]``, same natural-log LSE with ``-inf`` for a piece that
sees no position and ``+inf`` for a poisoned piece), so the two are interchangeable behind
`pyruntime.kernels.step`.

The same source runs under Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1`` with
upstream ``triton``) and compiles with Triton-Ascend for an Ascend NPU; `triton_launch` picks
the mode and fills the compile-time constants. Never import this module directly to launch:
whether ``@triton.jit`` builds an interpreted or a compiled function is decided when the
module is imported (``triton/runtime/jit.py::jit`` reads ``knobs.runtime.interpret``).

Constraints this code relies on, with their sources (check them on hardware):

- Grid = ``num_cores`` programs, fixed at capture, one per physical AI Core: Triton-Ascend
  binds each grid program to a physical core; programs beyond the core count run "in a new
  round" (triton-ascend ``docs/en/programming_guide/index.md``, "Setting the Maximum Number of
  Hardware Cores"; ``docs/en/migration_guide/architecture_difference.md``: grid size at most
  the AI Core count, at most 65,535). A kernel with ``tl.dot`` is a CV (cube + vector)
  kernel, so ``num_cores`` should be the *cube* core count (``num_aicore`` of
  ``driver.active.utils.get_device_properties``), e.g. 24 on a 910B3 (the tiling's
  ``num_cores``; the NPU backend's default).
- Loop bounds loaded from memory (``for r in range(begin_r, last_r + 1)`` with bounds read from
  the tiling) compile to ``scf.for`` with dynamic bounds: the probe in issue 9 compiled such
  a loop with triton-ascend 3.2.0 to TTIR and linalg and through ``bishengir-compile`` to
  HIVM; the same programming guide's examples use ``range(pid, NUM_BLOCKS, NUM_CORE)``.
  No ``while``, ``break``, ``continue`` or early ``return``: work is skipped by ``if`` on
  scalar flags, so every program's control flow is structured ``scf.for``/``scf.if``.
- ``tl.dot`` shapes: M = ``BLOCK_M``, N = ``BLOCK_N``, K = ``BLOCK_D`` are powers of two and at
  least 16 (upstream Triton's ``tl.dot`` minimum; triton-ascend
  ``docs/en/programming_guide/cube_operator.md`` asks for M/N/K tiles the cube supports).
  Operands are fp16 or bf16 with fp32 accumulation (the cube's native inputs); fp32 storage
  also works (the interpreter computes it exactly; on the NPU it depends on the cube's fp32
  mode and is not checked here). P is rounded to the storage dtype before the PV product, as
  in Triton's fused-attention tutorial and triton-ascend's
  ``docs/en/examples/04_fused_attention_example.md``.
- On-chip budget: Atlas A2 has 192 KB of UB per core (triton-ascend programming guide,
  "Tiling Optimization"). `triton_launch.block_shapes` picks ``BLOCK_M <= 64`` and
  ``BLOCK_N <= 128``. For 32/8 heads, head_dim 128, block 128, bf16, BiShengIR's memory
  planning placed the attention kernel's buffers in 180 KiB of UB (56 KiB L1, 48 KiB L0C)
  with the default tiles (q_tile 32: BLOCK_M 64, BLOCK_N 64) and in 103 KiB of UB with the
  decode tiles (q_tile 1: BLOCK_M 16, BLOCK_N 128); the combine in 105 / 28 KiB (the
  highest static ``pointer_cast`` offsets of ``module.hivm.opt.mlir``, reported by
  ``tools/ascend_compile.py [--q-tile 1]``). With ``USE_SOFT_CAP`` the attention kernel plans
  181 KiB and 135 KiB; with ``USE_SINKS`` 180.3 and 103.8 KiB, the combine 107 and 29 KiB; with
  ``KV_INT8`` 190.0 and 184.0 KiB (the int8 -> bf16 casts lower through f32 tiles). It fits,
  with little room at the default tiles (and for int8 at both), so larger tiles (or more
  per-score work) need that check again.
- The last axis of every tile is head_dim (contiguous in query, caches, output and
  partials), the alignment the guide asks for ("Aligning the Size of the Tail Axis").
- Upstream interpreter bug worked around by ``UPCAST_DOT``: ``tl.dot`` on bf16 operands
  multiplies the raw uint16 storage (``triton/runtime/interpreter.py``,
  ``InterpreterBuilder.create_dot`` calls ``np.matmul`` on the bf16 bit patterns; seen with
  triton 3.9.0). The launcher sets ``UPCAST_DOT`` for bf16 under the interpreter only: the
  operands are widened to fp32 first, which is exact, so the products are those of the cube.
- The logits soft cap (``USE_SOFT_CAP``, a compile-time switch; the cap itself, ``soft_cap``,
  is a runtime fp32 scalar, so one compiled kernel serves every cap value) caps the scores
  after the scale and before the mask, as vLLM's Triton path does. Its tanh is built from
  ``tl.exp`` (:func:`_soft_cap`): ``tl`` has no tanh that both upstream Triton and
  Triton-Ascend provide, and the kernel already lowers exp, abs, division and selects. With
  ``USE_SOFT_CAP`` off the branch is not compiled: the kernel is the uncapped one.
- Attention sinks (gpt-oss; ``USE_SINKS``, a compile-time switch in both kernels; ``sinks`` is
  an fp32 ``[num_q_heads]`` pointer read only when it is on): query head h's softmax gains
  ``exp(sinks[h] - m)`` in its denominator and nothing in its numerator, as vLLM's
  ``sinks`` (``vllm/v1/attention/ops/triton_unified_attention.py`` starts a row's first
  segment at ``M = sink``, ``L = 1``; only the first, so the sink counts once). Here too each
  row gets it once: a whole unit adds it when it normalises (``_segment``); a piece stores its
  lse without it and the combine merges the sink as one more piece (lse = sink, output 0).
  With ``USE_SINKS`` off neither branch is compiled. The soft cap caps scores, not the sink.
- The sliding window (``USE_WINDOW``, a compile-time switch of the attention kernel;
  ``sliding_window``, the window W, an int32 runtime scalar read only when it is on; causal
  only): the row at position p sees only the keys ``p - W < j <= p`` (the model's window, as
  Hugging Face's masks and vLLM's FlashAttention ``(W - 1, 0)``). Rows of a unit start their
  windows at different positions, so the mask is per row; a row block reads no block below
  its lowest window start, and a unit none below ``first = max(0, p0 - W + 1) // block_size``
  (p0 its first row's position), whatever the tiling's blocks: an ABI v4 tiling gives every
  unit all its blocks, from v5 a unit's blocks are [first, last) in absolute columns; both
  work, told apart by the core record where the block index alone is ambiguous (the C
  reference's ``begins_inside``). A piece left with no block writes lse = -inf, which the
  combine already merges with weight 0, so the combine kernel has no window switch. With it
  off nothing is compiled.
- The int8 KV cache (``KV_INT8``, a compile-time switch of the attention kernel; ``k_scale``,
  ``k_offset``, ``v_scale``, ``v_offset``, fp32 ``[num_kv_heads][head_dim]`` pointers read only
  when it is on): the caches hold int8 and a stored x of kv head h, dim d means
  ``(x - offset[h][d]) * scale[h][d]`` (vLLM-Ascend 0.30.0rc2's C8,
  ``vllm_ascend/attention/attention_v1.py``: ``_quantize_kv_to_int8`` stores
  ``round(x / scale + offset)``). Each K and V tile is dequantised in fp32 and rounded to the
  query's dtype for the cube, the operands an fp16/bf16 cache would give; accumulation stays
  fp32. The combine is unchanged. With it off nothing is compiled. ``KV_NZ`` (with ``KV_INT8``)
  reads the caches in vLLM-Ascend's C8 NZ layout ``[num_blocks, num_kv_heads, head_dim / 32,
  block_size, 32]`` (``vllm_ascend/attention/attention_v1.py``,
  ``AscendC8AttentionBackendImpl._nz_5d_view``): only the K and V tile offsets change (a
  token's 32-wide parts ``block_size * 32`` apart), so tiles and dequantisation are the ND ones.
- Device-side checks never read out of bounds: every index read from the tiling or the length
  arrays is range-checked before it addresses memory, and a block id outside
  ``[0, num_blocks)`` turns the segment into zeros (``lse = +inf`` for a piece), as in the C
  reference; each program reports its status in ``core_status[pid]``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _less(a_r, a_h, a_t, a_k, b_r, b_h, b_t, b_k):
    """Position a before position b in the tiling's head-major work order: the record words
    are (r, h, t, k), positions compare lexicographically as (h, r, t, k)."""
    return (a_h < b_h) | ((a_h == b_h) & ((a_r < b_r) | ((a_r == b_r) & (
        (a_t < b_t) | ((a_t == b_t) & (a_k < b_k))))))


@triton.jit
def _tiling_status(tiling, step_epoch, NUM_CORES: tl.constexpr, CAUSAL: tl.constexpr,
                   CHECK_FLAGS: tl.constexpr, MAGIC: tl.constexpr, VERSION: tl.constexpr,
                   OK: tl.constexpr, E_TILING: tl.constexpr, E_STALE: tl.constexpr,
                   HDR_MAGIC: tl.constexpr, HDR_VERSION: tl.constexpr, HDR_STATUS: tl.constexpr,
                   HDR_NUM_CORES: tl.constexpr, HDR_FLAGS: tl.constexpr,
                   HDR_EPOCH: tl.constexpr):
    """Whether both kernels may use the buffer (the C ``header_ok`` and status checks).

    OK for a tiling made for these params (and, with CHECK_FLAGS, these flags) and for this
    step (its header epoch equals ``step_epoch[0]``, the epoch the host wrote beside the
    step's lengths) whose status is OK. Otherwise: E_TILING for a buffer that is not such a
    tiling, E_STALE for a tiling planned for another step (e.g. a captured tiling task that
    replay did not re-run), else the tiling's own status. The one place every header check
    lives, for both kernels; any status but OK means no attention work and all-zero rows.
    """
    header_ok = ((tl.load(tiling + HDR_MAGIC) == MAGIC)
                 & (tl.load(tiling + HDR_VERSION) == VERSION)
                 & (tl.load(tiling + HDR_NUM_CORES) == NUM_CORES))
    fresh = tl.load(tiling + HDR_EPOCH) == tl.load(step_epoch)
    planned = tl.load(tiling + HDR_STATUS)
    status = tl.where(header_ok, tl.where(fresh, planned, E_STALE), E_TILING)
    if CHECK_FLAGS:
        flags_ok = tl.load(tiling + HDR_FLAGS) == CAUSAL
        status = tl.where((status == OK) & ~flags_ok, E_TILING, status)
    return status


@triton.jit
def _request(cu_seqlens_q, seqlens_kv, r, MAX_TOKENS: tl.constexpr, KV_CAPACITY: tl.constexpr,
             CAUSAL: tl.constexpr):
    """(q_start, q_len, kv_len, ok) of live request r, re-checked like the C ``load_request``."""
    lo = tl.load(cu_seqlens_q + r)
    hi = tl.load(cu_seqlens_q + r + 1)
    kv = tl.load(seqlens_kv + r)
    ok = (lo >= 0) & (hi >= lo) & (hi <= MAX_TOKENS) & (kv >= 0) & (kv <= KV_CAPACITY)
    if CAUSAL:
        ok = ok & (kv >= hi - lo)
    else:
        ok = ok & ((hi == lo) | (kv > 0))
    return lo, tl.where(ok, hi - lo, 0), tl.where(ok, kv, 0), ok


@triton.jit
def _walk_core(SEGMENT: tl.constexpr, tiling, step_epoch, cu_seqlens_q, seqlens_kv, block_table,
               core_status, num_blocks, query, query_rope, key_cache, key_rope_cache,
               value_cache, out, partial_out, partial_lse, scale, soft_cap, sinks,
               sliding_window, k_scale, k_offset, v_scale, v_offset, key_page_stride,
               value_page_stride,
               NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, VALUE_DIM: tl.constexpr,
               ROPE_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, MAX_BATCH: tl.constexpr,
               MAX_TOKENS: tl.constexpr, MAX_BLOCKS_PER_REQ: tl.constexpr,
               NUM_CORES: tl.constexpr, Q_TILE: tl.constexpr, MAX_SLOTS: tl.constexpr,
               CAUSAL: tl.constexpr, MAGIC: tl.constexpr, VERSION: tl.constexpr,
               OK: tl.constexpr, E_TILING: tl.constexpr, E_BLOCK_ID: tl.constexpr,
               E_STALE: tl.constexpr, HDR_EPOCH: tl.constexpr, HDR_MAGIC: tl.constexpr,
               HDR_VERSION: tl.constexpr, HDR_STATUS: tl.constexpr, HDR_BATCH: tl.constexpr,
               HDR_NUM_CORES: tl.constexpr, HDR_FLAGS: tl.constexpr,
               HEADER_WORDS: tl.constexpr, CORE_WORDS: tl.constexpr, CORE_BEGIN: tl.constexpr,
               CORE_END: tl.constexpr, CORE_FIRST_SLOT: tl.constexpr,
               CORE_LAST_SLOT: tl.constexpr, CORE_NUM_SEGMENTS: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
               BLOCK_R: tl.constexpr, UPCAST_DOT: tl.constexpr, USE_SOFT_CAP: tl.constexpr,
               USE_SINKS: tl.constexpr, USE_WINDOW: tl.constexpr, KV_INT8: tl.constexpr,
               KV_NZ: tl.constexpr):
    """Program ``pid`` = AI Core ``pid`` walks its range [begin, end) of the tiling and hands
    each segment (kv blocks [kb, ke) of one unit) to ``SEGMENT``; the one walk of both attention
    kernels (GQA ``_segment``, MLA ``triton_mla._mla_segment``), as ``aicpu_tiling.h`` defines
    it. Writes the program's status to ``core_status[pid]``: OK, the tiling's own status when it
    is not OK (nothing done), E_STALE (planned for another step: nothing done), E_TILING (the
    buffer or lengths do not match; nothing more done) or E_BLOCK_ID (the affected segments
    are zeros, the rest computed).

    The units come in the head-major work order (kv head, request, query tile;
    ``aicpu_tiling.h``, THE WORK ORDER) from three nested loops with bounds read from the core
    record, so requests without query tokens cost one check and no loop. The end of the work
    is the position (0, num_kv_heads, 0, 0), past every head. Every bound is range-checked
    before it addresses memory, and only the blocks a segment reads have their ids checked.
    With USE_WINDOW (causal only) a unit is read from the first block of its first row's
    window, whatever blocks the tiling gave it (ABI v4 gives all, v5 [first, last)).

    ``SEGMENT`` is a ``@triton.jit`` function passed as a constexpr (inlined where it is
    called; Triton 3.2, Triton-Ascend's base, has no tuple arguments, so the walk forwards the
    geometry's operands one by one). It is called positionally as

        SEGMENT(query, query_rope, key_cache, key_rope_cache, value_cache, block_table, out,
                partial_out, partial_lse, scale, soft_cap, sinks, sliding_window, k_scale,
                k_offset, v_scale, v_offset, key_page_stride, value_page_stride, r, h, t, kb,
                ke, slot, blocks_ok, q_start, q_len, kv_len, NUM_Q_HEADS, NUM_KV_HEADS, VALUE_DIM, ROPE_DIM, BLOCK_SIZE,
                MAX_BLOCKS_PER_REQ, Q_TILE, CAUSAL, BLOCK_M, BLOCK_N, BLOCK_V, BLOCK_R,
                UPCAST_DOT, USE_SOFT_CAP, USE_SINKS, USE_WINDOW, KV_INT8, KV_NZ)

    for each segment: rows of unit (r, h, t) attend to kv blocks [kb, ke) (``kb`` the first
    block read); ``slot`` < 0 for a whole unit (it writes ``out``), else the partial slot of
    its piece; ``blocks_ok`` false when a block id in [kb, ke) is out of range (the segment
    writes zeros, a piece ``lse = +inf``). The operands are the geometry's and the walk never
    reads them: ``query_rope`` / ``key_rope_cache`` / ``ROPE_DIM`` / ``BLOCK_R`` are MLA's rope
    parts (None / 0 for GQA), the soft cap, sinks, window and int8 operands GQA's variants
    (None and off for MLA); ``VALUE_DIM`` / ``BLOCK_V`` are the width of the query, value and
    output rows and its tile (GQA head_dim, MLA kv_lora_rank).
    """
    pid = tl.program_id(0)
    status = _tiling_status(tiling, step_epoch, NUM_CORES, CAUSAL, True, MAGIC, VERSION, OK,
                            E_TILING, E_STALE, HDR_MAGIC, HDR_VERSION, HDR_STATUS,
                            HDR_NUM_CORES, HDR_FLAGS, HDR_EPOCH)
    batch = tl.load(tiling + HDR_BATCH)
    status = tl.where((status == OK) & ((batch < 0) | (batch > MAX_BATCH)), E_TILING, status)
    rec = tiling + HEADER_WORDS + pid * CORE_WORDS
    b_r = tl.load(rec + CORE_BEGIN)
    b_h = tl.load(rec + CORE_BEGIN + 1)
    b_t = tl.load(rec + CORE_BEGIN + 2)
    b_k = tl.load(rec + CORE_BEGIN + 3)
    e_r = tl.load(rec + CORE_END)
    e_h = tl.load(rec + CORE_END + 1)
    e_t = tl.load(rec + CORE_END + 2)
    e_k = tl.load(rec + CORE_END + 3)
    first_slot = tl.load(rec + CORE_FIRST_SLOT)
    last_slot = tl.load(rec + CORE_LAST_SLOT)
    num_segments = tl.load(rec + CORE_NUM_SEGMENTS)
    busy = _less(b_r, b_h, b_t, b_k, e_r, e_h, e_t, e_k)
    # end may be the end of the work, (0, num_kv_heads, 0, 0)
    in_range = ((b_r >= 0) & (b_r < batch) & (e_r >= 0) & (e_r <= batch) & (b_h >= 0)
                & (b_h < NUM_KV_HEADS) & (e_h >= 0) & (e_h <= NUM_KV_HEADS) & (b_t >= 0)
                & (e_t >= 0) & (b_k >= 0) & (e_k >= 0))
    status = tl.where((status == OK) & busy & ~in_range, E_TILING, status)
    walked = pid * 0                         # int32 scalar, loop-carried
    if (status == OK) & busy:   # an idle core (begin == end) or a bad tiling does nothing
        KV_CAPACITY: tl.constexpr = MAX_BLOCKS_PER_REQ * BLOCK_SIZE
        if NUM_KV_HEADS == 1:
            # in range, the one head is 0 (MLA's latent head): constant bounds, so the
            # compiler folds the head loop away (the loop cost MLA's decode kernel 2.2 KiB of
            # UB in BiShengIR's plan)
            h_lo: tl.constexpr = 0
            h_end: tl.constexpr = 1
        else:
            h_lo = b_h
            h_end = tl.minimum(e_h, NUM_KV_HEADS - 1) + 1
        for h in range(h_lo, h_end):
            r_lo = tl.where(h == b_h, b_r, 0)
            r_hi = tl.minimum(tl.where(h == e_h, e_r + 1, batch), batch)
            for r in range(r_lo, r_hi):
                q_start, q_len, kv_len, req_ok = _request(cu_seqlens_q, seqlens_kv, r,
                                                          MAX_TOKENS, KV_CAPACITY, CAUSAL)
                status = tl.where(req_ok, status, E_TILING)
                num_tiles = tl.cdiv(q_len, Q_TILE)
                t_lo = tl.where((h == b_h) & (r == b_r), b_t, 0)
                t_hi = tl.minimum(tl.where((h == e_h) & (r == e_r), e_t + 1, num_tiles),
                                  num_tiles)
                for t in range(t_lo, t_hi):
                    if CAUSAL:
                        kv_end = kv_len - q_len + tl.minimum((t + 1) * Q_TILE, q_len)
                    else:
                        kv_end = kv_len
                    num_kv_blocks = tl.cdiv(kv_end, BLOCK_SIZE)
                    at_begin = (h == b_h) & (r == b_r) & (t == b_t)
                    at_end = (h == e_h) & (r == e_r) & (t == e_t)
                    kb = tl.where(at_begin, b_k, 0)
                    ke = tl.where(at_end, e_k, num_kv_blocks)
                    kr = kb             # the first block read
                    inside = kb > 0     # the core begins inside a unit the tiling cut
                    has_segment = ke > kb
                    if USE_WINDOW:
                        # the unit's first block in its first row's window (the C
                        # window_first_block). A tiling that knows no window (ABI v4) starts
                        # units at 0, one planned with it (v5) at `first`: 0 < k <= first is a
                        # unit start there unless the record says otherwise (the C
                        # begins_inside and walk_range: a continuation has a slot; an end
                        # there is a cut only while segments remain)
                        first = tl.maximum(kv_len - q_len + t * Q_TILE - sliding_window + 1,
                                           0) // BLOCK_SIZE
                        kr = tl.maximum(kb, first)
                        inside = (kb > first) | ((kb > 0) & (first_slot >= 0))
                        names_start = at_end & (ke > 0) & (ke <= first) & (walked
                                                                           == num_segments)
                        has_segment = has_segment & ~names_start
                    if has_segment:
                        piece = inside | (ke < num_kv_blocks)
                        # only a core's first segment starts inside a unit, only its last ends
                        # inside one (aicpu_tiling.h, core record)
                        slot = tl.where(piece, tl.where(walked == 0, first_slot, last_slot), -1)
                        seg_ok = (ke <= num_kv_blocks) & (~piece | ((slot >= 0)
                                                                    & (slot < MAX_SLOTS)))
                        status = tl.where(seg_ok, status, E_TILING)
                        if seg_ok:
                            bad_ids = kb * 0
                            for b in range(kr, ke):   # only the blocks read are checked
                                block_id = tl.load(block_table + r * MAX_BLOCKS_PER_REQ + b)
                                bad_ids += ((block_id < 0) | (block_id >= num_blocks)).to(
                                    tl.int32)
                            blocks_ok = bad_ids == 0
                            status = tl.where(blocks_ok | (status != OK), status, E_BLOCK_ID)
                            SEGMENT(query, query_rope, key_cache, key_rope_cache, value_cache,
                                    block_table, out, partial_out, partial_lse, scale, soft_cap,
                                    sinks, sliding_window, k_scale, k_offset, v_scale, v_offset,
                                    key_page_stride, value_page_stride, r, h, t, kr, ke, slot, blocks_ok, q_start, q_len, kv_len,
                                    NUM_Q_HEADS, NUM_KV_HEADS, VALUE_DIM, ROPE_DIM, BLOCK_SIZE,
                                    MAX_BLOCKS_PER_REQ, Q_TILE, CAUSAL, BLOCK_M, BLOCK_N,
                                    BLOCK_V, BLOCK_R, UPCAST_DOT, USE_SOFT_CAP, USE_SINKS,
                                    USE_WINDOW, KV_INT8, KV_NZ)
                        walked += 1
        status = tl.where((status == OK) & (walked != num_segments), E_TILING, status)
    tl.store(core_status + pid, status)


@triton.jit
def _soft_cap(s, cap):
    """``cap * tanh(s / cap)`` elementwise in fp32, from ``tl.exp`` only.

    tanh|x| = (1 - e) / (1 + e) with e = exp(-2|x|), which cannot overflow. Against float64
    tanh its absolute error is at most 1.1e-7 over all fp32 inputs (a numpy check), so a capped
    score, which lies in (-cap, cap), is within about 1.1e-7 * cap (two ulp of cap) of the
    exact one; for small |x| that is more than a relative ulp of the score (1 - e cancels), which
    only matters next to scores of size cap, whose own fp32 rounding is that large. A more
    accurate form (an odd polynomial below |x| = 0.25) needed two more [BLOCK_M, BLOCK_N] fp32
    tiles: 211 KiB of UB at the default tiles, over the A2's 192 KB (bishengir-compile, through
    ``tools/ascend_compile.py``); this one plans 181 KiB.
    """
    x = s * (1.0 / cap)
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return cap * tl.where(x < 0.0, -t, t)


@triton.jit
def _segment(query, query_rope, key_cache, key_rope_cache, value_cache, block_table, out,
             partial_out, partial_lse, scale, soft_cap, sinks, sliding_window, k_scale, k_offset,
             v_scale, v_offset, key_page_stride, value_page_stride, r, h, t, kb, ke, slot,
             blocks_ok, q_start, q_len, kv_len,
             NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
             ROPE_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, MAX_BLOCKS_PER_REQ: tl.constexpr,
             Q_TILE: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
             UPCAST_DOT: tl.constexpr, USE_SOFT_CAP: tl.constexpr, USE_SINKS: tl.constexpr,
             USE_WINDOW: tl.constexpr, KV_INT8: tl.constexpr, KV_NZ: tl.constexpr):
    """The GQA segment of `_walk_core` (its SEGMENT, whose parameters these are; MLA's rope
    parts, ``query_rope``, ``key_rope_cache``, ``ROPE_DIM``, ``BLOCK_R``, are None / 0 here).
    Kv blocks [kb, ke) of unit (r, h, t): its rows (token in tile, group member) attend with
    kv head h. A whole unit (slot < 0) writes its output rows; a piece writes slot ``slot``.
    With USE_SOFT_CAP every score is capped to ``soft_cap * tanh(s / soft_cap)`` first; with
    USE_SINKS a whole unit's row adds ``exp(sinks[q head] - m)`` to its denominator; with
    USE_WINDOW (causal only) the row at position p sees only ``p - sliding_window < j <= p``,
    and no block below the row block's lowest window start is read (an empty range leaves the
    rows unseen: a piece then writes lse = -inf and a zero output). With KV_INT8 the caches are
    int8 and each K and V tile is dequantised in fp32, ``(x - offset) * scale`` with kv head h's
    per-dim scale and offset, then rounded to the query's dtype for the dot, as an fp16/bf16
    cache would be read. With KV_NZ (int8 only) the caches are in vLLM-Ascend's NZ layout
    [num_blocks, num_kv_heads, head_dim / 32, block_size, 32]: a tile's token n of kv head h
    starts at ``(block_id * H + h) * D * BS + n * 32`` and its dim d lies ``(d // 32) * BS * 32
    + d % 32`` further; tiles are loaded as [BLOCK_N, BLOCK_D / 32, 32] and reshaped, the same
    values as ND, so the rest is unchanged. In both layouts cache block ``block_id`` starts
    ``block_id * key_page_stride`` elements into the key cache (``value_page_stride`` for the
    value cache): a block's own size when the cache is contiguous, twice that for vLLM-Ascend
    0.30's K and V pages side by side (`kv_quant.page_strides`); the blocks are read in place."""
    GROUP: tl.constexpr = NUM_Q_HEADS // NUM_KV_HEADS
    tok0 = t * Q_TILE
    ntok = tl.minimum(q_len - tok0, Q_TILE)
    rows = ntok * GROUP
    shift = kv_len - q_len
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    bt_row = block_table + r * MAX_BLOCKS_PER_REQ
    if KV_NZ:
        # NZ: a tile is loaded as [BLOCK_N, BLOCK_D / 32, 32] (token, part, dim in part), each
        # axis affine (token stride 32, part stride BLOCK_SIZE * 32, dims contiguous), then
        # reshaped to [BLOCK_N, BLOCK_D]: dim d = 32 * part + dim in part. One flat
        # [BLOCK_N, BLOCK_D] index, (d // 32) * BLOCK_SIZE * 32 + d % 32, is not affine in d
        # and Triton-Ascend lowered it to an element-by-element gather loop
        offs_p = tl.arange(0, BLOCK_D // 32)
        nz_col = offs_p[:, None] * (BLOCK_SIZE * 32) + tl.arange(0, 32)[None, :]
        p_ok = offs_p < HEAD_DIM // 32
    if KV_INT8:   # kv head h's per-channel scales and offsets, [1, BLOCK_D] each, once a segment
        ch = h * HEAD_DIM + offs_d
        k_sc = tl.load(k_scale + ch, mask=d_ok, other=0.0)[None, :]
        k_off = tl.load(k_offset + ch, mask=d_ok, other=0.0)[None, :]
        v_sc = tl.load(v_scale + ch, mask=d_ok, other=0.0)[None, :]
        v_off = tl.load(v_offset + ch, mask=d_ok, other=0.0)[None, :]
    for m0 in range(0, rows, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)           # row = token in tile * GROUP + member
        row_ok = offs_m < rows
        tok = offs_m // GROUP
        q_head = h * GROUP + offs_m % GROUP
        q_at = ((q_start + tok0 + tok).to(tl.int64) * NUM_Q_HEADS + q_head) * HEAD_DIM
        q = tl.load(query + q_at[:, None] + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST_DOT:
            q = q.to(tl.float32)
        if CAUSAL:
            limit = tl.where(row_ok, shift + tok0 + tok + 1, 0)   # row sees [0, limit)
        else:
            limit = tl.where(row_ok, kv_len, 0)
        kv_hi = tl.minimum(tl.max(limit, axis=0), ke * BLOCK_SIZE)
        b_hi = tl.where(blocks_ok, tl.minimum(ke, tl.cdiv(kv_hi, BLOCK_SIZE)), kb)
        b_lo = kb
        if USE_WINDOW:   # the row sees [lower, limit); the first row of the block starts lowest
            lower = tl.maximum(limit - sliding_window, 0)
            lo_min = tl.min(tl.where(row_ok, lower, kv_hi), axis=0)
            b_lo = tl.maximum(kb, lo_min // BLOCK_SIZE)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for b in range(b_lo, b_hi):
            block_id = tl.load(bt_row + b).to(tl.int64)
            k_block = key_cache + block_id * key_page_stride      # the block's first element
            v_block = value_cache + block_id * value_page_stride
            for c0 in range(0, BLOCK_SIZE, BLOCK_N):
                offs_n = c0 + tl.arange(0, BLOCK_N)       # token in the cache block
                pos = b * BLOCK_SIZE + offs_n              # kv position in the request
                kv_ok = pos < kv_hi
                if KV_NZ:
                    nz_at = (h * (HEAD_DIM * BLOCK_SIZE)
                             + offs_n[:, None, None] * 32 + nz_col[None, :, :])
                    nz_mask = kv_ok[:, None, None] & p_ok[None, :, None]
                    k = tl.reshape(tl.load(k_block + nz_at, mask=nz_mask, other=0),
                                   (BLOCK_N, BLOCK_D))
                else:
                    kv_at = (offs_n * NUM_KV_HEADS + h) * HEAD_DIM
                    kv_mask = kv_ok[:, None] & d_ok[None, :]
                    k = tl.load(k_block + kv_at[:, None] + offs_d[None, :], mask=kv_mask,
                                other=0.0)
                if KV_INT8:
                    k = ((k.to(tl.float32) - k_off) * k_sc).to(q.dtype)
                if UPCAST_DOT:
                    k = k.to(tl.float32)
                s = tl.dot(q, tl.trans(k)) * scale
                if USE_SOFT_CAP:   # after the scale, before the mask (vLLM's order)
                    s = _soft_cap(s, soft_cap)
                if USE_WINDOW:
                    s = tl.where((pos[None, :] < limit[:, None])
                                 & (pos[None, :] >= lower[:, None]), s, float("-inf"))
                else:
                    s = tl.where(pos[None, :] < limit[:, None], s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing
                alpha = tl.exp(m_i - m_use)
                p = tl.exp(s - m_use[:, None])
                l_i = l_i * alpha + tl.sum(p, axis=1)
                if KV_NZ:
                    v = tl.reshape(tl.load(v_block + nz_at, mask=nz_mask, other=0),
                                   (BLOCK_N, BLOCK_D))
                else:
                    v = tl.load(v_block + kv_at[:, None] + offs_d[None, :], mask=kv_mask,
                                other=0.0)
                if KV_INT8:
                    v = ((v.to(tl.float32) - v_off) * v_sc).to(out.dtype.element_ty)
                p = p.to(v.dtype)
                if UPCAST_DOT:
                    p = p.to(tl.float32)
                    v = v.to(tl.float32)
                acc = acc * alpha[:, None] + tl.dot(p, v)
                m_i = m_new
        seen = l_i > 0.0                      # rows that saw no position stay 0, lse -inf
        l_safe = tl.where(seen, l_i, 1.0)     # no 1/0 or log(0) even in discarded lanes
        inv = tl.where(seen, 1.0 / l_safe, 0.0)
        if USE_SINKS:   # the row's only sink term when the unit is whole; a piece's lse has none
            sink = tl.load(sinks + q_head, mask=row_ok, other=0.0).to(tl.float32)
            m_fin = tl.where(seen, m_i, 0.0)
            den = l_safe + tl.exp(sink - m_fin)   # +inf (sink far above m): inv 0, the limit
            inv = tl.where(seen & (slot < 0), 1.0 / den, inv)
        o = acc * inv[:, None]
        store_mask = row_ok[:, None] & d_ok[None, :]
        if slot < 0:
            tl.store(out + q_at[:, None] + offs_d[None, :], o.to(out.dtype.element_ty),
                     mask=store_mask)
        else:
            slot_row = (slot * Q_TILE * GROUP + offs_m).to(tl.int64)
            tl.store(partial_out + slot_row[:, None] * HEAD_DIM + offs_d[None, :], o,
                     mask=store_mask)
            lse = tl.where(seen, m_i + tl.log(l_safe), float("-inf"))
            lse = tl.where(blocks_ok, lse, float("inf"))   # poisoned: combine zeroes the unit
            tl.store(partial_lse + slot_row, lse, mask=row_ok)


@triton.jit
def paged_attention_kernel(
    tiling, step_epoch, query, key_cache, value_cache, block_table, cu_seqlens_q, seqlens_kv,
    out, partial_out, partial_lse, core_status, scale, soft_cap, sinks, sliding_window,
    num_blocks, k_scale, k_offset, v_scale, v_offset, key_page_stride, value_page_stride,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, MAX_BATCH: tl.constexpr, MAX_TOKENS: tl.constexpr,
    MAX_BLOCKS_PER_REQ: tl.constexpr, NUM_CORES: tl.constexpr, Q_TILE: tl.constexpr,
    MAX_SLOTS: tl.constexpr, CAUSAL: tl.constexpr,
    MAGIC: tl.constexpr, VERSION: tl.constexpr, OK: tl.constexpr, E_TILING: tl.constexpr,
    E_BLOCK_ID: tl.constexpr, E_STALE: tl.constexpr, HDR_EPOCH: tl.constexpr,
    HDR_MAGIC: tl.constexpr, HDR_VERSION: tl.constexpr,
    HDR_STATUS: tl.constexpr, HDR_BATCH: tl.constexpr, HDR_NUM_TOKENS: tl.constexpr,
    HDR_NUM_CORES: tl.constexpr, HDR_NUM_COMBINE: tl.constexpr, HDR_FLAGS: tl.constexpr,
    HEADER_WORDS: tl.constexpr, CORE_WORDS: tl.constexpr, CORE_BEGIN: tl.constexpr,
    CORE_END: tl.constexpr, CORE_FIRST_SLOT: tl.constexpr, CORE_LAST_SLOT: tl.constexpr,
    CORE_NUM_SEGMENTS: tl.constexpr, COMB_WORDS: tl.constexpr, COMB_REQUEST: tl.constexpr,
    COMB_KV_HEAD: tl.constexpr, COMB_Q_TILE: tl.constexpr, COMB_FIRST_SLOT: tl.constexpr,
    COMB_NUM_PIECES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    UPCAST_DOT: tl.constexpr, USE_SOFT_CAP: tl.constexpr, USE_SINKS: tl.constexpr,
    USE_WINDOW: tl.constexpr, KV_INT8: tl.constexpr, KV_NZ: tl.constexpr = False,
):
    """Program ``pid`` = AI Core ``pid``: `_walk_core` with the GQA `_segment`.

    Tensors as in ``attention_ref.h`` (TENSORS); ``step_epoch`` int32 [1] is the epoch the
    host wrote beside this step's lengths; ``soft_cap`` (fp32, > 0) is the logits soft cap,
    read only when ``USE_SOFT_CAP``; ``sinks`` (fp32 [num_q_heads]) the attention sinks, read
    only when ``USE_SINKS``; ``sliding_window`` (int32 W >= 1, causal only) the sliding window,
    read only when ``USE_WINDOW``; ``k_scale``, ``k_offset``, ``v_scale``, ``v_offset`` (fp32
    [num_kv_heads][head_dim]) the int8 caches' dequantisation, read only when ``KV_INT8`` (then
    the caches are int8; with ``KV_NZ`` too they are in vLLM-Ascend's NZ layout
    ``[num_blocks, num_kv_heads, head_dim / 32, block_size, 32]``). ``key_page_stride`` /
    ``value_page_stride`` (int) are the elements from one cache block to the next in each
    cache, ``block_size * num_kv_heads * head_dim`` when it is contiguous (`_segment`).
    ``core_status[pid]`` receives the walk's status (`_walk_core`).
    """
    _walk_core(_segment, tiling, step_epoch, cu_seqlens_q, seqlens_kv, block_table, core_status,
               num_blocks, query=query, query_rope=None, key_cache=key_cache,
               key_rope_cache=None, value_cache=value_cache, out=out, partial_out=partial_out,
               partial_lse=partial_lse, scale=scale, soft_cap=soft_cap, sinks=sinks,
               sliding_window=sliding_window, k_scale=k_scale, k_offset=k_offset,
               v_scale=v_scale, v_offset=v_offset, key_page_stride=key_page_stride,
               value_page_stride=value_page_stride, NUM_Q_HEADS=NUM_Q_HEADS,
               NUM_KV_HEADS=NUM_KV_HEADS, VALUE_DIM=HEAD_DIM, ROPE_DIM=0, BLOCK_SIZE=BLOCK_SIZE,
               MAX_BATCH=MAX_BATCH, MAX_TOKENS=MAX_TOKENS, MAX_BLOCKS_PER_REQ=MAX_BLOCKS_PER_REQ,
               NUM_CORES=NUM_CORES, Q_TILE=Q_TILE, MAX_SLOTS=MAX_SLOTS, CAUSAL=CAUSAL,
               MAGIC=MAGIC, VERSION=VERSION, OK=OK, E_TILING=E_TILING, E_BLOCK_ID=E_BLOCK_ID,
               E_STALE=E_STALE, HDR_EPOCH=HDR_EPOCH, HDR_MAGIC=HDR_MAGIC,
               HDR_VERSION=HDR_VERSION, HDR_STATUS=HDR_STATUS, HDR_BATCH=HDR_BATCH,
               HDR_NUM_CORES=HDR_NUM_CORES, HDR_FLAGS=HDR_FLAGS, HEADER_WORDS=HEADER_WORDS,
               CORE_WORDS=CORE_WORDS, CORE_BEGIN=CORE_BEGIN, CORE_END=CORE_END,
               CORE_FIRST_SLOT=CORE_FIRST_SLOT, CORE_LAST_SLOT=CORE_LAST_SLOT,
               CORE_NUM_SEGMENTS=CORE_NUM_SEGMENTS, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
               BLOCK_V=BLOCK_D, BLOCK_R=0, UPCAST_DOT=UPCAST_DOT, USE_SOFT_CAP=USE_SOFT_CAP,
               USE_SINKS=USE_SINKS, USE_WINDOW=USE_WINDOW, KV_INT8=KV_INT8, KV_NZ=KV_NZ)

@triton.jit
def _zero_rows(out, first, last, pid, nprog, ROW_ELEMS: tl.constexpr, BLOCK_Z: tl.constexpr):
    """Rows [first, last) of out ([max_tokens][num_q_heads * head_dim]) := 0, split by program."""
    offs = tl.arange(0, BLOCK_Z)
    zeros = tl.zeros([BLOCK_Z], out.dtype.element_ty)
    for row in range(first + pid, last, nprog):
        for c0 in range(0, ROW_ELEMS, BLOCK_Z):
            row64 = tl.zeros([BLOCK_Z], tl.int64) + row     # int64 before the multiply
            tl.store(out + row64 * ROW_ELEMS + c0 + offs, zeros,
                     mask=c0 + offs < ROW_ELEMS)


@triton.jit
def attention_combine_kernel(
    tiling, step_epoch, cu_seqlens_q, out, partial_out, partial_lse, combine_status, sinks,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, MAX_BATCH: tl.constexpr, MAX_TOKENS: tl.constexpr,
    MAX_BLOCKS_PER_REQ: tl.constexpr, NUM_CORES: tl.constexpr, Q_TILE: tl.constexpr,
    MAX_SLOTS: tl.constexpr, CAUSAL: tl.constexpr,
    MAGIC: tl.constexpr, VERSION: tl.constexpr, OK: tl.constexpr, E_TILING: tl.constexpr,
    E_BLOCK_ID: tl.constexpr, E_STALE: tl.constexpr, HDR_EPOCH: tl.constexpr,
    HDR_MAGIC: tl.constexpr, HDR_VERSION: tl.constexpr,
    HDR_STATUS: tl.constexpr, HDR_BATCH: tl.constexpr, HDR_NUM_TOKENS: tl.constexpr,
    HDR_NUM_CORES: tl.constexpr, HDR_NUM_COMBINE: tl.constexpr, HDR_FLAGS: tl.constexpr,
    HEADER_WORDS: tl.constexpr, CORE_WORDS: tl.constexpr, CORE_BEGIN: tl.constexpr,
    CORE_END: tl.constexpr, CORE_FIRST_SLOT: tl.constexpr, CORE_LAST_SLOT: tl.constexpr,
    CORE_NUM_SEGMENTS: tl.constexpr, COMB_WORDS: tl.constexpr, COMB_REQUEST: tl.constexpr,
    COMB_KV_HEAD: tl.constexpr, COMB_Q_TILE: tl.constexpr, COMB_FIRST_SLOT: tl.constexpr,
    COMB_NUM_PIECES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_Z: tl.constexpr,
    USE_SINKS: tl.constexpr,
):
    """The combine step on a fixed grid: program ``pid`` merges combine records pid, pid + n,
    ... and zeroes its share of the padding rows [num_tokens, max_tokens).

    Every program checks the header and every record before anyone writes (the records are
    at most num_cores - 1), so all programs take the same decision: a tiling whose status is
    not OK, a tiling of another step (its epoch differs from ``step_epoch[0]``) or a buffer
    that is not a consistent tiling makes them write zeros to every row (the C
    ``aicpu_attention_finalize``). ``combine_status[pid]`` receives OK, the tiling's status,
    E_STALE or E_TILING. With ``USE_SINKS`` each merged row's denominator gains its q head's
    sink (``sinks``, fp32 [num_q_heads]), once: one more piece with lse = sink and output 0.
    """
    GROUP: tl.constexpr = NUM_Q_HEADS // NUM_KV_HEADS
    ROW_ELEMS: tl.constexpr = NUM_Q_HEADS * HEAD_DIM
    SLOT_ROWS: tl.constexpr = Q_TILE * GROUP
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    status = _tiling_status(tiling, step_epoch, NUM_CORES, CAUSAL, False, MAGIC, VERSION, OK,
                            E_TILING, E_STALE, HDR_MAGIC, HDR_VERSION, HDR_STATUS,
                            HDR_NUM_CORES, HDR_FLAGS, HDR_EPOCH)
    batch = tl.load(tiling + HDR_BATCH)
    num_tokens = tl.load(tiling + HDR_NUM_TOKENS)
    num_combine = tl.load(tiling + HDR_NUM_COMBINE)
    sane = ((batch >= 0) & (batch <= MAX_BATCH) & (num_tokens >= 0)
            & (num_tokens <= MAX_TOKENS) & (num_combine >= 0) & (num_combine <= NUM_CORES - 1))
    status = tl.where((status == OK) & ~sane, E_TILING, status)
    comb = tiling + HEADER_WORDS + CORE_WORDS * NUM_CORES   # the table follows the core table
    if status == OK:
        status = tl.where(tl.load(cu_seqlens_q + batch) == num_tokens, status, E_TILING)
        for i in range(num_combine):
            rec = comb + i * COMB_WORDS
            r = tl.load(rec + COMB_REQUEST)
            h = tl.load(rec + COMB_KV_HEAD)
            t = tl.load(rec + COMB_Q_TILE)
            s0 = tl.load(rec + COMB_FIRST_SLOT)
            npieces = tl.load(rec + COMB_NUM_PIECES)
            rec_ok = ((r >= 0) & (r < batch) & (h >= 0) & (h < NUM_KV_HEADS) & (t >= 0)
                      & (s0 >= 0) & (npieces >= 2) & (npieces <= MAX_SLOTS)
                      & (s0 <= MAX_SLOTS - npieces))
            r_safe = tl.where(rec_ok, r, 0)    # never read cu_seqlens_q out of its bounds
            lo = tl.load(cu_seqlens_q + r_safe, mask=rec_ok, other=0)
            hi = tl.load(cu_seqlens_q + r_safe + 1, mask=rec_ok, other=0)
            rec_ok = rec_ok & (lo >= 0) & (hi <= num_tokens) & (t * Q_TILE < hi - lo)
            status = tl.where(rec_ok, status, E_TILING)
    if status == OK:
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        for i in range(pid, num_combine, nprog):
            rec = comb + i * COMB_WORDS
            r = tl.load(rec + COMB_REQUEST)
            h = tl.load(rec + COMB_KV_HEAD)
            t = tl.load(rec + COMB_Q_TILE)
            s0 = tl.load(rec + COMB_FIRST_SLOT)
            npieces = tl.load(rec + COMB_NUM_PIECES)
            lo = tl.load(cu_seqlens_q + r)
            ntok = tl.minimum(tl.load(cu_seqlens_q + r + 1) - lo - t * Q_TILE, Q_TILE)
            rows = ntok * GROUP
            for m0 in range(0, rows, BLOCK_M):
                offs_m = m0 + tl.arange(0, BLOCK_M)
                row_ok = offs_m < rows
                mx = tl.full([BLOCK_M], float("-inf"), tl.float32)
                for piece in range(npieces):
                    lse = tl.load(partial_lse + (s0 + piece) * SLOT_ROWS + offs_m, mask=row_ok,
                                  other=float("-inf"))
                    mx = tl.maximum(mx, lse)
                usable = (mx > float("-inf")) & (mx < float("inf"))   # +inf: a poisoned piece
                q_head = h * GROUP + offs_m % GROUP
                if USE_SINKS:   # the sink: one more piece, lse = sink, output 0
                    sink = tl.load(sinks + q_head, mask=row_ok, other=0.0).to(tl.float32)
                    mx = tl.maximum(mx, sink)
                mx_use = tl.where(usable, mx, 0.0)
                acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
                wsum = tl.zeros([BLOCK_M], tl.float32)
                if USE_SINKS:
                    wsum = tl.where(usable, tl.exp(sink - mx_use), 0.0)
                for piece in range(npieces):
                    srow = ((s0 + piece) * SLOT_ROWS + offs_m).to(tl.int64)
                    lse = tl.load(partial_lse + srow, mask=row_ok, other=float("-inf"))
                    w = tl.where(usable & (lse > float("-inf")), tl.exp(lse - mx_use), 0.0)
                    po = tl.load(partial_out + srow[:, None] * HEAD_DIM + offs_d[None, :],
                                 mask=row_ok[:, None] & d_ok[None, :], other=0.0)
                    acc += w[:, None] * po
                    wsum += w
                inv = tl.where(wsum > 0.0, 1.0 / tl.where(wsum > 0.0, wsum, 1.0), 0.0)
                merged = acc * inv[:, None]
                tok = offs_m // GROUP
                at = ((lo + t * Q_TILE + tok).to(tl.int64) * NUM_Q_HEADS + q_head) * HEAD_DIM
                tl.store(out + at[:, None] + offs_d[None, :], merged.to(out.dtype.element_ty),
                         mask=row_ok[:, None] & d_ok[None, :])
        _zero_rows(out, num_tokens, MAX_TOKENS, pid, nprog, ROW_ELEMS, BLOCK_Z)
    else:
        _zero_rows(out, 0, MAX_TOKENS, pid, nprog, ROW_ELEMS, BLOCK_Z)
    tl.store(combine_status + pid, status)
