"""The twin's torch / torch_npu behaviour that vLLM-Ascend's engine reaches (issue 28 items 8
and 4): five twin bugs the engine probe found (each rule failed on the twin before its fix),
and ``torch.npu`` as vLLM-Ascend 0.23.0.post1 and 0.30.0rc2 use it (memory accounting, the
``memory`` and ``config`` modules, pinned factories, ``torch.accelerator``).

Each group runs as one twin subprocess (`conftest.TwinRunner`) that checks every rule under
its name; each test reads its rule's outcome. A rule's line in `RULES` names the real rule.
"""

from __future__ import annotations

import pytest

COMMON = """
import gc
from pyruntime.npu_twin import device as twin
from pyruntime.npu_twin.npu_module import NotInTwinError
"""

BUGS = COMMON + """
def seed_after_activate():
    torch.manual_seed(7)          # recursed: torch.npu.manual_seed_all -> torch.manual_seed
    first = torch.randn(4, device="npu").cpu()
    torch.manual_seed(7)
    eq(torch.randn(4, device="npu").cpu().tolist(), first.tolist())


def device_generator_is_the_devices():
    # torch_npu seeds the device's own generator: host draws do not move it
    torch.npu.manual_seed(11)
    first = torch.rand(3, device="npu").cpu()
    torch.npu.manual_seed(11)
    torch.rand(100)               # a host draw in between
    eq(torch.rand(3, device="npu").cpu().tolist(), first.tolist())
    eq(torch.npu.initial_seed(), 11)


x = torch.arange(4.0).to("npu")
torch.npu.synchronize()


def cpu_in_inference_mode():
    with torch.inference_mode():
        host = x.cpu()
        eq((type(host) is torch.Tensor, host.device.type), (True, "cpu"))
        eq(host.tolist(), [0.0, 1.0, 2.0, 3.0])


def to_cpu_and_dtype_in_inference_mode():
    with torch.inference_mode():
        eq(x.to("cpu").device.type, "cpu")
        half = x.to(torch.float16)
        eq((half.device.type, half.dtype), ("npu", torch.float16))
        eq(half.cpu().tolist(), [0.0, 1.0, 2.0, 3.0])
        eq(x.to("npu") is x, True)        # no-op conversion returns the tensor itself


def empty_non_blocking_h2d():
    source = torch.empty(0, dtype=torch.int32)          # pageable, freed before the sync
    target = source.to("npu", non_blocking=True)
    del source
    gc.collect()
    torch.npu.synchronize()
    eq((tuple(target.shape), target.device.type), ((0,), "npu"))
    empty = torch.empty(0, device="npu")
    empty.copy_(torch.empty(0), non_blocking=True)      # copy_ into an empty tensor
    torch.npu.synchronize()


def to_meta():
    ops_before = twin.device().stats["op"]
    meta = x.to("meta")
    eq((meta.device.type, tuple(meta.shape), meta.dtype), ("meta", (4,), torch.float32))
    eq(twin.device().stats["op"], ops_before)           # no device work queued
    like = torch.empty_like(x, device="meta")
    eq(like.device.type, "meta")
    torch.npu.synchronize()


def inference_mode_allocations():
    with torch.inference_mode():
        fresh = torch.empty(3, device="npu")
        fresh.fill_(2.0)
        summed = fresh + torch.ones(3, device="npu")
        eq(fresh.is_inference(), True)                  # the tensor the caller sees
    torch.npu.synchronize()                             # the device thread writes them
    eq(summed.cpu().tolist(), [3.0, 3.0, 3.0])


def inference_mode_views():
    with torch.inference_mode():
        square = x.view(2, 2)                           # a view of a normal tensor
        row = square[1]
        eq(square.is_inference(), False)
        eq(row.cpu().tolist(), [2.0, 3.0])
        made = torch.full((6,), 3, device="npu").view(2, 3)  # of an inference tensor
        eq(made.is_inference(), True)
        eq(made[1].cpu().tolist(), [3.0, 3.0, 3.0])


check("manual_seed_after_activate_does_not_recurse", seed_after_activate)
check("npu_manual_seed_seeds_the_device_generator", device_generator_is_the_devices)
check("cpu_under_inference_mode_is_a_host_tensor", cpu_in_inference_mode)
check("to_under_inference_mode_converts", to_cpu_and_dtype_in_inference_mode)
check("empty_non_blocking_h2d_copy_is_no_race", empty_non_blocking_h2d)
check("memory_allocated_under_inference_mode_is_written", inference_mode_allocations)
check("views_under_inference_mode_work", inference_mode_views)
check("to_meta_is_metadata_only", to_meta)  # last: before its fix it queued a failing op
"""

