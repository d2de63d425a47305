"""The NPU twin in every Python process that asks for it: a ``.pth`` line and ``AICPU_TILING_TWIN``.

On an NPU machine torch_npu is installed, so every process vLLM starts (the model-inspection
subprocess ``python -m vllm.model_executor.models.registry``, the engine core and every
worker, by spawn, fork or forkserver) has ``torch.npu``. The twin is activated by a call
(:func:`pyruntime.npu_twin.activate`), which reaches only the process that makes it. This
module is the start-up path that makes it reach the others:

* :data:`PTH_FILENAME` is a one-line start-up file that Python's ``site`` module executes at
  every interpreter start. :func:`install` writes it into a site-packages folder; nothing
  writes it by itself: an editable install (``pip install -e .``) writes no ``.pth`` of ours
  and a regular install writes only the hook's. So it is one explicit, idempotent step::

      python -m pyruntime.npu_twin.pth install          # into this interpreter's site-packages
      python -m pyruntime.npu_twin.pth install --user   # or its user site (PYTHONUSERBASE)

  ``tools/vllm_env.sh`` runs that step for its own venv on every call (cached env or not).
* The line reads only ``os.environ`` (:data:`ENV_VAR`): ``1``, ``true``, ``yes``, ``on`` (any
  case) import :mod:`pyruntime.npu_twin.autostart`, which activates the twin; unset, empty,
  ``0``, ``false``, ``no``, ``off`` import nothing of ours; any other value imports nothing
  either and prints one stderr line naming the accepted values (once per process). With an
  "on" value and no ``pyruntime`` importable (the checkout is not on ``PYTHONPATH`` and not
  installed) it prints one line and goes on: interpreter start never fails because of us.
* Children inherit the variable, so every spawn, forkserver and ``subprocess`` child that is
  a Python of the same environment activates the twin too; a fork child inherits the
  activated twin itself (see :mod:`pyruntime.npu_twin.processes` for what a fork keeps).
* Order: ``site`` runs a folder's ``.pth`` files in sorted name order. :data:`PTH_FILENAME`
  sorts after setuptools' ``__editable__.*.pth`` (which makes an editable ``pyruntime``
  importable) and before the hook's ``aicpu_tiling_hook.pth`` (:mod:`pyruntime.hook.pth`), so
  with ``AICPU_TILING=1`` too the twin is active before the hook's autostart runs. The hook's
  vLLM plugin (:mod:`pyruntime.hook.vllm_plugin`) runs later still, in ``load_general_plugins``.

Nothing here imports torch or anything else of ours: ``setup.py``-style loaders and shell
scripts can load this file alone.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

ENV_VAR = "AICPU_TILING_TWIN"
#: sorts after ``__editable__.*.pth`` and before the hook's ``aicpu_tiling_hook.pth``
PTH_FILENAME = "aicpu_tiling_0_npu_twin.pth"
_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")
#: a private attribute of ``sys``: the unknown-value line was printed in this process
_WARNED = "_aicpu_tiling_twin_warned"
AUTOSTART_MODULE = "pyruntime.npu_twin.autostart"

#: printf-style, one ``%r`` for the value: the .pth line formats it without importing us
_WARNING = (
    f"aicpu-tiling: {ENV_VAR}=%r is not understood, so the NPU twin stays off; "
    f"accepted values: {'/'.join(_ON)} (on), {'/'.join(v for v in _OFF if v)} or unset (off)"
)
_NOT_IMPORTABLE = (
    f"aicpu-tiling: {ENV_VAR} is on but no pyruntime is importable in this interpreter "
    "(put the aicpu-tiling checkout on PYTHONPATH or pip install -e it), so the NPU twin "
    "stays off"
)


def unknown_value_warning(value: str) -> str:
    """The one stderr line for an ``AICPU_TILING_TWIN`` value that is neither on nor off."""
    return _WARNING % (value,)


def not_importable_warning() -> str:
    """The one stderr line when the variable is on but ``pyruntime`` cannot be imported."""
    return _NOT_IMPORTABLE


def env_value(value: str | None) -> bool | None:
    """``True`` for an "on" value, ``False`` for an "off" one (or unset), ``None`` otherwise."""
    text = (value or "").strip().lower()
    if text in _ON:
        return True
    if text in _OFF:
        return False
    return None


def pth_content() -> str:
    """The exact text of :data:`PTH_FILENAME`: one ``import`` line and a newline.

    ``site`` executes only lines that start with ``import``, so the decision is one
    expression: for an "on" value, import :data:`AUTOSTART_MODULE` when ``pyruntime`` can
    be found (else print :func:`not_importable_warning`); for an "off" value nothing; for
    anything else print :func:`unknown_value_warning`. Either line is printed once per
    process (``site`` runs a ``--system-site-packages`` venv's ``.pth`` files twice, see
    :mod:`pyruntime.hook.pth`).
    """
    warn_once = (f"getattr(sys, {_WARNED!r}, False) or setattr(sys, {_WARNED!r}, True) or "
                 "print({message}, file=sys.stderr)")
    return (
        "import os, sys; (lambda raw, value: "
        f"(__import__({AUTOSTART_MODULE!r}) if __import__('importlib.util').util"
        ".find_spec('pyruntime') is not None else "
        + warn_once.format(message=repr(_NOT_IMPORTABLE))
        + f") if value in {_ON!r} else value in {_OFF!r} or "
        + warn_once.format(message=f"{_WARNING!r} % (raw,)")
        + f")(os.environ.get({ENV_VAR!r}, ''), os.environ.get({ENV_VAR!r}, '').strip().lower())\n"
    )


def site_packages() -> Path:
    """This interpreter's site-packages (``purelib``): where a venv's ``pip install`` writes."""
    return Path(sysconfig.get_paths()["purelib"])


def installed(site_dir: Path | None = None) -> bool:
    """True when `site_dir` (default :func:`site_packages`) holds the current ``.pth`` text."""
    path = Path(site_dir or site_packages()) / PTH_FILENAME
    try:
        return path.read_text() == pth_content()
    except OSError:
        return False


def install(site_dir: Path | None = None) -> tuple[Path, bool]:
    """Write :data:`PTH_FILENAME` into `site_dir` (default :func:`site_packages`).

    Idempotent: an up-to-date file is left alone; an outdated one is replaced atomically.

    Returns:
        (the file's path, whether it was written now).

    Raises:
        FileNotFoundError: `site_dir` does not exist.
    """
    folder = Path(site_dir or site_packages())
    if not folder.is_dir():
        raise FileNotFoundError(f"no site-packages folder at {folder}")
    path = folder / PTH_FILENAME
    if installed(folder):
        return path, False
    tmp = folder / f".{PTH_FILENAME}.{os.getpid()}.tmp"
    tmp.write_text(pth_content())
    os.replace(tmp, path)
    return path, True


def user_site_packages() -> Path:
    """This interpreter's user site folder (``PYTHONUSERBASE``, ``pip install --user``)."""
    import site

    return Path(site.getusersitepackages())


USAGE = "usage: python -m pyruntime.npu_twin.pth install|check [--user | SITE_DIR]"


def main(argv: list[str] | None = None) -> int:
    """``python -m pyruntime.npu_twin.pth install|check [--user | SITE_DIR]``.

    ``install`` writes the file (default: this interpreter's site-packages; ``--user``: its
    user site folder, created if missing, for an interpreter whose site-packages is not
    writable); ``check`` exits 0 when the current text is there, 1 otherwise.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("install", "check") or len(args) > 2:
        print(USAGE, file=sys.stderr)
        return 2
    command, where = args[0], (args[1] if len(args) == 2 else None)
    if where == "--user":
        site_dir = user_site_packages()
        if command == "install":
            site_dir.mkdir(parents=True, exist_ok=True)
    else:
        site_dir = Path(where) if where else site_packages()
    if command == "check":
        ok = installed(site_dir)
        print(f"{site_dir / PTH_FILENAME}: {'installed' if ok else 'missing or outdated'}")
        return 0 if ok else 1
    try:
        path, written = install(site_dir)
    except OSError as exc:
        print(f"aicpu-tiling: cannot install {PTH_FILENAME}: {exc}", file=sys.stderr)
        return 1
    print(f"{path}: {'written' if written else 'up to date'} (inert unless {ENV_VAR}=1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
