"""Every function of ``vkml.numpy`` checked the same way, in the style of HIPS autograd's
``test_systematic``: one table of cases, each a vkml function, its ``autograd.numpy`` twin
and the inputs it is defined on; every case is checked for

- its value against NumPy (or SciPy) -- shape, dtype and numbers;
- its gradient (``backward``) against HIPS autograd and central differences in float64
  (``oracle.check_grad``), and ``vkml.grad`` of the traced function against autograd;
- ``vkml.jvp`` against central differences of the NumPy reference, and against autograd's
  gradient through the identity <jvp(v), w> = <v, grad(<f, w>)>;
- ``vkml.vmap`` against the NumPy reference applied example by example;
- second derivatives (grad of grad) against autograd, on the cases marked ``second``;

on the NumPy backend and the compiled cpu tier.  Inputs stay inside each function's
domain and away from its kinks and discontinuities (where a derivative is a convention).
"""

from __future__ import annotations

import math

import autograd
import autograd.numpy as anp
import autograd.scipy.special as asp
from autograd.tracer import getval
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import vkml
import vkml.numpy as vnp
import vkml.scipy.special as vsp
from backends_under_test import BACKENDS

import oracle as O

pytestmark = pytest.mark.parametrize("vk_backend", BACKENDS, indirect=True)

#: few examples (the cpu tier compiles C per new program), from a few shapes (reused programs)
SMALL = settings(max_examples=3)
SHAPES = st.sampled_from([(3,), (2, 3)])


# -- drawing inputs ---------------------------------------------------------------------------

def f64(shape, lo=-3.0, hi=3.0):
    return hnp.arrays(np.float64, shape, elements=st.floats(lo, hi, allow_nan=False))


def unary(lo=-3.0, hi=3.0):
    def draw(data):
        return [data.draw(f64(data.draw(SHAPES), lo, hi))], {}
    return draw


def unary_away(lo=0.3, hi=3.0):
    def draw(data):
        return [data.draw(O.away_from(data.draw(SHAPES), lo, hi))], {}
    return draw


def off_integers(fractions=(0.15, 0.3, 0.35, 0.65, 0.7, 0.85)):
    """Values at least 0.1 from every integer and every half (the jumps of floor ... rint)."""
    def draw(data):
        shape = data.draw(SHAPES)
        whole = data.draw(hnp.arrays(np.float64, shape, elements=st.integers(-4, 4).map(float)))
        frac = data.draw(hnp.arrays(np.float64, shape, elements=st.sampled_from(fractions)))
        return [whole + frac], {}
    return draw


