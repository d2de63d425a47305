"""Bad lengths: check() names the request, outputs are zero, nothing else is touched."""

import numpy as np
import pytest
import torch

from pyruntime import tiling
from pyruntime.attention import (
    AttentionInputError,
    AttentionStateError,
    FrozenSizeError,
    StaticAttention,
)
from pyruntime.backends import get

from .attention_helpers import NUM_BLOCKS, SHAPES, make_attention

MODES = ("device_tiling", "host_update")
GOOD = ([0, 1, 3, 4], [9, 30, 1])

# (error class, cu_seqlens_q, seqlens_kv, offending request, causal)
BAD = [
    (tiling.QueryStartError, [1, 2, 3, 4], [9, 30, 1], 0, True),
    (tiling.QueryDecreasingError, [0, 3, 2, 4], [9, 30, 1], 1, True),
    (tiling.QueryOverflowError, [0, 1, 3, 25], [9, 30, 30], 2, True),
    (tiling.KvNegativeError, [0, 1, 3, 4], [9, -4, 1], 1, True),
    (tiling.KvShortError, [0, 1, 3, 4], [9, 1, 1], 1, True),
    (tiling.KvCapacityError, [0, 1, 3, 4], [9, 30, 16 * 8 + 1], 2, True),
    (tiling.KvEmptyError, [0, 1, 3, 4], [9, 0, 1], 1, False),
]


def _block_table():
    return torch.arange(8 * 16, dtype=torch.int32).reshape(8, 16)


def _step(attn, cu, kv):
    bt = _block_table()
    return attn.step(bt, torch.tensor(cu, dtype=torch.int32), torch.tensor(kv, dtype=torch.int32))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("error, cu, kv, bad_request, causal", BAD,
                         ids=[case[0].__name__ for case in BAD])
def test_bad_lengths(mode, error, cu, kv, bad_request, causal):
    attn = make_attention(mode, causal=causal)
    outs = _step(attn, *GOOD)
    attn.check()
    assert all(o[:4].abs().sum() > 0 for o in outs)
    caches = [(k.clone(), v.clone()) for k, v in attn.kv_caches]
    outs = _step(attn, cu, kv)
    with pytest.raises(error) as caught:
        attn.check()
    assert caught.value.request == bad_request
    assert f"request {bad_request}" in str(caught.value)
    assert isinstance(caught.value, tiling.TilingInputError)
    assert all(torch.count_nonzero(o) == 0 for o in outs)
    for (k0, v0), (k1, v1) in zip(caches, attn.kv_caches):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
    assert torch.equal(attn.block_table, _block_table())
    _step(attn, *GOOD)  # a good step afterwards works again
    attn.check()
    attn.backend.close()


@pytest.mark.parametrize("mode", MODES)
def test_frozen_sizes_and_arguments(mode):
    attn = make_attention(mode, num_layers=1)
    nine = torch.zeros(9, dtype=torch.int32)
    with pytest.raises(FrozenSizeError, match="max_batch is frozen at 8") as caught:
        attn.step(_block_table(), torch.arange(10, dtype=torch.int32), nine)
    assert caught.value.name == "max_batch" and caught.value.got == 9
    with pytest.raises(FrozenSizeError, match="max_blocks_per_req is frozen at 16"):
        attn.step(torch.zeros(8, 17, dtype=torch.int32),
                  *(torch.tensor(x, dtype=torch.int32) for x in GOOD))
    with pytest.raises(AttentionInputError, match="cu_seqlens_q must be int32, got int64"):
        attn.step(_block_table(), torch.tensor(GOOD[0]), torch.tensor(GOOD[1]))
    with pytest.raises(AttentionInputError, match="len\\(seqlens_kv\\) \\+ 1 = 3"):
        attn.step(_block_table(), np.array([0, 1], np.int32), np.array([1, 1], np.int32))
    with pytest.raises(AttentionStateError, match="already called"):
        attn.capture()
    attn.backend.close()


def test_step_before_capture_and_bad_mode():
    backend = get("cpu")
    attn = StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="host_update",
                           dtype=torch.float32, num_cores=4, **SHAPES)
    with pytest.raises(AttentionStateError, match="before capture"):
        _step(attn, *GOOD)
    with pytest.raises(ValueError, match="mode must be one of"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="eager",
                        dtype=torch.float32, **SHAPES)
    with pytest.raises(AttentionInputError, match="dtype must be one of"):
        StaticAttention(backend, num_layers=1, num_blocks=NUM_BLOCKS, mode="host_update",
                        dtype=torch.float64, **SHAPES)
    backend.close()
