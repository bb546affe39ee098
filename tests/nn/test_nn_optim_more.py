"""The layers, activations, losses and optimisers PyTorch code ports to, checked against plain
NumPy written from PyTorch's documented formulas (an oracle independent of vkml) and against
central differences, on the NumPy backend and the cpu tier."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.special

import vkml
from backends_under_test import BACKENDS

import oracle as O

pytestmark = pytest.mark.parametrize("vk_backend", BACKENDS, indirect=True)

RNG = np.random.default_rng(7)
X = RNG.normal(size=(3, 4)) * 2.0


# -- activations ------------------------------------------------------------------------------

ACTIVATIONS = {
    "silu": (lambda x: vkml.nn.silu(x), lambda x: x / (1 + np.exp(-x))),
    "softplus": (lambda x: vkml.nn.softplus(x, 2.0, 3.0),
                 lambda x: np.where(2 * x > 3.0, x, np.log1p(np.exp(2 * x)) / 2)),
    "leaky_relu": (lambda x: vkml.nn.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    "elu": (lambda x: vkml.nn.elu(x, 1.5), lambda x: np.where(x > 0, x, 1.5 * np.expm1(x))),
    "gelu": (lambda x: vkml.nn.gelu(x), lambda x: 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))),
    "gelu-tanh": (lambda x: vkml.nn.gelu(x, approximate="tanh"),
                  lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    "SiLU": (lambda x: vkml.nn.SiLU()(x), lambda x: x / (1 + np.exp(-x))),
    "ELU": (lambda x: vkml.nn.ELU()(x), lambda x: np.where(x > 0, x, np.expm1(x))),
    "LeakyReLU": (lambda x: vkml.nn.LeakyReLU()(x), lambda x: np.where(x > 0, x, 0.01 * x)),
    "Softplus": (lambda x: vkml.nn.Softplus()(x), lambda x: np.log1p(np.exp(x))),
}


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_values_and_gradients(name):
    f_vk, ref = ACTIVATIONS[name]
    x = np.where(np.abs(X) < 0.05, 0.3, X)            # away from the kinks at 0
    np.testing.assert_allclose(f_vk(vkml.tensor(x)).numpy(), ref(x), rtol=1e-12, atol=1e-14)
    w = O.weights_like(x.shape, name)
    got = O.vkml_grads(f_vk, [x], [0], w)[0]
    fd = O.central_diff(lambda v: float(np.sum(ref(v) * w)), x)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


def test_one_hot_and_its_refusals():
    np.testing.assert_array_equal(vkml.nn.one_hot(np.array([[0, 2], [1, 1]]), 3).numpy(),
                                  np.eye(3, dtype=np.int64)[[[0, 2], [1, 1]]])
    assert vkml.nn.one_hot(np.array([0, 3])).shape == (2, 4)
    with pytest.raises(vkml.ArgumentError, match="integers"):
        vkml.nn.one_hot(np.array([0.5]), 2)
    with pytest.raises(vkml.ArgumentError, match="approximate"):
        vkml.nn.gelu(vkml.tensor(X), approximate="exact")


# -- convolution and pooling --------------------------------------------------------------------

def conv_ref(x, w, b, stride, padding, dilation, groups):
    """A direct loop over output positions, as PyTorch's conv2d defines them."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    x = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    ho = (x.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (x.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, ho, wo))
    per_out = o // groups
    for oc in range(o):
        g = oc // per_out
        for i in range(ho):
            for j in range(wo):
                rows = i * stride[0] + dilation[0] * np.arange(kh)
                cols = j * stride[1] + dilation[1] * np.arange(kw)
                patch = x[:, g * cg:(g + 1) * cg][:, :, rows][:, :, :, cols]
                out[:, oc, i, j] = np.sum(patch * w[oc], axis=(1, 2, 3)) + b[oc]
    return out


@pytest.mark.parametrize("stride, padding, dilation, groups", [
    ((1, 1), (0, 0), (2, 2), 1), ((2, 1), (1, 2), (1, 2), 2), ((1, 1), (1, 1), (1, 1), 4)])
