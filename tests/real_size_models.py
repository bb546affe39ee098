"""The four pictures users make at real size (the MLP gradients, an RK4 scan's gradient, a model's
pending loss), shared by the picture tests: each function returns the Diagram a notebook shows."""

import numpy as np

import vkml
from vkml import viz

RNG = np.random.default_rng(0)
X, Y = RNG.standard_normal((16, 64)), RNG.integers(0, 10, 16)


def mlp_dict(p, x, y):
    h = vkml.tanh(x @ p["W1"] + p["b1"])
    logits = h @ p["W2"] + p["b2"]
    return vkml.nn.cross_entropy(logits, y)


def mlp_list(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = vkml.relu(h @ w + b)
    w, b = params[-1]
    return vkml.nn.cross_entropy(h @ w + b, y)


def pendulum(state, length):
    theta, omega = state[0], state[1]
    return vkml.stack([omega, -9.81 / length * vkml.sin(theta)])


def rk4(state, length, dt=0.01):
    k1 = pendulum(state, length)
    k2 = pendulum(state + dt / 2 * k1, length)
    k3 = pendulum(state + dt / 2 * k2, length)
    k4 = pendulum(state + dt * k3, length)
    return state + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)


def swing(length, state0):
    def step(s, _):
        s = rk4(s, length)
        return s, s[0]
    _, thetas = vkml.scan(step, state0, np.zeros(100))
    return vkml.sum(thetas * thetas)


def mlp_dict_gradient():
    params = {"W1": RNG.standard_normal((64, 32)), "b1": np.zeros(32),
              "W2": RNG.standard_normal((32, 10)), "b2": np.zeros(10)}
    f = vkml.jit(mlp_dict)
    vkml.grad(f)(params, X, Y)
    return viz.derived_dot(f)


def mlp_list_gradient():
    params = [(RNG.standard_normal((64, 32)), np.zeros(32)),
              (RNG.standard_normal((32, 32)), np.zeros(32)),
              (RNG.standard_normal((32, 10)), np.zeros(10))]
    f = vkml.jit(mlp_list)
    vkml.grad(f)(params, X, Y)
    return viz.derived_dot(f)


def rk4_gradient():
    f = vkml.jit(swing)
    vkml.grad(f)(1.0, np.array([0.3, 0.0]))
    return viz.derived_dot(f)


def model_loss():
    model = vkml.nn.Sequential(vkml.nn.Linear(64, 32, rng=0), vkml.nn.ReLU(),
                               vkml.nn.Linear(32, 32, rng=1), vkml.nn.ReLU(),
                               vkml.nn.Linear(32, 10, rng=2))
    return viz.tensor_dot(vkml.nn.cross_entropy(model(X.astype(np.float32)), Y))


#: name -> (the picture, a name it must show)
PICTURES = {"mlp_dict": (mlp_dict_gradient, "p['W1']"), "mlp_list": (mlp_list_gradient, "params[1][0]"),
            "rk4": (rk4_gradient, "length"), "model_loss": (model_loss, "0.weight")}
