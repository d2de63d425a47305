"""The twin of vLLM-Ascend's ``vllm_ascend_C`` (issue 28, item 5): `pyruntime.npu_twin
.vllm_ascend_c`.

* Its schemas are the releases': the sdists' ``csrc/torch_binding.cpp`` of 0.23.0.post1 and
  0.30.0rc2 (``tools/fetch_wheels.sh`` caches them; CI runs it, and a missing sdist fails the
  test under ``CI=true``, else skips it), read for the twin's SoC, equal the table the twin
  registers, and the registered ops carry exactly those schemas.
* In a twin process (a stand-in ``vllm_ascend`` package that only says its release, since
  vLLM-Ascend itself is not installed here): the ops with a body against their fp32
  references (``npu_add_rms_norm_bias`` against torch's RMSNorm; the punica ops against the
  CPU references of vLLM-Ascend's own kernel tests), queued as AI Core tasks and replayed in
  a graph, their fake kernels, their rules (each refusal queues nothing), and every other op
  raising ``NotInTwinError``.
* In the vLLM environments of ``tools/vllm_env.sh``: vLLM-Ascend's own ``enable_custom_op()``
  is True on the twin, and its ``AscendRMSNorm`` and LoRA ops run through the twin's ops.
"""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from pyruntime.npu_twin.vllm_ascend_c import BODIES, BUILD_DEFINES, read_torch_binding
from pyruntime.npu_twin.vllm_ascend_c_schemas import SCHEMAS
from tests.wheels import cached_release, vllm_env

REPO = Path(__file__).resolve().parents[2]
RELEASES = ("0.23.0.post1", "0.30.0rc2")


def _torch_binding(release: str) -> str:
    archive = cached_release(release)
    with tarfile.open(archive) as tar:
        return tar.extractfile(f"vllm_ascend-{release}/csrc/torch_binding.cpp").read().decode()


def test_reader_keeps_only_the_branches_the_build_takes():
    text = r'''
    TORCH_LIBRARY_EXPAND(CONCAT(_C, _ascend), ops) {
    #ifdef ASCEND_PLATFORM_310P
        ops.def("only_310p(Tensor x) -> Tensor");
    #else
        ops.def("everywhere(Tensor x, "
                "  str mode=\"BSND\") -> Tensor");   // ops.def("commented(Tensor x) -> ()");
    #if defined(A) && !defined(B)
        ops.def("a_not_b(Tensor x) -> ()");
    #elif defined(B)
        ops.def("b(Tensor x) -> ()");
    #endif
    /* ops.def("block_comment(Tensor x) -> ()"); */
    #endif
    }
    '''
    assert read_torch_binding(text, frozenset({"A"})) == {
        "everywhere": 'everywhere(Tensor x, str mode="BSND") -> Tensor',
        "a_not_b": "a_not_b(Tensor x) -> ()"}
    assert list(read_torch_binding(text, frozenset({"A", "B"}))) == ["everywhere", "b"]
    assert list(read_torch_binding(text, frozenset({"ASCEND_PLATFORM_310P"}))) == ["only_310p"]
    with pytest.raises(ValueError, match="cannot evaluate"):
        read_torch_binding("#if VERSION > 3\n#endif\n")


@pytest.mark.parametrize("release", RELEASES)
def test_schemas_are_the_releases_torch_binding(release):
    source = _torch_binding(release)
    read = read_torch_binding(source)
    assert SCHEMAS[release] == read
    # every op given a body is defined by the release, but those named release-only, which
    # are defined exactly by the releases named
    from pyruntime.npu_twin.vllm_ascend_c import RELEASE_ONLY_BODIES
    everywhere = set(BODIES) - set(RELEASE_ONLY_BODIES)
    assert everywhere <= set(read), "every op given a body is defined by the release"
    for name, releases in RELEASE_ONLY_BODIES.items():
        assert name in BODIES and (name in read) == (release in releases), (name, release)
    # the SoC's build matters: the 310P build defines other ops (no direct kernels)
    on_310p = read_torch_binding(source, BUILD_DEFINES | {"ASCEND_PLATFORM_310P"})
    assert "npu_causal_conv1d_310" in on_310p and "bgmv_shrink" not in on_310p
    assert "bgmv_shrink" not in read_torch_binding(source, frozenset())


