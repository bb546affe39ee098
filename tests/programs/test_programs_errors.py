"""Bad arguments to the programs API: each is a VkmlError naming the function and the fix.

No internal exception (TypeError, ValueError, KeyError, IndexError, OverflowError,
StopIteration) may leak from scan, while_loop, switch, vmap, custom_vjp, grad, jit,
jacfwd, hessian or check_grads, and a refused call leaves the caches as they were.
"""

import numpy as np
import pytest

import vkml

X = np.arange(3.0)


def step(c, _):
    return c + 1.0, c


def square_sum(a):
    return vkml.sum(a * a)


def _cvjp(fwd, bwd, fun=lambda a: a * 2):
    f = vkml.custom_vjp(fun)
    f.defvjp(fwd, bwd)
    return f


CASES = [
    # scan(length=)
    ("scan length str", lambda: vkml.scan(step, 0.0, None, length="3"), vkml.ArgumentError, r"scan: length"),
    ("scan length negative", lambda: vkml.scan(step, 0.0, None, length=-1), vkml.ArgumentError, r"scan: length must be an int >= 0"),
    ("scan length float", lambda: vkml.scan(step, 0.0, None, length=2.5), vkml.ArgumentError, r"scan: length"),
    ("scan length bool", lambda: vkml.scan(step, 0.0, None, length=True), vkml.ArgumentError, r"scan: length"),
    ("scan length huge", lambda: vkml.scan(step, 0.0, None, length=10 ** 30), vkml.ArgumentError, r"scan: length"),
    ("scan step not callable", lambda: vkml.scan(3, 0.0, X), vkml.ArgumentError, r"scan: the step must be callable"),
    # while_loop(max_iters=)
    ("while max_iters str", lambda: vkml.while_loop(lambda c: c < 3, lambda c: c + 1, 0.0, max_iters="a"),
     vkml.ArgumentError, r"while_loop: max_iters must be an int >= 1"),
    ("while max_iters zero", lambda: vkml.while_loop(lambda c: c < 3, lambda c: c + 1, 0.0, max_iters=0),
     vkml.ArgumentError, r"while_loop: max_iters"),
    ("while max_iters inf", lambda: vkml.while_loop(lambda c: c < 3, lambda c: c + 1, 0.0, max_iters=float("inf")),
     vkml.ArgumentError, r"while_loop: max_iters"),
    ("while max_iters huge", lambda: vkml.while_loop(lambda c: c < 3, lambda c: c + 1, 0.0, max_iters=10 ** 30),
     vkml.ArgumentError, r"while_loop: max_iters"),
    ("while on_max_iters", lambda: vkml.while_loop(lambda c: c < 3, lambda c: c + 1, 0.0, max_iters=4, on_max_iters="loud"),
     vkml.ArgumentError, r"on_max_iters must be 'warn', 'raise' or 'ignore'"),
    ("while body not callable", lambda: vkml.while_loop(lambda c: c < 3, None, 0.0),
     vkml.ArgumentError, r"while_loop: the body must be callable"),
    # switch / cond
    ("switch branches not a list", lambda: vkml.switch(0, lambda a: a, 1.0), vkml.ArgumentError, r"switch: branches"),
    ("switch no branches", lambda: vkml.switch(0, [], 1.0), vkml.ArgumentError, r"switch: branches"),
    ("switch branch not callable", lambda: vkml.switch(0, [1, 2], 1.0), vkml.ArgumentError, r"switch: branch 0"),
    ("switch float index", lambda: vkml.switch(1.5, [lambda a: a, lambda a: a], 1.0), vkml.ArgumentError,
     r"switch: the index must be an integer"),
    ("switch vector index", lambda: vkml.switch(np.array([0, 1]), [lambda a: a], 1.0), vkml.ShapeError,
     r"switch: the index must be a scalar"),
    ("cond vector predicate", lambda: vkml.cond(np.array([True, False]), lambda a: a, lambda a: a, 1.0),
     vkml.ShapeError, r"cond: the predicate must be a scalar"),
    # vmap(in_axes=, out_axes=)
    ("vmap in_axes str", lambda: vkml.vmap(lambda a: a, in_axes="0")(X), vkml.ArgumentError, r"vmap: in_axes entries"),
    ("vmap in_axes float", lambda: vkml.vmap(lambda a: a, in_axes=0.5)(X), vkml.ArgumentError, r"vmap: in_axes entries"),
    ("vmap in_axes bool", lambda: vkml.vmap(lambda a: a, in_axes=True)(X), vkml.ArgumentError, r"vmap: in_axes entries"),
    ("vmap in_axes count", lambda: vkml.vmap(lambda a, b: a, in_axes=(0,))(X, X), vkml.ArgumentError,
     r"vmap: in_axes has 1 entries for 2 arguments"),
    ("vmap in_axes out of range", lambda: vkml.vmap(lambda a: a, in_axes=10 ** 30)(X), vkml.ShapeError,
     r"vmap: in_axes .* out of range"),
    ("vmap in_axes dict for two args", lambda: vkml.vmap(lambda a, b: a, in_axes={"a": 0})(X, X),
     vkml.ArgumentError, r"vmap: in_axes .* one entry per argument"),
    ("vmap out_axes str", lambda: vkml.vmap(lambda a: a, out_axes="x")(X), vkml.ShapeError, r"vmap: out_axes"),
    ("vmap not callable", lambda: vkml.vmap(5), vkml.ArgumentError, r"vmap: the function must be callable"),
    # custom_vjp's fwd and bwd
    ("custom_vjp fwd not a pair", lambda: _cvjp(lambda a: a * 2, lambda r, g: (g,))(X), vkml.ArgumentError,
     r"fwd must return \(out, residuals\)"),
    ("custom_vjp fwd out structure", lambda: vkml.grad(lambda a: vkml.sum(
        _cvjp(lambda a: ((a * 2, a), a), lambda r, g: (g,))(a)))(X), vkml.ShapeError, r"fwd's out must be the function's result"),
    ("custom_vjp fwd out shape", lambda: _cvjp(lambda a: (a[:2], a), lambda r, g: (g,))(X), vkml.ShapeError,
     r"fwd's out must be the function's result"),
    ("custom_vjp bwd not a tuple", lambda: vkml.grad(lambda a: vkml.sum(
        _cvjp(lambda a: (a * 2, a), lambda r, g: g * 2)(a)))(X), vkml.ArgumentError, r"bwd must return a tuple of 1"),
    ("custom_vjp bwd wrong shape", lambda: vkml.grad(lambda a: vkml.sum(
        _cvjp(lambda a: (a * 2, a), lambda r, g: (g[:2],))(a)))(X), vkml.ShapeError, r"cotangent 0 has shape \[2\]"),
    ("custom_vjp bwd wrong structure", lambda: vkml.grad(lambda a: vkml.sum(
        _cvjp(lambda a: (a * 2, a), lambda r, g: ((g, g),))(a)))(X), vkml.ShapeError, r"cotangent 0 has structure"),
    ("custom_vjp defvjp not callable", lambda: vkml.custom_vjp(lambda a: a).defvjp(1, 2), vkml.ArgumentError,
     r"defvjp: fwd must be callable"),
    ("custom_vjp nondiff_argnums bad", lambda: vkml.custom_vjp(lambda a: a, nondiff_argnums=("x",)),
     vkml.ArgumentError, r"nondiff_argnums"),
    ("custom_vjp nondiff_argnums out of range", lambda: _nondiff_out_of_range(), vkml.ArgumentError,
     r"nondiff_argnums .* out of range"),
    # grad(argnums=)
    ("grad argnums out of range", lambda: vkml.grad(square_sum, argnums=5)(X), vkml.ArgumentError,
     r"grad: argnums 5 is out of range"),
    ("grad argnums huge", lambda: vkml.grad(square_sum, argnums=10 ** 30)(X), vkml.ArgumentError, r"grad: argnums"),
    ("grad argnums str", lambda: vkml.grad(square_sum, argnums="0"), vkml.ArgumentError,
     r"grad: argnums must be an int or a tuple of ints"),
    ("grad argnums float", lambda: vkml.grad(square_sum, argnums=0.0), vkml.ArgumentError, r"grad: argnums"),
    ("grad argnums None", lambda: vkml.grad(square_sum, argnums=None), vkml.ArgumentError, r"grad: argnums"),
    ("grad argnums bool", lambda: vkml.grad(square_sum, argnums=True), vkml.ArgumentError, r"grad: argnums"),
    ("value_and_grad argnums", lambda: vkml.value_and_grad(square_sum, argnums=(0, 2))(X), vkml.ArgumentError,
     r"value_and_grad: argnums"),
    ("grad not callable", lambda: vkml.grad(3), vkml.ArgumentError, r"grad: the function must be callable"),
    # jit static arguments
    ("jit unhashable static", lambda: vkml.jit(lambda a, b: a, static_argnums=1)(X, [1]), vkml.ArgumentError,
     r"static argument 1 is a list, which is unhashable"),
    ("jit static_argnums str", lambda: vkml.jit(lambda a: a, static_argnums="0"), vkml.ArgumentError,
     r"jit: static_argnums"),
    ("jit static_argnums out of range", lambda: vkml.jit(lambda a: a, static_argnums=3)(X), vkml.ArgumentError,
     r"static_argnums.*out of range"),
    # jacfwd, jacrev, hessian
    ("jacfwd argnums", lambda: vkml.jacfwd(lambda a: a * 2, argnums=3)(X), vkml.ArgumentError, r"jacfwd: argnums 3"),
    ("jacfwd int input", lambda: vkml.jacfwd(lambda a: a * 2)(np.arange(3)), vkml.GradError, r"jacfwd: .*int64"),
    ("jacfwd not callable", lambda: vkml.jacfwd(None), vkml.ArgumentError, r"jacfwd: the function must be callable"),
    ("jacrev int output", lambda: vkml.jacrev(lambda a: vkml.argmax(a))(X), vkml.GradError, r"jacrev: result leaf 0"),
    ("hessian argnums", lambda: vkml.hessian(square_sum, argnums="a"), vkml.ArgumentError, r"hessian: argnums"),
    ("hessian has_aux not a pair", lambda: vkml.hessian(square_sum, has_aux=True)(X), vkml.ArgumentError,
     r"has_aux=True"),
    # check_grads
    ("check_grads args not a tuple", lambda: vkml.check_grads(square_sum, X), vkml.ArgumentError,
     r"check_grads: args must be a tuple"),
    ("check_grads order", lambda: vkml.check_grads(square_sum, (X,), order=0), vkml.ArgumentError,
     r"check_grads: order"),
    ("check_grads modes", lambda: vkml.check_grads(square_sum, (X,), modes=("sideways",)), vkml.ArgumentError,
     r"check_grads: modes"),
    ("check_grads modes str", lambda: vkml.check_grads(square_sum, (X,), modes="fwd"), vkml.ArgumentError,
     r"check_grads: modes"),
    ("check_grads eps", lambda: vkml.check_grads(square_sum, (X,), eps=-1), vkml.ArgumentError, r"check_grads: eps"),
    ("check_grads str argument", lambda: vkml.check_grads(square_sum, ("a",)), vkml.ArgumentError,
     r"check_grads: argument 0"),
    ("check_grads not callable", lambda: vkml.check_grads(None, (X,)), vkml.ArgumentError,
     r"check_grads: the function must be callable"),
    # fori_loop, associative_scan
    ("fori_loop float bound", lambda: vkml.fori_loop(0, 2.5, lambda i, c: c, 0.0), vkml.ArgumentError,
     r"fori_loop: upper must be an int"),
    ("fori_loop body", lambda: vkml.fori_loop(0, 2, None, 0.0), vkml.ArgumentError, r"fori_loop: the body"),
    ("associative_scan lengths", lambda: vkml.associative_scan(lambda a, b: a, (np.ones(3), np.ones(4))),
     vkml.ShapeError, r"associative_scan: the leaves"),
    ("associative_scan axis", lambda: vkml.associative_scan(lambda a, b: a + b, np.ones(3), axis=2),
     vkml.ShapeError, r"associative_scan: axis 2"),
    ("associative_scan fn structure", lambda: vkml.associative_scan(lambda a, b: (a, b), np.ones(3)),
     vkml.ShapeError, r"associative_scan: fn returns"),
    # found by the fuzz suite: a function that is None, flags that are arrays, counts beyond reach
    *[(f"{name} of None", call, vkml.ArgumentError, rf"{name}: the function must be callable")
      for name, call in [("checkpoint", lambda: vkml.checkpoint(None)),
                         ("jvp", lambda: vkml.jvp(None, (X,), (X,))),
                         ("vjp", lambda: vkml.vjp(None, X)),
                         ("linearize", lambda: vkml.linearize(None, X)),
                         ("program", lambda: vkml.program(None, X)),
                         ("hvp", lambda: vkml.hvp(None, (X,), (X,)))]],
    *[(f"{name} has_aux array", lambda t=t: t(square_sum, has_aux=np.array(["a", "b"])),
       vkml.ArgumentError, rf"{name}: has_aux must be True or False")
      for name, t in [("grad", vkml.grad), ("value_and_grad", vkml.value_and_grad),
                      ("jacfwd", vkml.jacfwd), ("jacrev", vkml.jacrev), ("hessian", vkml.hessian)]],
    ("scan reverse dict", lambda: vkml.scan(step, 0.0, X, reverse={}), vkml.ArgumentError,
     r"scan: reverse must be True or False"),
    ("scan step a class", lambda: vkml.scan(float, 0.0, X), vkml.ArgumentError,
     r"scan: the step must be a function, got the class float"),
    ("associative_scan reverse array", lambda: vkml.associative_scan(
        lambda a, b: a + b, np.ones(3), reverse=np.ones(2)), vkml.ArgumentError,
     r"associative_scan: reverse must be True or False"),
    ("hvp primals None", lambda: vkml.hvp(square_sum, None, (X,)), vkml.ArgumentError,
     r"hvp: primals must be a list or tuple"),
    ("jvp tangents an int", lambda: vkml.jvp(square_sum, (X,), 3), vkml.ArgumentError,
     r"jvp: tangents must be a list or tuple"),
    ("fori_loop bound beyond int64", lambda: vkml.fori_loop(0, 2 ** 70, lambda i, c: c, 0.0),
     vkml.ArgumentError, r"fori_loop: upper must be at most"),
    ("fori_loop too many iterations", lambda: vkml.fori_loop(-2 ** 62, 2 ** 62, lambda i, c: c, 0.0),
     vkml.ArgumentError, r"fori_loop: upper - lower \(the number of iterations\) must be at most"),
    ("check_grads order huge", lambda: vkml.check_grads(square_sum, (X,), order=2 ** 70),
     vkml.ArgumentError, r"check_grads: order must be at most 8"),
    ("check_grads modes None", lambda: vkml.check_grads(square_sum, (X,), modes=None),
     vkml.ArgumentError, r"check_grads: modes must be"),
    ("check_grads rtol str", lambda: vkml.check_grads(square_sum, (X,), rtol="a"),
     vkml.ArgumentError, r"check_grads: rtol must be a finite number"),
    ("check_grads seed negative", lambda: vkml.check_grads(square_sum, (X,), seed=-3),
     vkml.ArgumentError, r"check_grads: seed must be at least 0"),
    ("check_grads too many args", lambda: vkml.check_grads(square_sum, (X, X)),
     vkml.ArgumentError, r"check_grads: the function cannot take the 2 argument"),
]


