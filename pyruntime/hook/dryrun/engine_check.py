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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import judge as judging

SCHEMA = "aicpu-tiling/serve-check"
VERSION = 1
#: the report's fields, in order (issue 29, item 3)
REPORT_FIELDS = (
    "schema", "version", "vllm", "vllm_ascend", "backend", "model", "dtype", "tp", "lora",
    "placement", "compilation_mode", "compilation_reason", "graph_sizes", "layers",
    "device_layers", "updates_per_step", "added_per_step", "tokens_identical", "divergence",
    "reference", "tpot_ms", "verdict")
#: the child's result line prefix
RESULT_PREFIX = "ENGINE-RUN "
#: the capture sizes (FULL_DECODE_ONLY graphs); the requests' max_tokens differ so the batch
#: shrinks through them
GRAPH_SIZES = (1, 2, 4)
#: prompt token ids of the requests (ids of the tiny models' vocabulary)
PROMPTS = ((5, 17, 99, 300, 41), (7, 250, 3, 88), (120, 64, 9, 401, 33, 12))
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
#: the twin device's counters of host waits (`pyruntime.npu_twin.device`): blocking copies
#: either direction, explicit synchronizes
BLOCKING_COPIES = ("copies_h2d_blocking", "copies_d2h")
SYNCHRONIZES = ("synchronizes",)


class EngineCheckError(RuntimeError):
    """The engine check cannot run here, or a run stopped (says where and why)."""


def host_waits(stats: Any, before: dict | None = None) -> dict[str, int]:
    """The twin device's host waits (`stats`: ``pyruntime.npu_twin.device.device().stats``)
    since the snapshot `before` (``dict(stats)``; None: since the start): ``blocking_copies``
    (`BLOCKING_COPIES`) and ``synchronizes`` (`SYNCHRONIZES`)."""
    before = before or {}
    since = {k: stats[k] - before.get(k, 0) for k in BLOCKING_COPIES + SYNCHRONIZES}
    return {"blocking_copies": sum(since[k] for k in BLOCKING_COPIES),
            "synchronizes": sum(since[k] for k in SYNCHRONIZES)}


def max_tokens_of(max_tokens: int) -> list[int]:
    """Each request's ``max_tokens``: `max_tokens`, and two fewer each, at least 1, so the
    running batch shrinks from len(PROMPTS) to 1 through the capture sizes."""
    return [max(1, max_tokens - 2 * i) for i in range(len(PROMPTS))]


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
    hook_state: str | None = None
    hook_reason: str | None = None
    hook_engine: str | None = None
    device_layers: dict[str, str] = field(default_factory=dict)
    host_layers: dict[str, str] = field(default_factory=dict)
    compilation_mode: str | None = None
    compilation_reason: str | None = None
    error: str | None = None


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


def compilation_arguments(compilation: str
                          ) -> tuple[dict, dict | None, dict[str, str], str | None]:
    """``(compilation_config, additional_config, environ, reason)`` for `compilation`
    (`COMPILATIONS`): the ``vllm.LLM`` arguments and the variables to set before it.
    FULL_DECODE_ONLY graphs of `GRAPH_SIZES` in both; ``none`` sets mode NONE; ``default``
    leaves the mode to vLLM (VLLM_COMPILE) and the compiler to vLLM-Ascend, except where the
    release's default cannot run here: without torch_npu's graph compiler
    (`missing_graph_compiler`) vLLM-Ascend's own ``enable_npugraph_ex`` off, and on a torch
    other than the release's pin (`torch_off_the_release_pin`) vLLM's AOT compile off. `reason`
    says what differs from the release's default (None: nothing)."""
    if compilation not in COMPILATIONS:
        raise EngineCheckError(f"unknown compilation {compilation!r}: one of "
                               f"{', '.join(COMPILATIONS)}")
    config: dict[str, Any] = {"cudagraph_mode": "FULL_DECODE_ONLY",
                              "cudagraph_capture_sizes": list(GRAPH_SIZES)}
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
    return config, additional, environ, "; ".join(reasons) or None


def _engine_run(model: str, max_tokens: int, placement: str | None, tp: int,
                hooked: bool, lora: str | None = None, compilation: str = "none") -> EngineRun:
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
        compilation_arguments(compilation)
    os.environ.update(environ)  # before vLLM reads them (vllm.envs reads at each access)
    llm = vllm.LLM(
        model=model, skip_tokenizer_init=True, dtype=run.dtype, seed=0, tensor_parallel_size=tp,
        max_model_len=256, max_num_seqs=max(GRAPH_SIZES), block_size=128,
        kv_cache_memory_bytes=64 << 20,
        **({"enable_lora": True, "max_lora_rank": _lora_rank(lora), "max_loras": 1}
           if lora else {}),
        **({"additional_config": additional_config} if additional_config else {}),
        compilation_config=compilation_config)
    run.compilation_mode = _compilation_mode_of(llm)
    counted = {"updates": 0, "steps": 0}
    begin = torch.npu.graph_task_update_begin

    def counted_begin(*args, **kwargs):
        counted["updates"] += 1
        return begin(*args, **kwargs)

    torch.npu.graph_task_update_begin = counted_begin
    engine = llm.llm_engine
    step = engine.step

    def counted_step(*args, **kwargs):
        counted["steps"] += 1
        return step(*args, **kwargs)

    engine.step = counted_step
    stats = None
    if run.backend == "npu-twin":
        from pyruntime.npu_twin import device as twin_device

        stats = twin_device.device().stats
    before = dict(stats) if stats is not None else None
    params = [vllm.SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                                  detokenize=False) for n in max_tokens_of(max_tokens)]
    prompts = [{"prompt_token_ids": list(p)} for p in PROMPTS]
    start = time.perf_counter()
    lora_requests = None
    if lora:
        from vllm.lora.request import LoRARequest

        adapter = LoRARequest("tiny", 1, lora)
        lora_requests = [adapter if r in LORA_REQUESTS else None for r in range(len(prompts))]
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora_requests)
    seconds = time.perf_counter() - start
    run.tokens = [list(o.outputs[0].token_ids) for o in outputs]
    # the first step is the prefill; every later engine step decodes one token per request
    run.decode_steps = max(1, counted["steps"] - 1)
    run.updates = counted["updates"]
    if stats is not None:
        waits = host_waits(stats, before)
        run.blocking_copies, run.synchronizes = waits["blocking_copies"], waits["synchronizes"]
    run.tpot_ms = 1000.0 * seconds / max(1, max(len(t) for t in run.tokens))
    if hooked:
        from pyruntime import hook

        status = hook.status()
        run.hook_state, run.hook_engine = status.state, status.engine
        run.hook_reason = status.reason
        run.device_layers = dict(status.device_entries)
        run.host_layers = dict(status.host_path_layers)
    return run


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
    p.add_argument("--compilation", choices=COMPILATIONS, default="none")
    args = p.parse_args(argv)
    try:
        run = _engine_run(args.model, args.max_tokens, args.placement, args.tp, args.hooked,
                          args.lora, args.compilation)
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


