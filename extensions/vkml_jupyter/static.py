"""Explorers that still show something where no kernel runs them.

A widget's output in a notebook is only a reference to a model that lives in the kernel: a
tutorial opened fresh, exported with nbconvert, or rendered in the Sphinx docs has no such model,
and shows "Error displaying widget" or blank space there.  Each explorer therefore offers, next
to its live view, a picture of what it showed when it was displayed (``image/png`` or
``image/svg+xml``) in the same output.  JupyterLab with a running kernel prefers the live widget;
everywhere else the picture is what the reader sees.
"""

from __future__ import annotations

import base64


class StaticPicture:
    """Mixed into an ipywidgets explorer: its display bundle also carries ``static_picture()``,
    a ``(mime type, data)`` pair of what it shows now (None: nothing to add)."""

    def static_picture(self):
        """``(mime type, data)``: what the explorer shows now, for a reader without a kernel
        (None: nothing to add).  Each explorer says what its picture is.

        >>> ex = vkml.widgets.explore_gradient(lambda x: vkml.sum(x * x), np.array([1.0]))
        >>> mime, data = ex.static_picture()
        >>> mime, data[:4] == b"\\x89PNG"
        ('image/png', True)
        """
        return None

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        try:
            picture = self.static_picture()
        except Exception:             # noqa: BLE001 - a picture is an extra: never lose the widget
            picture = None
        if picture is not None and isinstance(bundle, dict):
            mime, data = picture
            bundle[mime] = base64.b64encode(data).decode("ascii") if mime == "image/png" else data
        return bundle
