"""``vkml.numpy.fft``: NumPy's (and the array API's) discrete Fourier transforms.

Each is NumPy's transform, differentiable in forward mode (every transform is
linear); reverse mode works for ``fft``, ``ifft``, ``fftn`` and ``ifftn`` of
complex values without a length change (the others say so).  Programs holding
a transform run on NumPy.
"""

from __future__ import annotations

import numpy as _np

from ..ops import api as _api
from ..ops import fft as _fft
from ..ops import numeric as _num
from .. import validate as _valid
from ._lift import doc as _doc, lifted as _lifted

_HEAD = ">>> import vkml.numpy as vnp\n"


def _one(kind):
    def fn(x, n=None, axis=-1, norm="backward"):
        n = None if n is None else _valid.check_int(n, "n", f"fft.{kind}", low=1)
        return _fft.transform(kind, x, n, _valid.check_int(axis, "axis", f"fft.{kind}"), norm)
    return fn


def _many(kind):
    def fn(x, s=None, axes=None, norm="backward"):
        if s is not None:
            s = tuple(_valid.check_int(v, "s", f"fft.{kind}", low=1)
                      for v in _valid.check_sequence(s, "s", f"fft.{kind}"))
        if axes is not None:
            axes = tuple(_valid.check_int(a, "axes", f"fft.{kind}")
                         for a in _valid.check_sequence(axes, "axes", f"fft.{kind}"))
        if s is not None and axes is None:
            axes = tuple(range(-len(s), 0))
        return _fft.transform(kind, x, s, axes, norm)
    return fn


def _fftfreq(n, d=1.0, *, dtype=None, device=None):
    n = _valid.check_int(n, "n", "fft.fftfreq", low=1, high=_valid.MAX_ELEMENTS)
    out = _np.fft.fftfreq(n, _valid.check_real(d, "d", "fft.fftfreq"))
    return _api.constant(out, None if dtype is None else _valid.check_dtype(dtype, "fft.fftfreq"))


def _rfftfreq(n, d=1.0, *, dtype=None, device=None):
    n = _valid.check_int(n, "n", "fft.rfftfreq", low=1, high=_valid.MAX_ELEMENTS)
    out = _np.fft.rfftfreq(n, _valid.check_real(d, "d", "fft.rfftfreq"))
    return _api.constant(out, None if dtype is None else _valid.check_dtype(dtype, "fft.rfftfreq"))


def _shift(sign):
    def fn(x, axes=None):
        x = _api.as_var(x)
        axes = tuple(range(x.ndim)) if axes is None else \
            tuple(_valid.check_int(a, "axes", "fft.fftshift") for a in
                  (axes if isinstance(axes, (list, tuple)) else (axes,)))
        axes = tuple(_api.normalize_axis("fft.fftshift", x.ndim, a) for a in axes)
        return _num.roll(x, [sign * (x.shape[a] // 2) for a in axes], axes) if axes else x
    return fn


_TABLE = [
    ("fft", _one("fft"), "The one-dimensional discrete Fourier transform along ``axis``.", "vnp.fft.fft([1.0, 0.0, 0.0, 0.0])", 'tensor([1.+0.j, 1.+0.j, 1.+0.j, 1.+0.j], dtype=complex128)'),
    ("ifft", _one("ifft"), "The inverse of ``fft``.", "vnp.fft.ifft([4.0, 0.0, 0.0, 0.0])", 'tensor([1.+0.j, 1.+0.j, 1.+0.j, 1.+0.j], dtype=complex128)'),
    ("fftn", _many("fftn"), "The n-dimensional transform over ``axes``.", "vnp.fft.fftn([[1.0, 0.0], [0.0, 0.0]])", 'tensor([[1.+0.j, 1.+0.j],\n        [1.+0.j, 1.+0.j]], dtype=complex128)'),
    ("ifftn", _many("ifftn"), "The inverse of ``fftn``.", "vnp.fft.ifftn([[4.0, 0.0], [0.0, 0.0]])", 'tensor([[1.+0.j, 1.+0.j],\n        [1.+0.j, 1.+0.j]], dtype=complex128)'),
    ("rfft", _one("rfft"), "The transform of real input (the non-negative frequencies).", "vnp.fft.rfft([1.0, 2.0, 3.0, 4.0])", 'tensor([10.+0.j, -2.+2.j, -2.+0.j], dtype=complex128)'),
    ("irfft", _one("irfft"), "The inverse of ``rfft`` (a real result).", "vnp.fft.irfft([10.0, -2.0 + 2.0j, -2.0])", 'tensor([1., 2., 3., 4.], dtype=float64)'),
    ("rfftn", _many("rfftn"), "The n-dimensional transform of real input.", "vnp.fft.rfftn([[1.0, 2.0], [3.0, 4.0]])", 'tensor([[10.+0.j, -2.+0.j],\n        [-4.+0.j,  0.+0.j]], dtype=complex128)'),
    ("irfftn", _many("irfftn"), "The inverse of ``rfftn``.", "vnp.fft.irfftn([[10.0, -2.0], [-4.0, 0.0]])", 'tensor([[1., 2.],\n        [3., 4.]], dtype=float64)'),
    ("hfft", _one("hfft"), "The transform of a Hermitian-symmetric signal (a real result).", "vnp.fft.hfft([1.0, 2.0, 1.0])", 'tensor([ 6.,  0., -2.,  0.], dtype=float64)'),
    ("ihfft", _one("ihfft"), "The inverse of ``hfft``.", "vnp.fft.ihfft([4.0, 0.0, 0.0, 0.0])", 'tensor([1.-0.j, 1.-0.j, 1.-0.j], dtype=complex128)'),
    ("fftfreq", _fftfreq, "The sample frequencies of an n-point ``fft`` with spacing ``d``.", "vnp.fft.fftfreq(4)", 'tensor([ 0.  ,  0.25, -0.5 , -0.25], dtype=float64)'),
    ("rfftfreq", _rfftfreq, "The sample frequencies of an n-point ``rfft``.", "vnp.fft.rfftfreq(4)", 'tensor([0.  , 0.25, 0.5 ], dtype=float64)'),
    ("fftshift", _shift(1), "The zero frequency moved to the middle.", "vnp.fft.fftshift([0.0, 1.0, 2.0, 3.0])", 'tensor([2., 3., 0., 1.], dtype=float64)'),
    ("ifftshift", _shift(-1), "The inverse of ``fftshift``.", "vnp.fft.ifftshift([2.0, 3.0, 0.0, 1.0])", 'tensor([0., 1., 2., 3.], dtype=float64)'),
]

for _name, _fn, _summary, _example, _output in _TABLE:
    globals()[_name] = _lifted(_fn, _name, _doc(_summary, _example, _output, head=_HEAD))
    globals()[_name].__module__ = __name__
