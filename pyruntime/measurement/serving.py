"""What a serving host does per decode step around the attention's own work: the bench's
measuring methods.

Two methods of measuring one mode's host step (``aicpu-tiling bench --method``):

``old`` (the method of the figures up to 2026-12-02, kept to rerun them side by side):
each mode's step is `StaticAttention.step` alone. host_update's step holds vLLM-Ascend's
pre-replay synchronize, which waits for the unmeasured first step of the warm pair, so the
host sleeps inside it; the device modes' steps neither synchronize nor sleep.

``symmetric`` (issue 30): each mode's measured step holds what that path's host does per
decode step inside vLLM-Ascend on an NPU, and nothing else:

- the input copies, the same in every mode: the block table and the packed lengths
  (vLLM-Ascend's model runner copies ``query_start_loc`` and ``seq_lens`` to the device every
  step whatever the attention backend: ``vllm_ascend/worker/model_runner_v1.py``,
  ``self.query_start_loc.copy_to_gpu()`` and ``self.seq_lens.copy_(..., non_blocking=True)``
  in 0.30.0rc2; host_update reads its lengths as host lists on top of that);
- vLLM-Ascend's ``torch.npu.current_stream().synchronize()`` before the replay, in every mode
  (``vllm_ascend/compilation/acl_graph.py``, ``ACLGraphWrapper.__call__``, FULL mode; the
  hook leaves it in place);
- in the device modes, the hook engine's per-step work: what ``NpuTilingEngine.before_replay``
  issues with K captured graph keys, counted off the engine itself
  (`pyruntime.hook.engine_step`) and issued here on the bench's backend (`EngineWork`);
- input validation in every mode, outside the measured step (`StaticAttention.step`
  validates before its host part starts).

Every measured step starts from the same host state: the device idle (the previous steps'
device work finished before it, so the synchronize inside it does not sleep) and the host
warm (a host-only warm-up runs just before it, `warm_up_host`). Each step records how long
the host was blocked inside it (`StaticAttention.last_step_blocked_seconds`), the marker
that shows it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

# torch is imported where work starts: `aicpu-tiling --help` imports this module (bench.py)
# and must answer without loading torch
from ..kernels.kernel import AICORE, Kernel

#: the bench's measuring methods (see the module docstring)
METHODS = ("old", "symmetric")
DEFAULT_METHOD = "symmetric"


def vllm_default_capture_sizes(max_num_seqs: int = 128, decode_query_len: int = 1,
                               default_max_graph_size: int = 512) -> list[int]:
    """vLLM's default list of graph capture sizes (token buckets).

    vLLM 0.30 (the one vLLM-Ascend 0.30.0rc2 runs on), ``vllm/config/vllm.py``
    ``VllmConfig._set_cudagraph_sizes``: ``max_graph_size = min(max_num_seqs *
    decode_query_len * 2, 512)`` (1024 only on data-centre Blackwell) and
    ``[1, 2, 4] + list(range(8, 256, 8)) + list(range(256, max_graph_size + 1, 16))``;
    ``max_num_seqs`` defaults to ``SchedulerConfig.DEFAULT_MAX_NUM_SEQS = 128``
    (``vllm/config/scheduler.py``). With the defaults: 35 sizes, 1 .. 256.
    """
    top = min(max_num_seqs * decode_query_len * 2, default_max_graph_size)
    sizes = [n for n in (1, 2, 4) if n <= top]
    sizes += list(range(8, min(256, top + 1), 8)) + list(range(256, top + 1, 16))
    return sorted(set(sizes))


#: K, the captured graph keys the bench's device modes stand in for by default
DEFAULT_GRAPH_KEYS = len(vllm_default_capture_sizes())


@dataclass(frozen=True)
class EngineWork:
    """The hook engine's device work per step (`pyruntime.hook.engine_step.EngineStepCounts`
    for the mode's placement and K keys).

    Attributes:
        graph_keys: K.
        h2d_copies: host-to-device copies per step (0 since the device-advanced shared
            epoch; `ServingStep` refuses any other count).
        blocking_copies: those that block (each synchronises the stream); 0 likewise.
        tiling_launches: AI-CPU tiling launches per step; the pre-replay path's own launch is
            one of them, so the bench adds ``tiling_launches - 1`` (``pre-replay``) or
            ``tiling_launches`` (``graph``).
        device_ops: enqueued AI Core ops per step with no copy and no host wait (the shared
            step epoch's advance under ``pre-replay`` until 2026-12-06, 0 since: the graphs
            advance it); the bench launches as many no-op AI Core tasks.
    """

    graph_keys: int
    h2d_copies: int
    blocking_copies: int
    tiling_launches: int
    device_ops: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)

    @classmethod
    def from_counts(cls, graph_keys: int, counts: Any) -> EngineWork:
        """From `pyruntime.hook.engine_step.engine_step_work`'s counts (its
        ``EngineStepCounts``: the same fields but ``graph_keys``)."""
        return cls(graph_keys=graph_keys, h2d_copies=counts.h2d_copies,
                   blocking_copies=counts.blocking_copies,
                   tiling_launches=counts.tiling_launches, device_ops=counts.device_ops)


class ServingStep:
    """The ``before_replay`` work of one mode under the symmetric method, on its backend.

    Args:
        attn: a captured `StaticAttention` (any mode).
        mode: a `pyruntime.measurement.abrun.VARIANTS` key.
        engine: the hook engine's per-step work (device modes; None for host_update).

    Raises:
        ValueError: an engine that launches fewer tiling tasks than the path itself does,
            engine work given to host_update, or an engine that copies from the host per
            step: `NpuTilingEngine` has made none since the device-advanced shared epoch
            (issue 30, item 4), so the stand-in for such copies (one staged int32 copy per
            key, a synchronize after each blocking one) ran on no path and was removed; an
            engine that copies again must be refused here rather than measured without them.
    """

    def __init__(self, attn: Any, mode: str, engine: EngineWork | None) -> None:
        buffers, path = attn._live()
        self.backend, self.buffers, self.path = attn.backend, buffers, path
        self.host_update = mode == "host_update"
        if self.host_update and engine is not None:
            raise ValueError("host_update runs no hook engine")
        own = 1 if getattr(path, "placement", None) == "pre-replay" else 0
        if engine is not None and engine.tiling_launches < own:
            raise ValueError(f"the engine launches {engine.tiling_launches} tiling task(s) per "
                             f"step, the {path.placement} path itself {own}")
        if engine is not None and (engine.h2d_copies or engine.blocking_copies):
            raise ValueError(f"the engine copies from the host per step ({engine.h2d_copies} "
                             f"copies, {engine.blocking_copies} blocking): the bench has no "
                             "stand-in for that since the engine stopped doing it")
        self.engine = engine
        self.extra_launches = 0 if engine is None else engine.tiling_launches - own
        import torch

        self.scratch = self.backend.alloc((1,), torch.int32)  # the device ops' (NPU body)
        self._lengths: np.ndarray | None = None

    def stage(self, cu_seqlens_q: np.ndarray, seqlens_kv: np.ndarray) -> None:
        """The host image of this step's packed lengths (host_update's extra copy); host
        preparation, outside the measured step."""
        n, first_kv = len(seqlens_kv), self.buffers.params.max_batch + 3
        image = np.zeros(self.buffers.lengths.shape[0], np.int32)
        image[1], image[2: n + 3], image[first_kv: first_kv + n] = n, cu_seqlens_q, seqlens_kv
        self._lengths = image

    def __call__(self) -> None:
        """Between the path's input copies and its replay (`StaticAttention.step`)."""
        be, stream = self.backend, self.path.stream
        if self.host_update:  # its own synchronize follows (HostUpdatePath.step)
            be.copy_h2d(self.buffers.lengths, self._lengths, stream=stream)
            return
        stream.synchronize()  # vLLM-Ascend's pre-replay synchronize
        for _ in range(self.engine.device_ops):
            be.launch(_NO_OP_TASK, {"scratch": self.scratch}, num_cores=1, stream=stream)
        for _ in range(self.extra_launches):
            self.path._launch_tiling()


