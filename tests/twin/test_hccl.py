"""The HCCL stand-in on the NPU twin (issue 28 item 2): ``torch.distributed``'s ``hccl``
backend, ``torch_npu._C._distributed_c10d.ProcessGroupHCCL`` and its ``Options``, collectives
over gloo in stream order, captured in a graph and re-run by every replay on every rank.

The two-rank tests start two twin processes (ranks 0 and 1 on npu:0 and npu:1) that meet
through a ``file://`` store; the rules and their sources are in
`pyruntime.npu_twin.hccl`'s docstring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.twin.test_preflight import REPO

RANK_PRELUDE = '''
import datetime, json, sys
RANK, INIT = int(sys.argv[1]), sys.argv[2]
from pyruntime import npu_twin
npu_twin.activate()
import torch
import torch.distributed as dist
from pyruntime.npu_twin import device as twin, hccl
torch.npu.set_device(RANK)
dist.init_process_group("hccl", init_method=INIT, rank=RANK, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
PG = dist.group.WORLD
out = {}
'''


def run_ranks(body: str, tmp_path, *, mutation: str = "", timeout: float = 240) -> list[dict]:
    """Run RANK_PRELUDE, `mutation`, then `body` (which fills ``out``) as ranks 0 and 1 in two
    twin processes at once; returns each rank's ``out``."""
    script = "\n".join([RANK_PRELUDE, textwrap.dedent(mutation), textwrap.dedent(body),
                        'print("RANK-RESULT " + json.dumps(out), flush=True)'])
    init = f"file://{tmp_path / 'store'}"
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "PYTHONPATH": str(REPO),
               "AICPU_TILING_TWIN_STATE": str(tmp_path / f"twin{rank}")}
        for name in ("TRITON_INTERPRET", "TASK_QUEUE_ENABLE", "AICPU_TILING_TWIN_DEVICES"):
            env.pop(name, None)
        procs.append(subprocess.Popen([sys.executable, "-c", script, str(rank), init],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=tmp_path))
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    results = []
    for rank, (proc, (stdout, stderr)) in enumerate(zip(procs, outputs)):
        lines = [ln for ln in stdout.splitlines() if ln.startswith("RANK-RESULT ")]
        if proc.returncode != 0 or not lines:
            other = outputs[1 - rank][1][-2000:]
            raise AssertionError(f"rank {rank} crashed:\n{stdout}\n{stderr[-4000:]}\n"
                                 f"(the other rank's stderr ends:\n{other})")
        results.append(json.loads(lines[-1][len("RANK-RESULT "):]))
    return results


CAPTURED_ALL_REDUCE = '''
out["group"] = [dist.get_backend(), type(PG).__name__, PG.rank(), PG.size()]
x = torch.full((4,), float(RANK + 1), device="npu")
dist.all_reduce(x)
out["eager"] = x.cpu().tolist()
# vLLM's TP forward under FULL_DECODE_ONLY: a linear's partial sums all-reduced inside the
# captured decode graph; each replay reads new inputs written into the static buffer
static = torch.zeros(4, device="npu")
graph = torch.npu.NPUGraph()
with torch.npu.graph(graph, stream=torch.npu.Stream()):
    partial = static * 2
    dist.all_reduce(partial)
    result = partial + 1
before = PG.collectives_run
out["replays"] = []
for step in range(4):
    static.copy_(torch.arange(4.0) * (RANK + 1) + step)
    graph.replay()
    out["replays"].append(result.cpu().tolist())
out["replayed_collectives"] = PG.collectives_run - before
out["device"] = [str(result.device), PG.device_index]
'''


@pytest.fixture(scope="module")
def collectives(tmp_path_factory) -> list[dict]:
    """Both two-rank collective scripts, run once for the module."""
    return run_ranks(CAPTURED_ALL_REDUCE + COLLECTIVES, tmp_path_factory.mktemp("hccl"))


def test_an_all_reduce_captured_in_a_graph_is_rerun_by_every_replay_on_both_ranks(collectives):
    for rank, got in enumerate(collectives):
        assert got["group"] == ["hccl", "ProcessGroupHCCL", rank, 2], got
        assert got["eager"] == [3.0] * 4
        # rank r's input at step s is arange(4) * (r + 1) + s; the graph doubles it,
        # all-reduces over both ranks and adds one
        want = [[2 * (i * 1 + s + i * 2 + s) + 1 for i in range(4)] for s in range(4)]
        assert got["replays"] == want, (rank, got["replays"])
        assert got["replayed_collectives"] == 4
        assert got["device"] == [f"npu:{rank}", rank]


