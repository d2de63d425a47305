"""The engine check (``aicpu-tiling serve-check``): vLLM's whole engine, ``vllm.LLM`` with the
installed vLLM-Ascend's platform, run twice in fresh processes on the same model and prompts,
without and with the hook (``AICPU_TILING=1``), greedy, under FULL_DECODE_ONLY; the tokens
judged against an fp32 HF transformers reference (`pyruntime.hook.dryrun.judge`).

Where no NPU is present the processes run on the NPU twin: ``AICPU_TILING_TWIN=1`` makes the
twin's ``.pth`` (installed in the vLLM environments by ``tools/vllm_env.sh``) activate it in
every process vLLM starts. Each run is one child, ``python -m pyruntime.hook.dryrun.engine_check
--child ...``, which prints one ``ENGINE-RUN {json}`` line (`child_main`): the tokens of each
request, the decode steps, the graph task updates (``torch.npu.graph_task_update_begin``) and,
on the twin, the blocking copies and synchronizes (the twin device's counters) counted over
the generate call, the hook's layer report, and the seconds per output token.

The parent (`check`) writes a tiny model when asked (`pyruntime.hook.dryrun.tiny_models`),
runs both children, computes the reference only at a divergence, and returns the report of
issue 29's schema (`REPORT_FIELDS`).

With a profile folder (``serve-check --profile DIR``, issue 32 item 4) each child runs its
``generate`` call under torch_npu's profiler (`pyruntime.measurement.device_lanes.
TorchNpuLanes`: CPU and NPU activities, ``tensorboard_trace_handler``; on the twin, the twin's
``torch_npu.profiler``, which writes the same files from its task records), its output kept in
``DIR/{without,with}/torch_npu/``; the child times each engine step and each graph task update
on the host clock, and returns the run as a profile `Run` (`profiled_run`): one host step per
engine step with its task updates as spans, the device tasks of torch_npu's
kernel_details.csv attributed to the step they started in. The parent writes, per run and for
both side by side, what ``aicpu-tiling profile --trace`` writes (`write_profiles`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...profiler.data import DeviceTask, HostStep, Run, Session
from ...profiler.report import write_profile_folder
from . import engine_workers
from . import judge as judging
from .engine_workers import host_waits

SCHEMA = "aicpu-tiling/serve-check"
VERSION = 1
#: the report's fields, in order (issue 29, item 3; ``speculative`` and ``replayed_sizes``
#: from item 4)
REPORT_FIELDS = (
    "schema", "version", "vllm", "vllm_ascend", "backend", "model", "dtype", "tp", "lora",
    "speculative", "placement", "compilation_mode", "compilation_reason", "graph_sizes",
    "replayed_sizes", "layers", "device_layers", "updates_per_step", "added_per_step",
    "tokens_identical", "divergence", "reference", "tpot_ms", "profile", "ranks", "verdict")
#: the child's result line prefix
RESULT_PREFIX = "ENGINE-RUN "
#: the most requests a step runs (vLLM's ``max_num_seqs``): the capture sizes are 1..MAX_SEQS
#: requests, so at least 8 FULL decode graphs (issue 29 item 4)
MAX_SEQS = 8
#: prompt token ids of the requests (ids of the tiny models' vocabulary), one per request.
#: Each repeats an n-gram, so that with ``--spec ngram`` vLLM's prompt-lookup proposer finds a
#: match from the first decode step on (and a greedy model that repeats itself, as a random
#: one does, gets its drafts accepted); without ``--spec`` they are plain prompts
PROMPTS = ((5, 17, 99, 5, 17, 99, 5), (7, 250, 7, 250, 7), (120, 64, 9, 120, 64, 9, 120),
           (33, 33, 33, 33), (301, 12, 44, 301, 12, 44), (88, 3, 88, 3, 88, 3),
           (410, 222, 19, 410, 222), (61, 61, 140, 61, 61, 140, 61))
#: the speculative decoding methods ``--spec`` runs: vLLM's ``speculative_config`` for each,
#: 2 draft tokens, so a verify step has up to 3 query rows per request (q_len 3).
#:
#: * ``ngram``: vLLM's prompt-lookup proposer (``vllm/v1/spec_decode/ngram_proposer.py``,
#:   which vLLM-Ascend's ``AscendNgramProposer`` subclasses, ``vllm_ascend/spec_decode/
#:   ngram_proposer.py``), matched on the last 1 to 3 tokens. It proposes only where the
#:   context repeats, so a step's requests carry 0, 1 or 2 drafts; vLLM dispatches a FULL
#:   graph only for a uniform batch (every request ``1 + num_speculative_tokens`` rows,
#:   ``gpu_model_runner.py`` ``uniform_decode``), so under FULL_DECODE_ONLY its ragged verify
#:   steps run eager, outside any graph (docs/hook-in-vllm-ascend.md, "The engine check").
#: * ``self-draft``: vLLM's draft-model proposer (``method: draft_model``; vLLM-Ascend's
#:   ``AscendDraftModelProposer``) with the served model as its own draft: every request gets
#:   both drafts every step, so every verify step is a uniform q_len-3 batch that replays a
#:   FULL graph, and greedy drafts of the same weights are mostly accepted. The draft
#:   model's own graphs keep vLLM-Ascend's path (the hook leaves speculative draft graphs on
#:   the host path, pyruntime/hook/vllm_ascend_patches.py).
SPECULATIVE_CONFIGS: dict[str, dict[str, Any]] = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
              "prompt_lookup_max": 3},
    "self-draft": {"method": "draft_model", "num_speculative_tokens": 2},
}
#: the fewest distinct FULL graph sizes the generate call must replay (the hooked run's): the
#: requests' staggered max_tokens shrink the batch, and a check whose batches all hit one
#: graph would not show the hook's per-size tilings
MIN_REPLAYED_SIZES = 2
#: with ``--lora``, the requests that use the adapter (the others the base model), so a batch
#: of one size runs with and without LoRA as the requests finish
LORA_REQUESTS = (1,)
#: the compilation configs the check can run (``--compilation``): ``none``, vLLM's mode NONE
#: (no Dynamo, the model's eager forward captured by vLLM-Ascend's ACL graphs); ``default``,
#: the release's default, which is what ``vllm serve`` runs when the user gives only the graph
#: mode: vLLM's default mode VLLM_COMPILE with vLLM-Ascend's compiler
#: (``NPUPlatform.get_compile_backend``: ``AscendCompiler``) and, under FULL graphs on A2/A3,
#: its ``enable_npugraph_ex`` default True (``ascend_config.py`` ``AscendCompilationConfig``)
#: (docs/hook-in-vllm-ascend.md, "The engine check: compilation")
COMPILATIONS = ("none", "default")
#: what `eager_reference_check` runs (a child's ``--compilation`` only, not serve-check's):
#: mode NONE with no graphs at all (``cudagraph_mode`` NONE), vLLM-Ascend's eager forward, for
#: the releases and models whose FULL graphs vLLM-Ascend cannot capture in mode NONE
EAGER = "eager"
#: torch_npu's graph compilers that vLLM-Ascend's ``npugraph_ex_compile`` uses, in its order
#: (``compilation/compiler_interface.py``: ``import npugraph_ex``, on ImportError ``import
#: torchair``): torch_npu 2.10 ships both as these subpackages and registers them as the
#: top-level modules ``npugraph_ex`` and ``torchair`` (``torch_npu/dynamo/__init__.py``; it
#: tells whether it was built with them by the package on disk, ``_get_default_backend``)
GRAPH_COMPILERS = ("torch_npu.dynamo.npugraph_ex", "torch_npu.dynamo.torchair")
#: the twin's tensor layer the children run on (`pyruntime.npu_twin.TENSORS_ENV`): plain npu
#: tensors, which Dynamo traces (the wrapper subclass stops VLLM_COMPILE in Dynamo)
TWIN_TENSORS = ("AICPU_TILING_TWIN_TENSORS", "plain")
#: what the hook's run needs to be called with the hook
HOOK_ENV = "AICPU_TILING"
TWIN_ENV = "AICPU_TILING_TWIN"
#: ``--profile DIR``: each run's folder under DIR, and the profile `Run`'s mode it is shown as
PROFILE_RUNS = {False: ("without", "without_hook"), True: ("with", "with_hook")}
#: the child's torch_npu profiler output, inside a run's folder
TORCH_NPU_DIR = "torch_npu"
#: what a profiled engine run's times are, as its JSON and trace state it
PROFILE_TIMES = {
    "npu": "measured on the Ascend device (device lanes from torch_npu's profiler); host lanes: "
           "the engine steps and graph task updates on the host clock",
    "npu-twin": "emulated: the NPU twin runs the device's tasks on the host; only counts are "
                "judged, times are not device times",
}


class EngineCheckError(RuntimeError):
    """The engine check cannot run here, or a run stopped (says where and why)."""


def max_tokens_of(max_tokens: int) -> list[int]:
    """Each request's ``max_tokens``: `max_tokens`, and one fewer each, at least 1, so the
    running batch shrinks by one request per decode step from len(PROMPTS) down to 1 through
    the capture sizes."""
    return [max(1, max_tokens - i) for i in range(len(PROMPTS))]


def speculative_config(speculative: str, model: str) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for the method `speculative` on the served `model`."""
    config = dict(SPECULATIVE_CONFIGS[speculative])
    if config["method"] == "draft_model":
        config["model"] = model
    return config