BROADCAST = st.sampled_from([((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((), (2, 3))])


def binary(x=(-3.0, 3.0), y=(-3.0, 3.0), y_away=False):
    def draw(data):
        sx, sy = data.draw(BROADCAST)
        ys = O.away_from(sy, *y) if y_away else f64(sy, *y)
        return [data.draw(f64(sx, *x)), data.draw(ys)], {}
    return draw


def distinct_values(n_args=1):
    def draw(data):
        shape = data.draw(SHAPES)
        flat = data.draw(O.distinct((n_args * math.prod(shape),), spacing=0.1))
        return [a.reshape(shape) for a in np.split(flat, n_args)], {}
    return draw


def distinct_of(shape):
    def draw(data):
        return [data.draw(O.distinct(shape, spacing=0.1))], {}
    return draw


def remainder_pair():
    """(x, y) with x / y at least 0.15 from a whole number: no jump of mod nearby."""
    def draw(data):
        shape = data.draw(SHAPES)
        y = data.draw(O.away_from(shape, 0.5, 3.0))
        q = data.draw(hnp.arrays(np.float64, shape, elements=st.integers(-3, 3).map(float)))
        frac = data.draw(hnp.arrays(np.float64, shape, elements=st.sampled_from([0.2, 0.5, 0.8])))
        return [(q + frac) * y, y], {}
    return draw


def with_params(draw_args, **choices):
    """``draw_args``'s inputs plus keyword parameters drawn from ``choices`` (name: list)."""
    def draw(data):
        args, params = draw_args(data)
        for k, options in choices.items():
            params[k] = data.draw(st.sampled_from(options))
        return args, params
    return draw


def matrices(kind):
    """Square matrices that are well conditioned ("general") or symmetric positive definite."""
    def draw(data):
        n = data.draw(st.sampled_from([2, 3]))
        a = data.draw(f64((n, n), -1.0, 1.0))
        if kind == "spd":
            a = a @ a.T + n * np.eye(n)
        else:
            a = a + 3.0 * np.eye(n)
        return [a], {}
    return draw


def matrix_and_rhs(vector):
    def draw(data):
        (a,), _ = matrices("general")(data)
        n = a.shape[0]
        b = data.draw(f64((n,) if vector else (n, 2)))
        return [a, b], {}
    return draw


def fixed_shapes(*shapes, lo=-3.0, hi=3.0):
    def draw(data):
        return [data.draw(f64(s, lo, hi)) for s in shapes], {}
    return draw


# -- the cases ----------------------------------------------------------------------------------

class Case:
    """One function: vkml's ``vk``, autograd's ``ag`` (None: autograd cannot differentiate it, so
    its gradient is checked against central differences only), NumPy's ``ref`` (default ``ag``),
    ``draw(data) -> (args, params)``; ``batch`` makes vmap's second example ("permute" the
    elements, "transpose" the matrices, or a function of the args)."""

    def __init__(self, name, vk, ag, draw, ref=None, grad=True, second=False, batch="permute",
                 rtol=1e-12):
        self.name, self.vk, self.ag, self.draw = name, vk, ag, draw
        self.ref = ref or ag
        self.grad, self.second, self.batch, self.rtol = grad, second, batch, rtol

    def __repr__(self):
        return self.name


def same(name, draw, **kw):
    """A case whose autograd twin has the same name."""
    return Case(name, getattr(vnp, name), getattr(anp, name), draw, **kw)


def _floor_ref(x):
    return np.floor(x)


def ag_sort(x, axis=-1):
    """autograd's sort is 1-D only: pick the elements in NumPy's order with an index."""
    order = np.argsort(getval(x), axis=axis)
    grid = list(np.indices(order.shape, sparse=True))
    grid[axis] = order
    return x[tuple(grid)]


UNARY = [
    same("tan", unary(-1.2, 1.2), second=True),
    same("sinh", unary(), second=True),
    same("cosh", unary(), second=True),
    same("arcsin", unary(-0.9, 0.9), second=True),
    same("arccos", unary(-0.9, 0.9)),
    same("arctan", unary(-5, 5), second=True),
    same("arcsinh", unary(-5, 5), second=True),
    same("arccosh", unary(1.1, 5.0)),
    same("arctanh", unary(-0.9, 0.9), second=True),
    same("log1p", unary(-0.9, 3.0), second=True),
    same("expm1", unary(), second=True),
    same("log2", unary(0.1, 3.0)),
    same("log10", unary(0.1, 3.0)),
    same("exp2", unary()),
    same("sqrt", unary(0.1, 3.0)),
    same("exp", unary()),
    same("log", unary(0.1, 3.0)),
    same("sin", unary(-5, 5)),
    same("cos", unary(-5, 5)),
    same("tanh", unary()),
    same("square", unary()),
    same("negative", unary()),
    same("reciprocal", unary_away()),
    same("deg2rad", unary()),
    same("rad2deg", unary()),
    same("absolute", unary_away()),
    same("sign", unary_away()),
    Case("erf", vsp.erf, asp.erf, unary(), ref=scipy.special.erf, second=True),
    Case("expit", vsp.expit, asp.expit, unary(-6, 6)),
    Case("logit", vsp.logit, asp.logit, unary(0.05, 0.95)),
] + [same(n, off_integers()) for n in ("floor", "ceil", "trunc", "rint")] + [
    Case("round(decimals=1)", lambda x: vnp.round(x, 1), lambda x: anp.round(x, 1),
         off_integers((0.12, 0.33, 0.67, 0.88)), ref=lambda x: np.round(x, 1)),
    Case("nan_to_num(finite)", vnp.nan_to_num, anp.nan_to_num, unary()),
]

BINARY = [
    same("arctan2", binary(y=(0.3, 3.0)), second=True),          # x > 0: off the branch cut
    same("logaddexp", binary(), second=True),
    same("hypot", binary((0.3, 3), (0.3, 3))),
    same("power", binary((0.3, 3.0), (-2.0, 2.0))),
    same("add", binary()),
    same("subtract", binary()),
    same("multiply", binary()),
    same("divide", binary(y=(0.3, 3.0), y_away=True)),
    same("maximum", distinct_values(2)),
    same("minimum", distinct_values(2)),
    same("mod", remainder_pair()),
    same("remainder", remainder_pair()),
    Case("fmod", vnp.fmod, None, remainder_pair(), ref=np.fmod),
    same("floor_divide", remainder_pair()),
]

AXES = [None, 0, -1, (0, 1)]

REDUCTIONS = [
    Case(f"{n}", getattr(vnp, n), getattr(anp, n),
         with_params(fixed_shapes((2, 3)), axis=AXES, keepdims=[False, True]))
    for n in ("sum", "mean")
] + [
    # away from zero: autograd's derivative of prod divides by the elements
    Case("prod", vnp.prod, anp.prod, with_params(lambda data: ([data.draw(O.away_from((2, 3), 0.3, 2.0))], {}),
                                                 axis=AXES, keepdims=[False, True])),
] + [
    Case(n, getattr(vnp, n), getattr(anp, n),
         with_params(distinct_of((2, 3)), axis=AXES, keepdims=[False, True], ddof=[0, 1]))
    for n in ("var", "std")                             # distinct: std's sqrt away from 0
] + [
    Case(n, getattr(vnp, n), getattr(anp, n), with_params(distinct_values(), axis=[None, -1],
                                                          keepdims=[False, True]))
    for n in ("max", "min", "amax", "amin")
] + [
    Case("ptp", vnp.ptp, anp.ptp, with_params(distinct_values(), axis=[None, -1]), grad=False),
    Case("logsumexp", vsp.logsumexp, asp.logsumexp,
         with_params(fixed_shapes((2, 3)), axis=AXES, keepdims=[False, True])),
    Case("cumsum", vnp.cumsum, anp.cumsum, with_params(fixed_shapes((2, 3)), axis=[None, 0, -1])),
    Case("cumprod", vnp.cumprod, None, with_params(fixed_shapes((2, 5)), axis=[None, 0, -1]),
         ref=np.cumprod),
    Case("cumprod(with zeros)", lambda x: vnp.cumprod(x * (vnp.arange(5) != 2)),
         None, fixed_shapes((5,)), ref=lambda x: np.cumprod(x * (np.arange(5) != 2))),
    Case("prod(with zeros)", lambda x: vnp.prod(x * (vnp.mod(vnp.arange(5), 2) == 1), axis=-1),
         None, fixed_shapes((2, 5)), ref=lambda x: np.prod(x * (np.arange(5) % 2 == 1), axis=-1)),
    Case("sort", vnp.sort, ag_sort, with_params(distinct_values(), axis=[-1, 0]), ref=np.sort),
    Case("sort(axis=None)", lambda x: vnp.sort(x, axis=None), lambda x: ag_sort(anp.ravel(x)),
         distinct_values(), ref=lambda x: np.sort(x, axis=None)),
    Case("argsort", vnp.argsort, np.argsort, with_params(distinct_values(), axis=[-1, 0]),
         grad=False),
    Case("argmax", vnp.argmax, np.argmax, with_params(distinct_values(), axis=[None, -1]),
         grad=False),
    Case("argmin", vnp.argmin, np.argmin, with_params(distinct_values(), axis=[None, -1]),
         grad=False),
]


def ag_diagonal(x, offset=0, axis1=0, axis2=1):
    """autograd's diagonal takes only the main one: index it out instead."""
    m = anp.moveaxis(anp.moveaxis(x, axis1, -1), axis2 if axis2 < axis1 else axis2 - 1, -1) \
        if x.ndim > 2 else (x if axis1 < axis2 else x.T)
    rows, cols = m.shape[-2:]
    r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
    d = max(0, min(rows - r0, cols - c0))
    return m[..., np.arange(d) + r0, np.arange(d) + c0]


def _pieces(split):
    """A function of the pieces ``split`` cuts (each weighted differently, so all matter)."""
    def f(x, **kw):
        pieces = split(x, **kw)
        return sum((p * (i + 1.0)).sum(axis=-1) for i, p in enumerate(pieces))
    return f


def _ag_pieces(split):
    def f(x, indices_or_sections, axis):
        pieces = split(x, indices_or_sections, axis)
        return sum(anp.sum(p * (i + 1.0), axis=-1) for i, p in enumerate(pieces))
    return f


def _grid(mesh):
    def f(a, b, **kw):
        g1, g2 = mesh(a, b, **kw)
        return g1 * 2.0 + g2 * g2
    return f


MOVEMENT = [
    Case("roll", vnp.roll, anp.roll, with_params(fixed_shapes((2, 3)), shift=[1, -2, 4],
                                                axis=[None, 0, -1])),
    Case("repeat", vnp.repeat, anp.repeat, with_params(fixed_shapes((2, 3)), repeats=[2, 3],
                                                      axis=[None, 0, 1])),
    Case("repeat(per element)", lambda x: vnp.repeat(x, [1, 0, 2], axis=1),
         lambda x: x[:, [0, 2, 2]], fixed_shapes((2, 3))),
    Case("tile", vnp.tile, np.tile, with_params(fixed_shapes((2, 3)), reps=[2, (2, 1), (2, 1, 2)])),
    Case("flip", vnp.flip, lambda x, axis: {None: x[::-1, ::-1], 0: x[::-1], 1: x[:, ::-1]}[axis],
         with_params(fixed_shapes((2, 3)), axis=[None, 0, 1]), ref=np.flip),
    Case("transpose", vnp.transpose, anp.transpose, fixed_shapes((2, 3, 2))),
    Case("moveaxis", vnp.moveaxis, anp.moveaxis,
         with_params(fixed_shapes((2, 3, 4)), source=[0, -1], destination=[1, 2])),
    Case("swapaxes", vnp.swapaxes, anp.swapaxes, with_params(fixed_shapes((2, 3, 4)), axis1=[0],
                                                            axis2=[1, 2])),
    Case("diagonal", vnp.diagonal, ag_diagonal,
         with_params(fixed_shapes((3, 4)), offset=[0, 1, -1, 3]), ref=np.diagonal),
    Case("diagonal(3-d)", lambda x: vnp.diagonal(x, 1, 2, 0), lambda x: ag_diagonal(x, 1, 2, 0),
         fixed_shapes((3, 2, 4)), ref=lambda x: np.diagonal(x, 1, 2, 0)),
    Case("trace", vnp.trace, anp.trace, with_params(fixed_shapes((3, 4)), offset=[0, 1, -2])),
    Case("diag(vector)", vnp.diag, anp.diag, with_params(fixed_shapes((3,)), k=[0, 1, -2])),
    Case("diag(matrix)", vnp.diag, lambda x, k: ag_diagonal(x, k),
         with_params(fixed_shapes((3, 3)), k=[0, 1, -1]), ref=np.diag),
    Case("triu", vnp.triu, anp.triu, with_params(fixed_shapes((3, 4)), k=[0, 1, -1])),
    Case("tril", vnp.tril, anp.tril, with_params(fixed_shapes((2, 3, 3)), k=[0, 1, -1])),
    Case("take", lambda x, axis: vnp.take(x, [2, 0, 2], axis=axis),
         lambda x, axis: {None: anp.ravel(x)[[2, 0, 2]], 0: x[[2, 0, 2]], 1: x[:, [2, 0, 2]]}[axis],
         with_params(fixed_shapes((3, 3)), axis=[None, 0, 1])),
    Case("concatenate", lambda a, b: vnp.concatenate([a, b], axis=1),
         lambda a, b: anp.concatenate([a, b], axis=1), fixed_shapes((2, 3), (2, 1))),
    Case("stack", lambda a, b: vnp.stack([a, b], axis=-1), lambda a, b: anp.stack([a, b], axis=-1),
         fixed_shapes((2, 3), (2, 3))),
    Case("hstack", lambda a, b: vnp.hstack([a, b]), lambda a, b: anp.hstack([a, b]),
         fixed_shapes((3,), (2,))),
    Case("vstack", lambda a, b: vnp.vstack([a, b]), lambda a, b: anp.vstack([a, b]),
         fixed_shapes((3,), (2, 3))),
    Case("split", _pieces(vnp.split), _ag_pieces(anp.split),
         with_params(fixed_shapes((2, 6)), indices_or_sections=[2, 3, [1, 4]], axis=[-1])),
    Case("array_split", _pieces(vnp.array_split), _ag_pieces(anp.array_split),
         with_params(fixed_shapes((2, 5)), indices_or_sections=[2, 3], axis=[-1])),
    Case("meshgrid", _grid(vnp.meshgrid), None,
         with_params(fixed_shapes((3,), (2,)), indexing=["xy", "ij"]), ref=_grid(np.meshgrid)),
    Case("reshape", lambda x: vnp.reshape(x, (3, -1)), lambda x: anp.reshape(x, (3, -1)),
         fixed_shapes((2, 3))),
    Case("ravel", vnp.ravel, anp.ravel, fixed_shapes((2, 3))),
    # autograd's where does not sum a broadcast operand's gradient back: the same choice as products
    Case("where", lambda x, y: vnp.where(x > 0, x, y), lambda x, y: x * (x > 0) + y * (x <= 0),
         lambda data: ([data.draw(O.away_from((2, 3), 0.1, 3.0)), data.draw(f64((3,)))], {}),
         ref=lambda x, y: np.where(x > 0, x, y)),
    Case("clip", lambda x: vnp.clip(x, -1.0, 1.0), lambda x: anp.clip(x, -1.0, 1.0),
         unary_away(0.1, 0.9)),
]

PRODUCTS = [
    Case("outer", vnp.outer, lambda a, b: anp.outer(anp.ravel(a), anp.ravel(b)),
         fixed_shapes((3,), (2, 2)), ref=np.outer),
    same("inner", fixed_shapes((2, 3), (3,))),
    Case("dot(1-d)", vnp.dot, anp.dot, fixed_shapes((3,), (3,))),
    Case("dot(2-d)", vnp.dot, anp.dot, fixed_shapes((2, 3), (3, 2))),
    Case("dot(3-d)", vnp.dot, anp.dot, fixed_shapes((2, 2, 3), (4, 3, 2))),
    Case("vdot", vnp.vdot, lambda a, b: anp.sum(anp.ravel(a) * anp.ravel(b)),
         fixed_shapes((2, 3), (3, 2)), ref=np.vdot),
    Case("matmul", vnp.matmul, anp.matmul, fixed_shapes((2, 2, 3), (3, 2))),
    Case("tensordot", vnp.tensordot, anp.tensordot,
         with_params(fixed_shapes((2, 3, 4), (3, 4, 2)), axes=[2, ([1], [0])])),
    Case("tensordot(0)", lambda a, b: vnp.tensordot(a, b, 0), lambda a, b: anp.tensordot(a, b, 0),
         fixed_shapes((2,), (3,))),
] + [
    Case(f"einsum({spec})", (lambda s: lambda *xs: vnp.einsum(s, *xs))(spec),
         # autograd cannot differentiate an einsum that takes a diagonal
         None if "ii" in spec else (lambda s: lambda *xs: anp.einsum(s, *xs))(spec),
         fixed_shapes(*shapes), ref=(lambda s: lambda *xs: np.einsum(s, *xs))(spec))
    for spec, shapes in [
        ("ij,jk->ik", [(2, 3), (3, 4)]),
        ("ij,jk", [(2, 3), (3, 4)]),
        ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]),
        ("ii->i", [(3, 3)]),
        ("ii", [(3, 3)]),
        ("ij->ji", [(2, 3)]),
        ("ij->", [(2, 3)]),
        ("i,i->", [(3,), (3,)]),
        ("i,j->ij", [(3,), (2,)]),
        ("ijk,kj->i", [(2, 3, 4), (4, 3)]),
        ("ij,jk,kl->il", [(2, 3), (3, 2), (2, 4)]),
        ("iij->ji", [(2, 2, 3)]),
    ]
]


