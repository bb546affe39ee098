"""The errors vkml raises.

Every refusal is a subclass of :class:`VkmlError`, and also of the builtin
exception a Python user would expect (``ValueError`` for a wrong shape,
``TypeError`` for a wrong kind of argument, ...), so ``except ValueError``
keeps working.  Messages name the op, node or plane and say what to do
instead; a refused call changes nothing.
"""

import functools
import os


class VkmlError(Exception):
    """Base class of every error vkml raises on purpose.

    >>> try:
    ...     vkml.reshape(vkml.zeros(3), (2, 2))
    ... except vkml.VkmlError as err:
    ...     print(type(err).__name__, isinstance(err, ValueError))
    ...
    ShapeError True
    """


class ShapeError(VkmlError, ValueError):
    """Operands whose shapes do not fit the op.

    >>> vkml.add(vkml.zeros(2), vkml.zeros(3))
    Traceback (most recent call last):
        ...
    vkml.errors.ShapeError: add: shapes (2,) and (3,) cannot be broadcast together; make the dimensions match (or be 1), e.g. with reshape
    """


class IndexOutOfRangeError(ShapeError, IndexError):
    """An index past the end of an axis; an IndexError too, so ``for row in t`` stops there.

    >>> vkml.tensor([1.0, 2.0])[5]
    Traceback (most recent call last):
        ...
    vkml.errors.IndexOutOfRangeError: index: 5 is out of range for axis 0 of size 2; use an index in [-2, 2)
    """


class DTypeError(VkmlError, TypeError):
    """An operand of a dtype the op does not accept.

    >>> vkml.take(vkml.tensor([1.0, 2.0]), vkml.tensor([0.5]))
    Traceback (most recent call last):
        ...
    vkml.errors.DTypeError: take: indices must be integers, got float64
    """


class ArgumentError(VkmlError, TypeError):
    """An argument of the wrong kind (not an array, not a tensor, ...).

    >>> vkml.sum(vkml.zeros(2), keepdims="yes")
    Traceback (most recent call last):
        ...
    vkml.errors.ArgumentError: sum: keepdims must be True or False, got str 'yes'
    """


class GradError(VkmlError, RuntimeError):
    """A derivative that cannot be taken as asked (non-scalar root, integer input, ...).

    >>> vkml.backward(vkml.tensor([1.0, 2.0], requires_grad=True) * 2)
    Traceback (most recent call last):
        ...
    vkml.errors.GradError: backward: the root must be a 0-d tensor, got shape [2]; reduce it to a scalar first (e.g. loss.sum() or loss.mean())
    """


class ExecutionError(VkmlError, RuntimeError):
    """An op that failed while its program ran (e.g. a gather index out of range).

    >>> index = vkml.tensor([0, 1]) + 5
    >>> try:
    ...     vkml.take(vkml.tensor([1.0, 2.0]), index).numpy()
    ... except vkml.ExecutionError as err:
    ...     print(str(err).split(" failed: ")[1])
    ...
    index 6 is out of range for axis 0 of size 2; indices must lie in [0, 2)
    """


class TracingError(VkmlError, TypeError):
    """A traced value used where a concrete one is needed (Python ``if``, ``bool()``).

    >>> def f(x):
    ...     return x if x > 0 else -x
    ...
    >>> vkml.jit(f)(1.0)
    Traceback (most recent call last):
        ...
    vkml.errors.TracingError: bool() of a traced value (bool [] at CPU) at <doctest vkml.TracingError[0]>:2: inside vkml.jit, grad, vmap or scan a value has no data until the traced function returns; use vkml.where for a choice made per element, or vkml.cond / vkml.while_loop for control flow
    """


class BackendError(VkmlError, RuntimeError):
    """A backend that is unknown or cannot run here.

    >>> vkml.set_backend("tpu")
    Traceback (most recent call last):
        ...
    vkml.errors.BackendError: unknown backend 'tpu'; available: cpu, cuda, ...numpy
    """


class RecordError(VkmlError, RuntimeError):
    """A Record used against its rules: live when a new recording launch comes, stale, ...

    >>> @vkml.kernel
    ... def square(x):
    ...     return {"u": x * x}
    ...
    >>> g = vkml.Graph().add(square.bind(x=np.ones(2), u=np.zeros(2)), name="square").build(record=True)
    >>> g.launch()
    <vkml.Graph: square>
    >>> g.launch()
    Traceback (most recent call last):
        ...
    vkml.errors.RecordError: launch: the Record of generation 1 is still live; reverse it first, or keep a copy with record.keep()
    """