def graph_sizes(speculative: str | None = None) -> list[int]:
    """The capture sizes (tokens per FULL_DECODE_ONLY graph) the check asks vLLM for: one
    graph per batch of 1..`MAX_SEQS` requests, each request ``1 + num_speculative_tokens``
    query rows under `speculative` (a `SPECULATIVE_CONFIGS` key). vLLM rounds the sizes up
    to that multiple anyway (``CompilationConfig.adjust_cudagraph_sizes_for_spec_decode``,
    vllm/config/compilation.py) and drops those past the largest, so asking for 1..8 with
    q_len 3 would leave two graphs."""
    q_len = 1 + (SPECULATIVE_CONFIGS[speculative]["num_speculative_tokens"]
                 if speculative else 0)
    return [q_len * n for n in range(1, MAX_SEQS + 1)]


# -- the child: one engine run ---------------------------------------------------------------


@dataclass
class EngineRun:
    """What one child reports."""

    hooked: bool
    vllm: str = ""
    vllm_ascend: str = ""
    backend: str = ""
    dtype: str = ""
    tokens: list[list[int]] = field(default_factory=list)
    decode_steps: int = 0
    updates: int = 0
    blocking_copies: int | None = None
    synchronizes: int | None = None
    tpot_ms: float = 0.0
    #: the capture sizes vLLM ended with (its compilation config after the model runner
    #: rounded them for speculative decoding)
    graph_sizes: list[int] = field(default_factory=list)
    #: FULL graph replays over the generate call: [num_tokens, num_reqs, replays] per batch
    #: descriptor (vLLM-Ascend's ``ACLGraphWrapper.__call__`` in FULL mode after the capture)
    replays: list[list[int]] = field(default_factory=list)
    #: draft tokens the verify steps accepted (tokens an engine step gave a request past its
    #: first); None without speculative decoding
    accepted_drafts: int | None = None
    hook_state: str | None = None
    hook_reason: str | None = None
    hook_engine: str | None = None
    device_layers: dict[str, str] = field(default_factory=dict)
    host_layers: dict[str, str] = field(default_factory=dict)
    #: with a profile folder: ``{"run": the profile Run as a dict, "lanes": what
    #: TorchNpuLanes read}``
    profile: dict[str, Any] | None = None
    #: one `engine_workers.counts` record per worker (rank order): what the fields above sum or
    #: combine over the ranks
    ranks: list[dict] = field(default_factory=list)
    compilation_mode: str | None = None
    compilation_reason: str | None = None
    error: str | None = None


@dataclass
class HostTimeline:
    """The host side of a profiled ``generate`` call on the ``perf_counter`` clock: each
    engine step's ``(start, end)`` and each graph task update's, ``graph_task_update_begin``
    to ``graph_task_update_end``."""

    steps: list[tuple[float, float]] = field(default_factory=list)
    updates: list[tuple[float, float]] = field(default_factory=list)


def profiled_run(mode: str, workload: dict[str, Any], host: HostTimeline,
                 tasks: list[DeviceTask]) -> Run:
    """The profile `Run` of one engine run: one `HostStep` per engine step (``host_s`` and
    ``step_s`` both the step's host wall time: the engine's own host time is not separated
    from its waits), its task updates as ``task_updates`` spans and phase (the rest
    ``other``), the device `tasks` (attributed to steps by the caller), and the graph task
    updates per step as a counter."""
    steps = []
    for start, end in host.steps:
        spans = [("task_updates", a, b) for a, b in host.updates if start <= a < end]
        updating = sum(b - a for _, a, b in spans)
        steps.append(HostStep(start, end - start, end - start,
                              {"task_updates": updating, "other": end - start - updating},
                              spans))
    counters = {"graph_task_updates": len(host.updates) / max(1, len(host.steps))}
    return Run(mode, workload, steps, list(tasks), counters)


def missing_graph_compiler() -> str | None:
    """None when torch_npu here ships one of its graph compilers (`GRAPH_COMPILERS`); else
    why vLLM-Ascend's ``npugraph_ex_compile`` cannot run here."""
    import importlib.util

    for name in GRAPH_COMPILERS:
        try:
            if importlib.util.find_spec(name) is not None:
                return None
        except ImportError:  # no torch_npu, or one without torch_npu.dynamo
            continue
    return ("torch_npu here ships neither npugraph_ex nor torchair (torch_npu/dynamo, the "
            "graph compiler vLLM-Ascend's default enable_npugraph_ex calls): vLLM-Ascend's "
            "AscendCompiler ran with enable_npugraph_ex false, its fusion-pass path "
            "(aot_autograd and GraphFusionPassManager)")


