"""Random batches through the C kernel and the pure-Python oracle: the buffers must be equal.

    PYTHONPATH=$PWD python tools/fuzz_oracle_identity.py [CASES] [SEED]

A longer run of what tests/test_tiling.py::test_c_and_oracle_are_byte_identical checks with
hypothesis: random params (1-4 kv heads, core counts that are and are not multiples of the kv
heads, sliding windows), decode / speculative / prefill / padded requests, and one corrupted length in about
one case in ten. Prints one line per differing case (params, inputs, both buffers, at most
three) and a summary; exits 1 when any case differs. Needs the built extension
(``python setup.py build_ext --inplace``).
"""

from __future__ import annotations

import itertools
import random
import sys

from pyruntime.tiling import TilingParams, plan, reference_plan


def random_case(rng: random.Random) -> tuple[TilingParams, list[int], list[int], bool]:
    """One (params, cu_seqlens_q, seqlens_kv, causal), like aicpu_kernels/tests/fuzz_tiling.c."""
    heads = rng.randint(1, 4)
    cores = rng.choice([1, rng.randint(1, 48), heads * rng.randint(1, 12)])
    block, blocks = rng.choice([1, 7, 16, 64, 100, 128]), rng.randint(1, 40)
    # sliding window (ABI v5): none half the time, else a few tokens, a few blocks, or up to
    # past the capacity; with causal=False a window is E_PARAMS, which both must write alike
    window = rng.choice([None, None, None, rng.randint(1, 6), rng.randint(1, 3 * block),
                         rng.randint(1, block * blocks + 8)])
    params = TilingParams(
        num_q_heads=heads * rng.choice([1, 1, 2, 8]), num_kv_heads=heads, head_dim=64,
        block_size=block, max_batch=rng.randint(1, 24),
        max_tokens=rng.randint(1, 300), max_blocks_per_req=blocks, num_cores=cores,
        q_tile=rng.randint(1, 32), cost_kv_load=rng.randint(0, 8), cost_qk_tile=rng.randint(1, 4),
        cost_segment=rng.choice([0, rng.randint(0, 200)]), sliding_window=window,
    )  # fmt: skip
    causal = rng.random() < 0.5
    capacity = params.max_blocks_per_req * params.block_size
    budget, q_lens = params.max_tokens, []
    for _ in range(rng.randint(0, params.max_batch)):
        mode = rng.randrange(5)  # padded, decode (twice as often), speculative, prefill chunk
        q = (0, 1, 1, rng.randint(1, 6), rng.randint(1, max(budget, 1)))[mode]
        q = min(q, budget, capacity)
        budget -= q
        q_lens.append(q)
    kv = [0 if q == 0 and rng.random() < 0.5 else rng.randint(max(q, 1), capacity) for q in q_lens]
    if kv and rng.random() < 0.1:
        kv[rng.randrange(len(kv))] = rng.choice([-1, 0, capacity + 1])
    return params, [0, *itertools.accumulate(q_lens)], kv, causal


def main(argv: list[str]) -> int:
    cases = int(argv[1]) if len(argv) > 1 else 10_000
    seed = int(argv[2]) if len(argv) > 2 else 1
    rng = random.Random(seed)
    different = 0
    for _ in range(cases):
        params, cu, kv, causal = random_case(rng)
        ours = plan(params, cu, kv, causal=causal)
        oracle = reference_plan(params, cu, kv, causal=causal)
        if ours.buffer.tobytes() != oracle.buffer.tobytes():
            different += 1
            if different <= 3:
                print(f"DIFFERENT {params} cu={cu} kv={kv} causal={causal}")
                print(f"  kernel {ours.words.tolist()}")
                print(f"  oracle {oracle.words.tolist()}")
    print(f"seed {seed}: {cases} cases, {cases - different} identical, {different} different")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
