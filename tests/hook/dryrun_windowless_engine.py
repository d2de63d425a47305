"""Engine factories for ``AICPU_TILING_ENGINE`` in the dry run (test_in_vllm_ascend.py).

``make``: the real NPU engine, except that it drops every layer's sliding window (the
attention and the tiling both run unwindowed) while still declaring
``applies_sliding_window``. The dry run must catch it: each windowed layer is then about its
``window_distance`` from the float64 reference with the window.

``make_host_windows``: the real NPU engine without ``applies_sliding_window``, so that windowed
layers keep vLLM-Ascend's host path in a graph whose other layers are device-tiled (a mixed
graph: vLLM-Ascend's own update runs for the host-path layer only).
"""

import dataclasses


def make():
    from pyruntime import backends
    from pyruntime.hook.npu_engine import vllm_tiling_engine

    engine = vllm_tiling_engine(backends.get("npu"))
    capture = engine.capture_attention

    def capture_without_window(c):
        capture(dataclasses.replace(c, sliding_window=None, graph_windows=()))

    engine.capture_attention = capture_without_window
    return engine


def make_host_windows():
    from pyruntime import backends
    from pyruntime.hook.npu_engine import vllm_tiling_engine

    engine = vllm_tiling_engine(backends.get("npu"))
    engine.applies_sliding_window = False  # an instance attribute: this engine only
    return engine
