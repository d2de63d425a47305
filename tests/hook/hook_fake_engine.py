"""A recording engine for mechanics tests, and a CPU engine for the behaviour test.

``CpuTilingEngine`` captures into the fixture device: per graph key one tiling task that
runs our tiling kernel (``pyruntime.tiling.plan``) on the lengths read from the static
tensors at replay time, and per layer an attention task that does exactly the work the
tiling's segments assign (split-KV partials merged by log-sum-exp). No host lists.
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
    name = "cpu-test"

    def __init__(self, launch, *, max_batch, max_blocks_per_req, num_cores=8):
        self.launch = launch
        self.max_batch = max_batch
        self.max_blocks_per_req = max_blocks_per_req
        self.num_cores = num_cores
        self.tilings = {}
        self.tiling_runs = 0
        self.captured_keys = []

    def capture_attention(self, c):
        from pyruntime.tiling import TilingParams, plan

        if c.graph_key not in self.tilings:
            self.captured_keys.append(c.graph_key)
            params = TilingParams(
                num_q_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_size,
                block_size=c.block_size, max_batch=self.max_batch,
                max_tokens=c.query.shape[0], max_blocks_per_req=self.max_blocks_per_req,
                num_cores=self.num_cores,
            )
            slot = self.tilings[c.graph_key] = [None]

            def tiling_task():
                self.tiling_runs += 1
                cu, kv = c.query_start_loc, c.seq_lens
                batch = int((cu[1:] > cu[:-1]).int().cumprod(0).sum())  # live prefix
                slot[0] = plan(params, cu[: batch + 1].clone(), kv[:batch].clone(),
                               causal=c.causal)
                slot[0].raise_for_status()

            self.launch(tiling_task)
        slot = self.tilings[c.graph_key]
        self.launch(lambda: _tiled_attention(c, slot[0]))


def _tiled_attention(c, tiling):
    out = c.output.view(c.output.shape[0], c.num_heads, c.head_size)
    out.zero_()
    group = c.num_heads // c.num_kv_heads
    cu = tiling.cu_seqlens_q
    kv_lens = tiling.seqlens_kv
    acc = {}
    for seg in tiling.segments():
        r, h = seg.request, seg.kv_head
        kv_len, q0 = int(kv_lens[r]), int(cu[r])
        q_len = int(cu[r + 1]) - q0
        tokens = torch.arange(seg.kv_start, seg.kv_end)
        blocks = c.block_table[r, tokens // c.block_size].long()
        kc = c.key_cache.view(c.key_cache.shape[0], c.block_size, c.num_kv_heads, -1)
        vc = c.value_cache.view(kc.shape)
        k = kc[blocks, tokens % c.block_size, h].double()
        v = vc[blocks, tokens % c.block_size, h].double()
        heads = slice(h * group, (h + 1) * group)
        rows = torch.arange(seg.q_start, seg.q_end)
        q = c.query[q0 + rows, heads].double()
        s = torch.einsum("qgd,kd->gqk", q, k) * c.scale
        pos = (kv_len - q_len + rows).unsqueeze(1)
        s = s.masked_fill(tokens.unsqueeze(0) > pos, float("-inf"))
        m = s.amax(-1, keepdim=True).clamp_min(-1e300)
        p = torch.exp(s - m)
        lse = (m + torch.log(p.sum(-1, keepdim=True))).squeeze(-1)
        o = torch.einsum("gqk,kd->gqd", p / p.sum(-1, keepdim=True).clamp_min(1e-300), v)
        for i, row in enumerate(rows.tolist()):
            acc.setdefault((q0 + row, h), []).append((o[:, i], lse[:, i]))
    for (row, h), parts in acc.items():
        lses = torch.stack([lse for _, lse in parts])
        weights = torch.softmax(lses, dim=0).unsqueeze(-1)
        merged = (torch.stack([o for o, _ in parts]) * weights).sum(0)
        out[row, h * group : (h + 1) * group] = merged.to(out.dtype)
