"""``vkml.numpy`` as a namespace: its names, documented examples, NumPy's dtype rules, special
values, the inputs it accepts and the errors it raises (numerics and derivatives are in
``test_numpy_systematic``)."""

from __future__ import annotations

import doctest
import inspect

from types import SimpleNamespace

import numpy as np
import pytest
import scipy.special

import vkml
import vkml.numpy as vnp
import vkml.numpy.linalg
import vkml.scipy.special as vsp
from vkml.errors import ArgumentError, DTypeError, ShapeError, VkmlError


def _public(module):
    return [(name, fn) for name, fn in vars(module).items()
            if callable(fn) and not name.startswith("_") and not inspect.ismodule(fn)
            and getattr(fn, "__module__", "").startswith("vkml.")
            and fn.__module__.split(".")[1] in ("numpy", "scipy")]


FUNCTIONS = _public(vnp) + [(f"linalg.{n}", f) for n, f in _public(vnp.linalg)] + \
    [(f"scipy.special.{n}", f) for n, f in _public(vsp)]


def test_the_namespace_has_the_names_numpy_users_reach_for():
    wanted = """tan sinh cosh arcsin arccos arctan arctan2 arcsinh arctanh log1p expm1 log2 log10 exp2
        floor ceil round mod logaddexp isnan isinf isfinite nan_to_num prod cumsum cumprod var std
        any all outer tensordot einsum trace diag diagonal roll triu tril repeat tile split stack
        sort argsort eye linspace meshgrid sin cos exp log sqrt abs sum mean max min argmax matmul
        dot where reshape transpose concatenate clip maximum minimum array asarray""".split()
    missing = [n for n in wanted if not callable(getattr(vnp, n, None))]
    assert not missing, missing
    for n in ("norm", "solve", "inv", "det", "slogdet", "cholesky"):
        assert callable(getattr(vkml.numpy.linalg, n)), n
    assert vsp.erf is vkml.scipy.special.erf
    assert vkml.numpy is vnp and len(FUNCTIONS) > 130


@pytest.mark.parametrize("name,fn", FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_every_function_has_a_docstring_whose_example_runs_as_shown(name, fn):
    doc = fn.__doc__
    assert doc and ">>> " in doc, f"{name} has no example"
    globs = {"vnp": vnp, "vkml": vkml}
    test = doctest.DocTestParser().get_doctest(doc, globs, name, None, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0 and runner.tries >= 2, name


#: the examples evaluated with NumPy and SciPy in place of vkml.numpy and vkml.scipy
REFERENCE = {"vnp": np, "vkml": SimpleNamespace(scipy=SimpleNamespace(special=scipy.special))}


@pytest.mark.parametrize("name,fn", FUNCTIONS, ids=[n for n, _ in FUNCTIONS])
def test_every_documented_example_agrees_with_numpy(name, fn):
    example = fn.__doc__.split(">>> ")[-1].splitlines()[0]
    got = eval(example, {"vnp": vnp, "vkml": vkml})
    try:
        want = eval(example, REFERENCE)
    except (TypeError, AttributeError):
        pytest.skip("NumPy does not take lists here")
    pairs = zip(got, want) if isinstance(got, (list, tuple)) and not isinstance(got, tuple) or \
        isinstance(got, tuple) and isinstance(got[0], vkml.Tensor) else [(got, want)]
    for g, w in pairs:
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert g.dtype == w.dtype, (name, g.dtype, w.dtype)
        if name in ("empty", "empty_like"):       # NumPy's values are whatever memory held
            continue
        np.testing.assert_allclose(g.astype(float), w.astype(float), rtol=1e-12, equal_nan=True)


def test_numpys_dtype_rules():
    f32 = np.array([0.5, 1.5], np.float32)
    i32 = np.array([1, 2], np.int32)
    for name in ("tan", "arcsinh", "log1p", "exp2", "log2", "cosh"):
        assert getattr(vnp, name)(f32).dtype == np.float32, name
        assert getattr(vnp, name)(i32).dtype == np.float64, name
    assert vnp.multiply(f32, 2.0).dtype == np.float32          # Python numbers are weak
    assert vnp.multiply(f32, np.float64(2.0)).dtype == np.float64
    assert vnp.sum(i32).dtype == vnp.prod(i32).dtype == vnp.cumsum(i32).dtype == np.int64
    assert vnp.prod([True, False]).dtype == np.int64
    assert vnp.mean(i32).dtype == vnp.var(i32).dtype == np.float64
    assert vnp.floor(i32).dtype == np.int32 and vnp.floor(f32).dtype == np.float32
    assert vnp.argsort(f32).dtype == np.int64
    assert vnp.zeros(3).dtype == vnp.eye(2).dtype == vnp.linspace(0, 1, 3).dtype == np.float64
    assert vnp.array([1, 2]).dtype == np.int64 and vnp.array([1.0], vnp.float32).dtype == np.float32
    np.testing.assert_array_equal(vnp.mod([5, -5, 5, 0], [3, 3, 0, 2]).numpy(),
                                  np.mod([5, -5, 5, 0], [3, 3, 1, 2]) * [1, 1, 0, 1])
    np.testing.assert_array_equal(vnp.round([125, -150], -2).numpy(), [100, -200])


def test_special_values_as_numpy_has_them():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -2.5, 1e308])
    for name in ("isnan", "isinf", "isfinite"):
        np.testing.assert_array_equal(getattr(vnp, name)(x).numpy(), getattr(np, name)(x))
    np.testing.assert_array_equal(vnp.nan_to_num(x).numpy(), np.nan_to_num(x))
    np.testing.assert_array_equal(vnp.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-3.0).numpy(),
                                  np.nan_to_num(x, nan=1.0, posinf=2.0, neginf=-3.0))
    assert not vnp.isnan([1, 2]).numpy().any()
    with np.errstate(all="ignore"):
        for name in ("logaddexp", "arctan2", "mod", "fmod", "floor_divide"):
            y = x[::-1]
            np.testing.assert_allclose(getattr(vnp, name)(x, y).numpy(), getattr(np, name)(x, y),
                                       rtol=1e-15, equal_nan=True, err_msg=name)
        for name in ("arcsinh", "arccosh", "arctanh", "sinh", "cosh", "tan", "expm1", "log1p",
                     "arcsin", "arccos", "arctan", "exp2", "log2", "log10", "rint", "floor"):
            np.testing.assert_allclose(getattr(vnp, name)(x).numpy(), getattr(np, name)(x),
                                       rtol=1e-15, equal_nan=True, err_msg=name)


