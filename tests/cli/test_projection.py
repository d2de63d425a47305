"""``aicpu-tiling bench projection``: the NPU projection table and its assumptions."""

from __future__ import annotations

import json

from pyruntime.cli import projection


def _bench(per_layer_us: float, device_us: float, floor_us: float) -> dict:
    layers = [1, 16, 61]
    host = [100 + n * per_layer_us for n in layers]
    modes = {"host_update": {"host_us": {"median": host[-1]}},
             "device_tiling": {"host_us": {"median": device_us}},
             "pre_replay": {"host_us": {"median": device_us + 10}},
             "floor": {"host_us": {"median": floor_us}}}
    return {"schema": "aicpu-tiling/bench", "method": {"headline": "symmetric"},
            "placements": {"layers": layers, "host_us": {"host_update": host}},
            "points": [{"layers": 61, "batch": 64, "source": "trace", "modes": modes}],
            "headline": {"layers": 61, "batch": 64, "source": "trace"}}


def test_the_per_layer_cost_is_the_slope_and_the_extra_is_over_the_floor():
    table = projection.projection(_bench(44.0, 30.0, 20.0))
    m = table["measured"]
    assert abs(m["host_update_per_layer_us"] - 44.0) < 1e-9
    assert m["extra_us"] == {"device_tiling": 10.0, "pre_replay": 20.0}
    row = next(r for r in table["rows"] if (r["mode"], r["replay_us"], r["layers"]) ==
               ("device_tiling", 1210.0, 20))
    assert row["saving_us"] == 20 * 184.0 - 10.0
    assert abs(row["ratio"] - (1210 + 3680) / 1220) < 1e-12
    assert table["real"]["per_layer_us"] == 184.0
    assert "issues/13058" in table["real"]["source"]


def test_without_a_json_the_real_figure_alone_and_no_extra(cli):
    code, out, _ = cli("bench", "projection")
    assert code == 0
    assert "184 us/layer" in out and "not measured" in out and "invariants: not in" in out
    assert out.count("x\n") >= 2 * len(projection.REPLAY_US) * len(projection.LAYERS) - 1


def test_invariants_are_printed_when_present(cli, tmp_path):
    bench = _bench(44.0, 30.0, 20.0)
    bench["invariants"] = {"device_tiling": {"1": {"py_calls": 24}, "61": {"py_calls": 24}}}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(bench))
    code, out, _ = cli("bench", "projection", "--from", str(path))
    assert code == 0 and "invariants device_tiling at L=61: py_calls 24" in out
    assert "0.24x the real figure" in out


def test_a_file_that_is_not_a_bench_json_is_one_line_error(cli, tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{}")
    code, _, err = cli("bench", "projection", "--from", str(path))
    assert code == 2 and "not an aicpu-tiling bench JSON" in err


def test_each_input_file_is_checked_under_its_own_option(cli, tmp_path):
    """A bench JSON handed to --selfcheck, and a file that is missing or not JSON, are one-line
    errors that name the option and the file."""
    bench = tmp_path / "b.json"
    bench.write_text(json.dumps(_bench(44.0, 30.0, 20.0)))
    code, _, err = cli("bench", "projection", "--selfcheck", str(bench))
    assert code == 2 and f"--selfcheck {bench}: not an aicpu-tiling selfcheck JSON" in err
    missing, broken = tmp_path / "missing.json", tmp_path / "broken.json"
    broken.write_text("{")
    for option, path in (("--from", missing), ("--selfcheck", broken)):
        code, _, err = cli("bench", "projection", option, str(path))
        assert code == 2 and f"{option} {path}: " in err and "Traceback" not in err, err


def _selfcheck(backend: str, emulated: bool) -> dict:
    where = {"backend": backend, "emulated": emulated}
    return {"schema": "aicpu-tiling/selfcheck", "checks": [
        {"name": "aicpu_replay", "replay_host": {"replay_host_us": 50.0, "replays_timed": 7,
                                                 **where}},
        {"name": "host_time", "update_per_layer": {"update_per_layer_us": 150.0, "layers": 61,
                                                   **where}}]}


def test_a_selfchecks_replay_and_update_costs_fill_their_own_rows():
    """What selfcheck --backend npu measures on the device it runs on (item 5) makes rows of
    its own: host_update = R + L u, ours = R + E."""
    check = projection.from_selfcheck(_selfcheck("npu", False))
    table = projection.projection(_bench(44.0, 30.0, 20.0), check)
    row = next(r for r in table["selfcheck_rows"] if (r["mode"], r["layers"]) ==
               ("pre_replay", 61))
    assert row["saving_us"] == 61 * 150.0 - 20.0
    assert abs(row["ratio"] - (50 + 61 * 150) / (50 + 20)) < 1e-12
    assert len(table["selfcheck_rows"]) == 2 * len(projection.LAYERS)
    assert "(npu, measured on the device)" in projection.render(table)


def test_an_emulated_selfcheck_is_marked_and_a_partial_one_refused(cli, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_selfcheck("npu-twin", True)))
    code, out, _ = cli("bench", "projection", "--selfcheck", str(path))
    assert code == 0 and "(npu-twin, emulated: not an NPU figure)" in out
    partial = _selfcheck("npu", False)
    partial["checks"] = partial["checks"][:1]
    path.write_text(json.dumps(partial))
    code, _, err = cli("bench", "projection", "--selfcheck", str(path))
    assert code == 2 and "per-layer update cost" in err
