"""One hook key per captured graph, and the update call of the real model runner.

Driven through the fixture package on CPU with the NPU engine (our custom ops' CPU bodies,
the fixture's graph recorder), as `test_npu_engine`:

* vLLM-Ascend 0.29+'s model runner calls ``update_full_graph_params`` after every FULL forward
  that is not a capture (vllm-ascend 0.30.0rc2 ``worker/model_runner_v1.py``,
  ``_update_full_graph_params_if_needed``: ``if forward_context.cudagraph_runtime_mode ==
  CUDAGraphMode.FULL and not forward_context.capturing ...: update_full_graph_params(
  self.attn_backend, self.update_stream, forward_context, num_tokens_padded,
  self.vllm_config, self.speculative_config)``, called from ``_model_forward`` after
  ``run_model()``) while the global graph params are None (it sets them only ``if
  self.use_aclgraph``, i.e. under ``VLLM_COMPILE``: ``_use_aclgraph``). The fixture runner's
  ``release="0.30"`` makes that call the same way.
* With LoRA, vLLM captures a FULL graph per token count and LoRA case
  (``cudagraph_specialize_lora`` True by default, vLLM 0.30.0 ``config/compilation.py``;
  ``CudagraphDispatcher._get_lora_cases``: ``[0] + captured_counts``), each under its own
  ``BatchDescriptor`` (``has_lora``, ``num_active_loras``), which vLLM-Ascend's
  ``ACLGraphWrapper`` keys its graphs by.
"""

import dataclasses
import importlib
import logging

import pytest
import torch

from pyruntime import hook
from pyruntime.hook.npu_engine import NpuTilingEngine

pytest.importorskip("pyruntime.tiling", reason="needs our tiling kernels (pyruntime.tiling)")

from test_behaviour import CFG, STEPS, _fresh

#: decode steps all in bucket 4, alternating the LoRA case (0: without, 1: one adapter),
#: each with other lengths and batch sizes than the step before
LORA_STEPS = [([1, 1, 1], [5, 40, 17], 0), ([1, 1], [70, 9], 1), ([1, 1, 1, 1], [3, 33, 8, 61], 0),
              ([1], [100], 1), ([1, 1, 1], [12, 2, 90], 1), ([1, 1], [44, 6], 0)]


def _decode(runner, steps):
    g = torch.Generator().manual_seed(1)
    outs = []
    for q_lens, kv_lens, *lora in steps:
        table = torch.randperm(CFG["num_blocks"], generator=g)[: len(q_lens) * 8]
        outs.append(runner.decode_step(q_lens, kv_lens, table.view(len(q_lens), 8).int(),
                                       *lora)[0])
    return outs


def _runner(layers, **options):
    runner_mod = importlib.import_module("vllm_ascend.worker.model_runner_v1")
    return runner_mod.NPUModelRunner(layers=layers, **CFG, **options)


def _reference(fixture_pkg, layers, steps):
    """vLLM-Ascend's own path (the fixture's host updates), one graph per bucket."""
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    npu.counters["task_updates"] = 0
    outs = _decode(_runner(layers), [s[:2] for s in steps])
    assert npu.counters["task_updates"] == len(layers) * len(steps)
    _fresh(fixture_pkg)
    return outs


def _install(where):
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    engine = NpuTilingEngine(where, num_cores=4, launch=npu.launch)
    hook.install(engine_factory=lambda: (engine, None))
    return engine, npu


@pytest.mark.parametrize("where", ["graph", "pre-replay"])
def test_the_030_runners_update_call_without_graph_params_runs_the_original(fixture_pkg, where):
    """Fix B: no global graph params, update_full_graph_params after every replay (as
    0.30.0rc2's runner calls it): the hook's wrapper runs the original (which returns at once
    for the FIA backend) instead of reading ``None.attn_params``; every layer stays on the
    device path and the outputs match vLLM-Ascend's own path."""
    layers = [(None, "auto")] * 3
    reference = _reference(fixture_pkg, layers, STEPS)
    engine, npu = _install(where)
    npu.counters["task_updates"] = 0
    acl_graph = importlib.import_module("vllm_ascend.compilation.acl_graph")
    runner = _runner(layers, release="0.30")
    assert acl_graph.get_graph_params() is None
    got = _decode(runner, STEPS)
    assert npu.counters["task_updates"] == 0 and hook.status().host_path_layers == []
    assert hook.status().updates_skipped == 0  # the original ran (and returned at once)
    for a, b in zip(reference, got):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("where", ["graph", "pre-replay"])