def torch_off_the_release_pin() -> str | None:
    """None when the torch here is the one the installed vLLM-Ascend pins (``torch==X`` in its
    requirements), or when the user set ``VLLM_USE_AOT_COMPILE``; else why the engine check
    turns vLLM's AOT compile off for the compiled run.

    Why: vLLM 0.30 compiles through ``torch._dynamo.aot_compile`` by default with torch >=
    2.10 (``vllm/envs.py`` ``use_aot_compile``). torch 2.13's ``aot_compile`` patches
    ``force_autograd_cache`` on (``torch/_dynamo/aot_compile.py``), so AOTAutograd caches the
    forward and requires the compiler to return Inductor's ``OutputCode``
    (``autograd_cache.py`` ``unwrap_output_code``), which vLLM-Ascend's fusion-pass compiler
    (a GraphModule from ``aot_autograd(fw_compiler=...)``) does not; torch 2.10, the release's
    pin, patches only ``bundled_autograd_cache`` and caches nothing for a compiler that is not
    ``SerializableAOTDispatchCompiler``."""
    import re
    from importlib import metadata

    import torch

    if "VLLM_USE_AOT_COMPILE" in os.environ:
        return None
    try:
        requires = metadata.requires("vllm-ascend") or []
    except metadata.PackageNotFoundError:
        return None
    pins = [m.group(1) for r in requires if (m := re.match(r"torch\s*==\s*([\w.]+)\s*$", r))]
    here = torch.__version__.split("+")[0]
    if not pins or pins[0] == here:
        return None
    return (f"VLLM_USE_AOT_COMPILE=0: torch {here} here, not vLLM-Ascend's pin {pins[0]}; "
            f"torch {here}'s aot_compile forces AOTAutograd's cache, which needs Inductor's "
            "OutputCode that vLLM-Ascend's fusion-pass compiler does not return")


#: the variable that overrides torch's `custom_op_aliasing_raises` setting (torch 2.13 has it,
#: torch 2.10 has neither)
ALIASING_ENV = "TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING"

#: why the compiled run, off the release's pin, keeps torch's custom-op aliasing check a
#: warning (`custom_op_aliasing_raises`)
ALIASING_REASON = (
    f"{ALIASING_ENV}=0: the torch here checks at a compiled graph's first call that no "
    "custom op returns an alias of its input and raises where CI is set (else it warns); "
    "torch 2.10, the release's pin, has no such check, and vLLM-Ascend 0.23's "
    "maybe_pad_and_reduce returns its input at TP 1")


#: why the compiled run turns vLLM's bytecode hook off with its AOT compile (the report's
#: ``compilation_reason``; `bytecode_hook_runs_only_without_aot_compile`)
BYTECODE_HOOK_REASON = (
    "VLLM_USE_BYTECODE_HOOK=0: the release's AOT compile never runs vLLM's bytecode hook "
    "(torch 2.10's aot_compile captures through compile_frame, which calls no Dynamo "
    "bytecode hook), so its check of the transformed frame's names does not run either")


def bytecode_hook_runs_only_without_aot_compile() -> bool:
    """Whether the check, having turned vLLM's AOT compile off (`torch_off_the_release_pin`),
    also turns vLLM's bytecode hook off (``VLLM_USE_BYTECODE_HOOK=0``): True unless the user
    set that variable or ``VLLM_DISABLE_COMPILE_CACHE`` (with which the release itself does
    not AOT-compile, ``vllm/envs.py`` ``use_aot_compile``, and so runs the hook).

    Why: with ``VLLM_USE_BYTECODE_HOOK`` (vLLM's default 1) ``TorchCompileWithNoGuardsWrapper``
    registers ``bytecode_hook`` with Dynamo (``vllm/compilation/wrapper.py:156-158``), which
    raises "Assigning / modifying buffers of nn.Module ..." whenever a cudagraph mode is set
    and ``"update" in new_code.co_names`` (``wrapper.py:250-263``). Dynamo builds the
    transformed code's names from the original frame's and only appends
    (``torch/_dynamo/bytecode_transformation.py`` ``transform_code_object``: ``code_options``
    from ``code``; ``fix_vars`` appends), so a name the frame only reads in a branch never
    taken trips it: vLLM-Ascend 0.30.0rc2's DeepSeek forward
    (``vllm_ascend/patch/worker/patch_deepseek_v2.py:361`` ``_patched_forward``) has
    ``pp_output.tensors.update(...)`` on its pipeline-parallel branch (line 414). The
    release's default, AOT compile on its pinned torch 2.10 (``envs.py`` ``use_aot_compile``:
    on for torch >= 2.10), never calls the hook: ``decorators.py`` compiles the first call
    through ``self.aot_compile`` and later calls run ``aot_compiled_fn``; torch 2.10's
    ``aot_compile`` captures through ``convert_frame.fullgraph_capture`` ->
    ``_fullgraph_capture_frame`` -> ``compile_frame``, and only ``_compile_inner`` calls the
    registered ``_bytecode_hooks`` (``torch/_dynamo/convert_frame.py:1505`` in torch 2.10.0).
    Off the AOT compile, the hook off is that default's behaviour: vLLM calls its
    ``torch.compile`` callable (``wrapper.py`` ``__call__``, the ``else`` branch)."""
    if "VLLM_USE_BYTECODE_HOOK" in os.environ:
        return False
    try:  # as vLLM reads it (envs.py disable_compile_cache: bool(int(...)))
        return not int(os.environ.get("VLLM_DISABLE_COMPILE_CACHE", "0"))
    except ValueError:  # vLLM refuses the value itself: leave its hook as it is
        return False


def custom_op_aliasing_raises() -> bool:
    """Whether the torch here raises at a compiled graph's first call when a custom op returns
    an alias of its input, and the user left `ALIASING_ENV` unset.

    Why it matters off the release's pin: torch 2.13 runs that check on every compiled graph's
    first call (``torch/_functorch/_aot_autograd/runtime_wrappers.py``
    ``_FirstInvocationContext``) and raises only where ``error_on_custom_op_aliasing`` is on,
    which defaults to ``bool(os.getenv("CI"))`` (``torch/_functorch/config.py``): a warning on
    a developer's machine, an error in a CI job. torch 2.10, vLLM-Ascend's pin, has no such
    check, and vLLM-Ascend 0.23.0.post1's ``maybe_pad_and_reduce`` returns its input at TP 1
    (``vllm_ascend/ops/register_custom_ops.py``: ``tensor_model_parallel_all_reduce`` of one
    rank), so the release's compiled engine stops on torch 2.13 only where ``CI`` is set."""
    if ALIASING_ENV in os.environ:
        return False
    import torch._functorch.config as functorch_config

    return bool(getattr(functorch_config, "error_on_custom_op_aliasing", False))


