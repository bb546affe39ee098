"""The tutorials as tests: nbval runs each notebook and compares its outputs (see pyproject's addopts).

Two things make a run here reproduce the stored outputs wherever pytest is started:

- the sanitize file named in addopts is found from the repository root, also when pytest runs from
  another directory;
- the kernels nbval starts see the environment the outputs were made in: the NumPy backend, lazy
  mode, and matplotlib's inline backend (an ``MPLBACKEND=Agg`` in CI would hide every figure).
"""

import os
from pathlib import Path

import pytest

#: Environment of the notebook kernels: None removes the variable.
KERNEL_ENV = {"VKML_BACKEND": "numpy", "VKML_EAGER": None, "VKML_THREADS": None, "MPLBACKEND": None,
              "VKML_PROGRESS": "0"}   # progress bars are live widgets: not part of stored outputs


def pytest_configure(config):
    sanitize = getattr(config.option, "nbval_sanitize_with", None)
    if sanitize and not os.path.isabs(sanitize) and not os.path.exists(sanitize):
        rooted = Path(config.rootpath, sanitize)
        if rooted.exists():
            config.option.nbval_sanitize_with = str(rooted)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """A notebook's kernel starts in its first cell's setup: give it KERNEL_ENV there."""
    if Path(str(item.fspath)).suffix != ".ipynb":
        yield
        return
    saved = {k: os.environ.get(k) for k in KERNEL_ENV}
    for k, v in KERNEL_ENV.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
