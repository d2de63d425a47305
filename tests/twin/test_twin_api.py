"""The twin's torch_npu surface against the real wheel (read as a zip, never installed): the
FIA schemas it defines, and every ``torch.npu`` name the NPU backend uses."""

from __future__ import annotations

import re

import pytest

from pyruntime.backends.npu import TORCH_NPU_API
from pyruntime.npu_twin import fia, npu_module
from tests.wheels import TORCH_NPU_WHEEL, read_wheel_file


@pytest.fixture(scope="module")
def plugin_docs() -> str:
    return read_wheel_file(TORCH_NPU_WHEEL, "torch_npu/_op_plugin_docs.py").decode()


@pytest.mark.parametrize("schema", [fia.SCHEMA, fia.OUT_SCHEMA, fia.V2_SCHEMA, fia.V2_OUT_SCHEMA,
                                    fia.V2_WORKSPACE_SCHEMA],
                         ids=["functional", "out", "v2", "v2-out", "v2-workspace"])
def test_fia_schemas_are_the_wheels(schema, plugin_docs):
    name = schema.split("(", 1)[0]
    prototypes = re.findall(rf"^torch_npu\.{re.escape(name)}\((.*)$", plugin_docs, re.MULTILINE)
    assert prototypes, f"the wheel documents no {name}"
    assert schema in [f"{name}({p.rstrip()}" for p in prototypes]


def test_every_torch_npu_name_the_backend_uses_is_implemented_by_the_twin():
    defined = vars(npu_module)  # what the module defines (its __getattr__ makes placeholders)
    missing = []
    for path in TORCH_NPU_API:
        name, *member = path.split(".")[2:]  # after torch.npu
        if name not in defined or (member and not hasattr(defined[name], member[0])):
            missing.append(path)
    assert not missing, f"the twin only has placeholders for {missing}"


def test_fia_band_is_pre_tokens_before_and_next_tokens_after_each_query():
    """sparse_mode 4 (torch_npu's _op_plugin_docs.py: the band between pre_tokens and
    next_tokens from the bottom-right corner), as vLLM-Ascend's sliding-window layers call
    FIA (pre_tokens=W, next_tokens=0: W + 1 keys), against the float64 reference's band."""
    import numpy as np
    import torch

    from pyruntime.workload.reference import reference_attention

    gen = torch.Generator().manual_seed(0)
    query = torch.randn(5, 4, 8, generator=gen)
    key, value = (torch.randn(6, 4, 2, 8, generator=gen) for _ in range(2))
    table = np.arange(6, dtype=np.int32).reshape(2, 3)
    cu, kv = np.array([0, 1, 5]), np.array([11, 9])
    for band in ((3, 0), (0, 0), (20, 0)):
        out, _ = fia._attention(query, key, value, table, cu, kv, scale=0.3, causal=False,
                                band=band)
        want = reference_attention(query, key, value, table, cu, kv, scale=0.3, causal=False,
                                   band=band)
        np.testing.assert_allclose(out.double().numpy(), want, rtol=1e-5, atol=1e-6)
    one, _ = fia._attention(query, key, value, table, cu, kv, scale=0.3, causal=True,
                            band=(0, 0))  # only the key at the query's own position
    # request 0: position 10 = block 2 (table row 0), slot 2
    np.testing.assert_allclose(one[0].numpy(), value[2, 2].repeat_interleave(2, 0).numpy(),
                               rtol=1e-6)


def test_fia_ignores_the_band_when_every_query_is_one_row():
    """torch_npu documents pre_tokens, next_tokens and (without rope) sparse_mode as having no
    effect at Q_S = 1 ("Q_S为1时该参数无效"): vLLM-Ascend's windowed decode (sparse_mode 4,
    pre_tokens=W, every request one query row) attends to the whole kv; with a request of two
    query rows (MTP) the band applies."""
    import numpy as np
    import torch

    from pyruntime.workload.reference import reference_attention

    gen = torch.Generator().manual_seed(1)
    query = torch.randn(3, 4, 8, generator=gen)
    key, value = (torch.randn(6, 4, 2, 8, generator=gen) for _ in range(2))
    table = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), 1)
    window = 3

    def fia_out(ends, lens):
        options = {**fia._DEFAULTS, "atten_mask": mask, "block_table": table,
                   "input_layout": "TND", "block_size": 4, "actual_seq_lengths": ends,
                   "actual_seq_lengths_kv": lens, "num_heads": 4, "num_key_value_heads": 2,
                   "scale": 0.3, "sparse_mode": 4, "pre_tokens": window, "next_tokens": 0}
        out, _ = fia._reference(query, key.view(6, 4, 16), value.view(6, 4, 16), options)
        return out.double().numpy()

    def want(ends, lens, band):
        return reference_attention(query, key, value, table.numpy(), np.array([0, *ends]),
                                   np.array(lens), scale=0.3, causal=True, band=band)

    decode = fia_out([1, 2], [11, 9])[:2]
    np.testing.assert_allclose(decode, want([1, 2], [11, 9], None)[:2], rtol=1e-5, atol=1e-6)
    assert np.abs(decode - want([1, 2], [11, 9], (window, 0))[:2]).max() > 1e-2
    mtp = fia_out([1, 3], [11, 9])
    np.testing.assert_allclose(mtp, want([1, 3], [11, 9], (window, 0)), rtol=1e-5, atol=1e-6)


def test_the_fia_workspace_query_is_the_wheels(plugin_docs):
    assert "torch_npu._npu_fused_infer_attention_score_get_max_workspace(" in plugin_docs
