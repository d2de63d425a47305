"""Smoke tests of every subcommand with --quick or small inputs, and user errors."""

from __future__ import annotations

import gzip
import json

import pytest

from pyruntime.cli import tiling_bench
from pyruntime.measurement.sources import SOURCES, TRACE_ENV, ContinuousBatch, SourceError, steps

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
    (["bench", "balance", "--geometries", "6/4"], "multiple"),
    (["frobnicate"], "invalid choice"),
])  # fmt: skip
def test_user_errors_are_one_line(cli, argv, fragment):
    code, _, err = cli(*argv)
    assert code == 2
    assert fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


SESSION = '"schema": "aicpu-tiling/profile", "version": 1'
TRACE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
# every CLI reader of a user's file, and how a malformed file is named to it
READERS = {
    "inspect": lambda path, monkeypatch: ["inspect", "--file", str(path)],
    "profile": lambda path, monkeypatch: ["profile", "--load", str(path)],
    "trace": lambda path, monkeypatch: (monkeypatch.setenv(TRACE_ENV, str(path))
                                        or ["inspect", "--trace-step", "0"]),
}
MALFORMED = [
    ("inspect", "garbage{", "line 1: 'garbage{' is not two integers"),
    ("inspect", "", "no q_len,kv_len lines"),
    ("inspect", "q_len,kv_len\n", "no q_len,kv_len lines"),
    ("inspect", "q_len,kv_len\n1,700\n2,x\n", "line 3"),
    ("inspect", "1,700\nq_len,kv_len\n", "line 2"),
    ("inspect", "1,2,3\n", "line 1"),
    ("inspect", "[0, 1]", "line 1"),
    ("inspect", b"\xff\xfe\x00\x01", "cannot read"),
    ("inspect", '{"cu_seqlens_q": [0, 1]', "is not JSON"),
    ("inspect", '{"cu_seqlens_q": [0, 1]}', "seqlens_kv is missing or not a list of integers"),
    ("inspect", '{"cu_seqlens_q": "01", "seqlens_kv": [4]}', "cu_seqlens_q is missing"),
    ("inspect", '{"cu_seqlens_q": [0, 1.5], "seqlens_kv": [4]}', "cu_seqlens_q is missing"),
    ("profile", "garbage{", "is not JSON"),
    ("profile", "[]", "is not an aicpu-tiling profile session"),
    ("profile", '{"schema": "aicpu-tiling/profile", "version": 99}', "session version 99"),
    ("profile", "{" + SESSION + "}", "missing field 'runs'"),
    ("profile", "{" + SESSION + ', "runs": []}', "holds no runs"),
    ("profile", "{" + SESSION + ', "runs": [1]}', "expected an object, found int"),
    ("profile", "{" + SESSION + ', "runs": [{"mode": "x", "steps": [{"start": "a", "step_s": 1, '
                '"host_s": 1}]}]}', "expected a number, found str"),
    ("profile", "{" + SESSION + ', "runs": [{"mode": "x", "device_tasks": [{"step": 0}]}]}',
     "missing field 'kind'"),
    ("trace", "garbage{", "lacks column TIMESTAMP, ContextTokens, GeneratedTokens"),
    ("trace", "q_len,kv_len\n1,700\n", "lacks column"),
    ("trace", TRACE_HEADER, "has no requests"),
    ("trace", TRACE_HEADER + "2023-11-16 18:15:46,3,x\n", "line 2"),
    ("trace", TRACE_HEADER + "2023-11-16 18:15:46,-3,4\n", "negative token count"),
    ("trace", b"\x1f\x8bnot gzip at all", "cannot read"),
    # mtime=0: the gzip header's timestamp is part of the test id, and xdist workers that collect
    # it in different seconds would disagree on the test list and abort the run
    ("trace", gzip.compress((TRACE_HEADER + "2023-11-16 18:15:46,3,4\n" * 300).encode(),
                            mtime=0)[:-40], "cannot read"),
]  # fmt: skip


@pytest.mark.parametrize("reader, content, fragment", MALFORMED)
def test_malformed_files_of_every_reader_are_one_line_errors(cli, tmp_path, monkeypatch, reader,
                                                             content, fragment):
    path = tmp_path / "input"
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    code, out, err = cli(*READERS[reader](path, monkeypatch))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert fragment in err and str(path) in err