SURFACE = COMMON + """
MIB = 2**20
memory = twin.device().memory


def settle():
    gc.collect()
    torch.npu.synchronize()


def device_size_from_env():
    eq(torch.npu.mem_get_info()[1], 256 * MIB)
    eq(torch.npu.get_device_properties(0).total_memory, 256 * MIB)


def live_accounting():
    settle()
    torch.npu.empty_cache()
    torch.npu.reset_peak_memory_stats()
    allocated, free = torch.npu.memory_allocated(), torch.npu.mem_get_info()[0]
    block = torch.empty(MIB // 4, dtype=torch.float32, device="npu")   # 1 MiB
    eq(torch.npu.memory_allocated() - allocated, MIB)
    eq(free - torch.npu.mem_get_info()[0], MIB)                        # free memory decreased
    odd = torch.empty(3, dtype=torch.uint8, device="npu")              # rounded to 512 bytes
    eq(torch.npu.memory_allocated() - allocated, MIB + 512)
    view = block[10:]                                                  # a view holds no block
    eq(torch.npu.memory_allocated() - allocated, MIB + 512)
    del block, odd
    gc.collect()
    eq(torch.npu.memory_allocated() - allocated, MIB)                  # the view keeps it
    del view
    gc.collect()
    eq(torch.npu.memory_allocated(), allocated)
    eq(torch.npu.max_memory_allocated() - allocated, MIB + 512)        # the peak stays
    eq(torch.npu.memory_reserved() - allocated, MIB + 512)             # cached, still reserved
    stats = torch.npu.memory_stats()
    eq(stats["allocated_bytes.all.peak"] - allocated, MIB + 512)
    eq(stats["reserved_bytes.all.current"], torch.npu.memory_reserved())
    torch.npu.empty_cache()
    eq(torch.npu.memory_reserved(), allocated)
    eq(torch.npu.mem_get_info()[0], 256 * MIB - allocated)
    torch.npu.reset_peak_memory_stats()
    eq(torch.npu.max_memory_allocated(), allocated)


def op_outputs_are_accounted():
    settle()
    before = torch.npu.memory_allocated()
    a = torch.ones(MIB // 4, device="npu")
    b = a * 2                                                          # queued op output
    eq(torch.npu.memory_allocated() - before, 2 * MIB)
    del a, b
    settle()
    eq(torch.npu.memory_allocated(), before)


def out_of_memory():
    settle()
    torch.npu.empty_cache()
    ooms = torch.npu.memory_stats()["num_ooms"]
    allocated = torch.npu.memory_allocated()
    expect(torch.OutOfMemoryError, "NPU out of memory. Tried to allocate 512.00 MiB",
           lambda: torch.empty(512 * MIB, dtype=torch.uint8, device="npu"))
    eq(torch.npu.memory_stats()["num_ooms"], ooms + 1)
    eq(torch.npu.memory_allocated(), allocated)                        # nothing accounted
    big = torch.empty(128 * MIB, dtype=torch.uint8, device="npu")      # what fits still does
    del big


def memory_module():
    import torch.npu.memory as module
    from torch.npu.memory import NPUPluggableAllocator
    eq(module.memory_stats is torch.npu.memory_stats, True)
    eq(torch.npu.memory.max_memory_allocated(), torch.npu.max_memory_allocated())
    expect(NotInTwinError, "torch.npu.memory.NPUPluggableAllocator",
           lambda: NPUPluggableAllocator("x.so", "alloc", "free"))
    expect(NotInTwinError, "torch.npu.memory.use_mem_pool",
           lambda: torch.npu.memory.use_mem_pool(None))


def config_module():
    from pyruntime.npu_twin import npu_module
    torch.npu.config.allow_internal_format = True       # vLLM-Ascend, model_runner_v1.py
    eq(npu_module.OPTIONS["ALLOW_INTERNAL_FORMAT"], "enable")
    expect(AttributeError, "allow_internal_format", lambda: torch.npu.config.allow_internal_format)


def pinned_factories():
    eq(torch.zeros(4, dtype=torch.int32, pin_memory=True).is_pinned(), True)
    eq(torch.tensor([1, 2], pin_memory=True).is_pinned(), True)
    eq(torch.arange(5, pin_memory=True).is_pinned(), True)
    eq(torch.full((2,), 3.0, pin_memory=True).is_pinned(), True)
    eq(torch.empty_like(torch.ones(2), pin_memory=True).is_pinned(), True)
    eq(torch.zeros(4).is_pinned(), False)
    with torch.device("npu"):                           # factories still follow the context
        eq(torch.zeros(2).device.type, "npu")
    staged = torch.tensor([5, 6], pin_memory=True)
    moved = staged.to("npu", non_blocking=True)
    del staged
    gc.collect()                                        # pinned: kept alive until it ran
    eq(moved.cpu().tolist(), [5, 6])


def soc_and_default_stream():
    eq(torch.npu.get_soc_version(), 223)                # Ascend910B3
    default = torch.npu.default_stream()
    eq(default == torch.npu.current_stream(), True)
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        eq(torch.npu.default_stream() == side, False)
        eq(torch.npu.default_stream() == default, True)


def synchronize_waits_for_every_stream():
    side = torch.npu.Stream()
    with torch.npu.stream(side):
        on_side = torch.ones(3, device="npu") * 4
    eq(side.query(), False)
    torch.npu.synchronize()
    eq(side.query(), True)
    with torch.npu.stream(side):
        again = on_side + 1
    torch.accelerator.synchronize()                     # routed to the twin as well
    eq(side.query(), True)
    eq(again.cpu().tolist(), [5.0] * 3)


def accelerator_memory_as_vllm_ascend_patches_it():
    # torch_npu 2.10's allocator is no c10 DeviceAllocator: torch.accelerator's memory
    # queries raise there, and vLLM-Ascend routes them to torch.npu.* (its
    # patch/platform/patch_torch_accelerator.py); the twin raises the same, then follows
    expect(RuntimeError, "not a DeviceAllocator", torch.accelerator.memory_stats)
    torch.accelerator.memory_stats = torch.npu.memory_stats
    torch.accelerator.memory_reserved = torch.npu.memory_reserved
    torch.accelerator.get_memory_info = torch.npu.mem_get_info
    before = torch.accelerator.memory_stats()["allocated_bytes.all.current"]
    held = torch.empty(MIB, dtype=torch.uint8, device="npu")
    eq(torch.accelerator.memory_stats()["allocated_bytes.all.current"] - before, MIB)
    eq(torch.accelerator.get_memory_info()[1], 256 * MIB)
    eq(torch.accelerator.current_device_index(), 0)
    del held


def unique_consecutive_is_synchronous():
    ids = torch.tensor([0, 0, 1, 1, 1, -1], dtype=torch.int32).to("npu")
    settle()
    syncs = twin.device().stats["synchronizes"]
    with torch.inference_mode():                                       # vLLM's execute_model
        values, counts = torch.unique_consecutive(ids * 1, return_counts=True)
    eq((values.device.type, counts.device.type), ("npu", "npu"))
    eq(twin.device().stats["synchronizes"], syncs + 1)                 # the host waited
    eq((values.cpu().tolist(), counts.cpu().tolist()), ([0, 1, -1], [2, 3, 1]))
    with capture():
        expect(twin.CaptureViolation, "while a graph is capturing",
               lambda: torch.unique_consecutive(ids))


check("device_size_comes_from_the_environment", device_size_from_env)
check("unique_consecutive_synchronizes_and_returns_npu_tensors", unique_consecutive_is_synchronous)
check("allocated_reserved_peak_and_free_are_live", live_accounting)
check("queued_op_outputs_are_accounted", op_outputs_are_accounted)
check("allocation_past_the_device_size_raises_npu_oom", out_of_memory)
check("memory_module_has_the_queries_and_placeholders", memory_module)
check("config_allow_internal_format_sets_the_option", config_module)
check("pin_memory_factories_make_pinned_host_tensors", pinned_factories)
check("get_soc_version_and_default_stream", soc_and_default_stream)
check("synchronize_waits_for_every_stream", synchronize_waits_for_every_stream)
check("accelerator_memory_raises_then_follows_vllm_ascends_patch",
      accelerator_memory_as_vllm_ascend_patches_it)
"""