def _transpose_and_negate(args):
    """A second (matrix, right-hand side) example of the same shapes, as well conditioned."""
    a, b = args
    return [a.T, -b]


LINALG = [
    Case("linalg.solve(vector)", vnp.linalg.solve, anp.linalg.solve, matrix_and_rhs(True),
         rtol=1e-10, batch=_transpose_and_negate),
    Case("linalg.solve(matrix)", vnp.linalg.solve, anp.linalg.solve, matrix_and_rhs(False),
         rtol=1e-10, batch=_transpose_and_negate, second=True),
    Case("linalg.inv", vnp.linalg.inv, anp.linalg.inv, matrices("general"), rtol=1e-10,
         batch="transpose", second=True),
    Case("linalg.det", vnp.linalg.det, anp.linalg.det, matrices("general"), rtol=1e-10,
         batch="transpose", second=True),
    Case("linalg.slogdet", lambda a: vnp.linalg.slogdet(a)[1], lambda a: anp.linalg.slogdet(a)[1],
         matrices("general"), rtol=1e-10, batch="transpose"),
    Case("linalg.cholesky", lambda a: vnp.linalg.cholesky(a @ vnp.transpose(a) + 3.0 * vnp.eye(a.shape[0])),
         lambda a: anp.linalg.cholesky(anp.dot(a, a.T) + 3.0 * np.eye(a.shape[0])),
         matrices("general"), rtol=1e-10, batch="transpose"),
    Case("linalg.norm", vnp.linalg.norm, anp.linalg.norm,
         with_params(distinct_of((4,)), ord=[None, 2, 3]), rtol=1e-10),
    Case("linalg.norm(1/inf/-inf/0.5)", vnp.linalg.norm, None,     # autograd has no derivative
         with_params(distinct_of((4,)), ord=[1, np.inf, -np.inf, 0.5]), ref=np.linalg.norm,
         rtol=1e-10),
    Case("linalg.norm(matrix)", vnp.linalg.norm, anp.linalg.norm,
         with_params(fixed_shapes((3, 3), lo=0.2, hi=3.0), ord=["fro", None]), rtol=1e-10),
    Case("linalg.norm(matrix, 1/inf)", vnp.linalg.norm, None,         # distinct: no tied sums
         with_params(distinct_of((3, 3)), ord=[1, np.inf, -1]),
         ref=np.linalg.norm, rtol=1e-10),
    Case("linalg.norm(axis)", lambda x: vnp.linalg.norm(x, axis=-1, keepdims=True),
         # autograd's norm loses keepdims in its derivative: the same norm written out
         lambda x: anp.sqrt(anp.sum(x * x, axis=-1, keepdims=True)), fixed_shapes((2, 3), lo=0.2),
         ref=lambda x: np.linalg.norm(x, axis=-1, keepdims=True)),
]

