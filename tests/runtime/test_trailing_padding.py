"""Tiling ABI v4: vLLM-Ascend's padding, as its model runner writes the device buffers.

A FULL_DECODE_ONLY batch of `live` requests replayed in a graph captured for `bucket` of them
carries, after the live requests, slots of q_len 1 and kv_len 0 (uniform padding), or one FIA
dummy request holding every padding token with kv_len 0 in the device buffer, and past the
slice the model runner hands attention its query offsets may be -1. Each consumer (the C
reference and the Triton kernels, on the device-tiling path) must give the live rows exactly
what the unpadded batch gives and zeros for every padding row; the tiling names the live
batch in its header.
"""

import numpy as np
import pytest
import torch

from pyruntime import backends
from pyruntime.kernels import triton_launch
from pyruntime.workload.reference import reference_attention

from .attention_helpers import SHAPES, make_attention

LIVE_Q = [1, 1, 1]
LIVE_KV = [37, 5, 64]


def _padded(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(cu_seqlens_q, seqlens_kv) of the live requests padded as vLLM-Ascend pads them."""
    cu = list(np.cumsum([0, *LIVE_Q]))
    kv = list(LIVE_KV)
    if kind == "uniform":  # _pad_query_start_loc_for_fia, uniform case: q_len 1, kv_len 0
        for _ in range(SHAPES["max_batch"] - len(kv)):
            cu.append(cu[-1] + 1)
            kv.append(0)
    elif kind == "fia-dummy":  # the mixed case: one dummy request takes the padding tokens
        cu.append(8)
        kv.append(0)
    elif kind == "minus-one-tail":  # the unused tail, filled with -1
        cu += [-1, -1]
        kv += [0, 0]
    return np.array(cu, dtype=np.int32), np.array(kv, dtype=np.int32)


def _block_table() -> np.ndarray:
    table = np.zeros((SHAPES["max_batch"], SHAPES["max_blocks_per_req"]), dtype=np.int32)
    for r in range(len(LIVE_KV)):
        table[r] = np.arange(r * SHAPES["max_blocks_per_req"], (r + 1) * SHAPES["max_blocks_per_req"])
    return table


@pytest.mark.parametrize("aicore", ["c", "triton"])
@pytest.mark.parametrize("kind", ["uniform", "fia-dummy", "minus-one-tail"])
def test_padded_batch_gives_the_live_rows_and_zeros(kind, aicore):
    if aicore == "triton" and triton_launch.available() is not None:
        pytest.skip(str(triton_launch.available()))
    backend = backends.get("cpu", num_threads=1, wait_timeout_s=120.0, aicore=aicore)
    with make_attention("device_tiling", num_layers=1, backend=backend) as attn:
        table = _block_table()
        cu_live, kv_live = _padded("none")
        cu, kv = _padded(kind)
        unpadded = attn.step(table, cu_live, kv_live)[0].clone()
        attn.check()
        padded = attn.step(table, cu, kv)[0].clone()
        attn.check()  # no tiling error: the padding is valid
        live_tokens = int(cu_live[-1])
        assert torch.equal(padded, unpadded)
        assert not padded[live_tokens:].any()
        k, v = attn.kv_caches[0]
        want = reference_attention(attn.queries[0], k, v, table, cu_live, kv_live,
                                   scale=attn.params.head_dim ** -0.5)
        np.testing.assert_allclose(padded[:live_tokens].double().numpy(), want[:live_tokens],
                                   rtol=1e-5, atol=1e-5)
    backend.close()


def test_a_zero_kv_slot_before_a_live_request_is_still_an_error():
    """Only the trailing slots are padding: an empty kv with a query before a live request is
    the caller's error, named by check()."""
    from pyruntime.tiling import KvShortError

    with make_attention("device_tiling", num_layers=1) as attn:
        attn.step(_block_table(), np.array([0, 1, 2, 3], np.int32),
                  np.array([9, 0, 9], np.int32))
        with pytest.raises(KvShortError) as info:
            attn.check()
        assert info.value.request == 1
        attn.backend.close()
