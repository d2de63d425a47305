"""Rendered tables at 80 columns against golden text.

A missing or different golden file fails; ``AICPU_TILING_UPDATE_GOLDEN=1`` rewrites them.
The balance tables are tested in test_balance.py.
"""

from __future__ import annotations

from pyruntime.cli.profile import process
from pyruntime.profiler.renderers import render_text
from pyruntime.profiler.renderers.bench_tables import bench_table, tiling_bench_table
from pyruntime.profiler.renderers.profile_tables import profile_tables
from pyruntime.profiler.renderers.tiling_tables import load_bar, tiling_tables

from .test_profiler import synthetic_session


def bench_result() -> dict:
    def mode(host, step):
        return {"host_us": {"median": host, "ci": [host * 0.97, host * 1.02]},
                "step_us": {"median": step, "ci": [step * 0.99, step * 1.01]}}  # fmt: skip

    def ratio(value):
        return {"value": value, "ci": [value * 0.95, value * 1.04]}

    def stat(median):
        return {"median": median, "ci": [median * 0.96, median * 1.05]}

    points = []
    for layers, batch, source, hu, dt, pr in (
        (61, 64, "trace", 4310.0, 61.2, 80.5),
        (1, 64, "trace", 118.0, 60.5, 78.0),
        (61, 64, "chunked-prefill", 12650.0, 64.0, 83.0),
    ):
        points.append({
            "layers": layers, "batch": batch, "source": source, "steps": 40,
            "modes": {"host_update": mode(hu, 30000.0), "device_tiling": mode(dt, 25000.0),
                      "pre_replay": mode(pr, 25100.0)},
            "host_ratio": ratio(hu / dt), "step_ratio": ratio(1.2),
            "host_ratio_pre_replay": ratio(hu / pr), "step_ratio_pre_replay": ratio(1.19),
        })  # fmt: skip
    counters = {
        "host_update": {"launches_aicpu": 0.0, "launches_aicore": 122.0, "task_updates": 61.0,
                        "host_tiling_calls": 61.0, "replays": 1.0, "copies_h2d": 1.0},
        "device_tiling": {"launches_aicpu": 0.0, "launches_aicore": 0.0, "task_updates": 0.0,
                          "host_tiling_calls": 0.0, "replays": 1.0, "copies_h2d": 2.0},
        "pre_replay": {"launches_aicpu": 1.0, "launches_aicore": 0.0, "task_updates": 0.0,
                       "host_tiling_calls": 0.0, "replays": 1.0, "copies_h2d": 2.0},
    }
    per_layer = {"python_calls": 95, "c_calls": 119, "lib_calls": 3, "launches_aicore": 2,
                 "task_updates": 1, "host_tiling_calls": 1, "event_records": 1}
    host_l1 = {"python_calls": 137, "c_calls": 142, "lib_calls": 3, "launches_aicore": 2,
               "task_updates": 1, "host_tiling_calls": 1, "replays": 1, "copies_h2d": 1,
               "synchronizes": 1, "event_records": 1}
    invariants = {
        "host_update": {str(n): {k: v + (n - 1) * per_layer.get(k, 0) for k, v in host_l1.items()}
                        for n in (1, 61)},
        "device_tiling": {str(n): {"python_calls": 44, "c_calls": 31, "replays": 1,
                                   "copies_h2d": 2} for n in (1, 61)},
    }
    return {
        "points": points,
        "placements": {"batch": 64, "source": "trace", "layers": [1, 61],
                       "host_us": {"host_update": [118.0, 4310.0], "device_tiling": [60.5, 61.2],
                                   "pre_replay": [78.0, 80.5]},
                       "counters_per_step": counters},
        "host_flatness": {
            "layers": [1, 61], "batch": 64, "source": "trace", "target": 1.3,
            "modes": {"device_tiling": {"host_us_L1": stat(18.2), "host_us_L61": stat(19.1),
                                        "ratio": ratio(19.1 / 18.2), "within_target": True},
                      "pre_replay": {"host_us_L1": stat(30.0), "host_us_L61": stat(41.0),
                                     "ratio": ratio(41.0 / 30.0), "within_target": False}}},
        "invariants": invariants,
        "invariants_check": {"batch": 64, "source": "trace", "warmup": 3, "holds": True,
                             "problems": [], "per_layer": {"host_update": per_layer}},
        "host_time_vs_layers": {
            "batch": 64, "source": "trace", "ratio_layers": 61,
            "modes": {"host_update": {"layers": [1, 61], "median_us": [118.0, 4310.0],
                                      "slope_us_per_layer": 69.87, "slope_ci": [68.5, 71.2]},
                      "device_tiling": {"layers": [1, 61], "median_us": [60.5, 61.2],
                                        "slope_us_per_layer": 0.012, "slope_ci": [-0.02, 0.04]}},
            "ratio": {"device_tiling": 4310.0 / 61.2}},
        "headline": {"layers": 61, "batch": 64, "source": "trace", "host_update_us": 4310.0,
                     "device_tiling_us": 61.2, "host_ratio": 4310.0 / 61.2,
                     "pre_replay_us": 80.5, "host_ratio_pre_replay": 4310.0 / 80.5},
        "config": {"steps": 40, "warmup": 3, "resamples": 2000, "seed": 0,
                   "geometry": {"num_q_heads": 8, "num_kv_heads": 1, "head_dim": 16,
                                "block_size": 128, "num_cores": 24, "dtype": "float32",
                                "max_kv": 4096}},
    }  # fmt: skip