def test_two_lora_graphs_of_one_size_each_get_their_own_tiling(fixture_pkg, where):
    """Review 2 item 2: two graphs per bucket (without and with LoRA) get a key each, so each
    captures its own tiling task (graph) and has its replay wrapped (a new epoch, and under
    pre-replay its tiling, before it runs); every step, whichever graph replays, matches
    vLLM-Ascend's own path. With one key per token count the LoRA graph would replay the
    tiling the other graph left, for another step's lengths, and the epoch would accept it."""
    layers = [(None, "auto")] * 2
    reference = _reference(fixture_pkg, layers, LORA_STEPS)
    engine, npu = _install(where)
    runner = _runner(layers, lora_cases=(0, 1))
    keys = list(engine.keys)
    assert len(keys) == 4  # buckets 4 and 8, each without and with LoRA
    descriptors = {(key[1], key[2]) for key in keys}
    assert descriptors == {(n, runner.descriptor(n, loras)) for n in (4, 8) for loras in (0, 1)}
    graphs = [entry.aclgraph for entry in runner.wrapper.concrete_aclgraph_entries.values()]
    # each graph's replay wrapped (functools.wraps keeps the original as __wrapped__)
    assert len(graphs) == 4 and all(hasattr(g.replay, "__wrapped__") for g in graphs)
    got = _decode(runner, LORA_STEPS)
    # graph: each replay runs the task its own graph captured; pre-replay: before a graph of
    # bucket 4 replays, the engine plans the keys of bucket 4 (both LoRA cases')
    assert engine.tiling_launches == len(LORA_STEPS) * (1 if where == "graph" else 2)
    for step, (a, b) in enumerate(zip(reference, got)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step}")


@dataclasses.dataclass(frozen=True)
class _DescriptorWithoutLora:
    """A batch descriptor of a release that cannot tell the LoRA cases apart."""

    num_tokens: int


def test_lora_without_a_descriptor_that_tells_graphs_apart_keeps_the_host_path(
        fixture_pkg, monkeypatch, caplog):
    """Where the forward context's descriptor has no LoRA fields and vLLM's config has LoRA,
    the layers keep vLLM-Ascend's path, logged with the reason."""
    from pyruntime.hook import vllm_ascend_patches as patches

    layers = [(None, "auto")] * 2
    reference = _reference(fixture_pkg, layers, STEPS)
    _install("graph")
    runner_mod = importlib.import_module("vllm_ascend.worker.model_runner_v1")
    monkeypatch.setattr(runner_mod.NPUModelRunner, "descriptor",
                        staticmethod(lambda n, loras=0: _DescriptorWithoutLora(n)))
    monkeypatch.setattr(patches, "vllm_lora_configured", lambda: True)
    npu = importlib.import_module("vllm_ascend._fixture_npu")
    npu.counters["task_updates"] = 0
    with caplog.at_level(logging.INFO, logger="pyruntime.hook"):
        got = _decode(_runner(layers), STEPS)
    reasons = dict(hook.status().host_path_layers)
    assert set(reasons) == {"model.0.self_attn.attn", "model.1.self_attn.attn"}
    assert all(r.startswith("LoRA:") for r in reasons.values())
    assert any("keeps the host-update path: LoRA" in r.getMessage() for r in caplog.records)
    assert npu.counters["task_updates"] == len(layers) * len(STEPS)
    for a, b in zip(reference, got):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_without_lora_a_descriptor_without_lora_fields_keeps_the_device_path(fixture_pkg,
                                                                             monkeypatch):
    from pyruntime.hook import vllm_ascend_patches as patches

    engine, npu = _install("graph")
    runner_mod = importlib.import_module("vllm_ascend.worker.model_runner_v1")
    monkeypatch.setattr(runner_mod.NPUModelRunner, "descriptor",
                        staticmethod(lambda n, loras=0: _DescriptorWithoutLora(n)))
    monkeypatch.setattr(patches, "vllm_lora_configured", lambda: False)
    _runner([(None, "auto")] * 2)
    assert hook.status().host_path_layers == [] and len(engine.keys) == 2