def child_env(hooked: bool) -> dict[str, str]:
    """The environment of a child: the twin on (unless torch_npu is installed: an NPU), the hook
    on only for the hooked run, vLLM's engine core in process (its counters are the child's)."""
    env = {k: v for k, v in os.environ.items() if k not in (HOOK_ENV, "AICPU_TILING_ENGINE")}
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        env[TWIN_ENV] = "1"  # the twin's Triton-Ascend backend is active: vLLM sets HAS_TRITON
        # plain npu tensors, which Dynamo traces (VLLM_COMPILE): explicit here until the
        # twin's default layer is plain
        env.setdefault(*TWIN_TENSORS)
    env[HOOK_ENV] = "1" if hooked else "0"
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def run_child(model: Path, max_tokens: int, placement: str | None, tp: int, hooked: bool,
              lora: Path | None = None, timeout: float = 1800,
              compilation: str = "none") -> EngineRun:
    """One engine run in a fresh process of this interpreter; raises `EngineCheckError` when
    the child printed no result."""
    cmd = [sys.executable, "-m", "pyruntime.hook.dryrun.engine_check", "--child", "--model",
           str(model), "--max-tokens", str(max_tokens), "--tp", str(tp),
           "--compilation", compilation]
    if placement is not None:
        cmd += ["--placement", placement]
    if hooked:
        cmd.append("--hooked")
    if lora is not None:
        cmd += ["--lora", str(lora)]
    proc = subprocess.run(cmd, env=child_env(hooked), capture_output=True, text=True,
                          timeout=timeout, check=False)
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


def build_report(model: str, tp: int, lora: bool, placement: str | None, without: EngineRun,
                 with_: EngineRun, divergence: judging.Divergence | None,
                 expected_device_layers: list[str] | None = None,
                 reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """The serve-check report (`REPORT_FIELDS`) from the two runs, the judged divergence and,
    when computed (`judge_against_reference`), the unhooked run against the fp32 reference
    (which must then be judged equal for a pass)."""
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
    verdict = tokens_ok and moved_ok and no_added and updates_ok and reference_ok
    report = {
        "schema": SCHEMA, "version": VERSION, "vllm": with_.vllm,
        "vllm_ascend": with_.vllm_ascend,
        "backend": with_.backend, "model": model, "dtype": with_.dtype, "tp": tp, "lora": lora,
        "placement": placement or (with_.hook_engine or "").removeprefix("npu-") or None,
        "compilation_mode": with_.compilation_mode,
        "compilation_reason": with_.compilation_reason,
        "graph_sizes": list(GRAPH_SIZES), "layers": layers, "device_layers": device_layers,
        "updates_per_step": {"without": updates_without, "with": updates_with},
        "added_per_step": added, "tokens_identical": identical,
        "divergence": None if divergence is None else {
            "request": divergence.request, "token": divergence.token,
            "margin": divergence.margin, "tolerance": divergence.tolerance},
        "reference": None if reference is None else {
            "identical": reference["identical"], "divergence": reference["divergence"]},
        "tpot_ms": {"without": without.tpot_ms, "with": with_.tpot_ms},
        "verdict": "pass" if verdict else "fail",
    }
    assert tuple(report) == REPORT_FIELDS
    return report


def check(model_dir: Path, model: str, max_tokens: int = 8, placement: str | None = None,
          tp: int = 1, lora: Path | None = None,
          expected_device_layers: list[str] | None = None,
          compilation: str = "none", reference: bool = False) -> dict[str, Any]:
    """Run the engine without and with the hook on `model_dir` (reported as `model`), with the
    LoRA adapter directory `lora` on the requests of `LORA_REQUESTS` when given; judge the
    tokens, return the report (`build_report`). Raises `EngineCheckError` when a run stops
    (its first error: exception, message and where)."""
    check_twin_autostart()
    without = run_child(model_dir, max_tokens, placement, tp, hooked=False, lora=lora,
                        compilation=compilation)
    if without.error:
        raise EngineCheckError(f"the engine without the hook stopped: {without.error}")
    with_ = run_child(model_dir, max_tokens, placement, tp, hooked=True, lora=lora,
                      compilation=compilation)
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
    judged = (judge_against_reference(model_dir, without, max_tokens, lora) if reference
              else None)
    return build_report(model, tp, lora is not None, placement, without, with_, divergence,
                        expected_device_layers, judged)


if __name__ == "__main__":
    sys.exit(child_main())