def test_accuracy_where_a_naive_formula_loses_digits():
    tiny = np.array([1e-300, -3e-20, 2e-10, 1e-5])
    for name in ("log1p", "expm1", "sinh", "arcsinh", "arctanh", "arcsin", "arctan", "tan"):
        got = getattr(vnp, name)(tiny).numpy()
        np.testing.assert_allclose(got, getattr(np, name)(tiny), rtol=4e-16, err_msg=name)
    near_one = 1.0 - np.array([1e-9, 1e-12, 2.0 ** -40])
    for name in ("arcsin", "arccos", "arctanh"):
        np.testing.assert_allclose(getattr(vnp, name)(near_one).numpy(), getattr(np, name)(near_one),
                                   rtol=4e-15, err_msg=name)
    big = np.array([1e10, 1e200, -1e300, 3e8])
    np.testing.assert_allclose(vnp.arcsinh(big).numpy(), np.arcsinh(big), rtol=4e-16)
    np.testing.assert_allclose(vnp.arccosh(np.abs(big)).numpy(), np.arccosh(np.abs(big)), rtol=4e-16)
    np.testing.assert_allclose(vnp.logaddexp(1000.0, [1000.0, -1000.0]).numpy(),
                               np.logaddexp(1000.0, [1000.0, -1000.0]), rtol=1e-15)


def test_lists_scalars_and_tensors_are_arrays():
    assert vnp.add(1.0, 2).item() == 3.0
    assert vnp.outer((1, 2), [3, 4]).numpy().tolist() == [[3, 4], [6, 8]]
    t = vkml.tensor(np.array([1.0, 2.0]), requires_grad=True)
    assert vnp.asarray(t) is t
    stacked = vnp.array([t, t * 3.0])
    vnp.sum(stacked * stacked).backward()
    np.testing.assert_allclose(t.grad.numpy(), 2 * t.numpy() + 18 * t.numpy())
    parts = vnp.split(t, 2)
    assert [p.requires_grad for p in parts] == [True, True]
    a = vkml.tensor(np.array([[2.0, 1.0], [0.5, 3.0]]), requires_grad=True)
    sign, logabs = vnp.linalg.slogdet(a)
    assert isinstance(vnp.linalg.slogdet(a), tuple) and logabs.requires_grad
    (logabs * sign).backward()
    np.testing.assert_allclose(a.grad.numpy(), np.linalg.inv(a.numpy()).T, rtol=1e-12)
    with vkml.eager():
        np.testing.assert_allclose(vnp.cumsum(vnp.arange(4)).numpy(), [0, 1, 3, 6])


