"""Checks of the tiling task on the device: our kernels, its output, and whether a captured
AI-CPU task re-runs at graph replay (which decides the placement)."""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from pyruntime import tiling
from pyruntime.backends import BackendError
from pyruntime.kernels import step as kernels

from .context import Context
from .report import CheckResult, failed, passed, skipped

#: replays the AI-CPU probe runs; the task must echo the epoch of each
PROBE_REPLAYS = 8


def probe_params(num_cores: int) -> tiling.TilingParams:
    """Llama-3-8B heads on one card, buckets up to 64 requests."""
    return tiling.TilingParams(num_q_heads=32, num_kv_heads=8, head_dim=128, block_size=128,
                               max_batch=64, max_tokens=256, max_blocks_per_req=64,
                               num_cores=num_cores)


class TilingTask:
    """The tiling task's static device buffers, and launches of it (eager or captured)."""

    def __init__(self, backend, params: tiling.TilingParams) -> None:
        self.backend, self.params = backend, params
        p, alloc = params, backend.alloc
        self.cu = alloc((p.max_batch + 1,), torch.int32)
        self.kv = alloc((p.max_batch,), torch.int32)
        self.batch = alloc((1,), torch.int32)
        self.epoch = alloc((1,), torch.int32)
        self.tiling = alloc((p.tiling_bytes,), torch.uint8)
        self.stream, self.aicpu = backend.stream("selfcheck"), backend.stream("selfcheck-aicpu")

    def stage(self, cu: np.ndarray, kv: np.ndarray, epoch: int) -> None:
        """Copy one case's lengths (padded with zeros) and epoch into the device buffers."""
        p, be = self.params, self.backend
        cu_full = np.zeros(p.max_batch + 1, np.int32)
        kv_full = np.zeros(p.max_batch, np.int32)
        cu_full[: cu.size], kv_full[: kv.size] = cu, kv
        be.copy_h2d(self.cu, cu_full, stream=self.stream)
        be.copy_h2d(self.kv, kv_full, stream=self.stream)
        be.copy_h2d(self.batch, np.array([kv.size], np.int32), stream=self.stream)
        be.copy_h2d(self.epoch, np.array([epoch], np.int32), stream=self.stream)

    def launch(self) -> None:
        """Fork to the AI-CPU stream, run the task, join (works inside a capture too)."""
        self.aicpu.wait_event(self.stream.record_event())
        self.backend.launch(kernels.TILING, {
            "cu_seqlens_q": self.cu, "seqlens_kv": self.kv, "batch": self.batch,
            "step_epoch": self.epoch, "tiling_out": self.tiling,
            "params": kernels.params_list(self.params), "causal": True}, stream=self.aicpu)
        self.stream.wait_event(self.aicpu.record_event())

    def read(self) -> np.ndarray:
        self.stream.synchronize()
        return self.tiling.cpu().numpy().copy()