COLLECTIVES = '''
def host(t):
    return t.cpu().tolist()
size = 2
# vLLM's DeviceCommunicatorBase.all_gather / reduce_scatter / broadcast (vLLM 0.30.0)
inp = (torch.arange(3.0) + 10 * RANK).to(f"npu:{RANK}")
gathered = torch.empty(size * 3, device="npu")
dist.all_gather_into_tensor(gathered, inp)
parts = [torch.empty(3, device="npu") for _ in range(size)]
dist.all_gather(parts, inp)
full = (torch.arange(4.0) * (RANK + 1)).to(f"npu:{RANK}")
chunk = torch.empty(2, device="npu")
dist.reduce_scatter_tensor(chunk, full)
b = torch.full((2,), float(RANK + 5), device="npu")
dist.broadcast(b, src=1)
m = torch.tensor([RANK, -RANK], dtype=torch.int32).to(f"npu:{RANK}")
dist.all_reduce(m, op=dist.ReduceOp.MAX)
h = torch.full((2,), 1.5 * (RANK + 1), dtype=torch.bfloat16, device="npu")
dist.all_reduce(h, op=dist.ReduceOp.AVG)
out["collectives_eager"] = [host(gathered), [host(p) for p in parts], host(chunk), host(b), host(m),
                host(h), str(h.dtype)]
# the same collectives captured together, replayed with new inputs
src = torch.zeros(2, device="npu")
graph = torch.npu.NPUGraph()
with torch.npu.graph(graph, stream=torch.npu.Stream()):
    g_out = torch.empty(4, device="npu")
    dist.all_gather_into_tensor(g_out, src + 0)
    rs_out = torch.empty(1, device="npu")
    dist.reduce_scatter_tensor(rs_out, src * 1)
    bc = src * 1
    dist.broadcast(bc, src=0)
out["collectives_replays"] = []
for step in range(3):
    src.copy_(torch.tensor([RANK + step, 10.0 * RANK]))
    graph.replay()
    out["collectives_replays"].append([host(g_out), host(rs_out), host(bc)])
'''


def test_all_gather_reduce_scatter_and_broadcast_eager_and_replayed(collectives):
    for rank, got in enumerate(collectives):
        gathered, parts, chunk, b, m, h, h_dtype = got["collectives_eager"]
        assert gathered == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
        assert parts == [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]]
        assert chunk == [[0.0, 3.0], [6.0, 9.0]][rank]  # arange(4) * (1 + 2), split by rank
        assert b == [6.0, 6.0] and m == [1, 0]
        assert h == [2.25, 2.25] and h_dtype == "torch.bfloat16"  # (1.5 + 3.0) / 2
        for step, (g_out, rs_out, bc) in enumerate(got["collectives_replays"]):
            assert g_out == [0.0 + step, 0.0, 1.0 + step, 10.0], (rank, step, g_out)
            assert rs_out == [[1.0 + 2 * step], [10.0]][rank], (rank, step, rs_out)
            assert bc == [float(step), 0.0], (rank, step, bc)


WRONG_DEVICE = '''
x = torch.ones(2, device="npu")
dist.all_reduce(x)   # the communicator is made on this rank's device
torch.npu.synchronize()
other = 1 - RANK
# rank 1 (npu:1) hands a tensor of npu:0, rank 0 a tensor of npu:1
y = torch.full((2,), float(RANK + 1), device=f"npu:{other}")
ran = PG.collectives_run
try:
    dist.all_reduce(y)
    torch.npu.synchronize(other)
    out["wrong_device"] = ["accepted", y.cpu().tolist()]
except Exception as exc:
    out["wrong_device"] = [type(exc).__name__, str(exc)]
torch.npu.synchronize(other)
out["ran_after_refusal"] = PG.collectives_run - ran
try:
    dist.all_reduce(torch.ones(2))
except RuntimeError as exc:
    out["host_tensor"] = str(exc)
try:
    dist.all_reduce(torch.ones(2, 2, device="npu").t())
except RuntimeError as exc:
    out["strided"] = str(exc)
try:
    dist.all_reduce(torch.ones(2, dtype=torch.int32, device="npu"), op=dist.ReduceOp.BAND)
except RuntimeError as exc:
    out["band"] = str(exc)
if RANK == 1:
    # torch_npu's Event takes the device of its first recording stream: a device-1 event
    # recorded on a device-0 stream (tests/twin/test_devices.py checks the other direction)
    event = torch.npu.Event()
    event.record(torch.npu.current_stream())
    try:
        event.record(torch.npu.Stream(device=0))
        out["event"] = "accepted"
    except RuntimeError as exc:
        out["event"] = str(exc)
'''


def test_a_tensor_of_another_device_is_refused_on_each_rank(tmp_path):
    ranks = run_ranks(WRONG_DEVICE, tmp_path)
    for rank, got in enumerate(ranks):
        kind, message = got["wrong_device"]
        assert kind == "CommunicatorDeviceError", got
        assert f"the tensor is on npu:{1 - rank}" in message
        assert f"communicator was created on npu:{rank}" in message
        assert got["ran_after_refusal"] == 0  # nothing was queued
        assert got["host_tensor"] == "Tensors must be NPU and dense"
        assert got["strided"] == "Tensors must be contiguous"
        assert got["band"] == "Cannot use ReduceOp.BAND with HCCL"
    assert ranks[1]["event"] == "Event device 1 does not match recording stream's device 0."


