"""Conformance against every vllm-ascend release on the index, 0.23.0 through 0.30.0rc2.

Each release's real source (its wheel, or its sdist where it ships none) is read as an
archive and parsed with ``ast``; nothing is installed or imported. For each release the
module finds which of the names the hook relies on exist (every target group of
``pyruntime/hook/vllm_ascend_targets.py``) and which of the 0.29+ code shape does
(``UpdatableGraph``, ``ACLGraphWrapper._updatable_graph_replay``, the param providers, an
``update_graph_params`` that raises, the ``*_gpu`` length buffers, the moved importer).
The tests assert what issue 17 states about them; the table is printed by

    PYTHONPATH=. python tests/hook/test_release_conformance.py

The archives come from ``tools/fetch_wheels.sh`` (``tests/wheels.py``'s rule: missing ones
skip the tests, except under ``CI=true``, where they fail them).
"""

from __future__ import annotations

import ast
import functools
import re

import pytest
from packaging.version import Version

from pyruntime.hook import vllm_ascend_targets as t
from tests.hook.vllm_ascend_source import archive_source, find_def, importers_by_name, param_names
from tests.wheels import VLLM_ASCEND_RELEASES, cached_release

RELEASES = tuple(VLLM_ASCEND_RELEASES)
UPDATABLE_GRAPH = "vllm_ascend.compilation.updatable_graph"
EAGLE = "vllm_ascend.worker.v2.spec_decode.eagle.aclgraph"
AUTOREGRESSIVE = "vllm_ascend.worker.v2.spec_decode.autoregressive.aclgraph"
PROVIDERS = ("FIAParamProvider", "FIAV2ParamProvider", "PAParamProvider")
BUILDER = "AscendAttentionMetadataBuilder.build"

#: Column -> what it checks. The first eight are the hook's own target set (for the release
#: line ``vllm_ascend_targets.release_line`` picks); the rest is the 0.27+ / 0.29+ code shape.
GROUPS = {
    "modules": "attention_v1, acl_graph, ascend_forward_context exist",
    "functions": "FUNCTIONS[release_line]: every function, with its parameter prefix",
    "staticmeth": "STATICMETHODS are @staticmethod",
    "impl_attrs": "IMPL_ATTRIBUTES assigned in AscendAttentionBackendImpl.__init__",
    "meta_fields": "METADATA_FIELDS on AscendMetadata",
    "graph_params": "GraphParams fields == GRAPH_PARAMS_FIELDS",
    "globals": "MODULE_GLOBALS",
    "importers": "every importer of update_full_graph_params is in IMPORTERS",
    "eagle_imp": "spec_decode.eagle.aclgraph imports update_full_graph_params",
    "autoreg_imp": "spec_decode.autoregressive.aclgraph imports update_full_graph_params",
    "updatable": "compilation/updatable_graph.py: UpdatableGraph.register_task, "
                 "resolve_tasks, update",
    "ug_replay": "ACLGraphWrapper._updatable_graph_replay",
    "providers": "FIAParamProvider, FIAV2ParamProvider, PAParamProvider in attention_v1",
    "upd_raises": "AscendAttentionBackendImpl.update_graph_params raises NotImplementedError",
    "gpu_fields": "AscendMetadata.query_start_loc_gpu and .seq_lens_gpu",
    "build_sig": "AscendAttentionMetadataBuilder.build exists (its parameters: see the test)",
    "strided_kv": "model_runner_v1 page-strides full-attention KV caches "
                  "(strided_attention_cache_layers)",
    "pa_rule": "attention/utils.py defines requires_contiguous_pa_kv_cache (the dry run "
               "strides its caches where it exists: pyruntime/hook/dryrun/kv_caches.py)",
}  # fmt: skip
HOOK_GROUPS = ("modules", "functions", "staticmeth", "impl_attrs", "meta_fields",
               "graph_params", "globals", "importers")  # fmt: skip