def _cases(ctx: Context, max_batch: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """Decode batches from the trace at 1, 8 and 64 requests, a spec-decode batch, a padded
    one and two invalid ones (the kernel must report them through the status)."""
    rng = np.random.default_rng(0)
    prompts = np.array([r.context_tokens for r in ctx.requests()], np.int64)
    out = []
    for n in (1, 8, max_batch):
        kv = np.minimum(rng.choice(prompts, n), 8000).astype(np.int32) + 1
        out.append((f"decode batch {n}", np.arange(n + 1, dtype=np.int32), kv))
    kv = np.minimum(rng.choice(prompts, 16), 8000).astype(np.int32) + 4
    out.append(("spec decode batch 16 x 4 tokens", np.arange(17, dtype=np.int32) * 4, kv))
    out.append(("padded slots (q_len = kv_len = 0)", np.array([0, 1, 1, 2, 2], np.int32),
                np.array([300, 0, 40, 0], np.int32)))
    out.append(("invalid: kv shorter than query", np.array([0, 1, 5], np.int32),
                np.array([9, 2], np.int32)))
    out.append(("invalid: kv over capacity", np.array([0, 1], np.int32),
                np.array([64 * 128 + 1], np.int32)))
    return out


def tiling_kernel(ctx: Context) -> CheckResult:
    """The tiling task run on the backend writes exactly the host build's bytes (and the
    pure-Python oracle's, on two cases), valid and invalid inputs alike."""
    name = "tiling_kernel"
    if not ctx.kernels_ready:
        return skipped(name, "our kernels are not available (see the kernels check)")
    be = ctx.make_backend()
    try:
        params = probe_params(be.default_num_cores)
        task = TilingTask(be, params)
        cases = _cases(ctx, params.max_batch)
        mismatches, statuses = [], []
        for i, (label, cu, kv) in enumerate(cases):
            task.stage(cu, kv, epoch=i + 1)
            task.launch()
            got = task.read()
            want = tiling.plan(params, cu, kv, epoch=i + 1)
            statuses.append(tiling.strerror(want.status) if want.status else "ok")
            if not np.array_equal(got, want.buffer):
                mismatches.append(label)
            if i in (1, len(cases) - 1):  # the oracle is slow: two cases
                oracle = tiling.reference_plan(params, cu, kv, epoch=i + 1)
                if not np.array_equal(oracle.buffer, want.buffer):
                    mismatches.append(f"{label} (host build vs oracle)")
    except BackendError as exc:
        return failed(name, f"the tiling task could not run on the {ctx.backend} backend: "
                            f"{exc}")
    finally:
        _close(be)
    data = {"cases": [c[0] for c in cases], "statuses": statuses}
    aarch64 = _aarch64_build(params, cases, mismatches) if ctx.backend == "cpu" else None
    if aarch64 is not None:
        data["aarch64"] = aarch64
    if mismatches:
        return failed(name, f"device tiling differs from the host build on: "
                            f"{'; '.join(mismatches)}", **data)
    also = ""
    if aarch64 and aarch64.get("checked"):
        also = (f"; the AArch64 build (emulated) too, {min(aarch64['instructions'])} to "
                f"{max(aarch64['instructions'])} instructions per call")
    elif aarch64:
        also = f"; AArch64 build not checked: {aarch64['reason']}"
    return passed(name, f"{len(cases)} cases (decode 1/8/64, spec decode, padded, 2 invalid) "
                        f"byte-identical to the host build; 2 also to the Python oracle{also}",
                  **data)


def _aarch64_build(params, cases, mismatches: list) -> dict:
    """On the CPU backend: the same cases through the AArch64 build of the kernel (what the
    AI-CPU runs), cross-compiled with ziglang and run in the emulator, when those tools are
    installed (`pyruntime.aarch64`)."""
    try:
        from pyruntime.aarch64 import missing_tools
        from pyruntime.aarch64.kernel import EmulatedKernel
    except ImportError as exc:
        return {"checked": False, "reason": f"pyruntime.aarch64 unavailable ({exc})"}
    missing = missing_tools()
    if missing:
        return {"checked": False, "reason": f"missing {', '.join(missing)}"}
    try:
        emulated = EmulatedKernel()
        counts = []
        for i, (label, cu, kv) in enumerate(cases):
            run = emulated.plan(params, cu.tolist(), kv.tolist(), epoch=i + 1)
            counts.append(run.instructions)
            want = tiling.plan(params, cu, kv, epoch=i + 1).buffer.tobytes()
            if run.buffer != want:
                mismatches.append(f"{label} (AArch64 build)")
    except Exception as exc:  # noqa: BLE001 - a toolchain problem is reported, not raised
        return {"checked": False, "reason": f"{type(exc).__name__}: {exc}"}
    return {"checked": True, "instructions": counts}


def replay_probe(backend, replays: int = PROBE_REPLAYS,
                 replay_seconds: list[float] | None = None) -> int:
    """Capture the tiling task alone, replay it `replays` times with a new step epoch in
    device memory each time, and count the replays whose tiling header echoes that epoch:
    only the AI-CPU task writes it, so the count is how often the captured task ran.

    `replay_seconds`, when given, receives the host CPU seconds (``time.thread_time``) of
    each ``graph.replay`` call but the first: the host cost of one replay of a one-task
    graph on this backend, the R of ``aicpu-tiling bench projection`` (on the CPU backend
    and the NPU twin an emulation's cost, not a device's).
    """
    params = probe_params(backend.default_num_cores)
    task = TilingTask(backend, params)
    graph = backend.graph()
    cu, kv = np.arange(5, dtype=np.int32), np.array([33, 700, 9, 128], np.int32)
    task.stage(cu, kv, epoch=0)
    with backend.capture(graph, task.stream):
        task.launch()
    ran = 0
    for epoch in range(1, replays + 1):
        task.stage(cu, kv, epoch=epoch)
        start = time.thread_time()
        graph.replay(task.stream)
        if replay_seconds is not None and epoch > 1:  # the first may load what it runs
            replay_seconds.append(time.thread_time() - start)
        header = task.read().view(np.int32)
        ran += int(header[tiling.HDR_EPOCH]) == epoch
    return ran


def _verdict(ran: int, replays: int) -> str | None:
    if ran == replays:
        return "graph"
    if ran <= 1:  # at most the first replay (the task as captured), never again
        return "pre-replay"
    return None


def aicpu_replay(ctx: Context) -> CheckResult:
    """Does graph replay re-run a captured AI-CPU task? Picks the placement."""
    name = "aicpu_replay"
    if not ctx.kernels_ready:
        return skipped(name, "our kernels are not available (see the kernels check)")
    runs = {}
    options = [{"replay_aicpu": True}, {"replay_aicpu": False}] if ctx.backend == "cpu" else [{}]
    replay_seconds: list[float] = []
    try:
        for opts in options:
            be = ctx.make_backend(**opts)
            try:
                runs[str(opts.get("replay_aicpu", "device"))] = replay_probe(
                    be, replay_seconds=replay_seconds if not replay_seconds else None)
            finally:
                _close(be)
    except BackendError as exc:
        return failed(name, f"the replay probe could not run: {exc}")
    n = PROBE_REPLAYS
    replay_host = replay_host_cost(ctx, replay_seconds)
    if ctx.backend == "cpu":
        found = {k: _verdict(v, n) for k, v in runs.items()}
        data = {"replays": n, "ran": runs, "placement_found": found,
                "replay_host": replay_host}
        if found != {"True": "graph", "False": "pre-replay"}:
            return failed(name, f"the probe misread the emulation: replay_aicpu=True -> "
                                f"{found['True']}, False -> {found['False']}", **data)
        ctx.placement = "graph"
        return passed(name, f"the task's epoch counter saw {runs['True']}/{n} replays with "
                            f"replay_aicpu=True (-> graph) and {runs['False']}/{n} with False "
                            "(-> pre-replay): detection works; this backend re-runs them, so "
                            f"placement graph; {_replay_text(replay_host)}", **data)
    ran = runs["device"]
    placement = _verdict(ran, n)
    data = {"replays": n, "ran": {"device": ran}, "replay_host": replay_host}
    if placement is None:
        return failed(name, f"the captured AI-CPU task ran at {ran} of {n} replays: neither "
                            "always nor never; no placement can be trusted", **data)
    ctx.placement = placement
    how = "re-runs it at every replay" if placement == "graph" else "does not re-run it"
    return passed(name, f"the captured AI-CPU task echoed the step epoch at {ran}/{n} replays: "
                        f"graph replay {how}, so placement {placement}; "
                        f"{_replay_text(replay_host)}", **data)


def measured_on(ctx: Context) -> dict:
    """Where a host cost was measured: ``backend`` as reported (``cpu``, ``npu``,
    ``npu-twin``) and ``emulated``: True unless it ran on an NPU (the CPU backend and the NPU
    twin emulate the device on the host, so their costs are not a device's)."""
    return {"backend": ctx.report_backend, "emulated": ctx.twin or ctx.backend != "npu"}


def replay_host_cost(ctx: Context, seconds: list[float]) -> dict:
    """The replay probe's host cost of one ``graph.replay`` of a one-task graph: median
    microseconds over the replays measured, where it was measured (`measured_on`)."""
    median = statistics.median(seconds) * 1e6 if seconds else None
    return {"replay_host_us": median, "replays_timed": len(seconds), **measured_on(ctx)}


def _replay_text(cost: dict) -> str:
    us = cost["replay_host_us"]
    where = f"{cost['backend']}, emulated" if cost["emulated"] else cost["backend"]
    return (f"replay host cost {us:.1f} us ({where})" if us is not None
            else "replay host cost not measured")


def _close(be) -> None:
    close = getattr(be, "close", None)
    if close is not None:
        close()
