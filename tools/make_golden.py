"""Regenerate tests/data/golden_tiling.json from the pure-Python oracle.

    python tools/make_golden.py

The golden file pins the ABI: a change to the kernel's output for these inputs shows up as
a failing test_golden_vectors, and then either the change is a bug or the ABI version moves.
The words come from the oracle (not the C build) so the file is made independently of what
it checks.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyruntime import tiling_oracle
from pyruntime.tiling import TilingParams

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden_tiling.json"

LLAMA = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 128}
SMALL = {"num_q_heads": 4, "num_kv_heads": 2, "head_dim": 64, "block_size": 16}

CASES = [
    ("decode one request", LLAMA, {"max_batch": 4, "max_tokens": 8, "max_blocks_per_req": 64,
                                       "num_cores": 24}, [0, 1], [3000], True),
    ("decode trace-like", LLAMA, {"max_batch": 8, "max_tokens": 8, "max_blocks_per_req": 64,
                                      "num_cores": 24},
     [0, 1, 2, 3, 4, 5, 6], [374, 396, 879, 91, 1500, 2411], True),
    ("padded bucket", LLAMA, {"max_batch": 8, "max_tokens": 8, "max_blocks_per_req": 64,
                                  "num_cores": 24}, [0, 1, 1, 2, 2, 2], [700, 0, 64, 0, 0], True),
    ("speculative decode", LLAMA, {"max_batch": 4, "max_tokens": 16, "max_blocks_per_req": 64,
                                       "num_cores": 20}, [0, 4, 8, 12], [900, 35, 4000], True),
    ("chunked prefill mix", SMALL, {"max_batch": 4, "max_tokens": 512, "max_blocks_per_req": 64,
                                        "num_cores": 5, "q_tile": 16},
     [0, 300, 301, 400], [300, 800, 120], True),
    ("non-causal", SMALL, {"max_batch": 4, "max_tokens": 64, "max_blocks_per_req": 8, "num_cores": 3,
                               "q_tile": 4}, [0, 10, 11], [50, 7], False),
    ("one core", SMALL, {"max_batch": 2, "max_tokens": 8, "max_blocks_per_req": 8, "num_cores": 1},
     [0, 3, 4], [20, 100], True),
    ("more cores than work", SMALL, {"max_batch": 2, "max_tokens": 8, "max_blocks_per_req": 8,
                                         "num_cores": 16}, [0, 1], [16], True),
    ("block size 7", SMALL, {"max_batch": 3, "max_tokens": 40, "max_blocks_per_req": 9,
                                 "num_cores": 6, "q_tile": 5, "cost_segment": 0},
     [0, 17, 18, 30], [60, 1, 12], True),
    ("vllm-ascend uniform padding (q_len 1, kv_len 0)", LLAMA,
     {"max_batch": 8, "max_tokens": 8, "max_blocks_per_req": 64, "num_cores": 24},
     [0, 1, 2, 3, 4, 5, 6, 7, 8], [374, 396, 879, 0, 0, 0, 0, 0], True),
    ("vllm-ascend FIA dummy request and -1 tail", LLAMA,
     {"max_batch": 6, "max_tokens": 8, "max_blocks_per_req": 64, "num_cores": 24},
     [0, 1, 2, 8, -1, -1, -1], [500, 600, 0, 0, 0, 0], True),
    ("sliding window 128, decode (ABI v5)", LLAMA,
     {"max_batch": 8, "max_tokens": 8, "max_blocks_per_req": 256, "num_cores": 24,
      "sliding_window": 128}, [0, 1, 2, 3, 4], [32768, 130, 129, 5000], True),
    ("sliding window 40, chunked prefill (ABI v5)", SMALL,
     {"max_batch": 4, "max_tokens": 512, "max_blocks_per_req": 64, "num_cores": 5, "q_tile": 16,
      "sliding_window": 40}, [0, 300, 301, 400], [300, 800, 120], True),
    ("sliding window 9, block size 7 (ABI v5)", SMALL,
     {"max_batch": 3, "max_tokens": 40, "max_blocks_per_req": 9, "num_cores": 6, "q_tile": 5,
      "cost_segment": 0, "sliding_window": 9}, [0, 17, 18, 30], [60, 1, 12], True),
    ("empty batch", SMALL, {"max_batch": 3, "max_tokens": 8, "max_blocks_per_req": 4,
                                "num_cores": 4}, [0], [], True),
    ("error: kv shorter than query", SMALL, {"max_batch": 3, "max_tokens": 8,
                                                 "max_blocks_per_req": 4, "num_cores": 4},
     [0, 1, 5], [3, 2], True),
    ("error: past max_tokens", SMALL, {"max_batch": 3, "max_tokens": 8, "max_blocks_per_req": 4,
                                           "num_cores": 4}, [0, 1, 9], [3, 20], True),
]


def main() -> None:
    cases = []
    for i, (name, heads, rest, cu, kv, causal) in enumerate(CASES):
        params = TilingParams(**heads, **rest)
        epoch = (i + 1) * 7919 * (-1 if i % 3 == 2 else 1)  # any int32, negatives included
        words = tiling_oracle.oracle_plan(params, cu, kv, len(kv), causal, epoch=epoch)
        cases.append({"name": name, "params": params.as_dict(), "cu_seqlens_q": cu, "seqlens_kv": kv,
                          "causal": causal, "epoch": epoch, "words": [int(w) for w in words]})
    OUT.write_text(json.dumps(cases, indent=1) + "\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
