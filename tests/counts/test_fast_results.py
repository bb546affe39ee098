"""The shortcuts of a tiny jitted call give what the general code gives.

- the result Tensor of a plain call is built field by field (no ``__init__`` calls): every field
  of its Var and of the Tensor holds what the constructors would have put there;
- the NumPy backend's generated run hands a ufunc's result out without ``np.asarray``: every
  result is still an array, 0-d ones included;
- a plain call's key starts with the call context; calls alternating between plans each get
  their own, and Tensors sharing one value take the full path wherever they stand;
- a compiled executable whose pool is taken (a call running in another thread) computes on
  fresh arrays and leaves the pool's alone; a program of a few microseconds is called holding
  the GIL, a longer one lets other threads run meanwhile, with the same results.
"""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu
from vkml.ir import Var, current_serial
from vkml.tensor import Tensor

from backends_under_test import BACKENDS
from test_speed_counts import _compiled


def _fields(obj):
    return {name: getattr(obj, name) for name in type(obj).__slots__ if name != "__weakref__"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_plain_calls_result_has_the_fields_the_constructors_give(backend, monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        f = vkml.jit(lambda a, b: a + b)
        a, b = np.arange(4.0), np.ones(4)
        for _ in range(3):                          # a plan, then (cpu) the compiled function
            f(a, b)
        before = current_serial()
        got = f(a, b)
        assert current_serial() == before + 1       # one Var made, with the next serial
        var = got.ir_var
        want = Tensor(Var(var.shape, var.dtype, var.device, None, var.value))
        assert type(got) is Tensor and type(var) is Var
        want_var = _fields(want.ir_var)
        assert want_var.pop("serial") == before + 1
        got_var = _fields(var)
        assert got_var.pop("serial") == before
        assert got_var == want_var
        assert want_var["value"] is var.value and want_var["weak"] is False
        assert {k: v for k, v in _fields(got).items() if k != "ir_var"} == \
               {k: v for k, v in _fields(want).items() if k != "ir_var"}
        assert got.numpy().tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("shape", [(), (3,), (2, 3)])
def test_the_numpy_run_hands_out_arrays_only(shape):
    with vkml.use_backend("numpy"):
        f = vkml.jit(lambda a, b: (a + b, a * b, -a))
        a, b = np.full(shape, 2.0), np.full(shape, 3.0)
        for _ in range(2):
            results = f(a, b)
        exe = f._fast[vkml.programs.arguments.fast_key((a, b))].call
        for value in exe([a, b]):
            assert type(value) is np.ndarray and value.shape == shape
        assert [r.numpy().tolist() for r in results] == \
               [np.full(shape, v).tolist() for v in (5.0, 6.0, -2.0)]


needs_cc = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


@needs_cc
def test_a_call_finding_the_pool_taken_computes_on_arrays_of_its_own(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend("cpu"):
        f = vkml.jit(lambda x: x * 2.0 + 1.0)
        x = np.arange(6.0)
        f(x), f(x)
        pool = _compiled(f)._pool
        pooled = f(x).numpy()                       # the pool's array, dropped by its Tensor
        allocations = pool.allocations
        pool.free.pop()                             # as a call running in another thread does
        try:
            results = [f(np.full(6, float(k))) for k in range(3)]
        finally:
            pool.free.append(True)
        assert [r.numpy().tolist() for r in results] == [[2.0 * k + 1.0] * 6 for k in range(3)]
        assert all(not np.shares_memory(r.numpy(), pooled) for r in results)
        assert pool.allocations == allocations and pool.free == [True]
        assert pooled.tolist() == (x * 2.0 + 1.0).tolist()     # the pool's array untouched
        assert f(x).numpy().tolist() == (x * 2.0 + 1.0).tolist()


@needs_cc          # (x * 3 - 1: two element operations per element)
@pytest.mark.parametrize("size, quick", [(8, True), (cpu.QUICK_WORK // 4, True),
                                         (4 * cpu.QUICK_WORK, False)])
def test_only_a_program_of_a_few_microseconds_keeps_the_gil(size, quick, monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend("cpu"):
        f = vkml.jit(lambda x: x * 3.0 - 1.0)
        x = np.linspace(-1, 1, size)
        f(x), f(x)
        exe = _compiled(f)
        assert exe.quick is quick
        assert isinstance(exe._pool.fn, cpu._HOLDING_GIL) is quick
        for _ in range(2):
            assert np.array_equal(f(x).numpy(), x * 3.0 - 1.0)


def test_a_plain_calls_key_starts_with_the_call_context():
    from vkml.programs.arguments import fast_key as _fast_key
    from vkml.runtime import call_context
    args = (np.ones(3), vkml.tensor(np.ones(3)))
    for backend in BACKENDS:
        with vkml.use_backend(backend):
            for mode in (False, True):
                with vkml.deterministic_matmul(mode):
                    context = call_context()
                    assert _fast_key(args)[:len(context)] == context
                    assert len(_fast_key(args)) == len(context) + 3 + 5    # an array, a Tensor


@pytest.mark.parametrize("backend", BACKENDS)
def test_calls_alternating_between_plans_each_get_their_own(backend, monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend(backend):
        f = vkml.jit(lambda a, b: a * b)
        small, big = np.arange(3.0), np.arange(5.0)
        t = vkml.tensor(np.full(3, 2.0))
        for _ in range(4):                  # the last call's plan is another one each time
            assert f(small, small).numpy().tolist() == [0.0, 1.0, 4.0]
            assert f(big, big).numpy().tolist() == [0.0, 1.0, 4.0, 9.0, 16.0]
            assert f(small, t).numpy().tolist() == [0.0, 2.0, 4.0]
            assert f(big.reshape(5, 1), big).shape == (5, 5)
        # (an array and a Tensor of one type share a program, not a plan)
        assert f.cache_info()["traces"] == 3 and len(f._fast) == 4
        before = vkml.stats()
        f(big, big), f(big, big)
        assert (vkml.stats() - before).traces == 0
        vkml.clear_caches()                 # the last call's plan goes with the others
        before = vkml.stats()
        assert f(big, big).numpy().tolist() == [0.0, 1.0, 4.0, 9.0, 16.0]
        assert (vkml.stats() - before).traces == 1


def _host(x):
    return x.numpy() if isinstance(x, vkml.Tensor) else x


def test_tensors_sharing_a_value_take_the_full_path_wherever_they_stand():
    from vkml.programs.arguments import fast_key as _fast_key
    f = vkml.jit(lambda a, b, c: a * 100.0 + b * 10.0 + c)
    t, u, w = (vkml.tensor(np.full(2, float(k))) for k in (1, 2, 3))
    for a, b, c in [(t, u, w), (t, u, u), (u, t, u), (u, u, t), (t, t, t), (t, u, t),
                    (t, u, np.ones(2))]:
        shared = len({id(x) for x in (a, b, c) if isinstance(x, vkml.Tensor)}) < \
            sum(isinstance(x, vkml.Tensor) for x in (a, b, c))
        assert (_fast_key((a, b, c)) is None) is shared
        want = (_host(a) * 100.0 + _host(b) * 10.0 + _host(c)).tolist()
        for _ in range(2):
            assert f(a, b, c).numpy().tolist() == want
    g = vkml.jit(lambda a, b: a * 2.0 + b)
    assert _fast_key((t, t)) is None and _fast_key((t, u)) is not None
    assert g(t, u).numpy().tolist() == [4.0, 4.0] and g(t, t).numpy().tolist() == [3.0, 3.0]


def test_a_jitted_function_wraps_as_update_wrapper_does():
    import functools

    def body(x: np.ndarray, y) -> np.ndarray:
        """Adds."""
        return x + y
    body.note = "kept"
    f = vkml.jit(body)

    class Plain:
        pass
    want = functools.update_wrapper(Plain(), body)
    for name in (*functools.WRAPPER_ASSIGNMENTS, "__wrapped__", "note"):
        assert getattr(f, name) == getattr(want, name), name
    assert not hasattr(f, vkml.programs.jitted._OWN_JIT) and vkml.jit(body) is f
    assert f(np.ones(2), np.ones(2)).numpy().tolist() == [2.0, 2.0]


def test_a_callable_objects_attributes_never_replace_the_jitteds_own():
    class Doubler:
        def __init__(self):
            self.fn, self.hits, self.cache_info, self.note = None, "many", "info", "kept"

        def __call__(self, a):
            return a * 2.0
    f = vkml.jit(Doubler())
    for _ in range(3):
        assert f(np.ones(2)).numpy().tolist() == [2.0, 2.0]
    assert f.__name__ == "Doubler" and f.note == "kept" and f.cache_info()["hits"] == 2
