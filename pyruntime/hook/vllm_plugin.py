"""vLLM general plugin: installs the hook in every vLLM process when ``AICPU_TILING`` is on.

pyproject.toml registers :func:`register` under the entry-point group
``vllm.general_plugins`` (name ``aicpu_tiling``). vLLM's ``load_general_plugins`` calls every
function of that group in each process it starts (API server, engine core, every worker)
before the model is built, and it reads entry points from the distribution metadata, which
an editable install writes too. So this path works with ``pip install -e .``, where the
``.pth`` start-up file (:mod:`.pth`, written only by a regular install) is missing. Where
both exist they meet in :func:`pyruntime.hook.install`, which is idempotent. ``VLLM_PLUGINS``,
when a user sets it, is vLLM's allowlist: it must then name ``aicpu_tiling``.

Same values and the same guarantee as the ``.pth`` path: ``AICPU_TILING`` ``1/true/yes/on``
installs, ``0/false/no/off``/unset does nothing (not even import the hook's modules), any
other value does nothing and prints one line naming the accepted values (once per process,
shared with the ``.pth`` line). Never raises: vLLM calls plugins outside any ``try``, so an
exception here would stop ``vllm serve``.
"""

from __future__ import annotations

import os
import sys

#: the entry-point group vLLM loads in every process, and our name in it
GROUP = "vllm.general_plugins"
NAME = "aicpu_tiling"


def register() -> None:
    """Install the vLLM-Ascend hook if ``AICPU_TILING`` is on; a no-op otherwise. Never raises.

    Failures (a broken install, an unknown value) print one ``aicpu-tiling: ...`` line on
    stderr and leave vLLM exactly as it would be without us.
    """
    try:
        from . import pth

        raw = os.environ.get(pth.ENV_VAR, "")
        value = raw.strip().lower()
        if value in pth._OFF:
            return
        if value not in pth._ON:
            # the .pth line (regular installs) may already have said it in this process
            if not getattr(sys, pth._WARNED, False):
                setattr(sys, pth._WARNED, True)
                print(pth.unknown_value_warning(raw), file=sys.stderr)
            return
        from .activation import install

        install()
    except Exception as exc:  # noqa: BLE001 - a plugin must never break vLLM's start-up
        print(f"aicpu-tiling: hook not installed: {type(exc).__name__}: {exc}", file=sys.stderr)
