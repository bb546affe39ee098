"""Per-sample kernels and the launch nodes made by binding them to planes.

A kernel is a Python function written for ONE sample with vkml ops: its
positional parameters are per-sample inputs (a value, or a small vector, per
sample), parameters annotated ``vkml.Param`` are uniforms shared by every
sample, and it returns a dict of named outputs.  It is traced once per input
type into a per-sample Program and batched over samples with ``vmap``; its
vjp is derived (linearize + transpose) the first time a reverse needs it and
cached beside it.  The user writes no derivative.

``kernel.bind(x=x, k=1.5, y=y)`` binds each name to a *plane* (a NumPy array
with one row per sample) or, for a Param, to a value: the result is a
:class:`Launch`, a node a :class:`vkml.Graph` runs.
"""

from __future__ import annotations

import functools
import inspect

import numpy as np

from .. import backends
from ..errors import ArgumentError, DTypeError, ShapeError, VkmlError
from ..ir import Var, dtype_name, format_shape, program_from_dag
from ..ops import api
from ..stats import STATS
from ..tensor import Tensor
from ..threadsafe import Cache
from ..transforms import vjp_program, vmap_program
from ..transforms.ad import derived
from .execute import run_named


class Param:
    """Annotation of a kernel parameter that is a uniform shared by every sample::

        @vkml.kernel
        def wave(u, k: vkml.Param): return {"y": vkml.sin(k * u)}

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> g = vkml.Graph().add(wave.bind(x=x, k=2.0, y=y), name="wave").build(record=True)
    >>> g.launch()
    <vkml.Graph: wave>
    >>> vkml.diff.reverse(g.record, {"y": np.ones(3)})["k"].round(4)
    np.float64(-0.146)
    """


def _is_param(annotation) -> bool:
    if annotation is Param:
        return True
    return isinstance(annotation, str) and annotation.split(".")[-1] == "Param"


class Kernel:
    """A per-sample function, traced once per input type, batched over samples.

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> isinstance(wave, vkml.graph.Kernel), wave.name
    (True, 'wave')
    """

    def __init__(self, fn, *, vjp_of=None):
        if not callable(fn):
            raise ArgumentError(f"kernel: expected a function, got {type(fn).__name__}")
        self.fn = fn
        self.name = getattr(fn, "__name__", "kernel")
        sig = inspect.signature(fn)
        self.inputs, self.params = [], []
        for p in sig.parameters.values():
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise ArgumentError(f"kernel {self.name}: parameter {p.name!r} must be a plain "
                                    "positional parameter (no *args, **kwargs or keyword-only)")
            (self.params if _is_param(p.annotation) else self.inputs).append(p.name)
        #: the signature's order: a Param may come before an input (``f(x, k: Param, y)``)
        self.order = list(sig.parameters)
        #: the forward kernel this one is the vjp of (a vjp is never a forward step)
        self.vjp_of = vjp_of
        self._traces = {}
        functools.update_wrapper(self, fn)

    def __repr__(self):
        return f"<vkml.kernel {self.name}({', '.join(self.inputs + [p + ': Param' for p in self.params])})>"

    def __call__(self, *args, **kwargs):
        """Call the per-sample function directly (for testing a kernel on one sample)."""
        return self.fn(*args, **kwargs)

    # -- tracing ------------------------------------------------------------------------------
    def trace(self, in_types, param_types):
        """The per-sample Program for these input/param types, and its output names (cached).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> f64 = ((), np.dtype("float64"))
        >>> program, out_names = wave.trace([f64], [f64])
        >>> out_names
        ['y']
        """
        key = (tuple(in_types), tuple(param_types))
        hit = self._traces.get(key)
        if hit is not None:
            return hit
        ph = [Var(s, d) for s, d in in_types] + [Var(s, d) for s, d in param_types]
        STATS.traces += 1
        by_name = dict(zip(self.inputs + self.params, ph))    # placeholders: inputs, then Params
        out = self.fn(*[Tensor(by_name[name]) for name in self.order])
        if not isinstance(out, dict) or not out:
            raise ArgumentError(f"kernel {self.name} must return a dict of named outputs, e.g. "
                                "{'y': ...}; got " + type(out).__name__)
        names = list(out)
        outs = []
        for name in names:
            v = out[name]
            var = v.ir_var if isinstance(v, Tensor) else api.constant(v)
            if name == "terminated" and var.dtype.kind != "b":
                var = api.not_equal(var, 0)
            outs.append(var)
        prog = program_from_dag(ph, outs)
        hit = self._traces[key] = (prog, names)
        return hit

    def bind(self, **bindings) -> "Launch":
        """Bind every input and output to a plane and every Param to a value: a launch node.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> node = wave.bind(x=x, k=2.0, y=y)
        >>> node.n, sorted(node.reads), sorted(node.writes), sorted(node.params)
        (3, ['x'], ['y'], ['k'])
        """
        return Launch(self, bindings)


