"""Traced programs: jit, scan, derived programs and their caches, the printer (first on the
running-sum scan of the tutorial "Programs and scan")."""

import autograd
import autograd.numpy as anp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vkml
from oracle import central_diff


def value(f):
    """A vkml function as a float-returning function of a NumPy array (for finite differences)."""
    return lambda x: float(np.asarray(f(x).numpy()))


# -- the running-sum scan of the tutorial ----------------------------------------------------------

SEED_PROGRAM = """\
program (xs)
  %1 : float64 [] at CPU = Map [0.0] at CPU
  %2 : float64 [] at CPU, sums : float64 [3] at CPU = scan 3 rows, init (%1), xs (xs), captures ()
    step
      program (%6, %7)
        nxt : float64 [] at CPU = Map [add(x0, x1)] (x0: float64 [] at CPU) (x1: float64 [] at CPU)
          with x0 = %6, x1 = %7
        return nxt, nxt
  %4 : float64 [3] at CPU = Map [mul(x0, x1)] (x0: float64 [3] at CPU) (x1: float64 [3] at CPU)
    with x0 = sums, x1 = sums
  %5 : float64 [] at CPU = Reduce [Sum x0] over [0] (x0: float64 [3] at CPU)
    with x0 = %4
  return %5"""


def running_sum_body(counter):
    def body(xs):
        counter[0] += 1

        def step(acc, row):
            nxt = acc + row
            return nxt, nxt
        _, sums = vkml.scan(step, np.float64(0.0), xs)
        return vkml.sum(sums * sums)
    return body


def test_seed_one_call():
    vkml.clear_caches()         # from a fresh process's state: another test may have compiled these programs
    runs = [0]
    f = vkml.jit(running_sum_body(runs))
    g1 = vkml.grad(f)(np.array([1.0, 2.0, 3.0]))
    first = f.cache_info()
    g2 = vkml.grad(f)(np.array([0.0, 0.0, 1.0]))
    second = f.cache_info()
    assert g1.dtype == np.float64 and g1.shape == (3,)
    assert g1.numpy().tolist() == [20, 18, 12]
    assert g2.numpy().tolist() == [2, 2, 2]
    assert runs[0] == 1                                   # "1 run"
    assert first["traces"] == 1 and first["derived"] >= 3
    # known and transposed parts compiled (a compiled tier may find them in its disk cache)
    assert first["compiles"] >= 2 or vkml.backend_info()["backend"] != "numpy"
    # the second gradient traced, derived and compiled nothing
    assert (second["traces"], second["derived"], second["compiles"]) == \
        (first["traces"], first["derived"], first["compiles"])
    assert second["hits"] == first["hits"] + 1


def test_seed_program_text():
    prog = vkml.program(running_sum_body([0]), np.array([1.0, 2.0, 3.0]))
    # the tutorial's program text, with the placement of the backend it was traced on ("at GPU" on cuda)
    want = SEED_PROGRAM.replace(" at CPU", f" at {vkml.backends.current().device}")
    assert str(prog) == want
    assert vkml.pp_program(prog) == want
    assert sum(1 for e in prog.eqns if e.prim.name == "scan") == 1


def test_derived_programs_are_listed_and_print():
    f = vkml.jit(running_sum_body([0]))
    vkml.grad(f)(np.array([1.0, 2.0, 3.0]))
    derived = f.derived_programs()[0]
    assert {"jvp", "known", "linear", "transposed"} <= set(derived)
    # the transpose runs the step's transpose from the last row to the first
    assert "scan 3 rows reversed" in str(derived["transposed"])
    # the known part's loop keeps nothing per step: its scan returns only the carry and the sums
    known = derived["known"]
    scan = next(e for e in known.eqns if e.prim.name == "scan")
    assert len(scan.outputs) == 2


