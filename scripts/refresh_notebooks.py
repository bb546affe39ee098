"""Run the tutorials and store their outputs so that they read well without a kernel.

    .venv/bin/python scripts/refresh_notebooks.py [notebooks/05-gradient-explorer.ipynb ...]

Each notebook (all of notebooks/ by default) is executed top to bottom in a fresh kernel of this
environment on the NumPy backend, as nbval runs it, then written back with two changes that make a
freshly opened, exported or documented tutorial show its pictures:

- a widget's output keeps only its static picture (every explorer puts one beside its live view,
  ``vkml_jupyter.static``): a stored reference to a widget model that no kernel holds shows
  "Error displaying widget" in JupyterLab and blank space in nbconvert's HTML and the docs;
- the notebook's saved widget state is dropped (it is what those references would need, and it
  changes on every run).

Run it after changing a tutorial or anything it prints, then read the diff (``pytest notebooks``
checks the outputs against the library).  tests/test_front_door.py checks that the stored
tutorials keep to the two rules above.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
#: the environment of the kernels: the tutorials' own (see notebooks/conftest.py)
KERNEL_ENV = {"VKML_BACKEND": "numpy", "VKML_PROGRESS": "0"}
DROPPED_ENV = ("VKML_EAGER", "VKML_THREADS", "MPLBACKEND")


def readable_without_a_kernel(nb) -> None:
    """Strip widget references and widget state (see the module docstring), in place."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data")
            if data and WIDGET_VIEW in data:
                del data[WIDGET_VIEW]


def refresh(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    readable_without_a_kernel(nb)
    nbformat.write(nb, path)
    print(f"refreshed {path.relative_to(ROOT)}")


def main(argv):
    os.environ.update(KERNEL_ENV)
    for name in DROPPED_ENV:
        os.environ.pop(name, None)
    paths = [Path(a).resolve() for a in argv] or sorted((ROOT / "notebooks").glob("0*.ipynb"))
    for path in paths:
        refresh(path)


if __name__ == "__main__":
    main(sys.argv[1:])
