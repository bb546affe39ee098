"""Discrete Fourier transforms (the array API's ``fft`` extension), one primitive for all.

``fft_p`` applies NumPy's ``numpy.fft.<kind>`` with its ``n``/``s``, ``axes`` and
``norm``.  Every transform is linear, so its tangent is the same transform of
the tangent.  Reverse mode (JAX's convention: no conjugation) needs the
transpose: for the complex-to-complex transforms without a length change
(``fft``, ``ifft``, ``fftn``, ``ifftn`` with ``n``/``s`` None) the DFT matrix is
symmetric, so the transpose is the same transform; the others (a length
change, the real-input and Hermitian transforms) differentiate in forward
mode only and say so in reverse mode.  A program holding a transform runs on
NumPy.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, DTypeError, GradError
from ..ir import dtype_name
from . import api as F
from .core import Primitive, bind

KINDS = ("fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft", "ihfft")
_REAL_IN = ("rfft", "rfftn", "ihfft")
_REAL_OUT = ("irfft", "irfftn", "hfft")
_SYMMETRIC = ("fft", "ifft", "fftn", "ifftn")
_COMPLEX_OF = {np.dtype(np.float32): np.dtype(np.complex64), np.dtype(np.float64): np.dtype(np.complex128)}
_REAL_OF = {v: k for k, v in _COMPLEX_OF.items()}


def _out_dtype(kind, dtype):
    if kind in _REAL_OUT:
        return _REAL_OF.get(dtype, dtype)
    return _COMPLEX_OF.get(dtype, dtype)


def _fft_rule(x, *, kind, n, axes, norm):
    if kind in _REAL_IN and x.dtype.kind != "f":
        raise DTypeError(f"fft.{kind}: needs a real floating input, got {dtype_name(x.dtype)}")
    if kind not in _REAL_IN and x.dtype.kind not in "fc":
        raise DTypeError(f"fft.{kind}: needs a floating or complex input, got {dtype_name(x.dtype)}")
    probe = getattr(np.fft, kind)(np.zeros(x.shape, x.dtype), *_call_args(kind, n, axes), norm=norm)
    return [(probe.shape, _out_dtype(kind, x.dtype))]


def _call_args(kind, n, axes):
    return (n, axes[0]) if not kind.endswith("n") else (n, axes)


def _fft_impl(x, *, kind, n, axes, norm):
    out = getattr(np.fft, kind)(x, *_call_args(kind, n, axes), norm=norm)
    return out.astype(_out_dtype(kind, x.dtype), copy=False)


def _fft_transpose(ct, x, *, kind, n, axes, norm):
    if kind not in _SYMMETRIC or n is not None:
        raise GradError(f"fft.{kind}: reverse mode (grad, vjp, backward) is not available for "
                        f"this transform{' with a length change' if n is not None else ''}; "
                        "use vkml.jvp / jacfwd, or fft/ifft of complex values without n")
    return [bind(fft_p, ct[0], kind=kind, n=n, axes=axes, norm=norm)]


fft_p = Primitive("fft", doc="NumPy's discrete Fourier transform ``kind`` along ``axes``.")
fft_p.abstract = _fft_rule
fft_p.impl = _fft_impl
fft_p.jvp = lambda p, t, o, **params: [bind(fft_p, t[0], **params)]
fft_p.transpose = _fft_transpose


def _batch(vals, dims, size, **params):
    """The batch axis moved first; the transform's (non-negative) axes shift past it."""
    x = F.batch_all(vals, dims, size)[0]
    axes = tuple(a + 1 for a in params["axes"])
    return [bind(fft_p, x, **dict(params, axes=axes))], [0]


fft_p.batch = _batch


def transform(kind, x, n=None, axis=-1, norm="backward"):
    """``numpy.fft.<kind>`` of ``x``: ``n`` an int (one axis) or a tuple (``s``, several)."""
    if kind not in KINDS:
        raise ArgumentError(f"fft: unknown transform {kind!r}")
    if norm not in ("backward", "ortho", "forward"):
        raise ArgumentError(f"fft.{kind}: norm must be 'backward', 'ortho' or 'forward', got {norm!r}")
    x = F.as_var(x)
    if x.ndim == 0:
        raise ArgumentError(f"fft.{kind}: needs at least one dimension")
    if kind.endswith("n"):
        axes = tuple(range(x.ndim)) if axis is None else tuple(axis)
        axes = tuple(F.normalize_axis(f"fft.{kind}", x.ndim, a) for a in axes)
        n = None if n is None else tuple(int(v) for v in n)
    else:
        axes = (F.normalize_axis(f"fft.{kind}", x.ndim, axis),)
        n = None if n is None else int(n)
    if x.dtype.kind in "iub":
        x = F.cast(x, np.float64)
    if kind not in _REAL_IN and x.dtype.kind == "f" and kind not in ("irfft", "irfftn", "hfft"):
        x = F.cast(x, _COMPLEX_OF[x.dtype])
    try:
        return bind(fft_p, x, kind=kind, n=n, axes=axes, norm=norm)
    except ValueError as err:
        raise ArgumentError(f"fft.{kind}: {err}") from None
