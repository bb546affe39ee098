"""A compiled training step updates parameters and optimiser state in their own arrays.

Counted and compared, never timed:

- an executable says which results it may compute over which arguments (``overwritable``), and
  every pair it allows gives the out-of-place bits; a pair whose argument is read after the
  result is written is refused (NumPy backend and cpu tier, before and after a program turns
  hot);
- after warm-up a step writes every parameter and moment where it is (the same arrays step after
  step: SGD with momentum and Adam, both backends) and, on the cpu tier, allocates no
  parameter-sized buffer, and makes one Var per result and per changed number only;
- a value the user holds never changes under them (a detached parameter, ``numpy()``, ``.grad``,
  the optimiser's state, a pending expression of a parameter): that step computes into an array
  of its own, and the next one is in place again once the holder lets go;
- the bits are those of the out-of-place step and of the lazy step, and within float32 rounding
  of an independent float64 Adam.
"""

import weakref

import numpy as np
import pytest

import vkml
from vkml import nn, optim
from vkml.backends import cpu
from test_graph_allocations import call_peak

BACKENDS = ["numpy", "cpu"] if cpu.compiler() is not None else ["numpy"]
SHAPE = (96, 128)
LR, BETAS, EPS = 1e-2, (0.9, 0.999), 1e-8


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))


# -- executables: which results may be computed over which arguments ----------------------------

def _adam_like(m, v, p, g):
    m = m + 0.1 * (g - m)
    v = v + 0.001 * (g * g - v)
    return m, v, p - m / (vkml.sqrt(v) * 3.0 + 1e-5)


FUNCTIONS = {
    "adam": (_adam_like, 4),
    "read after": (lambda a, b: (a + b, a * 2.0), 2),
    "sum first": (lambda a: (a - a.sum(), a * a), 1),
    "transposed": (lambda a: (a.T * 1.5, a + 1.0), 1),
    "flipped": (lambda a, b: (vkml.flip(a, 0) + b, b - a), 2),
    "matmul": (lambda a, b: (a @ b, a + 1.0, b * b), 2),
    "a view returned": (lambda a, b: (a.reshape(-1), a + b, b * 3.0), 2),
    "broadcast row": (lambda a, r: (a * r, r + 1.0), 2),
    # a vector-math nest (its last block moved back over elements already computed)
    "exp": (lambda a, b: (a * vkml.exp(b), b + 1.0, vkml.tanh(a) - b), 2),
}


def _arguments(name, count):
    rng = np.random.default_rng(len(name))
    shape = (8, 8) if name in ("transposed", "matmul") else (6, 10)
    args = [np.abs(rng.standard_normal(shape)).astype(np.float32) + 0.5 for _ in range(count)]
    if name == "broadcast row":
        args[1] = args[1][:1].copy()
    return args


def _allowed_and_results(jitted, args, into_of):
    """Call ``jitted`` on ``args`` through ``_call_overwriting``: the plan's ``overwritable``
    and the results (``into_of(allowed)`` gives the destinations)."""
    seen = {}

    def destinations(plan):
        seen["allowed"] = plan.overwritable()
        return into_of(seen["allowed"])

    outs = [o if isinstance(o, vkml.Tensor) else vkml.Tensor(o)       # (Vars on the fast path)
            for o in jitted._call_overwriting(args, destinations)]
    return seen.get("allowed"), [np.array(o.numpy()) for o in outs], outs


