"""A recording engine for mechanics tests, and a CPU engine for the behaviour test.

``CpuTilingEngine`` captures into the fixture device with the kernels the CPU backend runs:
per graph key one AI-CPU tiling task (``plan_into`` on the static length tensors at replay
time) and per layer the C reference attention over every core's tiling range plus the
combine step. No host lists.
"""

import torch


class RecordingEngine:
    name = "recording"

    def __init__(self):
        self.captures = []

    def capture_attention(self, capture):
        self.captures.append(capture)


def make_recording():
    return RecordingEngine()


class CpuTilingEngine:
    """Captures into the fixture device with the project's own kernels, as on the CPU backend.

    Per graph key, one AI-CPU tiling task: ``pyruntime.tiling.plan_into`` reads the static
    ``query_start_loc`` / ``seq_lens`` / ``batch`` tensors at replay time and writes a fixed tiling
    buffer (no host lists). Per layer, one AI Core task: the C reference attention runs
    every core's range of that buffer, then the combine step, with the layer's logits soft cap.
    """

    name = "cpu-test"
    applies_logits_soft_cap = True  # the C reference takes capture.logits_soft_cap

    def __init__(self, launch, *, max_batch, max_blocks_per_req, num_cores=8):
        self.launch = launch
        self.max_batch = max_batch
        self.max_blocks_per_req = max_blocks_per_req
        self.num_cores = num_cores
        self.tilings = {}
        self.tiling_runs = 0
        self.captured_keys = []

    def capture_attention(self, c):
        from pyruntime.kernels import reference_attention as ra
        from pyruntime.tiling import TilingParams, plan_into

        if c.graph_key not in self.tilings:
            self.captured_keys.append(c.graph_key)
            params = TilingParams(
                num_q_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_size,
                block_size=c.block_size, max_batch=self.max_batch,
                max_tokens=c.query.shape[0], max_blocks_per_req=self.max_blocks_per_req,
                num_cores=self.num_cores,
            )
            buffer = torch.zeros(params.tiling_bytes, dtype=torch.uint8)
            self.tilings[c.graph_key] = (params, buffer, ra.partial_buffers(params))

            def tiling_task():
                self.tiling_runs += 1
                # the static batch the hook wrote; trailing kv_len 0 slots are padding
                status = plan_into(params, c.query_start_loc, c.seq_lens, int(c.batch[0]),
                                   buffer, causal=c.causal)
                assert status == 0, f"tiling status {status}"

            self.launch(tiling_task)
        params, buffer, (partial_out, partial_lse) = self.tilings[c.graph_key]
        self.launch(lambda: _tiled_attention(c, params, buffer, partial_out, partial_lse))


def _tiled_attention(c, params, buffer, partial_out, partial_lse):
    from pyruntime.kernels import reference_attention as ra

    out = c.output.view(c.output.shape[0], c.num_heads, c.head_size)
    cache_shape = (c.key_cache.shape[0], c.block_size, c.num_kv_heads, c.head_size)
    block_table = torch.zeros(params.max_batch, params.max_blocks_per_req, dtype=torch.int32)
    rows = min(c.block_table.shape[0], params.max_batch)
    block_table[:rows] = c.block_table[:rows, : params.max_blocks_per_req]
    batch = int(buffer.view(torch.int32)[6])  # the tiling header's live batch
    cu = c.query_start_loc[: batch + 1].contiguous()
    kv = c.seq_lens[:batch].contiguous()
    for core in range(params.num_cores):
        status = ra.attention_core(
            params, buffer, core, query=c.query, key_cache=c.key_cache.view(cache_shape),
            value_cache=c.value_cache.view(cache_shape), block_table=block_table,
            cu_seqlens_q=cu, seqlens_kv=kv, out=out, partial_out=partial_out,
            partial_lse=partial_lse, scale=c.scale, causal=c.causal,
            logits_soft_cap=c.logits_soft_cap,
        )  # fmt: skip
        assert status == ra.OK, ra.strerror(status)
    status = ra.attention_finalize(params, buffer, cu_seqlens_q=cu, out=out,
                                   partial_out=partial_out, partial_lse=partial_lse)
    assert status == ra.OK, ra.strerror(status)