def warm_up_host(rounds: int = 40) -> None:
    """Host-only work of a serving loop's input preparation, run just before a measured step
    so that every mode starts warm after the host slept through the device phase: small
    numpy and torch operations, no device work (about 100 us here). Without it the first
    host work after a sleep of over 10 ms costs about 150 us more on this project's VM
    (docs/benchmarks.md, the cold-start probe)."""
    import torch

    a = np.arange(64, dtype=np.int32)
    t = torch.zeros(64, dtype=torch.int32)
    for _ in range(rounds):
        b = np.cumsum(a).astype(np.int32)
        t.copy_(torch.from_numpy(b))


def make_before_replay(method: str, attn: Any, mode: str,
                       engine: EngineWork | None) -> ServingStep | None:
    """The callable `StaticAttention.step` runs before its replay under `method` (None
    under ``old``)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if method == "old" or mode == FLOOR_MODE:
        return None
    return ServingStep(attn, mode, None if mode == "host_update" else engine)




#: the run mode of the floor (`FloorStep`), stepped beside the modes in one run
FLOOR_MODE = "floor"
#: what the floor's measured step follows under the symmetric method (``bench
#: --floor-method``): ``lead``, a whole device_tiling step on the floor's backend
#: (`pyruntime.measurement.abrun.FloorLead`), the host state the device modes' measured steps
#: start from; ``noop``, the floor's own previous step (its one no-op task), waited for, the
#: way the floor was measured before 2026-12-03 (warm, against cold device modes). Several,
#: comma-separated, run side by side in one run; the first is the headline's.
FLOOR_METHODS = ("lead", "noop")
DEFAULT_FLOOR_METHOD = "lead"


def _no_op(core: int, **args: Any) -> None:
    """The floor graph's one task: no work."""


