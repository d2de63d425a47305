"""``aicpu-tiling serve-check``: vLLM's whole engine on the installed vLLM-Ascend, without and
with the hook.

Runs ``vllm.LLM`` on a model directory (or a tiny random model it writes itself) twice, each
in a fresh process, without and with ``AICPU_TILING=1``: same prompts, greedy, FULL_DECODE_ONLY
graphs, requests with different max_tokens so the batch shrinks through the capture sizes; on
the NPU twin where there is no NPU. It reports which layers took the device path, the graph
task updates per step without and with the hook, the blocking copies and synchronizes the
hook adds per step, whether the tokens are identical (or, at the first divergence, the fp32
reference's margin and the tolerance), with ``--tiny`` the unhooked run's tokens against that
fp32 reference, and the time per output token. ``--compilation default`` runs the release's
default compilation instead of mode NONE. With --profile DIR each run's generate call runs
under torch_npu's profiler and DIR receives, per run and side by side, the Chrome trace and
tables of profile --trace. Exit 0 only when the verdict is pass (at least one
device-path layer, no task updates on them, nothing added, the tokens judged equal); 1
otherwise; 2 when it cannot run here (no vLLM or vLLM-Ascend, no
transformers for the reference, a run that stopped).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from pyruntime.hook.dryrun.engine_check import SPECULATIVE_CONFIGS
from pyruntime.hook.dryrun.tiny_models import CONFIGS, LORA_MODELS

from ._common import FORCE_HELP, CliError
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
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="run each generate call under torch_npu's profiler (the twin's on "
                        "the twin) and write DIR/{without,with}/ and DIR/: trace.json, "
                        "tables.txt, profile.json (and torch_npu's own output)")
    p.add_argument("--force", action="store_true",
                   help=FORCE_HELP + "; for --profile: a DIR that is not empty (serve-check's "
                        "own files and folders in it are replaced, nothing else)")
    p.add_argument("--compilation", choices=("none", "default"), default="none",
                   help="vLLM's compilation: none (mode NONE, the default) or default (the "
                        "release's default: VLLM_COMPILE with vLLM-Ascend's compiler; the "
                        "report's compilation_mode and compilation_reason say what ran)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)
    return p


def _check_arguments(args: argparse.Namespace) -> None:
    MAX_TOKENS.check("--max-tokens", args.max_tokens)
    TP.check("--tp", args.tp)
    if args.lora and args.tiny not in LORA_MODELS:
        raise CliError(f"--lora writes a tiny adapter for --tiny {' or '.join(LORA_MODELS)} only "
                       "(its attention projections' names and shapes)")
    if args.model is not None and not (Path(args.model) / "config.json").is_file():
        raise CliError(f"--model {args.model}: no config.json there")
    if args.profile is not None:
        check_profile_dir(Path(args.profile), force=args.force)


#: what ``--profile DIR`` writes in DIR (`engine_check.write_profiles`): replaced with --force
PROFILE_ENTRIES = ("without", "with", "trace.json", "tables.txt", "profile.json")


def check_profile_dir(folder: Path, *, force: bool) -> None:
    """Refuse, before any work, a ``--profile`` folder that cannot take the profile: its parent
    missing, a file, or a folder that is not empty (without ``force``). Changes nothing
    (`clear_profile_entries` does, once the run can start).

    Raises:
        CliError: one line naming --profile, the folder and what to do.
    """
    if not folder.parent.is_dir():
        raise CliError(f"--profile {folder}: the folder {folder.parent} does not exist")
    if folder.exists() and not folder.is_dir():
        raise CliError(f"--profile {folder}: not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise CliError(f"--profile {folder}: the folder is not empty (choose an empty or new "
                       "one, or pass --force to replace serve-check's files there)")


def clear_profile_entries(folder: Path) -> None:
    """Remove what an earlier ``--profile`` wrote in `folder` (`PROFILE_ENTRIES`), so a stale
    torch_npu output cannot be read as this run's; anything else in it is left alone."""
    import shutil

    for name in PROFILE_ENTRIES:
        entry = folder / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()


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

    if args.profile is not None:
        clear_profile_entries(Path(args.profile))

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
            report = engine_check.check(
                model_dir, name, max_tokens=args.max_tokens, placement=args.placement,
                tp=args.tp, lora=adapter,
                profile_dir=Path(args.profile).resolve() if args.profile else None,
                compilation=args.compilation, reference=args.tiny is not None,
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
    if report.get("compilation_reason"):
        lines.append(f"  compilation: {report['compilation_reason']}")
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
    if report["tp"] > 1:
        for rank in report["ranks"]:
            ups, replayed = rank["updates_per_step"], rank["collectives_replayed"]
            lines.append(f"  rank {rank['rank']} ({rank['device']}): "
                         f"{len(rank['device_layers'])} layers on the device path, task "
                         f"updates per step {ups['without']:g} without / {ups['with']:g} with, "
                         f"collectives run by replays {replayed['without']} / "
                         f"{replayed['with']}")
    ref = report["reference"]
    if ref is not None:
        lines.append("tokens without the hook vs the fp32 reference: " + (
            "identical" if ref["identical"] else
            f"request {ref['divergence']['request']} differs from token "
            f"{ref['divergence']['token']}"))
    lines.append(f"time per output token: {tpot['without']:.1f} ms without, "
                 f"{tpot['with']:.1f} ms with the hook")
    if report.get("profile"):
        lines.append(f"profile: {report['profile']['dir']} "
                     f"({len(report['profile']['files'])} files; trace.json side by side, "
                     "without/ and with/ per run)")
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines)
