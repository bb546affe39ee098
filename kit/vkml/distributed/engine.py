"""The one door to Dask: ``dask``, ``dask.array`` and ``distributed``, or a vkml error that says
how to install them.  Every other module of this package imports the engine from here, so
``import vkml`` never imports Dask, and ``import vkml.distributed`` without Dask says what to do."""

from __future__ import annotations

from ..errors import BackendError
from ..install import install_hint

INSTALL = install_hint("distributed")

try:
    import dask
    import dask.sizeof
    import dask.array as da
    import distributed
except ImportError as err:           # the optional extra is not installed
    raise BackendError(f"vkml.distributed runs on Dask, which is not installed ({err}); "
                       f"install it with {INSTALL}") from err

__all__ = ["INSTALL", "da", "dask", "distributed"]
