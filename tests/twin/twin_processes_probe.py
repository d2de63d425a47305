"""What a process knows about the NPU twin, for tests/twin/test_processes*.py.

Children import this module by name (``tests`` is on ``PYTHONPATH`` there): multiprocessing's
spawn children and vLLM's model-inspection subprocess unpickle functions by reference. It
never activates the twin itself: a child that reports it active got it at interpreter start.
"""

from __future__ import annotations

import os
import sys


def twin_facts(*, use_device: bool = False) -> dict:
    """This process's pid, whether the twin is active and ``torch.npu`` is the twin's module;
    with `use_device`, one device round trip (allocate, add, copy back) or what it raised."""
    twin = sys.modules.get("pyruntime.npu_twin")
    facts: dict = {"pid": os.getpid(), "active": bool(twin is not None and twin.is_active())}
    if not facts["active"]:
        return facts
    import torch

    facts["torch_npu_is_twin"] = torch.npu is sys.modules["pyruntime.npu_twin.npu_module"]
    facts["torch_npu_module"] = torch.npu.__name__
    if use_device:
        try:
            ones = torch.ones(3, device="npu")
            facts["device_sum"] = float((ones + ones).sum().cpu())
        except Exception as exc:  # noqa: BLE001 - the test reads what it was
            facts["device_error"] = f"{type(exc).__name__}: {exc}"
    return facts


def facts_using_the_device() -> dict:
    """`twin_facts` with a device round trip (a picklable target for child processes)."""
    return twin_facts(use_device=True)


def _report_into(queue) -> None:
    queue.put(facts_using_the_device())


def facts_from_a_child(context) -> dict:
    """`facts_using_the_device` of a child started by the multiprocessing `context` (whose
    ``Process`` vLLM uses for its engine core and workers)."""
    queue = context.SimpleQueue()
    child = context.Process(target=_report_into, args=(queue,))
    child.start()
    child.join(300)
    if child.exitcode is None:  # still running (a hang): it must not hold up our exit
        child.kill()
        child.join()
        return {"hung": True}
    if child.exitcode != 0:
        return {"exitcode": child.exitcode}
    return queue.get()
