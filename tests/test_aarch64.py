"""The tiling kernel and the AI-CPU entry points built for AArch64, and run in an emulator.

- Cross-compile (``python -m ziglang``, target aarch64-linux-gnu, -Wall -Wextra -Werror):
  the kernel, the classic CpuKernel and the Ascend C entry against cann_stub (NOT CANN),
  and the runtime route's .so.
- The static AArch64 build of ``aicpu_tiling_plan()`` runs in unicorn and writes buffers
  byte-identical to the host build (`pyruntime.tiling.plan`) on the golden vectors, trace
  batches and a few hundred hypothesis cases, valid and invalid; the Ascend C entry
  (``aicpu_tiling_kernel(void *args)``, the code the runtime route ships) does too.
- Every input array sits at the end of its own mapping before an unmapped page, so a read
  past an array or a write past the buffer faults the emulation.

Needs ziglang, unicorn and pyelftools (the ``test`` extra). Without them the tests skip with
the reason, except under CI (``CI=true``), where a missing tool is a failure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyruntime._native import ffi, lib
from tiling_inputs import any_inputs, small_params, trace_decode_batch, trace_mixed_batch

from pyruntime.aarch64 import missing_tools, toolchain
from pyruntime.tiling import TilingParams, params_from_words, plan

GOLDEN = Path(__file__).parent / "data" / "golden_tiling.json"
LLAMA_8B = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 128}
KERNEL_OK, KERNEL_INVALID = 0, 1

MISSING = missing_tools()
if MISSING:
    reason = f"the AArch64 tests need {', '.join(MISSING)} (pip install -e .[test])"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)

from pyruntime.aarch64.emulator import EmulationError, Machine
from pyruntime.aarch64.kernel import (
    FILL,
    EmulatedKernel,
    args_format,
    args_layout,
    max_plans,
    params_words,
    plan_signature,
)


@pytest.fixture(scope="module")
def emu(tmp_path_factory) -> EmulatedKernel:
    return EmulatedKernel(tmp_path_factory.mktemp("aarch64"))


def host_raw(words, cu, kv, batch, causal, size, epoch=0) -> tuple[int, bytes]:
    """The host build called like the emulated one: raw params, FILL-prefilled buffer,
    arguments by name in the header's order (further scalars 0, as the emulated call)."""
    c_params = ffi.new("aicpu_tiling_params *")
    ffi.memmove(c_params, struct.pack("<16i", *words), 64)
    cu_arr = np.asarray(cu, dtype=np.int32)
    kv_arr = np.asarray(kv, dtype=np.int32)
    buf = np.full(max(size, 1), FILL, dtype=np.uint8)
    known = {"params": c_params, "cu_seqlens_q": ffi.cast("int32_t *", cu_arr.ctypes.data),
             "seqlens_kv": ffi.cast("int32_t *", kv_arr.ctypes.data), "batch": batch,
             "epoch": epoch, "flags": 1 if causal else 0, "buffer": ffi.cast("void *", buf.ctypes.data),
             "buffer_bytes": size}
    status = lib.aicpu_tiling_plan(*(known.get(name, 0) for _, name in plan_signature()))
    return status, buf[:size].tobytes()


def assert_same(emu: EmulatedKernel, params: TilingParams, cu, kv, causal: bool,
                epoch: int = 0) -> int:
    """Emulated == host, through aicpu_tiling_plan and through the entry; the status."""
    host = plan(params, cu, kv, causal=causal, epoch=epoch)
    got = emu.plan(params, cu, kv, causal=causal, epoch=epoch)
    assert got.status == host.status
    assert got.buffer == host.buffer.tobytes(), "the AArch64 build wrote different bytes"
    entry = emu.launch_entry(params, cu, kv, len(kv), causal=causal, step_epoch=epoch)
    assert entry.status == KERNEL_OK
    assert entry.buffer == host.buffer.tobytes()
    return host.status


# --------------------------------------------------------------------------- layouts


def test_plan_signature_is_read_from_the_header():
    names = [name for _, name in plan_signature()]
    assert names[:3] == ["params", "cu_seqlens_q", "seqlens_kv"]
    assert {"batch", "flags", "buffer", "buffer_bytes"} <= set(names)
    assert len(names) == len(ffi.typeof(lib.aicpu_tiling_plan).args)


