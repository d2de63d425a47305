"""``aicpu-tiling bench tiling``: the C tiling kernel's time per call.

Compiles ``tools/bench_tiling.c`` with the kernel source (``gcc -std=c99 -O3``, as the cffi
build) into ``build/``, runs it on the trace (handed to it as a plain CSV) and parses its lines
``batch=B ns_per_call=X ns_per_request=Y min=A max=B repeats=N``.

Beside the time, each row gets the AArch64 instruction count per call (the AI-CPU's
architecture; `pyruntime.aarch64`): the kernel cross-compiled with ziglang and run in the
unicorn emulator on the same decode batches (the C benchmark's generator, mirrored in
`bench_batches`). A noise-free cost figure; skipped with a note when ziglang, unicorn or
pyelftools is missing.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..measurement.sources import SourceError, load_trace, trace_path
from ..profiler.renderers.bench_tables import tiling_bench_table
from ..workload import trace as workload_trace
from ._common import (
    CliError,
    add_force_arg,
    add_output_args,
    check_outputs,
    emit_json,
    make_console,
    progress,
    write_json,
)

REPO = Path(__file__).resolve().parents[2]
SOURCES_C = ("aicpu_kernels/aicpu_tiling.c", "tools/bench_tiling.c")
LINE = re.compile(
    r"batch=(?P<batch>\d+)\s+ns_per_call=(?P<ns_per_call>[\d.]+)\s+"
    r"ns_per_request=(?P<ns_per_request>[\d.]+)\s+min=(?P<min_ns>[\d.]+)\s+"
    r"max=(?P<max_ns>[\d.]+)\s+repeats=(?P<repeats>\d+)"
)
QUICK_MACRO = "AICPU_BENCH_QUICK"


def parse(output: str) -> list[dict]:
    """The rows of the benchmark's output; unknown lines are ignored.

    Raises:
        ValueError: no result line at all.
    """
    rows = []
    for m in LINE.finditer(output):
        d = m.groupdict()
        rows.append({
            "batch": int(d["batch"]), "ns_per_call": float(d["ns_per_call"]),
            "ns_per_request": float(d["ns_per_request"]), "min_ns": float(d["min_ns"]),
            "max_ns": float(d["max_ns"]), "repeats": int(d["repeats"]),
        })  # fmt: skip
    if not rows:
        raise ValueError("the tiling benchmark printed no result line")
    return rows


def build(quick: bool, compiler: str = "gcc", build_dir: Path | None = None) -> Path:
    """Compile the benchmark (cached by a hash of its sources and flags); its path.

    Raises:
        CliError: the compiler or a source is missing, or compilation fails.
    """
    srcs = [REPO / s for s in SOURCES_C]
    missing = [str(s) for s in srcs if not s.is_file()]
    if missing:
        raise CliError(f"missing benchmark source {missing[0]}: bench tiling compiles the C "
                       "kernel's sources, which only a source checkout has; run it from a clone "
                       "of the repository (pip install -e .)")
    if shutil.which(compiler) is None:
        raise CliError(f"{compiler} not found: bench tiling compiles C with it (set CC)")
    flags = ["-std=c99", "-O3", f"-I{REPO / 'aicpu_kernels'}"]  # as the cffi build
    if quick:
        flags.append(f"-D{QUICK_MACRO}=1")
    digest = hashlib.sha256(" ".join(flags).encode())
    for s in srcs:
        digest.update(s.read_bytes())
    out_dir = build_dir or REPO / "build"
    out_dir.mkdir(parents=True, exist_ok=True)
    exe = out_dir / f"bench_tiling-{digest.hexdigest()[:12]}"
    if not exe.exists():
        proc = subprocess.run([compiler, *flags, *map(str, srcs), "-o", str(exe)],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["unknown error"])[0]
            raise CliError(f"compiling the tiling benchmark failed: {first}")
    return exe


def write_plain_trace(trace: Path, out: Path) -> Path:
    """Write ``trace`` (plain or gzip, any column order) as the plain CSV the C benchmark reads:
    a header, then ``seconds,ContextTokens,GeneratedTokens`` per request.

    Raises:
        CliError: the trace cannot be read.
    """
    try:
        requests = workload_trace.load_trace(trace)
    except workload_trace.TraceError as exc:
        raise CliError(str(exc)) from exc
    lines = [",".join(workload_trace.TRACE_COLUMNS)]
    lines += [f"{r.arrival_s:.6f},{r.context_tokens},{r.generated_tokens}" for r in requests]
    out.write_text("\n".join(lines) + "\n")
    return out


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``bench tiling``."""
    p = sub.add_parser(
        "tiling",
        help="the C tiling kernel's time per call",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"build with -D{QUICK_MACRO} (fewer calls, when the source honours it)",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up")
    p.add_argument("-o", "--output", help="also write the JSON result here (an existing file "
                                           "is refused unless --force)")
    add_force_arg(p)
    add_output_args(p)
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Build, run, parse, report."""
    check_outputs({"-o": args.output}, force=args.force)
    try:
        trace = trace_path()
    except SourceError as exc:
        raise CliError(str(exc)) from exc
    exe = build(args.quick, os.environ.get("CC", "gcc"))
    with progress(not (args.json or args.no_progress)) as bar, tempfile.TemporaryDirectory() as tmp:
        bar.add_task("bench tiling (C)", total=None)
        plain = write_plain_trace(trace, Path(tmp) / "trace.csv")
        try:
            proc = subprocess.run([str(exe), str(plain)], capture_output=True, text=True, check=False,
                                  timeout=args.timeout)  # fmt: skip
        except subprocess.TimeoutExpired:
            raise CliError(f"the tiling benchmark ran past --timeout {args.timeout:g} s")
    if proc.returncode != 0:
        first = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[0]
        raise CliError(f"the tiling benchmark failed: {first}")
    try:
        rows = parse(proc.stdout)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    result = {"command": "bench tiling", "source": "tools/bench_tiling.c", "quick": args.quick,
              "rows": rows, "oracle": oracle_times(trace, quick=args.quick)}  # fmt: skip
    result["aarch64"] = add_instruction_counts(rows, trace)
    if args.output:
        write_json(args.output, result, force=args.force)
    if args.json:
        emit_json(result)
    else:
        console = make_console()
        for item in tiling_bench_table(result):
            console.print(item)
        console.print(result["aarch64"]["note"], markup=False)
        for row in result["oracle"]:
            console.print(f"pure-Python oracle, batch {row['batch']}: "
                          f"{row['us_per_call']:.0f} us per call (median of {row['repeats']})")
    return 0


def oracle_times(trace: Path, *, quick: bool) -> list[dict]:
    """Median time per call of the pure-Python oracle on the C benchmark's geometry."""
    import statistics
    import time

    import numpy as np

    from pyruntime.tiling import TilingParams, reference_plan

    params = TilingParams(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=128,
                          max_batch=1024, max_tokens=1024, max_blocks_per_req=512, num_cores=24,
                          q_tile=16)  # fmt: skip
    context = load_trace(trace)[:, 0]
    rng = np.random.default_rng(0)
    rows = []
    for batch in (1, 8, 64) if quick else (1, 8, 64, 256):
        kv = np.minimum(context[rng.integers(0, len(context), batch)] + 1, params.kv_capacity)
        samples = []
        for _ in range(3 if quick else 7):
            start = time.perf_counter()
            reference_plan(params, np.arange(batch + 1), kv)
            samples.append(time.perf_counter() - start)
        rows.append({"batch": batch, "us_per_call": statistics.median(samples) * 1e6,
                     "repeats": len(samples)})  # fmt: skip
    return rows


# --------------------------------------------------------------------------- AArch64 counts

#: tools/bench_tiling.c's generator state, sizes and batches per size (mirrored below).
BENCH_SEED = 0x2545F4914F6CDD1D
BENCH_SIZES = (1, 8, 64, 256, 1024)
BENCH_BATCHES = 8
BENCH_MAX_REQUESTS = 20000
_M64 = (1 << 64) - 1


def bench_batches(context, generated, kv_capacity: int) -> dict[int, list[list[int]]]:
    """The kv lengths of tools/bench_tiling.c's decode batches, per size.

    The same xorshift64* stream, drawn in the same order (sizes ascending, 8 batches each,
    per request: a trace row, then a share of its generated tokens when it has any), so the
    instruction counts describe the inputs the C timings ran on.
    """
    n = min(len(context), BENCH_MAX_REQUESTS)
    state = BENCH_SEED

    def rng() -> int:
        nonlocal state
        state ^= state >> 12
        state ^= (state << 25) & _M64
        state ^= state >> 27
        return ((state * 2685821657736338717) & _M64) >> 32

    out: dict[int, list[list[int]]] = {}
    for size in BENCH_SIZES:
        out[size] = []
        for _ in range(BENCH_BATCHES):
            kv = []
            for _ in range(size):
                k = rng() % n
                share = rng() % int(generated[k]) if generated[k] > 0 else 0
                kv.append(min(int(context[k]) + share + 1, kv_capacity))
            out[size].append(kv)
    return out


def add_instruction_counts(rows: list[dict], trace: Path) -> dict:
    """Add ``aarch64_instructions`` (median over the size's batches; min and max beside it)
    to each row whose batch the C benchmark ran; a dict with a one-line ``note``."""
    from pyruntime.aarch64 import ToolchainError, missing_tools

    missing = missing_tools()
    if missing:
        return {"note": f"AArch64 instruction counts skipped: {', '.join(missing)} not "
                        "installed (pip install -e .[test])", "rows": []}  # fmt: skip
    import statistics

    from pyruntime.aarch64.kernel import EmulatedKernel
    from pyruntime.tiling import TilingParams

    params = TilingParams(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=128,
                          max_batch=1024, max_tokens=1024, max_blocks_per_req=512, num_cores=24,
                          q_tile=16)  # fmt: skip
    try:
        emu = EmulatedKernel()
    except ToolchainError as exc:
        return {"note": f"AArch64 instruction counts skipped: {exc}", "rows": []}
    table = load_trace(trace)
    batches = bench_batches(table[:, 0], table[:, 1], params.kv_capacity)
    counts = []
    for size, kvs in batches.items():
        runs = [emu.plan(params, range(size + 1), kv) for kv in kvs]
        if any(run.status != 0 for run in runs):
            raise CliError(f"the emulated kernel failed on a batch of {size}")
        n = [run.instructions for run in runs]
        counts.append({"batch": size, "median": statistics.median(n), "min": min(n),
                       "max": max(n), "stack_bytes": max(run.stack_bytes for run in runs)})
    by_batch = {c["batch"]: c for c in counts}
    for row in rows:
        if row["batch"] in by_batch:
            row["aarch64_instructions"] = by_batch[row["batch"]]["median"]
    note = ("AArch64 instructions per call: the kernel built with ziglang (-O2, aarch64) and "
            f"run in unicorn on the same batches; median of {BENCH_BATCHES} batches per size; "
            f"deepest stack {max(c['stack_bytes'] for c in counts)} bytes")
    return {"note": note, "rows": counts}
