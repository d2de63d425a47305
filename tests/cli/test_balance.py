"""``bench balance``: the CLI, its JSON and its tables (golden text at 80 columns)."""

from __future__ import annotations

import json

import pytest

from pyruntime.partitioners import ANCHORS
from pyruntime.profiler.renderers import render_text
from pyruntime.profiler.renderers.balance_tables import balance_tables

needs_tiling = pytest.mark.skipif(
    __import__("importlib").util.find_spec("pyruntime._native") is None,
    reason="the tiling kernel's extension is not built",
)

SMALL = ("--quick", "--batch-sizes", "16", "--geometries", "16/1", "--sources", "trace")


@pytest.mark.parametrize("argv, fragment", [
    (["--batch-sizes", "x"], "comma-separated"),
    (["--geometries", "6/4"], "multiple"),
    (["--geometries", "16-1"], "Q/KV head pairs"),
    (["--sources", "nope"], "unknown source nope"),
    (["--cost-models", "mine"], "unknown cost model mine"),
    (["--samples", "0"], "--samples must be >= 1"),
])  # fmt: skip
def test_user_errors_are_one_line(cli, argv, fragment):
    code, _, err = cli("bench", "balance", "--no-progress", *argv)  # stderr: the error alone
    assert code == 2 and fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv, fragment", [
    (["--geometry", "llama"], "invalid choice: 'llama'"),
    (["--geometry", "deepseek-v3", "--geometries", "16/1"], "cannot be combined with --geometry"),
    (["--geometry", "deepseek-v3", "--sources", "trace"], "cannot be combined with --geometry"),
    (["--geometry", "deepseek-v3", "--cost-models", "fia_v3"], "fia_v3 is not an MLA cost model"),
    (["--geometry", "deepseek-v3", "--q-lens", "0"], "positive integers"),
    (["--geometry", "deepseek-v3", "--heads", "16,x"], "comma-separated"),
    (["--heads", "16"], "--heads needs --geometry"),
    (["--q-lens", "2"], "--q-lens needs --geometry"),
    (["--cost-models", "mla"], "cost model mla is for --geometry"),
])  # fmt: skip
def test_mla_geometry_user_errors_are_one_line(cli, argv, fragment):
    assert_one_line_error(cli, argv, fragment)


@needs_tiling
def test_mla_heads_past_the_kernel_limit_are_a_user_error(cli):
    assert_one_line_error(cli, ["--geometry", "deepseek-v3", "--quick", "--batch-sizes", "16",
                                "--heads", "2048", "--q-lens", "1"], "num_q_heads is 2048")  # fmt: skip


def assert_one_line_error(cli, argv, fragment):
    code, _, err = cli("bench", "balance", "--no-progress", *argv)  # stderr: the error alone
    assert code == 2 and fragment in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@needs_tiling
def test_mla_geometry_json(cli, tmp_path):
    from pyruntime.partitioners import MLA_ANCHORS

    out_file = tmp_path / "mla.json"
    code, out, _ = cli("bench", "balance", "--geometry", "deepseek-v3", "--quick",
                       "--batch-sizes", "16", "--heads", "128,16", "--q-lens", "1,3",
                       "--json", "-o", str(out_file))  # fmt: skip
    data = json.loads(out)
    assert code == 0 and json.loads(out_file.read_text()) == data
    assert data["geometry"] == "deepseek-v3" and data["q_lens"] == [1, 3]
    assert data["mla"]["head_dim"] == 576 and data["mla"]["heads"] == [128, 16]
    keys = {(c["geometry"], c["source"], c["cost_model"]) for c in data["cases"]}
    assert keys == {(g, s, cm) for g in ("128/1", "16/1") for s in ("decode", "mtp3")
                    for cm in ("mla", "fia_mla")}  # fmt: skip
    for case in data["cases"]:
        assert set(case["partitioners"]) == {"ours", *MLA_ANCHORS}, case["not_applicable"]
        mla = case["partitioners"]["flashmla"]
        # 128 heads (2 or 6 m blocks) and 16 heads x 3 tokens (48 rows, one m block)
        assert ("work_mean" in mla) == (case["geometry"] == "128/1")
        if "work_mean" in mla:
            assert mla["work_mean"] > 1 and mla["ratio_mean"] > mla["own_ratio_mean"]
    assert data["verdict"]["variants"] == list(MLA_ANCHORS)
    assert data["cost_models"]["mla"]["cost_kv_load"] == 36


@needs_tiling
def test_mla_geometry_table(cli):
    code, out, _ = cli("bench", "balance", "--geometry", "deepseek-v3", "--quick",
                       "--batch-sizes", "16", "--heads", "64", "--q-lens", "2",
                       "--cost-models", "mla", "--no-progress")  # fmt: skip
    assert code == 0
    assert "64/1 heads, mtp2, cost model mla" in " ".join(out.split())
    for label in ("FIA MLA", "FlashMLA F=5", "FlashMLA F=seg"):
        assert label in out


