"""Build glue only: metadata lives in pyproject.toml, build logic in bindings/build_config.py."""

from setuptools import setup

setup(cffi_modules=["bindings/ffi_build.py:ffibuilder"])
