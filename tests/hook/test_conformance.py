"""Conformance: every vllm-ascend and torch_npu name we rely on exists in the real wheels.

The wheels are read as zip files and parsed with ``ast``; nothing is imported. They are
downloaded by ``tools/fetch_wheels.sh`` into ``$AICPU_TILING_WHEEL_CACHE`` (default
``~/.cache/aicpu-tiling/wheels``). When that download is impossible the tests skip, except
under ``CI=true`` where a missing wheel fails them: a green CI run has always read the real
wheels.
"""

import ast
import re
import zipfile
from pathlib import Path

import pytest

from pyruntime.hook import vllm_ascend_targets as t
from tests.hook.vllm_ascend_source import (
    find_def,
    fixture_source,
    importers_by_name,
    param_names,
    wheel_source,
)
from tests.wheels import cached_wheel

REPO = Path(__file__).resolve().parents[2]


def _wheel(glob):
    return zipfile.ZipFile(cached_wheel(glob))


LINES = {"0.23": "vllm_ascend-0.23.0-*.whl", "0.25": "vllm_ascend-0.26.0rc1-*.whl"}


@pytest.fixture(scope="module", params=sorted(LINES))
def wheel(request):
    src, names = wheel_source(_wheel(LINES[request.param]))
    return request.param, src, names


def test_functions_and_signatures(wheel):
    line, src, _ = wheel
    for (module, qualname), expected in t.FUNCTIONS[line].items():
        tree = src.tree(module)
        assert tree is not None, f"{line}: module {module} missing"
        fn = find_def(tree, qualname)
        assert isinstance(fn, ast.FunctionDef), f"{line}: {module}:{qualname} missing"
        assert param_names(fn)[: len(expected)] == expected, (
            f"{line}: {module}:{qualname} has {param_names(fn)}, expected {expected}")


def test_staticmethods_attributes_and_fields(wheel):
    line, src, _ = wheel
    for module, qualname in t.STATICMETHODS:
        fn = find_def(src.tree(module), qualname)
        assert [ast.unparse(d) for d in fn.decorator_list] == ["staticmethod"], qualname
    init = find_def(src.tree(t.ATTENTION), f"{t.IMPL}.__init__")
    assigned = {n.attr for n in ast.walk(init) if isinstance(n, ast.Attribute)
                and isinstance(n.ctx, ast.Store)}
    assert set(t.IMPL_ATTRIBUTES) <= assigned, set(t.IMPL_ATTRIBUTES) - assigned
    meta = find_def(src.tree(t.ATTENTION), "AscendMetadata")
    fields = {n.target.id for n in meta.body if isinstance(n, ast.AnnAssign)}
    assert set(t.METADATA_FIELDS) <= fields, set(t.METADATA_FIELDS) - fields
    gp = find_def(src.tree(t.ACL_GRAPH), "GraphParams")
    gp_fields = tuple(n.target.id for n in gp.body if isinstance(n, ast.AnnAssign))
    assert gp_fields == t.GRAPH_PARAMS_FIELDS
    for module, names in t.MODULE_GLOBALS.items():
        text = ast.unparse(src.tree(module))
        for name in names:
            assert re.search(rf"\b{name}\b", text), f"{line}: {module} lacks {name}"


def test_every_importer_by_name_is_hooked(wheel):
    line, src, names = wheel
    found = importers_by_name(names, src)
    assert found, "no importer found: the scan is broken"
    assert found <= set(t.IMPORTERS), f"{line}: unhooked importers {found - set(t.IMPORTERS)}"


def test_fixture_matches_the_023_wheel():
    fixture = fixture_source()
    for (module, qualname), expected in t.FUNCTIONS["0.23"].items():
        tree = fixture.tree(module)
        assert tree is not None, f"fixture lacks {module}"
        fn = find_def(tree, qualname)
        assert fn is not None, f"fixture lacks {module}:{qualname}"
        assert param_names(fn)[: len(expected)] == expected, (module, qualname)


# ------------------------------------------------------------------ torch_npu

#: torch_npu / torch.npu calls the host-update path makes (reproduced by our fixture
#: and by the NPU backend), checked by name against the real wheel.
NPU_CALLS = (
    "torch.npu.graph_task_group_begin", "torch.npu.graph_task_group_end",
    "torch.npu.graph_task_update_begin", "torch.npu.graph_task_update_end",
    "torch.npu.ExternalEvent", "torch.npu.NPUGraph", "torch.npu.graph",
    "torch.npu.current_stream", "torch.npu.is_available", "torch.npu.get_device_name",
    "torch_npu.npu_fused_infer_attention_score",
    "torch_npu.npu_fused_infer_attention_score_v2",
)
FIA_OUT_KWARGS = ("query", "key", "value", "block_table", "actual_seq_lengths",
                  "actual_seq_lengths_kv", "num_key_value_heads", "num_heads", "scale",
                  "input_layout", "block_size", "sparse_mode", "workspace")


def _project_npu_calls():
    calls = set()
    for path in (REPO / "pyruntime").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                text = ast.unparse(node)
                if re.fullmatch(r"(torch\.npu|torch_npu(\.npu)?)\.[A-Za-z_]\w*", text):
                    calls.add(text)
    return calls


@pytest.fixture(scope="module")
def npu_wheel():
    zf = _wheel("torch_npu-*.whl")
    names = zf.namelist()
    npu_all = set()
    for path in ("torch_npu/npu/__init__.py",):
        tree = ast.parse(zf.read(path))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                getattr(x, "id", None) == "__all__" for x in node.targets
            ):
                npu_all |= set(ast.literal_eval(node.value))
    yaml = zf.read(next(n for n in names if n.endswith("npu_native_functions_by_codegen.yaml")))
    ops = dict(re.findall(rb"- func: ([\w.]+)\(([^)]*)\)", yaml))
    return npu_all, {k.decode(): v.decode() for k, v in ops.items()}, zf


def _exists(call, npu_all, ops, zf):
    name = call.rsplit(".", 1)[1]
    if call.startswith(("torch.npu.", "torch_npu.npu.")):
        return name in npu_all
    if name in ops:
        return True
    if f"torch_npu/{name}/__init__.py" in zf.namelist():  # a subpackage (torch_npu.profiler)
        return True
    init = zf.read("torch_npu/__init__.py").decode()
    return re.search(rf"\b{name}\b", init) is not None


def test_torch_npu_calls_exist(npu_wheel):
    npu_all, ops, zf = npu_wheel
    calls = set(NPU_CALLS) | _project_npu_calls()
    missing = sorted(c for c in calls if not _exists(c, npu_all, ops, zf))
    assert not missing, f"not in the torch_npu wheel: {missing}"


def test_every_torch_npu_api_entry_exists(npu_wheel):
    """`pyruntime.backends.npu.TORCH_NPU_API` (what the NPU backend calls through its
    ``torch.npu`` handle, out of reach of the name scan above) against the real wheel."""
    from pyruntime.backends.npu import TORCH_NPU_API

    npu_all, ops, zf = npu_wheel
    tops = {".".join(name.split(".")[:3]) for name in TORCH_NPU_API}
    missing = sorted(c for c in tops if not _exists(c, npu_all, ops, zf))
    assert not missing, f"TORCH_NPU_API names not in the torch_npu wheel: {missing}"


def test_fia_out_keywords(npu_wheel):
    _, ops, _ = npu_wheel
    schema = ops["npu_fused_infer_attention_score.out"]
    for kw in FIA_OUT_KWARGS:
        assert re.search(rf"\b{kw}\b", schema), f"FIA .out lacks {kw}"