def _at_least(version, first):
    return Version(version) >= Version(first)


#: What issue 17 ("Why") states, per release: group -> found. The hook's own target set (the
#: old update path) is stated for 0.23-0.28 only; on 0.27+ the moved importer is unhooked.
def expected(version):
    facts = {**expected_hook_targets(version), **expected_code_shape(version)}
    return facts


def expected_code_shape(version):
    return {
        "eagle_imp": not _at_least(version, "0.27.1rc1"),
        "autoreg_imp": _at_least(version, "0.27.1rc1"),
        "updatable": _at_least(version, "0.29.0rc1"),
        "ug_replay": _at_least(version, "0.29.0rc1"),
        "providers": _at_least(version, "0.29.0rc1"),
        "upd_raises": _at_least(version, "0.29.0rc1"),
        "gpu_fields": _at_least(version, "0.30.0rc1"),
        "build_sig": True,
        # issue 29, fix A: the releases whose runner hands page-strided KV caches are exactly
        # those that define the contiguity rule the dry run keys on
        "strided_kv": _at_least(version, "0.30.0rc1"),
        "pa_rule": _at_least(version, "0.30.0rc1"),
    }


def expected_hook_targets(version):
    """Every release in the supported range has the hook's whole target set (0.27+ with the
    moved importer, which IMPORTERS lists; 0.29+ because our layers never register_task, so
    the UpdatableGraph path has nothing of ours to update)."""
    return {g: True for g in HOOK_GROUPS}


#: Where the issue's statement does not hold (found by this module), with the reason; the
#: test is a strict xfail, so it fails as soon as the hook's data is fixed (then drop it).
KNOWN_GAPS: dict[str, str] = {}


def _missing(items):
    return (not items, ", ".join(items))


def _fields(cls):
    return [n.target.id for n in getattr(cls, "body", []) if isinstance(n, ast.AnnAssign)
            and isinstance(n.target, ast.Name)]  # fmt: skip


def _signature_ok(src, key, want):
    module, qualname = key
    tree = src.tree(module)
    fn = find_def(tree, qualname) if tree is not None else None
    return isinstance(fn, ast.FunctionDef) and param_names(fn)[: len(want)] == want


