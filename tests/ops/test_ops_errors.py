"""Bad input is refused: a ``VkmlError`` (also the builtin a Python user expects) whose
message names the op and the fix, and every tensor is left as it was.

Runs in eager mode (errors surface at the op), except where lazy mode is the
point: a gather index that is only checked when the program runs.
"""

import inspect
import os

import numpy as np
import pytest

import vkml

pytestmark = pytest.mark.usefixtures("eager")

HERE = os.path.basename(__file__)


class Snapshot:
    """The values (and gradients) of some tensors, to check a refusal changed nothing."""

    def __init__(self, *tensors):
        self.tensors = tensors
        self.values = [np.array(t.numpy(), copy=True) for t in tensors]
        self.grads = [None if t.grad is None else np.array(t.grad.numpy(), copy=True)
                      for t in tensors]
        self.vars = [t.ir_var for t in tensors]

    def unchanged(self):
        for t, v, g, var in zip(self.tensors, self.values, self.grads, self.vars):
            assert t.ir_var is var
            np.testing.assert_array_equal(t.numpy(), v)
            assert t.numpy().dtype == v.dtype and t.shape == v.shape
            if g is None:
                assert t.grad is None
            else:
                np.testing.assert_array_equal(t.grad.numpy(), g)
        return True


def refused(fn, *tensors, kind=vkml.VkmlError, builtin=None, words=()):
    """``fn()`` raises ``kind`` (and ``builtin``), ``words`` in its message; tensors unchanged."""
    snap = Snapshot(*tensors)
    with pytest.raises(kind) as err:
        fn()
    assert isinstance(err.value, vkml.VkmlError)
    if builtin is not None:
        assert isinstance(err.value, builtin), type(err.value).__mro__
    msg = str(err.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    assert snap.unchanged()
    for t in tensors:       # still usable
        if t.dtype.kind in "iuf":
            np.testing.assert_array_equal((t + 0).numpy(), t.numpy())
    return msg


def T(a, **kw):
    return vkml.tensor(a, **kw)


# -- shapes ------------------------------------------------------------------------------------

def test_mismatched_elementwise_shapes():
    a, b = T(np.arange(3.0)), T(np.arange(4.0))
    for fn, name in [(vkml.add, "add"), (vkml.sub, "sub"), (vkml.mul, "mul"), (vkml.div, "div"),
                     (vkml.maximum, "max"), (vkml.less, "lt"), (vkml.pow, "pow")]:
        refused(lambda: fn(a, b), a, b, kind=vkml.ShapeError, builtin=ValueError,
                words=[name, "(3,)", "(4,)", "broadcast"])
    refused(lambda: a + b, a, b, kind=vkml.ShapeError, words=["add", "broadcast"])
    c = T(np.ones((2, 3)))
    refused(lambda: vkml.where(c > 0, c, b), c, b, kind=vkml.ShapeError, words=["where", "(4,)"])


def test_matmul_shapes():
    a, b = T(np.ones((2, 3))), T(np.ones((4, 5)))
    refused(lambda: vkml.matmul(a, b), a, b, kind=vkml.ShapeError, builtin=ValueError,
            words=["matmul", "(2, 3)", "(4, 5)", "inner"])
    refused(lambda: a @ b, a, b, kind=vkml.ShapeError, words=["matmul"])
    s = T(np.float64(2.0))
    refused(lambda: vkml.matmul(a, s), a, s, kind=vkml.ShapeError, words=["matmul", "*"])
    c, d = T(np.ones((2, 3, 4))), T(np.ones((3, 4, 5)))
    refused(lambda: c @ d, c, d, kind=vkml.ShapeError, words=["matmul", "broadcast"])


def test_reshape_into_a_wrong_size():
    a = T(np.arange(6.0).reshape(2, 3))
    refused(lambda: a.reshape(4), a, kind=vkml.ShapeError, builtin=ValueError,
            words=["reshape", "(2, 3)", "(4,)", "element"])
    refused(lambda: vkml.reshape(a, (4, -1)), a, kind=vkml.ShapeError, words=["reshape", "(4, -1)"])
    refused(lambda: vkml.reshape(a, (-1, -1)), a, kind=vkml.ShapeError, words=["reshape", "-1"])


def test_movement_shapes():
    a, b = T(np.ones((2, 3))), T(np.ones((3, 3)))
    refused(lambda: vkml.broadcast_to(a, (4, 3)), a, kind=vkml.ShapeError,
            words=["broadcast", "(2, 3)", "(4, 3)"])
    refused(lambda: vkml.broadcast_to(a, (3,)), a, kind=vkml.ShapeError, words=["broadcast_to"])
    refused(lambda: vkml.concatenate([a, b], axis=1), a, b, kind=vkml.ShapeError,
            words=["concatenate", "(2, 3)", "(3, 3)"])
    refused(lambda: vkml.stack([a, b]), a, b, kind=vkml.ShapeError, words=["stack", "one shape"])
    refused(lambda: vkml.concatenate([]), kind=vkml.ArgumentError, builtin=TypeError,
            words=["concatenate", "at least one"])
    refused(lambda: vkml.squeeze(a, 0), a, kind=vkml.ShapeError, words=["squeeze", "size 2"])
    refused(lambda: vkml.pad(a, (-2, 0), (-1, 0)), a, kind=vkml.ShapeError, words=["pad", "crop"])
    refused(lambda: vkml.pad(a, (1,), (1,)), a, kind=vkml.ShapeError, words=["pad", "per axis"])
    refused(lambda: a.item(), a, kind=vkml.ShapeError, words=["item", "(2, 3)", "sum"])


def test_gather_scatter_take_shapes_and_dtypes():
    x = T(np.ones((2, 3)))
    i3 = T(np.zeros((1, 3), np.int64))
    refused(lambda: vkml.gather(x, i3), x, i3, kind=vkml.ShapeError, words=["gather", "(1, 3)"])
    i0 = T(np.zeros((2, 0), np.int64))       # no coordinates at all (the value had no batch dims)
    refused(lambda: vkml.gather(x, i0), x, i0, kind=vkml.ShapeError, words=["gather", "(2, 0)"])
    refused(lambda: vkml.scatter_add(x, i0, T(np.ones((2, 2, 3)))), x, i0, kind=vkml.ShapeError,
            words=["scatter_add", "(2, 0)"])
    fi = T(np.zeros((1, 1)))
    refused(lambda: vkml.gather(x, fi), x, fi, kind=vkml.DTypeError, builtin=TypeError,
            words=["gather", "integers", "float64"])
    refused(lambda: vkml.take(x, fi), x, fi, kind=vkml.DTypeError, words=["take", "integers"])
    idx, upd = T(np.array([[0], [1]])), T(np.ones((2, 2)))
    refused(lambda: vkml.scatter_add(x, idx, upd), x, idx, upd, kind=vkml.ShapeError,
            words=["scatter_add", "(2, 2)", "(2, 3)"])
    upd32 = T(np.ones((2, 3), np.float32))
    refused(lambda: vkml.scatter_add(x, idx, upd32), x, idx, upd32, kind=vkml.DTypeError,
            words=["scatter_add", "float32", "float64"])
    refused(lambda: vkml.take_along_axis(x, T(np.zeros(2, np.int64)), 1), x,
            kind=vkml.ShapeError, words=["take_along_axis", "2 dimensions"])


def test_known_take_indices_are_checked_against_the_users_axis():
    x = T(np.arange(6.0).reshape(2, 3))
    refused(lambda: vkml.take(x, [7], axis=1), x, kind=vkml.errors.IndexOutOfRangeError,
            builtin=IndexError, words=["take", "7", "axis 1", "size 3"])
    refused(lambda: vkml.take(x, [-4], axis=-1), x, kind=vkml.ShapeError,
            words=["take", "-4", "axis 1"])
    refused(lambda: vkml.take_along_axis(x, np.array([[0], [2]]), 0), x, kind=vkml.ShapeError,
            words=["take_along_axis", "2", "axis 0", "size 2"])


def test_conv_and_pool_shapes():
    x, w = T(np.ones((1, 2, 5, 5))), T(np.ones((3, 4, 3, 3)))
    refused(lambda: vkml.conv2d(x, w), x, w, kind=vkml.ShapeError,
            words=["conv2d", "2 channels", "4"])
    w3 = T(np.ones((3, 2, 3)))
    refused(lambda: vkml.conv2d(x, w3), x, w3, kind=vkml.ShapeError, words=["conv2d", "4-D"])
    big = T(np.ones((1, 2, 7, 7)))
    refused(lambda: vkml.conv2d(x, big), x, big, kind=vkml.ShapeError,
            words=["conv2d", "larger"])
    refused(lambda: vkml.conv2d(x, T(np.ones((3, 2, 3, 3))), stride=(1, 2, 3)), x,
            kind=vkml.ArgumentError, words=["stride", "pair"])
    refused(lambda: vkml.max_pool2d(x, 6), x, kind=vkml.ShapeError, words=["pool2d", "larger"])
    refused(lambda: vkml.avg_pool2d(T(np.ones((5, 5))), 2), kind=vkml.ShapeError,
            words=["pool2d", "4-D"])


# -- axes --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,call", [
    ("sum", lambda t: vkml.sum(t, 2)),
    ("sum", lambda t: vkml.sum(t, -3)),
    ("sum", lambda t: t.sum((0, 5))),
    ("mean", lambda t: vkml.mean(t, 2)),
    ("max", lambda t: vkml.max(t, 3)),
    ("max", lambda t: vkml.min(t, -3)),
    ("argmax", lambda t: vkml.argmax(t, 2)),
    ("argmax", lambda t: vkml.argmin(t, 2)),
    ("logsumexp", lambda t: vkml.logsumexp(t, 2)),
    ("logsumexp", lambda t: vkml.softmax(t, 2)),
    ("flip", lambda t: vkml.flip(t, 2)),
    ("squeeze", lambda t: vkml.squeeze(t, 2)),
    ("swapaxes", lambda t: vkml.swapaxes(t, 0, 2)),
    ("take", lambda t: vkml.take(t, [0], 2)),
    ("concatenate", lambda t: vkml.concatenate([t, t], 2)),
    ("stack", lambda t: vkml.stack([t, t], 3)),
    ("stack", lambda t: vkml.stack([t, t], -4)),
    ("expand_dims", lambda t: vkml.expand_dims(t, 3)),
    ("expand_dims", lambda t: vkml.expand_dims(t, -4)),
    ("transpose", lambda t: vkml.transpose(t, (0, 2))),
    ("transpose", lambda t: vkml.transpose(t, (0, 0))),
    ("transpose", lambda t: vkml.transpose(t, (0,))),
    ("flatten", lambda t: vkml.flatten(t, 0, 2)),
    ("sum", lambda t: vkml.sum(t, (0, 0))),
])
def test_out_of_range_or_repeated_axes(name, call):
    t = T(np.arange(6.0).reshape(2, 3))
    refused(lambda: call(t), t, kind=vkml.ShapeError, builtin=ValueError, words=[name + ":"])


