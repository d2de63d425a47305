"""Every name in vLLM-Ascend that the patch set touches or reads, per released line.

Pure data, no imports of the target: the patch set uses it to know where to hook, and
the conformance tests check it against the real wheels' sources (parsed, not imported)
and against the test fixture package.
"""

from __future__ import annotations

DISTRIBUTION = "vllm-ascend"
#: Supported release lines: the inclusive minimum and the exclusive upper bound.
MINIMUM = "0.23.0"
BELOW = "0.31.0"

ATTENTION = "vllm_ascend.attention.attention_v1"
ACL_GRAPH = "vllm_ascend.compilation.acl_graph"
FORWARD_CONTEXT = "vllm_ascend.ascend_forward_context"
IMPL = "AscendAttentionBackendImpl"
BUILDER = "AscendAttentionMetadataBuilder"

#: Modules that bind ``update_full_graph_params`` by name (``from ... import``) in some
#: supported release. Each is rebound when imported; a missing one is simply never hooked.
IMPORTERS = (
    "vllm_ascend.worker.model_runner_v1",
    "vllm_ascend.worker.v2.aclgraph_utils",
    "vllm_ascend.worker.v2.spec_decode.eagle.aclgraph",  # up to 0.26
    "vllm_ascend.worker.v2.spec_decode.autoregressive.aclgraph",  # from 0.27.1rc1
    "vllm_ascend.worker.v2.spec_decode.dflash.aclgraph",
    "vllm_ascend.spec_decode.llm_base_proposer",
)

_UPDATE_023 = (
    "update_stream",
    "forward_context",
    "num_tokens",
    "vllm_config",
    "speculative_config",
    "num_dcp_pcp_tokens",
    "draft_attn_metadatas",
)
_UPDATE_026 = (
    "update_stream",
    "forward_context",
    "num_tokens",
    "vllm_config",
    "speculative_config",
    "draft_attn_metadatas",
)
_COMMON_FUNCTIONS = {
    # wrapped: the metadata carries the persistent device buffers of common_attn_metadata
    (ATTENTION, f"{BUILDER}.build"): (
        "self",
        "common_prefix_len",
        "common_attn_metadata",
        "fast_build",
    ),
    (ATTENTION, f"{IMPL}.full_graph_fia"): (
        "self",
        "query",
        "key",
        "value",
        "attn_metadata",
        "output",
        "layer",
    ),
    (ATTENTION, f"{IMPL}.full_graph_fia_v2"): (
        "self",
        "query",
        "key",
        "value",
        "attn_metadata",
        "output",
    ),
    (ATTENTION, f"{IMPL}.full_graph_pa"): ("self", "query", "attn_metadata", "output"),
    (ATTENTION, f"{IMPL}._get_fia_params"): (
        "self",
        "key",
        "value",
        "attn_metadata",
        "kv_cache",
    ),
    (ATTENTION, f"{IMPL}.forward"): (
        "self",
        "layer",
        "query",
        "key",
        "value",
        "kv_cache",
        "attn_metadata",
        "output",
        "output_scale",
        "output_block_scale",
    ),
    (ATTENTION, f"{IMPL}.__init__"): (
        "self",
        "num_heads",
        "head_size",
        "scale",
        "num_kv_heads",
        "alibi_slopes",
        "sliding_window",
        "kv_cache_dtype",
        "logits_soft_cap",
        "attn_type",
        "kv_sharing_target_layer_name",
        "sinks",
    ),
    (ACL_GRAPH, "get_graph_params"): (),
    # patched to wrap the replay of each graph it captures (the engine's before_replay)
    (ACL_GRAPH, "ACLGraphWrapper.__call__"): ("self",),
    (ACL_GRAPH, "get_draft_graph_params"): (),
    (ACL_GRAPH, "get_draft_graph_prefill_params"): (),
    ("vllm_ascend.worker.model_runner_v1", "NPUModelRunner._pad_query_start_loc_for_fia"): (
        "self",
        "query_start_loc",
        "num_tokens_padded",
        "num_reqs_padded",
        "num_reqs",
        "cudagraph_runtime_mode",
        "batch_desc_num_reqs",
    ),
}

#: (module, qualified name) -> parameter names in order, per release line: "0.23" (0.23.x,
#: 0.24.x) and "0.25" (from 0.25.1rc1 on: no ``num_dcp_pcp_tokens``, no ``positions``; the
#: sources of every release are checked in tests/hook/test_release_conformance.py).
FUNCTIONS: dict[str, dict[tuple[str, str], tuple[str, ...]]] = {
    "0.23": {
        **_COMMON_FUNCTIONS,
        (ATTENTION, f"{IMPL}.update_graph_params"): _UPDATE_023,
        (ACL_GRAPH, "update_full_graph_params"): ("attn_backend", *_UPDATE_023),
        (
            "vllm_ascend.worker.model_runner_v1",
            "NPUModelRunner._update_full_graph_params_if_needed",
        ): (
            "self",
            "forward_context",
            "num_tokens_padded",
            "positions",
        ),
    },
    "0.25": {
        **_COMMON_FUNCTIONS,
        (ATTENTION, f"{IMPL}.update_graph_params"): _UPDATE_026,
        (ACL_GRAPH, "update_full_graph_params"): ("attn_backend", *_UPDATE_026),
        (
            "vllm_ascend.worker.model_runner_v1",
            "NPUModelRunner._update_full_graph_params_if_needed",
        ): (
            "self",
            "forward_context",
            "num_tokens_padded",
        ),
    },
}

#: Methods that must be decorated ``@staticmethod`` (we replace them with one).
STATICMETHODS = ((ATTENTION, f"{IMPL}.update_graph_params"),)

#: ``self.<name>`` attributes the patch set reads on the implementation instance;
#: each must be assigned in ``__init__``.
IMPL_ATTRIBUTES = (
    "num_heads",
    "num_kv_heads",
    "head_size",
    "scale",
    "sliding_window",
    "sinks",
    "kv_cache_dtype",
    "alibi_slopes",
    "attn_type",
    "enable_c8_quant",
    "key_cache",
    "value_cache",
)

#: Fields of ``AscendMetadata`` the patch set reads (never its per-step ``query_start_loc``
#: copy or its CPU ``seq_lens``: the lengths come from ``common_attn_metadata``).
METADATA_FIELDS = (
    "actual_seq_lengths_q",
    "causal",
    "attn_state",
)
#: Fields of the ``common_attn_metadata`` handed to ``build`` that the patch set reads: the
#: model runner's persistent device buffers (vLLM's ``CommonAttentionMetadata``).
COMMON_METADATA_FIELDS = ("query_start_loc", "seq_lens", "block_table_tensor")

#: Module-level names the patch set looks up in each module.
MODULE_GLOBALS = {
    ATTENTION: ("_EXTRA_CTX", "AscendAttentionBackend", "AscendMetadata", IMPL, BUILDER),
    ACL_GRAPH: ("GraphParams",),
}

#: Fields of ``GraphParams`` the patch set reads.
GRAPH_PARAMS_FIELDS = ("events", "workspaces", "handles", "attn_params")


def release_line(version: str) -> str:
    """Map an installed version such as ``"0.26.0rc1"`` to its key in :data:`FUNCTIONS`.

    Lines between known ones use the newest known line at or below them.
    """
    from packaging.version import Version

    release = Version(version).release
    known = sorted(FUNCTIONS, key=lambda line: Version(line).release)
    chosen = known[0]
    for line in known:
        if Version(line).release <= release[:2]:
            chosen = line
    return chosen