def kernel(fn=None, *, vjp_of=None):
    """Make a per-sample kernel (see the module docstring).  ``vjp_of=k`` marks a hand-written
    vjp of kernel ``k`` (used through ``Reverse(..., vjps=...)``; a forward graph refuses it).

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> wave.bind(x=x, k=2.0, y=y).launch()
    <launch of wave: reads ['x'], writes ['y']>
    >>> y.round(4)
    array([0.    , 0.8415, 0.9093])
    """
    if fn is None:
        return lambda f: Kernel(f, vjp_of=vjp_of)
    return Kernel(fn, vjp_of=vjp_of)


def _device_plane(value, name, kname):
    """A device array bound as a plane (a DeviceArray, or another library's array with
    ``__cuda_array_interface__``, taken without a copy) on a backend that keeps planes in device
    memory; anything else is refused."""
    backend = backends.current()
    if not hasattr(value, "__cuda_array_interface__"):
        raise ArgumentError(f"kernel {kname}: plane {name!r} must be a NumPy array with one row per "
                            f"sample (or, on the cuda backend, a device array), got "
                            f"{type(value).__name__}")
    if not backend.keeps_planes_on_device:
        raise ArgumentError(f"kernel {kname}: plane {name!r} is a device array, but the "
                            f"{backend.name} backend keeps planes in host memory; "
                            "vkml.set_backend('cuda') first, or bind a NumPy array")
    try:
        return backend.to_plane(value)
    except VkmlError as err:
        raise type(err)(f"kernel {kname}: plane {name!r}: {err}") from None


def _sample_type(plane, name, kname):
    return plane.shape[1:], plane.dtype


