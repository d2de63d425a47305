"""What `NpuTilingEngine.before_replay` asks of the device per step, read off the engine itself.

``aicpu-tiling bench`` charges the device modes' measured step with the hook engine's per-step
host work (issue 30, item 1). Rather than a copy of that work, `engine_step_work` runs the
real `NpuTilingEngine` with K captured graph keys on host tensors and records what one
``before_replay(num_tokens)`` does through torch and through the engine's op namespace:

- every aten ``copy_`` into one of the engine's device buffers from a host tensor is a
  host-to-device copy; with ``non_blocking=False`` it is blocking: torch_npu's aten copy
  kernel (Ascend/pytorch, ``copy_between_host_and_device``) synchronises the current stream
  after the copy unless ``non_blocking`` is set;
- every ``plan_tiling`` / ``plan_tilings`` op call is one AI-CPU tiling launch;
- every in-place aten op on one of the engine's device buffers whose other tensors are
  device buffers too (the shared step epoch's ``add_``) is one enqueued AI Core op: no copy,
  no host wait;
- anything else that touches a device buffer, or any other op of the namespace, is work the
  bench cannot stand in for, and raises `EngineStepError` naming it, so a change to the engine
  fails loudly here instead of being left out of the bench.

`tests/cli/test_bench_method.py` checks these counts against the engine's own seams (its
``_plan`` and ``_advance_epoch``); a check against the NPU twin's own counters of the same
engine is not written yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .engine import AttentionCapture
from .npu_engine import NpuTilingEngine

#: the op namespace calls that launch the AI-CPU tiling task (`NpuTilingEngine._plan`)
TILING_OPS = ("plan_tiling", "plan_tilings")


#: the in-place ops that advance the step epoch on the device (`NpuTilingEngine._advance_epoch`)
_EPOCH_ADVANCE = (torch.ops.aten.add_.Tensor, torch.ops.aten.add_.Scalar)


class EngineStepError(RuntimeError):
    """`NpuTilingEngine.before_replay` does per-step work the bench has no stand-in for."""


@dataclass(frozen=True)
class EngineStepCounts:
    """One ``before_replay`` of `NpuTilingEngine` with ``graph_keys`` captured keys.

    Attributes:
        placement: ``"graph"`` or ``"pre-replay"``.
        graph_keys: captured graph keys (token buckets).
        h2d_copies: host-to-device copies issued.
        blocking_copies: those of them that block the host (each synchronises the stream).
        tiling_launches: AI-CPU tiling launches (``plan_tiling`` / ``plan_tilings``).
        device_ops: enqueued in-place AI Core ops on the engine's buffers, each a launch
            with no copy and no host wait (the step epoch's advance under ``pre-replay``
            until 2026-12-06; since then captured in the graphs: 0 in both placements).
    """

    placement: str
    graph_keys: int
    h2d_copies: int
    blocking_copies: int
    tiling_launches: int
    device_ops: int = 0


class _RecordingOps:
    """The engine's op namespace: records calls, runs nothing."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def op(*args: Any, **kwargs: Any) -> None:
            self.calls.append(name)

        return op


class _CopyRecorder(TorchDispatchMode):
    """Records aten ops touching the engine's device buffers (by storage pointer)."""

    def __init__(self, device_storages: set[int]) -> None:
        super().__init__()
        self.device_storages = device_storages
        self.copies: list[bool] = []  # one entry per host-to-device copy: blocking?
        self.device_ops = 0  # in-place ops among the engine's device buffers
        self.other: list[str] = []

    def _on_device(self, value: Any) -> bool:
        return (isinstance(value, torch.Tensor)
                and value.untyped_storage().data_ptr() in self.device_storages)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        touched = [a for a in (*args, *kwargs.values()) if self._on_device(a)]
        if func is torch.ops.aten.copy_.default and touched and self._on_device(args[0]) \
                and not self._on_device(args[1]):
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            self.copies.append(not non_blocking)
        elif func in _EPOCH_ADVANCE and self._on_device(args[0]) and all(
                self._on_device(a) for a in (*args, *kwargs.values())
                if isinstance(a, torch.Tensor)):
            self.device_ops += 1  # the shared epoch's add_(1): enqueued, stays on the device
        elif touched:
            self.other.append(str(func))
        return func(*args, **kwargs)


