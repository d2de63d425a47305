"""The engine check's counters in vLLM's workers (``aicpu-tiling serve-check``, issue 29).

The engine check (`pyruntime.hook.dryrun.engine_check`) counts what happens where the model
runs: in each worker, one process per rank at TP > 1 (vLLM's ``MultiprocExecutor``), the
engine's own process at TP 1. It calls `begin` and then `counts` on every worker through
vLLM's ``LLM.collective_rpc``, which pickles a callable and runs it with the worker as its
first argument. They live in this module, not in ``engine_check`` (which runs as
``__main__`` in the child): cloudpickle sends a function of ``__main__`` by value, with a
copy of its module's globals per call, so `_WORKER`'s counts would not survive from one call
to the next; a function of an importable module is sent by reference.
"""

from __future__ import annotations

import os
from typing import Any

#: the twin device's counters of host waits (`pyruntime.npu_twin.device`): blocking copies
#: either direction, explicit synchronizes
BLOCKING_COPIES = ("copies_h2d_blocking", "copies_d2h")
SYNCHRONIZES = ("synchronizes",)


def host_waits(stats: Any, before: dict | None = None) -> dict[str, int]:
    """The twin device's host waits (`stats`: ``pyruntime.npu_twin.device.device().stats``)
    since the snapshot `before` (``dict(stats)``; None: since the start): ``blocking_copies``
    (`BLOCKING_COPIES`) and ``synchronizes`` (`SYNCHRONIZES`)."""
    before = before or {}
    since = {k: stats[k] - before.get(k, 0) for k in BLOCKING_COPIES + SYNCHRONIZES}
    return {"blocking_copies": sum(since[k] for k in BLOCKING_COPIES),
            "synchronizes": sum(since[k] for k in SYNCHRONIZES)}


#: this process's counters while a worker of it counts (`begin`)
_WORKER: dict[str, Any] = {"updates": 0, "stats": None, "wrapped": False, "replays": {},
                           "replays_wrapped": False}


def _count_replays() -> None:
    """Count each FULL graph replay in `_WORKER`'s ``replays`` by its batch descriptor's
    ``(num_tokens, num_reqs)``: wraps vLLM-Ascend's ``ACLGraphWrapper.__call__``
    (``vllm_ascend/compilation/acl_graph.py``: a call whose forward context's
    ``cudagraph_runtime_mode`` is the wrapper's own, not NONE, captures the descriptor's graph
    the first time and replays it after), so after the engine's capture (`begin` runs after
    it) every such call is a replay. Wraps what is there (the hook's wrapper in a hooked
    run), at class level: the model's wrapper is an instance of it."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import get_forward_context
    from vllm_ascend.compilation import acl_graph

    call = acl_graph.ACLGraphWrapper.__call__

    def counted_call(self, *args, **kwargs):
        context = get_forward_context()
        mode = context.cudagraph_runtime_mode
        if mode != CUDAGraphMode.NONE and mode == self.runtime_mode:
            descriptor = context.batch_descriptor
            key = (int(descriptor.num_tokens), int(getattr(descriptor, "num_reqs", 0) or 0))
            _WORKER["replays"][key] = _WORKER["replays"].get(key, 0) + 1
        return call(self, *args, **kwargs)

    acl_graph.ACLGraphWrapper.__call__ = counted_call


def begin(worker: Any) -> dict[str, Any]:
    """``LLM.collective_rpc`` target, in each worker (`worker`: vLLM-Ascend's ``NPUWorker``)
    before the generate call: from now on count the graph task updates
    (``torch.npu.graph_task_update_begin``, wrapped once per process) and, on the twin,
    snapshot the device's counters; count the FULL graph replays by batch descriptor
    (`_count_replays`). Returns ``{"rank", "pid"}``."""
    import torch

    if not _WORKER["wrapped"]:
        original = torch.npu.graph_task_update_begin

        def counted_begin(*args, **kwargs):
            _WORKER["updates"] += 1
            return original(*args, **kwargs)

        torch.npu.graph_task_update_begin = counted_begin
        _WORKER["wrapped"] = True
    if not _WORKER["replays_wrapped"]:
        _count_replays()
        _WORKER["replays_wrapped"] = True
    _WORKER["updates"], _WORKER["replays"] = 0, {}
    from pyruntime.npu_twin import is_active as twin_active

    if twin_active():
        from pyruntime.npu_twin import device as twin_device

        _WORKER["stats"] = dict(twin_device.device().stats)
    return {"rank": int(worker.rank), "pid": os.getpid()}


def counts(worker: Any, hooked: bool) -> dict[str, Any]:
    """``LLM.collective_rpc`` target, in each worker after the generate call: what it counted
    since `begin`: ``rank``, ``device`` (``"npu:k"``), ``pid``, ``updates``
    (graph task updates), ``replays`` (``[num_tokens, num_reqs, replays]`` per batch
    descriptor, ascending), on the twin ``blocking_copies`` and ``synchronizes``
    (`host_waits`), ``collectives_issued`` (HCCL collectives the host queued eagerly) and
    ``collectives_replayed`` (those run by graph replays: run minus issued), else None; and,
    when `hooked`, the hook's ``hook_state``, ``hook_reason``, ``hook_engine``,
    ``device_layers`` and ``host_layers`` in this worker."""
    record: dict[str, Any] = {
        "rank": int(worker.rank), "device": str(worker.device), "pid": os.getpid(),
        "updates": _WORKER["updates"],
        "replays": [[t, r, n] for (t, r), n in sorted(_WORKER["replays"].items())],
        "blocking_copies": None, "synchronizes": None,
        "collectives_issued": None, "collectives_replayed": None,
        "hook_state": None, "hook_reason": None, "hook_engine": None,
        "device_layers": {}, "host_layers": {}}
    if _WORKER["stats"] is not None:
        from pyruntime.npu_twin import device as twin_device

        stats, before = twin_device.device().stats, _WORKER["stats"]
        record.update(host_waits(stats, before))
        issued = stats["hccl"] - before.get("hccl", 0)
        ran = stats["collectives_run"] - before.get("collectives_run", 0)
        record["collectives_issued"], record["collectives_replayed"] = issued, ran - issued
    if hooked:
        from pyruntime import hook

        status = hook.status()
        reason = status.reason if status.installed else (
            "the hook is not installed in this worker's process (vLLM installs it there "
            "through its vllm.general_plugins entry point, aicpu_tiling)")
        record.update(hook_state=status.state, hook_reason=reason,
                      hook_engine=status.engine, device_layers=dict(status.device_entries),
                      host_layers=dict(status.host_path_layers))
    return record
