"""The few operations the graph layer's node-by-node paths need on device planes (cuda).

A launch or a reverse that goes node by node (guards, loops, a hand-written vjp kernel) runs each
node's program on the device planes and keeps its results there (:func:`run_resident`); the
adjoints that meet at one plane version are added on the device (:func:`plus`, the same IEEE
additions as the host's, in the same order), and a Param's per-sample cotangents are summed with
the canonical tree on the device (:func:`tree_sum`: one value comes back).
"""

from __future__ import annotations

from .. import backends
from ..backends import ExecutionFailure
from ..ir import Var, program_from_dag
from ..ops import api
from ..threadsafe import Cache
from .execute import execution_error


def run_resident(batch, n, args, where):
    """One run of a batched program over ``n`` samples whose results stay on the device
    (device arrays); a failing equation is named after ``where`` (the node or kernel)."""
    exe, program = batch.executable(n)
    try:
        return backends.current().run(exe, args, resident=True)
    except ExecutionFailure as failure:
        raise execution_error(failure, program.eqns, where) from failure.error


def plus(a, b):
    """``a + b`` of two device arrays of one shape and dtype, computed on the device."""
    backend = backends.current()

    def make():
        x, y = Var(a.shape, a.dtype), Var(b.shape, b.dtype)
        program = program_from_dag([x, y], [api.add(x, y)])
        return backend.executable(("graph-device-plus", program), lambda: program)
    exe, _ = _PLUS.get_or_make((id(backend), tuple(a.shape), a.dtype), make)
    return backend.run(exe, [a, b], resident=True)[0]


#: the executables of :func:`plus`, by backend, shape and dtype (bounded, cleared with the
#: other caches)
_PLUS = Cache("device additions")


def zeros(shape, dtype):
    """A device array of zeros (set on the device)."""
    return backends.current().zeros_plane(tuple(shape), dtype)


def tree_sum(ct):
    """The canonical-tree sum of per-sample cotangents ``ct`` (a device array), on the device."""
    return backends.current().tree_sum(ct)
