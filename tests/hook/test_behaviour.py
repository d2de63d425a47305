"""Behaviour on CPU: the fixture's multi-layer decode with and without the hook."""

import importlib

import pytest
import torch

from pyruntime import hook

pytest.importorskip("pyruntime.tiling", reason="needs our tiling kernels (pyruntime.tiling)")

from hook_fake_engine import CpuTilingEngine

CFG = dict(  # noqa: C408
    num_heads=8, num_kv_heads=2, head_size=16, block_size=16, num_blocks=64,
           max_batch=8, max_blocks_per_req=8, buckets=[4, 8])
STEPS = [([1, 1, 1], [5, 40, 17]), ([1, 1, 1, 1, 1], [6, 41, 18, 3, 100]), ([1, 1], [7, 42])]


def _run(layers, engine=None):
    runner_mod = importlib.import_module("vllm_ascend.worker.model_runner_v1")
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    npu.counters["task_updates"] = 0
    runner = runner_mod.NPUModelRunner(layers=layers, **CFG)
    g = torch.Generator().manual_seed(1)
    outs = []
    for q_lens, kv_lens in STEPS:
        table = torch.randperm(CFG["num_blocks"], generator=g)[: len(q_lens) * 8]
        outs.append(runner.decode_step(q_lens, kv_lens, table.view(len(q_lens), 8).int())[0])
    return outs, npu.counters["task_updates"]


def _fresh(fixture_pkg):
    import sys

    for n in [n for n in sys.modules if n.startswith("vllm_ascend")]:
        del sys.modules[n]


@pytest.mark.parametrize("layers", [[(None, "auto")] * 4])
def test_device_tiling_matches_host_update_with_zero_updates(fixture_pkg, layers):
    reference, updates = _run(layers)
    assert updates == len(layers) * len(STEPS)
    _fresh(fixture_pkg)
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    engine = CpuTilingEngine(npu.launch, max_batch=CFG["max_batch"],
                             max_blocks_per_req=CFG["max_blocks_per_req"])
    assert hook.install(engine_factory=lambda: (engine, None)).state == "waiting"
    patched, updates = _run(layers, engine)
    assert updates == 0
    assert engine.tiling_runs == len(STEPS)  # one tiling per step, not per layer
    assert hook.status().updates_skipped == len(STEPS)
    for a, b in zip(reference, patched):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_unsupported_layers_stay_on_the_host_path(fixture_pkg):
    layers = [(None, "auto"), (64, "auto"), (None, "int8"), (None, "auto")]
    reference, _ = _run(layers)
    _fresh(fixture_pkg)
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    engine = CpuTilingEngine(npu.launch, max_batch=CFG["max_batch"],
                             max_blocks_per_req=CFG["max_blocks_per_req"])
    hook.install(engine_factory=lambda: (engine, None))
    patched, updates = _run(layers, engine)
    assert updates == 2 * len(STEPS)  # only the two unsupported layers are updated
    reasons = {reason for _, reason in hook.status().host_path_layers}
    assert any("sliding window" in r for r in reasons)
    assert any("KV-cache quantization" in r for r in reasons)
    for a, b in zip(reference, patched):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_per_step_metadata_tensors_would_give_wrong_answers(fixture_pkg, monkeypatch):
    """The old handling, restored: capture ``AscendMetadata.query_start_loc`` / ``.seq_lens`` /
    ``.block_tables`` (a fresh copy, a host tensor and a per-step table in the real builder)
    instead of the persistent buffers. The first replay reads the capture's dead copy (the
    fixture's builder reuses it, as the caching allocator does) and the tiling refuses it;
    with the persistent buffers the outputs match the host path's (above)."""
    from pyruntime.hook import vllm_ascend_patches as patches

    reference, _ = _run([(None, "auto")] * 2)
    _fresh(fixture_pkg)

    def old_build(original, state):
        def build(*args, **kwargs):
            meta = original(*args, **kwargs)
            n = int(meta.seq_lens.numel())
            batch = torch.full((1,), n, dtype=torch.int32)
            setattr(meta, patches.LENGTHS_ATTR, patches.DeviceLengths(
                meta.query_start_loc, meta.seq_lens, meta.block_tables, batch))
            return meta
        return build

    monkeypatch.setattr(patches, "make_build", old_build)
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    engine = CpuTilingEngine(npu.launch, max_batch=CFG["max_batch"],
                             max_blocks_per_req=CFG["max_blocks_per_req"])
    hook.install(engine_factory=lambda: (engine, None))
    from pyruntime.tiling import lib

    # the first replay reads the capture's query_start_loc copy, since reused: cu[0] != 0
    with pytest.raises(AssertionError, match=f"tiling status {lib.AICPU_TILING_E_QUERY_START}$"):
        _run([(None, "auto")] * 2, engine)
    assert reference and engine.tiling_runs == 1


def test_eager_calls_do_not_plan(fixture_pkg):
    """Only replays of graphs with device-tiled layers run the engine's before_replay."""
    npu = importlib.import_module("vllm_ascend._fixture_npu")

    class Counting(CpuTilingEngine):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.before = []

        def before_replay(self, num_tokens):
            self.before.append(num_tokens)

    engine = Counting(npu.launch, max_batch=CFG["max_batch"],
                      max_blocks_per_req=CFG["max_blocks_per_req"])
    hook.install(engine_factory=lambda: (engine, None))
    runner_mod = importlib.import_module("vllm_ascend.worker.model_runner_v1")
    runner = runner_mod.NPUModelRunner(layers=[(None, "auto")], **CFG)
    assert engine.before == []  # capturing replays nothing
    ctx = importlib.import_module("vllm_ascend.ascend_forward_context")._FORWARD_CONTEXT
    ctx.cudagraph_runtime_mode = "NONE"
    with pytest.raises(NotImplementedError):  # the fixture has no eager path
        runner.wrapper(ctx.attn_metadata, 4)
    assert engine.before == []
    table = torch.arange(16, dtype=torch.int32).view(2, 8)
    runner.decode_step([1, 1], [5, 9], table)
    assert engine.before == [4]
