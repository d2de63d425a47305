"""``npugraph_ex``: torch_npu's graph compiler as a top-level module, with the one name that
vLLM-Ascend's fusion-pass compilation calls (`register_replacement`) and every other name a
placeholder that raises `NotInTwinError` when called.

Where the real one comes from: torch_npu 2.10.0.post4 ships it as ``torch_npu/dynamo/
npugraph_ex`` and, when torch_npu is imported, registers it as the top-level module
``npugraph_ex`` (``torch_npu/_init/registry/dynamo.py`` ``register_dynamo_backends`` ->
``torch_npu/dynamo/__init__.py`` ``_get_npugraph_ex_backend``: ``sys.modules["npugraph_ex"] =
_LazyNpuGraphEx(...)``). The twin does the same when it installs torch_npu
(`pyruntime.npu_twin.torch_npu_module.install`).

Who calls what (vLLM-Ascend 0.23.0.post1 and 0.30.0rc2):

* Under vLLM's default compilation (mode VLLM_COMPILE, ``AscendCompiler``), the compiler's
  pass manager (``compilation/graph_fusion_pass_manager.py`` ``configure``) imports its
  fusion passes, whose base (``compilation/passes/base_pattern.py``) does ``import
  npugraph_ex as nge`` (else ``torchair``) at module top and, in ``BasePattern.register``,
  calls ``nge.register_replacement(search_fn=..., replace_fn=..., example_inputs=...,
  extra_check=...)`` right after torch's own ``pm.register_replacement`` of the same pattern.
  That registers the pattern with npugraph_ex's own pattern pass, which only npugraph_ex's
  compiler applies. `register_replacement` here is the real one: the same code as
  ``torch_npu/dynamo/npugraph_ex/patterns/pattern_pass_manager.py`` (a process-wide
  ``PatternMatcherPass`` named ``npugraph_ex_generic_pattern_pass``, torch's
  ``register_replacement`` into it, the user's ``extra_check`` behind npugraph_ex's
  same-stream check), so a pattern torch cannot trace fails here as it does there.
* With ``enable_npugraph_ex`` (vLLM-Ascend's default on A2/A3), ``AscendCompiler.compile`` ->
  ``npugraph_ex_compile`` calls ``npugraph_ex.CompilerConfig()``, ``get_npu_backend`` and
  ``npu_fx_compiler``: npugraph_ex's whole compiler (about 16,000 lines: FX passes, NPU
  decompositions, an ACL concrete graph, code generation), which the twin does not model.
  Those names raise `NotInTwinError`; the engine check runs the release's
  ``enable_npugraph_ex`` false instead and says so (docs/hook-in-vllm-ascend.md, "The engine
  check: compilation").
* 0.23.0.post1's ``patch/worker/patch_npugraph_ex_triton.py`` imports
  ``npugraph_ex.core._concrete_graph``; this module is not a package, so that import fails
  with ``ImportError``, which vLLM-Ascend catches (``patch/worker/__init__.py``), as on a
  host without torch_npu's compilers.
"""

from __future__ import annotations

import sys
import types

from .npu_module import placeholder

#: the public names of torch_npu 2.10.0.post4's ``npugraph_ex/__init__.py`` (``__all__``)
#: besides `register_replacement`: placeholders here
NOT_MODELLED = ("get_npu_backend", "get_compiler", "compile_fx", "CompilerConfig")
#: the pattern pass's name (``pattern_pass_manager.py`` ``_PatternPassManager.__init__``)
PASS_NAME = "npugraph_ex_generic_pattern_pass"

_pattern_pass = None


def _stream_check(match) -> bool:
    """npugraph_ex's ``_check_pattern_stream``: every call node of a match on one stream
    (``node.meta["stream_label"]``; None is the default stream), else no fusion."""
    streams = set()
    has_default = False
    for node in match.nodes:
        if node.op == "call_function":
            label = node.meta.get("stream_label")
            if label is None:
                has_default = True
            else:
                streams.add(label)
                if len(streams) > 1:
                    return False
    return not (has_default and streams)


def pattern_pass():
    """The process-wide ``PatternMatcherPass`` the registered patterns go to (npugraph_ex's
    ``_pattern_manager().pass_dict``); only npugraph_ex's compiler applies it."""
    global _pattern_pass
    if _pattern_pass is None:
        from torch._inductor.pattern_matcher import PatternMatcherPass

        if "pass_name" in PatternMatcherPass.__init__.__code__.co_varnames:
            _pattern_pass = PatternMatcherPass(pass_name=PASS_NAME)
        else:
            _pattern_pass = PatternMatcherPass()
    return _pattern_pass


def register_replacement(search_fn, replace_fn, example_inputs, trace_fn=None,
                         extra_check=None, search_fn_pattern=None, scalar_workaround=None,
                         skip_duplicates=False):
    """npugraph_ex's ``register_replacement`` (``patterns/pattern_pass_manager.py``): torch's
    ``torch._inductor.pattern_matcher.register_replacement`` of `search_fn` -> `replace_fn`
    (traced with `example_inputs` by `trace_fn`, default ``fwd_only``) into `pattern_pass`,
    with `extra_check` (default: always) behind the same-stream check."""
    from torch._inductor import pattern_matcher as pm

    trace_fn = trace_fn if trace_fn is not None else pm.fwd_only
    user_check = extra_check if extra_check is not None else (lambda match: True)

    def add_stream_check(match) -> bool:
        return _stream_check(match) and user_check(match)

    pm.register_replacement(search_fn=search_fn, replace_fn=replace_fn,
                            example_inputs=example_inputs, trace_fn=trace_fn,
                            pass_dicts=pattern_pass(), extra_check=add_stream_check,
                            search_fn_pattern=search_fn_pattern,
                            scalar_workaround=scalar_workaround,
                            skip_duplicates=skip_duplicates)


def build() -> types.ModuleType:
    """The ``npugraph_ex`` module (not a package: its submodules are not found)."""
    import importlib.machinery

    module = types.ModuleType("npugraph_ex", __doc__)
    module.__file__ = __file__
    module.__spec__ = importlib.machinery.ModuleSpec("npugraph_ex", None, origin="npu-twin")
    module.register_replacement = register_replacement
    for name in NOT_MODELLED:
        setattr(module, name, placeholder(f"npugraph_ex.{name}"))
    module.__all__ = [*NOT_MODELLED, "register_replacement"]
    return module


def install() -> types.ModuleType:
    """Put `build`'s module in ``sys.modules`` as torch_npu's import does."""
    module = build()
    sys.modules["npugraph_ex"] = module
    return module
