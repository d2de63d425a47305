"""`pyruntime.hook.vllm_ascend_mla.mla_unsupported_reason`: which MLA layers keep
vLLM-Ascend's host-update path, with one-line reasons (the in-vLLM-Ascend runs are in
test_in_vllm_ascend.py; the targets in test_mla_conformance.py)."""

from __future__ import annotations

import types

import pytest
import torch

from pyruntime.hook import vllm_ascend_mla as mla
from pyruntime.hook import vllm_ascend_patches as gqa


class Impl:  # stands for AscendMLAImpl: only the attributes the rules read
    def __init__(self, **overrides):
        self.__dict__.update(num_heads=16, num_kv_heads=1, scale=0.07, kv_lora_rank=512,
                             qk_rope_head_dim=64, enable_kv_nz=False, fa_quant_layer=False,
                             pcp_enabled=False, is_pcp_decode_sharded=False,
                             speculative_config=None)
        self.__dict__.update(overrides)


class Subclass(Impl):
    pass


def _metadata(causal=True, lengths=True):
    meta = types.SimpleNamespace(causal=causal)
    if lengths:
        common = types.SimpleNamespace(query_start_loc=torch.zeros(3, dtype=torch.int32),
                                       seq_lens=torch.zeros(2, dtype=torch.int32),
                                       block_table_tensor=torch.zeros(2, 4, dtype=torch.int32))
        setattr(meta, gqa.LENGTHS_ATTR, gqa.device_lengths(common, {}))
    return meta


def _tensors(dtype=torch.bfloat16, **overrides):
    t = {"q_nope": torch.zeros(4, 16, 512, dtype=dtype),
         "q_pe": torch.zeros(4, 16, 64, dtype=dtype),
         "k_nope": torch.zeros(8, 128, 1, 512, dtype=dtype),
         "k_pe": torch.zeros(8, 128, 1, 64, dtype=dtype), "dequant_scale_q_nope": None}
    t.update(overrides)
    return t


CTX = types.SimpleNamespace(is_draft_model=False)


def reason(impl=None, ctx=CTX, meta=None, tensors=None):
    return mla.mla_unsupported_reason(impl or Impl(), Impl, ctx, meta or _metadata(),
                                      tensors or _tensors(), torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_plain_mla_layer_takes_the_device_path(dtype):
    assert reason(tensors=_tensors(dtype)) is None


@pytest.mark.parametrize("case, expected", [
    ({"impl": Impl(enable_kv_nz=True)}, "NZ cache layout (enable_kv_nz)"),
    ({"impl": Impl(fa_quant_layer=True)}, "FA quantization"),
    ({"tensors": _tensors(dequant_scale_q_nope=torch.ones(4, 16))}, "FA quantization"),
    ({"impl": Impl(pcp_enabled=True)}, "context parallel"),
    ({"impl": Impl(is_pcp_decode_sharded=True)}, "context parallel"),
    ({"impl": Subclass()}, "subclass Subclass"),
    ({"impl": Impl(qk_rope_head_dim=0)}, "without rope"),
    ({"meta": _metadata(causal=False)}, "non-causal"),
    ({"meta": _metadata(lengths=False)}, "no persistent device length buffers"),
    ({"ctx": types.SimpleNamespace(is_draft_model=True)}, "draft-model"),
    ({"tensors": _tensors(k_nope=torch.zeros(8, 128, 1, 512, dtype=torch.int8))},
     "k_nope in torch.int8"),
    ({"tensors": _tensors(k_pe=torch.zeros(8, 128, 1, 64, dtype=torch.float16))},
     "k_pe in torch.float16"),
    ({"tensors": _tensors(k_nope=torch.zeros(8, 128, 1, 1024, dtype=torch.bfloat16)
                          [..., :512])}, "not contiguous"),
])
def test_unsupported_layers_keep_the_host_path_with_one_line_reasons(case, expected):
    got = reason(**case)
    assert got is not None and expected in got and "\n" not in got


def test_a_missing_attribute_is_named():
    impl = Impl()
    del impl.enable_kv_nz
    assert "'enable_kv_nz'" in reason(impl=impl)


def test_the_layer_name_is_the_forward_contexts_key():
    """update_graph_params zips the forward context's attn_metadata keys with the captured
    tasks, so our layers must be named by those keys: the name forward() received wins, then
    AscendMLAImpl's own layer_name (None when vLLM does not pass one), then the instance."""
    impl = Impl(layer_name=None)
    assert mla.mla_layer_name(impl).startswith("<Impl@")
    impl.layer_name = "model.layers.3.self_attn.attn"
    assert mla.mla_layer_name(impl) == "model.layers.3.self_attn.attn"
    setattr(impl, gqa.LAYER_NAME_ATTR, "model.layers.3.self_attn")
    assert mla.mla_layer_name(impl) == "model.layers.3.self_attn"
