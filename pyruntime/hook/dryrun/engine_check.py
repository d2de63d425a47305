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
#: the report's fields, in order (issue 29, item 3; ``speculative`` and ``replayed_sizes``
#: from item 4)
REPORT_FIELDS = (
    "schema", "version", "vllm", "vllm_ascend", "backend", "model", "dtype", "tp", "lora",
    "speculative", "placement", "compilation_mode", "graph_sizes", "replayed_sizes", "layers", "device_layers",
    "updates_per_step", "added_per_step", "tokens_identical", "divergence", "tpot_ms",
    "verdict")
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
#: the compilation mode the check runs: NONE (0). vLLM's default VLLM_COMPILE stops in Dynamo
#: on the twin's tensors (docs/hook-in-vllm-ascend.md, "The engine check")
COMPILATION_MODE = "NONE"
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
    error: str | None = None


def _count_replays(replays: dict[tuple[int, int], int]) -> None:
    """Count each FULL graph replay by its batch descriptor's (num_tokens, num_reqs) in
    `replays`: wraps vLLM-Ascend's ``ACLGraphWrapper.__call__`` (``vllm_ascend/compilation/
    acl_graph.py``: a call whose forward context's ``cudagraph_runtime_mode`` is the wrapper's
    own, not NONE, captures the descriptor's graph the first time and replays it after), so
    after the engine's capture every such call is a replay. Wraps what is there (the hook's
    wrapper in a hooked run), at class level: the model's wrapper is an instance of it."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context
    from vllm_ascend.compilation import acl_graph

    call = acl_graph.ACLGraphWrapper.__call__

    def counted_call(self, *args, **kwargs):
        context = get_forward_context()
        mode = context.cudagraph_runtime_mode
        if mode != CUDAGraphMode.NONE and mode == self.runtime_mode:
            descriptor = context.batch_descriptor
            key = (int(descriptor.num_tokens), int(descriptor.num_reqs or 0))
            replays[key] = replays.get(key, 0) + 1
        return call(self, *args, **kwargs)

    acl_graph.ACLGraphWrapper.__call__ = counted_call


def _engine_run(model: str, max_tokens: int, placement: str | None, tp: int,
                hooked: bool, lora: str | None = None,
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
    llm = vllm.LLM(
        model=model, skip_tokenizer_init=True, dtype=run.dtype, seed=0, tensor_parallel_size=tp,
        max_model_len=256, max_num_seqs=MAX_SEQS, block_size=128,
        kv_cache_memory_bytes=64 << 20,
        **({"enable_lora": True, "max_lora_rank": _lora_rank(lora), "max_loras": 1}
           if lora else {}),
        **({"speculative_config": speculative_config(speculative, model)}
           if speculative else {}),
        compilation_config={"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY",
                            "cudagraph_capture_sizes": graph_sizes(speculative)})
    run.graph_sizes = sorted(
        llm.llm_engine.vllm_config.compilation_config.cudagraph_capture_sizes or [])
    replays: dict[tuple[int, int], int] = {}
    _count_replays(replays)
    counted = {"updates": 0, "steps": 0, "accepted": 0}
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
    process_outputs = engine.output_processor.process_outputs

    def counted_outputs(engine_core_outputs, *args, **kwargs):
        # host lists: a verify step gives a request 1 + its accepted drafts tokens
        counted["accepted"] += sum(max(0, len(o.new_token_ids) - 1)
                                   for o in engine_core_outputs)
        return process_outputs(engine_core_outputs, *args, **kwargs)

    engine.output_processor.process_outputs = counted_outputs
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
    run.replays = [[t, r, n] for (t, r), n in sorted(replays.items())]
    run.accepted_drafts = counted["accepted"] if speculative else None
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
    p.add_argument("--spec", default=None, choices=tuple(SPECULATIVE_CONFIGS),
                   help="speculative decoding method")
    args = p.parse_args(argv)
    try:
        run = _engine_run(args.model, args.max_tokens, args.placement, args.tp, args.hooked,
                          args.lora, args.spec)
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
    env[HOOK_ENV] = "1" if hooked else "0"
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def run_child(model: Path, max_tokens: int, placement: str | None, tp: int, hooked: bool,
              lora: Path | None = None, timeout: float = 1800,
              speculative: str | None = None) -> EngineRun:
    """One engine run in a fresh process of this interpreter; raises `EngineCheckError` when
    the child printed no result."""
    cmd = [sys.executable, "-m", "pyruntime.hook.dryrun.engine_check", "--child", "--model",
           str(model), "--max-tokens", str(max_tokens), "--tp", str(tp)]
    if placement is not None:
        cmd += ["--placement", placement]
    if hooked:
        cmd.append("--hooked")
    if lora is not None:
        cmd += ["--lora", str(lora)]
    if speculative is not None:
        cmd += ["--spec", speculative]
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
                 speculative: str | None = None) -> dict[str, Any]:
    """The serve-check report (`REPORT_FIELDS`) from the two runs and the judged divergence
    (`speculative`: the ``--spec`` method both ran with, or None)."""
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
    replayed = replayed_sizes(with_)
    # the staggered requests must shrink the batch through several graphs
    sizes_ok = len(replayed) >= MIN_REPLAYED_SIZES
    verdict = tokens_ok and moved_ok and no_added and updates_ok and sizes_ok
    report = {
        "schema": SCHEMA, "version": VERSION, "vllm": with_.vllm,
        "vllm_ascend": with_.vllm_ascend,
        "backend": with_.backend, "model": model, "dtype": with_.dtype, "tp": tp, "lora": lora,
        "speculative": speculative_report(speculative, without, with_),
        "placement": placement or (with_.hook_engine or "").removeprefix("npu-") or None,
        "compilation_mode": COMPILATION_MODE,
        "graph_sizes": with_.graph_sizes, "replayed_sizes": replayed, "layers": layers, "device_layers": device_layers,
        "updates_per_step": {"without": updates_without, "with": updates_with},
        "added_per_step": added, "tokens_identical": identical,
        "divergence": None if divergence is None else {
            "request": divergence.request, "token": divergence.token,
            "margin": divergence.margin, "tolerance": divergence.tolerance},
        "tpot_ms": {"without": without.tpot_ms, "with": with_.tpot_ms},
        "verdict": "pass" if verdict else "fail",
    }
    assert tuple(report) == REPORT_FIELDS
    return report


def check(model_dir: Path, model: str, max_tokens: int = 10, placement: str | None = None,
          tp: int = 1, lora: Path | None = None,
          expected_device_layers: list[str] | None = None,
          speculative: str | None = None) -> dict[str, Any]:
    """Run the engine without and with the hook on `model_dir` (reported as `model`), with the
    LoRA adapter directory `lora` on the requests of `LORA_REQUESTS` when given, with the
    speculative decoding method `speculative` (a `SPECULATIVE_CONFIGS` key) when given; judge the
    tokens, return the report (`build_report`). Raises `EngineCheckError` when a run stops
    (its first error: exception, message and where)."""
    check_twin_autostart()
    without = run_child(model_dir, max_tokens, placement, tp, hooked=False, lora=lora,
                        speculative=speculative)
    if without.error:
        raise EngineCheckError(f"the engine without the hook stopped: {without.error}")
    with_ = run_child(model_dir, max_tokens, placement, tp, hooked=True, lora=lora,
                      speculative=speculative)
    if with_.error:
        raise EngineCheckError(f"the engine with the hook stopped: {with_.error}")
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
    return build_report(model, tp, lora is not None, placement, without, with_, divergence,
                        expected_device_layers, speculative)


if __name__ == "__main__":
    sys.exit(child_main())