def _stand_in_package(root: Path, release: str) -> Path:
    """A ``vllm_ascend`` package that only says its release (``_version.py``, as the sdist's)."""
    package = root / f"vllm-ascend-{release}" / "vllm_ascend"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "_version.py").write_text(f"__version__ = version = {release!r}\n")
    return package.parent


TWIN_SCRIPT = r'''
import vllm_ascend
from vllm_ascend import _version
from pyruntime.npu_twin import device as twin
from pyruntime.npu_twin.npu_module import NotInTwinError
from pyruntime.npu_twin.vllm_ascend_c_schemas import SCHEMAS

ops = torch.ops._C_ascend
dev = twin.device()
gen = torch.Generator().manual_seed(0)


def imports():
    import vllm_ascend.vllm_ascend_C  # noqa: F401


check("import vllm_ascend.vllm_ascend_C", imports)


def schemas_registered():
    table = SCHEMAS[_version.version]
    for name, schema in table.items():
        packet, _, overload = name.partition(".")
        got = str(getattr(getattr(ops, packet), overload or "default")._schema)
        eq(got, str(torch._C.parse_schema("_C_ascend::" + schema)))


check("every op of the release with its schema", schemas_registered)


def rms_reference(x1, x2, gamma, beta, eps):
    x = x1.float() + x2.float()
    y = torch.nn.functional.rms_norm(x, tuple(gamma.shape), gamma.float(), eps)
    if beta is not None:
        y = y + beta.float()
    rstd = torch.rsqrt(x.pow(2).mean(dim=tuple(range(x.dim() - gamma.dim(), x.dim())),
                                     keepdim=True) + eps)
    return y, rstd, x


def close(got, want, dtype):
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(got.cpu().float(), want.to(dtype).float(), atol=tol, rtol=tol)


def add_rms_norm_bias_numerics():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape, gamma_shape, with_beta in (((7, 64), (64,), False), ((2, 3, 32), (32,), True),
                                              ((4, 2, 16), (2, 16), True)):
            x1, x2 = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
            gamma = torch.randn(gamma_shape, generator=gen).to(dtype)
            beta = torch.randn(gamma_shape, generator=gen).to(dtype) if with_beta else None
            y, rstd, x = ops.npu_add_rms_norm_bias(x1.npu(), x2.npu(), gamma.npu(),
                                                   None if beta is None else beta.npu(), 1e-5)
            want_y, want_rstd, want_x = rms_reference(x1, x2, gamma, beta, 1e-5)
            eq((y.device.type, y.dtype, rstd.dtype, x.dtype),
               ("npu", dtype, torch.float32, dtype))
            eq(list(rstd.shape), list(shape[:len(shape) - len(gamma_shape)])
               + [1] * len(gamma_shape))
            close(y, want_y, dtype)
            close(x, want_x, dtype)
            torch.testing.assert_close(rstd.cpu(), want_rstd.reshape(rstd.shape))


check("npu_add_rms_norm_bias against torch's fp32 RMSNorm", add_rms_norm_bias_numerics)


def add_rms_norm_bias_is_a_captured_ai_core_task():
    x1 = torch.randn(4, 16, generator=gen).half().npu()
    x2 = torch.randn(4, 16, generator=gen).half().npu()
    gamma = torch.randn(16, generator=gen).half().npu()
    torch.npu.synchronize()
    before = dev.stats["aicore"]
    with capture() as (graph, stream):
        y, _, _ = ops.npu_add_rms_norm_bias(x1, x2, gamma, None, 1e-6)
    eq(dev.stats["aicore"], before + 1)
    fresh = torch.randn(4, 16, generator=gen).half()
    x1.copy_(fresh.npu())
    graph.replay()
    torch.npu.synchronize()
    close(y, rms_reference(fresh, x2.cpu(), gamma.cpu(), None, 1e-6)[0], torch.float16)


check("npu_add_rms_norm_bias is an AI Core task, captured and replayed",
      add_rms_norm_bias_is_a_captured_ai_core_task)


def fake_kernels():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(3, 5, 8, dtype=torch.bfloat16)
        y, rstd, s = ops.npu_add_rms_norm_bias(x, x, torch.empty(8, dtype=torch.bfloat16))
        eq([list(t.shape) for t in (y, rstd, s)], [[3, 5, 8], [3, 5, 1], [3, 5, 8]])
        eq((y.dtype, rstd.dtype), (torch.bfloat16, torch.float32))
        lora_y = torch.empty(4, 32, dtype=torch.float16)
        out = ops.bgmv_expand(torch.empty(4, 8), torch.empty(2, 16, 8, dtype=torch.float16),
                              torch.empty(4, dtype=torch.int64), lora_y, 0, 16)
        eq((list(out.shape), out.dtype), ([4, 32], torch.float16))
        eq(ops.bgmv_shrink(torch.empty(4, 32, dtype=torch.float16),
                           torch.empty(2, 8, 32, dtype=torch.float16),
                           torch.empty(4, dtype=torch.int64), torch.empty(4, 8), 1.0), None)


check("the fake kernels give the real ops' shapes and dtypes", fake_kernels)


def refused(exc_type, fragment, op, *args):
    """op(*args) must raise exc_type with fragment, having queued nothing (the arguments
    are made before the count)."""
    torch.npu.synchronize()
    work = sum(dev.stats[k] for k in ("aicore", "op"))
    expect(exc_type, fragment, lambda: op(*args))
    eq(sum(dev.stats[k] for k in ("aicore", "op")), work)


def add_rms_norm_bias_rules():
    x = torch.randn(4, 16).half().npu()
    g = torch.randn(16).half().npu()
    norm = ops.npu_add_rms_norm_bias
    refused(RuntimeError, "one dtype", norm, x, x, g.float(), None, 1e-6)
    refused(RuntimeError, "takes float16, float32 or bfloat16", norm, x.int(), x.int(),
            g.int(), None, 1e-6)
    refused(RuntimeError, "must have the shape of x1", norm, x, x[:2], g, None, 1e-6)
    refused(RuntimeError, "trailing dims", norm, x, x, g[:8], None, 1e-6)
    refused(RuntimeError, "beta", norm, x, x, g, g[:4], 1e-6)
    refused(twin.HostPointerError, "x2 must be an npu tensor", norm, x, x.cpu(), g, None,
            1e-6)


check("npu_add_rms_norm_bias refuses what aclnnAddRmsNormBias refuses", add_rms_norm_bias_rules)


# vLLM-Ascend 0.30.0rc2 tests/e2e/nightly/single_node/ops/singlecard_ops/test_bgmv_shrink.py
# and test_bgmv_expand.py: the CPU references its kernels are tested against
def bgmv_shrink_cpu_impl(x, w, indices, y, scaling):
    W = w[indices, :, :].transpose(-1, -2).to(torch.float32)
    z = torch.bmm(x.unsqueeze(1).to(torch.float32), W).squeeze(1)
    y[:, :] += z * scaling
    return y


def bgmv_expand_cpu_impl(x, w, indices, y, slice_offset, slice_size):
    W = w[indices, :, :].transpose(-1, -2).to(torch.float32)
    z = torch.bmm(x.unsqueeze(1).to(torch.float32), W).squeeze(1)
    y[:, slice_offset:slice_offset + slice_size] += z
    return y


def punica_numerics():
    B, H, R, L = 6, 64, 8, 3
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(B, H, generator=gen).to(dtype)
        wa = torch.randn(L, R, H, generator=gen).to(dtype)
        wb = torch.randn(L, 16, R, generator=gen).to(dtype)
        idx = torch.tensor([0, 2, -1, 1, 2, 0])
        live = idx >= 0
        # bgmv: a negative index leaves its row as it was
        y = torch.full((B, R), 3.0)
        ops.bgmv_shrink(x.npu(), wa.npu(), idx.npu(), yn := y.npu(), 0.5)
        want = torch.where(live[:, None], bgmv_shrink_cpu_impl(
            x, wa, idx.clamp(min=0), torch.zeros(B, R), 0.5), y)
        torch.testing.assert_close(yn.cpu(), want, atol=1e-4, rtol=1e-4)
        shrunk = torch.randn(B, R, generator=gen)
        base = torch.randn(B, 40, generator=gen).to(dtype)
        out = ops.bgmv_expand(shrunk.npu(), wb.npu(), idx.npu(), yb := base.npu(), 10, 16)
        eq(out is yb, True)
        want = bgmv_expand_cpu_impl(shrunk, wb, idx.clamp(min=0), base.float(), 10, 16)
        close(yb, torch.where(live[:, None], want, base.float()), dtype)
        # sgmv: one index per sequence, tokens past the sequences untouched
        seq_len, lora = torch.tensor([2, 1, 2]), torch.tensor([1, -1, 2])
        token = torch.tensor([1, 1, -1, 2, 2, -1])
        tlive = token >= 0
        y = torch.full((B, R), -1.0)
        ops.sgmv_shrink(x.npu(), wa.npu(), lora.npu(), seq_len.npu(), yn := y.npu(), 2.0)
        want = bgmv_shrink_cpu_impl(x, wa, token.clamp(min=0), torch.zeros(B, R), 2.0)
        torch.testing.assert_close(yn.cpu(), torch.where(tlive[:, None], want, y), atol=1e-4,
                                   rtol=1e-4)
        ops.sgmv_expand(shrunk.npu(), wb.npu(), lora.npu(), seq_len.npu(), yb := base.npu(), 0,
                        16)
        want = bgmv_expand_cpu_impl(shrunk, wb, token.clamp(min=0), base.float(), 0, 16)
        close(yb, torch.where(tlive[:, None], want, base.float()), dtype)


check("the punica ops against vLLM-Ascend's CPU references", punica_numerics)


def punica_rules():
    x = torch.randn(4, 32).half().npu()
    wa = torch.randn(2, 8, 32).half().npu()
    idx = torch.zeros(4, dtype=torch.int64).npu()
    y = torch.zeros(4, 8).npu()
    shrink, expand = ops.bgmv_shrink, ops.bgmv_expand
    refused(RuntimeError, "only support half and bf16", shrink, x.float(), wa, idx, y, 1.0)
    refused(RuntimeError, "reads y as torch.float32", shrink, x, wa, idx, y.half(), 1.0)
    refused(RuntimeError, "must be a 1-d int64", shrink, x, wa, idx.int(), y, 1.0)
    refused(RuntimeError, "hidden in should be greater than hidden out", shrink,
            x[:, :8].contiguous(), wa[:, :, :8].contiguous(), idx, y, 1.0)
    refused(RuntimeError, "the first dimension of x, y, indices should be same", shrink, x,
            wa, idx[:3], y, 1.0)
    refused(RuntimeError, "must be [num_loras, 8, 32]", shrink, x,
            torch.randn(2, 32, 8).half().npu(), idx, y, 1.0)
    refused(RuntimeError, "must be contiguous", shrink, x.t().contiguous().t(), wa, idx, y,
            1.0)
    wb = torch.randn(2, 16, 8).half().npu()
    out = torch.zeros(4, 32).half().npu()
    refused(RuntimeError, "slice_size + slice_offset", expand, y, wb, idx, out, 20, 16)
    refused(RuntimeError, "slice offset should be no smaller than 0", expand, y, wb, idx, out,
            -1, 16)
    refused(RuntimeError, "reads x as torch.float32", expand, y.half(), wb, idx, out, 0, 16)
    refused(twin.HostPointerError, "indices must be an npu tensor", shrink, x, wa, idx.cpu(),
            y, 1.0)
    # an index past the weights: the kernel would read out of bounds (an AI Core exception)
    shrink(x, wa, torch.full((4,), 5, dtype=torch.int64).npu(), y, 1.0)
    expect(twin.TwinError, "out of bounds", torch.npu.synchronize)


check("the punica ops refuse what their wrappers and kernels refuse", punica_rules)


def eagle(ids, pos, nxt, starts, ends, slots, shift, total):
    i32 = lambda v: torch.tensor(v, dtype=torch.int32).npu()  # noqa: E731
    out = ops.npu_copy_and_expand_eagle_inputs(i32(ids), i32(pos), i32(nxt), i32(starts),
                                               i32(ends), 0, -7, slots, shift, total)
    eq([t.dtype for t in out], [torch.int32] * 2 + [torch.int8] * 2 + [torch.int32] * 2)
    return [t.cpu().tolist() for t in out]


def eagle_inputs_worked_examples():
    # two requests of 3 and 2 tokens, the first with one rejected token (query_end_loc =
    # query_start_loc[1:] - 1 - rejected, as llm_base_proposer.py computes it), 2 slots each
    ids, pos, nxt = [10, 11, 12, 20, 21], [100, 101, 102, 200, 201], [13, 22]
    # without shift: valid tokens, the bonus, one masked parallel-drafting slot, rejected
    eq(eagle(ids, pos, nxt, [0, 3, 5], [1, 4], 2, False, 9), [
        [10, 11, 13, -7, 0, 20, 21, 22, -7], [100, 101, 102, 103, 0, 200, 201, 202, 203],
        [0, 0, 0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0, 0, 1], [2, 3, 7, 8], [0] * 5])
    # shifted (hidden states passed on): one slot less per request, the ids read from qs + 1
    eq(eagle(ids, pos, nxt, [0, 3, 5], [1, 4], 2, True, 7), [
        [11, 13, -7, 0, 21, 22, -7], [100, 101, 102, 0, 200, 201, 202],
        [0, 0, 0, 1, 0, 0, 0], [0, 0, 1, 0, 0, 0, 1], [1, 2, 5, 6], [0, 1, 2, 4, 5]])
    args = [torch.zeros(n, dtype=torch.int32).npu() for n in (5, 5, 2, 3, 2)]
    with capture() as (graph, stream):
        ops.npu_copy_and_expand_eagle_inputs(*args, 0, -7, 2, False, 2)
    graph.replay()  # a draft buffer too small for what the kernel writes
    expect(twin.TwinError, "out of bounds", torch.npu.synchronize)


check("npu_copy_and_expand_eagle_inputs: worked examples of the AscendC kernel",
      eagle_inputs_worked_examples)


def eagle_inputs_rules_and_fake():
    i32 = torch.zeros(5, dtype=torch.int32).npu()
    two, three = i32[:2], i32[:3]
    op = ops.npu_copy_and_expand_eagle_inputs
    refused(RuntimeError, "query_start_loc must be int32", op, i32, i32, two, three.long(),
            two, 0, -7, 2, False, 9)
    refused(RuntimeError, "disagree", op, i32, i32, two, three, three, 0, -7, 2, False, 9)
    refused(RuntimeError, "one entry per target token", op, i32, three, two, three, two, 0,
            -7, 2, False, 9)
    refused(twin.HostPointerError, "next_token_ids must be an npu tensor", op, i32, i32,
            two.cpu(), three, two, 0, -7, 2, False, 9)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        t = torch.empty(5, dtype=torch.int32)
        out = op(t, t, t[:2], t[:3], t[:2], 0, -7, 2, True, 7)
        eq([(list(o.shape), o.dtype) for o in out],
           [([7], torch.int32), ([7], torch.int32), ([7], torch.int8), ([7], torch.int8),
            ([4], torch.int32), ([5], torch.int32)])


check("npu_copy_and_expand_eagle_inputs: its rules and fake kernel", eagle_inputs_rules_and_fake)


def others_are_not_in_the_twin():
    for name, make in (("npu_gemma_rms_norm",
                        lambda where: (torch.randn(4, 8, device=where),
                                       torch.randn(8, device=where))),
                       ("npu_sign_bits_pack", lambda where: (torch.randn(8, device=where), 2))):
        for where in ("npu", "cpu", "meta"):
            expect(NotInTwinError, f"_C_ascend.{name}", lambda: getattr(ops, name)(*make(where)))
    expect(NotInTwinError, "_C_ascend.device_print", lambda: ops.device_print("hello"))


check("every other op raises NotInTwinError on every device", others_are_not_in_the_twin)
'''