def test_scan_gradient_program_size_does_not_grow_with_rows():
    sizes = []
    for n in (10, 10_000):
        f = vkml.jit(running_sum_body([0]))
        vkml.grad(f)(np.linspace(0, 1, n))
        d = f.derived_programs()[0]
        sizes.append((len(d["known"].eqns), len(d["transposed"].eqns), len(d["jvp"].eqns)))
    assert sizes[0] == sizes[1]


def test_values_never_retrace_new_shapes_do():
    f = vkml.jit(lambda x, s: x * s + 1)
    for k in range(4):
        assert f(np.full(3, float(k)), 2.0).numpy().tolist() == [2 * k + 1] * 3
    assert f.cache_info()["traces"] == 1 and f.cache_info()["compiles"] == 1
    f(np.ones(4), 2.0)
    f(np.ones(3, np.float32), 2.0)
    assert f.cache_info()["traces"] == 3
    assert f(np.ones(2, np.float32), 2.0).dtype == np.float32       # a Python scalar is weak


def test_pytrees_in_and_out():
    f = vkml.jit(lambda d: {"s": d["a"] + d["b"][0], "p": [d["a"] * d["b"][1], None]})
    out = f({"a": np.ones(2), "b": (np.full(2, 2.0), np.full(2, 3.0))})
    assert out["s"].numpy().tolist() == [3, 3] and out["p"][0].numpy().tolist() == [3, 3]
    assert out["p"][1] is None


def test_keys_cannot_alias():
    f = vkml.jit(lambda a, b: a * 2 + b)
    t = vkml.tensor(np.ones(3))
    u = vkml.tensor(np.arange(3.0))
    assert f(t, t).numpy().tolist() == [3, 3, 3]
    assert f(t, u).numpy().tolist() == [2, 3, 4]      # not the program of f(t, t) read as one array
    g = vkml.jit(lambda a, b: a * 2 + b)
    assert g(t, u).numpy().tolist() == [2, 3, 4]
    assert g(t, t).numpy().tolist() == [3, 3, 3]


