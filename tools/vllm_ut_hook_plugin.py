"""pytest plugin: apply aicpu-tiling's vLLM-Ascend hook before vLLM-Ascend's modules import.

tools/run_vllm_ascend_ut.py --with-hook loads it with ``-p vllm_ut_hook_plugin``, which pytest
imports at start-up, before any conftest.py (vLLM-Ascend's tests/ut/conftest.py imports vLLM
and parts of vllm_ascend). Importing this module calls :func:`pyruntime.hook.install`, which
registers post-import hooks; the patch set is settled when the first target module imports.

There is no NPU in a unit-test run, so unless ``AICPU_TILING_ENGINE`` is already set this
module names its own factory there (:func:`make_engine`): a recording engine that takes the
captures the patched layers hand over and does nothing else. At the end of the session the
hook's :func:`pyruntime.hook.status` and what the engine saw go, as JSON, to the file named
by ``AICPU_TILING_UT_HOOK_REPORT`` (when set). Standard library and pyruntime only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

#: this module's engine factory, in the form ``AICPU_TILING_ENGINE`` takes
ENGINE_SPEC = f"{__name__}:make_engine"
REPORT_ENV = "AICPU_TILING_UT_HOOK_REPORT"


class RecordingEngine:
    """A stand-in device-tiling engine: records each capture and each replay notice."""

    name = "ut-recorder"

    def __init__(self) -> None:
        self.captures: list[dict] = []
        self.replays: list[int | None] = []

    def capture_attention(self, capture) -> None:
        def shape(t):
            return list(getattr(t, "shape", ())) or None

        self.captures.append(
            {
                "graph_key": repr(capture.graph_key)[:120],
                "layer_name": capture.layer_name,
                "query": shape(capture.query),
                "num_heads": capture.num_heads,
                "num_kv_heads": capture.num_kv_heads,
                "head_size": capture.head_size,
                "block_size": capture.block_size,
            }
        )

    def before_replay(self, num_tokens: int | None = None) -> None:
        self.replays.append(num_tokens)


_engine: RecordingEngine | None = None


def make_engine() -> RecordingEngine:
    """The factory ``AICPU_TILING_ENGINE`` names: one recording engine per process."""
    global _engine
    if _engine is None:
        _engine = RecordingEngine()
    return _engine


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


_log = _Lines()
logging.getLogger("pyruntime.hook").addHandler(_log)
logging.getLogger("pyruntime.hook").setLevel(logging.DEBUG)

os.environ.setdefault("AICPU_TILING_ENGINE", ENGINE_SPEC)
_install_error: str | None = None
try:
    import pyruntime.hook as _hook

    _hook.install()
except Exception as exc:  # noqa: BLE001 - reported in the JSON, the tests still run
    _hook = None
    _install_error = f"{type(exc).__name__}: {exc}"
_installed_at = time.time()


def hook_report() -> dict:
    """The hook's status and what the engine recorded, as plain JSON-able data."""
    if _hook is None:
        return {"installed": False, "state": "error", "reason": _install_error, "log": _log.lines}
    report = dataclasses.asdict(_hook.status())
    report["engine_env"] = os.environ.get("AICPU_TILING_ENGINE")
    report["log"] = _log.lines
    report["pyruntime"] = os.path.dirname(_hook.__file__)
    engine = _engine
    report["engine_calls"] = {
        "captures": len(engine.captures) if engine else 0,
        "before_replay": len(engine.replays) if engine else 0,
        "first_captures": engine.captures[:5] if engine else [],
    }
    return report


def pytest_report_header(config):
    status = hook_report()
    return f"aicpu-tiling hook: {status.get('state')} {status.get('reason') or ''}".rstrip()


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "w") as f:
            json.dump(hook_report(), f, indent=1, default=repr)
