"""The NPU backend's vLLM engine, driven through the fixture package on CPU.

`NpuTilingEngine` is what the hook captures into on an Ascend machine. Here its ops are our
custom ops' CPU implementations and its captured launches go through the fixture's graph
recorder, so the engine's own logic (per-key buffers, the tiling task captured once under
``graph`` or launched before every replay under ``pre-replay``, the step epoch advanced
on the device, the patched ``ACLGraphWrapper.__call__``) runs for real; only the
device is not. The reasons the NPU backend gives the hook when it cannot offer an engine
are checked against a stand-in torch.npu.
"""

import importlib
import types

import pytest
import torch

from pyruntime import hook, placement
from pyruntime.backends import BackendError, npu_kernels
from pyruntime.hook.npu_engine import NpuTilingEngine, vllm_tiling_engine

pytest.importorskip("pyruntime.tiling", reason="needs our tiling kernels (pyruntime.tiling)")

from test_behaviour import CFG, STEPS, _fresh, _run

from pyruntime.kernels.step import tiling_status
from pyruntime.tiling import StaleTilingError


@pytest.mark.parametrize("where", ["graph", "pre-replay"])
def test_engine_matches_host_update_with_one_tiling_per_step(fixture_pkg, where):
    layers = [(None, "auto")] * 3
    reference, _ = _run(layers)
    _fresh(fixture_pkg)
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    engine = NpuTilingEngine(where, num_cores=4, launch=npu.launch)
    hook.install(engine_factory=lambda: (engine, None))
    patched, updates = _run(layers)
    assert updates == 0 and len(engine.keys) == 2  # buckets 4 and 8
    # one epoch and one tiling per step: the captured task at every replay (graph), or the
    # task launched before the replay for the replayed bucket only (pre-replay)
    assert engine.epoch == len(STEPS) and engine.tiling_launches == len(STEPS)
    for a, b in zip(reference, patched):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("where", ["graph", "pre-replay"])