class Launch:
    """A kernel bound to planes and parameter values: one node of a Graph.

    Attributes: ``reads`` (input name -> plane), ``writes`` (output name ->
    plane), ``params`` (Param name -> value as a NumPy array), ``n`` (samples),
    ``program`` (per sample) and ``out_names``.

    >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
    >>> node = wave.bind(x=x, k=2.0, y=y)
    >>> node.n, node.out_names
    (3, ['y'])
    """

    kind = "launch"
    #: the hand-written vjp kernels batched for this launch (``batched_user_vjp``): made on first
    #: use, bounded and cleared like every vkml cache
    _user_vjps = None

    def __init__(self, kern: Kernel, bindings):
        self.kernel = kern
        kname = kern.name
        planes = {}
        for name in kern.inputs:
            if name not in bindings:
                raise ArgumentError(f"kernel {kname}: input {name!r} is not bound; bind it to a "
                                    f"plane: {kname}.bind({name}=array, ...)")
        for name in kern.params:
            if name not in bindings:
                raise ArgumentError(f"kernel {kname}: Param {name!r} is not bound; give it a value: "
                                    f"{kname}.bind({name}=0.5, ...)")
        self.params = {}
        for name in kern.params:
            v = bindings[name]
            try:
                arr = np.asarray(v.numpy() if isinstance(v, Tensor) else v)
            except (TypeError, ValueError):      # a ragged list: not an array at all
                arr = None
            if arr is None or arr.dtype.kind not in "biuf":
                raise ArgumentError(f"kernel {kname}: Param {name!r} must be a number or an array "
                                    f"of numbers, got {type(v).__name__}")
            if arr.dtype.kind == "f" and arr.dtype != np.float32:
                arr = arr.astype(np.float64)
            self.params[name] = arr
        for name, v in bindings.items():
            if name in kern.params:
                continue
            if not isinstance(v, np.ndarray):
                if name not in kern.inputs and not hasattr(v, "__cuda_array_interface__"):
                    raise ArgumentError(
                        f"kernel {kname}: {name!r} is bound to a {type(v).__name__}, but it is not "
                        f"an input or a Param (inputs {kern.inputs}, Params {kern.params}); an "
                        "output is bound to a plane with one row per sample (a NumPy array)")
                v = _device_plane(v, name, kname)
            if v.ndim == 0:
                raise ShapeError(f"kernel {kname}: plane {name!r} is 0-d; a plane has one row per "
                                 "sample (shape (n,) or (n, d))")
            if v.dtype.kind not in "biuf":
                raise DTypeError(f"kernel {kname}: plane {name!r} holds {v.dtype} values; a plane "
                                 "holds numbers (bool, int, uint or float)")
            planes[name] = v
        ns = {v.shape[0] for v in planes.values()}
        if len(ns) > 1:
            raise ShapeError(f"kernel {kname}: planes have different numbers of rows "
                             + ", ".join(f"{k}: {v.shape[0]}" for k, v in planes.items())
                             + "; every plane holds one row per sample")
        in_types = [_sample_type(planes[n], n, kname) for n in kern.inputs]
        param_types = [(a.shape, a.dtype) for a in (self.params[p] for p in kern.params)]
        self.program, self.out_names = kern.trace(in_types, param_types)
        n_samples = next(iter(ns)) if ns else 1
        for name, var in zip(self.out_names, self.program.outputs):
            if name == "terminated" and var.shape != ():
                shapes = {p: format_shape(a.shape) for p, a in self.params.items() if a.shape}
                hint = (f"; Params {shapes} are arrays shared by every sample, not per-sample "
                        "values (a per-sample value is a plane)") if shapes else ""
                raise ShapeError(f"kernel {kname}: output 'terminated' is one bool per sample, got "
                                 f"{format_shape(var.shape)} per sample{hint}; reduce it "
                                 "(vkml.any(...)) or bind per-sample values as planes")
            if name == "terminated" and name not in bindings:
                # a simulation kernel's stop flag: a plane of the launch's own unless bound
                planes[name] = np.zeros((n_samples,) + var.shape, var.dtype)
                bindings = dict(bindings, terminated=planes[name])
            if name not in bindings:
                raise ArgumentError(f"kernel {kname}: output {name!r} is not bound; bind it to a "
                                    f"plane of {dtype_name(var.dtype)} {format_shape(var.shape)} per "
                                    f"sample: {kname}.bind({name}=np.zeros(n...))")
            plane = planes[name]
            if plane.shape[1:] != var.shape or plane.dtype != var.dtype:
                raise ShapeError(f"kernel {kname}: output {name!r} is {dtype_name(var.dtype)} "
                                 f"{format_shape(var.shape)} per sample, but its plane is "
                                 f"{dtype_name(plane.dtype)} {format_shape(plane.shape[1:])} per "
                                 "sample; bind a plane of the output's type")
            if not plane.flags.writeable:
                raise ArgumentError(f"kernel {kname}: output plane {name!r} is read-only")
        extra = set(bindings) - set(kern.inputs) - set(kern.params) - set(self.out_names)
        if extra:
            raise ArgumentError(f"kernel {kname}: {sorted(extra)} are neither inputs, Params nor "
                                f"outputs of the kernel (inputs {kern.inputs}, Params {kern.params}, "
                                f"outputs {self.out_names})")
        self.reads = {n: planes[n] for n in kern.inputs}
        self.writes = {n: planes[n] for n in self.out_names}
        self.n = n_samples

    def __repr__(self):
        return f"<launch of {self.kernel.name}: reads {list(self.reads)}, writes {list(self.writes)}>"

    def launch(self) -> "Launch":
        """Run this launch once on its planes, outside any graph.

        Also a way to write a conditional's member:
        ``vkml.skippable(k.bind(...).launch, guard)`` passes this bound method,
        and the conditional takes the Launch it belongs to.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> wave.bind(x=x, k=1.0, y=y).launch()
        <launch of wave: reads ['x'], writes ['y']>
        >>> y.round(4)
        array([0.    , 0.4794, 0.8415])
        """
        kern = self.kernel
        self._check_planes()
        args = [self.reads[n] for n in kern.inputs] + [self.params[p] for p in kern.params]
        flags = [True] * len(kern.inputs) + [False] * len(kern.params)
        outs = run_named(self.batched(), self.n, args, flags, f"kernel {kern.name}")
        for name, value in zip(self.out_names, outs):       # every output computed: now written
            self.writes[name][...] = value
        return self

    def _check_planes(self):
        """The planes still have the rows and per-sample types the kernel was traced for, and
        the outputs' planes may still be written."""
        types = dict(zip(self.kernel.inputs, self.program.inputs))
        types.update(zip(self.out_names, self.program.outputs))
        for which in (self.reads, self.writes):
            for name, plane in which.items():
                var = types[name]
                if plane.shape != (self.n,) + var.shape or plane.dtype != var.dtype:
                    raise ShapeError(f"kernel {self.kernel.name}: plane {name!r} is now "
                                     f"{plane.dtype} {plane.shape}, but was bound as {var.dtype} "
                                     f"{(self.n,) + var.shape}; bind it again after "
                                     f"replacing/resizing plane {name!r}")
        frozen = [name for name, plane in self.writes.items() if not plane.flags.writeable]
        if frozen:
            raise ArgumentError(f"kernel {self.kernel.name}: output plane {frozen[0]!r} is read-only")

    # -- batched programs, derived once per kernel type ------------------------------------------
    def batched(self):
        """The kernel over all samples: inputs batched, params shared.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> prog = wave.bind(x=x, k=2.0, y=y).batched().program(3)
        >>> [v.shape for v in prog.inputs], [v.shape for v in prog.outputs]
        ([(3,), ()], [(3,)])
        """
        flags = [True] * len(self.kernel.inputs) + [False] * len(self.kernel.params)
        prog = self.program
        return derived("vmap", prog, flags + ["samples"], lambda: _vmap_any(prog, flags))

    def batched_vjp(self):
        """Per-sample vjp over all samples: (inputs, params, output cotangents) ->
        (input cotangents, per-sample param cotangents) for the floating ones.

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> batch, wrt = wave.bind(x=x, k=2.0, y=y).batched_vjp()
        >>> prog = batch.program(3)
        >>> wrt, [v.shape for v in prog.inputs], [v.shape for v in prog.outputs]
        ([0, 1], [(3,), (), (3,)], [(3,), (3,)])
        """
        prog = self.program
        wrt = [i for i, v in enumerate(prog.inputs) if v.dtype.kind == "f"]
        outs_f = [i for i, v in enumerate(prog.outputs) if v.dtype.kind == "f"]

        def make():
            vp = vjp_program(prog, wrt)                       # inputs + cts(all outs) -> outs + grads
            n_out = len(prog.outputs)
            grads = vp.outputs[n_out:]
            only = program_from_dag(list(vp.inputs), list(grads))
            flags = [True] * len(self.kernel.inputs) + [False] * len(self.kernel.params) + \
                [True] * n_out
            return _vmap_any(only, flags)

        return derived("graph-vjp", prog, [tuple(wrt), tuple(outs_f)], make), wrt

    def batched_user_vjp(self, vjp_kernel):
        """A hand-written vjp kernel (``vkml.kernel(vjp_of=...)``) over all samples.

        Its parameters are named after this launch's: the inputs and Params it
        reads, and ``<output>_bar`` for an output's cotangent; it returns
        ``<input>_bar`` / ``<Param>_bar`` per sample.  Returns the batch, the
        names of its per-sample arguments and of its Params, and its output
        names (traced and batched once per launch).

        >>> x, y = np.array([0.0, 0.5, 1.0]), np.zeros(3)
        >>> @vkml.kernel(vjp_of=wave)
        ... def wave_vjp(x, k: vkml.Param, y_bar):
        ...     return {"x_bar": y_bar * k * vkml.cos(k * x), "k_bar": y_bar * x * vkml.cos(k * x)}
        ...
        >>> batch, args, params, outs = wave.bind(x=x, k=2.0, y=y).batched_user_vjp(wave_vjp)
        >>> args, params, outs
        (['x', 'y_bar'], ['k'], ['x_bar', 'k_bar'])
        """
        if self._user_vjps is None:
            self._user_vjps = Cache("vjp kernel batches")
        hit = self._user_vjps.get(id(vjp_kernel))
        if hit is not None and hit[0] is vjp_kernel:       # (not another kernel at a reused id)
            return hit[1]
        var_out = dict(zip(self.out_names, self.program.outputs))
        in_types = []
        for name in vjp_kernel.inputs:
            if name in self.reads:
                in_types.append((self.reads[name].shape[1:], self.reads[name].dtype))
            elif name.endswith("_bar") and name[:-4] in var_out:
                v = var_out[name[:-4]]
                in_types.append((v.shape, v.dtype))
            else:
                raise ArgumentError(f"vjp kernel {vjp_kernel.name}: argument {name!r} is neither an input "
                                    f"of {self.kernel.name} ({self.kernel.inputs}) nor an output "
                                    f"cotangent ({[o + '_bar' for o in self.out_names]})")
        for name in vjp_kernel.params:
            if name not in self.params:
                raise ArgumentError(f"vjp kernel {vjp_kernel.name}: Param {name!r} is not a Param of "
                                    f"{self.kernel.name} ({self.kernel.params})")
        param_types = [(self.params[p].shape, self.params[p].dtype) for p in vjp_kernel.params]
        prog, names = vjp_kernel.trace(in_types, param_types)
        flags = [True] * len(vjp_kernel.inputs) + [False] * len(vjp_kernel.params)
        hit = (_vmap_any(prog, flags), list(vjp_kernel.inputs), list(vjp_kernel.params), names)
        self._user_vjps.put(id(vjp_kernel), (vjp_kernel, hit))
        return hit