@needs_tiling
def test_mla_runtime_cost_model_is_the_weights_the_runtime_plans_with(cli, tmp_path):
    """``--cost-models mla_runtime`` scores our tiling as StaticMLAAttention plans it: its
    weights come from pyruntime.mla_attention (one source), and its query tile is the runtime's
    (64 rows: q_tile = 64 // heads)."""
    from pyruntime import mla_attention
    from pyruntime.partitioners.study import mla_cost_table

    runtime = mla_cost_table()["mla_runtime"]
    assert (runtime["cost_kv_load"], runtime["cost_qk_tile"], runtime["cost_segment"]) == (
        mla_attention.MLA_COST_KV_LOAD, mla_attention.MLA_COST_QK_TILE,
        mla_attention.MLA_COST_SEGMENT)
    params = mla_attention.mla_tiling_params(num_heads=16, kv_lora_rank=512,
                                             qk_rope_head_dim=64, block_size=128, max_batch=4,
                                             max_tokens=16, max_blocks_per_req=4, num_cores=24)
    assert params.q_tile == runtime["tile_rows"] // 16
    code, out, _ = cli("bench", "balance", "--geometry", "deepseek-v3", "--quick",
                       "--batch-sizes", "16", "--heads", "16", "--q-lens", "1",
                       "--cost-models", "mla_runtime", "--json")  # fmt: skip
    data = json.loads(out)
    assert code == 0 and {c["cost_model"] for c in data["cases"]} == {"mla_runtime"}


@needs_tiling
def test_json_has_every_variant_and_the_verdict(cli, tmp_path):
    out_file = tmp_path / "balance.json"
    code, out, _ = cli("bench", "balance", *SMALL, "--json", "-o", str(out_file))
    data = json.loads(out)
    assert code == 0
    assert json.loads(out_file.read_text()) == data
    assert {c["cost_model"] for c in data["cases"]} == {"ours", "fia_v3"}
    for case in data["cases"]:
        assert case["batch"] == 16 and case["samples"] == 1 and case["geometry"] == "16/1"
        assert set(case["partitioners"]) == {"ours", *ANCHORS}
    verdict = data["verdict"]
    assert verdict["variants"] == list(ANCHORS) and verdict["variants_missing"] == []
    assert isinstance(verdict["ours_at_or_below_all"], bool)
    assert verdict["ours_at_or_below_all"] == (not verdict["losses"])
    for anchor in data["anchors"].values():
        assert anchor["source"] and anchor["label"]


@needs_tiling
def test_check_fails_without_a_verdict(cli):
    # chunked prefill only: IFA and FlashMLA cannot run, so no verdict and --check fails
    code, out, _ = cli("bench", "balance", "--quick", "--batch-sizes", "16", "--geometries",
                       "32/8", "--sources", "chunked-prefill", "--check", "--no-progress")  # fmt: skip
    assert code == 1 and "NO VERDICT" in out and "IFA 24c" in out.split("NO VERDICT")[1]


@needs_tiling
def test_table_shows_every_variant(cli):
    code, out, _ = cli("bench", "balance", *SMALL, "--no-progress")
    assert code == 0
    for anchor in ANCHORS.values():
        assert anchor.label in out


def _parts(values: dict[str, tuple[float, float]]) -> dict:
    return {n: {"ratio_mean": m, "ratio_max": w, "segments_mean": 30.0, "segments_max": 31,
                "units_mean": 16.0} for n, (m, w) in values.items()}  # fmt: skip


def balance_result(loss: bool = False) -> dict:
    """A fixed two-case result: 16/1 decode, both cost models, two anchors and ours."""
    anchors = {"fia_v3": {"label": "FIA V3", "source": "split_core.cpp SplitCore", "family": "FIA V3"},
               "flashmla": {"label": "FlashMLA F=5", "source": "get_mla_metadata.cu",
                            "family": "FlashMLA"}}  # fmt: skip
    cases = []
    for cm, ours in (("ours", (1.05, 1.1)), ("fia_v3", (1.01, 1.02))):
        for batch in (16, 64):
            values = {"ours": ours, "fia_v3": (1.2, 1.4), "flashmla": (1.3, 1.5)}
            if loss and cm == "ours" and batch == 64:
                values["flashmla"] = (1.04, 1.09)
            cases.append({"geometry": "16/1", "num_q_heads": 16, "num_kv_heads": 1,
                          "source": "trace", "cost_model": cm, "batch": batch, "samples": 4,
                          "partitioners": _parts(values), "not_applicable": []})  # fmt: skip
    losses = [{"geometry": "16/1", "source": "trace", "cost_model": "ours", "batch": 64,
               "anchor": "flashmla", "statistic": s, "ours": o, "anchor_value": a}
              for s, o, a in (("mean", 1.05, 1.04), ("worst", 1.1, 1.09))] if loss else []  # fmt: skip
    model = {"num_cores": 24, "block_size": 128, "cost_kv_load": 4, "cost_qk_tile": 1,
             "cost_segment": 32}  # fmt: skip
    return {
        "cost_models": {"ours": model, "fia_v3": {**model, "block_size": 64, "cost_kv_load": 40,
                                                  "cost_qk_tile": 3, "cost_segment": 0}},
        "anchors": anchors,
        "cases": cases,
        "verdict": {"ours_at_or_below_all": not loss, "variants": list(anchors),
                    "variants_missing": [], "losses": losses, "ties": []},
    }  # fmt: skip


