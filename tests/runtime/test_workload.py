"""The workload: trace lookup, continuous batching invariants, synthetic streams."""

import gzip
import itertools
from pathlib import Path

import numpy as np
import pytest

from pyruntime.workload import trace as trace_mod
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.synthetic import synthetic_requests

TRACE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
TRACE_ROWS = "2023-11-16 18:15:46.5,374,44\n2023-11-16 18:15:48.0,10,2\n"


def test_trace_default_is_the_bundled_package_data(monkeypatch):
    monkeypatch.delenv(trace_mod.TRACE_ENV, raising=False)
    default = trace_mod.trace_path()
    assert default == trace_mod.bundled_trace_path()
    assert default.name == trace_mod.TRACE_NAME == "azure_llm_2023_conv.csv.gz"
    package_dir = Path(trace_mod.__file__).resolve().parent
    assert default.resolve().parent == package_dir / "data"  # inside the package, nowhere else
    assert (package_dir / "data" / "ATTRIBUTION.md").is_file()


def test_bundled_trace_is_the_whole_azure_conversation_trace():
    reqs = trace_mod.load_trace()
    assert len(reqs) == 19366 and reqs[0].arrival_s == 0
    assert (reqs[0].context_tokens, reqs[0].generated_tokens) == (374, 44)
    assert all(b.arrival_s >= a.arrival_s for a, b in itertools.pairwise(reqs))
    assert trace_mod.load_trace(limit=100) == reqs[:100]


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz", "t.data"])
def test_trace_override_reads_plain_or_gzip_whatever_the_name(tmp_path, monkeypatch, compressed,
                                                             name):
    text = "ignored,GeneratedTokens,ContextTokens,TIMESTAMP\n"  # any order, extra columns
    text += "x,44,374,2023-11-16 18:15:46.5\ny,2,10,2023-11-16 18:15:48.0\n"
    data = gzip.compress(text.encode()) if compressed else text.encode()
    (tmp_path / name).write_bytes(data)
    monkeypatch.setenv(trace_mod.TRACE_ENV, str(tmp_path / name))
    assert trace_mod.trace_path() == tmp_path / name
    reqs = trace_mod.load_trace()
    assert [(r.context_tokens, r.generated_tokens) for r in reqs] == [(374, 44), (10, 2)]
    assert reqs[1].arrival_s == pytest.approx(1.5)


def test_trace_arrivals_cross_a_month_boundary(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(TRACE_HEADER + "2023-11-30 23:59:59,1,1\n2023-12-01 00:00:01,1,1\n")
    assert trace_mod.load_trace(path)[1].arrival_s == pytest.approx(2.0)


def test_trace_override_missing_file_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.setenv(trace_mod.TRACE_ENV, str(tmp_path / "missing.csv"))
    with pytest.raises(trace_mod.TraceNotFoundError, match="set AICPU_TILING_TRACE") as info:
        trace_mod.trace_path()
    assert isinstance(info.value, FileNotFoundError)
    assert isinstance(info.value, trace_mod.TraceError)
    with pytest.raises(trace_mod.TraceNotFoundError):
        trace_mod.load_trace()
    with pytest.raises(trace_mod.TraceNotFoundError):
        trace_mod.load_trace(tmp_path / "missing.csv")


def test_an_install_without_its_data_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.delenv(trace_mod.TRACE_ENV, raising=False)
    monkeypatch.setattr(trace_mod.resources, "files", lambda package: tmp_path)  # no data/
    with pytest.raises(trace_mod.TraceNotFoundError, match="installed without its data"):
        trace_mod.trace_path()


@pytest.mark.parametrize("text, fragment", [
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", "lacks column GeneratedTokens"),
    ("q_len,kv_len\n1,700\n", "lacks column TIMESTAMP, ContextTokens, GeneratedTokens"),
    ("", "lacks column"),
    (TRACE_HEADER, "has no requests"),
    (TRACE_HEADER + "2023-11-16 18:15:46,3,x\n", "line 2"),
    (TRACE_HEADER + "2023-11-16 18:15:46,3\n", "line 2"),
    (TRACE_HEADER + "yesterday,3,4\n", "line 2"),
    (TRACE_HEADER + "2023-11-16 18:15:46,-3,4\n", "negative"),
])  # fmt: skip
def test_malformed_trace_is_a_typed_error(tmp_path, text, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(trace_mod.TraceFormatError, match=fragment) as info:
        trace_mod.load_trace(path)
    assert isinstance(info.value, ValueError) and str(path) in str(info.value)


def test_truncated_gzip_trace_is_a_typed_error(tmp_path):
    path = tmp_path / "bad.csv.gz"
    path.write_bytes(gzip.compress((TRACE_HEADER + TRACE_ROWS * 200).encode())[:-30])
    with pytest.raises(trace_mod.TraceFormatError, match="cannot read"):
        trace_mod.load_trace(path)


@pytest.mark.parametrize("spec, chunk", [(1, 0), (3, 0), (2, 16)])
def test_batches_are_valid_and_padded(spec, chunk):
    requests = synthetic_requests("long_tail", 80, max_context=200, max_generated=20)
    batcher = ContinuousBatcher(requests, max_batch=8, max_tokens=32, block_size=8,
                                max_blocks_per_req=32, num_blocks=300, buckets=[2, 4, 8],
                                spec_tokens=spec, prefill_chunk=chunk)
    steps = list(batcher)
    assert batcher.finished == 80
    for b in steps:
        q = np.diff(b.cu_seqlens_q)
        assert b.cu_seqlens_q[0] == 0 and (q >= 0).all() and b.num_tokens <= 32
        assert b.bucket in (2, 4, 8) and b.bucket >= b.live
        assert (q[b.live:] == 0).all() and (b.seqlens_kv[b.live:] == 0).all()
        assert (b.seqlens_kv[: b.live] >= q[: b.live]).all()
        used = [b.block_table[r, : -(-int(b.seqlens_kv[r]) // 8)] for r in range(b.live)]
        flat = np.concatenate(used)
        assert len(set(flat.tolist())) == flat.size  # no block shared by two requests
    if chunk:
        assert any(b.prefills for b in steps)


def test_synthetic_kinds():
    assert len(synthetic_requests("uniform", 5, max_context=10)) == 5
    with pytest.raises(ValueError, match="kind must be one of"):
        synthetic_requests("zipf", 5, max_context=10)