def compilation_arguments(compilation: str, speculative: str | None = None
                          ) -> tuple[dict, dict | None, dict[str, str], str | None]:
    """``(compilation_config, additional_config, environ, reason)`` for `compilation`
    (`COMPILATIONS`): the ``vllm.LLM`` arguments and the variables to set before it.
    FULL_DECODE_ONLY graphs of `graph_sizes` (`speculative`'s) in both; ``none`` sets mode NONE; ``default``
    leaves the mode to vLLM (VLLM_COMPILE) and the compiler to vLLM-Ascend, except where the
    release's default cannot run here: without torch_npu's graph compiler
    (`missing_graph_compiler`) vLLM-Ascend's own ``enable_npugraph_ex`` off, and on a torch
    other than the release's pin (`torch_off_the_release_pin`) vLLM's AOT compile off, and with
    it vLLM's bytecode hook, which the release's AOT compile never runs
    (`bytecode_hook_runs_only_without_aot_compile`), and torch's custom-op aliasing check a
    warning, which the release's torch does not run (`custom_op_aliasing_raises`). `reason`
    says what differs from the release's default (None: nothing)."""
    if compilation == EAGER:
        return {"mode": 0, "cudagraph_mode": "NONE"}, None, {}, None
    if compilation not in COMPILATIONS:
        raise EngineCheckError(f"unknown compilation {compilation!r}: one of "
                               f"{', '.join(COMPILATIONS)}")
    config: dict[str, Any] = {"cudagraph_mode": "FULL_DECODE_ONLY",
                              "cudagraph_capture_sizes": graph_sizes(speculative)}
    if compilation == "none":
        return {"mode": 0, **config}, None, {}, None
    reasons, additional, environ = [], None, {}
    no_compiler = missing_graph_compiler()
    if no_compiler is not None:
        additional = {"ascend_compilation_config": {"enable_npugraph_ex": False}}
        reasons.append(no_compiler)
    off_pin = torch_off_the_release_pin()
    if off_pin is not None:
        environ["VLLM_USE_AOT_COMPILE"] = "0"
        reasons.append(off_pin)
        if bytecode_hook_runs_only_without_aot_compile():
            environ["VLLM_USE_BYTECODE_HOOK"] = "0"
            reasons.append(BYTECODE_HOOK_REASON)
        if custom_op_aliasing_raises():
            environ[ALIASING_ENV] = "0"
            reasons.append(ALIASING_REASON)
    return config, additional, environ, "; ".join(reasons) or None


def _engine_run(model: str, max_tokens: int, placement: str | None, tp: int,
                hooked: bool, lora: str | None = None,
                profile_dir: str | None = None, compilation: str = "none",
                speculative: str | None = None) -> EngineRun:
    from importlib import metadata

    run = EngineRun(hooked=hooked)
    if placement is not None:
        os.environ["AICPU_TILING_PLACEMENT"] = placement  # pyruntime.placement reads it
    if hooked:  # what the .pth line or vLLM's general plugin does with AICPU_TILING=1
        from pyruntime.hook import vllm_plugin

        vllm_plugin.register()
    import torch
    import vllm

    run.vllm, run.vllm_ascend = vllm.__version__, metadata.version("vllm-ascend")
    from pyruntime.npu_twin import is_active as twin_active

    run.backend = "npu-twin" if twin_active() else "npu"
    config = json.loads((Path(model) / "config.json").read_text())
    run.dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    compilation_config, additional_config, environ, run.compilation_reason = \
        compilation_arguments(compilation, speculative)
    os.environ.update(environ)  # before vLLM reads them (vllm.envs reads at each access)
    if ALIASING_ENV in environ:  # torch read its variables at import: this process by hand
        import torch._functorch.config as functorch_config

        functorch_config.error_on_custom_op_aliasing = False
    llm = vllm.LLM(
        model=model, skip_tokenizer_init=True, dtype=run.dtype, seed=0, tensor_parallel_size=tp,
        max_model_len=256, max_num_seqs=MAX_SEQS, block_size=128,
        kv_cache_memory_bytes=64 << 20,
        **({"enable_lora": True, "max_lora_rank": _lora_rank(lora), "max_loras": 1}
           if lora else {}),
        **({"additional_config": additional_config} if additional_config else {}),
        **({"speculative_config": speculative_config(speculative, model)}
           if speculative else {}),
        compilation_config=compilation_config)
    run.compilation_mode = _compilation_mode_of(llm)
    run.graph_sizes = sorted(
        llm.llm_engine.vllm_config.compilation_config.cudagraph_capture_sizes or [])
    counted = {"steps": 0, "accepted": 0}
    # with a profile folder: the host clock of each step and task update (None: not timed);
    # the updates are counted in the workers (engine_workers), this only times them, and only
    # where a worker runs in this process (TP 1)
    host = HostTimeline() if profile_dir is not None else None
    if host is not None:
        opened: list[float] = []
        begin_update = torch.npu.graph_task_update_begin
        end_update = torch.npu.graph_task_update_end

        def timed_begin(*args, **kwargs):
            opened.append(time.perf_counter())
            return begin_update(*args, **kwargs)

        def timed_end(*args, **kwargs):
            out = end_update(*args, **kwargs)
            if opened:
                host.updates.append((opened.pop(), time.perf_counter()))
            return out

        torch.npu.graph_task_update_begin = timed_begin
        torch.npu.graph_task_update_end = timed_end
    engine = llm.llm_engine
    step = engine.step

    def counted_step(*args, **kwargs):
        counted["steps"] += 1
        if host is None:
            return step(*args, **kwargs)
        start = time.perf_counter()
        out = step(*args, **kwargs)
        host.steps.append((start, time.perf_counter()))
        return out

    engine.step = counted_step
    process_outputs = engine.output_processor.process_outputs

    def counted_outputs(engine_core_outputs, *args, **kwargs):
        # host lists: a verify step gives a request 1 + its accepted drafts tokens
        counted["accepted"] += sum(max(0, len(o.new_token_ids) - 1)
                                   for o in engine_core_outputs)
        return process_outputs(engine_core_outputs, *args, **kwargs)

    engine.output_processor.process_outputs = counted_outputs

    # the graph task updates, host waits and collectives are counted where the model runs:
    # in each worker (one process per rank at TP > 1, this process at TP 1), through vLLM's
    # own collective_rpc; the engine's process adds its own host waits when no worker runs
    # in it
    workers_before = llm.collective_rpc(engine_workers.begin)
    stats = None
    if run.backend == "npu-twin" and all(w["pid"] != os.getpid() for w in workers_before):
        from pyruntime.npu_twin import device as twin_device

        stats = twin_device.device().stats
    before = dict(stats) if stats is not None else None
    params = [vllm.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                                  detokenize=False) for n in max_tokens_of(max_tokens)]
    prompts = [{"prompt_token_ids": list(p)} for p in PROMPTS]
    lora_requests = None
    if lora:
        from vllm.lora.request import LoRARequest

        adapter = LoRARequest("tiny", 1, lora)
        lora_requests = [adapter if r in LORA_REQUESTS else None for r in range(len(prompts))]
    lanes = None
    if profile_dir is not None:
        from pyruntime.measurement.device_lanes import TorchNpuLanes

        lanes = TorchNpuLanes(keep_dir=profile_dir)
        lanes.start()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora_requests)
    seconds = time.perf_counter() - start
    run.tokens = [list(o.outputs[0].token_ids) for o in outputs]
    # the first step is the prefill; every later engine step decodes one token per request
    run.decode_steps = max(1, counted["steps"] - 1)
    run.accepted_drafts = counted["accepted"] if speculative else None
    run.tpot_ms = 1000.0 * seconds / max(1, max(len(t) for t in run.tokens))
    run.ranks = sorted(llm.collective_rpc(engine_workers.counts, args=(hooked,)),
                       key=lambda w: w["rank"])
    combine_ranks(run, host_waits(stats, before) if stats is not None else None)
    if lanes is not None and host is not None:
        # after the counts: this wait is the profile's, not the engine's (the engine's steps
        # already waited for their tokens)
        torch.npu.synchronize()
        mode = PROFILE_RUNS[hooked][1]
        for i, (step_start, step_end) in enumerate(host.steps):
            lanes.window(mode, i, step_start, step_end)
        by_mode, info = lanes.stop()
        workload = {"name": f"{Path(model).name} serve-check", "model": model,
                    "max_tokens": max_tokens_of(max_tokens), "hooked": hooked}
        run.profile = {"run": asdict(profiled_run(mode, workload, host, by_mode.get(mode, []))),
                       "lanes": info}
    return run


