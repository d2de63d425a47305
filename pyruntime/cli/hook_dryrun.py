"""``aicpu-tiling hook-dryrun``: the hook inside the installed vLLM-Ascend's own classes.

Runs vLLM-Ascend's own metadata builder, attention implementation and ACL graph wrapper over a
small decoder under FULL_DECODE_ONLY twice, each in a fresh process: without the hook (vLLM-
Ascend's host-update path) and with it (the real engine), on the NPU twin where there is no
NPU. It reports which layers took the device path, the graph task updates per step before
and after, and the largest error against a float64 reference. Exit 0 only when at least one
layer moved, no layer of ours was updated and the error is within tolerance; 1 otherwise; 2
when it cannot run here (no vLLM or vLLM-Ascend, or the test fixture package instead of the
real one).
"""

from __future__ import annotations

import argparse
import json

from ._common import CliError

#: the most graphs ``--captured-sizes`` captures (vLLM's default capture list has 35 sizes
#: up to 256 tokens; the dry run's buckets are 1..N tokens)
MAX_CAPTURED_SIZES = 64


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``hook-dryrun``."""
    p = sub.add_parser(
        "hook-dryrun",
        help="run the vLLM-Ascend hook inside vLLM-Ascend's own classes",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument("--placement", choices=("graph", "pre-replay"), default="graph",
                   help="where the tiling task runs (default: graph)")
    p.add_argument("--steps", type=int, default=6,
                   help="decode steps replayed after capture (default: 6)")
    p.add_argument("--spec-tokens", type=int, default=0,
                   help="speculative decode: each request verifies 1 + N tokens (default: 0)")
    from pyruntime.hook.dryrun.models import MODELS

    p.add_argument("--model", choices=tuple(MODELS), default="mixed",
                   help="the layer set: mixed (default: plain, windowed, soft-capped and sink "
                        "layers), or one from a real config: gpt-oss (window 128 / full, sinks), "
                        "gemma2 (window 4096 / full, soft cap 50), gemma3 (window 1024 on 5 "
                        "of 6 layers), c8 (Qwen3-8B-shaped layers with vLLM-Ascend's int8 "
                        "KV cache in its NZ layout, through AscendC8AttentionBackendImpl), "
                        "mla (DeepSeek-V3-shaped MLA layers through "
                        "vLLM-Ascend's AscendMLAImpl; hooked run only: the twin does not model "
                        "its FIA v2 MLA call)")
    p.add_argument("--captured-sizes", type=int, default=None, metavar="N",
                   help=f"capture N token buckets (1..N tokens per step, N <= "
                        f"{MAX_CAPTURED_SIZES}) instead of the set's own; the report's "
                        "host_waits_per_step_before/after count the blocking copies and "
                        "synchronizes per replayed step without and with the hook")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    from pyruntime.hook import dryrun

    if args.steps < 1:
        raise CliError("--steps must be at least 1")
    if not 0 <= args.spec_tokens <= 3:
        raise CliError("--spec-tokens must be 0 to 3 (the dry run's buckets hold 8 tokens)")
    if args.captured_sizes is not None and not 1 <= args.captured_sizes <= MAX_CAPTURED_SIZES:
        raise CliError(f"--captured-sizes must be 1 to {MAX_CAPTURED_SIZES} (each is one "
                       "graph captured on the twin)")
    try:
        report = dryrun.dry_run(model=args.model, placement=args.placement, steps=args.steps,
                                spec_tokens=args.spec_tokens,
                                captured_sizes=args.captured_sizes)
    except dryrun.DryRunError as exc:
        raise CliError(str(exc)) from exc
    if args.model == "mla":
        return _print_mla(args, report)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        spec = f", {report['spec_tokens']} speculative tokens" if report["spec_tokens"] else ""
        print(f"vLLM-Ascend {report['vllm_ascend']} on {report['device']}, layer set "
              f"{report['model']}, placement {report['placement']}{spec}, {report['steps']} "
              "decode steps after capture")
        for layer in report["layers"]:
            reason = f" ({layer['reason']})" if layer["reason"] else ""
            if layer.get("logits_soft_cap") and layer["path"] == "device":
                reason += f" (logits soft cap {layer['logits_soft_cap']:g}, applied)"
            if layer.get("sinks") and layer["path"] == "device":
                reason += f" (attention sinks, applied; captured by {layer['entry']})"
            if layer.get("sliding_window") and layer["path"] == "device":
                reason += (f" (sliding window {layer['sliding_window']}: the model's W keys, "
                           f"past the window on {layer['steps_past_window']} steps)")
            if layer.get("kv_cache_dtype") == "int8" and layer["path"] == "device":
                reason += " (int8 KV cache, NZ layout, read in place with its scales)"
            print(f"  {layer['name']}: {layer['path']}{reason}")
        print(f"graph task updates per step: {report['updates_per_step_before']:g} without the "
              f"hook; with it {report['updates_per_step_after']:g} on the device-path layers "
              f"and {report['updates_per_step_host_layers']:g} on the host-path ones")
        print(f"max relative error against float64: {report['max_rel_err']:.2e} (tolerance "
              f"{report['tolerance']:g}; without the hook {report['max_rel_err_before']:.2e})")
        if report.get("steps_with_split_units") is not None:
            print(f"steps whose tiling split a unit (the combine ran): "
                  f"{report['steps_with_split_units']} of {report['steps']}")
        if report.get("tilings_per_graph") is not None:
            print(f"tilings per graph (one per distinct window): {report['tilings_per_graph']}, "
                  f"planned by {report['tiling_launches_per_step']:g} AI-CPU launch per step")
        before, after = (report.get(f"host_waits_per_step_{k}") for k in ("before", "after"))
        if before is not None and after is not None:
            print(f"host waits per replayed step with {report['captured_sizes']} captured "
                  "graphs (blocking H2D copies / D2H copies / synchronizes): without the hook "
                  + " / ".join(f"{before[k]:g}" for k in before) + "; with it "
                  + " / ".join(f"{after[k]:g}" for k in before))
        print("verdict: " + ("pass" if report["ok"] else "fail"))
    return 0 if report["ok"] else 1


def _print_mla(args: argparse.Namespace, report: dict) -> int:
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        spec = f", {report['spec_tokens']} speculative tokens" if report["spec_tokens"] else ""
        print(f"vLLM-Ascend {report['vllm_ascend']} on {report['device']}, MLA, placement "
              f"{report['placement']}{spec}, {report['steps']} decode steps after capture")
        for layer in report["layers"]:
            reason = f" ({layer['reason']})" if layer["reason"] else ""
            print(f"  {layer['name']}: {layer['path']}{reason}")
        print(f"graph task updates per step: {report['updates_per_step_after']:g} "
              f"({report['updates_skipped']} MLA update calls skipped)")
        print(f"max relative error against float64 absorbed MLA: {report['max_rel_err']:.2e} "
              f"(tolerance {report['tolerance']:g}; without the rope part "
              f"{report['rope_distance']:.2e})")
        print(f"steps whose tiling split a unit (the combine ran): "
              f"{report['steps_with_split_units']} of {report['steps']}")
        print("verdict: " + ("pass" if report["ok"] else "fail"))
    return 0 if report["ok"] else 1
