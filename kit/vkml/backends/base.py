"""What a backend is and which one is current.

A backend compiles Programs into executables and runs them.  One ``run`` is
one *submission*: the unit of cost that laziness exists to save (40-105 us
of host time per submission on a GPU, as measured when vkml was designed), so it is counted
in ``vkml.stats()``, and so are compiles and executable-cache hits.
"""

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np

from ..errors import ArgumentError, BackendError, ExecutionError, ShapeError
from ..ir import dtype_name, format_shape
from ..ops import operands
from ..stats import STATS, Stats, reset_stats, stats  # noqa: F401  (re-exported)
from ..threadsafe import Cache, Setting


class ExecutionFailure(ExecutionError):
    """Raised by an executable: equation ``index`` of its program raised ``error``.

    The caller that holds the program names the equation (``runtime.submit``); one that does not
    still gets a clean :class:`ExecutionError`."""

    def __init__(self, index, error):
        super().__init__(f"equation {index} of the program failed: {error}")
        self.index = index
        self.error = error


def threads() -> int:
    """Threads a computation may split its work over (``VKML_THREADS``, default 1): a graph's
    samples, a simulation's per-sample loops (the cpu tier's big matrix products use every core
    unless it is set: ``product_threads``).  Work is split so that every result is computed by
    one thread in one order: the bits never depend on it."""
    text = os.environ.get("VKML_THREADS") or "1"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ArgumentError(f"VKML_THREADS must be a positive whole number of threads, got {text!r}; "
                            "set it to e.g. 1 or 4 (or unset it)")
    return value


def cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the system has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def product_threads() -> int:
    """Threads the cpu tier's big matrix products split their rows over, and its programs' big
    loop nests their elements: ``VKML_THREADS`` when it is set, else every core (as NumPy's
    BLAS, PyTorch and JAX do).  Each output is still one thread's sum in index order (a
    reduction's, its fixed tree), so the bits are the one-thread bits.  (A graph's samples and a
    simulation's loops stay on one thread unless ``VKML_THREADS`` says otherwise: one thread
    runs a graph's launch and reverse as single fused programs, which more threads would split
    node by node.)"""
    return threads() if os.environ.get("VKML_THREADS") else cores()


def failure_error(name, info):
    """The exception a compiled primitive ``name`` reported, with its ``info`` words (the bad
    value, the axis, its size): what the NumPy backend raises for the same input."""
    bad, axis, size = (int(v) for v in info[:3])
    if name == "pow":
        return ValueError(f"Integers to negative integer powers are not allowed (exponent {bad})")
    return IndexError(f"index {bad} is out of range for axis {axis} of size {size}; "
                      f"indices must lie in [0, {size})")


#: the most elements, and bytes, a value may have: what a signed 64-bit integer counts
INT64_MAX = (1 << 63) - 1


def check_sizes(program, seen=None):
    """``program``, once refused (ShapeError) if it holds a value whose element count or byte
    size does not fit in an int64 -- before anything is compiled or allocated: generated code
    indexes with int64 and no allocation of it could succeed (NumPy would raise a bare
    ValueError)."""
    seen = set() if seen is None else seen
    if id(program) in seen:
        return program
    seen.add(id(program))
    for v in program.inputs:
        _check_size(v, "an input")
    for e in program.eqns:
        for v in e.outputs:
            _check_size(v, e.prim.name)
        for p in e.params.values():
            if hasattr(p, "eqns"):
                check_sizes(p, seen)
    return program


def _check_size(v, what):
    n = 1
    for d in v.shape:
        n *= d
    if n * v.dtype.itemsize > INT64_MAX:
        raise ShapeError(f"{what}: a {dtype_name(v.dtype)} value of shape {format_shape(v.shape)} "
                         f"has {n} elements ({n * v.dtype.itemsize} bytes), more than a 64-bit "
                         "size can count; use smaller shapes")


class DeviceValue:
    """A value a device backend keeps in its own memory between submissions (``cuda.DeviceArray``).

    Tensors realized on the GPU hold these, so a training loop's parameters
    never travel through the host; ``np.asarray(value)`` brings one to the
    host, and every other backend receives it that way (:func:`host_values`).
    """

    __slots__ = ()


def host_values(args) -> list:
    """``args`` with every :class:`DeviceValue` brought to the host (NumPy arrays pass as they are)."""
    return [np.asarray(a) if isinstance(a, DeviceValue) else a for a in args]


#: destinations smaller than this are copied into (cheaper than checking them for overlaps)
DIRECT_MIN_BYTES = 1 << 16