def combine_ranks(run: EngineRun, engine_waits: dict[str, int] | None = None) -> None:
    """Fill `run`'s totals from its per-rank records (`run.ranks`): the updates, blocking
    copies and synchronizes summed over the ranks (plus `engine_waits`, the engine process's
    own when no worker runs in it); the hook ``active`` only when it is on every rank (else the
    first other rank's state, its reason naming the rank); a layer on the device path only
    when every rank has it there (else on the host path, the reason naming the ranks)."""
    ranks = run.ranks
    run.updates = sum(r["updates"] for r in ranks)
    # every rank replays the same graphs (one batch, tensor-parallel): rank 0's are the run's
    run.replays = [list(x) for x in ranks[0].get("replays", [])] if ranks else []
    counted = [r for r in ranks if r["blocking_copies"] is not None]
    if counted and len(counted) == len(ranks):
        extra = engine_waits or {"blocking_copies": 0, "synchronizes": 0}
        run.blocking_copies = sum(r["blocking_copies"] for r in ranks) + extra["blocking_copies"]
        run.synchronizes = sum(r["synchronizes"] for r in ranks) + extra["synchronizes"]
    if not run.hooked or not ranks:
        return
    off = [r for r in ranks if r["hook_state"] != "active"]
    if off:
        first = off[0]
        run.hook_state = first["hook_state"]
        run.hook_reason = (first["hook_reason"] if len(ranks) == 1
                           else f"rank {first['rank']}: {first['hook_reason']}")
    else:
        run.hook_state, run.hook_reason = "active", None
    run.hook_engine = ranks[0]["hook_engine"]
    everywhere = set.intersection(*(set(r["device_layers"]) for r in ranks))
    run.device_layers = {n: ranks[0]["device_layers"][n] for n in sorted(everywhere)}
    host: dict[str, str] = {}
    for r in ranks:
        for name, reason in r["host_layers"].items():
            host.setdefault(name, reason if len(ranks) == 1 else f"rank {r['rank']}: {reason}")
    for name in sorted(set().union(*(r["device_layers"] for r in ranks)) - everywhere):
        on = [str(r["rank"]) for r in ranks if name in r["device_layers"]]
        host.setdefault(name, f"on the device path on rank(s) {', '.join(on)} only")
    run.host_layers = host


def _compilation_mode_of(llm: Any) -> str:
    """The compilation mode the engine settled on (after vLLM-Ascend's platform adjusted it),
    its name (``NONE``, ``VLLM_COMPILE``, ...)."""
    from vllm.config import CompilationMode

    return CompilationMode(llm.llm_engine.vllm_config.compilation_config.mode).name


