"""The backends the computing tests run on: the NumPy reference and the compiled CPU tier.

``VKML_TEST_BACKENDS=numpy`` narrows a local run.  A module of its own (not ``conftest``): the
notebooks' ``conftest`` shares that module name when the whole suite runs, so test modules import
this list from here.
"""

import os

BACKENDS = [b for b in os.environ.get("VKML_TEST_BACKENDS", "numpy,cpu").split(",") if b]
