"""How a tensor meets other array libraries: the array API standard's namespace, DLPack (NumPy,
PyTorch and JAX take a tensor's values without a copy where they can) and ``to_device``.  A part
of ``Tensor`` (a base class of it) that needs nothing of the rest."""

from __future__ import annotations

import sys

import numpy as np

from .errors import ArgumentError
from .validate import describe


class Interchange:
    """The array interchange protocols of a tensor (see the module docstring).

    >>> np.from_dlpack(vkml.tensor([1.0, 2.0])), vkml.tensor([1.0]).__dlpack_device__()
    (array([1., 2.]), (1, 0))
    """

    __slots__ = ()

    def __array_namespace__(self, *, api_version=None):
        """``vkml.numpy``: the array API standard's namespace of this tensor's functions
        (version 2023.12), so code written against the standard runs on vkml tensors.

        >>> vkml.tensor([1.0]).__array_namespace__().__name__
        'vkml.numpy'
        """
        if api_version not in (None, "2021.12", "2022.12", "2023.12"):
            raise ArgumentError(f"__array_namespace__: api_version {api_version!r} is not one "
                                "vkml.numpy follows; it follows 2023.12 (and the ones before)")
        # looked up, not imported: the layer above (``import vkml`` always loads it)
        return sys.modules["vkml.numpy"]

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """The values through DLPack (a read-only host array's, or a copy's when the consumer
        cannot be told it is read-only), so NumPy, PyTorch and JAX can take them.

        >>> np.from_dlpack(vkml.tensor([1.0, 2.0]))
        array([1., 2.])
        """
        arr = self.numpy()
        if copy:
            arr = np.array(arr)
        try:
            return arr.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device,
                                  copy=copy)
        except BufferError:
            if copy is False:
                raise
            return np.array(arr).__dlpack__(stream=stream, max_version=max_version,
                                            dl_device=dl_device)

    def __dlpack_device__(self):
        """(1, 0): the host (kDLCPU), where a tensor's values are read from.

        >>> vkml.tensor([1.0]).__dlpack_device__()
        (1, 0)
        """
        return (1, 0)

    def to_device(self, device, /, *, stream=None):
        """This tensor on ``device``: the device it is on already (vkml moves tensors between
        backends with ``vkml.set_backend``).

        >>> t = vkml.tensor([1.0])
        >>> t.to_device(t.device) is t
        True
        """
        if not isinstance(device, str) or device != self.device:
            raise ArgumentError(f"to_device: this tensor is on {self.device!r}; vkml runs one "
                                f"backend at a time, so {describe(device)} is not available (choose the "
                                "backend with vkml.set_backend)")
        return self
