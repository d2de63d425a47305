"""Imported by the twin's ``.pth`` line (:mod:`pyruntime.npu_twin.pth`) when ``AICPU_TILING_TWIN``
is on: activates the NPU twin at interpreter start.

Never raises: a broken install or a twin that cannot start here prints one
``aicpu-tiling: ...`` line on stderr and leaves the interpreter as it would be without us.

``site`` runs a folder's ``.pth`` files right after it puts that folder on ``sys.path`` and
before it adds the folders that come after it. In a venv made with
``--system-site-packages`` (``.ci/run``'s) the venv's ``.pth`` files therefore run while the
user site and the base interpreter's site-packages, where torch may live, are not on the path
yet. For the twin's own imports this module appends those folders in ``site``'s order (only
folders, their ``.pth`` files are not run) and takes them off again afterwards, so ``site``
then adds them, and runs their ``.pth`` files, exactly as it would have.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _venv_includes_system_site() -> bool:
    """``include-system-site-packages`` of this venv's ``pyvenv.cfg``, read as ``site.venv`` does
    (a missing key means true)."""
    exe_dir = Path(os.path.abspath(sys.executable)).parent
    for conf in (exe_dir / "pyvenv.cfg", Path(sys.prefix) / "pyvenv.cfg"):
        if conf.is_file():
            for line in conf.read_text(encoding="utf-8").splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "include-system-site-packages":
                    return value.strip().lower() == "true"
            return True
    return True


def pending_site_dirs() -> list[str]:
    """The site folders ``site.main()`` still adds after the one whose ``.pth`` runs now, in
    its order (user site, then the base interpreter's site-packages), that exist and are not
    on ``sys.path`` yet. Empty when ``site`` is done (e.g. a later ``site.addsitedir``)."""
    import site

    if sys.flags.no_site:
        return []
    in_venv = sys.prefix != sys.base_prefix
    if in_venv and not _venv_includes_system_site():
        return []
    candidates: list[str] = []
    user_site = site.ENABLE_USER_SITE
    if user_site is None:
        user_site = site.check_enableusersite()
    if user_site:
        candidates.append(site.getusersitepackages())
    candidates += site.getsitepackages([sys.base_prefix, sys.base_exec_prefix] if in_venv
                                       else None)
    seen = set(sys.path)
    pending = []
    for folder in candidates:
        if folder not in seen and os.path.isdir(folder):
            pending.append(folder)
            seen.add(folder)
    return pending


def _autostart() -> None:
    try:
        from .pth import ENV_VAR, env_value

        if env_value(os.environ.get(ENV_VAR)) is not True:  # the .pth line decided already
            return
        added = pending_site_dirs()
        sys.path.extend(added)
        try:
            from . import activate

            activate()
        finally:
            for folder in reversed(added):  # ours are the last occurrences
                if folder in sys.path:
                    del sys.path[len(sys.path) - 1 - sys.path[::-1].index(folder)]
    except Exception as exc:  # noqa: BLE001 - interpreter start must never fail because of us
        print(f"aicpu-tiling: NPU twin not activated: {type(exc).__name__}: {exc}",
              file=sys.stderr)


_autostart()
