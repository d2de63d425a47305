"""What vLLM 0.30's engine reached on plain npu tensors that the wrapper layer had (both
failed on plain tensors before their fix; one twin subprocess).

* ``aten::unique_consecutive`` (vLLM's LoRA metadata, ``compute_meta``): synchronous, its
  outputs npu tensors of the shapes it produced, as on the wrapper layer
  (``device._SHAPE_FROM_VALUES_OPS``); before, the plain fallback queued it and asked its meta
  kernel for a shape that only the values decide ("no fake impl or Meta kernel").
* Pinned host memory made by torch's C++ on plain npu tensors (`plain_device.cpp`'s pinned
allocator, the PrivateUse1 hooks' ``getPinnedMemoryAllocator`` / ``isPinnedPtr``): a
``non_blocking`` ``.to("cpu")`` of an npu tensor, which vLLM 0.30's model runner does with the
sampled token ids under async scheduling (``AsyncGPUModelRunnerOutput``), and ``torch.zeros(...,
pin_memory=True)``. Before the allocator, torch raised "You should register
``PrivateUse1HooksInterface`` ... and implement ``getPinnedMemoryAllocator``" and the engine
stopped at its first sample.
* A Python number among a tensor op's arguments (``positions % block_size`` in vLLM's
  draft-model slot mapping, ``compute_new_slot_mapping``): ``remainder.Scalar`` reaches the
  boxed fallback as ``remainder.Tensor_out`` with the wrapped number unwrapped to a Python int;
  before, it stopped with "Expected a value of type 'Tensor' for argument 'other'"."""

from __future__ import annotations

import pytest

SCRIPT = """
def non_blocking_to_cpu():
    x = torch.arange(6, dtype=torch.int32).to("npu")
    with torch.inference_mode():               # vLLM's execute_model
        host = (x * 2).to("cpu", non_blocking=True)
    torch.npu.synchronize()
    eq((host.device.type, host.tolist()), ("cpu", [0, 2, 4, 6, 8, 10]))
    eq(host.is_pinned(), True)                 # torch made it with pin_memory=True


def pinned_factory_and_pageable():
    eq(torch.zeros(4, pin_memory=True).is_pinned(), True)
    eq(torch.zeros(4).is_pinned(), False)
    eq(torch.zeros(4).pin_memory().is_pinned(), True)


def pinned_block_feeds_a_non_blocking_h2d_copy():
    # the twin's copy rules see the block as pinned: a rewrite after the copy ran is fine
    host = torch.arange(4, dtype=torch.float32).to("npu").to("cpu", non_blocking=True)
    torch.npu.synchronize()
    back = host.to("npu", non_blocking=True)
    torch.npu.synchronize()
    host.fill_(-1)
    eq(back.cpu().tolist(), [0.0, 1.0, 2.0, 3.0])


def unique_consecutive_is_synchronous():
    from pyruntime.npu_twin import device as twin

    ids = torch.tensor([0, 0, 1, 1, 1, -1], dtype=torch.int32).to("npu")
    torch.npu.synchronize()
    syncs = twin.device().stats["synchronizes"]
    with torch.inference_mode():                                       # vLLM's execute_model
        values, counts = torch.unique_consecutive(ids * 1, return_counts=True)
    eq((type(values) is torch.Tensor, values.device.type, counts.device.type),
       (True, "npu", "npu"))
    eq(twin.device().stats["synchronizes"], syncs + 1)                 # the host waited
    eq((values.cpu().tolist(), counts.cpu().tolist()), ([0, 1, -1], [2, 3, 1]))
    with capture():
        expect(twin.CaptureViolation, "while a graph is capturing",
               lambda: torch.unique_consecutive(ids))


def python_numbers_in_tensor_arguments():
    x = torch.arange(6).to("npu")
    eq((x % 4).cpu().tolist(), [0, 1, 2, 3, 0, 1])                 # remainder.Scalar
    eq(torch.remainder(x, 3).cpu().tolist(), [0, 1, 2, 0, 1, 2])
    half = x.to(torch.bfloat16)
    got = half % 2.5                                               # a float: the tensor's dtype
    eq((got.dtype, got.cpu().tolist()), (torch.bfloat16, [0.0, 1.0, 2.0, 0.5, 1.5, 0.0]))
    eq((x.to(torch.int32) % 4).dtype, torch.int32)


check("unique_consecutive_is_synchronous", unique_consecutive_is_synchronous)
check("python_numbers_in_tensor_arguments", python_numbers_in_tensor_arguments)
check("non_blocking_to_cpu", non_blocking_to_cpu)
check("pinned_factory_and_pageable", pinned_factory_and_pageable)
check("pinned_block_feeds_a_non_blocking_h2d_copy", pinned_block_feeds_a_non_blocking_h2d_copy)
"""

RULES = ("unique_consecutive_is_synchronous", "non_blocking_to_cpu", "pinned_factory_and_pageable",
         "pinned_block_feeds_a_non_blocking_h2d_copy", "python_numbers_in_tensor_arguments")


@pytest.fixture(scope="module")
def outcomes(run_twin):
    proc = run_twin(SCRIPT, env={"AICPU_TILING_TWIN_TENSORS": "plain"}, timeout=300)
    return run_twin.rules(proc)


@pytest.mark.parametrize("rule", RULES)
def test_engine_gaps_on_plain_tensors(outcomes, rule):
    assert outcomes.get(rule) == "ok", outcomes
