#!/usr/bin/env python3
"""Compile the Triton AI Core kernels for an Ascend 910B as far as the public toolchain goes.

Stages (each reported as reached, with the exact error where it stops):
  1. ttir       Triton-Ascend's front end: our kernel source to Triton IR
  2. ttadapter  Triton-Ascend's adapter (``triton-adapter-opt``): Triton IR to linalg/HIVM MLIR
  3. npubin     Triton-Ascend's own binary stage (needs CANN: ``ASCEND_HOME_PATH``, torch_npu)
  4. bishengir  ``bishengir-compile`` from the ``ascendnpu-ir`` wheel on the stage-2 MLIR with
                ``--target=Ascend910B3 --enable-hfusion-compile=true --enable-hivm-compile=true
                --enable-triton-kernel-compile=true``; it ends by handing the HIVM module to
                ``hivmc``, which no public wheel ships.

``triton`` (upstream, the interpreter the tests use) and ``triton-ascend`` both install the
module ``triton``, so the compile runs in its OWN virtual environment (created on first use,
``--venv``, default ``~/.cache/aicpu-tiling/ascend-venv``) and never in the project's. This
script runs twice: in the project environment it computes the kernels' compile-time constants
(from `pyruntime.kernels.triton_launch`, so the tiling ABI is read, never typed), then it runs
itself with ``--inner`` in the venv, which imports only ``triton`` and the kernel source file.

Kernels: the attention kernel seven times (plain, with the logits soft cap, ``USE_SOFT_CAP``,
with attention sinks, ``USE_SINKS``, with the sliding window, ``USE_WINDOW``, and with the
window and sinks together, gpt-oss's windowed layers, with the int8 KV cache, ``KV_INT8``, and
with the int8 KV cache in vLLM-Ascend's NZ layout, ``KV_INT8`` and ``KV_NZ``; reported as
``paged_attention_kernel``, ``paged_attention_kernel[soft_cap]``,
``paged_attention_kernel[sinks]``, ``paged_attention_kernel[window]``,
``paged_attention_kernel[window+sinks]``, ``paged_attention_kernel[int8_kv]`` and
``paged_attention_kernel[int8_kv_nz]``) and the combine
kernel twice (``attention_combine_kernel`` and ``attention_combine_kernel[sinks]``; neither the
soft cap nor the window touches it).

With ``--mla`` it compiles the MLA decode kernel instead (``pyruntime/kernels/triton_mla.py``,
``mla_decode_kernel``, at one TP-8 rank of DeepSeek-V3: 16 heads, kv_lora_rank 512, rope 64)
and the combine it uses, ``attention_combine_kernel`` at ``HEAD_DIM = kv_lora_rank``.

Usage:
    python tools/ascend_compile.py [--venv DIR] [--out DIR] [--dtype fp16|bf16] [--mla] [--json]
Exit status: 0 when the stages ran as far as they can here (bishengir-compile started and
stopped only for lack of ``hivmc``, or produced a binary), 1 otherwise, 2 when the venv cannot
be set up (no network, no wheel for this platform).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
KERNEL_SOURCE = ROOT / "pyruntime" / "kernels" / "triton_attention.py"
MLA_SOURCE = ROOT / "pyruntime" / "kernels" / "triton_mla.py"
PACKAGES = ("triton-ascend==3.2.0", "pybind11", "ascendnpu-ir==1.2.0")
DEFAULT_VENV = pathlib.Path.home() / ".cache" / "aicpu-tiling" / "ascend-venv"
TARGET_ARCH = "Ascend910B3"
BISHENGIR_FLAGS = ("--target=Ascend910B3", "--enable-hfusion-compile=true",
                   "--enable-hivm-compile=true", "--enable-triton-kernel-compile=true")

# A model shape as vLLM-Ascend would capture it: 32 query heads, 8 kv heads (group 4),
# head_dim 128, cache block 128, 24 cores (the 910B3's cube cores); q_tile from --q-tile.
MODEL_SHAPE = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 128,
               "max_batch": 64, "max_tokens": 256, "max_blocks_per_req": 256, "num_cores": 24}


# ------------------------------------------------------------------ outer: project environment


def venv_python(venv: pathlib.Path) -> pathlib.Path:
    return venv / "bin" / "python"


def ensure_venv(venv: pathlib.Path, log) -> float:
    """Create the venv and install the Ascend toolchain once; returns the seconds it took."""
    start = time.perf_counter()
    if not venv_python(venv).exists():
        log(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = subprocess.run([str(venv_python(venv)), "-c",
                            "import triton.backends.ascend, ascendnpuir"], check=False,
                           capture_output=True)
    if probe.returncode != 0:
        log(f"installing {' '.join(PACKAGES)} into {venv}")
        subprocess.run([str(venv_python(venv)), "-m", "pip", "install", "-q", *PACKAGES],
                       check=True)
    return time.perf_counter() - start


def kernel_specs(dtype: str, q_tile: int | None) -> list[dict]:
    """Signatures and constants of both kernels for MODEL_SHAPE (needs the project env)."""
    sys.path.insert(0, str(ROOT))
    from pyruntime import tiling
    from pyruntime.kernels import triton_launch

    params = tiling.TilingParams(**MODEL_SHAPE, q_tile=q_tile)
    consts = triton_launch.constants(params, True)
    shapes = triton_launch.block_shapes(params)
    store = f"*{dtype}"
    attention = {
        "name": "paged_attention_kernel",
        "signature": {"tiling": "*i32", "step_epoch": "*i32", "query": store, "key_cache": store,
                      "value_cache": store, "block_table": "*i32", "cu_seqlens_q": "*i32",
                      "seqlens_kv": "*i32", "out": store, "partial_out": "*fp32",
                      "partial_lse": "*fp32", "core_status": "*i32", "scale": "fp32",
                      "soft_cap": "fp32", "sinks": "*fp32", "sliding_window": "i32",
                      "num_blocks": "i32", "k_scale": "*fp32", "k_offset": "*fp32",
                      "v_scale": "*fp32", "v_offset": "*fp32",
                      # the caches' page strides in elements: i32, what a launch with any
                      # real cache passes (a Python int below 2**31; triton_launch)
                      "key_page_stride": "i32", "value_page_stride": "i32"},
        "constants": {**consts, **shapes, "UPCAST_DOT": False, "USE_SOFT_CAP": False,
                      "USE_SINKS": False, "USE_WINDOW": False, "KV_INT8": False,
                      "KV_NZ": False},
    }
    # the logits soft cap variant: the same function compiled with USE_SOFT_CAP
    soft_capped = {**attention, "label": "paged_attention_kernel[soft_cap]",
                   "constants": {**attention["constants"], "USE_SOFT_CAP": True}}
    # the attention sinks variants (gpt-oss): both kernels compiled with USE_SINKS
    sinks = {**attention, "label": "paged_attention_kernel[sinks]",
             "constants": {**attention["constants"], "USE_SINKS": True}}
    # the sliding window (USE_WINDOW), alone and with sinks (gpt-oss's windowed layers)
    window = {**attention, "label": "paged_attention_kernel[window]",
              "constants": {**attention["constants"], "USE_WINDOW": True}}
    window_sinks = {**attention, "label": "paged_attention_kernel[window+sinks]",
                    "constants": {**attention["constants"], "USE_WINDOW": True,
                                  "USE_SINKS": True}}
    # the int8 KV cache (KV_INT8): int8 caches, per-channel fp32 scales and offsets
    int8_kv = {**attention, "label": "paged_attention_kernel[int8_kv]",
               "signature": {**attention["signature"], "key_cache": "*i8", "value_cache": "*i8"},
               "constants": {**attention["constants"], "KV_INT8": True}}
    # the same in vLLM-Ascend's NZ layout (KV_NZ): only the K and V tile offsets differ
    int8_kv_nz = {**int8_kv, "label": "paged_attention_kernel[int8_kv_nz]",
                  "constants": {**int8_kv["constants"], "KV_NZ": True}}
    combine = {
        "name": "attention_combine_kernel",
        "signature": {"tiling": "*i32", "step_epoch": "*i32", "cu_seqlens_q": "*i32",
                      "out": store,
                      "partial_out": "*fp32", "partial_lse": "*fp32", "combine_status": "*i32",
                      "sinks": "*fp32"},
        "constants": {**consts, "BLOCK_M": shapes["BLOCK_M"], "BLOCK_D": shapes["BLOCK_D"],
                      "BLOCK_Z": 1024, "USE_SINKS": False},
    }
    combine_sinks = {**combine, "label": "attention_combine_kernel[sinks]",
                     "constants": {**combine["constants"], "USE_SINKS": True}}
    return [attention, soft_capped, sinks, window, window_sinks, int8_kv, int8_kv_nz, combine,
            combine_sinks]


# One TP-8 rank of DeepSeek-V3 / R1 (128 heads / 8; kv_lora_rank 512, qk_rope_head_dim 64),
# vLLM-Ascend's MLA block size 128 (AscendMLABackend.get_supported_kernel_block_sizes)
MLA_SHAPE = {"num_heads": 16, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "block_size": 128,
             "max_batch": 64, "max_tokens": 256, "max_blocks_per_req": 256, "num_cores": 24}


def mla_kernel_specs(dtype: str, q_tile: int | None) -> list[dict]:
    """The MLA decode kernel and its combine (the GQA combine at HEAD_DIM = kv_lora_rank) for
    MLA_SHAPE (needs the project env)."""
    sys.path.insert(0, str(ROOT))
    from pyruntime.kernels import reference_mla, triton_launch, triton_mla_launch
    from pyruntime.mla_attention import mla_tiling_params

    lora = MLA_SHAPE["kv_lora_rank"]
    params = mla_tiling_params(**MLA_SHAPE, q_tile=q_tile)
    store = f"*{dtype}"
    attention = {
        "name": "mla_decode_kernel",
        "signature": {"tiling": "*i32", "step_epoch": "*i32", "q_nope": store, "q_pe": store,
                      "kv_c_cache": store, "k_pe_cache": store, "block_table": "*i32",
                      "cu_seqlens_q": "*i32", "seqlens_kv": "*i32", "out": store,
                      "partial_out": "*fp32", "partial_lse": "*fp32", "core_status": "*i32",
                      "scale": "fp32", "num_blocks": "i32"},
        "constants": {**triton_launch.constants(params, True), "KV_LORA_RANK": lora,
                      **triton_mla_launch.block_shapes(params, lora), "UPCAST_DOT": False},
    }
    latent = reference_mla.latent_params(params, lora)
    combine = {
        "name": "attention_combine_kernel", "label": "attention_combine_kernel[mla]",
        "signature": {"tiling": "*i32", "step_epoch": "*i32", "cu_seqlens_q": "*i32",
                      "out": store, "partial_out": "*fp32", "partial_lse": "*fp32",
                      "combine_status": "*i32", "sinks": "*fp32"},
        "constants": {**triton_launch.constants(latent, True),
                      "BLOCK_M": triton_mla_launch.combine_block_m(params, lora),
                      "BLOCK_D": triton_launch.block_shapes(latent)["BLOCK_D"],
                      "BLOCK_Z": 1024, "USE_SINKS": False},
    }
    return [attention, combine]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=pathlib.Path, default=DEFAULT_VENV)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "ascend_compile")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="bf16")
    parser.add_argument("--q-tile", type=int, default=None,
                        help="query tokens per unit (default: the tiling's, 128 rows per tile; "
                             "1 gives the decode-only tile shapes)")
    parser.add_argument("--mla", action="store_true",
                        help="compile the MLA decode kernel (DeepSeek-V3 rank geometry)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--inner", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner is not None:
        return inner(args.inner)

    def log(message: str) -> None:
        if not args.json:
            print(message, file=sys.stderr)

    try:
        setup_s = ensure_venv(args.venv, log)
    except (subprocess.CalledProcessError, OSError) as exc:
        print(f"ascend_compile: cannot set up {args.venv}: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    specs = (mla_kernel_specs if args.mla else kernel_specs)(args.dtype, args.q_tile)
    spec = {"kernels": specs, "source": str(MLA_SOURCE if args.mla else KERNEL_SOURCE),
            "out": str(args.out), "target": TARGET_ARCH, "bishengir_flags": BISHENGIR_FLAGS}
    spec_path = args.out / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(args.out / "triton_cache")
    start = time.perf_counter()
    run = subprocess.run([str(venv_python(args.venv)), __file__, "--inner", str(spec_path)],
                         check=False, capture_output=True, text=True, env=env)
    compile_s = time.perf_counter() - start
    try:
        report = json.loads(run.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        print(f"ascend_compile: the inner run failed:\n{run.stdout}\n{run.stderr}",
              file=sys.stderr)
        return 1
    report["setup_seconds"] = round(setup_s, 1)
    report["compile_seconds"] = round(compile_s, 1)
    report["dtype"] = args.dtype
    report["tiles"] = {k: specs[0]["constants"][k] for k in ("Q_TILE", "BLOCK_M", "BLOCK_N",
                                                             "BLOCK_D", "BLOCK_L", "BLOCK_R")
                       if k in specs[0]["constants"]}
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    return 0 if all(k["reached_hivmc_or_binary"] for k in report["kernels"]) else 1


def print_report(report: dict) -> None:
    print(f"target {report['target']}, dtype {report['dtype']}, tiles {report['tiles']}, "
          f"venv setup {report['setup_seconds']} s, compile {report['compile_seconds']} s")
    for kernel in report["kernels"]:
        print(f"{kernel['name']}:")
        for stage in kernel["stages"]:
            mark = "reached" if stage["ok"] else "STOPPED"
            print(f"  {stage['stage']:10} {mark}  {stage.get('detail', '')}")
            if not stage["ok"] and stage.get("error"):
                print("    " + stage["error"].strip().replace("\n", "\n    "))


# ------------------------------------------------------------------ inner: the Ascend venv


def _last_lines(text: str, n: int = 6) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-n:])


def _compile_one(kernel: dict, module, spec: dict, out: pathlib.Path) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # a variant of a function (its label) gets its own file names and its own Triton cache, so
    # the artefacts found below are this compile's and never another variant's
    label = kernel.get("label", kernel["name"])
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", label).strip("_")
    cache = pathlib.Path(os.environ["TRITON_CACHE_DIR"]) / stem
    os.environ["TRITON_CACHE_DIR"] = str(cache)  # read by Triton at each compile
    fn = getattr(module, kernel["name"])
    signature = dict(kernel["signature"])
    for name in kernel["constants"]:
        signature[name] = "constexpr"
    stages = []
    src = ASTSource(fn, signature=signature, constants=kernel["constants"])
    target = GPUTarget("npu", spec["target"], 0)
    error = None
    try:
        triton.compile(src, target=target)
    except BaseException as exc:  # noqa: BLE001 - the point is to report where it stops
        error = f"{type(exc).__name__}: {exc}"
        stderr = getattr(exc, "stderr", None)
        if stderr:
            error += "\n" + _last_lines(stderr.decode() if isinstance(stderr, bytes) else stderr)
    found = {}
    for ext in ("ttir", "ttadapter", "npubin"):
        files = sorted(cache.rglob(f"{kernel['name']}.{ext}"), key=lambda p: p.stat().st_mtime)
        if files:
            found[ext] = files[-1]
            target_file = out / f"{stem}.{ext}.mlir"
            target_file.write_bytes(files[-1].read_bytes())
            found[ext] = target_file
    for ext in ("ttir", "ttadapter", "npubin"):
        entry = {"stage": ext, "ok": ext in found}
        if ext in found:
            entry["detail"] = f"{found[ext]} ({found[ext].stat().st_size} bytes)"
        else:
            entry["error"] = error or "not produced"
            stages.append(entry)
            break
        stages.append(entry)
    reached = "npubin" in found
    if "ttadapter" in found:
        stages.append(_bishengir(found["ttadapter"], spec, out / stem))
        reached = reached or stages[-1]["ok"] or stages[-1].get("stopped_at_hivmc", False)
    return {"name": label, "stages": stages, "reached_hivmc_or_binary": reached}


_POINTER_CAST = re.compile(r"hivm\.hir\.pointer_cast\(%c(\d+)_i64[^)]*\)[^:]*: "
                           r"memref<([0-9x]+)x(\w+), (?:strided<[^>]*>, )?"
                           r"#hivm\.address_space<(\w+)>>")
_BITS = {"bf16": 16, "f16": 16, "f32": 32, "i32": 32, "i64": 64, "i8": 8, "i1": 8}


def planned_extent(module: str) -> dict[str, int]:
    """Bytes up to the end of the highest buffer BiShengIR's memory planning placed in each
    on-chip space (ub, cbuf = L1, cc = L0C), from the static ``pointer_cast`` offsets of the
    HIVM module: a lower bound on what the kernel needs (dynamic shapes are not counted)."""
    extent: dict[str, int] = {}
    for match in _POINTER_CAST.finditer(module):
        elements = 1
        for dim in match.group(2).split("x"):
            elements *= int(dim)
        end = int(match.group(1)) + elements * _BITS.get(match.group(3), 32) // 8
        extent[match.group(4)] = max(extent.get(match.group(4), 0), end)
    return extent


def _bishengir(mlir: pathlib.Path, spec: dict, out_prefix: pathlib.Path) -> dict:
    import ascendnpuir

    binary = pathlib.Path(ascendnpuir.__file__).parent / "bin" / "bishengir-compile"
    temps = out_prefix.parent / f"{out_prefix.name}.temps"
    temps.mkdir(exist_ok=True)
    command = [str(binary), str(mlir), *spec["bishengir_flags"], f"--save-temps={temps}",
               "-o", str(out_prefix)]
    run = subprocess.run(command, check=False, capture_output=True, text=True,
                         cwd=out_prefix.parent)
    text = run.stdout + run.stderr
    hivm = sorted(temps.glob("*.hivm*.mlir"))
    entry = {"stage": "bishengir", "command": " ".join(command), "returncode": run.returncode,
             "ok": run.returncode == 0, "stopped_at_hivmc": "hivmc" in text}
    if hivm:
        module = hivm[-1].read_text(errors="ignore")
        # bishengir splits a kernel with tl.dot into cube (aic) and vector (aiv) functions
        # tagged mix_mode = "mix"; a vector-only kernel has AIV functions only
        kind = ("MIX (cube + vector)" if 'mix_mode = "mix"' in module
                else "AIV (vector only)" if "func_core_type<AIC>" not in module else "AIC")
        entry["kernel_kind"] = kind
        entry["planned_bytes"] = planned_extent(module)
        # the workspace Triton-Ascend's launcher allocates per program at each launch, and
        # whether the module asks for a sync-block lock (a synchronous copy per launch)
        workspace = re.search(r"infer_workspace_shape_function\(\)[^\n]*\n\s*%\w+ = "
                              r"arith\.constant (\d+)", module)
        entry["workspace_bytes_per_program"] = int(workspace.group(1)) if workspace else 0
        entry["sync_block_lock_count_function"] = "infer_sync_block_lock" in module
        spaces = ", ".join(f"{space} {size / 1024:.1f} KiB"
                           for space, size in sorted(entry["planned_bytes"].items()))
        entry["detail"] = (f"HIVM module {hivm[-1]} ({len(module)} bytes), {kind}; "
                           f"planned on-chip extent: {spaces}; workspace "
                           f"{entry['workspace_bytes_per_program']} B/program; lock count "
                           f"function: {entry['sync_block_lock_count_function']}")
    if run.returncode != 0:
        entry["error"] = _last_lines(text, 8)
    return entry


def inner(spec_path: pathlib.Path) -> int:
    spec = json.loads(spec_path.read_text())
    out = pathlib.Path(spec["out"])
    source = pathlib.Path(spec["source"])
    name = source.stem
    if name != "triton_attention":
        # triton_mla.py imports triton_attention's helpers relatively: load both by path as
        # modules of their package (the venv has no pyruntime, nor the project's torch)
        helpers = source.parent / "triton_attention.py"
        helpers_spec = importlib.util.spec_from_file_location(
            "pyruntime.kernels.triton_attention", helpers)
        sys.modules[helpers_spec.name] = importlib.util.module_from_spec(helpers_spec)
        helpers_spec.loader.exec_module(sys.modules[helpers_spec.name])
        name = f"pyruntime.kernels.{name}"
    module_spec = importlib.util.spec_from_file_location(name, source)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    import triton

    base_cache = os.environ["TRITON_CACHE_DIR"]
    kernels = []
    for kernel in spec["kernels"]:
        os.environ["TRITON_CACHE_DIR"] = base_cache
        kernels.append(_compile_one(kernel, module, spec, out))
    report = {"target": spec["target"], "triton": triton.__version__, "kernels": kernels}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
