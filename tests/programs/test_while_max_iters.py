"""``while_loop(max_iters=)`` cut short: it warns, raises or keeps quiet -- eagerly and inside
jit, grad, vmap and scan, on the NumPy backend and on the compiled CPU tier (and, with the
emulated driver, on the CUDA backend's generated kernels).

The check is the ``checked`` primitive (``vkml.ops.checks``): it travels inside the program with
the loop's result, and a warning is issued once per call however many steps or samples fired.
"""

from __future__ import annotations

import warnings

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml
from backends_under_test import BACKENDS
from cuda_emulation import CXX, emulate, fake_driver, host_library
from vkml.backends.codegen.cuda_render import cuda_plan
from vkml.ops.checks import checked

#: the tests that compute run on the NumPy backend and the compiled CPU tier
on_backends = pytest.mark.parametrize("vk_backend", BACKENDS, indirect=True)

MESSAGE = "while_loop: the condition still held after max_iters=3 iterations"


def doubling(a, max_iters=3, on_max_iters="warn"):
    """c = a; while c < 100: c *= a -- cut short after ``max_iters`` steps for a small ``a``."""
    return vkml.while_loop(lambda c: c < 100.0, lambda c: c * a, a, max_iters=max_iters,
                           on_max_iters=on_max_iters)


class Recorded:
    """The VkmlWarnings issued inside (each one, not deduplicated by Python's registry)."""

    def __enter__(self):
        self._catch = warnings.catch_warnings(record=True)
        self._all = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)

    @property
    def vkml(self):
        return [w for w in self._all if issubclass(w.category, vkml.VkmlWarning)]


_FALLBACKS_BEFORE = [0]


@pytest.fixture(autouse=True)
def _count_fallbacks_from_here(vk_backend):
    """The backend lives across tests: count this test's fallbacks only."""
    _FALLBACKS_BEFORE[0] = vkml.backend_info().get("numpy fallbacks", 0)


def assert_compiled(vk_backend):
    """On the CPU tier every program of the test ran as generated C (none fell back to NumPy)."""
    if vk_backend == "cpu":
        assert vkml.backend_info()["numpy fallbacks"] == _FALLBACKS_BEFORE[0]


# -- eager and concrete ---------------------------------------------------------------------------------

@on_backends
@pytest.mark.parametrize("eager_mode", [False, True])
def test_a_concrete_loop_cut_short_warns_once_at_the_users_line(vk_backend, eager_mode):
    vkml.set_eager(eager_mode)
    with Recorded() as rec:
        out = doubling(np.float64(2.0))
    assert out.item() == 16.0
    assert len(rec.vkml) == 1 and MESSAGE in str(rec.vkml[0].message)
    assert rec.vkml[0].filename == __file__


@on_backends
@pytest.mark.parametrize("eager_mode", [False, True])
def test_a_concrete_loop_cut_short_raises_or_is_ignored_by_flag(vk_backend, eager_mode):
    vkml.set_eager(eager_mode)
    with pytest.raises(vkml.ExecutionError, match=MESSAGE):
        doubling(np.float64(2.0), on_max_iters="raise")
    with Recorded() as rec:
        assert doubling(np.float64(2.0), on_max_iters="ignore").item() == 16.0
        assert doubling(np.float64(20.0), on_max_iters="raise").item() == 400.0
    assert rec.vkml == []


# -- jit ------------------------------------------------------------------------------------------------

@on_backends
def test_jit_warns_once_per_call_that_is_cut_short(vk_backend):
    f = vkml.jit(doubling)
    with Recorded() as rec:
        assert f(np.float64(2.0)).item() == 16.0
        assert len(rec.vkml) == 1 and rec.vkml[0].filename == __file__
        assert f(np.float64(20.0)).item() == 400.0          # ends in time: no warning
        assert len(rec.vkml) == 1
        assert f(np.float64(3.0)).item() == 81.0
        assert len(rec.vkml) == 2
    assert f.cache_info()["traces"] == 1
    assert_compiled(vk_backend)


@on_backends
def test_jit_raises_or_ignores_by_flag(vk_backend):
    raising = vkml.jit(lambda a: doubling(a, on_max_iters="raise"))
    with pytest.raises(vkml.ExecutionError, match=MESSAGE):
        raising(np.float64(2.0)).numpy()
    assert raising(np.float64(20.0)).item() == 400.0
    quiet = vkml.jit(lambda a: doubling(a, on_max_iters="ignore"))
    with Recorded() as rec:
        assert quiet(np.float64(2.0)).item() == 16.0
    assert rec.vkml == []
    assert_compiled(vk_backend)


@on_backends
def test_a_carry_of_several_leaves_warns_once(vk_backend):
    def f(a):
        x, n = vkml.while_loop(lambda c: c[0] < 100.0, lambda c: (c[0] * a, c[1] + 1), (a, 0),
                               max_iters=3)
        return x, n

    with Recorded() as rec:
        x, n = vkml.jit(f)(np.float64(2.0))
        vkml.realize([x, n])
    assert (x.item(), n.item()) == (16.0, 3)
    assert len(rec.vkml) == 1


