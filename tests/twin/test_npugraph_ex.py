"""The twin's ``npugraph_ex`` (`pyruntime.npu_twin.npugraph_ex`): the module torch_npu's import
registers, which vLLM-Ascend's fusion passes import under vLLM's default compilation (issue 28
item 7). Its one modelled name, ``register_replacement``, against the torch_npu 2.10.0.post4
wheel's source and in use on plain npu tensors (the pattern is registered and applied, a
cross-stream match is refused); the compiler's names raise ``NotInTwinError``; its submodules
are not found (``ImportError``, which vLLM-Ascend 0.23.0.post1's worker patch catches)."""

from __future__ import annotations

import ast
import inspect
import zipfile

import pytest

from pyruntime.npu_twin import npugraph_ex as twin_npugraph_ex
from tests.wheels import TORCH_NPU_WHEEL, cached_wheel

PACKAGE = "torch_npu/dynamo/npugraph_ex/"


def _wheel_source(path: str) -> ast.Module:
    with zipfile.ZipFile(cached_wheel(TORCH_NPU_WHEEL)) as wheel:
        return ast.parse(wheel.read(PACKAGE + path).decode())


def test_register_replacement_has_the_wheels_parameters():
    tree = _wheel_source("patterns/pattern_pass_manager.py")
    real = next(n for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name == "register_replacement")
    assert [a.arg for a in real.args.args] == \
        list(inspect.signature(twin_npugraph_ex.register_replacement).parameters)
    # the pass the patterns go to has the wheel's name
    assert twin_npugraph_ex.PASS_NAME in {n.value for n in ast.walk(tree)
                                          if isinstance(n, ast.Constant)}


def test_the_module_has_the_wheels_public_names():
    tree = _wheel_source("__init__.py")
    names = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "__all__" for t in n.targets))
    module = twin_npugraph_ex.build()
    # logger is a logging.Logger there (nothing to call); every other name is here
    assert sorted(set(names) - {"logger"}) == sorted(module.__all__)


SCRIPT = """
import importlib
import torch
from torch.fx.experimental.proxy_tensor import make_fx
import npugraph_ex
from pyruntime.npu_twin import npugraph_ex as twin_npugraph_ex
from pyruntime.npu_twin.npu_module import NotInTwinError


def search(x, y):
    return torch.mul(torch.add(x, y), 2.0)


def replace(x, y):
    return torch.add(x, y) * 2.0 + 0.0


def model(x, y):
    return torch.relu(torch.mul(torch.add(x, y), 2.0))


def traced(inputs):
    # one fake mode for every node's value, as the graphs a compiler's passes see
    return make_fx(model, tracing_mode="fake")(*inputs)


def registered_on_npu_inputs():
    # vLLM-Ascend's BasePattern.get_inputs make npu tensors; torch traces them for real
    inputs = [torch.randn(4, 8, device="npu"), torch.randn(4, 8, device="npu")]
    npugraph_ex.register_replacement(search_fn=search, replace_fn=replace,
                                     example_inputs=inputs)
    gm = traced(inputs)
    eq(twin_npugraph_ex.pattern_pass().apply(gm.graph), 1)
    gm.recompile()
    x, y = torch.ones(4, 8, device="npu"), torch.full((4, 8), 2.0, device="npu")
    eq(gm(x, y).cpu().tolist(), [[6.0] * 8] * 4)


def cross_stream_match_refused():
    gm = traced([torch.randn(4, 8, device="npu"), torch.randn(4, 8, device="npu")])
    for node in gm.graph.nodes:
        if node.op == "call_function" and "mul" in str(node.target):
            node.meta["stream_label"] = "side"     # one node of the match on another stream
    eq(twin_npugraph_ex.pattern_pass().apply(gm.graph), 0)


def compiler_not_in_twin():
    for name in twin_npugraph_ex.NOT_MODELLED:
        try:
            getattr(npugraph_ex, name)()
        except NotInTwinError as exc:
            eq(f"npugraph_ex.{name} is not implemented" in str(exc), True)
        else:
            raise AssertionError(f"npugraph_ex.{name}() ran")


def submodules_not_found():
    try:
        importlib.import_module("npugraph_ex.core._concrete_graph")
    except ImportError:
        return
    raise AssertionError("npugraph_ex.core._concrete_graph was found")


check("registered_on_npu_inputs", registered_on_npu_inputs)
check("cross_stream_match_refused", cross_stream_match_refused)
check("compiler_not_in_twin", compiler_not_in_twin)
check("submodules_not_found", submodules_not_found)
"""

RULES = ("registered_on_npu_inputs", "cross_stream_match_refused", "compiler_not_in_twin",
         "submodules_not_found")


@pytest.fixture(scope="module")
def outcomes(run_twin):
    # plain npu tensors: what the engine check's children run on under VLLM_COMPILE
    proc = run_twin(SCRIPT, env={"AICPU_TILING_TWIN_TENSORS": "plain"}, timeout=300)
    return run_twin.rules(proc)


@pytest.mark.parametrize("rule", RULES)
def test_npugraph_ex_on_the_twin(outcomes, rule):
    assert outcomes.get(rule) == "ok", outcomes
