"""tools/variant_errors.py: one CLI over the error-table tools (parsing only; the tables
themselves take minutes and are run by hand, docs/attention-variants.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import variant_errors


def test_every_variant_is_a_subcommand_with_its_own_defaults():
    parser = variant_errors.build_parser()
    assert set(variant_errors.VARIANTS) == {"soft_cap", "sinks", "window", "int8_kv", "mla"}
    mla = parser.parse_args(["mla"])
    assert (mla.steps, mla.triton_steps, mla.skip, mla.json) == (10, 2, 3, False)
    window = parser.parse_args(["window", "--window", "8", "--sinks", "--json"])
    assert (window.steps, window.triton_steps, window.window, window.sinks, window.json) == (
        200, 12, 8, True, True)
    assert parser.parse_args(["soft_cap"]).cap == 50.0
    assert parser.parse_args(["int8_kv"]).offset_sd == 15.0
    assert parser.parse_args(["sinks"]).sink_base == 3.0
    for name in variant_errors.VARIANTS:
        tool = __import__(variant_errors.VARIANTS[name])
        assert parser.parse_args([name]).table is tool.table


def test_an_unknown_or_missing_variant_is_a_usage_error():
    parser = variant_errors.build_parser()
    for argv in ([], ["bogus"]):
        with pytest.raises(SystemExit) as info:
            parser.parse_args(argv)
        assert info.value.code == 2
