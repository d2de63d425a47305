"""Decode-loop workloads for tests and benchmarks.

- `trace`: the Azure LLM conversation trace (path lookup and loading).
- `synthetic`: synthetic request-length distributions.
- `batching`: continuous batching into padded capture buckets, with speculative decode
  and chunked prefill.
- `reference`: an independent float64 per-request attention.
- `driver`: the decode loop that feeds a `StaticAttention` and checks every step.
"""
