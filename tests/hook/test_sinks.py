"""Attention sinks in the hook (issue 19): which sink layers take the device path, and what the
NPU engine hands its kernels.

The end-to-end evidence is in test_in_vllm_ascend.py (vLLM-Ascend's own classes capture a
gpt-oss-shaped sink layer through ``full_graph_fia_v2`` on the NPU twin and match float64 with
the sinks; an engine that drops them fails). Here: the one-line reasons of
``unsupported_reason`` for every sink layer that must keep vLLM-Ascend's FIA v2 path, and the
engine passing the layer's own sinks tensor (the same object, no copy) to both kernels.
"""

import types

import pytest
import torch

from pyruntime.hook import vllm_ascend_patches as patches
from pyruntime.hook.engine import AttentionCapture

HEADS, KV_HEADS, HEAD = 8, 2, 16


class _Impl:
    """The attributes ``unsupported_reason`` reads on ``AscendAttentionBackendImpl``."""

    def __init__(self, sinks=None, sliding_window=None):
        self.num_heads, self.num_kv_heads, self.head_size = HEADS, KV_HEADS, HEAD
        self.sliding_window, self.sinks = sliding_window, sinks
        self.kv_cache_dtype, self.alibi_slopes, self.attn_type = "auto", None, "decoder"
        self.enable_c8_quant = False


def _metadata(device="cpu"):
    lengths = patches.DeviceLengths(torch.zeros(3, dtype=torch.int32, device=device),
                                    torch.zeros(2, dtype=torch.int32, device=device),
                                    torch.zeros(2, 4, dtype=torch.int32, device=device),
                                    torch.ones(1, dtype=torch.int32, device=device))
    meta = types.SimpleNamespace(causal=True)
    setattr(meta, patches.LENGTHS_ATTR, lengths)
    return meta


def _reason(impl, *, applies_sinks=True):
    return patches.unsupported_reason(impl, _Impl, types.SimpleNamespace(is_draft_model=False),
                                      _metadata(), torch.device("cpu"), applies_soft_cap=True,
                                      applies_sinks=applies_sinks)


def test_float32_sinks_of_the_layer_take_the_device_path():
    assert _reason(_Impl(torch.zeros(HEADS))) is None
    # a bf16 model (vLLM loads gpt-oss's sinks in the model dtype): read in place, widened on load
    assert _reason(_Impl(torch.zeros(HEADS, dtype=torch.bfloat16))) is None
    assert _reason(_Impl(torch.zeros(HEADS, dtype=torch.float16))) is None
    # vLLM's gpt_oss.py holds them as a Parameter (requires_grad=False)
    assert _reason(_Impl(torch.nn.Parameter(torch.zeros(HEADS), requires_grad=False))) is None
    assert _reason(_Impl(None)) is None


@pytest.mark.parametrize("sinks, applies, words", [
    (torch.zeros(HEADS), False, "does not add them (no applies_sinks)"),
    (torch.zeros(HEADS, dtype=torch.float64), True, "attention sinks in torch.float64"),
    (torch.zeros(HEADS, dtype=torch.int32), True, "attention sinks in torch.int32"),
    (torch.zeros(HEADS + 1), True, f"of shape [{HEADS + 1}]"),
    (torch.zeros(HEADS, 2)[:, 0], True, "contiguous: False"),
    ([0.0] * HEADS, True, "of type list are not a tensor"),
])
def test_sinks_our_kernels_cannot_read_in_place_keep_fia_v2(sinks, applies, words):
    reason = _reason(_Impl(sinks), applies_sinks=applies)
    assert reason is not None and words in reason, reason


def test_sinks_on_another_device_than_the_query_keep_fia_v2():
    reason = _reason(_Impl(torch.zeros(HEADS, device="meta")))
    assert reason == "the attention sinks are on meta, the query on cpu"


def test_a_windowed_sink_layer_names_the_window_not_the_sinks():
    """gpt-oss's even layers: a window and sinks. On an engine that does not apply windows the
    window keeps them on the host path; the reason says the sinks are there too (the device
    path for windows: test_windows.py)."""
    reason = _reason(_Impl(torch.zeros(HEADS), sliding_window=128))
    assert reason == ("sliding window (128) (with attention sinks): the tiling engine does not "
                      "apply it (no applies_sliding_window), so the layer keeps vLLM-Ascend's "
                      "path")
    assert _reason(_Impl(None, sliding_window=128)).startswith("sliding window (128): ")


class _Ops:
    """Records the keyword arguments of each op the engine launches."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda **kwargs: self.calls.append((name, kwargs))


def _capture(graph_key, sinks):
    q = torch.zeros(4, HEADS, HEAD)
    cache = torch.zeros(8, 16, KV_HEADS * HEAD)
    i32 = torch.int32
    return AttentionCapture(
        graph_key=graph_key, layer_name="layer", query=q, key_cache=cache, value_cache=cache,
        block_table=torch.zeros(2, 4, dtype=i32), query_start_loc=torch.zeros(3, dtype=i32),
        seq_lens=torch.zeros(2, dtype=i32), batch=torch.ones(1, dtype=i32),
        output=torch.zeros(4, HEADS * HEAD), num_heads=HEADS, num_kv_heads=KV_HEADS,
        head_size=HEAD, block_size=16, scale=HEAD ** -0.5, causal=True, sinks=sinks)


def test_the_npu_engine_hands_the_layers_own_sinks_to_both_kernels():
    pytest.importorskip("pyruntime.tiling", reason="needs our tiling kernels")
    from pyruntime.hook.npu_engine import NpuTilingEngine

    ops = _Ops()
    engine = NpuTilingEngine("pre-replay", num_cores=4, ops=ops)
    assert engine.applies_sinks is True
    sinks = torch.nn.Parameter(torch.randn(HEADS), requires_grad=False)
    engine.capture_attention(_capture(("g", 4), sinks))
    engine.capture_attention(_capture(("g", 4), None))
    names = [name for name, _ in ops.calls]
    assert names == ["paged_attention", "attention_combine"] * 2
    with_sinks, without = ops.calls[:2], ops.calls[2:]
    # the very tensor the model holds: the kernels read its values at every replay
    assert all(kwargs["sinks"] is sinks for _, kwargs in with_sinks)
    # a layer without sinks launches with the arguments it had before sinks existed
    assert all("sinks" not in kwargs for _, kwargs in without)