def test_before_replay_copies_nothing_from_the_host_whatever_the_key_count(fixture_pkg,
                                                                         monkeypatch, where):
    """Issue 30: before_replay writes no host value into any key's buffers (it made one
    blocking epoch copy per captured key per step before): under graph it enqueues nothing,
    under pre-replay only the tiling of the replayed keys (the epoch's advance is captured)."""
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    engine = NpuTilingEngine(where, num_cores=4, launch=npu.launch)
    hook.install(engine_factory=lambda: (engine, None))
    _run([(None, "auto")] * 2)
    assert len(engine.keys) == 2
    copies, real_copy = [], torch.Tensor.copy_

    def counted_copy(self, src, *args, **kwargs):
        copies.append(self.data_ptr())
        return real_copy(self, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", counted_copy)
    advances, launches = engine.epoch_advances, engine.tiling_launches
    for _ in range(3):
        engine.before_replay(None)
    assert copies == []
    planned = where == "pre-replay"
    # the replays advance the epoch (ops captured once per graph), never before_replay
    assert engine.epoch_advances == advances
    assert engine.tiling_launches - launches == (3 * len(engine.keys) if planned else 0)
    if planned:
        # every key's tiling echoes the plan epoch, which only the next replay publishes as
        # the step epoch: until then every key reads as stale (a replay that before_replay
        # did not precede is refused)
        plan = int(engine._plan_epoch.cpu()[0])
        assert {tiling_status(k.params, k.tiling).epoch for k in engine.keys.values()} == {plan}
        assert engine.device_epoch() != plan
        assert all(isinstance(e, StaleTilingError) for e in engine.errors().values())
        assert len(engine.errors()) == len(engine.keys)


@pytest.mark.parametrize("where", ["graph", "pre-replay"])
def test_engine_never_drops_a_layers_soft_cap(fixture_pkg, where):
    """Layers with a logits soft cap take the device path on the real NPU engine (it
    declares applies_logits_soft_cap and hands the cap to its attention kernel) and match
    the capped float64 reference; vLLM-Ascend's own path gives the uncapped answer."""
    from test_behaviour import SOFT_CAP_LAYERS, _run_with_reference

    npu = importlib.import_module("vllm_ascend._fixture_npu")
    engine = NpuTilingEngine(where, num_cores=4, launch=npu.launch)
    assert engine.applies_logits_soft_cap is True
    hook.install(engine_factory=lambda: (engine, None))
    got, capped, uncapped, updates = _run_with_reference(SOFT_CAP_LAYERS)
    assert updates == 0 and dict(hook.status().host_path_layers) == {}
    for i, (out, want, plain) in enumerate(zip(got, capped, uncapped)):
        assert (out.double() - torch.from_numpy(want)).abs().max() < 1e-5
        if i % len(SOFT_CAP_LAYERS) == 2:  # cap 1.0: far from the uncapped answer
            assert (out.double() - torch.from_numpy(plain)).abs().max() > 0.1


def test_a_tiling_not_rerun_is_refused_not_reused(fixture_pkg):
    """Graph placement on a device that does not re-run the captured task: the epoch
    advanced by each replay no longer matches, so outputs are zero and errors() says so."""
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    engine = NpuTilingEngine("graph", num_cores=4, launch=npu.launch)
    real_plan = engine._plan
    calls = []

    def plan_once(key):  # the captured task runs at the first replay only
        if not calls:
            real_plan(key)
        calls.append(key)

    engine._plan = plan_once
    hook.install(engine_factory=lambda: (engine, None))
    runner = importlib.import_module("vllm_ascend.worker.model_runner_v1").NPUModelRunner(
        layers=[(None, "auto")] * 2, **CFG)
    outs = []
    for q_lens, kv_lens in STEPS[:1] * 3:  # one bucket, three steps
        table = torch.arange(len(q_lens) * 8, dtype=torch.int32).view(len(q_lens), 8)
        outs.append(runner.decode_step(q_lens, kv_lens, table)[0])
    assert outs[0][0].abs().sum() > 0
    assert all(not o.any() for o in outs[1][:1] + outs[2][:1])
    errors = engine.errors()
    assert errors and all("stale tiling" in str(e) for e in errors.values())


def test_engine_rejects_an_unknown_placement():
    with pytest.raises(ValueError, match="unknown tiling placement 'eager'"):
        NpuTilingEngine("eager", num_cores=4, ops=object())


class _FakeNpu:
    """Just what vllm_tiling_engine asks torch.npu (names from TORCH_NPU_API)."""

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def get_device_properties(device):
        return type("Props", (), {"cube_core_num": 20})()


def _npu_backend():
    from pyruntime.backends.npu import TORCH_NPU_API, NpuBackend

    assert {"torch.npu.current_device", "torch.npu.get_device_properties"} <= set(TORCH_NPU_API)
    return NpuBackend(npu=_FakeNpu())


@pytest.fixture
def no_placement(monkeypatch, tmp_path):
    monkeypatch.setenv(placement.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(placement.PLACEMENT_ENV, raising=False)
    monkeypatch.delenv(npu_kernels.EXT_ENV, raising=False)
    monkeypatch.setenv(npu_kernels.BUILD_DIR_ENV, str(tmp_path / "build"))
    return tmp_path


def test_no_placement_is_a_reason_naming_the_selfcheck(no_placement):
    with pytest.raises(BackendError, match="aicpu-tiling selfcheck --backend npu"):
        vllm_tiling_engine(_npu_backend())


def test_kernels_not_built_is_a_reason_naming_the_build(no_placement, monkeypatch):
    monkeypatch.setenv(placement.PLACEMENT_ENV, "pre-replay")
    with pytest.raises(npu_kernels.KernelsUnavailableError,
                       match="build_aicpu_kernel.sh runtime"):
        vllm_tiling_engine(_npu_backend())


def test_saved_placement_reaches_the_engine(no_placement, monkeypatch):
    placement.save("pre-replay", backend="npu", device="Ascend910B3", evidence="test")
    monkeypatch.setattr(npu_kernels, "load", lambda ops=None: None)
    monkeypatch.setattr(npu_kernels, "attention_reason", lambda: None)
    engine = vllm_tiling_engine(_npu_backend())
    assert engine.placement == "pre-replay" and engine.name == "npu-pre-replay"
    assert engine.num_cores == 20  # the device's AI Core count
    monkeypatch.setenv(placement.PLACEMENT_ENV, "graph")  # the variable wins
    assert vllm_tiling_engine(_npu_backend()).placement == "graph"
    monkeypatch.setenv(placement.PLACEMENT_ENV, "sideways")
    with pytest.raises(BackendError, match="unknown tiling placement 'sideways'"):
        vllm_tiling_engine(_npu_backend())


def test_load_registers_schemas_then_loads_library_and_names_the_binary_touching_no_device(
        no_placement, monkeypatch):
    """The order only (the NPU twin runs the real load: tests/twin/test_preflight.py and
    tests/twin/test_devices.py). The hook loads this while vLLM-Ascend's worker imports its
    modules, before the worker sets its device: nothing here may set or touch a device
    (review 2 item 1); the binary is loaded per device by the extension, or on the device
    asked for."""
    import torch

    ext = no_placement / "libaicpu_tiling_npu.so"
    js = no_placement / npu_kernels.RUNTIME_JSON
    ext.write_bytes(b""), js.write_text("{}"), js.with_suffix(".so").write_bytes(b"")
    monkeypatch.setenv(npu_kernels.EXT_ENV, str(ext))
    monkeypatch.setenv(npu_kernels.KERNEL_DIR_ENV, str(no_placement))
    monkeypatch.setattr(npu_kernels, "_loaded", None)
    calls = []
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(
        current_device=lambda: calls.append("current_device") or 0,
        set_device=lambda i: calls.append(("set_device", i))), raising=False)

    class Ops:
        def load_library(self, path):
            calls.append(("load_library", path))

        class aicpu_tiling:
            @staticmethod
            def npu_load_tiling_kernel(path, *device):
                calls.append(("npu_load_tiling_kernel", path, *device))

    files = npu_kernels.load(Ops())
    assert calls == [("load_library", str(ext)), ("npu_load_tiling_kernel", str(js))]
    assert files.extension == ext
    assert npu_kernels.load(Ops(), device=1) == files  # the self-check's eager load
    assert calls[2:] == [("npu_load_tiling_kernel", str(js), 1)]
    monkeypatch.setattr(npu_kernels, "_loaded", None)
