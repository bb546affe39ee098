"""Workloads more than one benchmark runs, written once: the damped pendulum kernel, the MLP
training step on vkml (lazy and compiled), and building each side of a comparison."""

from __future__ import annotations

import numpy as np

import vkml

#: the damped pendulum of bench/simulation.py and bench/gpu.py
DT, GRAVITY, LENGTH, DAMPING = 0.01, 9.81, 1.2, 0.3


@vkml.kernel
def pendulum(theta, omega, t, length: vkml.Param, damping: vkml.Param, t_end: vkml.Param):
    om = omega + DT * (-(GRAVITY / length) * vkml.sin(theta) - damping * omega)
    th = theta + DT * om
    tn = t + DT
    return {"theta": th, "omega": om, "t": tn, "terminated": tn >= t_end}


class VkmlMlp:
    """The bench MLP (Linear-ReLU-Linear, cross-entropy, Adam) on vkml, built twice from one seed:
    ``step()`` is the lazy step (zero_grad, backward, Adam.step) on ``model``/``opt``,
    ``compiled_step()`` the same step as ``opt.compile_step``; ``init`` holds the initial weights
    (W1, b1, W2, b2) for the other sides."""

    def __init__(self, X, Y, sizes, lr, betas, eps):
        def build():
            vkml.nn.manual_seed(0)
            d_in, d_hid, d_out = sizes
            model = vkml.nn.Sequential(vkml.nn.Linear(d_in, d_hid), vkml.nn.ReLU(),
                                       vkml.nn.Linear(d_hid, d_out))
            return model, vkml.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps)

        self.model, self.opt = build()
        self.init = [np.array(p.numpy()) for p in self.model.parameters()]
        self.xt, self.yt = vkml.tensor(X), vkml.tensor(Y)
        model_c, opt_c = build()
        self._compiled = opt_c.compile_step(lambda x, y: vkml.nn.cross_entropy(model_c(x), y))

    def step(self):
        self.opt.zero_grad()
        loss = vkml.nn.cross_entropy(self.model(self.xt), self.yt)
        loss.backward()
        self.opt.step()
        return loss

    def compiled_step(self):
        return self._compiled(self.xt, self.yt)


def build_sides(factories, what):
    """Each side a factory makes; a side that fails to build is said in the output, not faked."""
    sides = {}
    for name, make in factories.items():
        try:
            sides[name] = make()
        except Exception as err:  # noqa: BLE001
            print(f"  {name} could not build the {what}: {type(err).__name__}: {err}")
    return sides