@pytest.mark.parametrize("call,error", [
    (lambda: vnp.einsum("ij,jk->ik", np.ones((2, 3)), np.ones((2, 3))), ShapeError),
    (lambda: vnp.einsum("i...", np.ones(3)), ArgumentError),
    (lambda: vnp.einsum("ij->k", np.ones((2, 2))), ArgumentError),
    (lambda: vnp.einsum(3, np.ones(3)), ArgumentError),
    (lambda: vnp.linalg.solve(np.eye(3), np.ones(2)), ShapeError),
    (lambda: vnp.linalg.inv(np.ones((2, 3))), ShapeError),
    (lambda: vnp.linalg.det(np.ones(3)), ShapeError),
    (lambda: vnp.linalg.norm(np.ones((2, 2)), 3), ArgumentError),
    (lambda: vnp.linalg.norm(np.ones((2, 2, 2)), axis=(0, 1, 2)), ShapeError),
    (lambda: vnp.split(np.ones(5), 2), ShapeError),
    (lambda: vnp.split(np.ones(5), 0), ArgumentError),
    (lambda: vnp.repeat(np.ones(3), -1), ArgumentError),
    (lambda: vnp.repeat(np.ones(3), [1, 2]), ArgumentError),
    (lambda: vnp.tile(np.ones(3), -2), ArgumentError),
    (lambda: vnp.round(np.ones(3), 1.5), ArgumentError),
    (lambda: vnp.var(np.ones(2), ddof=2), ShapeError),
    (lambda: vnp.diagonal(np.ones(3)), ShapeError),
    (lambda: vnp.diagonal(np.ones((2, 2)), 0, 1, 1), ShapeError),
    (lambda: vnp.diag(np.ones((2, 2, 2))), ShapeError),
    (lambda: vnp.triu(np.ones(3)), ShapeError),
    (lambda: vnp.tensordot(np.ones((2, 3)), np.ones((2, 3)), 1), ShapeError),
    (lambda: vnp.tensordot(np.ones((2, 3)), np.ones((2, 3)), ([0, 1], [0])), ShapeError),
    (lambda: vnp.moveaxis(np.ones((2, 3)), (0, 1), 0), ArgumentError),
    (lambda: vnp.roll(np.ones((2, 3)), (1, 2, 3), (0, 1)), ArgumentError),
    (lambda: vnp.meshgrid([1, 2], indexing="xyz"), ArgumentError),
    (lambda: vnp.sort(np.ones(3), axis=2), ShapeError),
    (lambda: vnp.cumsum(np.ones(3), axis=-2), ShapeError),
    (lambda: vnp.array("abc"), ArgumentError),
    (lambda: vnp.array([[1, 2], [3]]), ArgumentError),
    (lambda: vnp.tan(np.ones(2), bogus=1), ArgumentError),
    (lambda: vnp.add(np.ones(2), np.ones(3)), ShapeError),
    (lambda: vnp.astype(np.ones(2), "float16"), DTypeError),
    # found by the fuzz suite (each leaked a TypeError, ValueError or OverflowError, or hung)
    *[(lambda f=f: f(None), ArgumentError) for f in (vnp.zeros, vnp.ones, vnp.eye, vnp.identity,
                                                     vnp.hstack, vnp.vstack, vnp.arange)],
    (lambda: vnp.full(None, 1.0), ArgumentError),
    (lambda: vnp.linspace(None, 1.0), ArgumentError),
    (lambda: vnp.linspace(0.0, 1.0, 2 ** 70), ArgumentError),
    (lambda: vnp.arange(-(2 ** 70)), ArgumentError),
    (lambda: vnp.arange(0, 3, 0), ArgumentError),
    (lambda: vnp.arange(5, dtype=bool), ArgumentError),
    (lambda: vnp.split(np.ones(4), None), ArgumentError),
    (lambda: vnp.array_split(np.ones(4), 2 ** 70), ArgumentError),
    (lambda: vnp.tile(np.ones(3), None), ArgumentError),
    (lambda: vnp.roll(np.ones(3), None), ArgumentError),
    (lambda: vnp.repeat(np.ones(2), [[1], [1, 2]]), ArgumentError),
    *[(lambda f=f: f(np.ones(2), dtype="abc"), DTypeError)
      for f in (vnp.zeros_like, vnp.ones_like)],
    (lambda: vnp.full_like(np.ones(2), 1.0, dtype="abc"), DTypeError),
    (lambda: vnp.zeros(3, dtype=np.array([True])), DTypeError),
    (lambda: vnp.round(np.ones(2), 2 ** 70), ArgumentError),
    (lambda: vnp.around(np.ones(2), -(2 ** 70)), ArgumentError),
    (lambda: vnp.std(np.ones(3), ddof=None), ArgumentError),
    (lambda: vnp.var(np.ones(3), ddof="1"), ArgumentError),
    *[(lambda f=f: f(np.ones((2, 2)), None), ArgumentError)
      for f in (vnp.diag, vnp.diagonal, vnp.trace, vnp.tril, vnp.triu)],
    (lambda: vnp.diag(np.ones(2), 2 ** 70), ShapeError),
    (lambda: vnp.linalg.norm(np.ones(2), ord=np.array(["a", "b"])), ArgumentError),
    (lambda: vnp.linalg.norm(np.ones(2), ord="max"), ArgumentError),
    (lambda: vnp.meshgrid([1, 2], indexing=np.array(["a", "b"])), ArgumentError),
    (lambda: vnp.prod(np.ones(2), keepdims=np.ones(2)), ArgumentError),
])
def test_bad_input_raises_a_vkml_error_naming_the_function(call, error):
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, VkmlError)


