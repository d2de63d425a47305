"""The reference attention in C on its own: strict builds, and every instruction-set variant
against the portable one (aicpu_kernels/tests/attention_variants.c, the logits soft cap and
attention sinks off and on), plainly and under AddressSanitizer + UndefinedBehaviorSanitizer."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pyruntime.kernels import reference_attention as ra

REPO = Path(__file__).resolve().parent.parent
KERNELS = REPO / "aicpu_kernels"
STRICT = ["-Wall", "-Wextra", "-Werror"]
SOURCES = [KERNELS / "tests" / "attention_variants.c", KERNELS / "attention_ref.c",
           KERNELS / "attention_x86.c", KERNELS / "aicpu_tiling.c"]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def compile_c(out: Path, sources: list[Path], flags: list[str]) -> Path:
    cmd = ["gcc", *flags, "-I", str(KERNELS), *map(str, sources), "-lm", "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stderr}"
    assert result.stderr == "", result.stderr
    return out


def skip_without_sanitizers(tmp_path: Path) -> None:
    """Skip the calling test when gcc cannot link an AddressSanitizer + UBSan program here."""
    probe = tmp_path / "probe.c"
    probe.write_text("int main(void) { return 0; }\n")
    if subprocess.run(["gcc", *SANITIZE, str(probe), "-o", str(tmp_path / "probe")],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("this compiler cannot link AddressSanitizer/UBSan programs")


@pytest.mark.parametrize("source", ["attention_ref.c", "attention_x86.c"])
@pytest.mark.parametrize(
    "flags",
    [["-std=c99", "-pedantic", "-O3"], ["-std=c99", "-O0", "-g"], ["-std=c11", "-O2"]],
    ids=["c99-pedantic-O3", "c99-O0", "c11-O2"],
)
def test_sources_build_warning_free(tmp_path, source, flags):
    compile_c(tmp_path / "a.o", [KERNELS / source], ["-c", *flags, *STRICT])


def run_variants(binary: Path) -> tuple[list[str], int]:
    result = subprocess.run([str(binary)], capture_output=True, text=True, check=False,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    match = re.search(r"variants: ([a-z0-9 ]+); (\d+) problems", result.stdout)
    assert match, result.stdout
    return match.group(1).split(), int(match.group(2))


def test_every_variant_matches_the_portable_one(tmp_path):
    binary = compile_c(tmp_path / "variants", SOURCES, ["-std=c99", "-pedantic", "-O2", *STRICT])
    names, problems = run_variants(binary)
    # the C program and the Python module see the same variants on this machine
    assert names == ra.isa_variants()["supported"]
    # 4 head dims x 3 groups x 2 core counts x 4 settings (off, soft cap, sinks, both) x 3 dtypes
    assert problems == 288 * (len(names) - 1)


def test_variants_under_address_and_undefined_sanitizers(tmp_path):
    skip_without_sanitizers(tmp_path)
    binary = compile_c(tmp_path / "variants_asan", SOURCES,
                       ["-std=c99", "-O1", "-g", *STRICT, *SANITIZE])
    names, problems = run_variants(binary)
    assert problems == 288 * (len(names) - 1)


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None,
                    reason="needs the aarch64-linux-gnu-gcc cross compiler")
def test_aarch64_build_has_only_the_portable_variant(tmp_path):
    # the x86 file compiles to the stub that reports no table, warning-free
    for source in ("attention_ref.c", "attention_x86.c"):
        cmd = ["aarch64-linux-gnu-gcc", "-std=c99", "-pedantic", "-O2", *STRICT, "-I",
               str(KERNELS), "-c", str(KERNELS / source), "-o", str(tmp_path / f"{source}.o")]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert result.returncode == 0 and result.stderr == "", result.stderr
    symbols = subprocess.run(["aarch64-linux-gnu-nm", str(tmp_path / "attention_x86.c.o")],
                             capture_output=True, text=True, check=False).stdout.split()
    assert symbols == ["0000000000000000", "T", "attention_x86_kernels"]


def vllm_030_kv_views(key_cache, value_cache):
    """``(key, value)``: views of ONE allocation holding the given caches' values, laid out as
    vLLM-Ascend 0.30.0rc2's model runner lays a full-attention layer (vLLM 0.30's ``LBNHC``):
    ``num_blocks * page_size`` raw int8 bytes viewed as the dtype, ``torch.as_strided`` to
    ``(2, num_blocks, block_size, H, D)`` with strides ``(hidden, 2 * hidden, H * D, D, 1)``,
    K = ``[0]``, V = ``[1]`` (``vllm_ascend/worker/model_runner_v1.py:5720-5744``; the v2 runner's
    ``_reshape_combined_attention_kv_cache``, ``worker/v2/attn_utils.py:687-719``, is the same).
    5-D (NZ) caches give C8's NZ views of those: ``cache.view(-1, H, D // 32, block_size, 32)``
    (``attention/attention_v1.py:1441-1444``, ``_nz_5d_view``). Each view's page stride is
    twice a block's elements and V starts one block after K, as the engine probe found
    (shape (64, 128, 2, 64), stride (32768, 128, 64, 1), V at storage offset 16384)."""
    import torch

    nz = key_cache.dim() == 5
    if nz:
        nb, h, parts, bs, width = key_cache.shape
        d = parts * width
    else:
        nb, bs, h, d = key_cache.shape
    hidden = bs * h * d
    raw = torch.zeros(nb * 2 * hidden * key_cache.element_size(), dtype=torch.int8)
    combined = torch.as_strided(raw.view(key_cache.dtype), (2, nb, bs, h, d),
                                (hidden, 2 * hidden, h * d, d, 1))
    views = []
    for cache, nd_view in zip((key_cache, value_cache), (combined[0], combined[1])):
        view = nd_view.view(-1, h, d // 32, bs, 32) if nz else nd_view
        view.copy_(cache)
        views.append(view)
    k, v = views
    assert k.stride()[0] == 2 * hidden and not k.is_contiguous()
    assert v.storage_offset() - k.storage_offset() == hidden
    return k, v


def test_vllm_030_views_match_the_engine_probe():
    """The helper's views have what the probe saw at vLLM-Ascend 0.30.0rc2's capture."""
    import torch

    k = torch.zeros(64, 128, 2, 64, dtype=torch.bfloat16)
    kv, vv = vllm_030_kv_views(k, k)
    assert (tuple(kv.shape), kv.stride(), vv.storage_offset()) == (
        (64, 128, 2, 64), (32768, 128, 64, 1), 16384)


def _float_case(name: str, dtype):
    """`tests.test_int8_kv.Int8Case` with caches of the query's dtype (no int8, no scales)."""
    import torch
    from tests.test_int8_kv import Int8Case

    case = Int8Case(name, dtype, d=64, seed=11)
    gen = torch.Generator().manual_seed(12)
    case.key_cache = torch.randn(case.key_cache.shape, generator=gen).to(dtype)
    case.value_cache = torch.randn(case.value_cache.shape, generator=gen).to(dtype)
    case.kv_scales = None
    return case


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_c_reads_vllm_030_strided_caches_in_place(dtype):
    """GQA ND caches as vLLM-Ascend 0.30.0rc2 hands them (K and V pages side by side in one
    allocation): every C entry point gives the contiguous caches' bits, reading them in place."""
    import torch
    from tests.test_int8_kv import CASES

    for name in CASES:
        case = _float_case(name, getattr(torch, dtype))
        want = {how: case.run_c(how) for how in ("cores", "span", "siblings")}
        case.key_cache, case.value_cache = vllm_030_kv_views(case.key_cache, case.value_cache)
        for how, out in want.items():
            assert torch.equal(case.run_c(how), out), (name, how)