def _writable_into(dest, args, into) -> bool:
    """Whether an executable may compute straight into ``dest``: a large C-contiguous array that
    overlaps neither an argument (read while the results are written) nor another destination."""
    if dest is None or not isinstance(dest, np.ndarray) or dest.nbytes < DIRECT_MIN_BYTES or \
            not dest.flags.c_contiguous or not dest.flags.writeable:
        return False
    others = [a for a in args if isinstance(a, np.ndarray)] + \
        [d for d in into if isinstance(d, np.ndarray) and d is not dest]
    return not any(np.may_share_memory(dest, a) for a in others)


def copy_into(outs, into):
    """The results with each destination holding its value (copied where not written directly).

    Shared by every backend's ``run``: the NumPy and compiled tiers here, the cuda backend's own.
    """
    outs = list(outs)
    for i, dest in enumerate(into):
        if dest is not None and outs[i] is not dest:
            dest[...] = outs[i]
            outs[i] = dest
    return outs


class Backend:
    """Compile Programs once per structure and run them, counting submissions.

    Subclasses implement ``_compile(program) -> callable(list_of_arrays) -> list_of_arrays``
    and set ``name`` and ``device`` (the placement printed in programs).
    """

    name = "?"
    device = "?"

    def __init__(self):
        # bounded (vkml.set_cache_limit) and shared by threads: each key is compiled once
        self._executables = Cache(f"{self.name} executables")

    def executable(self, key, make_program):
        """The executable for structural ``key``; ``make_program()`` builds the Program on a miss."""
        def make():
            exe = self._compile(check_sizes(make_program()))
            STATS.compiles += 1
            return exe
        return self._cached(key, make)

    def _cached(self, key, make, from_disk=lambda made: False):
        """What ``make()`` made for ``key``, made once.  Every later lookup is a cache hit in
        ``vkml.stats()``; so is a miss that ran no compiler when ``from_disk(made)`` says its code
        came from a compiled tier's disk cache.  Threads asking for one key at the same time
        wait for the first to make it: a key is never compiled twice."""
        compiled = []

        def counted():
            before = STATS.compiles
            made = make()
            compiled.append(STATS.compiles != before)
            return made

        made, fresh = self._executables.get_or_make(key, counted)
        if not fresh or not compiled[0] and from_disk(made):
            STATS.cache_hits += 1
        return made

    def run(self, exe, args, resident=False, into=None):
        """One submission.

        ``resident``: the caller keeps the results as tensor values, so a
        device backend may hand back values that stay in its memory
        (:class:`DeviceValue`); without it every result is a NumPy array.
        This backend computes on the host: values another backend left on
        its device are brought over first.

        ``into``: one destination array (or None) per result; on return
        result ``i`` IS ``into[i]``, holding the value.  An executable that
        can (``writes_into``) computes straight into a destination that
        overlaps no argument, saving a copy of every written plane per
        graph launch; otherwise the value is copied in.
        """
        STATS.submissions += 1
        if any(isinstance(a, DeviceValue) for a in args):
            args = host_values(args)
        if into is None:
            return exe(args)
        direct = None
        if getattr(exe, "writes_into", False):
            direct = [d if _writable_into(d, args, into) else None for d in into]
            if not any(d is not None for d in direct):
                direct = None
        outs = exe(args) if direct is None else exe(args, into=direct)
        return copy_into(outs, into)

    # -- planes: the graph layer's per-sample arrays, where this backend keeps them ---------------
    #: Whether the graph layer's planes, Records and gradients live in this backend's device
    #: memory (the cuda backend) rather than in host NumPy arrays (numpy and cpu).
    keeps_planes_on_device = False

    def to_plane(self, value):
        """The plane this backend keeps for a user's array ``value``.  Host backends: the array
        itself (``np.asarray``: no copy for a NumPy array, so the user's array IS the plane).
        A device backend copies a NumPy array to its memory once and takes a device array as
        it is (no copy)."""
        return np.asarray(value)

    def copy_plane(self, plane):
        """A new plane holding ``plane``'s values (a Record's copy of a version about to be
        overwritten, a refused call's backup): on a device backend, a copy on the device."""
        return plane.copy()

    def copy_plane_into(self, dst, src):
        """Write ``src``'s values into plane ``dst`` (same shape and dtype), in place."""
        dst[...] = src

    def empty_plane(self, shape, dtype):
        """A new plane of ``shape`` and ``dtype`` whose values are whatever the memory held."""
        return np.empty(shape, dtype)

    def zeros_plane(self, shape, dtype):
        """A new plane of ``shape`` and ``dtype`` holding zeros."""
        return np.zeros(shape, dtype)

    def layout(self, values) -> tuple:
        """What of the arguments' memory layout a compiled executable depends on.

        Part of a program's *variant*: a backend whose code is specialised to
        strides returns them here, so a new layout compiles a new variant.
        """
        return ()

    def clear_cache(self):
        self._executables.clear()

    @property
    def cache_size(self) -> int:
        return len(self._executables)

    def _compile(self, program):
        """Every backend says how it compiles a Program (the abstract hook of this class)."""
        raise NotImplementedError

    def info(self) -> dict:
        return {"backend": self.name, "device": self.device, "cached executables": self.cache_size}