def _with_specials(draw_args):
    """Inputs with NaN, +-inf and zeros mixed in (for the predicates)."""
    def draw(data):
        (x,), params = draw_args(data)
        specials = np.array([np.nan, np.inf, -np.inf, 0.0])
        picks = data.draw(hnp.arrays(np.int64, x.shape, elements=st.integers(0, 7)))
        return [np.where(picks < 4, specials[np.minimum(picks, 3)], x)], params
    return draw


PREDICATES = [
    Case(n, getattr(vnp, n), None, _with_specials(unary()), ref=getattr(np, n), grad=False)
    for n in ("isnan", "isinf", "isfinite")
] + [
    Case("nan_to_num(specials)", vnp.nan_to_num, None, _with_specials(unary()), ref=np.nan_to_num,
         grad=False),
    Case("any", vnp.any, None, with_params(_with_specials(unary()), axis=[None, -1]), ref=np.any,
         grad=False),
    Case("all", vnp.all, None, with_params(_with_specials(unary()), axis=[None, -1],
                                           keepdims=[False, True]), ref=np.all, grad=False),
    Case("count_nonzero", vnp.count_nonzero, None, _with_specials(unary()),
         ref=lambda x: np.asarray(np.count_nonzero(x), np.int64), grad=False),
] + [
    Case(n, getattr(vnp, n), None, binary(), ref=getattr(np, n), grad=False)
    for n in ("less", "greater_equal", "equal")
]