@pytest.mark.parametrize("name,call", [
    ("argmax", lambda t: vkml.argmax(t, (0, 1))),
    ("argmax", lambda t: vkml.argmin(t, 0.5)),
    ("take", lambda t: vkml.take(t, [0], (0, 1))),
    ("take_along_axis", lambda t: vkml.take_along_axis(t, np.zeros((1, 1), np.int64), (1,))),
    ("concatenate", lambda t: vkml.concatenate([t, t], (0,))),
    ("stack", lambda t: vkml.stack([t, t], (0,))),
    ("swapaxes", lambda t: vkml.swapaxes(t, (0,), 1)),
    ("flatten", lambda t: vkml.flatten(t, (0,))),
])
def test_a_single_axis_must_be_an_int(name, call):
    t = T(np.arange(6.0).reshape(2, 3))
    refused(lambda: call(t), t, kind=vkml.VkmlError, words=[name + ":", "int"])


def test_one_operand_concatenate_still_checks_its_axis():
    t = T(np.arange(3.0))
    refused(lambda: vkml.concatenate([t], 1), t, kind=vkml.ShapeError,
            words=["concatenate", "axis 1"])
    refused(lambda: vkml.stack([t], 2), t, kind=vkml.ShapeError, words=["stack", "axis 2"])


