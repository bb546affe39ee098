"""vkml.nn and vkml.optim: submission counts, cache behaviour, and numbers against independent oracles.

Oracles are never vkml itself: optimiser updates are checked against hand-written NumPy updates in
float64, losses and layer gradients against HIPS autograd (a separate pure-NumPy autodiff package).
"""

import math

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml
from vkml import nn, optim


# -- helpers ------------------------------------------------------------------------------------------

def make_params(n, rng, dtype=np.float32):
    """``n`` leaves of assorted small shapes (so the update program really is per-parameter)."""
    shapes = [(3,), (2, 4), (5,), (3, 3), (1,), (4, 2, 2), (6,), (2, 3)]
    return [vkml.tensor(rng.standard_normal(shapes[i % len(shapes)]).astype(dtype), requires_grad=True)
            for i in range(n)]


def quadratic_loss(params, coef):
    """sum_i sum(a_i * p_i**2 / 2 + b_i * p_i): its gradient a_i * p_i + b_i is known in closed form."""
    total = None
    for p, (a, b) in zip(params, coef):
        term = vkml.sum(vkml.tensor(a) * p * p * 0.5 + vkml.tensor(b) * p)
        total = term if total is None else total + term
    return total


def coefficients(params, rng):
    return [(rng.uniform(0.5, 2.0, p.shape).astype(np.float32),
             rng.standard_normal(p.shape).astype(np.float32)) for p in params]


def step_cost(opt):
    before = vkml.stats()
    opt.step()
    return vkml.stats() - before


# -- optimiser step: constant submissions ---------------------------------------------------------------

UPDATE_PROGRAMS = {"adam": optim._update_program(optim.Adam),
                   "sgd-momentum": optim._update_program(optim.SGD),
                   "sgd": optim._update_program(optim.SGD)}


def replays(kind):
    """How often the optimiser's jitted update program has been replayed from its cache so far."""
    return UPDATE_PROGRAMS[kind].cache_info()["hits"]


@pytest.mark.parametrize("kind,make_opt", [
    ("adam", lambda ps: optim.Adam(ps, lr=1e-2)),
    ("sgd-momentum", lambda ps: optim.SGD(ps, lr=1e-2, momentum=0.9)),
    ("sgd", lambda ps: optim.SGD(ps, lr=1e-2)),
], ids=["adam", "sgd-momentum", "sgd"])
def test_step_costs_the_same_few_submissions_for_8_and_64_parameters(kind, make_opt, rng):
    costs = {}
    for n in (8, 64):
        params = make_params(n, rng)
        coef = coefficients(params, rng)
        opt = make_opt(params)
        per_step = []
        for _ in range(3):
            opt.zero_grad()
            vkml.backward(quadratic_loss(params, coef))
            hits = replays(kind)
            per_step.append((step_cost(opt), replays(kind) - hits))
        # The first step traces and compiles the update program at most once (an earlier optimiser
        # over the same shapes may have done it already); later steps only replay it, although the
        # bias corrections change: they are Python floats, i.e. program inputs, not constants.
        first, _ = per_step[0]
        assert first.traces <= 1 and first.compiles <= 1
        for later, replayed in per_step[1:]:
            assert later.traces == 0 and later.compiles == 0 and later.derivations == 0
            assert replayed == 1
        subs = {cost.submissions for cost, _ in per_step}
        assert len(subs) == 1, per_step
        costs[n] = subs.pop()
    assert costs[8] == costs[64]
    assert costs[64] <= 3
    assert costs[64] == 1   # all new values (parameters and state) computed and written in one go


def test_changing_lr_between_steps_does_not_recompile(rng):
    params = make_params(4, rng)
    coef = coefficients(params, rng)
    opt = optim.Adam(params, lr=1e-2)
    for lr in (1e-2, 5e-3, 1e-3):
        opt.lr = lr
        opt.zero_grad()
        vkml.backward(quadratic_loss(params, coef))
        cost = step_cost(opt)
    assert cost.compiles == 0 and cost.traces == 0 and cost.submissions == 1


