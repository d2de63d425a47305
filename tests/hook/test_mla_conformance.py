"""The MLA patch's targets (`pyruntime.hook.vllm_ascend_mla`) against every vllm-ascend
release's real ``vllm_ascend/attention/mla_v1.py``, 0.23.0 through 0.30.0rc2, read from its
wheel or sdist with ``ast`` (nothing installed or imported; the archives come from
``tools/fetch_wheels.sh``, missing ones skip, except under ``CI=true``)."""

from __future__ import annotations

import ast

import pytest

from pyruntime.hook import vllm_ascend_mla as mla
from tests.hook.vllm_ascend_source import archive_source, find_def, param_names
from tests.wheels import VLLM_ASCEND_RELEASES, cached_release


def _tree(release):
    src, _ = archive_source(cached_release(release))
    tree = src.tree(mla.MODULE)
    assert tree is not None, f"{release} has no {mla.MODULE}"
    return tree


def _assigned_self_attrs(fn):
    return {t.attr for node in ast.walk(fn) if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"}


@pytest.mark.parametrize("release", list(VLLM_ASCEND_RELEASES))
def test_the_mla_targets_exist_in_every_release(release):
    tree = _tree(release)
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))} | {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
        if isinstance(t, ast.Name)} | {
        a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert set(mla.MODULE_GLOBALS) <= names, set(mla.MODULE_GLOBALS) - names
    decode = find_def(tree, f"{mla.IMPL}._forward_decode")
    params = param_names(decode)
    assert any(params[: len(p)] == p for p in mla.FORWARD_DECODE_PARAMS), params
    # the branch the patch replaces: the capture records FIA in a task group and appends its
    # arguments to graph_params.attn_params, which update_graph_params rewrites
    body = ast.unparse(decode)
    for needle in ("_EXTRA_CTX.capturing", "graph_task_group_begin", "attn_params",
                   "self._v_up_proj(", "self.enable_kv_nz"):
        assert needle in body, needle
    update = find_def(tree, f"{mla.IMPL}.update_graph_params")
    assert any(isinstance(d, ast.Name) and d.id == "staticmethod"
               for d in update.decorator_list)
    assert param_names(update)[: len(mla.UPDATE_PARAMS)] == mla.UPDATE_PARAMS
    assert "graph_task_update_begin" in ast.unparse(update)
    # forward(self, layer_name, ...): the patched forward records the name
    assert param_names(find_def(tree, f"{mla.IMPL}.forward"))[:2] == ("self", "layer_name")
    build = find_def(tree, f"{mla.BUILDER}.build")
    assert "common_attn_metadata" in param_names(build)
    attrs = _assigned_self_attrs(find_def(tree, f"{mla.IMPL}.__init__"))
    assert set(mla.IMPL_ATTRIBUTES) <= attrs, set(mla.IMPL_ATTRIBUTES) - attrs
    assert find_def(tree, f"{mla.IMPL}._v_up_proj") is not None