MODULES = COMMON + """
def profiler_dynamic_profile():
    from torch_npu.profiler import dynamic_profile as dp     # vLLM-Ascend worker.py
    expect(NotInTwinError, "torch_npu.profiler.dynamic_profile.step", dp.step)


def inductor_module():
    import torch_npu._inductor                                # NPUWorker._init_device
    expect(NotInTwinError, "torch_npu._inductor.register_device_op_overrides_npu",
           torch_npu._inductor.register_device_op_overrides_npu)


def acl_and_fla_npu():
    from acl.rt import memcpy                                 # device_allocator/camem.py
    expect(NotInTwinError, "acl.rt.memcpy", lambda: memcpy(0, 0, 0, 0, 0))
    from fla_npu.ops.ascendc import causal_conv1d_fn          # ops/gdn.py
    expect(NotInTwinError, "fla_npu.ops.ascendc.causal_conv1d_fn", causal_conv1d_fn)
    import importlib
    expect(ModuleNotFoundError, "fla_npu.ops.triton",         # outside the allow-list
           lambda: importlib.import_module("fla_npu.ops.triton"))
    expect(ModuleNotFoundError, "acl_other", lambda: importlib.import_module("acl_other"))


class WeightParameter(torch.nn.Parameter):
    # vllm/model_executor/parameter.py BasevLLMParameter: __new__ through Parameter.__new__,
    # the weight loader kept by __init__
    def __new__(cls, data, **kwargs):
        return super().__new__(cls, data=data, requires_grad=False)

    def __init__(self, data, weight_loader):
        self._weight_loader = weight_loader

    @property
    def weight_loader(self):
        return self._weight_loader


def parameter_subclass_keeps_its_class():
    loader = object()
    param = WeightParameter(data=torch.empty(2, 3, device="npu"), weight_loader=loader)
    eq((isinstance(param, WeightParameter), isinstance(param, torch.nn.Parameter)), (True, True))
    eq((param.weight_loader is loader, param.requires_grad, param.device.type),
       (True, False, "npu"))
    param.data.copy_(torch.arange(6.0).view(2, 3))            # default_weight_loader
    eq(param.cpu().tolist(), [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    doubled = param * 2                                       # ops give plain npu tensors
    eq((isinstance(doubled, torch.nn.Parameter), twin.is_npu_tensor(doubled)), (False, True))
    layer = torch.nn.Module()
    layer.weight = param
    eq([n for n, _ in layer.named_parameters()], ["weight"])
    plain = torch.nn.Parameter(torch.ones(2, device="npu"))
    eq((type(plain).__name__, plain.requires_grad, isinstance(plain, torch.nn.Parameter)),
       ("Parameter", True, True))
    host = WeightParameter(data=torch.ones(2), weight_loader=loader)   # torch's own path
    eq((type(host) is WeightParameter, host.device.type), (True, "cpu"))


@torch.library.custom_op("twin_rules::scaled_add", mutates_args={"y"})
def scaled_add(y: torch.Tensor, x: torch.Tensor, scale: float) -> None:
    # as vLLM-Ascend's _vllm_ascend_lora::lora_linear: no device types, a Python body
    y.add_(x * scale)


def python_custom_op_runs_its_body():
    y, x = torch.zeros(3, device="npu"), torch.ones(3, device="npu")
    ops_before = twin.device().stats["op"]
    scaled_add(y, x, 2.0)
    eq(twin.device().stats["op"] - ops_before, 2)             # mul, add_: queued on the device
    eq(y.cpu().tolist(), [2.0, 2.0, 2.0])


check("profiler_dynamic_profile_is_a_placeholder_module", profiler_dynamic_profile)
check("python_custom_op_of_another_library_runs_its_body", python_custom_op_runs_its_body)
check("torch_npu_inductor_imports_as_a_placeholder", inductor_module)
check("acl_and_fla_npu_are_allow_listed_placeholders", acl_and_fla_npu)
check("parameter_subclass_of_an_npu_tensor_keeps_its_class", parameter_subclass_keeps_its_class)
"""