# -- grad: the derivative is computed, and the cut is reported ---------------------------------------

@on_backends
def test_grad_of_a_loop_cut_short_warns_and_still_differentiates(vk_backend):
    with Recorded() as rec:
        g = vkml.grad(doubling)(np.float64(2.0)).item()
    assert g == 32.0                                       # d/da a**4 at 2: the truncated loop's
    assert len(rec.vkml) == 1 and MESSAGE in str(rec.vkml[0].message)
    with Recorded() as rec:                                # a loss linear in the loop's result
        g = vkml.grad(lambda a: doubling(a) * 3.0)(np.float64(2.0)).item()
    assert g == 96.0 and len(rec.vkml) == 1
    with pytest.raises(vkml.ExecutionError, match=MESSAGE):
        vkml.grad(lambda a: doubling(a, on_max_iters="raise"))(np.float64(2.0)).numpy()
    with Recorded() as rec:
        assert vkml.grad(lambda a: doubling(a, on_max_iters="ignore"))(np.float64(2.0)).item() == 32.0
    assert rec.vkml == []
    assert_compiled(vk_backend)


def _ends_in_time(a, x):
    """A loop whose condition ends it long before max_iters: x scaled by a until its norm exceeds
    10, then a smooth function of the result."""
    def body(c):
        return c * a + 0.1 * vkml.sin(c)
    out = vkml.while_loop(lambda c: vkml.sum(c * c) < 100.0, body, x, max_iters=50)
    return vkml.sum(vkml.tanh(out) * out)


def _ends_in_time_np(a, x):
    c = x
    while anp.sum(c * c) < 100.0:
        c = c * a + 0.1 * anp.sin(c)
    return anp.sum(anp.tanh(c) * c)


