"""The MLA consumers on their own: the C reference's strict builds and its random check program
(aicpu_kernels/tests/mla_check.c, plainly and under AddressSanitizer + UBSan), then the C and
Triton kernels through their Python launchers against float64 absorbed MLA, with split units,
a stale tiling, a bad block id and misuse."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from pyruntime import tiling
from pyruntime.kernels import reference_mla as rm
from pyruntime.kernels import triton_launch
from pyruntime.workload.mla_reference import reference_mla

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "aicpu_kernels"
STRICT = ["-Wall", "-Wextra", "-Werror"]
SOURCES = [KERNELS / "tests" / "mla_check.c", KERNELS / "attention_mla_ref.c",
           KERNELS / "attention_ref.c", KERNELS / "attention_x86.c", KERNELS / "aicpu_tiling.c"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
needs_triton = pytest.mark.skipif(triton_launch.available() is not None,
                                  reason=str(triton_launch.available()))


def compile_c(out: Path, sources: list[Path], flags: list[str]) -> Path:
    cmd = ["gcc", *flags, "-I", str(KERNELS), *map(str, sources), "-lm", "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    assert result.stderr == "", result.stderr
    return out


@needs_gcc
@pytest.mark.parametrize(
    "flags",
    [["-std=c99", "-pedantic", "-O3"], ["-std=c99", "-O0", "-g"], ["-std=c11", "-O2"]],
    ids=["c99-pedantic-O3", "c99-O0", "c11-O2"],
)
def test_source_builds_warning_free(tmp_path, flags):
    compile_c(tmp_path / "a.o", [KERNELS / "attention_mla_ref.c"], ["-c", *flags, *STRICT])


def run_check(binary: Path, problems: int = 300) -> tuple[int, int, int]:
    result = subprocess.run([str(binary), str(problems)], capture_output=True, text=True,
                            check=False, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"(\d+) problems, (\d+) with split units, (\d+) bad block ids; 0 failures",
                      result.stdout)
    assert match, result.stdout
    return tuple(int(g) for g in match.groups())


@needs_gcc
def test_random_problems_match_double_precision_mla_under_sanitizers(tmp_path):
    """The check program (300 random problems against double-precision MLA) built strict and
    under AddressSanitizer + UBSan (at -O0: the -O1 build takes three times as long to
    compile here and finds nothing more)."""
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    sanitize = SANITIZE
    if subprocess.run(["gcc", *SANITIZE, str(probe), "-o", str(tmp_path / "probe")],
                      capture_output=True, check=False).returncode != 0:
        sanitize = []   # this compiler cannot link the sanitizers: check the plain build
    binary = compile_c(tmp_path / "mla_check", SOURCES,
                       ["-std=c99", "-pedantic", "-O0", "-g", *STRICT, *sanitize])
    problems, splits, bad = run_check(binary)
    assert problems == 300 and splits > 50 and bad > 30   # splits and poisoned units covered


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                    reason="needs the aarch64-linux-gnu-gcc cross compiler")
def test_aarch64_build(tmp_path):
    cmd = ["aarch64-linux-gnu-gcc", "-std=c99", "-pedantic", "-O2", *STRICT, "-I", str(KERNELS),
           "-c", str(KERNELS / "attention_mla_ref.c"), "-o", str(tmp_path / "mla.o")]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0 and result.stderr == "", result.stderr


# ---------------------------------------------------------------- the Python launchers

L, R, H = 32, 16, 4
PARAMS = tiling.TilingParams(num_q_heads=H, num_kv_heads=1, head_dim=L + R, block_size=16,
                             max_batch=3, max_tokens=10, max_blocks_per_req=8, num_cores=7,
                             q_tile=2, cost_kv_load=2, cost_qk_tile=1, cost_segment=60)
CU = torch.tensor([0, 1, 5, 7], dtype=torch.int32)     # decode, MTP 4, MTP 2
KV = torch.tensor([120, 37, 9], dtype=torch.int32)
SCALE = 0.2


def tensors(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = {"q_nope": torch.randn(10, H, L, generator=gen),
         "q_pe": torch.randn(10, H, R, generator=gen),
         "kv_c_cache": torch.randn(30, 16, 1, L, generator=gen),
         "k_pe_cache": torch.randn(30, 16, 1, R, generator=gen)}
    t = {k: v.to(dtype) for k, v in t.items()}
    t["block_table"] = torch.randperm(30, generator=gen)[:24].to(torch.int32).reshape(3, 8)
    return t


def run_c(plan, t, out, causal=True):
    po, pl = rm.partial_buffers(PARAMS, L)
    statuses = [rm.mla_core(PARAMS, L, plan, core, **t, cu_seqlens_q=CU, seqlens_kv=KV, out=out,
                            partial_out=po, partial_lse=pl, scale=SCALE, causal=causal)
                for core in range(PARAMS.num_cores)]
    final = rm.mla_finalize(PARAMS, L, plan, cu_seqlens_q=CU, out=out, partial_out=po,
                            partial_lse=pl)
    return statuses, final


def run_triton(plan, t, out, epoch=0):
    from pyruntime.kernels import triton_mla_launch as tm

    po, pl = rm.partial_buffers(PARAMS, L)
    words = torch.from_numpy(plan.buffer)
    step_epoch = torch.tensor([epoch], dtype=torch.int32)
    status = tm.launch_mla_attention(PARAMS, L, tiling_in=words, step_epoch=step_epoch, **t,
                                     cu_seqlens_q=CU, seqlens_kv=KV, out=out, partial_out=po,
                                     partial_lse=pl, scale=SCALE)
    final = tm.launch_mla_combine(PARAMS, L, tiling_in=words, step_epoch=step_epoch,
                                  cu_seqlens_q=CU, out=out, partial_out=po, partial_lse=pl)
    return status.tolist(), final.tolist()


def relative(out, want):
    return float(np.abs(out.double().numpy() - want).max() / np.abs(want).max())


@pytest.mark.parametrize("consumer", ["c", pytest.param("triton", marks=needs_triton)])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.float16, 2e-3),
                                        (torch.bfloat16, 2e-2)], ids=["fp32", "fp16", "bf16"])
def test_consumers_match_float64_with_split_units(consumer, dtype, tol):
    plan = tiling.plan(PARAMS, CU.numpy(), KV.numpy())
    assert plan.combine_records()   # 7 cores split units
    t = tensors(dtype)
    out = torch.full((10, H, L), 5.0, dtype=dtype)
    statuses, final = (run_c if consumer == "c" else run_triton)(plan, t, out)
    assert set(np.ravel(statuses)) == {0} and set(np.ravel(final)) == {0}
    want = reference_mla(t["q_nope"], t["q_pe"], t["kv_c_cache"], t["k_pe_cache"],
                         t["block_table"].numpy(), CU.numpy(), KV.numpy(), scale=SCALE)
    assert relative(out, want) < tol
    assert not out[7:].any()


@pytest.mark.parametrize("consumer", ["c", pytest.param("triton", marks=needs_triton)])
def test_a_bad_block_id_zeroes_its_request_only(consumer):
    plan = tiling.plan(PARAMS, CU.numpy(), KV.numpy())
    t = tensors(torch.float32)
    t["block_table"][1, 0] = 30   # request 1 (rows 1..4) reads a block past the caches
    out = torch.full((10, H, L), 5.0)
    statuses, final = (run_c if consumer == "c" else run_triton)(plan, t, out)
    assert rm.E_BLOCK_ID in statuses and set(np.ravel(final)) == {0}
    want = reference_mla(t["q_nope"], t["q_pe"], t["kv_c_cache"], t["k_pe_cache"],
                         t["block_table"].clamp(max=29).numpy(), CU.numpy(), KV.numpy(),
                         scale=SCALE)
    assert not out[1:5].any()
    for rows in (slice(0, 1), slice(5, 7)):
        assert relative(out[rows], want[rows]) < 2e-6


@needs_triton
def test_triton_does_nothing_on_a_stale_tiling():
    plan = tiling.plan(PARAMS, CU.numpy(), KV.numpy(), epoch=3)
    out = torch.full((10, H, L), 5.0)
    statuses, final = run_triton(plan, tensors(torch.float32), out, epoch=4)
    assert set(statuses) == {triton_launch.E_STALE} and set(final) == {triton_launch.E_STALE}
    assert not out.any()


def test_a_failed_tiling_zeroes_every_row():
    bad_kv = torch.tensor([120, 2, 9], dtype=torch.int32)   # shorter than its 4 query tokens
    plan = tiling.plan(PARAMS, CU.numpy(), bad_kv.numpy())
    out = torch.full((10, H, L), 5.0)
    po, pl = rm.partial_buffers(PARAMS, L)
    status = rm.mla_core(PARAMS, L, plan, 0, **tensors(torch.float32), cu_seqlens_q=CU,
                         seqlens_kv=bad_kv, out=out, partial_out=po, partial_lse=pl, scale=SCALE)
    assert status == plan.status != 0
    assert rm.mla_finalize(PARAMS, L, plan, cu_seqlens_q=CU, out=out, partial_out=po,
                           partial_lse=pl) == plan.status
    assert not out.any()


def test_misuse_raises_before_any_c_code():
    plan = tiling.plan(PARAMS, CU.numpy(), KV.numpy())
    t = tensors(torch.float32)
    out = torch.zeros(10, H, L)
    po, pl = rm.partial_buffers(PARAMS, L)
    gqa = tiling.TilingParams(num_q_heads=H, num_kv_heads=2, head_dim=L + R, block_size=16,
                              max_batch=3, max_tokens=10, max_blocks_per_req=8, num_cores=7)
    common = {"cu_seqlens_q": CU, "seqlens_kv": KV, "partial_out": po, "partial_lse": pl,
              "scale": SCALE}
    with pytest.raises(ValueError, match="num_kv_heads == 1"):
        rm.mla_core(gqa, L, plan, 0, **t, out=out, **common)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        rm.mla_core(PARAMS, L + R + 1, plan, 0, **t, out=out, **common)
    with pytest.raises(ValueError, match="k_pe_cache must have shape"):
        rm.mla_core(PARAMS, L, plan, 0, **{**t, "k_pe_cache": t["k_pe_cache"][:, :, :, :8]},
                    out=out, **common)
    with pytest.raises(TypeError, match="q_pe must have dtype"):
        rm.mla_core(PARAMS, L, plan, 0, **{**t, "q_pe": t["q_pe"].half()}, out=out, **common)
    with pytest.raises(ValueError, match="core must be in"):
        rm.mla_core(PARAMS, L, plan, 7, **t, out=out, **common)
    with pytest.raises(ValueError, match="cu_seqlens_q must be 1-D with at least 4"):
        rm.mla_core(PARAMS, L, plan, 0, **t, out=out, **{**common, "cu_seqlens_q": CU[:3]})
    with pytest.raises(ValueError, match="partial_out must have shape"):
        rm.mla_finalize(PARAMS, L, plan, cu_seqlens_q=CU, out=out, partial_out=po[:, :1],
                        partial_lse=pl)


def test_strided_mla_caches_are_refused_with_a_typed_error_naming_the_strides():
    """MLA caches arrive contiguous on vLLM-Ascend 0.23.0.post1 and 0.30.0rc2
    (`kv_quant.MLA_CONTIGUOUS_WHY`): a page-strided one (as GQA's on 0.30) is refused by name,
    with its strides, before any C code runs."""
    import re

    from pyruntime.kernels import kv_quant

    plan = tiling.plan(PARAMS, CU.numpy(), KV.numpy())
    t = tensors(torch.float32)
    po, pl = rm.partial_buffers(PARAMS, L)
    common = {"cu_seqlens_q": CU, "seqlens_kv": KV, "partial_out": po, "partial_lse": pl,
              "scale": SCALE}
    kv_c = t["kv_c_cache"]
    wide = torch.zeros(kv_c.shape[0], 2, *kv_c.shape[1:], dtype=kv_c.dtype)
    strided = wide[:, 0]
    out = torch.full_like(t["q_nope"], 7.0)
    with pytest.raises(kv_quant.CacheStrideError, match=re.escape(str(list(strided.stride())))):
        rm.mla_core(PARAMS, L, plan, 0, **{**t, "kv_c_cache": strided}, out=out, **common)
    assert bool((out == 7.0).all())
