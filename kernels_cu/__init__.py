"""CUDA C templates for the CUDA backend (data only; see README.md).

A regular package so that `importlib.resources.files("vkml.kernels_cu")` finds the templates both in
an installed wheel and in an editable install, where this folder is mapped outside kit/vkml.
"""
