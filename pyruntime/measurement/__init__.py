"""Measurement: the step sources and the interleaved A/B loop that ``aicpu-tiling bench`` and
``profile`` and the self-check's host-time check all run.

- `sources`: where a run's steps come from (the request trace, synthetic distributions), as
  per-step lengths of a continuous batch.
- `abrun`: `StaticAttention` (or `StaticMLAAttention`) in several modes on identical steps,
  interleaved, host time measured warm with the device held.

It sits below both of its users (`pyruntime.cli` and `pyruntime.selfcheck`), on
`pyruntime.workload` and `pyruntime.profiler` (docs/design.md, section 8).
"""
