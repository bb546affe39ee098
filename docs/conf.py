"""Sphinx configuration for vkml's own documentation.

Why Sphinx, and these extensions:

- ``sphinx.ext.autodoc`` builds the API reference from the docstrings the code already has, so the
  reference cannot drift from the code; ``sphinx.ext.napoleon`` reads the few Google-style sections.
- ``myst_nb`` renders the checked-in tutorial notebooks (``notebooks/``, copied into ``tutorials/``)
  with the outputs stored in them, without executing anything: the notebooks are already run and
  compared by nbval in the test suite, so the docs build stays fast and needs no kernel.
- the examples in the docstrings are run by ``tests/test_docs.py`` with Python's ``doctest``; the
  same test builds these pages with warnings as errors.
- ``furo`` is a clean, readable theme; without it the build falls back to Sphinx's ``alabaster``.
"""

import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path[:0] = [os.path.join(ROOT, "kit"), os.path.join(ROOT, "extensions")]
os.environ.setdefault("VKML_BACKEND", "numpy")


def _copy_tutorials():
    """The notebooks live in ``notebooks/`` (where ``scripts/dev lab`` opens them and nbval runs
    them); Sphinx reads only files under ``docs/``, so each build copies them, with the page that
    lists them and the two files it links to, into ``docs/tutorials/`` (ignored by git)."""
    import shutil
    source = os.path.join(ROOT, "notebooks")
    target = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tutorials")
    os.makedirs(target, exist_ok=True)
    for name in sorted(os.listdir(source)):
        if name.endswith((".ipynb", ".md", ".cfg")) or name == "conftest.py":
            shutil.copyfile(os.path.join(source, name), os.path.join(target, name))


_copy_tutorials()

project = "vkml"
author = "the vkml authors"
copyright = "the vkml authors, MIT licence"
release = version = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_nb",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "README.md", "**/.ipynb_checkpoints"]
root_doc = "index"

# The tutorials are shown with their stored outputs; they are executed by nbval in the test suite.
nb_execution_mode = "off"
# Widget views need a live kernel; their stored state is shown as text.
nb_render_markdown_format = "myst"
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

try:
    import furo  # noqa: F401
    html_theme = "furo"
except ImportError:  # the docs extra installs furo; a bare Sphinx still builds
    html_theme = "alabaster"
html_title = "vkml"
html_static_path = []


def _usage_as_text(app, what, name, obj, options, lines):
    """The ``%vkml`` magic's docstring is the usage text it prints (columns of options, not
    reStructuredText): show it as it prints."""
    if name.endswith("VkmlMagics.vkml") and lines:
        lines[:] = ["The ``%%vkml`` cell magic and the ``%vkml`` line magic::", ""] + \
            ["    " + line for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _usage_as_text)