GROUPS = {
    "bugs": (BUGS, {}),
    "modules": (MODULES, {}),
    "surface": (SURFACE, {"AICPU_TILING_TWIN_DEVICE_MEMORY": "256MiB"}),
}

#: group -> rule -> the real rule it mirrors
RULES: dict[str, dict[str, str]] = {
    "bugs": {
        "manual_seed_after_activate_does_not_recurse":
            "torch.manual_seed calls torch.npu.manual_seed_all (torch/random.py "
            "_seed_custom_device), which seeds the device generators only (torch_npu "
            "npu/random.py)",
        "npu_manual_seed_seeds_the_device_generator":
            "torch_npu npu/random.py: manual_seed seeds default_generators[current_device]; "
            "random ops on npu draw from it, not from the host's",
        "cpu_under_inference_mode_is_a_host_tensor":
            "torch's dispatcher: CompositeImplicitAutograd ops (aten::to.dtype_layout) "
            "decompose on every backend, inference mode or not",
        "to_under_inference_mode_converts": "the same for .to(device) and .to(dtype)",
        "empty_non_blocking_h2d_copy_is_no_race":
            "torch_npu CopyKernelOpApi.cpp copy_: an empty destination returns at once",
        "to_meta_is_metadata_only":
            "torch _to_copy allocates on the target; copy_ into meta reads nothing",
        "memory_allocated_under_inference_mode_is_written":
            "inference tensors are an autograd notion: the device writes their memory",
        "views_under_inference_mode_work":
            "torch InferenceMode: a view of a normal tensor is normal, of an inference "
            "tensor an inference tensor",
    },
    "modules": {
        "profiler_dynamic_profile_is_a_placeholder_module":
            "torch_npu 2.10.0.post4 torch_npu/profiler/dynamic_profile.py (init, step, start, "
            "set_state); vLLM-Ascend worker.py imports it, dp.step() only under "
            "msmonitor_use_daemon",
        "python_custom_op_of_another_library_runs_its_body":
            "torch.library.custom_op without device_types registers CompositeExplicitAutograd, "
            "which the dispatcher uses for PrivateUse1: vLLM-Ascend 0.30 lora_ops.py "
            "lora_linear runs its Python body on npu tensors",
        "torch_npu_inductor_imports_as_a_placeholder":
            "torch_npu/_inductor/__init__.py; vLLM-Ascend NPUWorker._init_device imports it "
            "when HAS_TRITON",
        "acl_and_fla_npu_are_allow_listed_placeholders":
            "pyACL (CANN) and fla_npu: vLLM-Ascend camem.py / ops/gdn.py import them at module "
            "top; its tests/ut/conftest.py stands in for the same five modules",
        "parameter_subclass_of_an_npu_tensor_keeps_its_class":
            "torch/nn/parameter.py Parameter.__new__: a plain tensor (an npu tensor on an NPU) "
            "takes _make_subclass(cls, ...), so vLLM's parameter classes and weight_loader "
            "survive",
    },
    "surface": {
        "unique_consecutive_synchronizes_and_returns_npu_tensors":
            "torch_npu op-plugin UniqueConsecutiveKernelNpuOpApi.cpp: EXEC_NPU_CMD_SYNC, "
            "outputs resized to the kernel's shapes; vLLM's LoRA compute_meta calls it",
        "device_size_comes_from_the_environment":
            "mem_get_info()[1] / total_memory: AICPU_TILING_TWIN_DEVICE_MEMORY",
        "allocated_reserved_peak_and_free_are_live":
            "torch_npu memory.py over its caching allocator (512-byte blocks, cache kept "
            "until empty_cache); vLLM's MemorySnapshot reads these",
        "queued_op_outputs_are_accounted": "an op's output is allocated when it is issued",
        "allocation_past_the_device_size_raises_npu_oom":
            "libtorch_npu.so: 'NPU out of memory. Tried to allocate', torch.OutOfMemoryError",
        "memory_module_has_the_queries_and_placeholders":
            "torch.npu.memory is a module (torch_npu npu/memory.py); vLLM-Ascend imports "
            "NPUPluggableAllocator / use_mem_pool from it (sleep mode, not run here)",
        "config_allow_internal_format_sets_the_option":
            "torch_npu npu_config.py _npuConfig.__setattr__: ALLOW_INTERNAL_FORMAT",
        "pin_memory_factories_make_pinned_host_tensors":
            "torch factories with pin_memory=True use torch_npu's CachingHostAllocator",
        "get_soc_version_and_default_stream":
            "torch_npu _backends.py get_soc_version (NpuVariables.h: Ascend910B3 = 223), "
            "utils.py default_stream",
        "synchronize_waits_for_every_stream":
            "torch_npu utils.py synchronize (_npu_synchronize); torch.accelerator.synchronize "
            "via NPUGuardImpl::synchronizeDevice",
        "accelerator_memory_raises_then_follows_vllm_ascends_patch":
            "no c10 DeviceAllocator in libtorch_npu.so; vLLM-Ascend's "
            "patch_torch_accelerator.py",
    },
}


