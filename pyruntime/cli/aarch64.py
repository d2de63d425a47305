"""``python -m pyruntime.cli.aarch64 build [DIR]`` and ``python -m pyruntime.cli.aarch64 count``.

``build`` cross-compiles the kernel and every AI-CPU entry for aarch64 with ziglang (what
``tools/build_aicpu_kernel.sh cross`` runs) and the emulator images, into DIR (default
``build/aicpu/cross``). ``count`` prints the AArch64 instructions per call of the emulated
kernel on the decode batches of ``aicpu-tiling bench tiling`` (needs the request trace).
Both return 0 on success and 1 with one line on stderr otherwise.

The command line of `pyruntime.aarch64` lives here, with the other command lines, because
``count`` is ``bench tiling``'s measurement (the aarch64 package itself imports nothing above
it). It is a module entry point, not an ``aicpu-tiling`` subcommand.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyruntime.aarch64 import toolchain


def build(out_dir: Path) -> int:
    """Run every cross-compile step into `out_dir`; print one line per output."""
    for unit in (*toolchain.cross_units(), *toolchain.emulator_images()):
        path = toolchain.run_unit(unit, out_dir)
        print(f"{unit.name:24s} {path} ({path.stat().st_size} bytes)")
    return 0


def count() -> int:
    """Print the instruction counts ``bench tiling`` shows, one line per batch size."""
    from pyruntime.measurement.sources import trace_path

    from . import tiling_bench

    rows = [{"batch": b} for b in tiling_bench.BENCH_SIZES]
    info = tiling_bench.add_instruction_counts(rows, trace_path())
    for row in info["rows"]:
        print(f"batch={row['batch']} instructions_median={row['median']:.0f} "
              f"min={row['min']} max={row['max']} stack_bytes={row['stack_bytes']}")
    print(info["note"])
    return 0 if info["rows"] else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point; `argv` without the program name."""
    from ._common import CliError

    args = sys.argv[1:] if argv is None else argv
    try:
        if args[:1] == ["build"] and len(args) <= 2:
            root = Path(__file__).resolve().parents[2]
            return build(Path(args[1]) if len(args) == 2 else root / "build/aicpu/cross")
        if args == ["count"]:
            return count()
    except (CliError, RuntimeError, OSError, ImportError, ValueError) as exc:  # one line, no traceback
        print(f"pyruntime.cli.aarch64: {exc}", file=sys.stderr)
        return 1
    print("usage: python -m pyruntime.cli.aarch64 build [DIR] | count", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