def child_main(argv: list[str] | None = None) -> int:
    """``python -m pyruntime.hook.dryrun.engine_check --child``: one engine run; prints
    ``ENGINE-RUN {json}`` (an `EngineRun`, ``error`` set when the run stopped: the exception's
    type, message and the innermost frames)."""
    p = argparse.ArgumentParser(prog="engine_check")
    p.add_argument("--child", action="store_true", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--max-tokens", type=int, required=True)
    p.add_argument("--placement", default=None)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--hooked", action="store_true")
    p.add_argument("--lora", default=None, help="a LoRA adapter directory")
    p.add_argument("--profile", default=None,
                   help="run generate under torch_npu's profiler, its output kept here")
    p.add_argument("--compilation", choices=(*COMPILATIONS, EAGER), default="none")
    p.add_argument("--spec", default=None, choices=tuple(SPECULATIVE_CONFIGS),
                   help="speculative decoding method")
    args = p.parse_args(argv)
    try:
        run = _engine_run(args.model, args.max_tokens, args.placement, args.tp, args.hooked,
                          args.lora, profile_dir=args.profile, compilation=args.compilation,
                          speculative=args.spec)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which says where
        import traceback

        traceback.print_exc()  # the whole chain on stderr; the result line has the innermost
        frames = traceback.extract_tb(exc.__traceback__)[-4:]
        where = "; ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames)
        run = EngineRun(hooked=args.hooked, error=f"{type(exc).__name__}: {exc} [at {where}]")
    print(RESULT_PREFIX + json.dumps(run.__dict__), flush=True)
    return 0 if run.error is None else 1


# -- the parent: both runs, the reference, the report -----------------------------------------


def check_twin_autostart() -> None:
    """Where there is no NPU (torch_npu not installed) the children need the twin active from
    their first line, in every process vLLM starts: the twin's ``.pth`` in this interpreter's
    site-packages or user site. Raises `EngineCheckError` naming the command that installs it."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        return
    from pyruntime.npu_twin import pth

    if not (pth.installed() or pth.installed(pth.user_site_packages())):
        raise EngineCheckError(
            f"no NPU here (torch_npu is not installed) and the NPU twin's {pth.PTH_FILENAME} "
            f"is not in {pth.site_packages()}: run python -m pyruntime.npu_twin.pth install "
            "(tools/vllm_env.sh does it for its environments)")


def check_twin_devices(tp: int) -> None:
    """Where the children run on the twin (no torch_npu), `tp` ranks need `tp` twin devices
    (one per worker, vLLM-Ascend's ``NPUWorker`` sets device ``local_rank``): raises
    `EngineCheckError` naming ``AICPU_TILING_TWIN_DEVICES`` when it holds fewer (or is not a
    device count)."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        return
    from pyruntime.npu_twin.device import DEVICES_ENV, device_count_from_env

    try:
        count = device_count_from_env()
    except ValueError as exc:
        raise EngineCheckError(str(exc)) from exc
    if tp > count:
        raise EngineCheckError(f"--tp {tp} needs {tp} NPUs and the NPU twin has {count}: set "
                               f"{DEVICES_ENV}={tp}")


def child_env(hooked: bool, plugin_path: Path | None = None) -> dict[str, str]:
    """The environment of a child: the twin on (unless torch_npu is installed: an NPU), the hook
    on only for the hooked run, vLLM's engine core in process (it steps the engine the child
    counts; at TP > 1 its executor still starts one worker process per rank), and
    `plugin_path` (`write_hook_plugin`'s folder), when given, first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k not in (HOOK_ENV, "AICPU_TILING_ENGINE")}
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        env[TWIN_ENV] = "1"  # the twin's Triton-Ascend backend is active: vLLM sets HAS_TRITON
        # plain npu tensors, which Dynamo traces (VLLM_COMPILE): explicit here until the
        # twin's default layer is plain
        env.setdefault(*TWIN_TENSORS)
    env[HOOK_ENV] = "1" if hooked else "0"
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if plugin_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(plugin_path)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def hook_plugin_installed() -> bool:
    """Whether vLLM would load the hook's general plugin (`pyruntime.hook.vllm_plugin`) here:
    an ``aicpu_tiling`` entry point in ``vllm.general_plugins`` (a regular or editable install
    of this package)."""
    from importlib.metadata import entry_points

    from pyruntime.hook import vllm_plugin

    return any(ep.name == vllm_plugin.NAME
               for ep in entry_points(group=vllm_plugin.GROUP))


def write_hook_plugin(folder: Path) -> Path:
    """Write into `folder` the distribution metadata an install of this package has for vLLM
    (``aicpu_tiling-VERSION.dist-info`` with pyproject.toml's ``vllm.general_plugins`` entry
    point, `pyruntime.hook.vllm_plugin.register`) and return `folder`. On ``PYTHONPATH`` it
    makes vLLM install the hook in every process it starts, the workers of TP > 1 included,
    where the package runs from a checkout on ``PYTHONPATH`` and is not installed (vLLM's
    ``load_general_plugins``, which ``WorkerWrapperBase.init_worker`` calls before it imports
    the worker class, reads only entry points)."""
    import pyruntime
    from pyruntime.hook import vllm_plugin

    info = folder / f"aicpu_tiling-{pyruntime.__version__}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: aicpu-tiling\nVersion: {pyruntime.__version__}\n")
    (info / "entry_points.txt").write_text(
        f"[{vllm_plugin.GROUP}]\n{vllm_plugin.NAME} = {vllm_plugin.__name__}:register\n")
    return folder


def run_child(model: Path, max_tokens: int, placement: str | None, tp: int, hooked: bool,
              lora: Path | None = None, timeout: float = 1800,
              profile_dir: Path | None = None, compilation: str = "none",
              speculative: str | None = None) -> EngineRun:
    """One engine run in a fresh process of this interpreter (its ``generate`` under
    torch_npu's profiler, output in `profile_dir`, when given); raises `EngineCheckError`
    when the child printed no result."""
    cmd = [sys.executable, "-m", "pyruntime.hook.dryrun.engine_check", "--child", "--model",
           str(model), "--max-tokens", str(max_tokens), "--tp", str(tp),
           "--compilation", compilation]
    if placement is not None:
        cmd += ["--placement", placement]
    if hooked:
        cmd.append("--hooked")
    if lora is not None:
        cmd += ["--lora", str(lora)]
    if speculative is not None:
        cmd += ["--spec", speculative]
    if profile_dir is not None:
        cmd += ["--profile", str(profile_dir)]
    import tempfile

    with tempfile.TemporaryDirectory(prefix="aicpu-tiling-plugin-") as scratch:
        plugin = (write_hook_plugin(Path(scratch))
                  if hooked and not hook_plugin_installed() else None)
        proc = subprocess.run(cmd, env=child_env(hooked, plugin), capture_output=True,
                              text=True, timeout=timeout, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise EngineCheckError(f"the {'hooked' if hooked else 'unhooked'} engine run printed "
                               f"no result (exit {proc.returncode}): {' | '.join(tail)}")
    return EngineRun(**json.loads(lines[-1][len(RESULT_PREFIX):]))


def _lora_rank(adapter: str | Path) -> int:
    return int(json.loads((Path(adapter) / "adapter_config.json").read_text())["r"])


def reference_logits(model: Path, prompt: list[int], generated: list[int], index: int,
                     lora: Path | None = None) -> list:
    """The fp32 HF transformers logits (``[vocab]``) for generated token `index` of a request:
    the model on the CPU in float32 (with the LoRA adapter at `lora` folded in, for a request
    that used it) fed the prompt and ``generated[:index]``."""
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    if lora is not None:
        from .tiny_models import merge_lora

        merge_lora(hf, lora)
    ids = torch.tensor([list(prompt) + list(generated[:index])])
    with torch.no_grad():
        return hf(ids).logits[0, -1].tolist()


def reference_tokens(model: Path, prompt: list[int], max_tokens: int,
                     lora: Path | None = None) -> list[int]:
    """The fp32 HF transformers greedy tokens of one request (the model on the CPU in
    float32, with the LoRA adapter at `lora` folded in for a request that used it), as the
    engine's requests run: `max_tokens` tokens, an end-of-sequence token not stopping it."""
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    if lora is not None:
        from .tiny_models import merge_lora

        merge_lora(hf, lora)
    ids = list(prompt)
    with torch.no_grad():  # argmax step by step: no end-of-sequence stop (ignore_eos)
        for _ in range(max_tokens):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def judge_against_reference(model_dir: Path, run: EngineRun, max_tokens: int,
                            lora: Path | None = None) -> dict[str, Any]:
    """The unhooked run's tokens against the fp32 HF reference's greedy tokens, request by
    request (`judging.judge_request` with the reference as the first run): ``{"identical",
    "divergence": null | {"request", "token", "margin", "tolerance"}, "ok"}``, the first
    divergence only."""
    for r, n in enumerate(max_tokens_of(max_tokens)):
        adapter = lora if lora is not None and r in LORA_REQUESTS else None
        ref = reference_tokens(model_dir, list(PROMPTS[r]), n, adapter)
        found = judging.judge_request(
            r, ref, run.tokens[r], lambda i, r=r, ref=ref, adapter=adapter: reference_logits(
                model_dir, list(PROMPTS[r]), ref, i, adapter), run.dtype)
        if found is not None:
            return {"identical": False, "ok": found.ok, "divergence": {
                "request": found.request, "token": found.token, "margin": found.margin,
                "tolerance": found.tolerance}}
    return {"identical": True, "ok": True, "divergence": None}


def replayed_sizes(run: EngineRun) -> list[int]:
    """The distinct FULL graph sizes (tokens) `run` replayed, ascending."""
    return sorted({tokens for tokens, _, _ in run.replays})


def speculative_report(speculative: str | None, without: EngineRun,
                       with_: EngineRun) -> dict[str, Any] | None:
    """The report's ``speculative`` field: None without it, else the method, its draft
    tokens, the draft tokens each run's verify steps accepted, and ``max_q_len``, the most
    query rows per request of a replayed graph of the hooked run (``num_tokens / num_reqs``
    of its batch descriptor: 1 + the draft tokens for a verify batch)."""
    if speculative is None:
        return None
    config = SPECULATIVE_CONFIGS[speculative]
    return {"method": config["method"],
            "num_speculative_tokens": config["num_speculative_tokens"],
            "accepted_drafts": {"without": without.accepted_drafts,
                                "with": with_.accepted_drafts},
            "max_q_len": max((t // r for t, r, _ in with_.replays if r), default=0)}


def build_report(model: str, tp: int, lora: bool, placement: str | None, without: EngineRun,
                 with_: EngineRun, divergence: judging.Divergence | None,
                 expected_device_layers: list[str] | None = None,
                 profile: dict[str, Any] | None = None,
                 reference: dict[str, Any] | None = None,
                 speculative: str | None = None) -> dict[str, Any]:
    """The serve-check report (`REPORT_FIELDS`) from the two runs, the judged divergence and,
    when computed (`judge_against_reference`), the unhooked run against the fp32 reference
    (which must then be judged equal for a pass); ``profile``: `write_profiles`' ``{"dir",
    "files"}``, or None when not asked; `speculative`: the ``--spec`` method both ran with,
    or None."""
    layers = [{"name": n, "path": "device", "reason": None} for n in sorted(with_.device_layers)]
    layers += [{"name": n, "path": "host", "reason": r}
               for n, r in sorted(with_.host_layers.items())]
    steps_without, steps_with = max(1, without.decode_steps), max(1, with_.decode_steps)
    added: dict[str, float | None] = {"blocking_copies": None, "synchronizes": None}
    if without.blocking_copies is not None and with_.blocking_copies is not None:
        added["blocking_copies"] = (with_.blocking_copies / steps_with
                                    - without.blocking_copies / steps_without)
        added["synchronizes"] = (with_.synchronizes / steps_with
                                 - without.synchronizes / steps_without)
    identical = without.tokens == with_.tokens
    tokens_ok = identical or (divergence is not None and divergence.ok)
    device_layers = len(with_.device_layers)
    moved_ok = device_layers >= 1 and (
        expected_device_layers is None
        or sorted(expected_device_layers) == sorted(with_.device_layers))
    no_added = all(v is None or v <= 0 for v in added.values())
    updates_with = with_.updates / steps_with
    updates_without = without.updates / steps_without
    # 0 updates on the device-path layers: what is left is at most the host-path layers'
    # share of vLLM-Ascend's own updates
    total = device_layers + len(with_.host_layers)
    host_share = len(with_.host_layers) / total if total else 0.0
    updates_ok = updates_with <= updates_without * host_share + 1e-9
    reference_ok = reference is None or reference["ok"]
    replayed = replayed_sizes(with_)
    # the staggered requests must shrink the batch through several graphs
    sizes_ok = len(replayed) >= MIN_REPLAYED_SIZES
    verdict = (tokens_ok and moved_ok and no_added and updates_ok and reference_ok
               and sizes_ok)
    report = {
        "schema": SCHEMA, "version": VERSION, "vllm": with_.vllm,
        "vllm_ascend": with_.vllm_ascend,
        "backend": with_.backend, "model": model, "dtype": with_.dtype, "tp": tp, "lora": lora,
        "speculative": speculative_report(speculative, without, with_),
        "placement": placement or (with_.hook_engine or "").removeprefix("npu-") or None,
        "compilation_mode": with_.compilation_mode,
        "compilation_reason": with_.compilation_reason,
        "graph_sizes": with_.graph_sizes, "replayed_sizes": replayed, "layers": layers,
        "device_layers": device_layers,
        "updates_per_step": {"without": updates_without, "with": updates_with},
        "added_per_step": added, "tokens_identical": identical,
        "divergence": None if divergence is None else {
            "request": divergence.request, "token": divergence.token,
            "margin": divergence.margin, "tolerance": divergence.tolerance},
        "reference": None if reference is None else {
            "identical": reference["identical"], "divergence": reference["divergence"]},
        "tpot_ms": {"without": without.tpot_ms, "with": with_.tpot_ms},
        "profile": profile,
        "ranks": rank_report(without, with_),
        "verdict": "pass" if verdict else "fail",
    }
    assert tuple(report) == REPORT_FIELDS
    return report


def rebased(run: Run) -> Run:
    """`run` with every time moved so its first host step starts at 0 (the two engine runs
    ran one after the other in two processes; side by side they start together)."""
    t0 = min([s.start for s in run.steps] + [t.start for t in run.device_tasks], default=0.0)
    steps = [HostStep(s.start - t0, s.step_s, s.host_s, dict(s.phases),
                      [(p, a - t0, b - t0) for p, a, b in s.spans], s.blocked_s)
             for s in run.steps]
    tasks = [DeviceTask(t.step, t.kind, t.name, t.lane, t.start - t0, t.end - t0)
             for t in run.device_tasks]
    return Run(run.mode, dict(run.workload), steps, tasks, dict(run.counters))


def write_profiles(folder: Path, model: str, without: EngineRun,
                   with_: EngineRun) -> dict[str, Any]:
    """Write what ``aicpu-tiling profile --trace`` writes (`write_profile_folder`: trace.json,
    tables.txt, profile.json) for each profiled run into ``folder/without`` and
    ``folder/with``, and for both side by side (each rebased to start at 0) into `folder`.

    Returns:
        ``{"dir": folder, "files": every file under folder, relative, sorted}`` (torch_npu's
        own output under ``{without,with}/torch_npu/`` included).

    Raises:
        EngineCheckError: a run came back without its profile, or a file cannot be written.
    """
    backend = with_.backend
    runs, lanes = [], {}
    for engine_run in (without, with_):
        name = PROFILE_RUNS[engine_run.hooked][0]
        if engine_run.profile is None:
            raise EngineCheckError(f"the {'hooked' if engine_run.hooked else 'unhooked'} "
                                   "engine run came back without its profile")
        runs.append(Run.from_dict(engine_run.profile["run"]))
        lanes[name] = engine_run.profile["lanes"]
    meta = {"command": f"aicpu-tiling serve-check --profile ({model})", "model": model,
            "backend": backend, "times": PROFILE_TIMES.get(backend, PROFILE_TIMES["npu-twin"]),
            "device_lanes": lanes,
            "trace": {"generator": "aicpu-tiling serve-check --profile"}}
    try:
        for run, engine_run in zip(runs, (without, with_)):
            name = PROFILE_RUNS[engine_run.hooked][0]
            write_profile_folder(Session([run], {**meta, "device_lanes": lanes[name]}),
                                 folder / name)
        write_profile_folder(Session([rebased(r) for r in runs],
                                     {**meta, "side_by_side": "each run rebased to start at 0"}),
                             folder)
    except OSError as exc:
        raise EngineCheckError(f"cannot write the profile in {folder}: "
                               f"{exc.strerror or exc}") from exc
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    return {"dir": str(folder), "files": files}
def rank_report(without: EngineRun, with_: EngineRun) -> list[dict[str, Any]]:
    """The report's ``ranks``: per worker (rank order, from `engine_workers.counts` of both runs)
    ``rank``, ``device``, the hooked run's ``device_layers`` (names), and ``updates_per_step``
    and ``collectives_replayed`` (HCCL collectives run by graph replays over the generate
    call; None off the twin) ``{"without", "with"}``. The report's totals are these summed
    over the ranks (`combine_ranks`)."""
    steps = {"without": max(1, without.decode_steps), "with": max(1, with_.decode_steps)}
    runs = {"without": {r["rank"]: r for r in without.ranks},
            "with": {r["rank"]: r for r in with_.ranks}}
    out = []
    for rank in sorted(set(runs["without"]) | set(runs["with"])):
        both = {k: runs[k].get(rank) for k in runs}
        device = next(r["device"] for r in both.values() if r is not None)
        out.append({
            "rank": rank, "device": device,
            "device_layers": sorted((both["with"] or {}).get("device_layers", {})),
            "updates_per_step": {k: None if r is None else r["updates"] / steps[k]
                                 for k, r in both.items()},
            "collectives_replayed": {k: None if r is None else r["collectives_replayed"]
                                     for k, r in both.items()}})
    return out


def check(model_dir: Path, model: str, max_tokens: int = 10, placement: str | None = None,
          tp: int = 1, lora: Path | None = None,
          expected_device_layers: list[str] | None = None,
          profile_dir: Path | None = None, compilation: str = "none",
          reference: bool = False, speculative: str | None = None) -> dict[str, Any]:
    """Run the engine without and with the hook on `model_dir` (reported as `model`), with the
    LoRA adapter directory `lora` on the requests of `LORA_REQUESTS` when given, with the
    speculative decoding method `speculative` (a `SPECULATIVE_CONFIGS` key) when given; judge
    the tokens, return the report (`build_report`). With `profile_dir`, each run's ``generate``
    runs under torch_npu's profiler and `write_profiles` writes the traces and tables there.
    Raises `EngineCheckError` when a run stops (its first error: exception, message and
    where)."""
    check_twin_autostart()
    check_twin_devices(tp)
    if profile_dir is not None and tp > 1:
        # the profiler runs in the engine's process; at TP > 1 the model runs in the workers'
        raise EngineCheckError("--profile runs at --tp 1 only: the workers of TP > 1 are "
                               "other processes, outside the profiler")

    def torch_npu_dir(hooked: bool) -> Path | None:
        if profile_dir is None:
            return None
        return Path(profile_dir) / PROFILE_RUNS[hooked][0] / TORCH_NPU_DIR

    without = run_child(model_dir, max_tokens, placement, tp, hooked=False, lora=lora,
                        profile_dir=torch_npu_dir(False), compilation=compilation,
                        speculative=speculative)
    if without.error:
        raise EngineCheckError(f"the engine without the hook stopped: {without.error}")
    with_ = run_child(model_dir, max_tokens, placement, tp, hooked=True, lora=lora,
                      profile_dir=torch_npu_dir(True), compilation=compilation,
                      speculative=speculative)
    if with_.error:
        raise EngineCheckError(f"the engine with the hook stopped: {with_.error}")
    if (with_.compilation_mode, with_.compilation_reason) != (
            without.compilation_mode, without.compilation_reason):
        raise EngineCheckError(
            f"the two runs compiled differently: {without.compilation_mode} "
            f"({without.compilation_reason}) without the hook, {with_.compilation_mode} "
            f"({with_.compilation_reason}) with it")
    if with_.hook_state != "active":
        raise EngineCheckError(f"the hook was not active in the hooked run ({with_.hook_state}: "
                               f"{with_.hook_reason})")
    divergence = None
    for r, (a, b) in enumerate(zip(without.tokens, with_.tokens)):
        adapter = lora if lora is not None and r in LORA_REQUESTS else None
        found = judging.judge_request(
            r, a, b, lambda i, r=r, a=a, adapter=adapter: reference_logits(
                model_dir, list(PROMPTS[r]), a, i, adapter), with_.dtype)
        if found is not None:
            divergence = found
            break
    profile = (write_profiles(Path(profile_dir), model, without, with_)
               if profile_dir is not None else None)
    judged = (judge_against_reference(model_dir, without, max_tokens, lora) if reference
              else None)
    return build_report(model, tp, lora is not None, placement, without, with_, divergence,
                        expected_device_layers, profile, judged, speculative)


def eager_reference_check(model_dir: Path, model: str, max_tokens: int = 10) -> dict[str, Any]:
    """vLLM's engine without the hook, in mode NONE with no graphs (`EAGER`), on `model_dir`
    (reported as `model`): its tokens against the fp32 HF reference (`judge_against_reference`).

    What it is for: on the twin, the check that vLLM-Ascend's own eager forward of a model runs
    and gives the reference's tokens where its FULL graphs cannot be captured in mode NONE
    (0.23.0.post1, any model; 0.30.0rc2's MLA), so serve-check cannot run there. The hook has
    nothing to act on without graphs, so it is not run. Returns ``{"model", "vllm",
    "vllm_ascend", "backend", "compilation_mode", "graph_replays", "decode_steps", "tokens",
    "reference"}`` (``reference``: `judge_against_reference`'s). Raises `EngineCheckError`
    when the run stops."""
    check_twin_autostart()
    run = run_child(model_dir, max_tokens, None, 1, hooked=False, compilation=EAGER)
    if run.error:
        raise EngineCheckError(f"the eager engine run stopped: {run.error}")
    return {"model": model, "vllm": run.vllm, "vllm_ascend": run.vllm_ascend,
            "backend": run.backend, "compilation_mode": run.compilation_mode,
            "graph_replays": sum(n for _, _, n in run.replays),
            "decode_steps": run.decode_steps, "tokens": run.tokens,
            "reference": judge_against_reference(model_dir, run, max_tokens)}


if __name__ == "__main__":
    sys.exit(child_main())
