"""The kernels and models several test folders use, defined once.

- ``square`` (``u = x * x``) and ``wave`` (``y = sin(k u)``): the two-node graph of the graph tests;
- ``pendulum_step(dt)``: a damped pendulum's explicit Euler step with a per-sample stop
  (``terminated`` once ``t >= t_end``), the simulation tests' model; ``pendulum`` is it at
  ``DT = 0.01``;
- ``H``: the step of the central differences the gradient checks use.
"""

from __future__ import annotations

import vkml

DT = 0.01
H = 1e-6


@vkml.kernel
def square(x):
    return {"u": x * x}


@vkml.kernel
def wave(u, k: vkml.Param):
    return {"y": vkml.sin(k * u)}


def pendulum_step(dt):
    """The damped pendulum's step with time step ``dt``, as a kernel named ``pendulum``."""
    @vkml.kernel
    def pendulum(theta, omega, t, t_end, length: vkml.Param, damping: vkml.Param):
        acc = -9.81 / length * vkml.sin(theta) - damping * omega
        om = omega + dt * acc
        tn = t + dt
        return {"theta": theta + dt * om, "omega": om, "t": tn, "terminated": tn >= t_end}
    return pendulum


pendulum = pendulum_step(DT)
