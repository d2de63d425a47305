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


# ---------------------------------------------------------------------- logits soft cap
#: layers: plain, Gemma 2's cap, a small cap that bends every score (N(0, 1) here)
SOFT_CAP_LAYERS = [(None, "auto"), (None, "auto", 50.0), (None, "auto", 1.0), (None, "auto", 0)]


def _run_with_reference(layers):
    """The decode loop with each step's float64 references: (outputs, with cap, without cap,
    task updates) per step and layer (the cap of each layer as vLLM handed it)."""
    from pyruntime.workload.reference import reference_attention

    runner_mod = importlib.import_module("vllm_ascend.worker.model_runner_v1")
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    npu.counters["task_updates"] = 0
    runner = runner_mod.NPUModelRunner(layers=layers, **CFG)
    g = torch.Generator().manual_seed(1)
    got, capped, uncapped = [], [], []
    for q_lens, kv_lens in STEPS:
        table = torch.randperm(CFG["num_blocks"], generator=g)[: len(q_lens) * 8]
        table = table.view(len(q_lens), 8).int()
        outs, _ = runner.decode_step(q_lens, kv_lens, table)
        cu = torch.tensor([0, *q_lens]).cumsum(0).int().numpy()
        n = int(cu[-1])
        for i, layer in enumerate(layers):
            k, v = runner.kv[i]
            cap = layer[2] if len(layer) > 2 and layer[2] else None
            args = (runner.queries[i][:n], k, v, table.numpy(), cu, torch.tensor(kv_lens).numpy())
            got.append(outs[i].view(n, CFG["num_heads"], CFG["head_size"]))
            capped.append(reference_attention(*args, scale=CFG["head_size"] ** -0.5,
                                              logits_soft_cap=cap))
            uncapped.append(reference_attention(*args, scale=CFG["head_size"] ** -0.5))
    return got, capped, uncapped, npu.counters["task_updates"]


def test_soft_capped_layers_take_the_device_path_and_get_the_cap(fixture_pkg, caplog):
    """vLLM-Ascend's own path drops logits_soft_cap (its outputs are the uncapped ones); with
    the hook and an engine that applies it, every layer is device-tiled and the capped layers
    match the capped float64 reference; one log line per capped layer says so."""
    host, _, host_uncapped, updates = _run_with_reference(SOFT_CAP_LAYERS)
    assert updates == len(SOFT_CAP_LAYERS) * len(STEPS)
    for out, want in zip(host, host_uncapped):  # vLLM-Ascend ignores the cap
        assert (out.double() - torch.from_numpy(want)).abs().max() < 1e-5
    _fresh(fixture_pkg)
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    engine = CpuTilingEngine(npu.launch, max_batch=CFG["max_batch"],
                             max_blocks_per_req=CFG["max_blocks_per_req"])
    hook.install(engine_factory=lambda: (engine, None))
    with caplog.at_level("INFO", logger="pyruntime.hook"):
        got, capped, uncapped, updates = _run_with_reference(SOFT_CAP_LAYERS)
    assert updates == 0  # every layer on the device path, none updated per step
    assert hook.status().host_path_layers == []
    names = [f"model.{i}.self_attn.attn" for i in (1, 2)]  # caps 50 and 1; 0 is no cap
    assert hook.status().soft_capped_layers == names
    lines = [r.getMessage() for r in caplog.records if "logits_soft_cap" in r.getMessage()]
    assert len(lines) == 2 and all(any(n in line for line in lines) for n in names)
    assert "vLLM-Ascend's own path ignores" in lines[0]
    for i, (out, want, plain) in enumerate(zip(got, capped, uncapped)):
        err = float((out.double() - torch.from_numpy(want)).abs().max() / abs(want).max())
        assert err < 1e-5, (i, err)
    # the small cap changes layer 2's answer far beyond the tolerance (the test would fail
    # if the engine ignored it); Gemma 2's 50 barely touches N(0, 1) scores
    layer2 = [(o, p) for i, (o, p) in enumerate(zip(got, uncapped)) if i % 4 == 2]
    assert all(float((o.double() - torch.from_numpy(p)).abs().max()) > 0.1 for o, p in layer2)


def test_soft_capped_layers_keep_the_host_path_when_the_engine_cannot_apply_it(fixture_pkg):
    """An engine that does not set applies_logits_soft_cap: a capped layer keeps
    vLLM-Ascend's path (which ignores the cap, as before the hook), with its reason."""
    npu = importlib.import_module("vllm_ascend._fixture_npu")

    class NoSoftCap(CpuTilingEngine):
        applies_logits_soft_cap = False

    engine = NoSoftCap(npu.launch, max_batch=CFG["max_batch"],
                       max_blocks_per_req=CFG["max_blocks_per_req"])
    hook.install(engine_factory=lambda: (engine, None))
    got, _, uncapped, updates = _run_with_reference(SOFT_CAP_LAYERS)
    assert updates == 2 * len(STEPS)  # the two capped layers
    reasons = dict(hook.status().host_path_layers)
    assert set(reasons) == {"model.1.self_attn.attn", "model.2.self_attn.attn"}
    assert all("logits soft cap" in r and "does not apply it" in r for r in reasons.values())
    assert hook.status().soft_capped_layers == []
    for out, want in zip(got, uncapped):
        assert (out.double() - torch.from_numpy(want)).abs().max() < 1e-5


def test_init_records_the_soft_cap_and_uninstall_restores_init(fixture_pkg):
    from pyruntime.hook import vllm_ascend_patches as patches

    attn = importlib.import_module("vllm_ascend.attention.attention_v1")
    original = attn.AscendAttentionBackendImpl.__dict__["__init__"]
    hook.install(engine_factory=lambda: (CpuTilingEngine(None, max_batch=1,
                                                         max_blocks_per_req=1), None))
    impl = attn.AscendAttentionBackendImpl(8, 16, 0.25, 2, None, None, "auto", 30.0, "decoder",
                                           None)
    assert patches.layer_soft_cap(impl) == 30.0
    kw = attn.AscendAttentionBackendImpl(num_heads=8, head_size=16, scale=0.25, num_kv_heads=2,
                                         alibi_slopes=None, sliding_window=None,
                                         kv_cache_dtype="auto", logits_soft_cap=None,
                                         attn_type="decoder", kv_sharing_target_layer_name=None)
    assert patches.layer_soft_cap(kw) is None
    hook.uninstall()
    assert attn.AscendAttentionBackendImpl.__dict__["__init__"] is original