def test_step_updates_every_parameter_and_its_state_in_place_of_the_handles(rng):
    params = make_params(5, rng)
    before = [np.array(p.numpy()) for p in params]
    opt = optim.Adam(params, lr=0.1)
    vkml.backward(quadratic_loss(params, coefficients(params, rng)))
    opt.step()
    for p, old in zip(params, before):
        assert not np.allclose(p.numpy(), old)
        assert p.requires_grad and p.is_leaf   # still a trainable leaf after the assign
    assert all(m is not None and np.abs(m.numpy()).sum() > 0 for m in opt.exp_avg)
    assert all(np.abs(v.numpy()).sum() > 0 for v in opt.exp_avg_sq)
    assert opt.steps == [1] * 5


def test_eager_mode_gives_the_same_parameters_and_a_one_submission_step(rng):
    x = rng.standard_normal((8, 5)).astype(np.float32)
    y = np.arange(8) % 3

    def train(eager):
        vkml.set_eager(eager)
        try:
            nn.manual_seed(0)
            model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
            opt = optim.Adam(model.parameters(), lr=0.1, weight_decay=0.01)
            for _ in range(3):
                opt.zero_grad()
                nn.cross_entropy(model(vkml.tensor(x)), y).backward()
                cost = step_cost(opt)
            return [p.numpy() for p in model.parameters()], cost
        finally:
            vkml.set_eager(False)

    (lazy, lazy_cost), (eager, eager_cost) = train(False), train(True)
    assert lazy_cost.submissions == eager_cost.submissions == 1
    for a, b in zip(lazy, eager):
        np.testing.assert_array_equal(a, b)


# -- zero_grad and accumulation ----------------------------------------------------------------------