@pytest.mark.parametrize("call, expected", [
    (lambda: vnp.tril(np.ones((2, 3)), 2 ** 70), np.tril(np.ones((2, 3)), 5)),
    (lambda: vnp.triu(np.ones((2, 3)), -(2 ** 70)), np.triu(np.ones((2, 3)), -5)),
    (lambda: vnp.diagonal(np.arange(6.0).reshape(2, 3), 2 ** 70), np.zeros(0)),
    (lambda: vnp.eye(2, 3, k=-(2 ** 70)), np.zeros((2, 3))),
    (lambda: vnp.arange(1, 2, 0.25), np.arange(1, 2, 0.25)),
    (lambda: vnp.linspace([0.0, 1.0], 2.0, 3), np.linspace([0.0, 1.0], 2.0, 3)),
    (lambda: vnp.split(np.arange(6), [2, 4])[2], np.array([4, 5])),
    (lambda: vnp.roll(np.arange(4), [1], 0), np.roll(np.arange(4), 1)),
    (lambda: vnp.zeros(2, dtype=None), np.zeros(2)),
])
def test_offsets_beyond_the_matrix_and_numpy_spellings_still_work(call, expected):
    """A diagonal offset past the corner is clamped (NumPy's C long would overflow), not refused."""
    got = call().numpy()
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_singular_matrices_give_nan_not_an_exception():
    x = vnp.linalg.solve(np.ones((2, 2)), [1.0, 2.0]).numpy()
    assert np.isnan(x).all()
    assert np.isnan(vnp.linalg.inv(np.zeros((2, 2))).numpy()).all()
    assert vnp.linalg.det(np.ones((2, 2))).item() == 0.0
    assert np.isnan(vnp.linalg.cholesky([[1.0, 2.0], [2.0, 1.0]]).numpy()).all()


def test_mod_on_ir_values_is_what_the_percent_operator_can_call():
    """``Tensor.__mod__`` belongs to the tensor layer, which cannot import ``vkml.numpy``: the
    function on IR values, ``vkml.ops.numeric.mod``, is the one it calls."""
    from vkml.ops import api, numeric
    for a, b in [([-7.5, 7.5, 0.5], [2.0, -2.0, 0.25]), ([-7, 7, 3], [2, -2, 0])]:
        out = vkml.Tensor(numeric.mod(api.constant(np.array(a)), api.constant(np.array(b))))
        with np.errstate(all="ignore"):
            np.testing.assert_array_equal(out.numpy(), np.mod(a, b))


#: domains for the ulp measurement below
DOMAINS = {"arcsinh": (-20, 20), "arccosh": (1, 40), "arctanh": (-0.999, 0.999), "sinh": (-20, 20),
           "cosh": (-20, 20), "tan": (-1.5, 1.5), "arcsin": (-1, 1), "arccos": (-1, 1),
           "arctan": (-50, 50), "log2": (1e-3, 1e3), "log10": (1e-3, 1e3), "exp2": (-40, 40),
           "expm1": (-5, 5), "log1p": (-0.999, 30)}


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_composed_functions_stay_within_two_ulps_of_numpy(name):
    x = np.random.default_rng(7).uniform(*DOMAINS[name], 20000)
    want = getattr(np, name)(x)
    ulps = np.abs(getattr(vnp, name)(x).numpy() - want) / np.spacing(np.abs(want))
    assert ulps.max() <= 2.0, (name, ulps.max())
