"""How to install what is missing: the name vkml has on the package index, and its extras.

The import name is ``vkml``; the distribution is ``vkml-toolkit``, because the package index
already holds an unrelated project called ``vkml``.  Every message that tells the user to
install an extra is made here, so it names the right project (a test checks that the README,
the docs, the notebooks and ``pyproject.toml`` agree with it).
"""

#: the name ``pip install`` takes (``pyproject.toml``'s ``project.name``)
DISTRIBUTION = "vkml-toolkit"


def install_hint(extra: str) -> str:
    """``pip install 'vkml-toolkit[extra]'``: the command that adds ``extra``.

    >>> from vkml.install import install_hint
    >>> install_hint("distributed")
    "pip install 'vkml-toolkit[distributed]'"
    """
    return f"pip install '{DISTRIBUTION}[{extra}]'"