def test_caches_whose_blocks_are_not_dense_are_refused_naming_the_stride():
    """Only the page stride may differ: a head-major view (dims 1.. permuted) or overlapping
    blocks raise `kv_quant.CacheStrideError` with the strides found, nothing written; the C
    call itself refuses a block stride below a block (E_ARGS, nothing written)."""
    import torch

    from pyruntime.kernels import kv_quant

    case = _float_case("decode_split", torch.float16)
    nb, bs, h, d = case.key_cache.shape
    head_major = case.key_cache.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    overlapping = torch.as_strided(case.key_cache, (nb, bs, h, d), (bs * h * d // 2, h * d, d, 1))
    po, pl = ra.partial_buffers(case.params)
    for bad, found in ((head_major, str(list(head_major.stride()))),
                       (overlapping, f"page stride {bs * h * d // 2}")):
        out = torch.full_like(case.query, 7.0)
        with pytest.raises(kv_quant.CacheStrideError, match=re.escape(found)):
            ra.attention_core(case.params, case.plan, 0, query=case.query, key_cache=bad,
                              value_cache=case.value_cache, block_table=case.block_table,
                              cu_seqlens_q=case.cu, seqlens_kv=case.kv, out=out,
                              partial_out=po, partial_lse=pl)
        assert bool((out == 7.0).all())
    out = torch.full_like(case.query, 7.0)
    bound = ra.BoundAttention(case.params, case.plan, query=case.query, key_cache=case.key_cache,
                              value_cache=case.value_cache, block_table=case.block_table,
                              cu_seqlens_q=case.cu, seqlens_kv=case.kv, out=out, partial_out=po,
                              partial_lse=pl)
    args = list(bound._core_args)
    at = args.index(nb) + 1   # key_block_stride, value_block_stride follow num_blocks
    assert args[at:at + 2] == [bs * h * d] * 2
    for which in (at, at + 1):
        bad_args = list(args)
        bad_args[which] = bs * h * d - 1
        for core in range(case.params.num_cores):
            assert ra._lib.aicpu_attention_core(bound._c_params, bound._tiling, core,
                                                *bad_args) == ra.E_ARGS
        assert ra._lib.aicpu_attention_core_span(bound._c_params, bound._tiling, 0,
                                                 case.params.num_cores, *bad_args) == ra.E_ARGS
    assert bool((out == 7.0).all())