def _nondiff_out_of_range():
    f = vkml.custom_vjp(lambda k, a: a, nondiff_argnums=(3,))
    f.defvjp(lambda k, a: (a, None), lambda k, r, g: (g,))
    return f(1.0, X)


@pytest.mark.parametrize("call, error, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_is_a_vkml_error_naming_the_function_and_fix(call, error, message):
    with pytest.raises(error, match=message) as info:
        call()
    assert isinstance(info.value, vkml.VkmlError)


@pytest.mark.parametrize("index, expected", [(0, 1.0), (1, 2.0), (2, 3.0), (7, 3.0), (2 ** 33, 3.0),
                                             (2 ** 32, 3.0), (-1, 1.0), (-2 ** 40, 1.0)])
def test_switch_index_clamps_like_jax_instead_of_wrapping(index, expected):
    branches = [lambda a: a, lambda a: a * 2, lambda a: a * 3]
    assert vkml.switch(np.int64(index), branches, 1.0).item() == expected
    if abs(index) < 2 ** 62:
        assert vkml.switch(index, branches, 1.0).item() == expected


def test_cond_takes_a_number_as_a_truth_value():
    assert vkml.cond(2.5, lambda a: a + 1, lambda a: a - 1, 1.0).item() == 2.0
    assert vkml.cond(0, lambda a: a + 1, lambda a: a - 1, 1.0).item() == 0.0


def test_a_refused_grad_leaves_the_cache_unchanged():
    g = vkml.grad(square_sum)
    g(X)
    before = g.cache_info()
    with pytest.raises(vkml.ArgumentError):
        vkml.grad(square_sum, argnums=4)(X)
    assert g.cache_info() == before


def test_custom_vjp_refusal_leaves_it_usable():
    f = vkml.custom_vjp(lambda a: a * 2)
    f.defvjp(lambda a: (a * 2, a), lambda r, g: (g[:2],))
    with pytest.raises(vkml.ShapeError):
        vkml.grad(lambda a: vkml.sum(f(a)))(X)
    f.defvjp(lambda a: (a * 2, a), lambda r, g: (g * 2,))
    np.testing.assert_allclose(vkml.grad(lambda a: vkml.sum(f(a)))(X).numpy(), [2.0, 2.0, 2.0])


def test_jit_static_arguments_are_part_of_the_key():
    calls = []

    def f(a, n):
        calls.append(n)
        return a * n

    jf = vkml.jit(f, static_argnums=(1,))
    np.testing.assert_allclose(jf(X, 2).numpy(), X * 2)
    np.testing.assert_allclose(jf(X, 2).numpy(), X * 2)
    np.testing.assert_allclose(jf(X, 3).numpy(), X * 3)
    assert calls == [2, 3]
    assert jf.cache_info()["traces"] == 2
    decorated = vkml.jit(static_argnums=0)(lambda n, a: a ** n)
    np.testing.assert_allclose(decorated(2, X).numpy(), X ** 2)


@pytest.mark.parametrize("thing", [3, None, "program", np.ones(2), lambda x: x])
def test_pp_program_of_anything_but_a_program_is_refused_with_what_to_do(thing):
    with pytest.raises(vkml.ArgumentError, match=r"pp_program: expected a vkml Program, got .*"
                                                 r"vkml\.program\(fn, \*args\)"):
        vkml.pp_program(thing)