def test_without_the_device_binding_the_other_device_is_silently_reduced(tmp_path):
    """What the refusal prevents: with the binding off, both ranks' wrong-device tensors are
    all-reduced over their host memory and nothing is said."""
    ranks = run_ranks(WRONG_DEVICE, tmp_path, mutation="hccl.BINDS_DEVICE = False")
    assert [got["wrong_device"] for got in ranks] == [["accepted", [3.0, 3.0]]] * 2


SINGLE_PROCESS = '''
import datetime, json, tempfile
from pyruntime import npu_twin
npu_twin.activate()
import torch, torch.distributed as dist
import torch_npu
from torch_npu._C._distributed_c10d import ProcessGroupHCCL
out = {}
from torch.distributed import is_hccl_available  # vLLM-Ascend 0.23's netloader imports it so
out["is_hccl_available"] = is_hccl_available()
opts = ProcessGroupHCCL.Options()
out["defaults"] = [opts.backend, opts.is_high_priority_stream, opts.global_ranks_in_group,
                   opts.hccl_config, opts.group_id]
opts.hccl_config = {"hccl_buffer_size": 200}
for name, bad in (("is_high_priority_stream", 1), ("global_ranks_in_group", [-1]),
                  ("hccl_config", {"k": 1.5}), ("group_id", 3)):
    try:
        setattr(opts, name, bad)
        out[name] = "accepted"
    except TypeError as exc:
        out[name] = str(exc)
store = tempfile.mktemp()
dist.init_process_group("hccl", init_method="file://" + store, rank=0, world_size=1,
                        pg_options=opts, timeout=datetime.timedelta(seconds=30))
pg = dist.group.WORLD
out["pg"] = [isinstance(pg, ProcessGroupHCCL), pg.options is opts,
             pg.options.hccl_config, pg.options.group_id,
             pg._get_backend(torch.device("npu")) is pg]
try:
    pg.send([torch.ones(1, device="npu")], 0, 0)
except NotImplementedError as exc:
    out["send"] = type(exc).__name__
# vLLM-Ascend's GroupCoordinator makes its device groups with new_group and destroys each at
# shutdown (patch/worker/patch_distributed.py _release_hccl_resources)
sub = dist.new_group([0], backend="hccl", pg_options=ProcessGroupHCCL.Options())
out["sub_name"] = [sub.group_name == dist.distributed_c10d._world.pg_names[sub],
                   sub.group_desc]
dist.destroy_process_group(sub)
out["destroyed"] = sub not in dist.distributed_c10d._world.pg_map
dist.destroy_process_group()
print("RESULT " + json.dumps(out))
'''


def test_the_backend_and_its_options_are_torch_npus(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "AICPU_TILING_TWIN_STATE": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", SINGLE_PROCESS], capture_output=True,
                          text=True, timeout=180, env=env, cwd=tmp_path, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got["defaults"] == ["hccl", False, [], {}, ""]
    assert got["is_hccl_available"] is True  # torch_npu's patch of torch.distributed
    for name in ("is_high_priority_stream", "global_ranks_in_group", "hccl_config", "group_id"):
        assert got[name].startswith(f"ProcessGroupHCCL.Options.{name}: incompatible"), got
    # torch_npu's creator keeps the given Options and fills the group's id from torch
    assert got["pg"][:3] == [True, True, {"hccl_buffer_size": 200}]
    assert got["pg"][3] != "" and got["pg"][4] is True
    assert got["send"] == "NotInTwinError"
    # a group has the name torch gave it and can be destroyed (as at a vLLM worker's shutdown)
    assert got["sub_name"] == [True, "undefined"] and got["destroyed"] is True


def test_the_twins_creator_sets_what_the_wheels_creator_sets():
    """torch_npu 2.10.0.post4's registry (read from the wheel) registers "hccl" for npu with
    the extended API; its creator sets these ``pg_options`` fields, and so does the twin's."""
    import inspect
    import re

    from pyruntime.npu_twin import hccl
    from tests.wheels import TORCH_NPU_WHEEL, read_wheel_file

    source = read_wheel_file(TORCH_NPU_WHEEL,
                             "torch_npu/_init/registry/distributed.py").decode()
    helper = source[source.index("def _new_process_group_hccl_helper"):
                    source.index("def _new_process_group_lccl_helper")]
    wheel_sets = set(re.findall(r"pg_options\.(\w+) = ", helper))
    assert wheel_sets == {"is_high_priority_stream", "_timeout", "global_ranks_in_group",
                          "group_id"}
    assert set(re.findall(r"pg_options\.(\w+) = ",
                          inspect.getsource(hccl._new_process_group_hccl))) == wheel_sets
    for fragment in ('"hccl"', 'devices=["npu"]', "extended_api=True"):
        assert fragment in source and fragment in inspect.getsource(hccl.install), fragment