def test_conv2d_dilation_and_groups(stride, padding, dilation, groups):
    x = RNG.normal(size=(2, 4, 7, 8))
    w = RNG.normal(size=(8, 4 // groups, 3, 2))
    b = RNG.normal(size=8)
    conv = vkml.nn.Conv2d(4, 8, (3, 2), stride, padding, dilation, groups, rng=0, dtype=np.float64)
    conv.weight.assign_(w)
    conv.bias.assign_(b)
    got = conv(x)
    np.testing.assert_allclose(got.numpy(), conv_ref(x, w, b, stride, padding, dilation, groups),
                               rtol=1e-12, atol=1e-12)
    wts = O.weights_like(got.shape, "conv")
    (got * wts).sum().backward()
    fd = O.central_diff(lambda v: float(np.sum(conv_ref(x, v, b, stride, padding, dilation, groups) * wts)), w)
    np.testing.assert_allclose(conv.weight.grad.numpy(), fd, rtol=1e-6, atol=1e-7)


def test_conv2d_groups_that_do_not_divide_are_refused_with_the_fix():
    with pytest.raises(vkml.ShapeError, match="groups=3 must divide"):
        vkml.conv2d(vkml.ones((1, 4, 5, 5)), vkml.ones((6, 2, 3, 3)), groups=3)


def pool_ref(x, k, s, p, op, fill):
    x = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=fill)
    ho, wo = (x.shape[2] - k) // s + 1, (x.shape[3] - k) // s + 1
    out = np.empty(x.shape[:2] + (ho, wo))
    for i in range(ho):
        for j in range(wo):
            out[:, :, i, j] = op(x[:, :, i * s:i * s + k, j * s:j * s + k], axis=(2, 3))
    return out


def test_pooling_with_padding_matches_pytorchs_definition():
    x = RNG.normal(size=(2, 3, 7, 6))
    np.testing.assert_array_equal(vkml.max_pool2d(vkml.tensor(x), 3, 2, 1).numpy(),
                                  pool_ref(x, 3, 2, 1, np.max, -np.inf))
    np.testing.assert_allclose(vkml.avg_pool2d(vkml.tensor(x), 3, 2, 1).numpy(),
                               pool_ref(x, 3, 2, 1, np.mean, 0.0), rtol=1e-12)
    np.testing.assert_array_equal(vkml.nn.MaxPool2d(2, padding=1)(x).numpy(),
                                  pool_ref(x, 2, 2, 1, np.max, -np.inf))
    with pytest.raises(vkml.ShapeError, match="at most half the window"):
        vkml.max_pool2d(vkml.tensor(x), 2, 2, 2)


# -- embeddings and losses ---------------------------------------------------------------------

def test_embedding_padding_row_starts_at_zero_and_is_never_trained():
    emb = vkml.nn.Embedding(5, 3, padding_idx=-1, rng=0, dtype=np.float64)
    assert emb.padding_idx == 4
    np.testing.assert_array_equal(emb.weight.numpy()[4], 0.0)
    ids = np.array([[4, 1], [1, 4]])
    emb(ids).sum().backward()
    grad = emb.weight.grad.numpy()
    np.testing.assert_array_equal(grad[4], 0.0)
    np.testing.assert_array_equal(grad[1], 2.0)


def ce_ref(logits, labels, smoothing, reduction):
    logp = logits - scipy.special.logsumexp(logits, axis=1, keepdims=True)
    rows = -(1 - smoothing) * logp[np.arange(len(labels)), labels] - smoothing * logp.mean(1)
    return {"mean": rows.mean(), "sum": rows.sum(), "none": rows}[reduction]


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_smoothing_and_reduction(smoothing, reduction):
    logits = RNG.normal(size=(5, 4))
    labels = np.array([0, 3, 1, 1, 2])
    f = lambda z: vkml.nn.cross_entropy(z, labels, label_smoothing=smoothing, reduction=reduction)  # noqa: E731
    np.testing.assert_allclose(f(vkml.tensor(logits)).numpy(), ce_ref(logits, labels, smoothing, reduction),
                               rtol=1e-12)
    w = O.weights_like(np.shape(ce_ref(logits, labels, smoothing, reduction)), "ce", reduction)
    got = O.vkml_grads(f, [logits], [0], w)[0]
    fd = O.central_diff(lambda v: float(np.sum(ce_ref(v, labels, smoothing, reduction) * w)), logits)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-9)


