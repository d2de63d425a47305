"""Smoke tests of every subcommand with --quick or small inputs, and user errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pyruntime.cli import tiling_bench
from pyruntime.cli.sources import SOURCES, TRACE_ENV, ContinuousBatch, SourceError, steps

needs_tiling = pytest.mark.skipif(
    __import__("importlib").util.find_spec("pyruntime._native") is None,
    reason="the tiling kernel's extension is not built",
)


def _runtime_ready() -> bool:
    try:
        import pyruntime.attention  # noqa: F401
    except (ImportError, AttributeError):
        return False
    return True


needs_runtime = pytest.mark.skipif(not _runtime_ready(), reason="pyruntime.attention unusable")


def test_help_and_no_command(cli):
    code, out, _ = cli()
    assert code == 0 and "bench" in out and "inspect" in out


@pytest.mark.parametrize("argv, fragment", [
    (["bench", "balance", "--batch-sizes", "x"], "comma-separated"),
    (["bench", "--sources", "nope"], "unknown source"),
    (["inspect"], "exactly one of"),
    (["inspect", "--kv", "5,5", "--q", "1"], "--q has 1 values"),
    (["inspect", "--file", "/nonexistent/lengths.json"], "cannot read"),
    (["profile", "--load", "/nonexistent/session.json"], "cannot read session"),
    (["bench", "balance", "--q-heads", "6", "--kv-heads", "4"], "multiple"),
    (["frobnicate"], "invalid choice"),
])  # fmt: skip
def test_user_errors_are_one_line(cli, argv, fragment):
    code, _, err = cli(*argv)
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_missing_trace_is_a_user_error(cli, monkeypatch, tmp_path):
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "none.csv"))
    code, _, err = cli("bench", "balance", "--quick", "--json")
    assert code == 2 and "AICPU_TILING_TRACE" in err


@needs_tiling
def test_bench_balance_quick_json(cli, tmp_path):
    out_file = tmp_path / "balance.json"
    code, out, _ = cli("bench", "balance", "--quick", "--json", "--check", "-o", str(out_file))
    data = json.loads(out)
    assert code == 0, data["verdict"]
    assert [s["batch"] for s in data["sizes"]] == [16, 64, 256, 1024]
    assert set(data["sizes"][0]["partitioners"]) == {
        "ours",
        "fia_even",
        "fia_weighted",
        "flashmla",
        "flashinfer",
    }
    assert json.loads(out_file.read_text()) == data


@needs_tiling
def test_bench_balance_table(cli):
    code, out, _ = cli("bench", "balance", "--quick", "--batch-sizes", "16", "--no-progress")
    assert code == 0 and "FlashMLA" in out and "at or below every anchor" in out


@needs_tiling
def test_inspect_from_arguments(cli):
    code, out, _ = cli("inspect", "--kv", "700,3000,90,5000", "--q", "1,1,1,4")
    assert code == 0 and "status OK" in out and "Per-core load" in out and "█" in out


@needs_tiling
def test_inspect_json_from_file_and_trace(cli, tmp_path):
    f = tmp_path / "lengths.csv"
    f.write_text("q_len,kv_len\n1,700\n2,3000\n")
    code, out, _ = cli("inspect", "--file", str(f), "--json")
    view = json.loads(out)
    assert code == 0 and view["seqlens_kv"] == [700, 3000] and view["cu_seqlens_q"] == [0, 1, 3]
    assert sum(c["num_segments"] for c in view["cores"]) == view["summary"]["num_segments"]
    j = tmp_path / "lengths.json"
    j.write_text(json.dumps({"cu_seqlens_q": [0, 1], "seqlens_kv": [40]}))
    assert cli("inspect", "--file", str(j), "--json")[0] == 0
    code, out, _ = cli("inspect", "--trace-step", "3", "--batch", "16", "--json")
    assert code == 0 and len(json.loads(out)["seqlens_kv"]) == 16


@needs_tiling
def test_inspect_bad_lengths_show_status(cli):
    code, out, _ = cli("inspect", "--kv", "700,0", "--q", "1,3")
    assert code == 1 and "status 8" in out


@needs_tiling
def test_inspect_png(cli, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "load.png"
    code, _, _ = cli("inspect", "--kv", "700,3000", "--png", str(png))
    assert code == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_bench_tiling_parse():
    text = (
        "noise\nbatch=8 ns_per_call=3552.6 ns_per_request=444.07 min=1718.7 max=4629.8 repeats=31\n"
    )
    rows = tiling_bench.parse(text)
    assert rows == [{"batch": 8, "ns_per_call": 3552.6, "ns_per_request": 444.07,
                     "min_ns": 1718.7, "max_ns": 4629.8, "repeats": 31}]  # fmt: skip
    with pytest.raises(ValueError):
        tiling_bench.parse("nothing here")


@pytest.mark.skipif(
    tiling_bench.QUICK_MACRO not in (tiling_bench.REPO / "tools/bench_tiling.c").read_text()
    if (tiling_bench.REPO / "tools/bench_tiling.c").exists()
    else True,
    reason="tools/bench_tiling.c has no quick mode; the full run takes minutes",
)
def test_bench_tiling_quick(cli, tmp_path):
    code, out, _ = cli("bench", "tiling", "--quick", "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and [r["batch"] for r in rows] == [1, 8, 64, 256, 1024]


def test_bench_tiling_build_errors(monkeypatch):
    from pyruntime.cli._common import CliError

    with pytest.raises(CliError, match="not found"):
        tiling_bench.build(False, compiler="no-such-cc-xyz")


@pytest.mark.parametrize("source", SOURCES)
def test_sources_are_valid_and_deterministic(source):
    a = steps(source, 16, 5, seed=3, max_kv=8192)
    b = steps(source, 16, 5, seed=3, max_kv=8192)
    for x, y in zip(a, b):
        assert (x.cu_seqlens_q == y.cu_seqlens_q).all() and (x.seqlens_kv == y.seqlens_kv).all()
        q = x.cu_seqlens_q[1:] - x.cu_seqlens_q[:-1]
        assert (q >= 1).all() and (x.seqlens_kv >= q).all() and (x.seqlens_kv <= 8192).all()
        assert x.num_tokens <= ContinuousBatch(source, 16).max_tokens()
    if source == "spec-decode":
        assert (a[0].cu_seqlens_q[1:] - a[0].cu_seqlens_q[:-1] == 4).all()


def test_source_errors():
    with pytest.raises(SourceError, match="unknown"):
        ContinuousBatch("zipf", 4)
    with pytest.raises(SourceError, match="batch"):
        ContinuousBatch("uniform", 0)


def test_trace_found_beside_the_repository():
    from pyruntime.cli.sources import trace_path

    if os.environ.get(TRACE_ENV):
        pytest.skip("AICPU_TILING_TRACE overrides the lookup")
    assert trace_path().name == "azure_llm_2023_conv.csv"
    assert Path(trace_path()).parent.name == "data"


@needs_runtime
def test_bench_quick_small_grid(cli, tmp_path):
    out_file = tmp_path / "bench.json"
    code, out, _ = cli("bench", "--layers", "2", "--batch-sizes", "4", "--sources",
                       "trace,spec-decode", "--steps", "4", "--warmup", "1", "--json",
                       "-o", str(out_file), "--resamples", "200")  # fmt: skip
    data = json.loads(out)
    assert code == 0 and len(data["points"]) == 2
    assert data["version"] == 2 and data["placements"] is None  # one layer count only
    p = data["points"][0]
    for mode in ("host_update", "device_tiling", "pre_replay"):
        assert p["modes"][mode]["host_us"]["ci"][0] <= p["modes"][mode]["host_us"]["median"]
    graph, pre = (p["modes"][m]["counters_per_step"] for m in ("device_tiling", "pre_replay"))
    assert graph["task_updates"] == 0 and graph["launches_aicpu"] == 0
    assert pre["task_updates"] == 0 and pre["launches_aicpu"] == 1  # exactly one per step
    assert pre["replays"] == 1 and pre["host_tiling_calls"] == 0
    assert p["modes"]["host_update"]["counters_per_step"]["task_updates"] == 2
    assert p["host_ratio"]["value"] > 0 and p["host_ratio_pre_replay"]["value"] > 0
    assert json.loads(out_file.read_text())["schema"] == "aicpu-tiling/bench"


@needs_runtime
def test_bench_placements_summary_over_layer_counts(cli):
    code, out, _ = cli("bench", "--layers", "1,3", "--batch-sizes", "64", "--steps", "3",
                       "--warmup", "1", "--json", "--no-save", "--resamples", "100")
    summary = json.loads(out)["placements"]
    assert code == 0 and summary["layers"] == [1, 3]
    assert set(summary["host_us"]) == {"host_update", "device_tiling", "pre_replay"}
    hu = summary["host_us"]["host_update"]
    assert summary["growth"]["host_update"] == pytest.approx(hu[1] / hu[0])
    assert summary["counters_per_step"]["host_update"]["task_updates"] == 3


@needs_runtime
def test_profile_quick_trace_and_reload(cli, tmp_path):
    trace, session = tmp_path / "trace.json", tmp_path / "session.json"
    code, out, _ = cli("profile", "--quick", "--no-progress", "--trace", str(trace),
                       "--save", str(session))  # fmt: skip
    assert code == 0 and "host time per step" in out
    events = json.loads(trace.read_text())["traceEvents"]
    lanes = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert "host" in lanes and any(name.startswith("device: ") for name in lanes)
    code, again, _ = cli("profile", "--load", str(session), "--no-progress")
    assert code == 0 and again.split("\n")[0] == out.split("\n")[0]
