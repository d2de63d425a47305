"""Sliding windows in the hook (issue 19): which windowed layers take the device path, and
what the NPU engine plans and hands its kernels.

The end-to-end evidence is in test_in_vllm_ascend.py (vLLM-Ascend's own classes capture
gpt-oss-shaped and Gemma-shaped layer sets on the NPU twin, every layer on the device path,
matching float64 with the model's W keys; an engine that drops the window fails). Here: the
reasons of ``unsupported_reason`` for windowed layers, the one log line per windowed layer,
and the engine's one tiling per distinct window, all planned by one launch per step.
"""

import logging
import types

import pytest
import torch

from pyruntime.hook import vllm_ascend_patches as patches
from pyruntime.hook.engine import AttentionCapture

HEADS, KV_HEADS, HEAD = 8, 2, 16


class _Impl:
    """The attributes ``unsupported_reason`` reads on ``AscendAttentionBackendImpl``; built
    after the hook was installed (its patched ``__init__`` recorded the soft cap) unless
    ``recorded`` is False."""

    def __init__(self, sliding_window=None, sinks=None, recorded=True):
        self.num_heads, self.num_kv_heads, self.head_size = HEADS, KV_HEADS, HEAD
        self.sliding_window, self.sinks = sliding_window, sinks
        self.kv_cache_dtype, self.alibi_slopes, self.attn_type = "auto", None, "decoder"
        self.enable_c8_quant = False
        if recorded:
            setattr(self, patches.SOFT_CAP_ATTR, None)


def _reason(impl, *, applies=True):
    lengths = patches.DeviceLengths(*(torch.zeros(n, dtype=torch.int32) for n in (3, 2)),
                                    torch.zeros(2, 4, dtype=torch.int32),
                                    torch.ones(1, dtype=torch.int32))
    meta = types.SimpleNamespace(causal=True)
    setattr(meta, patches.LENGTHS_ATTR, lengths)
    return patches.unsupported_reason(impl, _Impl, types.SimpleNamespace(is_draft_model=False),
                                      meta, torch.device("cpu"), applies_sinks=True,
                                      applies_sliding_window=applies)


@pytest.mark.parametrize("sinks", [None, torch.zeros(HEADS)], ids=["alone", "with sinks"])
def test_a_windowed_layer_takes_the_device_path_when_the_engine_applies_windows(sinks):
    assert _reason(_Impl(128, sinks)) is None
    assert _reason(_Impl(0, sinks)) is None  # 0 is off, as in vLLM-Ascend (``or SWA_INT_MAX``)
    reason = _reason(_Impl(128, sinks), applies=False)
    assert reason.startswith("sliding window (128)") and "no applies_sliding_window" in reason


@pytest.mark.parametrize("impl, words", [
    (_Impl(128, recorded=False), "built before the hook was installed"),
    (_Impl(-3), "sliding_window=-3 is not an int >= 1"),
    (_Impl(2.5), "sliding_window=2.5 is not an int >= 1"),
    (_Impl(True), "sliding_window=True is not an int >= 1"),
])
def test_windows_the_device_path_cannot_take_keep_the_host_path(impl, words):
    reason = _reason(impl)
    assert reason is not None and words in reason, reason


def test_an_implementation_without_the_attribute_keeps_the_host_path():
    impl = _Impl()
    del impl.sliding_window
    assert _reason(impl) == "the implementation has no attribute 'sliding_window' (not built by its __init__)"


def test_the_patched_init_records_every_window():
    windows = set()

    class Impl:
        def __init__(self, num_heads, sliding_window, logits_soft_cap=None):
            self.sliding_window = sliding_window

    init = patches.make_init(Impl.__init__, windows)
    for w in (None, 128, 0, 128):
        init(Impl.__new__(Impl), 8, w)
    assert windows == {None, 128}  # vLLM's 0 is off: our None (ours refuses 0)


def test_the_hook_logs_one_line_per_windowed_layer(caplog):
    state = patches.PatchState(engine=types.SimpleNamespace(), line="t")
    impl = _Impl(128)
    with caplog.at_level(logging.INFO, logger="pyruntime.hook"):
        for _ in range(3):
            patches._note_window(state, impl, 128)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "sees its last 128 keys" in lines[0] and "(pre_tokens=128) keeps 129" in lines[0]