@on_backends
def test_gradient_of_a_loop_that_ends_in_time_matches_finite_differences_and_autograd(vk_backend):
    a, x = 1.3, np.array([0.7, -0.4, 1.1])
    with Recorded() as rec:
        ga, gx = vkml.grad(_ends_in_time, argnums=(0, 1))(np.float64(a), x)
        ga, gx = ga.item(), gx.numpy()
    assert rec.vkml == []
    eps = 1e-6
    fd_a = (_ends_in_time_np(a + eps, x) - _ends_in_time_np(a - eps, x)) / (2 * eps)
    fd_x = np.array([(_ends_in_time_np(a, x + eps * e) - _ends_in_time_np(a, x - eps * e)) / (2 * eps)
                     for e in np.eye(3)])
    np.testing.assert_allclose(ga, fd_a, rtol=1e-6)
    np.testing.assert_allclose(gx, fd_x, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(ga, autograd.grad(_ends_in_time_np, 0)(a, x), rtol=1e-10)
    np.testing.assert_allclose(gx, autograd.grad(_ends_in_time_np, 1)(a, x), rtol=1e-10)
    assert_compiled(vk_backend)


# -- vmap: one warning for the batch -----------------------------------------------------------------

@on_backends
def test_vmap_warns_once_when_one_sample_is_cut_short(vk_backend):
    f = vkml.vmap(doubling)
    with Recorded() as rec:
        np.testing.assert_array_equal(f(np.array([20.0, 2.0, 50.0, 1.5])).numpy(),
                                      [400.0, 16.0, 2500.0, 1.5 ** 4])
    assert len(rec.vkml) == 1
    with Recorded() as rec:
        np.testing.assert_array_equal(f(np.array([20.0, 50.0])).numpy(), [400.0, 2500.0])
    assert rec.vkml == []
    with pytest.raises(vkml.ExecutionError, match=MESSAGE):
        vkml.vmap(lambda a: doubling(a, on_max_iters="raise"))(np.array([20.0, 2.0])).numpy()
    assert_compiled(vk_backend)


@on_backends
def test_vmap_of_grad_warns_once(vk_backend):
    with Recorded() as rec:
        g = vkml.vmap(vkml.grad(doubling))(np.array([2.0, 20.0, 3.0])).numpy()
    np.testing.assert_array_equal(g, [32.0, 2 * 20.0, 4 * 27.0])
    assert len(rec.vkml) == 1


# -- inside scan: once per call, not once per step ---------------------------------------------------

def _scan_of_loops(on_max_iters):
    def step(total, a):
        return total + doubling(a, on_max_iters=on_max_iters), None
    return lambda xs: vkml.scan(step, np.float64(0.0), xs)[0]


@on_backends
def test_a_loop_inside_scan_warns_once_per_call(vk_backend):
    f = vkml.jit(_scan_of_loops("warn"))
    xs = np.array([2.0, 20.0, 3.0, 1.5])                  # three of four rows cut short
    with Recorded() as rec:
        assert f(xs).item() == 16.0 + 400.0 + 81.0 + 1.5 ** 4
    assert len(rec.vkml) == 1
    with Recorded() as rec:
        assert f(np.array([20.0, 50.0])).item() == 2900.0
    assert rec.vkml == []
    with Recorded() as rec:                                # and its gradient
        g = vkml.grad(_scan_of_loops("warn"))(xs).numpy()
    np.testing.assert_array_equal(g, [32.0, 40.0, 108.0, 4 * 1.5 ** 3])
    assert len(rec.vkml) == 1
    with pytest.raises(vkml.ExecutionError, match=MESSAGE):
        vkml.jit(_scan_of_loops("raise"))(xs).numpy()
    with Recorded() as rec:
        vkml.jit(_scan_of_loops("ignore"))(xs).numpy()
    assert rec.vkml == []
    assert_compiled(vk_backend)


# -- the primitive ---------------------------------------------------------------------------------------

@on_backends
def test_checked_refuses_a_flag_that_is_not_a_bool_scalar(vk_backend):
    x = vkml.tensor(np.ones(3)).ir_var
    with pytest.raises(vkml.ShapeError, match="checked: the flag must be a bool scalar"):
        checked(x, np.array([True, False]), "m")
    with pytest.raises(vkml.DTypeError, match="checked: the flag must be a bool scalar"):
        checked(x, np.int32(1), "m")
    with pytest.raises(vkml.ArgumentError, match="mode is 'warn' or 'raise'"):
        checked(x, np.bool_(True), "m", mode="loud")


@on_backends
def test_a_result_never_used_is_never_checked(vk_backend):
    """The check is an identity on the loop's result: it runs exactly when the result is used."""
    f = vkml.jit(lambda a: (doubling(a), a * 2.0)[1])
    with Recorded() as rec:
        assert f(np.float64(2.0)).item() == 4.0
    assert rec.vkml == []


# -- the CUDA backend's generated kernels, on the host emulation and the emulated driver ------------

def _emulated(plan, args, avals, tmp_path, name):
    if CXX is None:
        pytest.skip("no C++ compiler")
    return emulate(host_library(plan.source, str(tmp_path), name), plan, args, avals)


def test_cuda_kernels_set_a_warning_word_once_the_loop_is_cut_short(tmp_path):
    plan = cuda_plan(vkml.program(vkml.vmap(doubling), np.zeros(3)))
    assert plan.warnings == [plan.warnings[0]] and MESSAGE in plan.warnings[0]
    assert plan.status_words == 5
    (out,), status = _emulated(plan, [np.array([20.0, 2.0, 50.0])], [((3,), np.float64)],
                               tmp_path, "warn")
    np.testing.assert_array_equal(out, [400.0, 16.0, 2500.0])
    assert list(status) == [0, 0, 0, 0, 1]                 # no failure; the warning's word set
    (out,), status = _emulated(plan, [np.array([20.0, 50.0, 30.0])], [((3,), np.float64)],
                               tmp_path, "quiet")
    assert list(status) == [0, 0, 0, 0, 0]


def test_cuda_kernels_fail_with_the_checks_message(tmp_path):
    prog = vkml.program(lambda a: doubling(a, on_max_iters="raise") * 2.0, np.float64(0.0))
    plan = cuda_plan(prog)
    (out,), status = _emulated(plan, [np.array(2.0)], [((), np.float64)], tmp_path, "raise")
    code = int(status[0])
    assert code and plan.errors[code - 1] == "checked" and MESSAGE in plan.messages[code]
    (out,), status = _emulated(plan, [np.array(20.0)], [((), np.float64)], tmp_path, "fine")
    assert status[0] == 0 and out == 800.0


def test_the_cuda_backend_warns_once_per_run_and_raises_on_an_emulated_driver():
    """(The raise also checks that a block kernel failing on thread 0 right after a barrier stops
    every thread: it used to leave thread 0 waiting at the next barrier.)"""
    if CXX is None:
        pytest.skip("no C++ compiler")
    with fake_driver():
        backend = vkml.set_backend("cuda")
        try:
            f = vkml.jit(vkml.vmap(doubling))
            with Recorded() as rec:
                np.testing.assert_array_equal(f(np.array([20.0, 2.0])).numpy(), [400.0, 16.0])
                assert len(rec.vkml) == 1 and rec.vkml[0].filename == __file__
                np.testing.assert_array_equal(f(np.array([20.0, 50.0])).numpy(), [400.0, 2500.0])
                assert len(rec.vkml) == 1
            quiet = vkml.jit(vkml.vmap(lambda a: doubling(a, on_max_iters="ignore")))
            with Recorded() as rec:
                np.testing.assert_array_equal(quiet(np.array([20.0, 2.0])).numpy(), [400.0, 16.0])
            assert rec.vkml == []
            raising = vkml.jit(lambda a: doubling(a, on_max_iters="raise"))
            with pytest.raises(vkml.ExecutionError, match=MESSAGE):
                raising(np.float64(2.0)).numpy()
            assert raising(np.float64(20.0)).item() == 400.0
            assert backend.fallbacks == 0
        finally:
            vkml.set_backend("numpy")
