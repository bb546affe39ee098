"""Bad input that vkml used to accept is refused, and the refusals people meet first say what is
wrong *and what to do* -- each naming the operation, the shapes, and a fix."""

from __future__ import annotations

import numpy as np
import pytest

import vkml
import vkml.numpy as vnp


def test_take_along_axis_refuses_float_indices_as_numpy_does():
    with pytest.raises(vkml.DTypeError, match=r"take_along_axis: indices must be integers.*astype"):
        vnp.take_along_axis(np.ones((2, 3)), np.array([[0.0], [1.0]]), axis=1)


def test_custom_jvp_rule_with_a_tangent_of_the_wrong_shape_is_refused():
    f = vkml.custom_jvp(lambda x: x * 2)
    f.defjvp(lambda p, t: (p[0] * 2, vkml.concatenate([t[0], t[0][:1]])))
    with pytest.raises(vkml.ShapeError, match=r"custom_jvp .*tangent 0 is float64 \[4\].*\[3\]"):
        vkml.jvp(f, (np.ones(3),), (np.ones(3),))
    with pytest.raises(vkml.ShapeError, match="tangent 0"):
        vkml.grad(lambda x: f(x).sum())(np.ones(3))


def test_stop_gradient_maps_over_a_pytree():
    params = {"w": np.array([2.0, 3.0]), "b": [np.array(1.0)]}
    frozen = vkml.stop_gradient(params)
    assert set(frozen) == {"w", "b"} and isinstance(frozen["b"], list)
    g = vkml.grad(lambda p: (p["w"] * vkml.stop_gradient(p)["w"]).sum())(params)
    np.testing.assert_array_equal(g["w"].numpy(), [2.0, 3.0])      # not 2w: the copy is constant


@pytest.mark.parametrize("call, says", [
    (lambda: vnp.concatenate([np.ones((2, 3)), np.ones((2, 4))]), r"differ off axis 0; every axis but the joined one"),
    (lambda: vnp.einsum("ij,jk->ik", np.ones((2, 3))), r"names 2 operands but 1 were given; give one subscript group"),
    (lambda: vnp.einsum("ij,jk->ik", np.ones((2, 3)), np.ones((4, 2))), r"axis 'j' has lengths 3 and 4.*give the axes different letters"),
    (lambda: vnp.tensordot(np.ones((2, 3)), np.ones((4, 2)), 1), r"contracted axes must have equal lengths: choose other axes="),
    (lambda: vnp.max(np.ones((0,))), r"empty axis.*check the input's size first"),
    (lambda: vnp.argmax(np.ones((0, 2)), axis=0), r"argmax: of an empty axis.*check the input's size first"),
    (lambda: vnp.matmul(np.ones((2, 3)), np.ones((4, 2))), r"inner dimensions 3 and 4 differ.*transpose an operand"),
    (lambda: vnp.linalg.solve(np.eye(3), np.ones(4)), r"it needs 3 rows"),
    (lambda: vkml.vmap(lambda x: x * 2, out_axes=2)(np.ones((3, 4))), r"give an axis in \[-2, 2\)"),
    (lambda: vkml.nn.cross_entropy(vkml.tensor(np.zeros((2, 3))), np.array([0, 5])), r"needs 6 outputs"),
    (lambda: vkml.max_pool2d(vkml.ones((1, 1, 2, 2)), 3), r"larger than the input.*use a smaller kernel_size"),
    (lambda: vkml.optim.Adam([]), r"nothing to optimise; pass model.parameters\(\)"),
])
def test_refusals_say_what_to_do(call, says):
    with pytest.raises(vkml.VkmlError, match=says):
        call()


def test_argmax_of_an_empty_axis_fails_when_called_not_when_run():
    """It used to fail only when realized, as a wrapped NumPy error; now at the call."""
    with vkml.eager(False):
        with pytest.raises(vkml.ShapeError, match="argmax"):
            vnp.argmax(np.ones((0,)))


# -- the new dtypes on every backend -------------------------------------------------------------

def _small_int_and_complex_programs():
    a = vkml.tensor(np.array([100, 50, 3], np.int8))
    u = vkml.tensor(np.array([1, 2], np.uint16))
    total = vkml.jit(lambda x: (x * x).sum())(np.arange(4, dtype=np.uint8))
    z = vkml.tensor(np.array([1 + 2j, -0.5j]))
    grad = vkml.grad(lambda w: vnp.sum(vnp.abs(w) ** 2))(np.array([3 + 4j]))
    return (a * 3).numpy(), (u - 3).numpy(), total, (z * z).numpy(), grad.numpy()


def _check_small_int_and_complex(results):
    times3, minus3, total, squared, grad = results
    np.testing.assert_array_equal(times3, np.array([100, 50, 3], np.int8) * np.int8(3))  # wraps
    np.testing.assert_array_equal(minus3, np.array([1, 2], np.uint16) - np.uint16(3))
    assert total.dtype == np.uint64 and total.item() == 14
    np.testing.assert_allclose(squared, np.array([1 + 2j, -0.5j]) ** 2)
    np.testing.assert_allclose(grad, [6 - 8j])              # JAX's convention: 2 conj(z)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_small_integers_and_complex_on_the_host_backends(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        _check_small_int_and_complex(_small_int_and_complex_programs())


def test_small_integers_and_complex_on_the_emulated_cuda_backend(emulated_cuda):
    """The CUDA lowering compiles the original five dtypes; programs with the others run
    through the backend's NumPy fallback, with NumPy's results."""
    backend, _ = emulated_cuda
    before = backend.info()["numpy fallbacks"]
    _check_small_int_and_complex(_small_int_and_complex_programs())
    assert backend.info()["numpy fallbacks"] > before
