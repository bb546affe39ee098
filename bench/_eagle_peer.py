"""The raptor-eagle side of ``graph_reverse.py`` and ``simulation.py``: the same models written with
eagle/hawk (PyPI ``raptor-eagle`` / ``raptor-hawk``), run on the CPU.

eagle compiles each hawk kernel with g++ the first time it is deployed (cached on disk after), so
``setup_s`` of every builder below is a one-time cost that is reported, never timed per launch.
Written from eagle's and hawk's own docstrings; nothing here is vkml code, and vkml never imports it.

Import this module only after the thread count is set (``OMP_NUM_THREADS``): eagle's host team
reads it when it first runs a kernel.
"""

from __future__ import annotations

import time

import numpy as np

_IMPORT_ERROR = None
try:
    import eagle
    import eagle.diff
    import hawk
    import hawk.math as hm
    from hawk import Mutable, Param, Scalar, Terminated
except Exception as err:  # noqa: BLE001 - reported by the benchmarks as "eagle unavailable"
    _IMPORT_ERROR = err


def available():
    """``(True, version)`` or ``(False, why)``."""
    if _IMPORT_ERROR is not None:
        return False, f"{type(_IMPORT_ERROR).__name__}: {_IMPORT_ERROR}"
    return True, f"raptor-eagle {eagle.__version__}, raptor-hawk {hawk.__version__}"


# -- the two-node graph: u = x*x; y = sin(k*u) ----------------------------------------------------

_KERNELS = {}


def _graph_kernels():
    if "graph" not in _KERNELS:
        @hawk.kernel
        def square(x: Scalar, u: Mutable[Scalar]):
            u = x * x  # noqa: F841 - a hawk sink is committed by assignment

        @hawk.kernel
        def wave(u: Scalar, k: Param, y: Mutable[Scalar]):
            y = hm.sin(k * u)  # noqa: F841

        _KERNELS["graph"] = (eagle.deploy(square), eagle.deploy(wave))
    return _KERNELS["graph"]


class TwoNodeGraph:
    """``eagle.Graph`` of square -> wave, built with ``record=True``; ``eagle.diff.Reverse`` built once."""

    def __init__(self, x, k):
        t0 = time.perf_counter()
        sq, wv = _graph_kernels()
        n = x.shape[0]
        self.x = x
        self.u = np.zeros(n)
        self.y = np.zeros(n)
        self.g = (eagle.Graph()
                  .add(sq.bind(x=x, u=self.u), name="square")
                  .add(wv.bind(u=self.u, k=k, y=self.y), name="wave")
                  .build(record=True))
        self.rev = eagle.diff.Reverse(self.g)
        self.setup_s = time.perf_counter() - t0

    def launch(self):
        self.g.launch()

    def reverse(self, seed):
        grads = self.rev(self.g.record, {"y": seed})
        return {"x": grads["x"], "k": float(np.ravel(grads["k"])[0])}


# -- the damped pendulum: semi-implicit Euler, stops when t >= t_end ------------------------------

def _pendulum_kernel(dt, gravity):
    key = ("pendulum", dt, gravity)
    if key not in _KERNELS:
        @hawk.kernel(steps=1)          # one step per launch: what a recorded run needs
        def pendulum(theta: Mutable[Scalar], omega: Mutable[Scalar], t: Mutable[Scalar],
                     length: Param, damping: Param, t_end: Param, terminated: Terminated):
            omega = omega + dt * (-(gravity / length) * hm.sin(theta) - damping * omega)
            theta = theta + dt * omega  # noqa: F841
            t = t + dt
            terminated = t >= t_end  # noqa: F841

        _KERNELS[key] = pendulum
    return _KERNELS[key]


class Pendulum:
    """``eagle.simulation(..., record=True)`` (default window) and its ``eagle.diff.Reverse``."""

    def __init__(self, theta0, omega0, *, length, damping, t_end, max_steps, dt, gravity,
                 window=None):
        t0 = time.perf_counter()
        self.theta0, self.omega0 = theta0, omega0
        self.theta = theta0.copy()
        self.omega = omega0.copy()
        self.t = np.zeros_like(theta0)
        kw = {} if window is None else {"window": window}
        self.sim = eagle.simulation(_pendulum_kernel(dt, gravity), theta=self.theta,
                                    omega=self.omega, t=self.t, length=length, damping=damping,
                                    t_end=t_end, max_steps=max_steps, record=True, **kw)
        self.rev = eagle.diff.Reverse(self.sim)
        self.first = True
        self.setup_s = time.perf_counter() - t0

    def reset(self):
        """Back to the initial state (untimed): the next ``run`` starts the batch over."""
        self.theta[...] = self.theta0
        self.omega[...] = self.omega0
        self.t[...] = 0.0
        if not self.first:
            self.sim.reset()
        self.first = False

    def run(self):
        self.result = self.sim.run()
        return self.result

    def reverse(self, seeds):
        grads = self.rev(self.sim.record, seeds)
        out = {k: np.asarray(grads[k]) for k in ("theta", "omega")}
        out.update({k: float(np.ravel(grads[k])[0]) for k in ("length", "damping")})
        out["_report"] = grads.report
        return out

    @property
    def steps(self):
        return int(self.result.steps)

    @property
    def record_nbytes(self):
        return int(self.sim.record.nbytes)

    @property
    def window(self):
        return self.sim.record.window
