"""Engine factories for ``AICPU_TILING_ENGINE`` in the C8 dry run (test_in_vllm_ascend.py).

``make_unscaled``: the real NPU engine, except that it hands the kernels unit scales instead of
a C8 layer's own (the int8 values read as they are stored). The dry run must catch it: each C8
layer is then about its ``scales_distance`` away from the float64 reference.
"""

import dataclasses


def make_unscaled():
    import torch

    from pyruntime import backends
    from pyruntime.hook.npu_engine import vllm_tiling_engine

    engine = vllm_tiling_engine(backends.get("npu"))
    capture = engine.capture_attention

    def capture_unscaled(c):
        if c.kv_scales is not None:
            ones = torch.ones_like(c.kv_scales[0])  # allocated at capture, filled once
            c = dataclasses.replace(c, kv_scales=(ones, c.kv_scales[1], ones, c.kv_scales[3]))
        capture(c)

    engine.capture_attention = capture_unscaled
    return engine