class RefusedError(VkmlError, RuntimeError):
    """A reverse that cannot be taken (an opaque node, a max reduction, second order, ...).

    >>> y, top = np.array([1.0, 3.0]), np.zeros(1)
    >>> g = vkml.Graph().add(vkml.graph.reduce(y, top, "max"), name="top").build(record=True)
    >>> g.launch()
    <vkml.Graph: top>
    >>> vkml.diff.reverse(g.record, {"top": np.ones(1)})
    Traceback (most recent call last):
        ...
    vkml.errors.RefusedError: reverse: node 'top' is a 'max' reduction; a tie has no single derivative -- use a 'sum' reduction, or take the node out of what you differentiate
    """


class BudgetError(VkmlError, ValueError):
    """A memory budget that cannot hold what a checkpointed reverse needs.

    >>> @vkml.kernel
    ... def drift(x, k: vkml.Param):
    ...     return {"x": x + 0.1 * k}
    ...
    >>> vkml.simulation(drift, max_steps=100, record=True, memory_budget=8, x=np.ones(300), k=1.0)
    Traceback (most recent call last):
        ...
    vkml.errors.BudgetError: simulation: one sample needs 184 bytes but memory_budget is 8 bytes; raise memory_budget, lower max_steps, or set window
    """


class Busy(VkmlError, RuntimeError):
    """A launch while a reverse reads the Record, or one Reverse used by two threads at once.

    >>> issubclass(vkml.Busy, RuntimeError), issubclass(vkml.Busy, vkml.VkmlError)
    (True, True)
    """


class VkmlWarning(UserWarning):
    """A result vkml returns but doubts, e.g. a ``while_loop`` cut off at ``max_iters`` while its
    condition still held.  Turn it into an error with ``warnings.simplefilter("error", VkmlWarning)``.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = vkml.while_loop(lambda x: x < 100.0, lambda x: x * 2.0, 1.0, max_iters=3)
    ...
    >>> [type(w.message).__name__ for w in caught]
    ['VkmlWarning']
    """


# -- tracebacks that start and end in the user's code --------------------------------------------

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def hide_vkml_frames(error: BaseException) -> None:
    """Take vkml's own frames out of ``error``'s traceback, keeping every frame of the user's
    code (the call into vkml, and a traced function's line that went wrong), as JAX does.

    Why: an error inside ``jit`` passes through 6-13 frames of tracing machinery between the
    user's call and the user's line that caused it; the message already names the op and the
    line, and the frames in between only bury it.  Called where an error leaves a public entry
    point (a jitted call, a graph's launch, a reverse, a model's forward, an optimiser step) for
    ``VkmlError``\\ s only: any other exception is a bug (of the user's or of vkml's) and keeps
    every frame.  ``VKML_TRACEBACK=full`` keeps them all (Python 3.10, whose re-raise keeps the
    old traceback, shows them all too).

    >>> def f(x):
    ...     return x.numpy()           # no value inside a trace: refused, at this line
    ...
    >>> try:
    ...     vkml.jit(f)(np.ones(2))
    ... except vkml.TracingError as err:
    ...     import traceback
    ...     [frame.name for frame in traceback.extract_tb(err.__traceback__)]
    ['<module>', 'f']
    """
    if not isinstance(error, VkmlError) or os.environ.get("VKML_TRACEBACK") == "full":
        return
    kept, frames, tb = [], 0, error.__traceback__
    while tb is not None:
        frames += 1
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
            kept.append(tb)
        tb = tb.tb_next
    if len(kept) == frames:
        return
    for a, b in zip(kept, kept[1:]):
        a.tb_next = b
    if kept:
        kept[-1].tb_next = None
    # (none kept: the traceback starts again at the user's call, added as the error leaves)
    error.__traceback__ = kept[0] if kept else None


def boundary(fn):
    """``fn`` as a public entry point: a :class:`VkmlError` leaving it loses vkml's own frames
    (:func:`hide_vkml_frames`).  For calls made a few times a step (a launch, a reverse, an
    optimiser step); the hot ones (a jitted call, a forward) do the same inline.

    >>> @vkml.errors.boundary
    ... def entry(x):
    ...     return vkml.reshape(x, (5,))     # refused deep inside vkml
    ...
    >>> try:
    ...     entry(vkml.zeros(3))
    ... except vkml.ShapeError as err:
    ...     import traceback
    ...     [frame.name for frame in traceback.extract_tb(err.__traceback__)]
    ['<module>', 'entry']
    """

    @functools.wraps(fn)
    def entry(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except VkmlError as error:
            hide_vkml_frames(error)
            raise
    return entry