@functools.cache
def release_facts(version):
    """Group -> (found, what is missing or found), for `version`'s real source."""
    src, names = archive_source(cached_release(version))
    attention = src.tree(t.ATTENTION)
    acl_graph = src.tree(t.ACL_GRAPH)
    facts = {}
    facts["modules"] = _missing([m for m in (t.ATTENTION, t.ACL_GRAPH, t.FORWARD_CONTEXT)
                                 if src.tree(m) is None])  # fmt: skip

    bad = []
    for (module, qualname), want in t.FUNCTIONS[t.release_line(version)].items():
        tree = src.tree(module)
        fn = find_def(tree, qualname) if tree is not None else None
        if not isinstance(fn, ast.FunctionDef):
            bad.append(f"{qualname} missing")
        elif param_names(fn)[: len(want)] != want:
            bad.append(f"{qualname}{param_names(fn)}")
    facts["functions"] = _missing(bad)
    facts["line"] = [line for line, functions in t.FUNCTIONS.items()
                     if all(_signature_ok(src, key, want) for key, want in functions.items())]

    bad = []
    for module, qualname in t.STATICMETHODS:
        fn = find_def(src.tree(module), qualname)
        if fn is None or [ast.unparse(d) for d in fn.decorator_list] != ["staticmethod"]:
            bad.append(qualname)
    facts["staticmeth"] = _missing(bad)

    init = find_def(attention, f"{t.IMPL}.__init__")
    assigned = {n.attr for n in ast.walk(init) if isinstance(n, ast.Attribute)
                and isinstance(n.ctx, ast.Store)} if init else set()  # fmt: skip
    facts["impl_attrs"] = _missing([a for a in t.IMPL_ATTRIBUTES if a not in assigned])

    meta = _fields(find_def(attention, "AscendMetadata"))
    facts["meta_fields"] = _missing([f for f in t.METADATA_FIELDS if f not in meta])
    gp = tuple(_fields(find_def(acl_graph, "GraphParams")))
    facts["graph_params"] = (gp == t.GRAPH_PARAMS_FIELDS, ", ".join(gp))

    bad = []
    for module, wanted in t.MODULE_GLOBALS.items():
        text = ast.unparse(src.tree(module))
        bad += [f"{module}:{n}" for n in wanted if not re.search(rf"\b{n}\b", text)]
    facts["globals"] = _missing(bad)

    importers = importers_by_name(names, src)
    facts["importers"] = _missing(sorted(importers - set(t.IMPORTERS)))
    facts["eagle_imp"] = (EAGLE in importers, EAGLE)
    facts["autoreg_imp"] = (AUTOREGRESSIVE in importers, AUTOREGRESSIVE)

    ug = src.tree(UPDATABLE_GRAPH)
    ug_cls = find_def(ug, "UpdatableGraph") if ug is not None else None
    facts["updatable"] = _missing(
        ["UpdatableGraph"] if ug_cls is None else
        [m for m in ("register_task", "resolve_tasks", "update") if find_def(ug_cls, m) is None])
    facts["ug_replay"] = (isinstance(find_def(acl_graph, "ACLGraphWrapper._updatable_graph_replay"),
                                     ast.FunctionDef), "")  # fmt: skip
    facts["providers"] = _missing([p for p in PROVIDERS
                                   if not isinstance(find_def(attention, p), ast.ClassDef)])

    update = find_def(attention, f"{t.IMPL}.update_graph_params")
    raises = update is not None and any(
        isinstance(n, ast.Raise) and n.exc is not None
        and "NotImplementedError" in ast.unparse(n.exc) for n in ast.walk(update))  # fmt: skip
    facts["upd_raises"] = (raises, "")
    facts["gpu_fields"] = _missing([f for f in ("query_start_loc_gpu", "seq_lens_gpu")
                                    if f not in meta])  # fmt: skip
    build = find_def(attention, BUILDER)
    facts["build_sig"] = (isinstance(build, ast.FunctionDef),
                          ", ".join(param_names(build)) if build else "")  # fmt: skip
    runner = src.tree("vllm_ascend.worker.model_runner_v1")
    strided = runner is not None and any(
        isinstance(n, ast.Name) and n.id == "strided_attention_cache_layers"
        for n in ast.walk(runner))  # fmt: skip
    facts["strided_kv"] = (strided, "")
    utils = src.tree("vllm_ascend.attention.utils")
    rule = find_def(utils, "requires_contiguous_pa_kv_cache") if utils is not None else None
    facts["pa_rule"] = (isinstance(rule, ast.FunctionDef), "")
    return facts


def _check(version, wanted):
    facts = release_facts(version)
    wrong = {g: f"found={facts[g][0]} ({facts[g][1]})" for g, want in wanted.items()
             if facts[g][0] != want}  # fmt: skip
    assert not wrong, f"{version}: the issue's statement does not hold for {wrong}"


@pytest.mark.parametrize("version", RELEASES)
def test_the_code_shape_the_issue_states(version):
    """0.27+: the moved importer; 0.29+: UpdatableGraph, _updatable_graph_replay, the
    providers, update_graph_params raising; 0.30.0rc1+: the *_gpu length buffers, and the
    page-strided KV caches with their contiguity rule."""
    _check(version, expected_code_shape(version))


@pytest.mark.parametrize("version", [
    pytest.param(v, marks=pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[v]))
    if v in KNOWN_GAPS else v for v in RELEASES if expected_hook_targets(v)])  # fmt: skip