def test_missing_trace_is_a_user_error(cli, monkeypatch, tmp_path):
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "none.csv"))
    code, _, err = cli("bench", "balance", "--quick", "--json")
    assert code == 2 and "AICPU_TILING_TRACE" in err


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
    code, out, _ = cli("inspect", "--kv", "700,0,9", "--q", "1,3,1")
    assert code == 1 and "status 8" in out


@needs_tiling
def test_inspect_trailing_padding_is_planned_without_it(cli):
    """vLLM-Ascend's padded slots (kv_len 0 at the end) are padding (tiling ABI v4)."""
    code, out, _ = cli("inspect", "--kv", "700,0,0", "--q", "1,1,6")
    assert code == 0 and "batch 1 · tokens 1" in out


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


def test_cli_trace_is_the_bundled_one(monkeypatch):
    from pyruntime.measurement.sources import trace_path
    from pyruntime.workload.trace import bundled_trace_path

    monkeypatch.delenv(TRACE_ENV, raising=False)
    assert trace_path() == bundled_trace_path()
    assert trace_path().name == "azure_llm_2023_conv.csv.gz"


@needs_runtime
def test_bench_quick_small_grid(cli, tmp_path):
    out_file = tmp_path / "bench.json"
    code, out, _ = cli("bench", "--layers", "2", "--batch-sizes", "4", "--sources",
                       "trace,spec-decode", "--steps", "4", "--warmup", "1", "--json",
                       "-o", str(out_file), "--resamples", "200")  # fmt: skip
    data = json.loads(out)
    assert code == 0 and len(data["points"]) == 2
    assert data["version"] == 4 and data["placements"] is None  # one layer count only
    assert data["invariants"] is None  # a grid given by flags: not counted unless asked
    assert data["host_flatness"] is None  # a grid given by flags: no flatness run unless asked
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
    assert summary["counters_per_step"]["host_update"]["task_updates"] == 3


@needs_runtime
def test_bench_flatness_measures_both_layer_counts_side_by_side(cli, monkeypatch):
    from pyruntime.cli import bench
    from pyruntime.measurement import abrun

    # the figure's layer counts and step floor, shrunk so that the test takes seconds
    monkeypatch.setattr(abrun, "FLATNESS_LAYERS", (1, 3))
    monkeypatch.setattr(bench, "FLATNESS_LAYERS", (1, 3))
    monkeypatch.setattr(bench, "FLATNESS_MIN_STEPS", 3)
    code, out, _ = cli("bench", "--layers", "2", "--batch-sizes", "4", "--steps", "3",
                       "--warmup", "1", "--flatness", "--json", "--no-save",
                       "--resamples", "100")  # fmt: skip
    flat = json.loads(out)["host_flatness"]
    assert code == 0 and flat["layers"] == [1, 3] and flat["target"] == 1.3
    assert set(flat["modes"]) == {"device_tiling", "pre_replay"}
    for mode, v in flat["modes"].items():
        low, high = v["host_us_L1"]["median"], v["host_us_L3"]["median"]
        assert v["ratio"]["value"] == pytest.approx(high / low)
        assert v["within_target"] == (v["ratio"]["value"] <= 1.3)
        # each layer count ran its own graph: one replay per step, the device path's copies
        for counters in v["counters_per_step"].values():
            assert counters["replays"] == 1 and counters["task_updates"] == 0
            assert counters["launches_aicpu"] == (1 if mode == "pre_replay" else 0)


@needs_runtime
def test_bench_invariants_and_the_host_time_fit(cli):
    """Issue 30: the JSON carries the invariants per mode and L (as a string), their verdict,
    and host time over L with its least-squares slope; two layer counts keep it short."""
    code, out, _ = cli("bench", "--layers", "2", "--batch-sizes", "4", "--steps", "3",
                       "--warmup", "1", "--invariants", "--invariant-layers", "1,3",
                       "--max-kv", "256", "--json", "--no-save", "--resamples", "50")
    data = json.loads(out)
    assert code == 0 and data["version"] == 4
    counts = data["invariants"]
    assert set(counts) == {"host_update", "device_tiling", "pre_replay"}
    assert all(set(rows) == {"1", "3"} for rows in counts.values())
    assert counts["device_tiling"]["1"] == counts["device_tiling"]["3"]
    assert counts["pre_replay"]["3"]["launches_aicpu"] == 1
    # the whole measured serving step (symmetric, the default): vLLM-Ascend's synchronize,
    # and under pre-replay no epoch advance from the host (the replay advances it)
    assert counts["device_tiling"]["1"]["synchronizes"] == 1
    assert counts["pre_replay"]["1"]["launches_aicore"] == 0
    check = data["invariants_check"]
    assert check["method"] == "symmetric"
    assert check["holds"] and check["problems"] == [] and check["layers"] == [1, 3]
    assert check["per_layer"]["host_update"]["task_updates"] == 1
    fit = data["host_time_vs_layers"]
    for mode in ("host_update", "device_tiling", "pre_replay"):
        m = fit["modes"][mode]
        assert m["layers"] == [1, 3] and m["steps"] == 6  # every measured step a point
        assert m["slope_ci"][0] <= m["slope_us_per_layer"] <= m["slope_ci"][1]
    assert fit["ratio"] == {}  # L=61 was not measured
    assert len(data["points"]) == 1  # the fit's extra layer counts are not grid points


