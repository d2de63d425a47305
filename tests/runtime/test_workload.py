"""The workload: trace lookup, continuous batching invariants, synthetic streams."""

import numpy as np
import pytest

from pyruntime.workload import trace as trace_mod
from pyruntime.workload.batching import ContinuousBatcher
from pyruntime.workload.synthetic import synthetic_requests


def test_trace_path_default_and_override(tmp_path, monkeypatch):
    monkeypatch.delenv(trace_mod.TRACE_ENV, raising=False)
    try:
        default = trace_mod.trace_path()
    except trace_mod.TraceNotFoundError:
        default = None
    if default is not None:
        assert default.parts[-3:] == ("shared", "data", trace_mod.TRACE_NAME)
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   "2023-11-16 18:15:46.5,374,44\n2023-11-16 18:15:48.0,10,2\n")
    monkeypatch.setenv(trace_mod.TRACE_ENV, str(csv))
    reqs = trace_mod.load_trace()
    assert [(r.context_tokens, r.generated_tokens) for r in reqs] == [(374, 44), (10, 2)]
    assert reqs[1].arrival_s == pytest.approx(1.5)
    monkeypatch.setenv(trace_mod.TRACE_ENV, str(tmp_path / "missing.csv"))
    with pytest.raises(trace_mod.TraceNotFoundError, match="set AICPU_TILING_TRACE"):
        trace_mod.trace_path()


def test_real_trace_loads():
    reqs = trace_mod.load_trace(limit=100)
    assert len(reqs) == 100 and reqs[0].arrival_s == 0
    assert all(r.context_tokens > 0 and r.generated_tokens > 0 for r in reqs)


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