@pytest.mark.parametrize("call,words", [
    (lambda x, w: vkml.conv2d(x, w, stride=0), ["conv2d", "stride", "0"]),
    (lambda x, w: vkml.conv2d(x, w, stride=(1, -1)), ["conv2d", "stride", "-1"]),
    (lambda x, w: vkml.conv2d(x, w, padding=-1), ["conv2d", "padding", "-1"]),
    (lambda x, w: vkml.max_pool2d(x, 2, stride=0), ["pool2d", "stride", "0"]),
    (lambda x, w: vkml.avg_pool2d(x, 0), ["pool2d", "kernel_size", "0"]),
    (lambda x, w: vkml.max_pool2d(x, (2, 2, 2)), ["kernel_size", "pair"]),
])
def test_conv_and_pool_parameters(call, words):
    x, w = T(np.ones((1, 2, 5, 5))), T(np.ones((3, 2, 3, 3)))
    refused(lambda: call(x, w), x, w, kind=vkml.VkmlError, words=words)


def test_a_zero_slice_step():
    t = T(np.arange(4.0))
    refused(lambda: t[::0], t, kind=vkml.ShapeError, builtin=ValueError,
            words=["index", "step", "zero"])


def test_axes_of_a_0d_tensor():
    s = T(np.float64(2.0))
    refused(lambda: vkml.sum(s, 0), s, kind=vkml.ShapeError, words=["sum", "0-d"])
    refused(lambda: vkml.mean(s, 0), s, kind=vkml.ShapeError, words=["mean", "0-d"])
    assert vkml.sum(s).item() == 2.0 and vkml.mean(s).item() == 2.0


