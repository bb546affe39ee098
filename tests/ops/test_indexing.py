"""Tensor.__getitem__ against NumPy, and its gradient against autograd (eager mode).

Indices are drawn by hypothesis: ints (negative too), slices with any step
(negative too), None, Ellipsis, integer arrays and lists, NumPy bool masks
(1-D and N-D), integer tensors, and mixtures -- including NumPy's rule that
array indices separated by a slice put their dims first, with an int counting
as an array index there.
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import vkml

import oracle as O
from oracle import assert_same, check_grad

pytestmark = pytest.mark.usefixtures("eager")

dtypes = st.sampled_from(O.ALL_DTYPES)


def T(a):
    return vkml.tensor(a)


def as_tensors(index):
    """The same index with its integer arrays passed as vkml tensors."""
    wrap = (lambda i: T(i) if isinstance(i, np.ndarray) and i.dtype.kind in "iu" else i)
    return tuple(wrap(i) for i in index) if isinstance(index, tuple) else wrap(index)


# -- strategies --------------------------------------------------------------------------------

@st.composite
def array_and_basic_index(draw, dtype="float64"):
    x = draw(O.arrays(dtype, shape=O.shapes(min_dims=1), lo=-5, hi=5))
    index = draw(hnp.basic_indices(x.shape, min_dims=0, allow_newaxis=True, allow_ellipsis=True))
    return x, index


@st.composite
def array_and_mixed_index(draw, dtype="float64"):
    """ints, slices, integer arrays/lists (maybe separated by slices) and bool masks."""
    x = draw(O.arrays(dtype, shape=O.shapes(min_dims=1), lo=-5, hi=5))
    bshape = draw(O.shapes(max_dims=2, max_side=3))
    index, axis = [], 0
    while axis < x.ndim:
        d = x.shape[axis]
        kind = draw(st.sampled_from(["int", "slice", "array", "list", "mask", "mask2", "stop"]))
        if kind == "stop":
            break
        if kind == "int":
            index.append(draw(st.integers(-d, d - 1)))
        elif kind == "slice":
            index.append(draw(st.slices(d)))
        elif kind in ("array", "list"):
            arr = draw(hnp.arrays(draw(st.sampled_from([np.int32, np.int64])), bshape,
                                  elements=st.integers(-d, d - 1)))
            index.append(arr.tolist() if kind == "list" and arr.ndim == 1 else arr)
        elif kind == "mask" or axis == x.ndim - 1:
            index.append(draw(hnp.arrays(bool, (d,))))
        else:   # a 2-D mask over this axis and the next
            index.append(draw(hnp.arrays(bool, x.shape[axis:axis + 2])))
            axis += 1
        axis += 1
    if draw(st.booleans()) and len(index) < x.ndim:
        index.insert(draw(st.integers(0, len(index))), Ellipsis)
    return x, tuple(index)


def numpy_index(index):
    return tuple(np.asarray(i) if isinstance(i, list) else i for i in index)


# -- forward -------------------------------------------------------------------------------------

@given(data=st.data(), dtype=dtypes)
def test_basic_indexing(data, dtype):
    x, index = data.draw(array_and_basic_index(dtype))
    assert_same(T(x)[index], x[index])


@settings(max_examples=60)
@given(data=st.data(), dtype=dtypes)
def test_mixed_indexing(data, dtype):
    x, index = data.draw(array_and_mixed_index(dtype))
    try:
        want = x[numpy_index(index)]
    except IndexError:      # index arrays (masks included) that do not broadcast together
        with pytest.raises(vkml.ShapeError, match="index: shapes .* cannot be broadcast"):
            T(x)[index]
        return
    assert_same(T(x)[index], want)
    assert_same(T(x)[as_tensors(numpy_index(index))], want)


@given(data=st.data())
def test_integer_array_indices_on_every_axis(data):
    x = data.draw(O.arrays("int64", shape=O.shapes(min_dims=1)))
    index = data.draw(hnp.integer_array_indices(x.shape, result_shape=O.shapes(max_dims=2)))
    assert_same(T(x)[index], x[index])
    assert_same(T(x)[as_tensors(index)], x[index])
    negative = tuple(np.where(i < 0, i, i - x.shape[k]) for k, i in enumerate(index))
    assert_same(T(x)[negative], x[index])


@pytest.mark.parametrize("index", [
    (0, slice(None), [1, 2]),          # int and array split by a slice: picked dims go first
    ([1, 2], slice(None), 0),
    (slice(None), 0, [1, 2]),          # adjacent: they stay in place
    (slice(None), [0, 2], 1),
    ([0, 1], slice(None), [2, 3]),
    (Ellipsis, [0, -1]),
    (-1, Ellipsis, [[0], [3]]),
    (slice(None, None, -1), [2, 0], slice(1, None, 2)),
    (np.int64(1), slice(None, None, -2), np.array(3)),
])
def test_numpy_placement_of_array_dims(index):
    x = np.arange(3 * 4 * 5).reshape(3, 4, 5)
    assert_same(T(x)[index], x[index])


@pytest.mark.parametrize("index", [
    (slice(None), 0, slice(None), [1, 2]),        # split after a kept axis: picked dims first
    (slice(None), [0, 1], slice(1, 3), [[4], [0]]),
    (slice(None), 1, [0, 2], slice(None)),        # adjacent after a kept axis: in place
    (Ellipsis, [1, 0], 2),
])
def test_numpy_placement_in_four_dimensions(index):
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    assert_same(T(x)[index], x[index])


@pytest.mark.parametrize("mask_of", [
    lambda x: x % 3 == 0,                  # full-rank mask
    lambda x: (x % 2 == 0)[:, :, 0],       # 2-D mask on the leading axes
    lambda x: np.array([True, False, True]),
    lambda x: np.zeros(3, bool),           # nothing picked
])
def test_bool_masks(mask_of):
    x = np.arange(3 * 4 * 5).reshape(3, 4, 5)
    mask = mask_of(x)
    assert_same(T(x)[mask], x[mask])
    if mask.ndim == 1:
        two = [False, True, False, False, True]
        assert_same(T(x)[:, [True, False, False, True], two], x[:, [True, False, False, True], two])
        assert_same(T(x)[mask, 1:], x[mask, 1:])
        assert_same(T(x)[..., mask.repeat(2)[:5]], x[..., mask.repeat(2)[:5]])


def test_tensor_indices_int32_int64_and_negative():
    x = np.arange(20.0).reshape(4, 5)
    for dtype in (np.int32, np.int64):
        idx = np.array([[3, -1], [0, -4]], dtype=dtype)
        assert_same(T(x)[T(idx)], x[idx])
        assert_same(T(x)[1, T(idx)], x[1, idx])
        assert_same(T(x)[T(idx), T(idx[::-1])], x[idx, idx[::-1]])
    assert_same(T(x)[T(np.array(2))], x[2])
    computed = vkml.argmax(T(x), axis=1)            # an index made by another op
    assert_same(T(x)[T(np.arange(4)), computed], x[np.arange(4), x.argmax(1)])


def test_iterating_a_tensor_walks_its_first_axis():
    x = np.arange(6.0).reshape(3, 2)
    rows = [r.numpy() for r in T(x)]
    assert len(rows) == 3
    for r, want in zip(rows, x):
        assert_same(r, want)


def test_empty_tuple_and_full_slices_are_the_whole_tensor():
    x = np.arange(6.0).reshape(2, 3)
    assert_same(T(x)[()], x[()])
    assert_same(T(x)[...], x[...])
    assert_same(T(x)[:, :], x[:, :])
    assert_same(T(np.float64(3.0))[()], np.float64(3.0))
    assert_same(T(np.float64(3.0))[None], np.float64(3.0)[None])


# -- refusals --------------------------------------------------------------------------------------

@pytest.mark.parametrize("index,exc,words", [
    (3, IndexError, ["index", "3", "out of range", "axis 0"]),
    (-4, IndexError, ["index", "-4", "out of range"]),
    ((0, 5), IndexError, ["index", "5", "axis 1"]),
    ([0, 3], IndexError, ["index", "3", "out of range"]),
    ((0, 0, 0), ValueError, ["index", "too many"]),
    ((Ellipsis, 0, Ellipsis), ValueError, ["index", "Ellipsis"]),
    (1.5, TypeError, ["index", "float"]),
    (np.array([True, False]), ValueError, ["index", "mask", "(2,)"]),
    (np.ones((3, 2), bool), ValueError, ["index", "mask", "(3, 2)"]),
    (([0, 1], None), TypeError, ["index", "None"]),
])
def test_bad_indices_are_refused_with_the_fix(index, exc, words):
    x = np.arange(12.0).reshape(3, 4)
    t = T(x)
    with pytest.raises(vkml.VkmlError) as err:
        t[index]
    assert isinstance(err.value, exc)
    for w in words:
        assert w in str(err.value), (w, str(err.value))
    assert_same(t, x)


def test_bool_and_float_tensor_indices_are_refused():
    t = T(np.arange(4.0))
    with pytest.raises(vkml.DTypeError, match="index: a bool tensor.*numpy"):
        t[t > 1.0]
    with pytest.raises(vkml.DTypeError, match="index: tensor indices must be integers"):
        t[T(np.array([0.0, 1.0]))]
    assert_same(t[(t > 1.0).numpy()], np.arange(4.0)[2:])   # the fix the message names


# -- gradients -------------------------------------------------------------------------------------

@settings(max_examples=10)
@given(data=st.data())
def test_basic_indexing_gradient(data):
    x, index = data.draw(array_and_basic_index("float64"))
    check_grad(lambda t: t[index], lambda t: t[index], x)


@settings(max_examples=10)
@given(data=st.data())
def test_mixed_indexing_gradient_with_repeats(data):
    x, index = data.draw(array_and_mixed_index("float64"))
    index = numpy_index(index)
    try:
        x[index]
    except IndexError:
        assume(False)
    check_grad(lambda t: t[index], lambda t: t[index], x)
    tindex = as_tensors(index)
    check_grad(lambda t: t[tindex], lambda t: t[index], x)


def test_repeated_and_negative_indices_accumulate():
    x = np.random.default_rng(0).normal(size=(4, 3))
    rows = np.array([0, -1, 0, 3, 3, 3])
    check_grad(lambda t: t[rows, 1:], lambda t: t[rows, 1:], x)
    check_grad(lambda t, i: t[i, ::-1], lambda t, i: t[i, ::-1], x, rows)
    mask = np.array([[True, False, True], [False, False, True], [True, True, True],
                     [False, False, False]])
    check_grad(lambda t: t[mask] * t[mask][::-1], lambda t: t[mask] * t[mask][::-1], x)
