"""tools/bench_attention.py: its core groupings run every core exactly once, and a small run
reports the grouping it used with a positive throughput."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "bench_attention.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_attention", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RecordingBound:
    """Stands in for BoundAttention: records which cores each call would run."""

    def __init__(self, num_cores: int, num_kv_heads: int):
        self.num_cores = num_cores
        fused = num_cores % num_kv_heads == 0
        self.num_sibling_sets = num_cores // num_kv_heads if fused else num_cores
        self.ran: list[int] = []

    def sibling_cores(self, first_core):
        return range(first_core, self.num_cores, self.num_sibling_sets)

    def core_siblings(self, first_core):
        self.ran.extend(self.sibling_cores(first_core))
        return 0

    def core_span(self, first_core, num_cores):
        assert num_cores >= 1
        self.ran.extend(range(first_core, first_core + num_cores))
        return 0

    def core(self, core):
        self.ran.append(core)
        return 0


@pytest.mark.parametrize("cores, heads", [(24, 8), (24, 32), (5, 8), (1, 1), (3, 4)])
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("grouping", ["auto", "siblings", "spans", "cores"])
def test_every_grouping_runs_every_core_once(bench, cores, heads, threads, grouping):
    bound = RecordingBound(cores, heads)
    jobs = bench.core_jobs(bound, grouping, threads)
    assert all(job() == 0 for job in jobs)
    assert sorted(bound.ran) == list(range(cores))
    if bench.resolve_grouping(bound, grouping) == "spans":
        assert len(jobs) == min(threads, cores)  # one span per thread, none empty


def test_auto_grouping_fuses_by_sibling_sets_only_when_they_fuse(bench):
    assert bench.resolve_grouping(RecordingBound(24, 8), "auto") == "siblings"
    assert bench.resolve_grouping(RecordingBound(24, 32), "auto") == "spans"
    assert bench.resolve_grouping(RecordingBound(24, 32), "cores") == "cores"


@pytest.mark.parametrize("cores, grouping", [(6, "spans"), (8, "siblings")])
def test_small_run_reports_its_grouping(bench, capsys, cores, grouping):
    argv = ["--batch", "4", "--max-kv", "512", "--q-heads", "8", "--kv-heads", "4",
            "--head-dim", "64", "--cores", str(cores), "--threads", "2", "--repeats", "1",
            "--bandwidth-mb", "8", "--json"]
    assert bench.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["grouping"] == grouping
    assert result["kv_bytes_per_second"] > 0 and result["step_seconds"] > 0