def _twin_rules(run_twin, tmp_path: Path, release: str) -> dict[str, str]:
    tree = _stand_in_package(tmp_path, release)
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(tree)])}
    return run_twin.rules(run_twin(TWIN_SCRIPT, env=env, timeout=300))


@pytest.mark.parametrize("release", RELEASES)
def test_the_twins_vllm_ascend_c(run_twin, tmp_path, release):
    rules = _twin_rules(run_twin, tmp_path, release)
    broken = {rule: outcome for rule, outcome in rules.items() if outcome != "ok"}
    assert not broken, "\n".join(f"{rule}: {outcome}" for rule, outcome in broken.items())
    # every check reported (a script that died early reports fewer, and "<script>")
    assert sorted(rules) == sorted(re.findall(r'^check\("([^"]+)"', TWIN_SCRIPT, re.MULTILINE))


def test_a_release_without_schemas_cannot_import_it(run_twin, tmp_path):
    tree = _stand_in_package(tmp_path, "0.26.0rc1")
    script = """
def imports():
    import vllm_ascend.vllm_ascend_C  # noqa: F401


expect(ImportError, "not 0.26.0rc1", imports)
check("nothing registered", lambda: eq(hasattr(torch.ops._C_ascend, "bgmv_shrink"), False))
"""
    proc = run_twin(script, env={"PYTHONPATH": os.pathsep.join([str(REPO), str(tree)])})
    assert run_twin.rules(proc) == {"nothing registered": "ok"}, proc.stderr[-2000:]