@pytest.fixture(scope="module")
def outcomes(run_twin):
    """group -> rule -> outcome; both groups start at the first call, on the runner's
    pool."""
    futures = {}

    def get(group: str) -> dict[str, str]:
        if not futures:
            for name, (script, env) in GROUPS.items():
                futures[name] = run_twin.submit(
                    lambda s=script, e=env: run_twin.rules(run_twin(s, env=e)))
        return futures[group].result()
    return get


def _check(outcomes, group: str, rule: str) -> None:
    found = outcomes(group)
    died = {k: v for k, v in found.items() if k.startswith("<script>")}
    assert found.get(rule) == "ok", (
        f"twin rule {rule!r} ({RULES[group][rule]}) broke: {found.get(rule, 'not reported')}"
        + "".join(f"\n{k}: {v}" for k, v in died.items()))


@pytest.mark.parametrize("group", sorted(RULES))
def test_group_reports_exactly_its_rules(outcomes, group):
    assert sorted(outcomes(group)) == sorted(RULES[group])


@pytest.mark.parametrize("rule", sorted(RULES["bugs"]))
def test_twin_bug_fixed(outcomes, rule):
    """The engine probe's five twin bugs (shared/reviews/engine-on-twin-probe-2026-12.md):
    seeding recursed, CompositeImplicitAutograd ops were queued under inference mode, an
    empty non-blocking copy was a race, to("meta") was queued, inference-mode memory and
    views failed."""
    _check(outcomes, "bugs", rule)


@pytest.mark.parametrize("rule", sorted(RULES["modules"]))
def test_module_vllm_ascends_engine_imports(outcomes, rule):
    """The modules vLLM-Ascend's worker imports on the engine's path, and vLLM's parameter
    classes over npu tensors (docs/npu-twin.md)."""
    _check(outcomes, "modules", rule)


@pytest.mark.parametrize("rule", sorted(RULES["surface"]))
def test_torch_npu_surface(outcomes, rule):
    """torch.npu as vLLM-Ascend 0.23.0.post1 / 0.30.0rc2 use it (docs/npu-twin.md)."""
    _check(outcomes, "surface", rule)