def _capture(graph_key: tuple, tokens: int) -> AttentionCapture:
    """A one-layer GQA capture of bucket ``tokens`` on host tensors (shapes only matter)."""
    heads, kv_heads, head_size, block_size, blocks = 8, 1, 16, 128, 4
    t = torch.empty
    return AttentionCapture(
        graph_key=graph_key, layer_name="layer.0", query=t((tokens, heads, head_size)),
        key_cache=t((blocks, block_size, kv_heads * head_size)),
        value_cache=t((blocks, block_size, kv_heads * head_size)),
        block_table=t((tokens, 8), dtype=torch.int32),
        query_start_loc=t((tokens + 1,), dtype=torch.int32),
        seq_lens=t((tokens,), dtype=torch.int32), batch=t((1,), dtype=torch.int32),
        output=t((tokens, heads * head_size)), num_heads=heads, num_kv_heads=kv_heads,
        head_size=head_size, block_size=block_size, scale=head_size ** -0.5, causal=True)


def engine_step_work(placement: str, graph_keys: int) -> EngineStepCounts:
    """Count what one `NpuTilingEngine.before_replay` does with ``graph_keys`` captured keys.

    The engine captures one layer per key (buckets 1..graph_keys; the count, not the
    sizes, decides the work), then steps twice; the second ``before_replay`` (for bucket 1,
    as vLLM-Ascend's replay of one graph) is recorded.

    Raises:
        ValueError: ``graph_keys`` < 1 or an unknown placement.
        EngineStepError: the engine did work the bench cannot stand in for (names it), or
            could not run on host tensors.
    """
    if graph_keys < 1:
        raise ValueError(f"graph_keys must be at least 1, got {graph_keys}")
    ops = _RecordingOps()
    engine = NpuTilingEngine(placement, num_cores=8, ops=ops, launch=lambda fn: None)
    for tokens in range(1, graph_keys + 1):
        engine.capture_attention(_capture(("graph", tokens), tokens))
    storages: set[int] = set()
    for key in engine.keys.values():
        for value in (*key.__dict__.values(), *key.capture.__dict__.values(),
                      *(buf for _, buf in key.tilings.values())):
            if isinstance(value, torch.Tensor):
                storages.add(value.untyped_storage().data_ptr())
    if engine._device_epoch is not None:  # shared by every key (a key's `epoch` is it too)
        storages.add(engine._device_epoch.untyped_storage().data_ptr())
    try:
        engine.before_replay(1)  # a first step: anything done once is not per-step work
        ops.calls.clear()
        with _CopyRecorder(storages) as recorder:
            engine.before_replay(1)
    except Exception as exc:  # reported with what it means for the bench
        raise EngineStepError(f"NpuTilingEngine.before_replay did not run on host tensors "
                              f"({type(exc).__name__}: {exc}); pyruntime.hook.engine_step "
                              "must learn its new per-step work") from exc
    unknown = [c for c in ops.calls if c not in TILING_OPS] + recorder.other
    if unknown:
        raise EngineStepError(f"NpuTilingEngine.before_replay does {sorted(set(unknown))} per "
                              "step, which the bench has no stand-in for: teach "
                              "pyruntime.hook.engine_step and pyruntime.measurement.serving")
    return EngineStepCounts(placement=placement, graph_keys=graph_keys,
                            h2d_copies=len(recorder.copies),
                            blocking_copies=sum(recorder.copies),
                            tiling_launches=sum(c in TILING_OPS for c in ops.calls),
                            device_ops=recorder.device_ops)
