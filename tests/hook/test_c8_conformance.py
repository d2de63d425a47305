"""What the C8 patch (`pyruntime.hook.vllm_ascend_c8`) relies on, against every vllm-ascend
release's real ``vllm_ascend/attention/attention_v1.py``, 0.23.0 through 0.30.0rc2, read from its
wheel or sdist with ``ast`` (nothing installed or imported; missing archives skip, except under
``CI=true``)."""

from __future__ import annotations

import ast

import pytest

from pyruntime.hook import vllm_ascend_c8 as c8
from pyruntime.hook import vllm_ascend_targets as targets
from tests.hook.vllm_ascend_source import archive_source, find_def, param_names
from tests.wheels import VLLM_ASCEND_RELEASES, cached_release


def _tree(release):
    src, _ = archive_source(cached_release(release))
    tree = src.tree(targets.ATTENTION)
    assert tree is not None, f"{release} has no {targets.ATTENTION}"
    return tree


def _calls(fn, name):
    """The calls ``self.<name>(...)`` in `fn`."""
    return [n for n in ast.walk(fn) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == name
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]


@pytest.mark.parametrize("release", list(VLLM_ASCEND_RELEASES))
def test_c8_layers_reach_the_patched_full_graph_fia_with_their_layer(release):
    tree = _tree(release)
    cls = find_def(tree, c8.C8_IMPL)
    assert cls is not None
    # a subclass of the implementation the patch set replaces, adding no __init__: its
    # instances are built by the patched base __init__, then swapped (kv_c8.create_weights)
    assert [ast.unparse(b) for b in cls.bases] == [targets.IMPL]
    assert find_def(tree, f"{c8.C8_IMPL}.__init__") is None
    assert find_def(tree, f"{c8.C8_IMPL}.full_graph_fia") is None  # inherits the patched one
    forward = find_def(tree, f"{c8.C8_IMPL}.forward")
    assert param_names(forward) == c8.FORWARD_PARAMS
    # while capturing, it calls full_graph_fia(query, key, value, attn_metadata, output, layer)
    captures = _calls(forward, "full_graph_fia")
    assert captures and all([ast.unparse(a) for a in call.args][-1] == "layer"
                            for call in captures)
    assert "_EXTRA_CTX.capturing" in ast.unparse(forward)
    assert _calls(forward, "_prepare_c8_scales")  # the layer's _c8_* tensors are made first


@pytest.mark.parametrize("release", list(VLLM_ASCEND_RELEASES))
def test_the_nz_view_and_the_scales_are_as_the_patch_reads_them(release):
    tree = _tree(release)
    view = find_def(tree, f"{c8.C8_IMPL}._nz_5d_view")
    assert param_names(view) == c8.NZ_VIEW_PARAMS
    body = ast.unparse(view)
    assert f"NZ_FMT_LAST_DIM = {c8.NZ_LAST_DIM}" in body
    assert ("cache.view(-1, self.num_kv_heads, self.head_size // NZ_FMT_LAST_DIM, block_size, "
            "NZ_FMT_LAST_DIM)") in body
    prepare = ast.unparse(find_def(tree, f"{c8.C8_IMPL}._prepare_c8_scales"))
    for name in c8.LAYER_SCALES:
        assert f"layer.{name} = " in prepare, name
    assert "layer._c8_scales_prepared = True" in prepare
    # its shapes: [1, num_kv_heads, head_size] per channel, or the raw [1] per tensor
    assert "raw.view(1, self.num_kv_heads, self.head_size)" in prepare
    assert "if raw.numel() == 1" in prepare


@pytest.mark.parametrize("release", list(VLLM_ASCEND_RELEASES))
def test_vllm_ascends_c8_dequantisation_is_scale_only(release):
    """Why the device path hands our kernels zero offsets: FIA gets the antiquant scales and
    no offset in both C8 FIA calls, and the dense fallback multiplies by the scale alone,
    while the quantisation adds the offset (so only a zero offset round-trips)."""
    tree = _tree(release)
    fia = ast.unparse(find_def(tree, f"{targets.IMPL}.full_graph_fia"))
    assert "'key_antiquant_scale': layer._c8_k_aq_scale_nz_bnsd" in fia
    assert "'value_antiquant_scale': layer._c8_v_aq_scale_nz_bnsd" in fia
    assert "self._nz_5d_view(self.key_cache, block_size)" in fia
    assert "_, block_size, _, _ = self.key_cache.shape" in fia
    decode = ast.unparse(find_def(tree, f"{c8.C8_IMPL}._forward_c8_decode"))
    assert "key_antiquant_scale=layer._c8_k_aq_scale_nz_bnsd" in decode
    dense = ast.unparse(find_def(tree, f"{c8.C8_IMPL}._dequant_paged_kv_to_dense"))
    assert "dense_k.to(target_dtype) * layer._c8_k_scale" in dense
    for text in (fia, decode, dense):
        assert "antiquant_offset" not in text and "_c8_k_offset" not in text
    quantize = ast.unparse(find_def(tree, f"{c8.C8_IMPL}._quantize_kv_to_int8"))
    assert "layer._c8_k_inv_scale + layer._c8_k_offset" in quantize