def test_params_words_match_the_c_struct():
    params = TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                          num_cores=6, cost_segment=17)
    c_bytes = bytes(ffi.buffer(params._c_params()))
    assert struct.pack("<16i", *params_words(params)) == c_bytes


def test_args_layout_matches_the_header(tmp_path):
    """The layout read from tiling_kernel_args.h against the host compiler's offsetof()."""
    import shutil
    import subprocess

    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    names = [name for name, _ in args_layout()]
    prog = tmp_path / "layout.c"
    prog.write_text(
        '#include <stdio.h>\n#include "tiling_kernel_args.h"\nint main(void) {\n'
        + "".join(f'    printf("%zu\\n", offsetof(aicpu_tiling_kernel_args, {n}));\n'
                  for n in names)
        + '    printf("%zu\\n", sizeof(aicpu_tiling_kernel_args));\n    return 0;\n}\n')
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-std=c99", f"-I{toolchain.AICPU}", str(prog), "-o", str(exe)],
                   check=True)
    c_offsets = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True,
                                                check=True).stdout.split()]
    py_offsets, offset = [], 0
    for _, fmt in args_layout():
        py_offsets.append(offset)
        offset += struct.calcsize("<" + fmt)
    assert c_offsets == [*py_offsets, struct.calcsize(args_format())]


# --------------------------------------------------------------------------- cross-compile


@pytest.mark.parametrize("unit", toolchain.cross_units(), ids=lambda u: u.name)
def test_cross_compiles_warning_free(unit, tmp_path):
    out = toolchain.run_unit(unit, tmp_path)
    assert out.stat().st_size > 0
    from elftools.elf.elffile import ELFFile

    with open(out, "rb") as f:
        assert ELFFile(f)["e_machine"] == "EM_AARCH64"


def test_cross_compile_failure_is_reported(tmp_path):
    broken = tmp_path / "broken.c"
    broken.write_text("int f(void) { int unused; return 0; }\n")
    unit = toolchain.Unit("broken", "broken.o", (*toolchain.ZIG, "cc", "-target",
                          toolchain.TARGET, *toolchain.C_FLAGS, "-c", str(broken)))
    with pytest.raises(toolchain.ToolchainError, match="unused"):
        toolchain.run_unit(unit, tmp_path)