@needs_runtime
def test_bench_invariants_need_two_layer_counts(cli):
    code, _, err = cli("bench", "--layers", "2", "--invariants", "--invariant-layers", "4",
                       "--no-save")
    assert code == 2 and "--invariant-layers needs two or more layer counts" in err
    code, _, err = cli("bench", "--layers", "2", "--invariants", "--invariant-layers",
                       "1,100000", "--no-save")
    assert code == 2 and "from 1 to 128" in err


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


# ---- help, early checks, progress (issue 18, part 3) -----------------------------------------


def _parsers():
    import argparse

    from pyruntime.cli import build_parser

    todo, found = [("aicpu-tiling", build_parser())], []
    while todo:
        name, parser = todo.pop()
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
    return found


@pytest.mark.parametrize("name, parser", _parsers(), ids=lambda v: v if isinstance(v, str) else "")
def test_help_is_plain_text_and_shows_every_default(name, parser):
    assert "``" not in parser.format_help(), name
    formatter = parser._get_formatter()
    for action in parser._actions:
        default = action.default
        if (not action.option_strings or default is None or default is False
                or default == "==SUPPRESS=="):
            continue
        entry = " ".join(formatter._format_action(action).split())
        assert "default" in entry, (name, entry)


def test_bench_png_without_matplotlib_fails_before_the_grid(cli, monkeypatch):
    from pyruntime.cli import bench
    from pyruntime.profiler.renderers import plots

    monkeypatch.setattr(plots, "available", lambda: False)
    monkeypatch.setattr(bench, "grid", lambda args: pytest.fail("the grid ran"))
    code, _, err = cli("bench", "--quick", "--png", "x.png")
    assert code == 2 and "--png needs matplotlib" in err and "aicpu-tiling[plot]" in err


def test_bench_tiling_outside_a_checkout_says_it_needs_one(monkeypatch, tmp_path):
    from pyruntime.cli._common import CliError

    monkeypatch.setattr(tiling_bench, "REPO", tmp_path)  # an install: no C sources beside it
    with pytest.raises(CliError, match="only a source checkout has"):
        tiling_bench.build(quick=True)


@needs_tiling
def test_inspect_trace_step_reports_progress_while_it_skips(cli, monkeypatch):
    from pyruntime.cli import inspect

    monkeypatch.setattr(inspect, "TRACE_PROGRESS_STEPS", 2)
    code, _, err = cli("inspect", "--trace-step", "5", "--batch", "4")
    assert code == 0
    assert err.splitlines() == ["inspect: batching the trace, step 2 of 5",
                                "inspect: batching the trace, step 4 of 5"]


# ---- a CLI that respects the user's time (issue 30, item 7) ----------------------------------

import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
#: every answer that must come without the work's imports: help of every parser, the
#: version, a usage error, and the checks made before work
FAST_ARGVS = [[*name.split()[1:], "--help"] for name, _ in _parsers()] + [
    ["--version"], ["frobnicate"], ["bench", "--layers", "x"], ["bench", "--layers", "100000"],
    ["bench", "--quick", "-o", "/missing/dir/x.json"], ["profile", "--quick", "--batch", "-1"],
    ["selfcheck", "--checks", "nope"], ["serve-check", "--tiny", "qwen3", "--max-tokens", "0"],
]


