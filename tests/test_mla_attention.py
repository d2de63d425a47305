"""StaticMLAAttention (issue 20): absorbed MLA decode against a float64 reference on trace
batches (decode, MTP speculative decode with q_len 2-4, padded buckets), per dtype, on both
AI Core consumers (C reference, Triton under the interpreter), in every mode and placement of
the CPU backend; and its typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pyruntime import backends, tiling
from pyruntime.attention import AttentionClosedError, AttentionInputError, FrozenSizeError
from pyruntime.kernels import triton_launch
from pyruntime.mla_attention import StaticMLAAttention, mla_tiling_params
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.mla_reference import reference_mla, run_mla_loop
from pyruntime.workload.trace import load_trace

# small MLA geometry (the kernels' shapes scale; DeepSeek-V3's 16 x (512 + 64) is the bench's)
SHAPES = {"num_heads": 8, "kv_lora_rank": 32, "qk_rope_head_dim": 16, "block_size": 16,
          "max_batch": 6, "max_tokens": 24, "max_blocks_per_req": 12}
NUM_BLOCKS = SHAPES["max_batch"] * SHAPES["max_blocks_per_req"] + 8
MODES = [("device_tiling", "graph"), ("device_tiling", "pre-replay"), ("host_update", None)]
#: max |out - ref| / max |ref|: one rounding of the output (and of P before the PV product in
#: the Triton kernel) in the storage dtype, fp32 accumulation
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}

needs_triton = pytest.mark.skipif(triton_launch.available() is not None,
                                  reason=str(triton_launch.available()))


def make(aicore="c", mode="device_tiling", placement="graph", dtype=torch.float32, **overrides):
    backend = backends.get("cpu", num_threads=2, wait_timeout_s=300.0, aicore=aicore)
    args = {**SHAPES, "num_layers": 2, "num_blocks": NUM_BLOCKS, "num_cores": 5,
            "softmax_scale": 0.12, **overrides}
    extra = {"placement": placement} if placement else {}
    return StaticMLAAttention(backend, mode=mode, dtype=dtype, owns_backend=True, **args,
                              **extra)


def fill(attn, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for kv_c, k_pe in attn.kv_caches:
        kv_c.copy_(torch.randn(kv_c.shape, generator=gen))
        k_pe.copy_(torch.randn(k_pe.shape, generator=gen))


def batcher(spec_tokens, seed=0):
    return ContinuousBatcher(load_trace(limit=400), num_blocks=NUM_BLOCKS, buckets=(2, 4),
                             spec_tokens=spec_tokens, length_scale=0.1, step_s=0.05, seed=seed,
                             **{k: SHAPES[k] for k in ("max_batch", "max_tokens", "block_size",
                                                       "max_blocks_per_req")})


DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: the C consumer in every mode x dtype; the Triton one (interpreted, about 0.2 s a step) in
#: every mode at bf16 and in the graph placement at the other dtypes
RUNS = [("c", 8, mode, placement, dtype) for mode, placement in MODES for dtype in TOLERANCE]
RUNS += [("triton", 2, mode, placement, torch.bfloat16) for mode, placement in MODES]
RUNS += [("triton", 2, "device_tiling", "graph", dtype) for dtype in (torch.float32,
                                                                      torch.float16)]


@pytest.mark.parametrize(
    "aicore, steps, mode, placement, dtype",
    [pytest.param(*run, marks=needs_triton if run[0] == "triton" else (),
                  id=f"{run[0]}-{run[3] or run[2]}-{DTYPE_IDS[run[4]]}") for run in RUNS])
def test_trace_batches_match_the_float64_reference(aicore, steps, mode, placement, dtype):
    stats = []
    with make(aicore, mode, placement, dtype) as attn:
        fill(attn)
        attn.capture()
        for spec_tokens in (1, 2, 4):   # decode, and MTP speculative decode with q_len 2 and 4
            stats.append(run_mla_loop(attn, batcher(spec_tokens, seed=spec_tokens),
                                      steps=steps, seed=spec_tokens))
    assert all(s.steps == steps for s in stats)
    assert max(s.max_rel_err for s in stats) < TOLERANCE[dtype]
    # the batches covered what they are for: MTP steps, padded buckets and split units
    assert stats[0].spec_steps == 0 and stats[1].spec_steps and stats[2].spec_steps
    assert sum(s.padded_steps for s in stats) and sum(s.split_steps for s in stats)


def test_deepseek_v3_rank_geometry_on_both_consumers():
    """One TP-8 rank of DeepSeek-V3 (16 heads, 512 + 64) with an MTP request: the wide tiles."""
    params = {"num_heads": 16, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "block_size": 128,
              "max_batch": 2, "max_tokens": 8, "max_blocks_per_req": 2, "num_blocks": 4,
              "num_cores": 3}
    cu, kv = np.array([0, 1, 4], np.int32), np.array([200, 130], np.int32)
    block_table = np.array([[0, 1], [2, 3]], np.int32)
    outs = {}
    for aicore in ["c"] + (["triton"] if triton_launch.available() is None else []):
        with make(aicore, dtype=torch.bfloat16, **params) as attn:
            fill(attn)
            gen = torch.Generator().manual_seed(3)
            for q_nope, q_pe in attn.queries:
                q_nope.copy_(torch.randn(q_nope.shape, generator=gen))
                q_pe.copy_(torch.randn(q_pe.shape, generator=gen))
            assert attn.params.q_tile == 4 and attn.params.num_kv_heads == 1
            attn.capture()
            out = attn.step(block_table, cu, kv)[1]
            attn.check()
            want = reference_mla(*attn.queries[1], *attn.kv_caches[1], block_table, cu, kv,
                                 scale=0.12)
            assert tiling.plan(attn.params, cu, kv).combine_records()  # 3 cores split units
            outs[aicore] = out.clone()
        err = np.abs(outs[aicore].double().numpy() - want).max() / np.abs(want).max()
        assert err < TOLERANCE[torch.bfloat16], (aicore, err)
        assert not outs[aicore][4:].any()   # padding rows


def test_padding_rows_are_zeroed_after_a_larger_step():
    with make() as attn:
        fill(attn)
        attn.capture()
        bt = np.arange(NUM_BLOCKS - 8, dtype=np.int32).reshape(6, 12)
        attn.step(bt, np.array([0, 4, 8, 12], np.int32), np.array([40, 50, 60], np.int32))
        assert attn.outputs[0][:12].abs().sum() > 0
        outs = attn.step(bt, np.array([0, 2], np.int32), np.array([30], np.int32))
        attn.check()
        assert outs[0][:2].abs().sum() > 0 and not outs[0][2:].any() and not outs[1][2:].any()


def test_bad_lengths_are_reported_by_check_and_give_zero_outputs():
    with make() as attn:
        fill(attn)
        attn.capture()
        bt = np.zeros((6, 12), np.int32)
        outs = attn.step(bt, np.array([0, 3], np.int32), np.array([2], np.int32))
        assert not outs[0].any()
        with pytest.raises(tiling.KvShortError):
            attn.check()


def test_a_bad_block_id_fails_the_step():
    with make() as attn:
        fill(attn)
        attn.capture()
        bt = np.full((6, 12), NUM_BLOCKS, np.int32)   # one past the last block
        with pytest.raises(backends.BackendError, match="block-table entry"):
            attn.step(bt, np.array([0, 1], np.int32), np.array([20], np.int32))


@pytest.mark.parametrize("overrides, error, match", [
    ({"dtype": torch.int8}, AttentionInputError, "dtype"),
    ({"softmax_scale": 0.0}, AttentionInputError, "softmax_scale"),
    ({"softmax_scale": float("nan")}, AttentionInputError, "softmax_scale"),
    ({"softmax_scale": True}, AttentionInputError, "softmax_scale"),
    ({"num_heads": 0}, AttentionInputError, "num_heads"),
    ({"kv_lora_rank": 2.5}, AttentionInputError, "kv_lora_rank"),
    ({"qk_rope_head_dim": 0}, AttentionInputError, "qk_rope_head_dim"),
    ({"num_blocks": 0}, AttentionInputError, "num_blocks"),
    ({"mode": "eager"}, ValueError, "mode"),
    ({"placement": "side"}, ValueError, "placement"),
    ({"mode": "host_update", "placement": "graph"}, ValueError, "placement"),
    ({"kv_lora_rank": 1000, "qk_rope_head_dim": 64}, tiling.TilingParamsError, "head_dim"),
])
def test_bad_arguments_raise_typed_errors(overrides, error, match):
    args = {"mode": "device_tiling", "placement": "graph", "dtype": torch.float32, **overrides}
    with pytest.raises(error, match=match):
        make(**args)


def test_host_update_on_a_fia_backend_is_refused(monkeypatch):
    backend = backends.get("cpu")
    monkeypatch.setattr(backend, "host_update_attention", "fia")
    with pytest.raises(AttentionInputError, match="FIA"):
        StaticMLAAttention(backend, mode="host_update", dtype=torch.float16, num_layers=1,
                           num_blocks=8, softmax_scale=0.1, owns_backend=True, **SHAPES)


def test_life_cycle_and_step_input_errors():
    attn = make()
    assert [t.shape for t in attn.queries[0]] == [(24, 8, 32), (24, 8, 16)]
    assert [t.shape for t in attn.kv_caches[0]] == [(NUM_BLOCKS, 16, 1, 32),
                                                    (NUM_BLOCKS, 16, 1, 16)]
    assert attn.outputs[1].shape == (24, 8, 32) and attn.sinks is None
    attn.capture()
    with pytest.raises(FrozenSizeError, match="max_batch"):
        attn.step(np.zeros((7, 12), np.int32), np.zeros(1, np.int32), np.zeros(0, np.int32))
    with pytest.raises(AttentionInputError, match="int32"):
        attn.step(np.zeros((6, 12), np.int64), np.zeros(1, np.int32), np.zeros(0, np.int32))
    attn.close()
    attn.close()   # idempotent
    with pytest.raises(AttentionClosedError):
        _ = attn.queries


def test_mla_tiling_params_defaults():
    for heads, q_tile in ((16, 4), (32, 2), (64, 1), (128, 1)):
        p = mla_tiling_params(num_heads=heads, kv_lora_rank=512, qk_rope_head_dim=64,
                              block_size=128, max_batch=16, max_tokens=64,
                              max_blocks_per_req=16, num_cores=24)
        assert (p.num_kv_heads, p.head_dim, p.q_tile) == (1, 576, q_tile)
        assert (p.cost_kv_load, p.cost_qk_tile, p.cost_segment) == (2, 1, 60)