def test_the_hook_target_set_on_every_release(version):
    """The hook's target set, for the line ``release_line`` picks, is all there."""
    _check(version, expected_hook_targets(version))


def test_the_supported_range_covers_every_release():
    from pyruntime.hook.versions import VersionRange

    supported = VersionRange(t.DISTRIBUTION, t.MINIMUM, t.BELOW)
    assert all(supported.check(v) is None for v in RELEASES), supported
    assert supported.check("0.31.0") is not None and supported.check("0.22.1") is not None


@pytest.mark.parametrize("version", RELEASES)
def test_the_model_runner_hands_build_the_persistent_buffers(version):
    """Item 1's seam: the model runner builds ``AscendCommonAttentionMetadata`` with the
    fields the build wrapper reads (``COMMON_METADATA_FIELDS``) sliced from its persistent
    buffers (``self.<buffer>...``), not from per-step temporaries."""
    src, _ = archive_source(cached_release(version))
    tree = src.tree("vllm_ascend.worker.model_runner_v1")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "AscendCommonAttentionMetadata"]
    assert calls, version
    for field in t.COMMON_METADATA_FIELDS:
        values = [k.value for c in calls for k in c.keywords if k.arg == field]
        assert values, (version, field)
        # query_start_loc / seq_lens: slices of self.<buffer>; the block table: a local
        # holding self.input_batch.block_table[...]'s device tensor slice
        text = [ast.unparse(v) for v in values]
        if field != "block_table_tensor":
            assert all(x.startswith("self.") for x in text), (version, field, text)


def test_each_old_path_release_matches_one_known_line():
    lines = {v: release_facts(v)["line"] for v in RELEASES if not _at_least(v, "0.29.0rc1")}
    assert all(len(found) == 1 for found in lines.values()), lines


def test_the_builder_signature_is_stable():
    """Item 1: ``AscendAttentionMetadataBuilder.build``'s signature is the same in every
    release 0.23-0.30 (the seam the right-buffers fix can wrap)."""
    signatures = {v: release_facts(v)["build_sig"][1] for v in RELEASES}
    assert len(set(signatures.values())) == 1, signatures


def test_the_scan_sees_every_importer():
    """The importer scan finds the ones the hook lists (else it is broken, not the release)."""
    for version in RELEASES:
        src, names = archive_source(cached_release(version))
        assert "vllm_ascend.worker.model_runner_v1" in importers_by_name(names, src), version


def conformance_table(releases=RELEASES):
    """One row per release, one column per target group: "found" / "missing" (or "n/a"
    when the release's archive is not cached and cannot be downloaded)."""
    width = max(len(g) for g in GROUPS)
    rows = [["release", *GROUPS, "sig_line"]]
    for version in releases:
        try:
            facts = release_facts(version)
        except (pytest.skip.Exception, pytest.fail.Exception):
            rows.append([version, *["n/a"] * (len(GROUPS) + 1)])
            continue
        rows.append([version, *("found" if facts[g][0] else "missing" for g in GROUPS),
                     "/".join(facts["line"]) or "none"])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    legend = [f"{g.ljust(width)}  {what}" for g, what in GROUPS.items()]
    picks = ", ".join(f"{v} -> {t.release_line(v)}" for v in releases)
    legend.append(f"{'sig_line'.ljust(width)}  the FUNCTIONS line(s) whose signatures all match "
                  f"(release_line picks: {picks})")  # fmt: skip
    return "\n".join([*lines, "", *legend])


def test_the_table_has_a_row_per_release():
    table = conformance_table()
    for version in RELEASES:
        assert re.search(rf"^{re.escape(version)}\s", table, re.MULTILINE), version


if __name__ == "__main__":
    print(conformance_table())
    for version in RELEASES:
        facts = release_facts(version)
        details = {g: facts[g][1] for g in GROUPS if facts[g][1] and not facts[g][0]}
        if details:
            print(f"{version} missing: {details}")
