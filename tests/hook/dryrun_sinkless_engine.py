"""An engine factory for ``AICPU_TILING_ENGINE`` in the dry run: the real NPU engine, except
that it drops every layer's attention sinks while still declaring ``applies_sinks``. The dry
run must catch it (test_in_vllm_ascend.py): the sink layer is then far from the float64
reference with the sinks."""

import dataclasses


def make():
    from pyruntime import backends
    from pyruntime.hook.npu_engine import vllm_tiling_engine

    engine = vllm_tiling_engine(backends.get("npu"))
    capture = engine.capture_attention

    def capture_without_sinks(c):
        capture(dataclasses.replace(c, sinks=None))

    engine.capture_attention = capture_without_sinks
    return engine