@pytest.mark.parametrize("hot", ["0", "2"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_every_allowed_overwrite_gives_the_out_of_place_bits(name, backend, hot, monkeypatch):
    monkeypatch.setenv("VKML_CPU_HOT", hot)
    fn, count = FUNCTIONS[name]
    jitted = vkml.jit(fn)                        # a fresh one: its plan is made on this backend
    with vkml.use_backend(backend):
        for _ in range(4):                       # traced, then planned (and hot on the cpu tier)
            want = [np.array(o.numpy()) for o in jitted(*_arguments(name, count))]
        allowed, got, _ = _allowed_and_results(jitted, _arguments(name, count), lambda a: None)
        assert allowed is not None, "a plain call after the first has a fast plan"
        assert [g.tobytes() for g in got] == [w.tobytes() for w in want]
        pairs = [(j, k) for j, ks in allowed.items() for k in ks]
        for j, k in pairs:
            args = _arguments(name, count)
            into = [None] * len(want)
            into[j] = args[k]
            _, got, outs = _allowed_and_results(jitted, args, lambda a, into=into: into)
            assert [g.tobytes() for g in got] == [w.tobytes() for w in want], (j, k)
            if backend == "cpu":
                assert outs[j].ir_var.value is args[k]   # computed where the argument was
    if name == "adam":
        # each new value may go where its old one was: the update reads before it writes
        assert {(0, 0), (1, 1), (2, 2)} <= set(pairs)
    if name == "read after":
        assert (0, 0) not in pairs                   # a * 2.0 reads a after a + b is written
    if name == "a view returned" and backend == "numpy":
        assert (1, 0) not in pairs                   # result 0, a view of a, would change too


# -- the compiled step --------------------------------------------------------------------------

def _data():
    rng = np.random.default_rng(5)
    return (rng.standard_normal(SHAPE).astype(np.float32),
            rng.standard_normal(SHAPE).astype(np.float32))


def _problem(kind="adam"):
    """A parameter fitted elementwise (``mean((w * x - y)**2)``: no matrix product, so on the cpu
    tier the whole step is one C function) and a bias, with its optimiser and compiled step."""
    rng = np.random.default_rng(11)
    w = nn.Parameter(rng.standard_normal(SHAPE).astype(np.float32))
    b = nn.Parameter(np.zeros(SHAPE[1], np.float32))
    opt = optim.Adam([w, b], lr=LR, betas=BETAS, eps=EPS) if kind == "adam" else \
        optim.SGD([w, b], lr=LR, momentum=0.9)

    def loss(x, y):
        return ((w * x + b - y) ** 2).mean()

    return w, b, opt, loss


def _arrays(opt):
    state = opt.exp_avg + opt.exp_avg_sq if isinstance(opt, optim.Adam) else opt.momentum_buffers
    return [t.ir_var.value for t in list(opt.params) + state]


def _same_arrays(opt, refs) -> bool:
    """Whether parameters and state still hold the arrays ``refs`` (weak references, which hold
    nothing: a strong one would make the step leave the array alone) point to."""
    return all(r() is a for r, a in zip(refs, _arrays(opt)))


def _warmed(kind="adam", steps=3):
    """A problem's compiled step after ``steps`` steps on ``_data()``: ``(w, b, opt, step, x, y)``
    (call it inside the backend's block)."""
    x, y = _data()
    w, b, opt, loss = _problem(kind)
    step = opt.compile_step(loss)
    for _ in range(steps):
        step(x, y)
    return w, b, opt, step, x, y


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_steady_steps_write_parameters_and_state_where_they_are(backend, kind):
    with vkml.use_backend(backend):
        w, b, opt, step, x, y = _warmed(kind)
        refs = [weakref.ref(a) for a in _arrays(opt)]
        values = [np.array(a) for a in _arrays(opt)]
        for _ in range(3):
            step(x, y)
        assert _same_arrays(opt, refs)
        assert all(not np.array_equal(a, v) for a, v in zip(_arrays(opt), values))   # they moved


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_steady_step_makes_a_var_per_result_and_per_changed_number_only(backend, kind):
    """The Python around the program makes no Var per parameter argument (a parameter goes in as
    its array) nor per hyperparameter that stays the same (the last step's weak scalar): one per
    result -- the loss, each gradient, each new parameter and moment -- and one per number that
    changed (Adam's two bias-corrected factors; SGD's numbers stay the same)."""
    with vkml.use_backend(backend):
        w, b, opt, step, x, y = _warmed(kind)
        made = []
        for _ in range(3):
            before = vkml.ir.current_serial()
            step(x, y)
            made.append(vkml.ir.current_serial() - before)
    params = 2
    results = 1 + params + (3 * params if kind == "adam" else 2 * params)
    changed = 2 if kind == "adam" else 0
    assert made == [results + changed] * 3


@pytest.mark.skipif("cpu" not in BACKENDS, reason="needs a C compiler")
def test_a_steady_step_on_the_cpu_tier_allocates_no_parameter_sized_buffer():
    with vkml.use_backend("cpu"):
        w, b, opt, step, x, y = _warmed(steps=4)
        peak = call_peak(lambda: [step(x, y) for _ in range(3)][-1])
    assert peak < w.numpy().nbytes, peak


@pytest.mark.skipif("cpu" not in BACKENDS, reason="needs a C compiler")
def test_a_steady_mlp_step_on_the_cpu_tier_allocates_no_parameter_sized_buffer():
    """A product big enough for BLAS: the step is a NumPy program with compiled runs, and the
    first weight's gradient comes from BLAS, written into the array of the last one."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((64, 300)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    with vkml.use_backend("cpu"):
        nn.manual_seed(1)
        model = nn.Sequential(nn.Linear(300, 240), nn.ReLU(), nn.Linear(240, 10))
        opt = optim.Adam(model.parameters(), lr=LR)
        step = opt.compile_step(lambda xb, yb: nn.cross_entropy(model(xb), yb))
        for _ in range(4):
            step(x, y)
        weight = opt.params[0]
        refs = [weakref.ref(weight.ir_var.value), weakref.ref(weight.grad.ir_var.value)]
        peak = call_peak(lambda: [step(x, y) for _ in range(3)][-1])
        assert refs[0]() is weight.ir_var.value and refs[1]() is weight.grad.ir_var.value
    assert peak < weight.numpy().nbytes, peak


HOLDS = {
    "detached parameter": lambda w, opt: w.detach(),
    "numpy() of the parameter": lambda w, opt: w.numpy(),
    "the parameter's grad": lambda w, opt: w.grad,
    "numpy() of the grad": lambda w, opt: w.grad.numpy(),
    "numpy() of a moment": lambda w, opt: opt.exp_avg[0].numpy(),
    "a detached second moment": lambda w, opt: opt.exp_avg_sq[0].detach(),
    "a pending expression of the parameter": lambda w, opt: w * 1.0,
}


def _value(held):
    return np.array(held.numpy() if isinstance(held, vkml.Tensor) else held)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_holding_a_value_keeps_the_bits_and_in_place_steps_resume_once_let_go(hold, backend):
    x, y = _data()
    with vkml.use_backend(backend):
        w, b, opt, loss = _problem()
        step = opt.compile_step(loss)
        ref_w, ref_b, ref_opt, ref_loss = _problem()
        ref_step = ref_opt.compile_step(ref_loss)
        for _ in range(3):
            step(x, y), ref_step(x, y)
        held = HOLDS[hold](w, opt)
        for _ in range(2):
            step(x, y), ref_step(x, y)
        _value(held)                     # a pending expression is realized only now
        del held
        for _ in range(2):               # the holder let go: in place again
            step(x, y), ref_step(x, y)
        refs = [weakref.ref(a) for a in _arrays(opt)]
        step(x, y), ref_step(x, y)
        assert _same_arrays(opt, refs)
        for t, r in zip(_arrays(opt), _arrays(ref_opt)):
            assert t.tobytes() == r.tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_the_held_value_is_the_one_it_had(hold, backend):
    with vkml.use_backend(backend):
        w, b, opt, step, x, y = _warmed()
        source = {"detached parameter": w, "numpy() of the parameter": w, "the parameter's grad":
                  w.grad, "numpy() of the grad": w.grad, "numpy() of a moment": opt.exp_avg[0],
                  "a detached second moment": opt.exp_avg_sq[0],
                  "a pending expression of the parameter": w}[hold]
        then = np.array(source.numpy())
        held = HOLDS[hold](w, opt)
        for _ in range(2):
            step(x, y)
        assert _value(held).tobytes() == then.tobytes()
        assert not np.array_equal(np.array(source.numpy()), then) or "grad" in hold


def _out_of_place(monkeypatch):
    monkeypatch.setattr(optim.CompiledStep, "_destinations",
                        lambda self, plan, dsts, args, first: [None] * len(plan.out_vars))
    monkeypatch.setattr(optim.CompiledStep, "_gradients_into", lambda self, plan, params, into: None)


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_steps_have_the_out_of_place_and_the_lazy_bits(backend, kind, monkeypatch):
    x, y = _data()
    steps = 5
    with vkml.use_backend(backend):
        w, b, opt, loss = _problem(kind)
        step = opt.compile_step(loss)
        lazy_w, lazy_b, lazy_opt, lazy_loss = _problem(kind)
        xt, yt = vkml.tensor(x), vkml.tensor(y)
        for _ in range(steps):
            step(x, y)
            lazy_opt.zero_grad()
            lazy_loss(xt, yt).backward()
            lazy_opt.step()
        in_place = [np.array(a) for a in _arrays(opt)]
        _out_of_place(monkeypatch)
        w2, b2, opt2, loss2 = _problem(kind)
        step2 = opt2.compile_step(loss2)
        for _ in range(steps):
            step2(x, y)
        assert step2._owned == {}
        out_of_place = _arrays(opt2)
    assert [a.tobytes() for a in in_place] == [a.tobytes() for a in out_of_place]
    assert [a.tobytes() for a in in_place] == [a.tobytes() for a in _arrays(lazy_opt)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_place_adam_matches_an_independent_float64_adam(backend):
    x, y = _data()
    steps = 6
    with vkml.use_backend(backend):
        w, b, opt, loss = _problem()
        init = [np.array(p.numpy(), dtype=np.float64) for p in (w, b)]
        step = opt.compile_step(loss)
        for _ in range(steps):
            step(x, y)
        got = [np.array(p.numpy()) for p in (w, b)]
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    ps = list(init)
    m = [np.zeros_like(p) for p in ps]
    v = [np.zeros_like(p) for p in ps]
    for t in range(1, steps + 1):
        r = 2.0 * (ps[0] * x64 + ps[1] - y64) / x64.size     # d mean(r**2) / d(w x + b)
        for k, g in enumerate((r * x64, r.sum(axis=0))):
            m[k] = BETAS[0] * m[k] + (1 - BETAS[0]) * g
            v[k] = BETAS[1] * v[k] + (1 - BETAS[1]) * g * g
            ps[k] = ps[k] - LR * (m[k] / (1 - BETAS[0] ** t)) / \
                (np.sqrt(v[k] / (1 - BETAS[1] ** t)) + EPS)
    for g, want, p0 in zip(got, ps, init):
        assert not np.allclose(g, p0)
        np.testing.assert_allclose(g, want, rtol=0, atol=2e-5)


# -- the rule on lowered statements, line by line ------------------------------------------------

def _rule(stmts, shapes=((4, 3), (4, 3)), outs=((4, 3),)):
    """``lower.overwritable`` of hand-written statements over buffers a0, a1, ... -> o0, ..."""
    from vkml.backends.codegen.lower import overwritable
    from vkml.ir import Program, Var
    ins = [Var(s, np.dtype(np.float32)) for s in shapes]
    outputs = [Var(s, np.dtype(np.float32)) for s in outs]
    program = Program(ins, [], outputs)
    return overwritable(stmts, [f"a{k}" for k in range(len(ins))],
                        [f"o{j}" for j in range(len(outputs))], program)


def _nest(*lines, extents=(4, 3)):
    from vkml.backends.codegen.statements import Loop
    return [Loop("i0", extents[0], [Loop("i1", extents[1], list(lines))])]


def test_the_statement_rule_allows_reads_done_before_the_store_at_its_element():
    index = "(i0)*3 + i1"
    fused = _nest(f"o0[{index}] = (a0[{index}] + a1[{index}]);")
    assert _rule(fused) == {0: frozenset({0, 1})}
    earlier_nest = _nest(f"t0[{index}] = a1[{index}];") + _nest(f"o0[{index}] = a0[{index}];")
    assert _rule(earlier_nest) == {0: frozenset({0, 1})}


def test_the_statement_rule_refuses_late_reads_other_elements_and_bare_pointers():
    index = "(i0)*3 + i1"
    read_after = _nest(f"o0[{index}] = a0[{index}];", f"t1[{index}] = a1[{index}] * a0[{index}];")
    assert _rule(read_after) == {}        # both are read after o0[i] is written
    other_element = _nest(f"o0[{index}] = a0[(3 - i0)*3 + i1];")
    assert 0 not in _rule(other_element).get(0, frozenset())
    bare = _nest(f"o0[{index}] = a0[{index}];") + ["vk_copy(t0, a0, 12);"]
    assert 0 not in _rule(bare).get(0, frozenset())
    later_nest = _nest(f"o0[{index}] = a1[{index}];") + _nest(f"t0[{index}] = a0[{index}];")
    assert 0 not in _rule(later_nest).get(0, frozenset())
    # a store that is not the line's first word is still a store
    hidden_store = _nest(f"t9[0] = 1; o0[{index}] += a1[{index}];") + _nest(f"t0[{index}] = a0[{index}];")
    assert 0 not in _rule(hidden_store).get(0, frozenset())
    # a check that may stop the function after a store, or in the store's nest: refused
    check = "if (a1[0] < 0) { *err = 1; goto done; }"
    checked_after = _nest(f"o0[{index}] = a0[{index}];") + [check]
    assert 0 not in _rule(checked_after).get(0, frozenset())
    checked_in_nest = _nest(f"if (a1[{index}] < 0) {{ *err = 1; goto done; }}",
                            f"o0[{index}] = a0[{index}];")
    assert _rule(checked_in_nest) == {}
    checked_before = [check] + _nest(f"o0[{index}] = a0[{index}];")
    assert _rule(checked_before) == {0: frozenset({0, 1})}
    # a nest that is not over the result's elements one by one: refused
    short = _nest(f"o0[{index}] = a0[{index}];", extents=(2, 3))
    assert 0 not in _rule(short).get(0, frozenset())


def test_the_statement_rule_refuses_results_of_nests_calling_vector_math():
    """A nest calling a libm function run in vector blocks computes its last block again over
    elements already stored: its results are never computed over an argument; a nest beside it
    without such a call still is."""
    from vkml.backends.codegen.lower import overwritable
    from vkml.ir import Program, Var
    index = "(i0)*3 + i1"
    stmts = _nest(f"o0[{index}] = expf(a0[{index}]);") + _nest(f"o1[{index}] = a1[{index}] + 1;")
    ins = [Var((4, 3), np.dtype(np.float32)) for _ in range(2)]
    program = Program(ins, [], [Var((4, 3), np.dtype(np.float32)) for _ in range(2)])
    rule = overwritable(stmts, ["a0", "a1"], ["o0", "o1"], program, vector_calls={"expf"})
    assert 0 not in rule and rule[1] == frozenset({0, 1})
    assert overwritable(stmts, ["a0", "a1"], ["o0", "o1"], program)[0] == frozenset({0})


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_refused_for_a_bad_label_changes_nothing_and_the_next_ones_keep_the_bits(backend):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    good, bad = np.array([0, 3, 1, 2, 3]), np.array([0, 3, 7, 2, 3])   # 7: no such class

    def build():
        nn.manual_seed(4)
        model = nn.Linear(6, 4)
        opt = optim.Adam(model.parameters(), lr=LR)
        return opt, opt.compile_step(lambda xb, yb: nn.cross_entropy(model(xb), yb))

    with vkml.use_backend(backend):
        opt, step = build()
        ref_opt, ref_step = build()
        for _ in range(3):
            step(x, good), ref_step(x, good)
        refs = [weakref.ref(a) for a in _arrays(opt)]
        step(x, good), ref_step(x, good)
        assert _same_arrays(opt, refs)                 # the steps are in place
        before = [np.array(a) for a in _arrays(opt)]
        with pytest.raises(vkml.VkmlError):
            step(x, bad)
        assert [a.tobytes() for a in _arrays(opt)] == [b.tobytes() for b in before]
        assert opt.steps == ref_opt.steps
        for _ in range(2):
            step(x, good), ref_step(x, good)
        assert [a.tobytes() for a in _arrays(opt)] == [a.tobytes() for a in _arrays(ref_opt)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_lazy_steps_between_compiled_ones_keep_the_bits(backend, monkeypatch):
    x, y = _data()
    xt, yt = vkml.tensor(x), vkml.tensor(y)

    def run():
        w, b, opt, loss = _problem()
        step = opt.compile_step(loss)
        for i in range(7):
            if i % 3 == 2:                        # a lazy step now and then
                opt.zero_grad()
                loss(xt, yt).backward()
                opt.step()
            else:
                step(x, y)
        return [np.array(a) for a in _arrays(opt)]

    with vkml.use_backend(backend):
        in_place = run()
        _out_of_place(monkeypatch)
        out_of_place = run()
    assert [a.tobytes() for a in in_place] == [a.tobytes() for a in out_of_place]


@pytest.mark.parametrize("backend", BACKENDS)
def test_where_reference_counts_are_not_known_exact_steps_compute_into_new_arrays(backend, monkeypatch):
    """On an interpreter whose reference counts may leave a holder out (``EXACT_REFCOUNTS``
    False), the step never concludes it alone holds an array: every step computes into arrays
    of its own, with the same bits as the in-place steps."""
    with vkml.use_backend(backend):
        w, b, opt, step, x, y = _warmed()
        in_place = [np.array(a) for a in _arrays(opt)]
    monkeypatch.setattr(optim, "EXACT_REFCOUNTS", False)
    with vkml.use_backend(backend):
        w, b, opt, loss = _problem()
        step = opt.compile_step(loss)
        step(x, y)
        for _ in range(2):
            refs = [weakref.ref(a) for a in _arrays(opt)]
            step(x, y)
            assert not any(r() is a for r, a in zip(refs, _arrays(opt)))
        assert all(np.array_equal(a, v) for a, v in zip(_arrays(opt), in_place))


def test_a_batch_that_requires_grad_gives_a_loss_that_keeps_its_graph():
    """Such a call takes the full path every time: its loss is the full path's own Tensor, so
    ``loss.backward()`` reaches the batch (the gradient of ``sum(w * x)`` in ``x`` is ``w``
    as the step found it)."""
    w = nn.Parameter([1.0, -2.0])
    step = optim.Adam([w], lr=0.1).compile_step(lambda x: (w * x).sum())
    for _ in range(3):
        before = np.array(w.numpy())
        x = vkml.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
        loss = step(x)
        assert loss.requires_grad
        loss.backward()
        assert np.array_equal(x.grad.numpy(), before)
        assert not np.array_equal(w.numpy(), before)