def _zero_scratch(scratch: Any) -> None:
    """The floor's task on the NPU backend: a graph holds at least one task, and the NPU
    backend launches a kernel's torch op, so the nearest thing to no work is zeroing one
    element of a scratch buffer (one small kernel, captured and replayed like any other)."""
    scratch.zero_()


_NO_OP_TASK = Kernel("floor_no_op", AICORE, _no_op, npu_op=_zero_scratch)


class FloorStep:
    """The work a device mode's host step cannot avoid, stepped like a `StaticAttention`.

    Its measured host part: the two input copies of the device path (the packed lengths and
    the block table, from host arrays prepared before it), the pre-replay synchronize that
    vLLM-Ascend keeps (``sync=True``, the symmetric method), and one replay of a graph that
    holds one task that does nothing. A device mode's ``floor_ratio`` is its median host
    time over this one's, measured side by side in the same run.

    Args:
        backend: the backend (one of its own, like every mode of a run).
        max_batch, max_blocks_per_req: the sizes of the device path's input buffers.
        sync: synchronise the stream before the replay.
    """

    def __init__(self, backend: Any, *, max_batch: int, max_blocks_per_req: int,
                 sync: bool) -> None:
        self.backend, self.sync = backend, sync
        self.stream = backend.stream("floor")
        import torch

        self.lengths = backend.alloc((2 * max_batch + 3,), torch.int32)
        self.block_table = backend.alloc((max_batch, max_blocks_per_req), torch.int32)
        self._image = np.zeros(2 * max_batch + 3, np.int32)
        self._first_kv = max_batch + 3
        self.scratch = backend.alloc((1,), torch.int32)  # what the NPU body writes
        self.graph = backend.graph()
        with backend.capture(self.graph, self.stream):
            backend.launch(_NO_OP_TASK, {"scratch": self.scratch}, num_cores=1,
                           stream=self.stream)
        self.last_step_host_seconds = self.last_step_blocked_seconds = float("nan")

    def step(self, block_table: np.ndarray, cu_seqlens_q: np.ndarray, seqlens_kv: np.ndarray,
             *, wait: bool = True, before_replay: Any = None) -> None:
        """Stage the lengths (not measured), then the measured host part."""
        n, image = len(seqlens_kv), self._image
        image[1], image[2: n + 3] = n, cu_seqlens_q
        image[self._first_kv: self._first_kv + n] = seqlens_kv
        be, stream = self.backend, self.stream
        with be.hold_device():
            wall, start = time.perf_counter(), time.thread_time()
            be.copy_h2d(self.lengths, image, stream=stream)
            be.copy_h2d(self.block_table, block_table, stream=stream)
            if self.sync:
                stream.synchronize()
            self.graph.replay(stream)
            self.last_step_host_seconds = time.thread_time() - start
            self.last_step_blocked_seconds = max(
                0.0, time.perf_counter() - wall - self.last_step_host_seconds)
        if wait:
            self.wait()

    def wait(self) -> None:
        self.stream.synchronize()

    def check(self) -> None:
        self.wait()

    def close(self) -> None:
        self.graph.reset()
        self.backend.release_stream(self.stream)
