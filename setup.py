"""Build glue only: metadata lives in pyproject.toml, build logic in bindings/build_config.py
and pyruntime/hook/pth.py (both pure, both tested)."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class build_py_with_pth(build_py):
    """Also write the import hook's one-line .pth file into the wheel root (site-packages).

    It activates pyruntime.hook at interpreter start only when AICPU_TILING=1. An editable
    install never carries it (nothing is copied into site-packages); inside vLLM the
    vllm.general_plugins entry point in pyproject.toml activates the hook either way.
    """

    def run(self):
        super().run()
        pth = _load(HERE / "pyruntime" / "hook" / "pth.py")
        target = Path(self.build_lib) / pth.PTH_FILENAME
        target.write_text(pth.pth_content())

    def get_outputs(self, include_bytecode=True):
        pth = _load(HERE / "pyruntime" / "hook" / "pth.py")
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / pth.PTH_FILENAME)]


setup(
    cffi_modules=["bindings/ffi_build.py:ffibuilder"],
    cmdclass={"build_py": build_py_with_pth},
)