def test_backward_accumulates_and_zero_grad_clears():
    w0 = np.array([1.0, -2.0, 3.0], np.float32)
    w = vkml.tensor(w0, requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    vkml.backward(vkml.sum(w * w))
    np.testing.assert_allclose(w.grad.numpy(), 2 * w0)
    vkml.backward(vkml.sum(w * w))            # accumulates, as in PyTorch
    np.testing.assert_allclose(w.grad.numpy(), 4 * w0)
    opt.zero_grad()
    assert w.grad is None
    vkml.backward(vkml.sum(3.0 * w))
    np.testing.assert_allclose(w.grad.numpy(), np.full(3, 3.0, np.float32))


def test_module_zero_grad_clears_every_parameter():
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    x = vkml.tensor(np.ones((2, 3), np.float32))
    vkml.backward(vkml.sum(model(x)))
    assert all(p.grad is not None for p in model.parameters())
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_parameters_without_grad_are_skipped_and_keep_their_state(rng):
    a, b = make_params(2, rng)
    b_before = np.array(b.numpy())
    opt = optim.Adam([a, b], lr=0.1)
    vkml.backward(vkml.sum(a * a))   # b takes no part: its grad stays None
    assert b.grad is None
    opt.step()
    np.testing.assert_array_equal(b.numpy(), b_before)
    assert opt.steps == [1, 0] and opt.exp_avg[1] is None
    opt.zero_grad()
    opt.step()                        # nothing has a grad: a no-op, no submission
    assert opt.steps == [1, 0]


# -- numbers against hand-written NumPy (float64) ---------------------------------------------------------

def _run_trajectory(opt_factory, rng, steps=3):
    params = make_params(3, rng)
    coef = coefficients(params, rng)
    init = [np.array(p.numpy(), np.float64) for p in params]
    opt = opt_factory(params)
    for _ in range(steps):
        opt.zero_grad()
        vkml.backward(quadratic_loss(params, coef))
        opt.step()
    return [p.numpy() for p in params], init, [(a.astype(np.float64), b.astype(np.float64))
                                                for a, b in coef]


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.8, 0.01)])
def test_sgd_matches_a_numpy_update(rng, momentum, weight_decay):
    lr = 0.05
    got, init, coef = _run_trajectory(
        lambda ps: optim.SGD(ps, lr=lr, momentum=momentum, weight_decay=weight_decay), rng)
    for p, g_got, (a, b) in zip(init, got, coef):
        buf = None
        for _ in range(3):
            g = a * p + b + weight_decay * p
            buf = g if buf is None else momentum * buf + g     # PyTorch: the first buffer is g
            p = p - lr * (buf if momentum else g)
        np.testing.assert_allclose(g_got, p, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_adam_matches_a_numpy_update(rng, weight_decay):
    lr, (b1, b2), eps = 0.01, (0.9, 0.999), 1e-8
    got, init, coef = _run_trajectory(
        lambda ps: optim.Adam(ps, lr=lr, betas=(b1, b2), eps=eps, weight_decay=weight_decay), rng)
    for p, p_got, (a, b) in zip(init, got, coef):
        m = np.zeros_like(p)
        v = np.zeros_like(p)
        for t in range(1, 4):
            g = a * p + b + weight_decay * p
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            m_hat = m / (1 - b1 ** t)
            v_hat = v / (1 - b2 ** t)
            p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
        np.testing.assert_allclose(p_got, p, rtol=2e-5, atol=2e-6)


def test_adam_keeps_a_step_count_per_parameter(rng):
    # b has no gradient in the first step, so in the second step a is at t=2 and b at t=1: their
    # bias corrections differ, as in torch.optim.Adam.
    lr, b1, b2, eps = 0.05, 0.9, 0.999, 1e-8
    a0, b0 = rng.standard_normal(4), rng.standard_normal(3)
    a = vkml.tensor(a0.astype(np.float32), requires_grad=True)
    b = vkml.tensor(b0.astype(np.float32), requires_grad=True)
    opt = optim.Adam([a, b], lr=lr, betas=(b1, b2), eps=eps)
    vkml.backward(vkml.sum(a * a))
    opt.step()
    opt.zero_grad()
    vkml.backward(vkml.sum(a * a) + vkml.sum(b * b * b))
    opt.step()
    assert opt.steps == [2, 1]

    def adam(p, grads):
        m = v = np.zeros_like(p)
        for t, grad in enumerate(grads, start=1):
            g = grad(p)
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            p = p - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        return p

    a0, b0 = a0.astype(np.float32).astype(np.float64), b0.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(a.numpy(), adam(a0, [lambda p: 2 * p] * 2), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(b.numpy(), adam(b0, [lambda p: 3 * p * p]), rtol=2e-5, atol=2e-6)


def test_one_adam_step_moves_each_weight_by_lr_against_its_gradient_sign():
    # Adam's first step is lr * g / (|g| + eps'): a sanity check that needs no reference at all.
    p0 = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    p = vkml.tensor(p0, requires_grad=True)
    opt = optim.Adam([p], lr=0.1)
    vkml.backward(vkml.sum(vkml.tensor(np.array([3.0, -2.0, 0.5, 1e-3], np.float32)) * p))
    opt.step()
    np.testing.assert_allclose(p.numpy(), p0 - 0.1 * np.array([1, -1, 1, 1]), atol=1e-4)


# -- bad input --------------------------------------------------------------------------------------

def test_optimizers_refuse_bad_input_with_argument_errors():
    good = vkml.tensor(np.ones(3, np.float32), requires_grad=True)
    frozen = vkml.tensor(np.ones(3, np.float32))
    cases = [
        (lambda: optim.SGD([good, np.ones(3)], lr=0.1), "parameter 1 is a ndarray"),
        (lambda: optim.Adam([good, "w"], lr=0.1), "not a vkml Tensor"),
        (lambda: optim.SGD([good], lr=0.0), "lr must be > 0"),
        (lambda: optim.Adam([good], lr=-1e-3), "lr must be > 0"),
        (lambda: optim.SGD([good], lr=float("nan")), "finite"),
        (lambda: optim.SGD([good], lr="0.1"), "finite number"),
        (lambda: optim.Adam([good, frozen], lr=0.1), "does not require grad"),
        (lambda: optim.SGD([], lr=0.1), "empty"),
        (lambda: optim.SGD(good, lr=0.1), "iterable of tensors"),
        (lambda: optim.SGD([good, good], lr=0.1), "more than once"),
        (lambda: optim.SGD([good * 2.0], lr=0.1), "not a leaf"),
        (lambda: optim.SGD([good], lr=0.1, momentum=-0.5), "momentum"),
        (lambda: optim.Adam([good], betas=(0.9, 1.0)), "betas"),
        (lambda: optim.Adam([good], betas=0.9), "pair"),
        (lambda: optim.Adam([good], eps=-1.0), "eps"),
        (lambda: optim.SGD(nn.Linear(2, 2), lr=0.1), "model.parameters()"),
    ]
    for make, words in cases:
        with pytest.raises(vkml.ArgumentError, match=words.replace("(", r"\(").replace(")", r"\)")):
            make()
    opt = optim.SGD([good], lr=0.1)
    with pytest.raises(vkml.ArgumentError, match="lr"):
        opt.lr = 0
    assert opt.lr == 0.1


def test_a_refused_step_changes_nothing():
    p = vkml.tensor(np.ones(3, np.float32), requires_grad=True)
    opt = optim.Adam([p], lr=0.1)
    for bad, error in [(np.ones(4, np.float32), vkml.ShapeError), (np.ones(3), vkml.DTypeError)]:
        p.grad = vkml.tensor(bad)   # a gradient set by hand that cannot belong to p
        with pytest.raises(error, match="parameter 0"):
            opt.step()
        np.testing.assert_array_equal(p.numpy(), np.ones(3, np.float32))
        assert opt.steps == [0] and opt.exp_avg == [None]


# -- losses against autograd ----------------------------------------------------------------------

def _ag_log_softmax(z):
    m = anp.max(z, axis=1, keepdims=True)
    return z - m - anp.log(anp.sum(anp.exp(z - m), axis=1, keepdims=True))


def _ag_cross_entropy(z, labels):
    return -anp.mean(_ag_log_softmax(z)[np.arange(len(labels)), labels])


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("labels_as", ["array", "tensor", "pending tensor"])
def test_cross_entropy_value_and_gradient_match_autograd(rng, dtype, tol, labels_as):
    z0 = (rng.standard_normal((7, 5)) * 3).astype(dtype)
    labels = rng.integers(0, 5, 7)
    z = vkml.tensor(z0, requires_grad=True)
    given = {"array": lambda: labels, "tensor": lambda: vkml.tensor(labels),
             "pending tensor": lambda: vkml.tensor(labels + 1) - 1}[labels_as]()
    loss = nn.cross_entropy(z, given)
    loss.backward()
    z64 = z0.astype(np.float64)
    assert loss.dtype == dtype
    np.testing.assert_allclose(loss.item(), _ag_cross_entropy(z64, labels), rtol=tol, atol=tol)
    np.testing.assert_allclose(z.grad.numpy(), autograd.grad(_ag_cross_entropy)(z64, labels),
                               rtol=tol * 10, atol=tol)


def test_cross_entropy_is_stable_for_huge_logits():
    z = vkml.tensor(np.array([[1000.0, 0.0, -1000.0]], np.float32), requires_grad=True)
    loss = nn.cross_entropy(z, [0])
    loss.backward()
    assert loss.item() == 0.0
    np.testing.assert_allclose(z.grad.numpy(), [[0.0, 0.0, 0.0]], atol=1e-6)


def test_log_softmax_value_and_gradient_match_autograd(rng):
    z0 = rng.standard_normal((4, 6))
    w = rng.standard_normal((4, 6))
    z = vkml.tensor(z0, requires_grad=True)
    out = nn.log_softmax(z, axis=-1)
    vkml.backward(vkml.sum(out * vkml.tensor(w)))
    np.testing.assert_allclose(out.numpy(), _ag_log_softmax(z0), rtol=1e-12, atol=1e-12)
    ref = autograd.grad(lambda a: anp.sum(_ag_log_softmax(a) * w))(z0)
    np.testing.assert_allclose(z.grad.numpy(), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("loss_fn", [nn.mse, nn.mse_loss])
def test_mse_value_and_gradient_match_autograd(rng, loss_fn):
    p0, t0 = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    pred = vkml.tensor(p0, requires_grad=True)
    loss = loss_fn(pred, t0)
    loss.backward()

    def ref(a):
        return anp.mean((a - t0) ** 2)

    np.testing.assert_allclose(loss.item(), ref(p0), rtol=1e-12)
    np.testing.assert_allclose(pred.grad.numpy(), autograd.grad(ref)(p0), rtol=1e-12, atol=1e-15)


def test_losses_refuse_bad_input():
    z = vkml.tensor(np.zeros((3, 4), np.float32), requires_grad=True)
    with pytest.raises(vkml.ArgumentError, match="label 4"):
        nn.cross_entropy(z, [0, 1, 4])
    with pytest.raises(vkml.ArgumentError, match="label -1"):
        nn.cross_entropy(z, [0, -1, 2])
    with pytest.raises(vkml.DTypeError, match="integer class indices"):
        nn.cross_entropy(z, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(vkml.ShapeError, match=r"\(3,\)"):
        nn.cross_entropy(z, [0, 1])
    with pytest.raises(vkml.ShapeError, match="batch, classes"):
        nn.cross_entropy(vkml.tensor(np.zeros(4, np.float32)), [0])
    with pytest.raises(vkml.ShapeError, match="not broadcast"):
        nn.mse(vkml.tensor(np.zeros((3, 1))), np.zeros(3))


# -- layers and modules ---------------------------------------------------------------------------------

def test_linear_matches_numpy_and_uses_pytorch_init_bounds():
    layer = nn.Linear(50, 7, rng=np.random.default_rng(1))
    w, b = layer.weight.numpy(), layer.bias.numpy()
    assert w.shape == (7, 50) and b.shape == (7,) and w.dtype == np.float32
    bound = 1 / math.sqrt(50)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert np.abs(w).max() > 0.8 * bound          # really spread over the interval
    x = np.random.default_rng(2).standard_normal((4, 50)).astype(np.float32)
    np.testing.assert_allclose(layer(vkml.tensor(x)).numpy(), x @ w.T + b, rtol=1e-5, atol=1e-6)
    no_bias = nn.Linear(50, 7, bias=False)
    assert no_bias.bias is None and len(no_bias.parameters()) == 1


def test_seeding_makes_initial_parameters_reproducible():
    def build():
        return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(8, 3))

    nn.manual_seed(123)
    first = [p.numpy().copy() for p in build().parameters()]
    nn.manual_seed(123)
    second = [p.numpy().copy() for p in build().parameters()]
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    a = nn.Linear(3, 3, rng=np.random.default_rng(5)).weight.numpy()
    b = nn.Linear(3, 3, rng=5).weight.numpy()
    np.testing.assert_array_equal(a, b)


def test_named_parameters_follow_attribute_order_and_list_each_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(4, 3)
            self.blocks = [nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3, bias=False)]
            self.dec = nn.Linear(3, 4)
            self.dec.weight = self.enc.weight          # tied: listed once, under its first name
            self.scale = vkml.tensor(np.float32(2.0), requires_grad=True)
            self.running = vkml.tensor(np.zeros(3, np.float32))   # no grad: state, not a parameter

        def forward(self, x):
            h = self.enc(x)
            for blk in self.blocks:
                h = blk(h)
            return self.dec(h) * self.scale

    model = Tied()
    names = [n for n, _ in model.named_parameters()]
    assert names == ["scale", "enc.weight", "enc.bias", "blocks.0.weight", "blocks.0.bias",
                     "blocks.2.weight", "dec.bias"]
    assert len(model.parameters()) == 7
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert len(seq) == 3 and isinstance(seq[1], nn.ReLU) and len(seq[1:]) == 2
    assert "Linear(in_features=2, out_features=3, bias=True)" in repr(seq)


def test_train_and_eval_set_the_flag_in_every_submodule():
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Linear(2, 2)))
    assert all(m.training for m in model.modules())
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    model.train()
    assert all(m.training for m in model.modules())


