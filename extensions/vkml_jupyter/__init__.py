"""vkml in Jupyter: the ``%%vkml`` / ``%vkml`` magics and the ipywidgets explorers.

Load it in a notebook with ``%load_ext vkml`` (or ``%load_ext vkml_jupyter``):

- ``%%vkml [--eager] [--backend NAME] [--show WHAT[,WHAT]] [--grad VAR] [--time]`` runs a cell
  under a mode and backend and shows what it built (see :data:`vkml_jupyter.magics.USAGE`);
- ``%vkml info | eager on|off | backend NAME`` looks at or changes vkml's state;
- :mod:`vkml_jupyter.widgets` (also ``vkml.widgets``): ``explore_gradient`` and ``explore_record``.

This package depends on ``vkml`` (the library in ``kit/``) and on IPython; the library never
imports it except through ``%load_ext vkml`` and ``vkml.widgets``.
"""

from .magics import USAGE, VkmlMagics, help_without_a_body

__all__ = ["USAGE", "VkmlMagics", "load_ipython_extension"]


def load_ipython_extension(ipython):
    """Register the ``%%vkml`` cell magic and the ``%vkml`` line magic with ``ipython``.

    >>> from IPython.core.interactiveshell import InteractiveShell
    >>> ip = InteractiveShell()    # a shell of its own (a notebook has one already)
    >>> _ = ip.extension_manager.load_extension("vkml")
    >>> "vkml" in ip.magics_manager.magics["cell"]
    True
    """
    ipython.register_magics(VkmlMagics)
    cleanup = ipython.input_transformers_cleanup
    if help_without_a_body not in cleanup:
        cleanup.append(help_without_a_body)
