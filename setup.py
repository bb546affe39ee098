"""Packaging shim: everything is declared in pyproject.toml except one thing it cannot say.

pyproject's `packages` is either an explicit list or a `find` directive, never both. We want `find`
under kit/ (so new subpackages ship without edits) *and* the CUDA C templates in kernels_cu/, which
live outside kit/, shipped as the package `vkml.kernels_cu` (its directory is mapped in pyproject's
`package-dir`). The Jupyter layer, extensions/vkml_jupyter, ships beside it as the top-level package
`vkml_jupyter` (also mapped in `package-dir`). So the package list is computed here.
"""
from setuptools import find_packages, setup

setup(packages=find_packages("kit", include=["vkml", "vkml.*"]) + ["vkml.kernels_cu"]
      + find_packages("extensions", include=["vkml_jupyter", "vkml_jupyter.*"]))