# -- dtypes --------------------------------------------------------------------------------------

def test_bool_arithmetic_is_refused_with_the_fix():
    b = T(np.array([True, False]))
    for fn, name in [(vkml.add, "add"), (vkml.sub, "sub"), (vkml.mul, "mul")]:
        refused(lambda: fn(b, b), b, kind=vkml.DTypeError, builtin=TypeError,
                words=[name, "bool", "cast"])
    refused(lambda: -b, b, kind=vkml.DTypeError, words=["neg", "bool", "cast"])
    refused(lambda: vkml.matmul(b, b), b, kind=vkml.DTypeError, words=["matmul", "bool"])


def test_floor_divide_of_floats_names_a_fix_that_exists():
    a = T(np.array([3.0, -4.5]))
    np.testing.assert_array_equal((a // 2.0).numpy(), np.array([3.0, -4.5]) // 2.0)   # NumPy's //
    msg = refused(lambda: vkml.floor_divide(a, 2.0), a, kind=vkml.DTypeError, builtin=TypeError,
                  words=["floor_divide", "float64", "astype"])
    for word in msg.replace("(", " ").replace(")", " ").split():
        if word.startswith("vkml."):
            assert hasattr(vkml, word[5:].rstrip(".;,")), word


@pytest.mark.parametrize("dtype", ["float16", "datetime64", "notadtype", 3.5])
def test_bad_cast_dtype(dtype):
    a = T(np.array([1.0, 2.0]))
    refused(lambda: vkml.cast(a, dtype), a, kind=vkml.DTypeError, builtin=TypeError,
            words=["cast", "float32", "float64"])
    refused(lambda: a.astype(dtype), a, kind=vkml.DTypeError, words=["cast"])


def test_what_numpy_accepts_vkml_accepts_too():
    # a float or int condition is read as != 0, as np.where does
    c = np.array([0.0, 2.5, -1.0])
    np.testing.assert_array_equal(vkml.where(T(c), 1, 2).numpy(), np.where(c, 1, 2))
    np.testing.assert_array_equal(vkml.where(T(c.astype(np.int32)), 1.0, 2.0).numpy(),
                                  np.where(c.astype(np.int32), 1.0, 2.0))
    # log of bool computes in floating point (float64 here; NumPy picks float16)
    with np.errstate(divide="ignore"):
        got = vkml.log(T(np.array([True, False]))).numpy()
        np.testing.assert_array_equal(got, np.log(np.array([True, False])).astype(got.dtype))
    # logical ops read numbers as truth values
    np.testing.assert_array_equal(vkml.logical_not(T(c)).numpy(), np.logical_not(c))


# -- non-array data --------------------------------------------------------------------------------

@pytest.mark.parametrize("data", ["abc", b"abc", {"a": 1}, {1, 2}, None, [[1, 2], [3]],
                                  [1, "a"], object(), [1, None], np.array(["x"]),
                                  [[1.0], 2.0]])
def test_non_array_data_is_refused(data):
    msg = refused(lambda: vkml.tensor(data), kind=vkml.ArgumentError, builtin=TypeError,
                  words=["tensor"])
    assert "number" in msg or "list" in msg or "array" in msg


def test_non_array_operands_are_refused():
    a = T(np.arange(3.0))
    refused(lambda: vkml.add(a, "abc"), a, kind=vkml.ArgumentError, builtin=TypeError,
            words=["str"])
    refused(lambda: vkml.mul(a, None), a, kind=vkml.ArgumentError, words=["NoneType"])
    refused(lambda: vkml.exp({"a": 1}), kind=vkml.ArgumentError, words=["dict"])


# -- gradients ------------------------------------------------------------------------------------

def test_backward_on_a_non_scalar_names_the_shape_and_keeps_grad():
    x = T(np.arange(6.0).reshape(2, 3), requires_grad=True)
    vkml.sum(x * x).backward()
    y = x * 2.0
    msg = refused(lambda: y.backward(), x, kind=vkml.GradError, builtin=RuntimeError,
                  words=["backward", "0-d", "sum"])
    assert "[2, 3]" in msg or "(2, 3)" in msg
    np.testing.assert_array_equal(x.grad.numpy(), 2 * np.arange(6.0).reshape(2, 3))
    refused(lambda: vkml.backward(y), x, kind=vkml.GradError, words=["backward", "2, 3"])
    refused(lambda: vkml.backward(np.float64(1.0)), x, kind=vkml.ArgumentError,
            words=["backward", "Tensor"])


def test_backward_of_a_root_without_grad():
    x = T(np.arange(3.0))
    root = vkml.sum(x)
    refused(lambda: root.backward(), x, root, kind=vkml.GradError, words=["requires_grad"])


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_integer_tensors_cannot_require_grad(dtype):
    refused(lambda: vkml.tensor(np.array([1, 2], dtype=dtype), requires_grad=True),
            kind=vkml.GradError, builtin=RuntimeError,
            words=["requires_grad", dtype, "astype"])
    t = T(np.array([1, 2], dtype=dtype))
    refused(lambda: t.requires_grad_(), t, kind=vkml.GradError, words=["requires_grad_", dtype])
    assert t.requires_grad is False


def test_the_gradient_does_not_flow_into_an_integer_result():
    x = T(np.array([1.5, 2.5]), requires_grad=True)
    root = vkml.sum(vkml.cast(x, "int32"))          # an integer root: not differentiable
    assert root.dtype == np.int64 and root.requires_grad is False
    refused(lambda: root.backward(), x, kind=vkml.GradError, words=["requires_grad"])
    assert x.grad is None


# -- gather out of range: eager at the op, lazy at realize, both naming the op and the line --------

def test_gather_out_of_range_in_eager_mode_raises_at_the_line_that_made_it():
    x = T(np.arange(6.0).reshape(2, 3), requires_grad=True)
    idx = T(np.array([[5]]))
    snap = Snapshot(x, idx)
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(vkml.ExecutionError) as err:
        vkml.gather(x, idx)
    assert isinstance(err.value, RuntimeError)
    msg = str(err.value)
    assert "gather" in msg and f"{HERE}:{line}" in msg and "5" in msg and "[0, 2)" in msg
    assert any(entry.path.name == HERE and entry.lineno + 1 == line for entry in err.traceback)
    assert snap.unchanged()


def test_gather_out_of_range_in_lazy_mode_raises_at_realize_naming_the_op_and_line():
    with vkml.eager(False):
        x = T(np.arange(6.0).reshape(2, 3), requires_grad=True)
        idx = T(np.array([[0], [-1]]))
        line = inspect.currentframe().f_lineno + 1
        y = vkml.gather(x, idx) * 2.0          # nothing runs yet, so nothing is refused yet
        snap = Snapshot(x, idx)
        for _ in range(2):                     # and it fails the same way every time
            with pytest.raises(vkml.ExecutionError) as err:
                y.numpy()
            msg = str(err.value)
            assert "gather" in msg and f"{HERE}:{line}" in msg and "-1" in msg
        assert snap.unchanged()
        ok = vkml.gather(x, T(np.array([[1]])))      # the inputs still work
        np.testing.assert_array_equal(ok.numpy(), [[3.0, 4.0, 5.0]])


def test_a_backward_that_fails_when_it_runs_leaves_grad_as_it_was():
    with vkml.eager(False):
        x = T(np.arange(6.0).reshape(2, 3), requires_grad=True)
        vkml.sum(x).backward()
        before = np.array(x.grad.numpy(), copy=True)
        bad = T(np.array([[7]]))
        line = inspect.currentframe().f_lineno + 1
        loss = vkml.sum(vkml.gather(x, bad))
        with pytest.raises(vkml.ExecutionError) as err:
            loss.backward()
        assert "gather" in str(err.value) and f"{HERE}:{line}" in str(err.value)
        np.testing.assert_array_equal(x.grad.numpy(), before)
        np.testing.assert_array_equal(x.numpy(), np.arange(6.0).reshape(2, 3))


def test_an_out_of_range_tensor_index_is_found_by_gather_when_it_runs():
    x = T(np.arange(4.0))
    i = vkml.argmax(x) + 2                     # 5, as data
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(vkml.ExecutionError) as err:
        x[i]
    assert "gather" in str(err.value) and f"{HERE}:{line}" in str(err.value)
    with vkml.eager(False):
        line = inspect.currentframe().f_lineno + 1
        y = vkml.take(x, vkml.argmax(x) - 9)   # -6: past the front even after wrapping
        with pytest.raises(vkml.ExecutionError) as err:
            y.numpy()
        assert "gather" in str(err.value) and f"{HERE}:{line}" in str(err.value)


# -- assignment refusals leave the destination as it was -------------------------------------------

def test_bad_assign_changes_nothing():
    a, b = T(np.zeros(3)), T(np.ones(3))
    refused(lambda: vkml.assign([a, b], [np.ones(3), np.ones(4)]), a, b, kind=vkml.ShapeError,
            words=["assign", "source 1", "(4,)"])
    src = T(np.ones(3, np.float32))
    refused(lambda: a.assign_(src), a, src, kind=vkml.DTypeError, words=["assign", "float32"])