def _vmap_any(prog, flags):
    """vmap over a symbolic number of samples: traced for size 1 and re-derived per size lazily."""
    return _SizedBatch(prog, flags)


class _SizedBatch:
    """A per-sample program batched for whatever number of samples a launch has (cached per
    size and backend: a backend switch must not run another backend's executables)."""

    def __init__(self, prog, flags):
        self.prog, self.flags = prog, flags
        self._by_size = Cache("kernel batches")       # one per sample count: bounded

    def program(self, n):
        """The batched Program for ``n`` samples (derived once)."""
        return derived("vmap", self.prog, list(self.flags) + [n],
                       lambda: vmap_program(self.prog, self.flags, n))

    def executable(self, n):
        backend = backends.current()
        # (with the backend's choice of code for a graph's programs: the cpu tier's vector math,
        # read when a graph's programs are made, so a graph built after VKML_VECTOR_MATH=0 was
        # set gets programs of scalar libm even for a kernel an earlier graph batched)
        variant = getattr(backend, "graph_variant", None)
        key = (id(backend), n, variant() if variant is not None else None)
        hit = self._by_size.get(key)
        if hit is None:
            bp = self.program(n)
            hit = self._by_size.put_first(key, (backend.executable(("graph", bp), lambda: bp), bp))
        return hit

    def run(self, n, args, into=None):
        """One run over ``n`` samples; ``into``: destinations for the results (see
        ``Backend.run``), e.g. buffers a Reverse reuses from call to call."""
        exe, bp = self.executable(n)
        return backends.current().run(exe, args, into=into)