_FACTORIES = {}
#: the backend of this thread or task, falling back to the process default (None: not chosen yet,
#: ``default_backend()`` on first use); ``vkml.runtime`` documents who sees which
_CURRENT = Setting("backend", None)
#: (name, why) in order of preference for the process default: ``why()`` says why the backend
#: is the default here, or None where it cannot be (registered by the backends themselves)
_PREFERRED = []
#: how the process default was chosen (``backend_info()["default"]``)
_CHOSEN = [None]


def register(name, factory, preferred_because=None):
    """Make backend ``name`` available (``factory()`` makes it on first use); with
    ``preferred_because``, it is the process default where that says why (before the ones
    registered earlier, after ``VKML_BACKEND``)."""
    _FACTORIES[name] = factory
    if preferred_because is not None:
        _PREFERRED.insert(0, (name, preferred_because))


def default_backend() -> tuple:
    """``(name, why)``: the backend work runs on until one is set -- ``VKML_BACKEND`` when it
    is set, else the first preferred backend that can run here (the compiled cpu tier where a C
    compiler is found), else NumPy."""
    name = os.environ.get("VKML_BACKEND")
    if name:
        return name, f"VKML_BACKEND={name}"
    for name, why in _PREFERRED:
        reason = why()
        if reason:
            return name, reason
    return "numpy", "no compiled tier can run here (a C compiler, gcc or clang, makes the cpu tier the default)"


def current() -> Backend:
    """The backend work of this thread or asyncio task runs on."""
    backend = _CURRENT.get()
    if backend is None:
        name, why = default_backend()
        backend = set_backend(name)
        _CHOSEN[0] = f"{name}: {why}"
    return backend


_INSTANCES = {}
_INSTANCES_LOCK = threading.Lock()


def set_backend(name: str) -> Backend:
    """Select the backend new work runs on, for the whole process: ``"numpy"`` (default, always
    present), ``"cpu"`` or ``"cuda"``.  It becomes this thread's (or task's) backend and the one
    every thread and task follows that has not chosen its own with :func:`use_backend`.

    >>> vkml.set_backend("numpy").name
    'numpy'
    """
    backend = _backend_named(name, "set_backend")
    _CHOSEN[0] = None
    _CURRENT.set_global(backend)
    operands.DEFAULT_DEVICE.set_global(backend.device)
    return backend


def use_backend(name: str):
    """``with use_backend("cpu"):`` -- this thread or asyncio task runs on ``name`` for the block;
    other threads and tasks, and the process default, are untouched.  A bad name is refused at
    the call, before the block.

    >>> with vkml.use_backend("numpy"):
    ...     print(vkml.backend_info()["backend"])
    ...
    numpy
    """
    return _using(_backend_named(name, "use_backend"))


@contextlib.contextmanager
def _using(backend):
    with _CURRENT.local(backend), operands.DEFAULT_DEVICE.local(backend.device):
        yield backend


def _backend_named(name, where) -> Backend:
    """The one instance of backend ``name``, made on first use (one per process, for every thread)."""
    if not isinstance(name, str):
        raise BackendError(f"{where}: the backend is named by a string, got "
                           f"{type(name).__name__}; available: {', '.join(sorted(_FACTORIES))}")
    if name not in _FACTORIES:
        raise BackendError(f"unknown backend {name!r}; available: {', '.join(sorted(_FACTORIES))}")
    with _INSTANCES_LOCK:
        if name not in _INSTANCES:
            _INSTANCES[name] = _FACTORIES[name]()
        return _INSTANCES[name]


def started(name: str) -> bool:
    """Whether backend ``name`` has been made in this process (one that started can run)."""
    with _INSTANCES_LOCK:
        return name in _INSTANCES


def instances() -> list:
    """The backends made so far (each is made on first use, once per process)."""
    with _INSTANCES_LOCK:
        return list(_INSTANCES.values())


def backend_info() -> dict:
    """What the current backend is, why (``"default"``: how the process default was chosen, or
    that it was set), and which backends this machine has."""
    info = current().info()
    info["default"] = _CHOSEN[0] or "set by set_backend"
    info["available"] = sorted(_FACTORIES)
    return info