def test_layers_refuse_bad_arguments():
    with pytest.raises(vkml.ArgumentError):
        nn.Linear(0, 3)
    with pytest.raises(vkml.ArgumentError):
        nn.Conv2d(1, 2, kernel_size=(3,))
    with pytest.raises(vkml.ArgumentError):
        nn.Sequential(nn.ReLU(), lambda x: x)
    with pytest.raises(vkml.ShapeError, match="last dimension must be 4"):
        nn.Linear(4, 2)(vkml.tensor(np.zeros((2, 3), np.float32)))
    with pytest.raises(vkml.ShapeError, match=r"\(N, 3, H, W\)"):
        nn.Conv2d(3, 2, 3)(vkml.tensor(np.zeros((1, 1, 5, 5), np.float32)))
    with pytest.raises(vkml.ArgumentError):
        nn.manual_seed("0")


def _ag_conv(x, w, b, pad):
    """Direct 2-D cross-correlation, written with autograd.numpy (one einsum per kernel tap)."""
    x = anp.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    o, c, kh, kw = w.shape
    ho, wo = x.shape[2] - kh + 1, x.shape[3] - kw + 1
    out = 0.0
    for i in range(kh):
        for j in range(kw):
            out = out + anp.einsum("nchw,oc->nohw", x[:, :, i:i + ho, j:j + wo], w[:, :, i, j])
    return out + b[None, :, None, None]