def inspect_view() -> dict:
    cores = [{"begin": [0, 0, 0, k], "end": [0, 0, 0, k + 2], "first_slot": k // 2,
              "last_slot": k // 2, "num_segments": 1, "cost": 112 - 8 * (k % 3)}
             for k in range(0, 8, 2)]  # fmt: skip
    return {
        "status": 0, "error": None, "params": {"cost_segment": 32},
        "summary": {"batch": 1, "num_tokens": 1, "num_units": 1, "num_segments": 4,
                    "num_slots": 4, "num_combine": 1, "max_core_cost": 112, "total_cost": 352,
                    "ideal": 120.0, "ratio": 112 / 120},
        "cores": cores,
        "combine": [{"request": 0, "kv_head": 0, "q_tile": 0, "first_slot": 0, "num_pieces": 4}],
    }  # fmt: skip


def test_bench_table(golden):
    golden("bench.txt", render_text(bench_table(bench_result())))


def test_tiling_bench_table(golden):
    rows = [{"batch": b, "ns_per_call": 100.0 * b + 2000, "ns_per_request": 100 + 2000 / b,
             "min_ns": 90.0 * b + 1500, "max_ns": 120.0 * b + 4000, "repeats": 31}
            for b in (1, 8, 64)]  # fmt: skip
    golden("bench_tiling.txt", render_text(tiling_bench_table(
        {"source": "tools/bench_tiling.c", "rows": rows})))  # fmt: skip


def test_profile_tables(golden):
    golden("profile.txt", render_text(profile_tables(process(synthetic_session()))))


def test_inspect_tables(golden):
    golden("inspect.txt", render_text(tiling_tables(inspect_view())))
    bad = {**inspect_view(), "status": 8, "error": "request 2: kv shorter than query"}
    golden("inspect_error.txt", render_text(tiling_tables(bad)))


def test_rendered_lines_fit_80_columns():
    for text in (render_text(bench_table(bench_result())),
                 render_text(profile_tables(process(synthetic_session()))),
                 render_text(tiling_tables(inspect_view()))):  # fmt: skip
        assert max(len(line) for line in text.splitlines()) <= 80


def test_load_bar():
    assert load_bar(0, 10) == "" and load_bar(5, 0) == ""
    assert load_bar(10, 10, width=4) == "████"
    assert load_bar(5, 10, width=3) == "█▌"