def test_cross_entropy_out_of_range_label_says_what_to_do():
    with pytest.raises(vkml.ArgumentError, match="needs 6 outputs"):
        vkml.nn.cross_entropy(vkml.tensor(np.zeros((2, 3))), np.array([0, 5]))


# -- optimisers: PyTorch's documented update rules, in NumPy ------------------------------------------

def sgd_ref(w, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
    buf = None
    for g in grads:
        g = g + weight_decay * w
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        w = w - lr * g
    return w


def adam_ref(w, grads, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False,
             decoupled=False):
    m = v = vmax = 0.0
    for t, g in enumerate(grads, start=1):
        if decoupled:
            w = w * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * w
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        vmax = np.maximum(vmax, v) if amsgrad else v
        denom = np.sqrt(vmax) / np.sqrt(1 - betas[1] ** t) + eps
        w = w - lr / (1 - betas[0] ** t) * m / denom
    return w


def rmsprop_ref(w, grads, lr, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False):
    sq = ga = buf = 0.0
    for g in grads:
        g = g + weight_decay * w
        sq = alpha * sq + (1 - alpha) * g * g
        if centered:
            ga = alpha * ga + (1 - alpha) * g
            avg = np.sqrt(sq - ga * ga) + eps
        else:
            avg = np.sqrt(sq) + eps
        if momentum:
            buf = momentum * buf + g / avg
            w = w - lr * buf
        else:
            w = w - lr * g / avg
    return w


TARGETS = [RNG.normal(size=(3, 4)) for _ in range(6)]
W0 = RNG.normal(size=(3, 4))


OPTIMISERS = [
    ("SGD", sgd_ref, dict(lr=0.01, momentum=0.9, nesterov=True)),
    ("SGD", sgd_ref, dict(lr=0.01, momentum=0.9, dampening=0.3, weight_decay=0.1)),
    ("Adam", adam_ref, dict(lr=0.05, amsgrad=True)),
    ("AdamW", lambda w, g, **k: adam_ref(w, g, decoupled=True, **k), dict(lr=0.05, weight_decay=0.1)),
    ("AdamW", lambda w, g, **k: adam_ref(w, g, decoupled=True, **k), dict(lr=0.05, weight_decay=0.1, amsgrad=True)),
    ("RMSprop", rmsprop_ref, dict(lr=0.01)),
    ("RMSprop", rmsprop_ref, dict(lr=0.01, momentum=0.9, centered=True, weight_decay=0.1)),
]


def _reference_run(ref, kw):
    """The reference's parameters after one step per target.  The references are loops over a
    list of gradients; each gradient is taken at the parameters the steps before it reached
    (the reference run again on the gradients so far)."""
    grads, w = [], W0.copy()
    for t in TARGETS:
        grads.append(6 * w ** 2 * (w ** 3 - t))      # d/dw sum((w^3 - t)^2)
        w = ref(W0.copy(), list(grads), **kw)
    return w


@pytest.mark.parametrize("name, ref, kw", OPTIMISERS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(OPTIMISERS)])
@pytest.mark.parametrize("compiled", [False, True])
def test_optimisers_follow_pytorchs_update_rules(name, ref, kw, compiled):
    want = _reference_run(ref, kw)
    w = vkml.nn.Parameter(W0, dtype=np.float64)
    opt = getattr(vkml.optim, name)([w], **kw)
    if compiled:
        step = opt.compile_step(lambda t: ((w * w * w - t) ** 2).sum())
        for t in TARGETS:
            step(t)
    else:
        for t in TARGETS:
            opt.zero_grad()
            ((w * w * w - vkml.tensor(t)) ** 2).sum().backward()
            opt.step()
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-12, atol=1e-14)


def test_optimiser_refusals_say_what_to_do():
    with pytest.raises(vkml.ArgumentError, match="model.parameters"):
        vkml.optim.Adam([])
    with pytest.raises(vkml.ArgumentError, match="nesterov=True needs momentum"):
        vkml.optim.SGD([vkml.nn.Parameter([1.0])], lr=0.1, nesterov=True)