def test_jit_interop_with_lazy_autograd():
    rng = np.random.default_rng(0)
    W, X = rng.normal(size=(3, 2)), rng.normal(size=(4, 3))

    def body(x, w):
        return vkml.tanh(x @ w)

    fj = vkml.jit(body)
    w1 = vkml.tensor(W, requires_grad=True)
    w2 = vkml.tensor(W, requires_grad=True)
    (fj(vkml.tensor(X), w1) ** 2).sum().backward()
    (body(vkml.tensor(X), w2) ** 2).sum().backward()
    want = autograd.grad(lambda w: anp.sum(anp.tanh(X @ w) ** 2))(W)
    np.testing.assert_allclose(w1.grad.numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(w2.grad.numpy(), want, rtol=1e-12)


# -- derivatives of compositions against finite differences and autograd -----------------------------

RNG = np.random.default_rng(42)
A = RNG.normal(size=(3, 4))
B = RNG.normal(size=(4, 2))
C = RNG.normal(size=(2,))

COMPOSITIONS = {
    "matmul chain + broadcasting": (
        lambda x: vkml.sum(vkml.tanh(x @ A @ B + C) ** 2),
        lambda x: anp.sum(anp.tanh(x @ A @ B + C) ** 2), (5, 3)),
    "reductions over several axes": (
        lambda x: vkml.sum(vkml.mean(x * x, axis=(0, 2)) * vkml.max(x, axis=1).sum()),
        lambda x: anp.sum(anp.mean(x * x, axis=(0, 2)) * anp.sum(anp.max(x, axis=1))), (2, 3, 4)),
    "indexing": (
        lambda x: vkml.sum(x[1:, ::-1][[0, 2]] ** 3) + x[0, 1] * x[-1, -1],
        lambda x: anp.sum(x[1:, ::-1][[0, 2]] ** 3) + x[0, 1] * x[-1, -1], (4, 3)),
    "softmax cross-entropy": (
        lambda x: -vkml.sum(vkml.log_softmax(x, axis=1)[np.arange(3), np.array([0, 2, 1])]),
        lambda x: -anp.sum((x - anp.log(anp.sum(anp.exp(x), axis=1, keepdims=True)))[
            np.arange(3), np.array([0, 2, 1])]), (3, 3)),
}


@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_grad_of_compositions(name):
    vf, af, shape = COMPOSITIONS[name]
    x = RNG.normal(size=shape)
    g = vkml.grad(vf)(x).numpy()
    np.testing.assert_allclose(g, autograd.grad(af)(x), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, central_diff(value(vf), x), rtol=1e-5, atol=1e-7)
    # vjp and jvp agree with the same oracle
    out, pb = vkml.vjp(vf, x)
    np.testing.assert_allclose(pb(np.float64(1.0))[0].numpy(), g, rtol=1e-12)
    v = RNG.normal(size=shape)
    _, t = vkml.jvp(vf, (x,), (v,))
    np.testing.assert_allclose(t.item(), np.sum(g * v), rtol=1e-10)


def scan_pytree(x):
    """A pytree carry (dict of two leaves) and two outputs per row."""
    def step(c, row):
        h = vkml.tanh(c["h"] * 0.5 + row)
        return {"h": h, "n": c["n"] + h.sum()}, (h * h, h.sum())
    carry, (ys, sums) = vkml.scan(step, {"h": np.zeros(3), "n": np.float64(0.0)}, x)
    return carry["n"] + vkml.sum(ys) + vkml.sum(sums * sums)


def scan_pytree_np(x):
    h, n, total = anp.zeros(3), 0.0, 0.0
    for row in x:
        h = anp.tanh(h * 0.5 + row)
        n = n + anp.sum(h)
        total = total + anp.sum(h * h) + anp.sum(h) ** 2
    return n + total


def scan_reverse(x):
    _, ys = vkml.scan(lambda c, r: (c * 0.9 + vkml.sin(r), c * r), np.float64(1.0), x, reverse=True)
    return vkml.sum(ys)


def scan_reverse_np(x):
    c, total = 1.0, 0.0
    for r in x[::-1]:
        total = total + c * r
        c = c * 0.9 + anp.sin(r)
    return total


def scan_nested(x):
    def outer(c, row):
        inner, ys = vkml.scan(lambda a, v: (a * v + 1.0, a), c, row)
        return inner, vkml.sum(ys)
    c, outs = vkml.scan(outer, np.float64(0.5), x)
    return c + vkml.sum(outs * outs)


def scan_nested_np(x):
    c, total = 0.5, 0.0
    for row in x:
        a, s = c, 0.0
        for v in row:
            s = s + a
            a = a * v + 1.0
        c = a
        total = total + s * s
    return c + total


def scan_capture(x):
    w = vkml.tensor(np.array([0.3, -0.2, 0.5]))
    _, ys = vkml.scan(lambda c, r: (c + w * r, (c * w).sum()), vkml.zeros(3, np.float64), x)
    return vkml.sum(ys ** 2)


def scan_capture_np(x):
    w = np.array([0.3, -0.2, 0.5])
    c, total = anp.zeros(3), 0.0
    for r in x:
        total = total + anp.sum(c * w) ** 2
        c = c + w * r
    return total


SCANS = {"pytree carry": (scan_pytree, scan_pytree_np, (5, 3)),
         "reverse": (scan_reverse, scan_reverse_np, (6,)),
         "scan inside scan": (scan_nested, scan_nested_np, (3, 4)),
         "captured tensor": (scan_capture, scan_capture_np, (4, 3))}


@pytest.mark.parametrize("name", sorted(SCANS))
def test_grad_of_scans(name):
    vf, af, shape = SCANS[name]
    x = RNG.uniform(0.2, 0.9, size=shape)
    g = vkml.grad(vf)(x).numpy()
    np.testing.assert_allclose(g, autograd.grad(af)(x), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(g, central_diff(value(vf), x), rtol=1e-5, atol=1e-7)
    # the same function lazily, op by op, through backward
    t = vkml.tensor(x, requires_grad=True)
    vf(t).backward()
    np.testing.assert_allclose(t.grad.numpy(), g, rtol=1e-12)


def test_scan_with_captured_parameter_gets_its_gradient_lazily():
    w = vkml.tensor(np.array([0.5, -1.0]), requires_grad=True)
    xs = vkml.tensor(np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]]))
    _, ys = vkml.scan(lambda c, r: (c * w + r, (c * w).sum()), vkml.zeros(2, np.float64), xs)
    (ys ** 2).sum().backward()

    def ref(w):
        c, total = anp.zeros(2), 0.0
        for r in xs.numpy():
            total = total + anp.sum(c * w) ** 2
            c = c * w + r
        return total
    np.testing.assert_allclose(w.grad.numpy(), autograd.grad(ref)(w.numpy()), rtol=1e-12)