CASES = UNARY + BINARY + REDUCTIONS + MOVEMENT + PRODUCTS + LINALG + PREDICATES


# -- the checks ------------------------------------------------------------------------------------

def _floats(x):
    return np.asarray(x, dtype=np.float64)


def _close(got, want, rtol, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=what)


def check_value(case, args, params):
    got = case.vk(*args, **params)
    want = np.asarray(case.ref(*args, **params))
    value = got.numpy()
    assert value.dtype == O.canonical(want.dtype), (value.dtype, want.dtype)
    assert (tuple(got.shape), got.dtype) == (value.shape, value.dtype)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(value, want)
    else:
        _close(value, want, case.rtol, f"{case.name}: value")


def _weights(case, args, params):
    out = np.asarray(case.ref(*args, **params))
    return O.weights_like(out.shape, case.name, tuple(np.shape(a) for a in args))


def check_gradients(case, args, params):
    f_vk = lambda *xs: case.vk(*xs, **params)          # noqa: E731
    f_ag = lambda *xs: case.ag(*xs, **params)          # noqa: E731
    if case.ag is None:
        _check_fd_only(case, f_vk, args)
        return None
    want = O.check_grad(f_vk, f_ag, *args, rtol=1e-9, key=case.name)
    # the traced program's gradient (vkml.grad) against autograd's as well
    w = _weights(case, args, params)
    n = len(args)
    grads = vkml.grad(lambda *xs: vnp.sum(f_vk(*xs) * w), argnums=tuple(range(n)))(*args)
    for i, (g, r) in enumerate(zip(grads, want)):
        _close(g.numpy(), r, 1e-9, f"{case.name}: vkml.grad of argument {i}")
    return want


