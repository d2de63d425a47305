#!/usr/bin/env python3
"""The attention variants' error tables, one CLI: each variant's consumer outputs against float64.

    python tools/variant_errors.py VARIANT [--steps N] [--triton-steps N] [--json] [options]
    python tools/variant_errors.py VARIANT --help      # the variant's table and options

VARIANT is one of ``soft_cap`` (tools/soft_cap_errors.py), ``sinks`` (sinks_errors.py),
``window`` (window_errors.py), ``int8_kv`` (int8_kv_errors.py) and ``mla`` (mla_errors.py).
Each variant's module describes its table and holds its own loop and options; the sweep over
consumers, modes and dtypes, the common options and the report (the Markdown table, or JSON
with ``--json``) are `tools/_variant_errors.py`'s. ``python tools/NAME_errors.py [...]`` still
runs one variant alone, with the same options and output.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: the variant names of the CLI and their modules (tools/NAME.py)
VARIANTS = {
    "soft_cap": "soft_cap_errors",
    "sinks": "sinks_errors",
    "window": "window_errors",
    "int8_kv": "int8_kv_errors",
    "mla": "mla_errors",
}


def build_parser() -> argparse.ArgumentParser:
    """The CLI: one subcommand per variant, with that variant's options."""
    p = argparse.ArgumentParser(prog="variant_errors.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="variant", required=True, metavar="VARIANT")
    for name, module_name in VARIANTS.items():
        tool = importlib.import_module(module_name)
        summary = tool.__doc__.split("\n")[0]
        one = sub.add_parser(name, help=summary, description=summary)
        tool.add_arguments(one)
        one.set_defaults(table=tool.table)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.table(args)


if __name__ == "__main__":
    sys.exit(main())