def test_runtime_so_needs_no_library(tmp_path):
    """The runtime route's .so must load on the AI-CPU with nothing beside it."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    unit = next(u for u in toolchain.cross_units() if u.output.endswith(".so"))
    with open(toolchain.run_unit(unit, tmp_path), "rb") as f:
        elf = ELFFile(f)
        needed = [t.needed for s in elf.iter_sections() if isinstance(s, DynamicSection)
                  for t in s.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
        exported = {s.name for s in elf.get_section_by_name(".dynsym").iter_symbols()
                    if s["st_shndx"] != "SHN_UNDEF" and s.name}
        undefined = {s.name for s in elf.get_section_by_name(".dynsym").iter_symbols()
                     if s["st_shndx"] == "SHN_UNDEF" and s.name}
    assert needed == [] and undefined == set()
    assert "aicpu_tiling_kernel" in exported


# --------------------------------------------------------------------------- emulator


def test_block_count_equals_per_instruction_count(emu):
    params = TilingParams(**LLAMA_8B, max_batch=64, max_tokens=64, max_blocks_per_req=64,
                          num_cores=24)
    cu, kv = np.arange(9), [100 * i + 1 for i in range(8)]
    fast = emu.plan(params, cu, kv)
    exact = emu.plan(params, cu, kv, exact_count=True)
    assert fast.instructions == exact.instructions > 1000
    assert fast.buffer == exact.buffer


def test_read_past_an_array_faults(emu):
    """The guard pages work: batch 3 with arrays of 2 requests reads past the end."""
    params = TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                          num_cores=4)
    with pytest.raises(EmulationError, match="UNMAPPED|unmapped"):
        emu.plan(params, [0, 1, 2], [5, 5], batch=3)
    emu.plan(params, [0, 1, 2], [5, 5])  # the machine is usable afterwards


def test_machine_rejects_a_non_aarch64_file(tmp_path):
    import shutil
    import sys

    exe = tmp_path / "host.elf"
    shutil.copy(sys.executable, exe)  # an x86-64 (or other host) ELF
    if exe.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("the interpreter is not an ELF file")
    with pytest.raises(EmulationError):
        Machine(exe)


# --------------------------------------------------------------------------- byte identity


def test_golden_vectors_byte_identical(emu):
    cases = json.loads(GOLDEN.read_text())
    for case in cases:
        params = params_from_words(case["params"])  # the C word's 0: no window
        status = assert_same(emu, params, case["cu_seqlens_q"], case["seqlens_kv"],
                             case["causal"], case["epoch"])
        assert np.frombuffer(emu.plan(params, case["cu_seqlens_q"], case["seqlens_kv"],
                                      causal=case["causal"], epoch=case["epoch"]).buffer,
                             dtype="<i4")[: len(case["words"])].tolist() == case["words"]
        assert status == case["words"][2]


@pytest.mark.parametrize("window", [None, 128])  # 128: the windowed decode pass (ABI v5)
@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_trace_decode_batches_byte_identical(emu, batch, window):
    params = TilingParams(**LLAMA_8B, max_batch=1024, max_tokens=1024, max_blocks_per_req=512,
                          num_cores=24, q_tile=16, sliding_window=window)
    rng = np.random.default_rng(batch)
    cu, kv = trace_decode_batch(batch, rng, params.kv_capacity)
    assert assert_same(emu, params, cu, kv, True) == 0


@pytest.mark.parametrize("causal", [True, False])
def test_trace_mixed_batches_byte_identical(emu, causal):
    params = TilingParams(**LLAMA_8B, max_batch=64, max_tokens=2048, max_blocks_per_req=256,
                          num_cores=20)
    rng = np.random.default_rng(7)
    for _ in range(4):
        cu, kv = trace_mixed_batch(48, rng, params)
        assert_same(emu, params, cu, kv, causal)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), params=small_params(windows=True), causal=st.booleans(),
       epoch=st.integers(-(2**31), 2**31 - 1))
def test_fuzz_byte_identical(emu, data, params, causal, epoch):
    causal = causal or params.sliding_window is not None  # a window needs causal (else E_PARAMS)
    cu, kv = data.draw(any_inputs(params, causal))
    assert_same(emu, params, cu, kv, causal, epoch)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), params=small_params(), causal=st.booleans())
def test_fuzz_bad_batch_params_and_buffers(emu, data, params, causal):
    """The statuses the Python API cannot reach: batch out of range, raw invalid params,
    short buffers. Host and AArch64 builds run on the same FILL-prefilled buffer."""
    words = params_words(params)
    kind = data.draw(st.sampled_from(["batch", "params", "buffer"]))
    n = data.draw(st.integers(0, params.max_batch))
    cu, kv = list(range(n + 1)), [max(1, params.kv_capacity // 2)] * n
    batch, size = n, params.tiling_bytes
    if kind == "batch":
        batch = data.draw(st.sampled_from([-1, -(2**31), params.max_batch + 1, 2**31 - 1]))
    elif kind == "params":
        field = data.draw(st.integers(0, 15))
        words[field] = data.draw(st.sampled_from([-1, 0, 2**31 - 1, 5000, 3]))
    else:
        size = data.draw(st.sampled_from([0, 4, 60, 64, params.tiling_bytes - 4]))
    epoch = data.draw(st.integers(-(2**31), 2**31 - 1))
    want_status, want = host_raw(words, cu, kv, batch, causal, size, epoch)
    got = emu.plan(words, cu, kv, batch=batch, causal=causal, epoch=epoch, buffer_bytes=size)
    assert (got.status, got.buffer) == (want_status, want)


@pytest.mark.parametrize("live", [None, 0, 3, 4, 5, -1])
def test_entry_live_batch_and_plumbing(emu, live):
    """The entry reads the live batch from device memory; out-of-range values reach the
    kernel and come back as E_BATCH in the header, with the entry still returning OK."""
    params = TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                          num_cores=6)
    cu, kv = [0, 1, 2, 3, 4], [300, 1, 4000, 77]
    got = emu.launch_entry(params, cu, kv, 4, live_batch=live, step_epoch=-41)
    used = 4 if live is None else live
    status, want = host_raw(params_words(params), cu, kv, used, True, params.tiling_bytes, -41)
    assert got.status == KERNEL_OK
    assert got.buffer == want
    assert status == (0 if 0 <= used <= 4 else lib.AICPU_TILING_E_BATCH)


def test_entry_plans_more_tilings_in_one_launch(emu):
    """ABI v3: one launch plans the block's own tiling and each of ``more`` (one per distinct
    sliding window: gpt-oss's full and 128-token layers) from the same lengths, live batch and
    epoch; each buffer is what the host build plans for its own params."""
    full = TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                        num_cores=6)
    windows = [dataclasses.replace(full, sliding_window=w) for w in (128, 1, 4096)]
    cu, kv = [0, 1, 2, 4, 5], [300, 1, 4000, 77]
    got = emu.launch_entry(full, cu, kv, 4, live_batch=3, step_epoch=9, more=windows)
    assert got.status == KERNEL_OK
    for params, buffer in zip([full, *windows], [got.buffer, *got.more_buffers], strict=True):
        status, want = host_raw(params_words(params), cu, kv, 3, True, params.tiling_bytes, 9)
        assert status == 0 and buffer == want
    assert got.more_buffers[0] != got.buffer  # the window changed the plan (kv 4000 > 128)
    # a further plan whose buffer is too small fails the launch (E_BUFFER) like the first
    got = emu.launch_entry(full, cu, kv, 4, more=[(windows[0], 64)])
    assert got.status == KERNEL_INVALID
    assert got.more_buffers[0] == bytes([FILL]) * 64
    # num_more past the block's capacity: refused before anything is planned
    got = emu.launch_entry(full, cu, kv, 4, num_more=max_plans())
    assert (got.status, got.buffer) == (KERNEL_INVALID, bytes([FILL]) * full.tiling_bytes)
    with pytest.raises(ValueError, match="holds 3"):
        emu.launch_entry(full, cu, kv, 4, more=[full] * max_plans())


def test_entry_rejects_bad_blocks(emu):
    params = TilingParams(**LLAMA_8B, max_batch=4, max_tokens=8, max_blocks_per_req=64,
                          num_cores=6)
    # live batch with arrays shorter than max_batch: refused before anything is read
    got = emu.launch_entry(params, [0, 1], [5], 1, live_batch=1)
    assert got.status == KERNEL_INVALID
    assert got.buffer == bytes([FILL]) * params.tiling_bytes
    # a buffer too small for the tiling: E_BUFFER, reported as INVALID, nothing written
    got = emu.launch_entry(params, [0, 1], [5], 1, buffer_bytes=64)
    assert got.status == KERNEL_INVALID
    assert got.buffer == bytes([FILL]) * 64


# --------------------------------------------------------------------------- bench column


def test_bench_tiling_gets_instruction_counts():
    from pyruntime.cli import tiling_bench
    from pyruntime.measurement.sources import trace_path

    rows = [{"batch": b} for b in (1, 8, 64, 256, 1024, 3)]
    info = tiling_bench.add_instruction_counts(rows, trace_path())
    counted = {r["batch"]: r["aarch64_instructions"] for r in rows if "aarch64_instructions" in r}
    assert sorted(counted) == [1, 8, 64, 256, 1024]  # batch 3 was not run by the C bench
    assert all(c > 500 for c in counted.values())
    assert counted[1024] > counted[64]  # decode cost grows with the batch past the small sizes
    assert "AArch64 instructions per call" in info["note"]
    assert [r["min"] <= r["median"] <= r["max"] for r in info["rows"]] == [True] * 5


def test_bench_batches_follow_the_c_generator():
    """The mirrored xorshift64* stream: first outputs for the C seed, computed by hand."""
    from pyruntime.cli import tiling_bench

    context, generated = np.arange(1, 101), np.zeros(100, dtype=np.int64)
    batches = tiling_bench.bench_batches(context, generated, kv_capacity=10**9)
    assert [len(batches[s]) for s in tiling_bench.BENCH_SIZES] == [8] * 5
    state = tiling_bench.BENCH_SEED
    state ^= state >> 12
    state ^= (state << 25) & ((1 << 64) - 1)
    state ^= state >> 27
    first = ((state * 2685821657736338717) & ((1 << 64) - 1)) >> 32
    assert batches[1][0] == [int(context[first % 100]) + 1]