@settings(max_examples=15)
@given(n=st.integers(1, 12), seed=st.integers(0, 1000))
def test_scan_running_sum_gradient_any_length(n, seed):
    x = np.random.default_rng(seed).normal(size=n)
    g = vkml.grad(vkml.jit(running_sum_body([0])))(x).numpy()
    s = np.cumsum(x)
    np.testing.assert_allclose(g, 2 * np.cumsum(s[::-1])[::-1], rtol=1e-12, atol=1e-12)


# -- higher order, Jacobians, vmap -------------------------------------------------------------------

def test_second_and_third_derivatives():
    f = lambda x: vkml.sum(x ** 3)  # noqa: E731
    x = np.array([1.0, -2.0, 3.0])
    d2 = vkml.grad(lambda x: vkml.sum(vkml.grad(f)(x)))(x)
    assert d2.numpy().tolist() == [6, -12, 18]
    d3 = vkml.grad(vkml.grad(vkml.grad(lambda x: x ** 4)))(np.float64(2.0))
    assert d3.item() == 48
    h = vkml.hessian(f)(x).numpy()
    np.testing.assert_allclose(h, np.diag([6.0, -12.0, 18.0]), atol=1e-12)


def test_hvp_jacfwd_jacrev_agree_with_each_other_and_fd():
    f = lambda x: vkml.sum(vkml.tanh(x @ A) ** 2) + vkml.sum(x ** 4)  # noqa: E731
    x = RNG.normal(size=3)
    v = RNG.normal(size=3)
    H_fwd = vkml.jacfwd(vkml.grad(f))(x).numpy()
    H_rev = vkml.jacrev(vkml.grad(f))(x).numpy()
    H = vkml.hessian(f)(x).numpy()
    np.testing.assert_allclose(H_fwd, H_rev, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(H, H_fwd, rtol=1e-10, atol=1e-12)
    grad_np = lambda x: vkml.grad(f)(x).numpy()  # noqa: E731
    fd = np.stack([(grad_np(x + 1e-6 * e) - grad_np(x - 1e-6 * e)) / 2e-6 for e in np.eye(3)], 1)
    np.testing.assert_allclose(H, fd, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(vkml.hvp(f, (x,), (v,)).numpy(), H @ v, rtol=1e-10)
    g = lambda x: vkml.sin(x @ A)  # noqa: E731  (non-scalar output)
    J = np.cos(x @ A)[:, None] * A.T
    np.testing.assert_allclose(vkml.jacfwd(g)(x).numpy(), J, rtol=1e-12)
    np.testing.assert_allclose(vkml.jacrev(g)(x).numpy(), J, rtol=1e-12)


def test_vmap_of_grad_equals_per_example_gradients():
    w = RNG.normal(size=(3, 2))
    xs = RNG.normal(size=(6, 3))
    loss = lambda w, x: vkml.sum(vkml.tanh(x @ w) ** 2)  # noqa: E731
    per = vkml.vmap(vkml.grad(loss), in_axes=(None, 0))(w, xs).numpy()
    one_by_one = np.stack([vkml.grad(loss)(w, x).numpy() for x in xs])
    np.testing.assert_allclose(per, one_by_one, rtol=1e-12)
    ref = np.stack([autograd.grad(lambda w: anp.sum(anp.tanh(x @ w) ** 2))(w) for x in xs])
    np.testing.assert_allclose(per, ref, rtol=1e-10)


def test_vmap_axes_and_scan_inside():
    xs = RNG.normal(size=(4, 5))
    f = lambda x: vkml.scan(lambda c, r: (c + r, c * r), np.float64(0.0), x)[1]  # noqa: E731
    out = vkml.vmap(f, in_axes=1, out_axes=1)(xs).numpy()
    ref = np.stack([f(xs[:, j]).numpy() for j in range(5)], axis=1)
    np.testing.assert_allclose(out, ref)
    with pytest.raises(vkml.ShapeError, match="one size"):
        vkml.vmap(lambda a, b: a + b)(np.ones(3), np.ones(4))


# -- control flow and custom rules -------------------------------------------------------------------

def test_cond_gradients_and_vmap():
    f = lambda x: vkml.cond(x.sum() > 0, lambda x: (x ** 2).sum(),  # noqa: E731
                            lambda x: vkml.sin(x).sum(), x)
    x = np.array([1.0, -2.0, 3.0])
    np.testing.assert_allclose(vkml.grad(f)(x).numpy(), 2 * x)
    np.testing.assert_allclose(vkml.grad(f)(-x).numpy(), np.cos(-x))
    both = vkml.vmap(vkml.grad(f))(np.stack([x, -x])).numpy()
    np.testing.assert_allclose(both, np.stack([2 * x, np.cos(-x)]))
    with pytest.raises(vkml.ShapeError, match="same types"):
        vkml.cond(True, lambda x: x, lambda x: x.sum(), np.ones(2))


def test_while_loop_forward_and_bounded_reverse():
    body = lambda c: (c[0] * 1.5, c[1] + 1)  # noqa: E731
    test = lambda c: c[1] < 5  # noqa: E731
    x = np.array([1.0, -2.0, 3.0])
    out = vkml.while_loop(test, body, (x, 0))
    np.testing.assert_allclose(out[0].numpy(), x * 1.5 ** 5)
    _, t = vkml.jvp(lambda x: vkml.while_loop(test, body, (x, 0))[0], (x,), (np.ones(3),))
    np.testing.assert_allclose(t.numpy(), np.full(3, 1.5 ** 5))
    g = vkml.grad(lambda x: vkml.while_loop(test, body, (x, 0), max_iters=8)[0].sum())(x)
    np.testing.assert_allclose(g.numpy(), np.full(3, 1.5 ** 5))
    with pytest.raises(vkml.GradError):
        vkml.grad(lambda x: vkml.while_loop(test, body, (x, 0))[0].sum())(x)


def test_custom_vjp_and_custom_jvp():
    @vkml.custom_vjp
    def clip_grad(x):
        return x * 1.0

    clip_grad.defvjp(lambda x: (x * 1.0, None), lambda res, g: (vkml.clip(g, -0.1, 0.1),))
    x = np.array([1.0, -2.0, 3.0])
    assert vkml.grad(lambda x: (clip_grad(x) * 5).sum())(x).numpy().tolist() == [0.1] * 3

    @vkml.custom_jvp
    def my_sin(x):
        return vkml.sin(x)

    @my_sin.defjvp
    def my_sin_jvp(primals, tangents):
        return vkml.sin(primals[0]), 2 * vkml.cos(primals[0]) * tangents[0]

    np.testing.assert_allclose(vkml.grad(lambda x: my_sin(x).sum())(x).numpy(), 2 * np.cos(x))


def test_checkpoint_recomputes_and_gives_the_same_gradient():
    f = lambda x: vkml.sin(vkml.sin(x) * 2)  # noqa: E731
    ck = vkml.checkpoint(f)
    x = RNG.normal(size=4)
    g_ck = vkml.grad(lambda x: ck(x).sum())(x).numpy()
    g = vkml.grad(lambda x: f(x).sum())(x).numpy()
    np.testing.assert_allclose(g_ck, g, rtol=1e-14)
    np.testing.assert_allclose(g, np.cos(np.sin(x) * 2) * 2 * np.cos(x), rtol=1e-12)
    # the known part of the checkpointed function saves no intermediate for the backward pass
    jf = vkml.jit(lambda x: ck(x).sum())
    vkml.grad(jf)(x)
    known = jf.derived_programs()[0]["known"]
    assert len(known.outputs) == 1 + 1                   # the value and the saved input, nothing else


def test_check_grads_passes_and_catches_a_wrong_rule():
    vkml.check_grads(lambda x: vkml.sum(vkml.tanh(x) ** 3), (RNG.normal(size=3),), order=2)

    @vkml.custom_vjp
    def wrong(x):
        return x * 2.0

    wrong.defvjp(lambda x: (x * 2.0, None), lambda res, g: (g * 3.0,))
    with pytest.raises(vkml.GradCheckError, match="finite differences"):
        vkml.check_grads(wrong, (RNG.normal(size=3),), modes=("rev",))


# -- errors ------------------------------------------------------------------------------------------

def test_grad_of_non_scalar_output():
    with pytest.raises(vkml.GradError, match=r"floating scalar.*shape \[3\].*jacrev"):
        vkml.grad(lambda x: x * 2)(np.ones(3))


def test_argument_that_is_not_an_array_or_pytree():
    with pytest.raises(vkml.ArgumentError, match="got str"):
        vkml.jit(lambda x: x)("abc")
    with pytest.raises(vkml.ArgumentError, match="got object"):
        vkml.grad(lambda x: x)(object())


def test_python_if_on_a_traced_value():
    def f(x):
        if x.sum() > 0:
            return x
        return -x
    with pytest.raises(vkml.TracingError, match=r"bool\(\) of a traced value .*test_programs.py:"
                                                 r"\d+: .*vkml.where.*vkml.cond / vkml.while_loop"):
        vkml.jit(f)(np.ones(3))
    with pytest.raises(vkml.TracingError, match=r"float\(\) of a traced value .*return it from"):
        vkml.grad(lambda x: x * float(x))(np.float64(2.0))


def test_scan_carry_that_changes_shape_or_dtype():
    with pytest.raises(vkml.ShapeError, match=r"float64 \[\].*float64 \[2\]"):
        vkml.scan(lambda c, r: (c + r, c), np.float64(0.0), np.ones((3, 2)))
    with pytest.raises(vkml.DTypeError, match=r"int64 \[\].*float64 \[\]"):
        vkml.scan(lambda c, r: (c + r, c), np.int64(0), np.ones(3))


def test_grad_of_integer_argument_is_refused():
    with pytest.raises(vkml.GradError, match="only floating"):
        vkml.grad(lambda x: (x * 2).sum())(np.arange(3))


def test_vmap_out_axes_per_result_and_its_errors():
    a, b = np.arange(3.0), np.arange(6.0).reshape(2, 3)
    f = vkml.vmap(lambda x, y: (x * 2.0, vkml.stack([y, y])), in_axes=(0, 1), out_axes=(0, 1))
    r1, r2 = f(a, b)
    assert r1.numpy().tolist() == (a * 2).tolist()
    np.testing.assert_array_equal(r2.numpy(), np.stack([b.T, b.T]))     # mapped axis moved to 1
    np.testing.assert_array_equal(vkml.vmap(lambda y: y * 1.0, in_axes=1, out_axes=-1)(b).numpy(), b)
    with pytest.raises(vkml.VkmlError, match="out_axes has 1 entries but the function returns 2"):
        vkml.vmap(lambda x: (x, x), out_axes=(0,))(a)
    with pytest.raises(vkml.VkmlError, match="out_axes 5 is out of range for a result of shape"):
        vkml.vmap(lambda x: (x, x), out_axes=(0, 5))(a)
