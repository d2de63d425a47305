"""Running the NPU twin in subprocesses.

`pyruntime.npu_twin.activate()` is once per process and cannot be undone (torch's PrivateUse1
backend is renamed once), so every twin test runs its twin code in a fresh ``python -c``
whose first lines activate the twin (`PREAMBLE`). Each call gets its own twin state
directory (``AICPU_TILING_TWIN_STATE``) unless it is handed one (the device-lost fault
persists there, so two processes sharing one directory share a lost device).

`OP_SCRIPT` starts the op tests' scripts. `run_vllm_tool` runs one of
``tools/vllm_ascend_*.py`` in a built vLLM environment (the twin active inside vLLM-Ascend's
own code) and returns the report it printed; `registered_schemas` is what a test compares the
twin's op schemas with.

A script may use the helpers of `CHECKS` (prepended after the preamble): ``check(rule, fn)``
records ``"ok"`` or the exception's type and text under ``rule``, ``expect(exc_type,
fragment, fn)`` requires exactly that exception type with ``fragment`` in its message,
``capture()`` opens a capture on a fresh side stream and always ends it; at exit the
script prints one line ``RESULT_TAG + json`` that `rules` parses.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyruntime.npu_twin import STATE_ENV
from tests.wheels import REPO, TORCH_NPU_WHEEL, read_wheel_file, vllm_env

PREAMBLE = """\
from pyruntime import npu_twin
npu_twin.activate({fault!r})
import torch
"""

RESULT_TAG = "TWIN-RULES "

#: the start that the op tests' scripts share (after the preamble and `CHECKS`): numpy,
#: torch_npu, `NotInTwinError`, a seeded generator ``gen``, ``dev`` and ``close(got, want,
#: tol)``, which requires the largest difference of a device tensor from a float64 numpy
#: reference to be at most `tol` times the reference's largest value (or 1)
OP_SCRIPT = '''
import numpy as np
import torch_npu
from pyruntime.npu_twin.npu_module import NotInTwinError

gen = torch.Generator().manual_seed(0)
dev = "npu"


def close(got, want, tol):
    got = got.detach().cpu().double().numpy()
    err = float(np.abs(got - want).max())
    if not err <= tol * max(1.0, float(np.abs(want).max())):
        raise AssertionError(f"max error {err} over {tol}")
'''

CHECKS = f'''
import atexit as _atexit
import contextlib as _contextlib
import json as _json

RESULTS = {{}}


def check(rule, fn):
    """Run fn; record "ok" or what it raised under `rule` (the rule must be new)."""
    if rule in RESULTS:
        raise KeyError(f"rule {{rule!r}} checked twice")
    try:
        fn()
    except Exception as exc:  # the pytest side reports it
        RESULTS[rule] = f"{{type(exc).__module__}}.{{type(exc).__qualname__}}: {{exc}}"
    else:
        RESULTS[rule] = "ok"


def expect(exc_type, fragment, fn):
    """fn() must raise exactly `exc_type` with `fragment` in its message; returns it."""
    try:
        fn()
    except Exception as exc:
        if type(exc) is not exc_type:
            raise AssertionError(f"expected {{exc_type.__qualname__}}, got "
                                 f"{{type(exc).__qualname__}}: {{exc}}") from exc
        if fragment not in str(exc):
            raise AssertionError(f"{{exc_type.__qualname__}} without {{fragment!r}}: {{exc}}")
        return exc
    raise AssertionError(f"expected {{exc_type.__qualname__}} ({{fragment!r}}); nothing raised")


def eq(got, want):
    if got != want:
        raise AssertionError(f"got {{got!r}}, want {{want!r}}")


@_contextlib.contextmanager
def capture(graph=None, stream=None):
    """Capture on `stream` (a fresh side stream by default); the capture is ended on the way
    out, also after an error, unless the body ended it (a refused capture_end ends it too)."""
    graph = graph if graph is not None else torch.npu.NPUGraph()
    stream = stream if stream is not None else torch.npu.Stream()
    with torch.npu.stream(stream):
        graph.capture_begin()
        try:
            yield graph, stream
        except BaseException:
            if graph.state.status == "capturing":
                try:
                    graph.capture_end()
                except Exception:
                    pass
            raise
        if graph.state.status == "capturing":
            graph.capture_end()


@_atexit.register
def _report():
    print({RESULT_TAG!r} + _json.dumps(RESULTS), flush=True)
'''


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


class TwinRunner:
    """`run_twin`: ``runner(script, fault=..., env=..., timeout=..., state_dir=...)``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._ids = itertools.count()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def state_dir(self) -> Path:
        """A fresh, empty twin state directory."""
        path = self.root / f"state-{next(self._ids)}"
        path.mkdir(parents=True)
        return path

    def __call__(self, script: str, *, fault: str | None = None,
                 env: dict[str, str | None] | None = None, timeout: float = 120,
                 state_dir: Path | None = None) -> subprocess.CompletedProcess:
        """Run `script` in ``python -c`` after the preamble and `CHECKS`.

        Args:
            script: Python source; torch is imported and the twin active.
            fault: the twin fault (`pyruntime.npu_twin.FAULTS`), or None.
            env: variables to set (a value of None removes the variable).
            timeout: seconds before the subprocess is killed (TimeoutExpired).
            state_dir: the twin state directory; a fresh one when None.
        """
        full = os.environ.copy()
        # tests/conftest.py turns on Triton's interpreter for the suite; on the twin our
        # kernels take the compiled (NPU) path, and the twin interprets them itself
        full.pop("TRITON_INTERPRET", None)
        full.pop("TASK_QUEUE_ENABLE", None)  # the caller's shell must not refuse captures
        full[STATE_ENV] = str(state_dir if state_dir is not None else self.state_dir())
        for key, value in (env or {}).items():
            if value is None:
                full.pop(key, None)
            else:
                full[key] = value
        source = PREAMBLE.format(fault=fault) + CHECKS + "\n" + script
        return subprocess.run([sys.executable, "-c", source], env=full, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def submit(self, fn, *args, **kwargs) -> concurrent.futures.Future:
        """Run ``fn(*args, **kwargs)`` on the runner's thread pool (subprocesses overlap)."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(2, min(4, os.cpu_count() or 2)))
        return self._pool.submit(fn, *args, **kwargs)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def rules(proc: subprocess.CompletedProcess) -> dict[str, str]:
        """The rule -> outcome dict a `CHECKS` script printed; a script that died before its
        last check adds ``"<script>"`` with its exit status and stderr."""
        found: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            if line.startswith(RESULT_TAG):
                found = json.loads(line[len(RESULT_TAG):])
        if proc.returncode != 0:
            found["<script>"] = f"exit status {proc.returncode}:\n{_tail(proc.stderr)}"
        return found


@pytest.fixture(scope="session")
def run_twin(tmp_path_factory):
    """The `TwinRunner` of this session (callable like `TwinRunner.__call__`)."""
    runner = TwinRunner(tmp_path_factory.mktemp("npu-twin"))
    yield runner
    runner.close()


#: what a vLLM-environment tool must not inherit from the test's shell: our own switches (the
#: tool runs vLLM-Ascend without our hook), the suite's PYTHONHOME and Triton interpreter
#: (the twin interprets our kernels itself), and a TASK_QUEUE_ENABLE that refuses captures
_NOT_FOR_VLLM_TOOLS = ("AICPU_TILING", "AICPU_TILING_ENGINE", "PYTHONHOME", "TRITON_INTERPRET",
                       "TASK_QUEUE_ENABLE")


@pytest.fixture
def run_vllm_tool(tmp_path):
    """``run(release, tool, timeout=300) -> dict``: runs ``tools/<tool>`` with the python of
    vLLM-Ascend `release`'s environment (`vllm_env`: a skip without it, a failure under CI),
    that release's source tree on the path and a fresh twin state directory, and returns its
    report (the last stdout line starting with ``{``, as JSON). The test fails, with the end
    of the tool's stderr, when the tool exits non-zero or prints no report, or when the
    report is not of `release` on the twin."""

    def run(release: str, tool: str, timeout: float = 300) -> dict:
        env = vllm_env(release)
        child = {k: v for k, v in os.environ.items() if k not in _NOT_FOR_VLLM_TOOLS}
        child["PYTHONPATH"] = os.pathsep.join([str(REPO), str(env / "vllm-ascend")])
        child[STATE_ENV] = str(tmp_path)
        proc = subprocess.run([str(env / "venv" / "bin" / "python"), str(REPO / "tools" / tool)],
                              capture_output=True, text=True, env=child, cwd=REPO,
                              timeout=timeout, check=False)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        assert proc.returncode == 0 and lines, proc.stderr[-3000:]
        report = json.loads(lines[-1])
        assert report["vllm_ascend"] == release and report["device"] == "npu-twin", report
        return report

    return run


@pytest.fixture(scope="module")
def registered_schemas() -> bytes:
    """The bytes of torch_npu 2.10.0.post4's ``libtorch_npu.so``: its registered op schemas
    stand in its read-only data, NUL-terminated."""
    return read_wheel_file(TORCH_NPU_WHEEL, "torch_npu/lib/libtorch_npu.so")