def test_help_version_and_usage_errors_import_no_torch():
    """``--help`` (every parser's), ``--version``, usage errors and the checks made before work
    answer without importing torch (seconds): each argv in a fresh interpreter."""
    script = (
        "import json, sys\n"
        "from pyruntime.cli import main\n"
        "try:\n    code = main(json.loads(sys.argv[1]))\n"
        "except SystemExit as exc:\n    code = exc.code\n"
        "print('torch' in sys.modules, code, file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    imported = {}
    for argv in FAST_ARGVS:
        out = subprocess.run([sys.executable, "-c", script, json.dumps(argv)], env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        torch_loaded, code = out.stderr.strip().splitlines()[-1].split()
        imported[" ".join(argv)] = (torch_loaded, code)
    assert {a: v for a, v in imported.items() if v[0] != "False"} == {}
    assert imported["--version"][1] in ("0", "None")
    assert all(v[1] == "2" for a, v in imported.items() if "--help" not in a and a != "--version")


def test_version_is_the_package_version(cli, capsys):
    import tomllib

    import pyruntime

    with pytest.raises(SystemExit) as exc:
        cli("--version")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert exc.value.code == 0 and pyruntime.__version__ == version
    assert capsys.readouterr().out.strip() == f"aicpu-tiling {version}"


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if bench or profile starts measuring."""
    from pyruntime.cli import bench, profile

    def ran(*args, **kwargs):
        pytest.fail("the run started")

    monkeypatch.setattr(bench, "run_interleaved", ran)
    monkeypatch.setattr(bench, "measure_flatness", ran)
    monkeypatch.setattr(profile, "run_point", ran)


@pytest.mark.parametrize("argv, fragment", [
    (["bench", "--quick", "-o", "/missing/dir/x.json"], "the folder /missing/dir does not exist"),
    (["bench", "--quick", "-o", "{tmp}"], "is a folder"),
    (["bench", "--quick", "--png", "q.png", "--no-save"], "--png would be ignored"),
    (["bench", "--quick", "-o", "x.json", "--no-save"], "-o would be ignored"),
    (["bench", "--quick", "--steps", "3"], "cannot be combined with --steps"),
    (["bench", "--quick", "--layers", "8"], "cannot be combined with --layers"),
    (["bench", "--layers", "100000"], "at most 512 layers"),
    (["bench", "--layers", "0"], "expected positive integers"),
    (["bench", "--batch-sizes", "100000"], "at most 4,096 requests per step"),
    (["bench", "--steps", "1"], "measured steps must be at least 2"),
    (["bench", "--warmup", "-1"], "must be at least 0"),
    (["bench", "--head-dim", "4096"], "AICPU_TILING_MAX_HEAD_DIM"),
    (["bench", "--geometry", "deepseek-v3", "--q-heads", "4"], "--q-heads cannot be combined"),
    (["profile", "--quick", "--batch", "-1"], "cannot be combined with --batch"),
    (["profile", "--quick", "--layers", "4", "--steps", "2"], "with --layers, --steps"),
    (["profile", "--batch", "-1"], "--batch -1: requests per step must be at least 1"),
    (["profile", "--layers", "100000"], "at most 512 layers"),
    (["profile", "--steps", "0"], "must be at least 1"),
    (["profile", "--load", "s.json", "--layers", "3"], "--layers would be ignored"),
    (["profile", "--quick", "--trace", "/missing/dir/t.json"], "/missing/dir does not exist"),
    (["profile", "--quick", "--save", "{tmp}/s.json", "--trace", "{tmp}/s.json"], "both name"),
])  # fmt: skip
def test_refused_before_any_work(cli, no_work, tmp_path, argv, fragment):
    code, out, err = cli(*[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert code == 2 and out == "", err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("argv, flag", [
    (["bench", "--quick"], "-o"),   # the default file, in the current folder
    (["bench", "--quick", "-o", "mine.json"], "-o"),
    (["profile", "--quick", "--trace", "mine.json"], "--trace"),
    (["profile", "--quick", "--save", "mine.json"], "--save"),
])
def test_an_existing_output_file_is_refused_before_work_without_force(cli, no_work, tmp_path,
                                                                      monkeypatch, argv, flag):
    monkeypatch.chdir(tmp_path)
    name = "mine.json" if "mine.json" in argv else "aicpu-tiling-bench.json"
    (tmp_path / name).write_text("keep me")
    code, _, err = cli(*argv)
    assert code == 2 and f"{flag} {name} exists; --force replaces it" in err
    assert (tmp_path / name).read_text() == "keep me"


def test_force_is_in_the_help_of_every_command_that_writes():
    parsers = dict(_parsers())
    for name in ("aicpu-tiling bench", "aicpu-tiling profile", "aicpu-tiling bench balance",
                 "aicpu-tiling bench tiling"):
        text = " ".join(parsers[name].format_help().split())
        assert "--force replace output files that exist" in text, name


@needs_runtime
def test_bench_force_replaces_and_a_file_that_appears_meanwhile_is_kept(cli, tmp_path,
                                                                         monkeypatch):
    from pyruntime.cli import bench

    out_file = tmp_path / "bench.json"
    out_file.write_text("old")
    small = ["bench", "--layers", "1", "--batch-sizes", "2", "--steps", "2", "--warmup", "0",
             "--no-flatness", "--resamples", "50", "--no-progress", "--json", "-o", str(out_file)]
    code, _, _ = cli(*small, "--force")
    assert code == 0 and json.loads(out_file.read_text())["schema"] == "aicpu-tiling/bench"

    fresh = tmp_path / "fresh.json"
    real = bench.run_interleaved

    def run_and_race(*args, **kwargs):
        fresh.write_text("someone else's")   # appears after the check, during the run
        return real(*args, **kwargs)

    monkeypatch.setattr(bench, "run_interleaved", run_and_race)
    code, _, err = cli(*small[:-1], str(fresh))
    assert code == 2 and "appeared while this ran; not replaced" in err
    assert fresh.read_text() == "someone else's"


def test_selfcheck_output_folder_is_checked_first_and_an_existing_file_replaced(cli, tmp_path):
    from pyruntime.cli import selfcheck as selfcheck_cli

    code, _, err = cli("selfcheck", "-o", "/missing/dir/s.json", "--no-progress")
    assert code == 2 and "/missing/dir does not exist" in err
    help_text = " ".join(dict(_parsers())["aicpu-tiling selfcheck"].format_help().split())
    assert "rewritten atomically" in help_text and "an existing FILE is replaced" in help_text
    report = tmp_path / "s.json"
    report.write_text("old")

    class Args:
        backend, checks, twin_fault, quick, build, output = "cpu", None, None, True, False, report
        json, no_progress, check_timeout, no_save_placement = True, True, 10.0, True

    from pyruntime.selfcheck import report as report_mod

    table = [("kernels", lambda ctx: report_mod.passed("kernels", "stand-in"))]
    assert selfcheck_cli.run(Args(), checks_table=table, isolate=False) == 0
    assert json.loads(report.read_text())["checks"][0]["name"] == "kernels"


# -- memory and limits


def test_memory_check_names_the_need_and_what_is_available(cli, no_work, monkeypatch):
    from pyruntime.cli import _limits

    monkeypatch.setattr(_limits, "available_bytes", lambda: 1 << 30)   # 1 GiB available
    code, _, err = cli("bench", "--layers", "61", "--batch-sizes", "64", "--sources",
                       "chunked-prefill")
    assert code == 2 and "point L61-b64-chunked-prefill needs about" in err
    # the three modes and, under the symmetric method, the floor's lead (a device_tiling
    # attention of its own: pyruntime.measurement.abrun.FloorLead)
    assert "4 captured attentions x 61 layers" in err and "of the 1.0 GiB" in err


@needs_runtime
@pytest.mark.parametrize("geometry, source", [("gqa", "trace"), ("gqa", "spec-decode"),
                                              ("gqa", "chunked-prefill"), ("mla", "trace")])
def test_the_memory_estimate_is_what_a_layer_allocates(geometry, source):
    """The per-layer bytes `_limits` charges are exactly what one more layer allocates."""
    from pyruntime import backends
    from pyruntime.cli import _limits
    from pyruntime.measurement.abrun import Geometry, make_attention

    geom = Geometry(num_blocks=8, max_kv=512) if geometry == "gqa" else Geometry(
        num_q_heads=4, num_kv_heads=1, head_dim=48, block_size=16, num_cores=3,
        dtype="bfloat16", max_kv=64, num_blocks=16, kv_lora_rank=32, qk_rope_head_dim=16)
    batch = 3

    def allocated(layers: int) -> int:
        backend = backends.get("cpu")
        total, alloc = [0], backend.alloc

        def counting(shape, dtype):
            buf = alloc(shape, dtype)
            total[0] += buf.nbytes
            return buf

        backend.alloc = counting
        try:
            make_attention(backend, "device_tiling", geom, layers, batch,
                           _limits.max_tokens(source, batch)).close()
        finally:
            backend.close()
        return total[0]

    per_layer = (allocated(3) - allocated(1)) // 2
    assert per_layer == _limits.attention_bytes_per_layer(geom, source, batch)


def test_max_tokens_is_the_sources_own():
    from pyruntime.cli import _limits

    for source in SOURCES:
        for batch in (1, 7, 64):
            assert _limits.max_tokens(source, batch) == ContinuousBatch(source,
                                                                        batch).max_tokens()


# -- progress lines


def test_plain_progress_lines_have_elapsed_and_estimated_time():
    import io

    from pyruntime.cli._common import PlainProgress

    now = [100.0]
    out = io.StringIO()
    bar = PlainProgress(out, clock=lambda: now[0])
    task = bar.add_task("bench", total=10)
    bar.update(task, description="bench L61-b64-trace")
    for _ in range(4):
        now[0] += 15
        bar.advance(task)
    bar.update(task, description="bench L1-b64-trace")
    bar.update(task, description="bench L1-b64-trace")   # unchanged: no line
    now[0] += 3700
    bar.advance(task, 6)
    bar.finish()
    assert out.getvalue().splitlines() == [
        "aicpu-tiling: bench: 0 of 10 done, 0:00 elapsed",
        "aicpu-tiling: bench L61-b64-trace: 0 of 10 done, 0:00 elapsed",
        "aicpu-tiling: bench L1-b64-trace: 4 of 10 done, 1:00 elapsed, about 1:30 left",
        "aicpu-tiling: bench L1-b64-trace: finished 10 of 10 in 1:02:40",
    ]


@needs_runtime
def test_bench_prints_one_progress_line_per_point_when_stderr_is_not_a_terminal(cli):
    code, _, err = cli("bench", "--layers", "1,2", "--batch-sizes", "2", "--steps", "2",
                       "--warmup", "0", "--no-flatness", "--no-save", "--resamples", "50")
    lines = err.splitlines()
    assert code == 0 and len(lines) == 4, err
    assert lines[1].startswith("aicpu-tiling: bench L1-b2-trace: 0 of 4 done")
    assert lines[2].startswith("aicpu-tiling: bench L2-b2-trace: 2 of 4 done")
    assert "elapsed, about" in lines[2] and "left" in lines[2]
    assert lines[3].startswith("aicpu-tiling: bench L2-b2-trace: finished 4 of 4 in ")


# -- Ctrl-C


def _interrupted_run(argv: list[str], *, wait_for: str) -> tuple[int, list[str]]:
    """Start ``python -X importtime -m pyruntime.cli ARGV``, send SIGINT once it has imported
    module `wait_for` (``import time: ... | <name>``) or printed a line starting with it;
    return (exit code, stderr lines other than importtime's). Killed after two minutes."""
    import threading

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "pyruntime.cli", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = threading.Timer(120, proc.kill)
    deadline.start()
    lines, sent = [], False
    try:
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if line.split("|")[-1].strip() == wait_for or line.startswith(wait_for):
                proc.send_signal(signal.SIGINT)
                sent = True
                break
        lines += proc.stderr.read().splitlines()
        proc.wait()
    finally:
        deadline.cancel()
        proc.kill()
    assert sent, f"never saw {wait_for!r}: {lines[-5:]}"
    return proc.returncode, [x for x in lines if not x.startswith("import time:")]


LONG_BENCH = ["bench", "--layers", "1", "--batch-sizes", "2", "--steps", "100000",
              "--warmup", "0", "--no-flatness", "--no-save"]


@needs_runtime
@pytest.mark.parametrize("moment, wait_for", [
    ("start-up: the subcommands' imports", "numpy"),
    ("start-up: torch's import", "torch._C"),
    ("the run", "aicpu-tiling: bench L1-b2-trace"),
])
def test_ctrl_c_at_any_moment_exits_130_with_one_line(moment, wait_for):
    code, lines = _interrupted_run(LONG_BENCH, wait_for=wait_for)
    assert code == 130, (moment, lines)
    assert "Traceback" not in "\n".join(lines), (moment, lines)
    assert lines[-1] == "aicpu-tiling: interrupted", (moment, lines)
    assert not [x for x in lines if not x.startswith("aicpu-tiling: ")], (moment, lines)
