"""Independent references for the per-operator tests.

- hypothesis strategies for the shapes and values the operators are checked on
  (small: rank 0-3, every dimension 1-4);
- ``check_grad``: vkml's gradient (``tensor(requires_grad=True)`` + ``backward``)
  against HIPS autograd running the same function written in ``autograd.numpy``,
  and against central finite differences of vkml's own forward in float64 --
  never against vkml's derivative machinery;
- plain NumPy / autograd versions of what NumPy does not have (lax-style pad and
  slice, gather/scatter_add, conv2d and pooling as direct loops).
"""

from __future__ import annotations

import zlib

import autograd
import autograd.numpy as anp
import numpy as np
from autograd.scipy.special import logsumexp as ag_logsumexp
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import vkml

FLOATS = ("float32", "float64")
INTS = ("int32", "int64")
NUMERIC = INTS + FLOATS
ALL_DTYPES = ("bool",) + NUMERIC


# -- strategies ---------------------------------------------------------------------------

def shapes(min_dims=0, max_dims=3, min_side=1, max_side=4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                            max_side=max_side)


def elements(dtype, lo=-10.0, hi=10.0):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return st.booleans()
    if dtype.kind in "iu":
        return st.integers(int(lo), int(hi))
    return st.floats(lo, hi, width=dtype.itemsize * 8, allow_nan=False, allow_infinity=False)


def arrays(dtype, shape=None, lo=-10.0, hi=10.0, elements_=None):
    """An array of ``dtype``, shape drawn by :func:`shapes` unless given, values in [lo, hi]."""
    return hnp.arrays(np.dtype(dtype), shapes() if shape is None else shape,
                      elements=elements_ if elements_ is not None else elements(dtype, lo, hi))


@st.composite
def away_from(draw, shape, lo, hi, gap=0.1, dtype="float64"):
    """Floats with |x| in [lo, hi] (gap > 0 keeps them clear of a kink at 0)."""
    mags = draw(hnp.arrays(np.float64, shape, elements=st.floats(max(lo, gap), hi)))
    signs = draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([-1.0, 1.0])))
    return (mags * signs).astype(dtype)


@st.composite
def distinct(draw, shape, dtype="float64", spacing=0.1):
    """Floats whose pairwise gaps are >= ``spacing``: max/min without ties, far from ties."""
    n = int(np.prod(shape))
    ints = draw(hnp.arrays(np.int64, (n,), elements=st.integers(-60, 60), unique=True))
    return (ints.reshape(shape) * spacing + 0.013).astype(dtype)


@st.composite
def broadcastable_pair(draw, max_dims=3):
    """Two shapes that broadcast together, NumPy style."""
    pair = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=max_dims,
                                                  min_side=1, max_side=4))
    return pair.input_shapes


@st.composite
def axes_for(draw, ndim, allow_none=True, allow_tuple=True, allow_negative=True):
    """An ``axis`` argument for a reduction over an array of rank ``ndim``."""
    choices = []
    if allow_none:
        choices.append("none")
    if ndim:
        choices.append("int")
        if allow_tuple:
            choices.append("tuple")
    kind = draw(st.sampled_from(choices))
    if kind == "none":
        return None
    lo = -ndim if allow_negative else 0
    if kind == "int":
        return draw(st.integers(lo, ndim - 1))
    picked = draw(st.lists(st.integers(0, ndim - 1), min_size=0, max_size=ndim, unique=True))
    if allow_negative:
        picked = [p - ndim if draw(st.booleans()) else p for p in picked]
    return tuple(picked)


# -- helpers ---------------------------------------------------------------------------------

def rng_for(*keys):
    """A generator seeded by ``keys`` (shapes, names): the same weights for the same example."""
    return np.random.default_rng(zlib.crc32(repr(keys).encode()))


def weights_like(shape, *keys):
    return rng_for(tuple(shape), *keys).normal(size=shape)


