"""``aicpu-tiling serve-check``: vLLM's whole engine on the installed vLLM-Ascend, without and
with the hook.

Runs ``vllm.LLM`` on a model directory (or a tiny random model it writes itself) twice, each
in a fresh process, without and with ``AICPU_TILING=1``: same prompts, greedy, FULL_DECODE_ONLY
graphs, requests with different max_tokens so the batch shrinks through the capture sizes; on
the NPU twin where there is no NPU. It reports which layers took the device path, the graph
task updates per step without and with the hook, the blocking copies and synchronizes the
hook adds per step, whether the tokens are identical (or, at the first divergence, the fp32
reference's margin and the tolerance), and the time per output token. Exit 0 only when the
verdict is pass (at least one device-path layer, no task updates on them, nothing added, the
tokens judged equal); 1 otherwise; 2 when it cannot run here (no vLLM or vLLM-Ascend, no
transformers for the reference, a run that stopped).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from pyruntime.hook.dryrun.engine_check import SPECULATIVE_CONFIGS
from pyruntime.hook.dryrun.tiny_models import CONFIGS, LORA_MODELS

from ._common import CliError
from ._limits import Limit

MAX_TOKENS = Limit("generated tokens per request", 5, 128,
                   "the check's model length is 256 tokens, its prompts up to 6")
TP = Limit("tensor-parallel ranks", 1, 8, "one node of NPUs")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``serve-check``."""
    p = sub.add_parser(
        "serve-check",
        help="run vLLM's engine without and with the hook and compare",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="DIR", default=None,
                        help="a model directory (config.json and weights)")
    source.add_argument("--tiny", choices=tuple(CONFIGS), default=None,
                        help="write this tiny random model (fixed seed, no download) and run it")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--lora", action="store_true",
                   help="write a tiny random LoRA adapter and mix requests with and without "
                        "it (--tiny qwen3)")
    p.add_argument("--placement", choices=("graph", "pre-replay"), default=None,
                   help="where the tiling task runs (default: the placement the hook would use)")
    p.add_argument("--spec", choices=tuple(SPECULATIVE_CONFIGS), default=None,
                   help="speculative decoding in both runs, 2 draft tokens (verify steps of "
                        "up to 3 query rows per request): ngram, vLLM's prompt-lookup proposer "
                        "(ragged drafts: its verify steps run outside the graphs); self-draft, "
                        "the model as its own draft model (every verify step replays a graph)")
    p.add_argument("--max-tokens", type=int, default=10,
                   help="tokens the longest request generates (each next request one fewer, "
                        "so the batch shrinks through the capture sizes)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)
    return p


def _check_arguments(args: argparse.Namespace) -> None:
    MAX_TOKENS.check("--max-tokens", args.max_tokens)
    TP.check("--tp", args.tp)
    if args.tp != 1:
        raise CliError(f"--tp {args.tp}: only TP 1 runs yet (TP 2 needs the twin's two "
                       "devices and workers, issue 29 item 4)")
    if args.lora and args.tiny not in LORA_MODELS:
        raise CliError(f"--lora writes a tiny adapter for --tiny {' or '.join(LORA_MODELS)} only "
                       "(its attention projections' names and shapes)")
    if args.model is not None and not (Path(args.model) / "config.json").is_file():
        raise CliError(f"--model {args.model}: no config.json there")


def run(args: argparse.Namespace) -> int:
    import importlib.util

    _check_arguments(args)
    for module, what in (("vllm", "vLLM"), ("vllm_ascend", "vLLM-Ascend"),
                         ("transformers", "transformers (the fp32 reference)")):
        if importlib.util.find_spec(module) is None:
            raise CliError(f"{what} is not installed here: run serve-check where vLLM and "
                           "vLLM-Ascend are (tools/vllm_env.sh RELEASE makes such an "
                           "environment)")
    from pyruntime.hook.dryrun import engine_check, tiny_models

    with tempfile.TemporaryDirectory(prefix="aicpu-tiling-serve-check-") as scratch:
        if args.tiny is not None:
            try:
                model_dir = tiny_models.write(args.tiny, Path(scratch) / args.tiny)
            except tiny_models.TinyModelError as exc:
                raise CliError(str(exc)) from exc
            name = args.tiny
        else:
            model_dir, name = Path(args.model), str(args.model)
        adapter = (tiny_models.write_lora(args.tiny, Path(scratch) / f"{args.tiny}-lora")
                   if args.lora else None)
        try:
            report = engine_check.check(model_dir, name, max_tokens=args.max_tokens,
                                        placement=args.placement, tp=args.tp, lora=adapter,
                                        speculative=args.spec)
        except engine_check.EngineCheckError as exc:
            raise CliError(str(exc)) from exc
    print(json.dumps(report, indent=1) if args.json else render(report))
    return 0 if report["verdict"] == "pass" else 1


def render(report: dict) -> str:
    """The report as text lines."""
    head = (f"vLLM {report['vllm']}, vLLM-Ascend {report['vllm_ascend']} on "
            f"{report['backend']}: model {report['model']} ({report['dtype']}), TP "
            f"{report['tp']}, placement {report['placement']}, compilation "
            f"{report['compilation_mode']}, graphs {report['graph_sizes']}")
    lines = [head, f"graph sizes replayed: {report['replayed_sizes']}"]
    spec = report["speculative"]
    if spec is not None:
        accepted = spec["accepted_drafts"]
        lines.append(f"speculative decoding {spec['method']}, {spec['num_speculative_tokens']} "
                     f"draft tokens: up to {spec['max_q_len']} query rows per request in a "
                     f"replayed graph, {accepted['without']} drafts accepted without the hook, "
                     f"{accepted['with']} with it")
    for layer in report["layers"]:
        reason = f" ({layer['reason']})" if layer["reason"] else ""
        lines.append(f"  {layer['name']}: {layer['path']}{reason}")
    ups, added, tpot = report["updates_per_step"], report["added_per_step"], report["tpot_ms"]
    lines.append(f"graph task updates per step: {ups['without']:g} without the hook, "
                 f"{ups['with']:g} with it")
    if added["blocking_copies"] is None:
        lines.append("added blocking copies / synchronizes per step: not counted here")
    else:
        lines.append(f"added per step: {added['blocking_copies']:g} blocking copies, "
                     f"{added['synchronizes']:g} synchronizes")
    div = report["divergence"]
    if report["tokens_identical"]:
        lines.append("tokens: identical")
    elif div is not None:
        margin = "not the reference's top two" if div["margin"] is None else (
            f"reference margin {div['margin']:.4g} (tolerance {div['tolerance']:.4g})")
        lines.append(f"tokens: request {div['request']} differs from token {div['token']}: "
                     f"{margin}")
    lines.append(f"time per output token: {tpot['without']:.1f} ms without, "
                 f"{tpot['with']:.1f} ms with the hook")
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines)
