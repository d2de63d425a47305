"""C8 layers (vLLM-Ascend's int8 KV cache) in the hook: which take the device path, the scales
our kernels get, and what the NPU engine hands its kernels.

The end-to-end evidence is in test_in_vllm_ascend.py (vLLM-Ascend's own
``AscendC8AttentionBackendImpl`` captured on the NPU twin, our kernels reading its int8 NZ
caches in place, against float64; an engine that drops the scales is caught), and what vLLM-Ascend
itself does is read from every release in test_c8_conformance.py. Here: the one-line reasons,
the fp32 scales made from the layer's (per channel and per tensor, any float dtype; zero
offsets, logged once when the layer's are not zero), and the engine's arguments.
"""

import logging
import types

import pytest
import torch

from pyruntime.hook import vllm_ascend_c8 as c8
from pyruntime.hook import vllm_ascend_patches as patches
from pyruntime.hook.engine import AttentionCapture

HEADS, KV_HEADS, HEAD, BLOCKS, BLOCK = 8, 2, 64, 6, 32


class _Impl:
    """The attributes ``unsupported_reason`` and ``c8_reason`` read on a C8 implementation,
    and vLLM-Ascend's ``_nz_5d_view`` rule (read from every release by test_c8_conformance)."""

    def __init__(self, head_size=HEAD, cache_dtype=torch.int8, kv_cache_dtype="int8"):
        self.num_heads, self.num_kv_heads, self.head_size = HEADS, KV_HEADS, head_size
        self.sliding_window, self.sinks = None, None
        self.kv_cache_dtype, self.alibi_slopes, self.attn_type = kv_cache_dtype, None, "decoder"
        self.enable_c8_quant = True
        shape = (BLOCKS, BLOCK, KV_HEADS, head_size)
        self.key_cache = torch.zeros(shape, dtype=cache_dtype)
        self.value_cache = torch.zeros(shape, dtype=cache_dtype)

    def _nz_5d_view(self, cache, block_size):
        return cache.view(-1, self.num_kv_heads, self.head_size // 32, block_size, 32)


class _Plain(_Impl):
    """Stands in for ``AscendAttentionBackendImpl`` (the C8 class is its subclass)."""


class _C8(_Plain):
    pass


class _OtherSubclass(_Plain):
    pass


def _layer(dtype=torch.bfloat16, per_tensor=False, offset=0.0, prepared=True):
    """A vLLM layer after ``_prepare_c8_scales``: ``_c8_*`` of ``[1, kv_heads, head]`` (or
    ``[1]`` per tensor) in the model dtype."""
    shape = (1,) if per_tensor else (1, KV_HEADS, HEAD)
    gen = torch.Generator().manual_seed(0)
    layer = types.SimpleNamespace(layer_name="model.layers.0.self_attn.attn")
    for name in ("k", "v"):
        setattr(layer, f"_c8_{name}_scale",
                (0.01 + torch.rand(shape, generator=gen)).to(dtype))
        setattr(layer, f"_c8_{name}_offset", torch.full(shape, offset, dtype=dtype))
    if prepared:
        layer._c8_scales_prepared = True
    return layer


def _metadata():
    lengths = patches.DeviceLengths(torch.zeros(3, dtype=torch.int32),
                                    torch.zeros(2, dtype=torch.int32),
                                    torch.zeros(2, 4, dtype=torch.int32),
                                    torch.ones(1, dtype=torch.int32))
    meta = types.SimpleNamespace(causal=True)
    setattr(meta, patches.LENGTHS_ATTR, lengths)
    return meta


def _reason(impl, layer, *, applies=True):
    return patches.unsupported_reason(impl, _Plain, types.SimpleNamespace(is_draft_model=False),
                                      _metadata(), torch.device("cpu"), c8_cls=_C8,
                                      layer=layer, applies_kv_int8=applies)


def test_a_c8_layer_takes_the_device_path_on_an_engine_that_reads_int8():
    assert _reason(_C8(), _layer()) is None
    assert _reason(_C8(kv_cache_dtype=torch.int8), _layer()) is None  # 0.29+: a torch dtype
    assert _reason(_C8(), _layer(torch.float32, per_tensor=True)) is None


@pytest.mark.parametrize("impl, layer, applies, words", [
    (_C8(), _layer(), False, "no applies_kv_int8"),
    (_C8(kv_cache_dtype="fp8"), _layer(), True, "kv_cache_dtype='fp8'"),
    (_C8(head_size=48), _layer(), True, "head_size 48"),
    (_C8(cache_dtype=torch.float16), _layer(), True, "not 4-D int8"),
    (_C8(), None, True, "layer=None"),
    (_C8(), _layer(prepared=False), True, None),  # prepared flag is not what is read
    (_OtherSubclass(), _layer(), True, "subclass _OtherSubclass"),
])
def test_c8_layers_our_kernels_cannot_read_keep_vllm_ascends_path(impl, layer, applies, words):
    reason = _reason(impl, layer, applies=applies)
    if words is None:
        assert reason is None
    else:
        assert reason is not None and words in reason, reason


def test_c8_with_a_window_or_sinks_or_odd_scales_keeps_vllm_ascends_path():
    windowed = _C8()
    windowed.sliding_window = 128
    assert "sliding window or attention sinks" in _reason(windowed, _layer())
    missing = _layer()
    del missing._c8_v_offset
    assert "lacks _c8_v_offset" in _reason(_C8(), missing)
    odd = _layer()
    odd._c8_k_scale = torch.ones(3)
    assert "_c8_k_scale of shape [3]" in _reason(_C8(), odd)
    ints = _layer()
    ints._c8_v_scale = torch.ones(1, KV_HEADS, HEAD, dtype=torch.int32)
    assert "_c8_v_scale" in _reason(_C8(), ints)


def test_a_plain_layer_with_a_quantized_cache_still_keeps_vllm_ascends_path():
    plain = _Plain(kv_cache_dtype="int8")
    reason = _reason(plain, _layer())
    assert "KV-cache quantization" in reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_kernels_get_fp32_per_channel_scales_and_zero_offsets(dtype):
    layer = _layer(dtype, offset=3.0)
    k_scale, k_offset, v_scale, v_offset = c8.kv_scales(_C8(), layer)
    for t in (k_scale, k_offset, v_scale, v_offset):
        assert t.dtype == torch.float32 and t.shape == (KV_HEADS, HEAD) and t.is_contiguous()
    assert torch.equal(k_scale, layer._c8_k_scale.float().view(KV_HEADS, HEAD))
    assert torch.equal(v_scale, layer._c8_v_scale.float().view(KV_HEADS, HEAD))
    # vLLM-Ascend's FIA and dense fallback dequantise with the scale alone: so do we
    assert not k_offset.any() and not v_offset.any()
    # made once: the same tensors at every later capture (the kernels read them at replay)
    again = c8.kv_scales(_C8(), layer)
    assert all(a is b for a, b in zip(again, (k_scale, k_offset, v_scale, v_offset)))


def test_scales_made_inside_a_capture_are_made_per_graph():
    """A layer first met inside a capture: a copy captured in one graph runs only when that
    graph replays, so each graph gets its own set; a set made outside any graph (the eager
    warm-up) serves every graph."""
    layer = _layer()
    first = c8.kv_scales(_C8(), layer, graph_key=("g", 2))
    again = c8.kv_scales(_C8(), layer, graph_key=("g", 2))
    other = c8.kv_scales(_C8(), layer, graph_key=("g", 4))
    assert all(a is b for a, b in zip(first, again))
    assert all(a is not b for a, b in zip(first, other))
    assert all(torch.equal(a, b) for a, b in zip(first, other))
    eager = c8.kv_scales(_C8(), layer)
    assert all(a is not b for a, b in zip(eager, first))
    assert all(a is b for a, b in zip(eager, c8.kv_scales(_C8(), layer, graph_key=("g", 8))))


def test_a_per_tensor_scale_is_broadcast_to_every_channel():
    layer = _layer(torch.bfloat16, per_tensor=True)
    k_scale, _, v_scale, _ = c8.kv_scales(_C8(), layer)
    assert torch.equal(k_scale, layer._c8_k_scale.float().expand(KV_HEADS, HEAD))
    assert torch.equal(v_scale, layer._c8_v_scale.float().expand(KV_HEADS, HEAD))


def test_non_zero_offsets_are_logged_once_per_layer(caplog):
    noted: set = set()
    layer, plain = _layer(offset=2.0), _layer()
    plain.layer_name = "model.layers.1.self_attn.attn"
    with caplog.at_level(logging.INFO, logger="pyruntime.hook"):
        c8.prepare_eager(_C8(), layer, noted)
        c8.prepare_eager(_C8(), plain, noted)
        del layer._aicpu_tiling_kv_scales
        c8.prepare_eager(_C8(), layer, noted)  # made again, not logged again
    lines = [r.getMessage() for r in caplog.records if "non-zero KV offsets" in r.getMessage()]
    assert len(lines) == 1 and "model.layers.0.self_attn.attn" in lines[0]
    assert getattr(plain, c8.KV_SCALES_ATTR) is not None


def test_scales_are_not_made_before_vllm_ascend_prepared_its_own():
    layer = _layer(prepared=False)
    c8.prepare_eager(_C8(), layer, set())
    assert getattr(layer, c8.KV_SCALES_ATTR, None) is None


def test_the_nz_views_of_the_layers_own_caches_go_to_the_engine():
    impl = _C8()
    key, value, block_size = c8.nz_caches(impl)
    assert block_size == BLOCK
    assert key.shape == (BLOCKS, KV_HEADS, HEAD // 32, BLOCK, 32)
    assert key.data_ptr() == impl.key_cache.data_ptr()  # a view: read in place
    assert value.data_ptr() == impl.value_cache.data_ptr()


def test_the_npu_engine_passes_nz_caches_and_scales_as_they_are():
    from pyruntime.hook.npu_engine import NpuTilingEngine

    calls = []

    class _Ops:
        def __getattr__(self, name):
            return lambda **kwargs: calls.append((name, kwargs))

    engine = NpuTilingEngine("graph", num_cores=4, ops=_Ops(), launch=lambda fn: fn())
    assert engine.applies_kv_int8 is True
    impl, layer = _C8(), _layer()
    key, value, block_size = c8.nz_caches(impl)
    scales = c8.kv_scales(impl, layer)
    lengths = _metadata().__dict__[patches.LENGTHS_ATTR]
    engine.capture_attention(AttentionCapture(
        graph_key=("g", 4), layer_name="l0", query=torch.zeros(4, HEADS, HEAD),
        key_cache=key, value_cache=value, block_table=lengths.block_table,
        query_start_loc=lengths.query_start_loc, seq_lens=lengths.seq_lens,
        batch=lengths.batch, output=torch.zeros(4, HEADS, HEAD), num_heads=HEADS,
        num_kv_heads=KV_HEADS, head_size=HEAD, block_size=block_size, scale=0.125,
        causal=True, kv_scales=scales))
    attention = next(kwargs for name, kwargs in calls if name == "paged_attention")
    assert attention["key_cache"] is key and attention["value_cache"] is value
    assert [attention[n] for n in ("k_scale", "k_offset", "v_scale", "v_offset")] == list(scales)


def test_c8_layer_with_vllm_030_strided_caches_takes_the_device_path():
    """vLLM-Ascend 0.30.0rc2 hands a C8 layer K and V views of one allocation (pages side by
    side): our kernels read them in place, so the layer is not refused (it was: "not
    contiguous"); caches whose blocks are not dense still are, naming the strides."""
    from tests.test_attention_c import vllm_030_kv_views

    impl = _C8()
    impl.key_cache, impl.value_cache = vllm_030_kv_views(impl.key_cache, impl.value_cache)
    assert not impl.key_cache.is_contiguous()
    assert _reason(impl, _layer()) is None
    impl.key_cache = impl.key_cache.transpose(1, 2).contiguous().transpose(1, 2)
    reason = _reason(impl, _layer())
    assert reason is not None and str(list(impl.key_cache.stride())) in reason, reason