def canonical(dtype):
    """NumPy's result dtype mapped onto vkml's five (NumPy's float16 for bool math is float32)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return np.dtype(np.float64) if dtype.itemsize >= 8 else np.dtype(np.float32)
    return dtype


def assert_same(actual, expected, exact=True, rtol=1e-6, atol=0.0):
    """``actual`` (a Tensor or array) equals ``expected`` in shape, dtype and values."""
    if isinstance(actual, vkml.Tensor):
        value = actual.numpy()
        # the shape/dtype rule and the implementation agree
        assert (tuple(actual.shape), actual.dtype) == (value.shape, value.dtype), \
            (actual.shape, actual.dtype, value.shape, value.dtype)
        actual = value
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == canonical(expected.dtype), (actual.dtype, expected.dtype)
    if expected.dtype.kind in "biu" or exact and vkml.backend_info()["backend"] == "numpy":
        np.testing.assert_array_equal(actual, expected)
    elif exact:
        # A compiled tier's transcendentals come from libm: a few ulps from NumPy's (its contract;
        # +, -, *, / and sqrt are checked bit for bit in tests/test_compiled.py).
        tol = 1e-13 if actual.dtype == np.float64 else 2e-6
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * 1e-3, equal_nan=True)
    else:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


# -- gradients ---------------------------------------------------------------------------------

def vkml_grads(f_vk, args, wrt, w):
    """d/d args[i] of sum(f_vk(*args) * w) for i in ``wrt``, through ``backward``."""
    ts = [vkml.tensor(a, requires_grad=(i in wrt)) for i, a in enumerate(args)]
    out = f_vk(*ts)
    assert tuple(out.shape) == np.shape(w), (out.shape, np.shape(w))
    loss = vkml.sum(vkml.mul(out, vkml.tensor(np.asarray(w, dtype=out.dtype))))
    loss.backward()
    grads = []
    for i in wrt:
        g = ts[i].grad
        assert g is not None, f"argument {i} got no gradient"
        g = g.numpy()
        assert g.shape == np.shape(args[i]) and g.dtype == np.asarray(args[i]).dtype, \
            (g.shape, g.dtype, np.shape(args[i]), np.asarray(args[i]).dtype)
        grads.append(np.array(g, dtype=np.float64))
    # the inputs are untouched by the backward pass
    for t, a in zip(ts, args):
        np.testing.assert_array_equal(t.numpy(), a)
    return grads


def autograd_grads(f_ag, args, wrt, w):
    grads = []
    for i in wrt:
        def scalar(xi, i=i):
            xs = list(args)
            xs[i] = xi
            return anp.sum(f_ag(*xs) * w)
        grads.append(np.asarray(autograd.grad(scalar)(np.asarray(args[i], dtype=np.float64)),
                                dtype=np.float64))
    return grads


def vkml_value(f_vk, args, w):
    """sum(f_vk(*args) * w) as a float, lazily (one submission) and without gradients."""
    with vkml.eager(False), vkml.no_grad():
        out = f_vk(*[vkml.tensor(a) for a in args])
        return float(np.sum(np.asarray(out.numpy(), dtype=np.float64) * w))


def central_diff(f, x, eps=1e-6):
    """The gradient of a float-valued ``f`` at ``x`` by central differences (float64)."""
    x = np.array(x, dtype=np.float64)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        g[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


def finite_difference_grads(f_vk, args, wrt, w, h=1e-5, max_full=32, directions=6):
    """Central differences of vkml's forward in float64.

    Element by element when an argument has at most ``max_full`` elements;
    otherwise along ``directions`` random unit directions (returned as pairs
    ``(directions, derivatives)`` for :func:`check_grad` to compare with g . v).
    """
    out = []
    for i in wrt:
        x = np.asarray(args[i], dtype=np.float64)

        def at(xi, i=i):
            xs = list(args)
            xs[i] = xi
            return vkml_value(f_vk, xs, w)

        if x.size <= max_full:
            g = np.zeros_like(x)
            for k in range(x.size):
                e = np.zeros_like(x)
                e.flat[k] = h
                g.flat[k] = (at(x + e) - at(x - e)) / (2 * h)
            out.append(("full", g))
        else:
            vs = rng_for(x.shape, "directions").normal(size=(directions,) + x.shape)
            vs /= np.sqrt(np.sum(vs ** 2, axis=tuple(range(1, vs.ndim)), keepdims=True))
            ds = np.array([(at(x + h * v) - at(x - h * v)) / (2 * h) for v in vs])
            out.append(("directional", (vs, ds)))
    return out


def check_grad(f_vk, f_ag, *args, wrt=None, rtol=1e-10, fd_rtol=1e-5, fd_h=1e-5, key=""):
    """vkml's gradient of sum(f(*args) * w) equals autograd's and central differences'.

    ``args`` are arrays; the ones in ``wrt`` (default: every floating one) are
    differentiated, the others are passed as constants (indices, masks, ...).
    ``w`` is a fixed random weight of the output's shape, so every output
    element matters.  Returns vkml's gradients.
    """
    args = [np.asarray(a) for a in args]
    if wrt is None:
        wrt = [i for i, a in enumerate(args) if a.dtype.kind == "f"]
    ref_out = np.asarray(f_ag(*[a.astype(np.float64) if a.dtype.kind == "f" else a
                                for a in args]))
    w = weights_like(ref_out.shape, key, tuple(a.shape for a in args))
    got = vkml_grads(f_vk, args, wrt, w)
    want = autograd_grads(f_ag, args, wrt, w)
    for i, g, r in zip(wrt, got, want):
        scale = max(1.0, float(np.max(np.abs(r), initial=0.0)))
        np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol * scale,
                                   err_msg=f"gradient of argument {i} differs from autograd's")
    if all(np.asarray(args[i]).dtype == np.float64 for i in wrt):
        for i, g, (kind, fd) in zip(wrt, got, finite_difference_grads(f_vk, args, wrt, w, fd_h)):
            scale = max(1.0, float(np.max(np.abs(g), initial=0.0)))
            if kind == "full":
                np.testing.assert_allclose(g, fd, rtol=fd_rtol, atol=fd_rtol * scale,
                                           err_msg=f"gradient of argument {i} differs from "
                                                   "central differences")
            else:
                vs, ds = fd
                gv = np.array([np.sum(g * v) for v in vs])
                np.testing.assert_allclose(gv, ds, rtol=fd_rtol, atol=fd_rtol * scale,
                                           err_msg=f"directional derivatives of argument {i} "
                                                   "differ from central differences")
    return got


# -- references for ops NumPy/autograd do not have ------------------------------------------------

def _select_along(x, axis, rows, n_out):
    """out[..., r, ...] = x[..., rows[r], ...] (rows[r] = -1 gives 0): a 0/1 matrix product."""
    n_in = x.shape[axis]
    m = np.zeros((n_out, n_in))
    for r, src in enumerate(rows):
        if 0 <= src < n_in:
            m[r, src] = 1.0
    y = anp.tensordot(m, x, axes=([1], [axis]))
    return anp.moveaxis(y, 0, axis)


def lax_pad(x, lo, hi, interior):
    """lax.pad with zeros: lo/hi (may be negative: crop) and interior per axis."""
    for ax, (a, b, i) in enumerate(zip(lo, hi, interior)):
        n = x.shape[ax]
        full_len = n + max(0, n - 1) * i
        rows = []
        for r in range(a + full_len + b):
            p = r - a
            rows.append(p // (i + 1) if 0 <= p < full_len and p % (i + 1) == 0 else -1)
        x = _select_along(x, ax, rows, len(rows))
    return x


def lax_slice(x, starts, limits, strides):
    for ax, (s, l, st_) in enumerate(zip(starts, limits, strides)):
        rows = list(range(s, l, st_))
        x = _select_along(x, ax, rows, len(rows))
    return x


def np_pad(x, lo, hi, interior):
    """lax.pad in plain NumPy, keeping the dtype: interior zeros, then lo/hi (negative crops)."""
    if x.ndim == 0:
        return x.copy()
    n = x.shape
    grown = tuple(d + max(0, d - 1) * i for d, i in zip(n, interior))
    out = np.zeros(grown, dtype=x.dtype)
    out[tuple(slice(None, None, i + 1) for i in interior)] = x
    out = np.pad(out, [(max(a, 0), max(b, 0)) for a, b in zip(lo, hi)])
    crop = tuple(slice(max(-a, 0), out.shape[k] - max(-b, 0))
                 for k, (a, b) in enumerate(zip(lo, hi)))
    return out[crop]



def gather_nd(x, idx):
    idx = np.asarray(idx)
    return x[tuple(idx[..., j] for j in range(idx.shape[-1]))]


def scatter_add_nd(base, idx, upd):
    """base + the updates added at the rows idx picks (duplicates add), as a matrix product."""
    idx = np.asarray(idx)
    k = idx.shape[-1]
    lead = base.shape[:k]
    flat = np.ravel_multi_index(tuple(idx[..., j].ravel() for j in range(k)), lead) \
        if idx[..., 0].size else np.zeros(0, dtype=np.int64)
    m = np.zeros((int(np.prod(lead)), flat.size))
    m[flat, np.arange(flat.size)] = 1.0
    rest = base.shape[k:]
    u = anp.reshape(upd, (flat.size, int(np.prod(rest))))
    return base + anp.reshape(anp.dot(m, u), base.shape)


def conv2d_loop(x, w, b=None, stride=1, padding=0):
    """Direct cross-correlation, one output position at a time (NCHW, OIHW)."""
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    ph, pw = (padding, padding) if np.isscalar(padding) else padding
    if ph or pw:
        x = lax_pad(x, (0, 0, ph, pw), (0, 0, ph, pw), (0, 0, 0, 0))
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ho, wo = (h - kh) // sh + 1, (wd - kw) // sw + 1
    rows = []
    for i in range(ho):
        cols = []
        for j in range(wo):
            patch = x[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            cols.append(anp.einsum("nckl,ockl->no", patch, w))
        rows.append(anp.stack(cols, axis=-1))
    out = anp.stack(rows, axis=-2)
    if b is not None:
        out = out + anp.reshape(b, (1, o, 1, 1))
    return out


def pool2d_loop(x, k, stride, reduce):
    kh, kw = (k, k) if np.isscalar(k) else k
    if stride is None:
        stride = (kh, kw)
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    n, c, h, wd = x.shape
    ho, wo = (h - kh) // sh + 1, (wd - kw) // sw + 1
    rows = []
    for i in range(ho):
        cols = [reduce(x[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw], axis=(2, 3))
                for j in range(wo)]
        rows.append(anp.stack(cols, axis=-1))
    return anp.stack(rows, axis=-2)


def logsumexp_ref(x, axis=-1, keepdims=False):
    return ag_logsumexp(x, axis=axis, keepdims=keepdims)