def test_balance_tables(golden):
    golden("balance.txt", render_text(balance_tables(balance_result())))
    golden("balance_violation.txt", render_text(balance_tables(balance_result(True))))


def test_balance_tables_fit_80_columns():
    for loss in (False, True):
        text = render_text(balance_tables(balance_result(loss)))
        assert max(len(line) for line in text.splitlines()) <= 80


def test_reference_rows_are_shown_when_present():
    result = balance_result()
    for case in result["cases"]:
        case["references"] = {n: {"ratio_mean": 1.001, "ratio_max": 1.002}
                              for n in ("minmax", "minmax_best_order")}  # fmt: skip
    text = render_text(balance_tables(result))
    assert "exact min-max (ref)" in text and "1.001/1.002" in text
    assert "exact min-max" not in render_text(balance_tables(balance_result()))


def test_mla_tables_tool_reads_every_number_from_the_result():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "mla_balance_tables.py"
    spec = importlib.util.spec_from_file_location("mla_balance_tables", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    result = balance_result()
    for case, source in zip(result["cases"], ("decode", "mtp3", "decode", "mtp3")):
        case["source"] = source
        parts = case["partitioners"]
        parts["fia_mla"] = dict(parts.pop("fia_v3"))
        parts["flashmla"] |= {"work_mean": 1.24, "own_ratio_mean": 1.111, "own_ratio_max": 1.222}
        parts["flashmla_tuned"] = dict(parts["flashmla"], ratio_mean=1.25, ratio_max=1.6)
    text = tool.render(result)
    row = next(line for line in text.splitlines() if line.split()[:3] == ["16", "3", "64"])
    # ours, FIA MLA, F=5, F=seg, best of the sweep (F=seg by mean), work, F=5 own
    assert row.split()[3:] == ["1.050/1.100", "1.200/1.400", "1.300/1.500", "1.250/1.600",
                               "1.250/1.600", "1.24", "1.111/1.222"]  # fmt: skip
    assert text.startswith("Cost model ours:") and "0 losses, 0 ties in 4 cases" in text


def test_competitor_table_tool_aggregates_and_lists_losses():
    """tools/competitor_balance_table.py: per (geometry, source, cost model) the mean of the
    per-size means and the worst step, for ours and fia_v2_sink_metadata; every case where
    the competitor is below ours is listed, from either file kind (bench balance and its
    --window form)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "competitor_balance_table.py"
    spec = importlib.util.spec_from_file_location("competitor_balance_table", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    part = lambda m, w: {"ratio_mean": m, "ratio_max": w}
    result = {"cases": [
        {"geometry": "16/1", "source": "trace", "cost_model": "ours", "batch": 16,
         "partitioners": {"ours": part(1.05, 1.10), "fia_v2_sink_metadata": part(1.20, 1.40)}},
        {"geometry": "16/1", "source": "trace", "cost_model": "ours", "batch": 64,
         "partitioners": {"ours": part(1.01, 1.30), "fia_v2_sink_metadata": part(1.10, 1.20)}},
    ]}  # fmt: skip
    text = tool.render("balance.json", result)
    row = next(line for line in text.splitlines() if line.split()[:1] == ["16/1"])
    assert row.split()[3:] == ["1.0300", "1.3000", "1.1500", "1.4000"]
    assert "16/1 trace ours batch 64 worst: ours 1.3000 > competitor 1.2000" in text
    window = {"window": 128, "cases": [
        {"geometry": "32/8", "source": "trace", "batch": 16,
         "ratios": {"ours": {"mean": 1.0, "worst": 1.0},
                    "fia_v2_sink_metadata": {"mean": 1.3, "worst": 1.7}}}]}  # fmt: skip
    text = tool.render("window.json", window)
    assert "(window 128)" in text and text.rstrip().endswith("none")
    assert tool.main([]) == 2