def _check_fd_only(case, f_vk, args):
    """Functions autograd cannot differentiate: vkml's gradient against central differences."""
    out = np.asarray(f_vk(*args).numpy())
    w = O.weights_like(out.shape, case.name)
    wrt = list(range(len(args)))
    got = O.vkml_grads(f_vk, args, wrt, w)
    for g, (kind, fd) in zip(got, O.finite_difference_grads(f_vk, args, wrt, w)):
        assert kind == "full"
        _close(g, fd, 1e-5, f"{case.name}: gradient against central differences")


def check_jvp(case, args, params, grads):
    f = lambda *xs: case.vk(*xs, **params)             # noqa: E731
    rng = O.rng_for(case.name, "tangent")
    vs = [rng.normal(size=np.shape(a)) for a in args]
    out, tangent = vkml.jvp(f, tuple(args), tuple(vs))
    tangent = tangent.numpy()
    h = 1e-6
    plus = case.ref(*[a + h * v for a, v in zip(args, vs)], **params)
    minus = case.ref(*[a - h * v for a, v in zip(args, vs)], **params)
    fd = (_floats(plus) - _floats(minus)) / (2 * h)
    _close(tangent, fd, 1e-5, f"{case.name}: jvp against central differences")
    if grads is not None:                   # <jvp(v), w> = <v, grad <f, w>> with autograd's grad
        w = _weights(case, args, params)
        _close(np.sum(tangent * w), sum(np.sum(g * v) for g, v in zip(grads, vs)), 1e-9,
               f"{case.name}: jvp against autograd's gradient")