VENV_SCRIPT = r'''
from pyruntime import npu_twin
npu_twin.activate()
import torch
from vllm_ascend.utils import enable_custom_op

assert enable_custom_op() is True, "custom ops are off on the twin"
import vllm_ascend.utils as utils

# the device_print ops' registration: 0.30's NPUWorker.init_device calls
# register_device_print() next (probe step 21); 0.23 does it at the first device_print
(getattr(utils, "register_device_print", None) or utils._ensure_device_print_registered)()
from vllm.config import VllmConfig, set_current_vllm_config
from vllm_ascend.ops.layernorm import AscendRMSNorm
from vllm_ascend.lora import lora_ops

gen = torch.Generator().manual_seed(0)
with set_current_vllm_config(VllmConfig()):
    norm = AscendRMSNorm(64, eps=1e-6).to(dtype=torch.bfloat16)
norm.weight.data.copy_(torch.randn(64, generator=gen))
norm = norm.to("npu")
x, residual = (torch.randn(5, 64, generator=gen).bfloat16() for _ in range(2))
out, new_residual = norm.forward_oot(x.npu(), residual.npu())
added = x.float() + residual.float()
want = torch.nn.functional.rms_norm(added, (64,), norm.weight.cpu().float(), 1e-6)
torch.testing.assert_close(out.cpu().float(), want.bfloat16().float(), atol=2e-2, rtol=2e-2)
torch.testing.assert_close(new_residual.cpu(), added.bfloat16())
before = npu_twin.device.device().stats["aicore"]
y = torch.zeros(5, 8, device="npu")
lora_ops.bgmv_shrink(x.npu(), torch.randn(2, 8, 64, generator=gen).bfloat16().npu(), y,
                     torch.tensor([0, 1, -1, 0, 1]).npu(), 0.5)
torch.npu.synchronize()
assert npu_twin.device.device().stats["aicore"] == before + 1
print("VLLM-ASCEND-C-OK")
'''


@pytest.mark.parametrize("release", RELEASES)
def test_vllm_ascend_turns_custom_ops_on_and_runs_them_on_the_twin(release):
    """vLLM-Ascend's own enable_custom_op() (``vllm_ascend/utils.py``) is True on the twin, as
    on hardware, the device_print ops' registration finds them, and its AscendRMSNorm with a
    residual (_C_ascend.npu_add_rms_norm_bias) and LoRA's bgmv_shrink run through the twin's
    ops."""
    env_dir = vllm_env(release)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AICPU_TILING", "VLLM_")) and k != "PYTHONHOME"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(env_dir / "vllm-ascend")])
    proc = subprocess.run([str(env_dir / "venv" / "bin" / "python"), "-c", VENV_SCRIPT],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0 and "VLLM-ASCEND-C-OK" in proc.stdout, proc.stderr[-4000:]