class _Ops:
    """Records the keyword arguments of each op the engine launches."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda **kwargs: self.calls.append((name, kwargs))


def _capture(graph_key, window, graph_windows, name="layer"):
    q = torch.zeros(4, HEADS, HEAD)
    cache = torch.zeros(8, 16, KV_HEADS * HEAD)
    i32 = torch.int32
    return AttentionCapture(
        graph_key=graph_key, layer_name=name, query=q, key_cache=cache, value_cache=cache,
        block_table=torch.zeros(2, 4, dtype=i32), query_start_loc=torch.zeros(3, dtype=i32),
        seq_lens=torch.zeros(2, dtype=i32), batch=torch.ones(1, dtype=i32),
        output=torch.zeros(4, HEADS * HEAD), num_heads=HEADS, num_kv_heads=KV_HEADS,
        head_size=HEAD, block_size=16, scale=HEAD ** -0.5, causal=True,
        sliding_window=window, graph_windows=graph_windows)


@pytest.mark.parametrize("placement", ["graph", "pre-replay"])
def test_the_npu_engine_plans_one_tiling_per_window_in_one_launch(placement):
    """gpt-oss: windowed (128) and full layers alternate in one graph. One launch per step
    plans both tilings (same lengths, batch, epoch); each layer reads its window's tiling and
    passes its window to the attention only."""
    pytest.importorskip("pyruntime.tiling", reason="needs our tiling kernels")
    from pyruntime.hook.npu_engine import NpuTilingEngine
    from pyruntime.kernels.step import split_params

    ops = _Ops()
    engine = NpuTilingEngine(placement, num_cores=4, ops=ops)
    assert engine.applies_sliding_window is True
    windows = (None, 128)
    for i in range(4):
        engine.capture_attention(_capture(("g", 4), 128 if i % 2 == 0 else None, windows))
    engine.before_replay(4)
    names = [name for name, _ in ops.calls]
    assert names.count("plan_tilings") == 1 and "plan_tiling" not in names
    plan = next(kwargs for name, kwargs in ops.calls if name == "plan_tilings")
    planned = split_params(plan["params"], len(plan["tiling_outs"]))
    assert [p[-1] for p in planned] == [0, 128]  # sliding_window is the last params field
    key = engine.keys[("g", 4)]
    assert plan["tiling_outs"] == [key.tilings[None][1], key.tilings[128][1]]
    attention = [kwargs for name, kwargs in ops.calls if name == "paged_attention"]
    assert [a.get("sliding_window") for a in attention] == [128, None, 128, None]
    assert [a["tiling_in"] is key.tilings[128 if i % 2 == 0 else None][1]
            for i, a in enumerate(attention)] == [True] * 4
    assert all(a["params"][-1] == (128 if i % 2 == 0 else 0) for i, a in enumerate(attention))
    combine = [kwargs for name, kwargs in ops.calls if name == "attention_combine"]
    assert all("sliding_window" not in c for c in combine)
    assert [c["tiling_in"] is a["tiling_in"] for c, a in zip(combine, attention)] == [True] * 4


def test_a_graph_without_windows_keeps_the_single_tiling_launch():
    pytest.importorskip("pyruntime.tiling", reason="needs our tiling kernels")
    from pyruntime.hook.npu_engine import NpuTilingEngine

    ops = _Ops()
    engine = NpuTilingEngine("graph", num_cores=4, ops=ops)
    engine.capture_attention(_capture(("g", 4), None, ()))
    assert [name for name, _ in ops.calls] == ["plan_tiling", "paged_attention",
                                               "attention_combine"]
    assert "sliding_window" not in ops.calls[1][1]


def test_a_window_the_graphs_tiling_task_does_not_plan_is_refused():
    pytest.importorskip("pyruntime.tiling", reason="needs our tiling kernels")
    from pyruntime.backends.errors import BackendError
    from pyruntime.hook.npu_engine import NpuTilingEngine

    engine = NpuTilingEngine("graph", num_cores=4, ops=_Ops())
    engine.capture_attention(_capture(("g", 4), None, (None, 128)))
    with pytest.raises(BackendError, match="sliding window 64 is not among the windows"):
        engine.capture_attention(_capture(("g", 4), 64, (None, 128), name="late"))