def _second_example(case, args):
    if callable(case.batch):
        return case.batch(args)
    if case.batch == "transpose":
        return [np.swapaxes(a, -1, -2) for a in args]
    rng = O.rng_for(case.name, "batch")
    return [rng.permutation(a.ravel()).reshape(a.shape) if a.ndim else a for a in args]


def check_vmap(case, args, params):
    others = _second_example(case, args)
    batched = [np.stack([a, b]) for a, b in zip(args, others)]
    got = vkml.vmap(lambda *xs: case.vk(*xs, **params))(*batched)
    want = np.stack([np.asarray(case.ref(*a, **params)) for a in (args, others)])
    value = got.numpy()
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(value, want)
    else:
        _close(value, want, max(case.rtol, 1e-12), f"{case.name}: vmap")


def check_second_order(case, args, params):
    x = args[0]
    rest = args[1:]
    w = _weights(case, args, params)
    w2 = O.rng_for(case.name, "second").normal(size=np.shape(x))

    def inner_vk(y):
        return vnp.sum(case.vk(y, *rest, **params) * w)

    def outer_vk(y):
        return vnp.sum(vkml.grad(inner_vk)(y) * w2)

    def inner_ag(y):
        return anp.sum(case.ag(y, *rest, **params) * w)

    def outer_ag(y):
        return anp.sum(autograd.grad(inner_ag)(y) * w2)

    got = vkml.grad(outer_vk)(x).numpy()
    want = autograd.grad(outer_ag)(x)
    _close(got, want, 1e-8, f"{case.name}: second derivative")


@pytest.mark.parametrize("case", CASES, ids=repr)
@SMALL
@given(data=st.data())
def test_function(case, data):
    args, params = case.draw(data)
    check_value(case, args, params)
    grads = check_gradients(case, args, params) if case.grad else None
    if case.grad:
        check_jvp(case, args, params, grads)
    check_vmap(case, args, params)
    if case.second:
        check_second_order(case, args, params)