def _ag_maxpool2(x):
    n, c, h, w = x.shape
    return anp.max(anp.max(x.reshape(n, c, h // 2, 2, w // 2, 2), axis=5), axis=3)


def test_small_cnn_loss_and_every_parameter_gradient_match_autograd(rng):
    nn.manual_seed(7)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(3 * 3 * 3, 4))
    x = rng.standard_normal((5, 2, 6, 6))
    labels = rng.integers(0, 4, 5)
    params = [p.numpy().astype(np.float64) for p in model.parameters()]
    loss = nn.cross_entropy(model(vkml.tensor(x.astype(np.float32))), labels)
    loss.backward()

    def ref(ps):
        cw, cb, lw, lb = ps
        h = _ag_maxpool2(anp.maximum(_ag_conv(x, cw, cb, 1), 0.0))
        return _ag_cross_entropy(h.reshape(5, -1) @ lw.T + lb, labels)

    np.testing.assert_allclose(loss.item(), ref(params), rtol=1e-5)
    grads = autograd.grad(ref)(params)
    for p, g in zip(model.parameters(), grads):
        np.testing.assert_allclose(p.grad.numpy(), g, rtol=2e-4, atol=2e-6)


def test_conv2d_stride_and_maxpool_stride_match_numpy(rng):
    conv = nn.Conv2d(2, 4, (3, 2), stride=2, padding=1, rng=rng)
    x = rng.standard_normal((2, 2, 7, 6)).astype(np.float32)
    out = conv(vkml.tensor(x)).numpy()
    w, b = conv.weight.numpy().astype(np.float64), conv.bias.numpy().astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ho, wo = (xp.shape[2] - 3) // 2 + 1, (xp.shape[3] - 2) // 2 + 1
    ref = np.zeros((2, 4, ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, 2 * i:2 * i + 3, 2 * j:2 * j + 2]
            ref[:, :, i, j] = np.einsum("nckl,ockl->no", patch, w) + b
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    pooled = nn.MaxPool2d(3, stride=2)(vkml.tensor(x)).numpy()
    ref_pool = np.array([[[[x[n, c, 2 * i:2 * i + 3, 2 * j:2 * j + 3].max() for j in range(2)]
                           for i in range(3)] for c in range(2)] for n in range(2)])
    np.testing.assert_array_equal(pooled, ref_pool)


# -- a training loop compiles once, then replays -----------------------------------------------------------

def test_twenty_training_steps_compile_in_the_first_steps_then_hit_the_cache(rng):
    nn.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = optim.Adam(model.parameters(), lr=5e-2)
    x = rng.standard_normal((32, 10)).astype(np.float32)
    y = rng.integers(0, 3, 32)
    vkml.reset_stats()
    snapshots, losses, update_replays = [], [], []
    for _ in range(20):
        opt.zero_grad()
        loss = nn.cross_entropy(model(vkml.tensor(x)), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        snapshots.append(vkml.stats())
        update_replays.append(replays("adam"))
    after2, after20 = snapshots[1], snapshots[19]
    assert after20.compiles == after2.compiles
    assert after2.compiles <= 2             # the backward program and the update program, once each
    assert after20.derivations == after2.derivations <= 1   # derived once (or already cached)
    steady = after20 - after2
    assert steady.submissions == 18 * 2     # backward + the update per step; loss.item() is free
    assert steady.traces == 0
    # Each backward replays its cached program (counted in stats().cache_hits); each update replays
    # the optimiser's jitted program (counted by the jit).
    assert steady.cache_hits >= 18
    assert update_replays[19] - update_replays[1] == 18
    assert losses[-1] < 0.5 * losses[0]     # and it learns


# -- compile_step: the whole training step as one program -----------------------------------------------

def _mlp_and_batch(seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((8, 5)).astype(dtype)
    y = rng.integers(0, 3, 8)
    nn.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 6, dtype=dtype), nn.ReLU(), nn.Linear(6, 3, dtype=dtype))
    return model, vkml.tensor(x), vkml.tensor(y)


def _loss_oracle(x, y):
    """The same network's mean cross-entropy in HIPS autograd (an independent differentiator)."""
    def loss(w1, b1, w2, b2):
        h = anp.maximum(x @ w1.T + b1, 0.0)
        z = h @ w2.T + b2
        z = z - anp.max(z, axis=1, keepdims=True)
        logp = z - anp.log(anp.sum(anp.exp(z), axis=1, keepdims=True))
        return -anp.mean(logp[np.arange(len(y)), y])
    return loss


@pytest.mark.parametrize("make_opt", [lambda ps: optim.Adam(ps, lr=1e-2),
                                      lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)],
                         ids=["adam", "sgd-momentum-decay"])
def test_compile_step_is_one_submission_and_matches_backward_and_step(make_opt):
    eager_model, x, y = _mlp_and_batch(1)
    model, _, _ = _mlp_and_batch(1)
    eager_opt, opt = make_opt(eager_model.parameters()), make_opt(model.parameters())
    step = opt.compile_step(lambda xb, yb: nn.cross_entropy(model(xb), yb))
    oracle = _loss_oracle(x.numpy(), y.numpy())
    for k in range(3):
        before = [np.array(p.numpy()) for p in model.parameters()]
        eager_opt.zero_grad()
        want = nn.cross_entropy(eager_model(x), y)
        want.backward()
        eager_opt.step()
        cost = vkml.stats()
        loss = step(x, y)
        cost = vkml.stats() - cost
        assert cost.submissions == 1
        if k:
            assert cost.traces == 0 and cost.compiles == 0 and cost.derivations == 0
        # the loss and the gradient at the step's starting point, against autograd
        np.testing.assert_allclose(loss.item(), oracle(*before), rtol=1e-12)
        grads = autograd.grad(lambda ps: oracle(*ps))(before)
        for p, g in zip(model.parameters(), grads):
            np.testing.assert_allclose(p.grad.numpy(), g, rtol=1e-10, atol=1e-12)
        # and the same program as backward + step, so the same bits
        assert loss.item() == want.item()
        for p, q in zip(model.parameters(), eager_model.parameters()):
            assert p.numpy().tobytes() == q.numpy().tobytes()
            assert p.grad.numpy().tobytes() == q.grad.numpy().tobytes()
            assert p.requires_grad and p.is_leaf


def test_compile_step_replays_across_lr_changes_and_retraces_for_a_new_batch_shape():
    model, x, y = _mlp_and_batch(2)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    step = opt.compile_step(lambda xb, yb: nn.cross_entropy(model(xb), yb))
    losses = [step(x, y).item()]
    for lr in (5e-3, 1e-3):
        opt.lr = lr
        cost = vkml.stats()
        losses.append(step(x, y).item())
        cost = vkml.stats() - cost
        assert (cost.traces, cost.compiles, cost.submissions) == (0, 0, 1)
    assert losses[-1] < losses[0] and opt.steps == [3] * 4
    x2 = vkml.tensor(np.ones((3, 5)))
    y2 = vkml.tensor(np.array([0, 1, 2]))
    cost = vkml.stats()
    step(x2, y2)
    assert (vkml.stats() - cost).traces >= 1 and step.cache_info()["keys"] == 2


def test_compile_step_refuses_a_bad_loss_and_changes_nothing():
    model, x, y = _mlp_and_batch(3)
    opt = optim.SGD(model.parameters(), lr=0.1)
    before = [np.array(p.numpy()) for p in model.parameters()]
    with pytest.raises(vkml.VkmlError, match="loss_fn must return a floating 0-d Tensor"):
        opt.compile_step(lambda xb, yb: model(xb))(x, y)
    with pytest.raises(vkml.VkmlError, match="loss_fn must be callable"):
        opt.compile_step("loss")
    for p, b in zip(model.parameters(), before):
        assert p.numpy().tobytes() == b.tobytes() and p.grad is None and p.is_leaf
    # the model still works eagerly afterwards (its parameters were pointed back at their values)
    nn.cross_entropy(model(x), y).backward()
    opt.step()
    assert not np.array_equal(model.parameters()[0].numpy(), before[0])
