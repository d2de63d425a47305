"""Line coverage of the NPU-only code, run unmodified on the NPU twin.

    python tools/twin_coverage.py [--json]

Runs, in this process on the twin (`pyruntime.npu_twin`): every selfcheck check body on the
NPU backend, `StaticAttention` in every mode and placement, the capture-abort path, the
kernel loader's errors, and the vLLM engine (`NpuTilingEngine`) captured under
``torch.npu.graph`` in both placements, then prints the line coverage of
``pyruntime/backends/npu*.py`` (issue 16 aims at 90 % or more). Exit status 0 when every
scenario ran. Needs ``coverage`` (the ``test`` extra), ziglang, unicorn and triton.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MEASURED = ("pyruntime/backends/npu.py", "pyruntime/backends/npu_kernels.py",
            "pyruntime/hook/npu_engine.py")


def _engine_scenario(placement: str) -> None:
    """The vLLM engine as the hook drives it: layers captured inside torch.npu.graph,
    before_replay and the replay each step, errors() read back."""
    import numpy as np
    import torch

    from pyruntime.backends import npu_kernels
    from pyruntime.hook.engine import AttentionCapture
    from pyruntime.hook.npu_engine import NpuTilingEngine

    npu_kernels.load()
    engine = NpuTilingEngine(placement, num_cores=4)
    heads, kv_heads, dim, block, tokens, batch = 8, 2, 32, 16, 4, 4
    dev = {"device": "npu"}
    query = torch.zeros(tokens, heads, dim, **dev)
    cache = torch.zeros(16, block, kv_heads * dim, **dev)
    table = torch.arange(16, dtype=torch.int32).reshape(batch, 4).to("npu")
    cu = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32).to("npu")
    # the last slot is vLLM-Ascend's uniform padding (q_len 1, kv_len 0): trailing padding
    lens = torch.tensor([5, 17, 33, 0], dtype=torch.int32).to("npu")
    live = torch.tensor([batch], dtype=torch.int32).to("npu")  # made outside the capture
    outputs = [torch.zeros(tokens, heads * dim, **dev) for _ in range(2)]
    captures = [AttentionCapture(("graph", tokens), f"layer{layer}", query, cache, cache, table,
                                 cu, lens, live, out, heads, kv_heads, dim, block, dim ** -0.5,
                                 True) for layer, out in enumerate(outputs)]
    # the hook's eager warm-up before vLLM captures: one launch per kernel variant
    assert engine.warm_up(captures[0]) and not engine.warm_up(captures[1])
    stream, graph = torch.npu.Stream(), torch.npu.NPUGraph()
    with torch.npu.graph(graph, stream=stream):
        for capture in captures:
            engine.capture_attention(capture)
    assert engine.cold_captures == [], engine.cold_captures
    for _ in range(2):
        engine.before_replay(tokens)
        graph.replay()
    torch.npu.synchronize()
    assert not engine.errors(), engine.errors()
    np.testing.assert_array_equal(outputs[0].cpu().numpy(), outputs[1].cpu().numpy())
    assert not outputs[0].cpu()[3:].any()  # the padding slot's row is zero
    mismatched = AttentionCapture(("graph", tokens), "odd", query, cache, cache, table, cu, lens,
                                  live, outputs[0], heads * 2, kv_heads, dim, block, 1.0, True)
    try:
        with torch.npu.graph(torch.npu.NPUGraph(), stream=stream):
            engine.capture_attention(mismatched)
    except Exception as exc:  # noqa: BLE001 - the geometry check must refuse it
        assert "head geometry" in str(exc), exc
    else:
        raise AssertionError("a second geometry in one graph key was accepted")


def _mla_engine_scenario(placement: str) -> None:
    """The vLLM engine's MLA capture (`capture_mla`) as the MLA hook drives it: two MLA
    layers of one graph key captured inside torch.npu.graph, replayed twice, against float64
    absorbed MLA; a second MLA geometry in the key refused."""
    import dataclasses

    import torch

    from pyruntime.backends import npu_kernels
    from pyruntime.hook.dryrun.mla import reference
    from pyruntime.hook.npu_engine import NpuTilingEngine
    from pyruntime.hook.vllm_ascend_mla import MLACapture

    npu_kernels.load()
    engine = NpuTilingEngine(placement, num_cores=4)
    heads, lora, rope, block, tokens, batch = 4, 32, 16, 16, 4, 4
    gen = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to("npu")

    table_cpu = torch.randperm(16, generator=gen).int().reshape(batch, 4)
    table = table_cpu.to("npu")
    cu = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32).to("npu")
    kv_lens = [5, 17, 33, 0]  # the last slot: uniform padding (trailing)
    lens = torch.tensor(kv_lens, dtype=torch.int32).to("npu")
    live = torch.tensor([batch], dtype=torch.int32).to("npu")
    layers = [MLACapture(("graph", tokens), f"mla{i}", rand(tokens, heads, lora),
                         rand(tokens, heads, rope), rand(16, block, 1, lora),
                         rand(16, block, 1, rope), table, cu, lens, live,
                         torch.zeros(tokens, heads, lora, device="npu"), heads, lora, rope,
                         block, (lora + rope) ** -0.5) for i in range(2)]
    assert engine.warm_up_mla(layers[0]) and not engine.warm_up_mla(layers[1])
    stream, graph = torch.npu.Stream(), torch.npu.NPUGraph()
    with torch.npu.graph(graph, stream=stream):
        for layer in layers:
            engine.capture_mla(layer)
    assert engine.cold_captures == [], engine.cold_captures
    for _ in range(2):
        engine.before_replay(tokens)
        graph.replay()
    torch.npu.synchronize()
    assert not engine.errors(), engine.errors()
    for c in layers:
        want = reference(c.q_nope.cpu(), c.q_pe.cpu(), c.kv_c_cache.cpu()[:, :, 0],
                         c.k_pe_cache.cpu()[:, :, 0], table_cpu, [1, 1, 1], kv_lens[:3],
                         c.scale)
        got = c.output.cpu()
        assert float((got[:3].double() - want).abs().max()) < 1e-5
        assert not got[3:].any()  # the padding slot's rows are zero
    odd = dataclasses.replace(layers[0], num_heads=heads * 2)
    try:
        with torch.npu.graph(torch.npu.NPUGraph(), stream=stream):
            engine.capture_mla(odd)
    except Exception as exc:  # noqa: BLE001 - the geometry check must refuse it
        assert "MLA geometry" in str(exc), exc
    else:
        raise AssertionError("a second MLA geometry in one graph key was accepted")


def scenarios() -> dict[str, str]:
    """Run every scenario; name -> "ok" or the error."""
    import torch

    from pyruntime import backends
    from pyruntime.backends import npu_kernels
    from pyruntime.hook.npu_engine import vllm_tiling_engine
    from pyruntime.selfcheck import CHECKS, Context

    results: dict[str, str] = {}

    def attempt(name, fn):
        try:
            fn()
            results[name] = "ok"
        except Exception as exc:  # noqa: BLE001 - reported, and the exit status says it
            results[name] = f"{type(exc).__name__}: {exc}"

    be = backends.get("npu")
    ctx = Context("npu", lambda **o: backends.get("npu", **o), quick=True, npu=be.npu)

    def check(fn):
        def run():
            result = fn(ctx)
            assert result.status in ("pass", "skip"), result.detail
        return run

    for name, fn in CHECKS:
        attempt(f"selfcheck {name}", check(fn))
    for placement in ("graph", "pre-replay"):
        attempt(f"engine {placement}", lambda p=placement: _engine_scenario(p))
        attempt(f"mla engine {placement}", lambda p=placement: _mla_engine_scenario(p))

    def abort():
        stream, x = be.stream(), be.alloc([2], torch.float32)
        try:
            with be.capture(be.graph(), stream):
                torch.ops.aten.fill_(x, 1.0)
                raise LookupError
        except LookupError:
            pass
        be.synchronize()
    attempt("capture abort", abort)

    def loader_errors():
        saved = {k: os.environ.pop(k, None) for k in (npu_kernels.EXT_ENV,
                                                       npu_kernels.KERNEL_DIR_ENV)}
        os.environ[npu_kernels.BUILD_DIR_ENV] = tempfile.mkdtemp()
        try:
            npu_kernels.find()
        except npu_kernels.KernelsUnavailableError as exc:
            assert "not built" in str(exc)
        finally:
            os.environ.pop(npu_kernels.BUILD_DIR_ENV)
            os.environ.update({k: v for k, v in saved.items() if v is not None})
        # building without CANN: the script says what is missing
        os.environ.pop("ASCEND_HOME_PATH", None)
        os.environ.pop("ASCEND_TOOLKIT_HOME", None)
        try:
            npu_kernels.build(timeout_s=60)
        except npu_kernels.KernelsUnavailableError as exc:
            assert "building runtime failed" in str(exc) and "CANN" in str(exc), exc
        else:
            raise AssertionError("a build without CANN succeeded")
        # a JSON whose binary is missing, and a load that fails
        empty = Path(tempfile.mkdtemp())
        (empty / npu_kernels.RUNTIME_JSON).write_text("{}")
        os.environ[npu_kernels.KERNEL_DIR_ENV] = str(empty)
        try:
            npu_kernels.find()
        except npu_kernels.KernelsUnavailableError as exc:
            assert "beside" in str(exc), exc
        (empty / npu_kernels.RUNTIME_JSON).with_suffix(".so").write_bytes(b"not an ELF")
        loaded, npu_kernels._loaded = npu_kernels._loaded, None
        try:
            npu_kernels.load()
        except npu_kernels.KernelsUnavailableError as exc:
            assert "failed" in str(exc), exc
        finally:
            npu_kernels._loaded = loaded
            os.environ.update({k: v for k, v in saved.items() if v is not None})
        assert npu_kernels.attention_reason() is None
        assert be.ai_core_count() == 20
        os.environ["AICPU_TILING_PLACEMENT"] = "graph"
        assert vllm_tiling_engine(be).placement == "graph"
    attempt("loader and engine factory", loader_errors)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    import coverage

    os.environ.setdefault("AICPU_TILING_TWIN_AICORE", "reference")
    os.environ.setdefault("AICPU_TILING_CACHE_DIR", tempfile.mkdtemp())
    os.environ.pop("TRITON_INTERPRET", None)
    cov = coverage.Coverage(include=[str(REPO / m) for m in MEASURED], data_file=None)
    cov.start()
    from pyruntime import npu_twin

    npu_twin.activate()
    results = scenarios()
    cov.stop()
    files = {}
    for path in MEASURED:
        _, statements, _, missing, _ = cov.analysis2(str(REPO / path))
        files[path] = {"statements": len(statements), "missing": len(missing),
                       "percent": round(100 * (1 - len(missing) / max(1, len(statements))), 1),
                       "missing_lines": missing}
    total = sum(f["statements"] for f in files.values())
    missed = sum(f["missing"] for f in files.values())
    report = {"scenarios": results, "files": files,
              "total_percent": round(100 * (1 - missed / max(1, total)), 1)}
    if args.json:
        print(json.dumps(report))
    else:
        for name, outcome in results.items():
            print(f"{name:32s} {outcome}")
        for path, f in files.items():
            print(f"{path:40s} {f['percent']:5.1f} %  ({f['statements'] - f['missing']}/"
                  f"{f['statements']} lines; missing {f['missing_lines']})")
        print(f"{'total':40s} {report['total_percent']:5.1f} %")
    return 0 if all(v == "ok" for v in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
