"""Drive public callables with bad arguments and collect what escapes that is not a ``VkmlError``.

A reusable helper for the public-error tests (``test_public_errors.py``):

- :func:`public_callables` lists what a module (or a class) offers users, so a
  test can require that every public name has a valid *baseline* call;
- :data:`BAD_VALUES` is the battery of wrong arguments (``None``, strings,
  dicts, mixed nested lists, NaN/inf, negative, huge and float sizes, bools,
  ``2**63``, arrays of the wrong rank, empty and 0-d arrays, ...);
- :func:`leaks` calls a baseline with each argument in turn replaced by each
  bad value, realizes any tensor that comes back, and returns every call that
  raised something other than a ``VkmlError``.  A call may succeed: a bad value
  is only required to be refused cleanly *if* it is refused.

To cover another layer, give its callables baselines and pass them to :func:`leaks`.
"""

from __future__ import annotations

import inspect
import math
import resource
import contextlib

import numpy as np

import vkml


def public_callables(namespace, skip=()) -> dict:
    """``{name: object}`` for every public callable ``namespace`` offers (``__all__`` when it has
    one, else the names not starting with ``_``), minus ``skip``."""
    names = getattr(namespace, "__all__", None) or [n for n in dir(namespace) if not n.startswith("_")]
    out = {}
    for name in names:
        if name in skip:
            continue
        obj = getattr(namespace, name)
        if callable(obj) and not isinstance(obj, type(vkml)):
            out[name] = obj
    return out


class _Opaque:
    """An object vkml knows nothing about."""

    def __repr__(self):
        return "<opaque>"


def _deep_list(depth):
    """``[[[...[1.0]...]]]``: deeper than Python's recursion limit."""
    out = 1.0
    for _ in range(depth):
        out = [out]
    return out


def _bad_values():
    return [
        ("None", None), ("str", "x"), ("bytes", b"x"), ("dict", {"a": 1}), ("set", {1, 2}),
        ("object", _Opaque()), ("function", lambda: 0), ("complex", 1 + 2j),
        ("mixed list", [1, "a", [2.0]]), ("ragged list", [[1, 2], [3]]),
        ("nested None", [[None]]), ("str tuple", ("a", "b")), ("deep list", _deep_list(5000)),
        ("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf), ("np nan", np.float64("nan")),
        ("-1", -1), ("-7", -7), ("0", 0), ("2**31", 2 ** 31), ("-2**31-1", -2 ** 31 - 1),
        ("2**63", 2 ** 63), ("-2**63", -2 ** 63), ("2**100", 2 ** 100), ("np int64 max",
                                                                         np.int64(2 ** 63 - 1)),
        ("1.5", 1.5), ("-0.5", -0.5), ("2.0", 2.0), ("True", True), ("False", False),
        ("np bool", np.bool_(True)),
        ("3-d array", np.ones((2, 3, 4))), ("empty array", np.zeros((0,))),
        ("empty 2-d", np.zeros((0, 3))), ("0-d array", np.array(3.0)),
        ("int matrix", np.array([[1, 2], [3, 4]])), ("str array", np.array(["a", "b"])),
        ("object array", np.array([None, 1], dtype=object)), ("complex array", np.ones(2, complex)),
        ("huge shape", (2 ** 40, 2 ** 40)), ("negative shape", (-1, -2)), ("float shape", (1.5, 2)),
        ("bool shape", (True, False)), ("nan shape", (math.nan,)), ("empty tuple", ()),
        ("slice", slice(None)), ("ellipsis", Ellipsis), ("type", int),
        ("bool tensor", vkml.tensor(np.array([True, False]))),
        ("int tensor", vkml.tensor(np.array([[5, -9]], dtype=np.int64))),
        ("0-d tensor", vkml.tensor(np.float32(2.0))),
    ]


#: ``(label, value)`` pairs: every value is a wrong argument somewhere.
BAD_VALUES = _bad_values()


@contextlib.contextmanager
def memory_cap(nbytes=6 << 30):
    """Cap this process's address space while bad sizes are tried, so a shape that slips through
    to an allocation fails with MemoryError instead of taking the machine's memory."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = nbytes if hard == resource.RLIM_INFINITY else min(nbytes, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError):     # already lower (e.g. under a sanitizer): keep it
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _tensors(out) -> list:
    """Every tensor in ``out`` (a result of any shape)."""
    if isinstance(out, vkml.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def _realize(out):
    """Realize every tensor in ``out``; plain values are left alone."""
    for t in _tensors(out):
        t.numpy()


def _escaping(thunk):
    """The exception ``thunk()`` raises that is not a VkmlError, or None."""
    try:
        thunk()
    except vkml.VkmlError:
        return None
    except Exception as err:      # noqa: BLE001 -- catching every other kind is the point
        return err
    return None


def succeeds(fn, args, kwargs):
    """Call ``fn`` and realize what it returns; any exception propagates (a baseline's check)."""
    _realize(fn(*args, **kwargs))
    return True


def call_once(fn, args, kwargs):
    """``None`` when ``fn(*args, **kwargs)`` succeeds (its tensors realized) or raises a VkmlError,
    else the escaping exception."""
    return _escaping(lambda: _realize(fn(*args, **kwargs)))


def mutations(args, kwargs, values=None):
    """Every ``(where, label, replace)``: ``replace(args, kwargs)`` puts one bad value in one place."""
    values = BAD_VALUES if values is None else values
    for i in range(len(args)):
        for label, bad in values:
            yield f"arg {i}", label, lambda a, k, i=i, bad=bad: (a[:i] + (bad,) + a[i + 1:], k)
    for key in kwargs:
        for label, bad in values:
            yield f"{key}=", label, lambda a, k, key=key, bad=bad: (a, {**k, key: bad})


def leaks(name, fn, make_args, values=None, together=False):
    """Every call of ``fn`` with one bad argument that let a non-VkmlError escape, as readable lines.

    ``make_args()`` returns a fresh valid ``(args, kwargs)`` for each call, so a call
    that changes its arguments cannot affect the next.  ``together`` (for lazy mode):
    the tensors the calls return are realized at the end in ONE submission, so a
    compiling backend compiles one program instead of one per call; if that fails,
    each call's tensors are realized alone, so the culprit is named.
    """
    out, pending = [], []

    def report(what, err):
        out.append(f"{what}: {type(err).__name__}: {str(err)[:160]}")

    for where, label, replace in mutations(*make_args(), values):
        a, k = replace(*make_args())
        what = f"{name}({where} {label})"
        results = []
        err = _escaping(lambda: results.append(fn(*a, **k)))
        if err is not None:
            report(what, err)
        elif results and together:
            pending.append((what, _tensors(results[0])))
        elif results:
            err = _escaping(lambda: _realize(results[0]))
            if err is not None:
                report(what, err)
    everything = [t for _, ts in pending for t in ts]
    try:
        vkml.realize(everything)
    except Exception:             # noqa: BLE001 -- one of them failed: find which, and how
        for what, ts in pending:
            err = _escaping(lambda: vkml.realize(ts))
            if err is not None:
                report(what, err)
    return out


def signature_arity(fn) -> int:
    """How many positional parameters ``fn`` declares (a baseline must pass at least the required)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                   p.POSITIONAL_OR_KEYWORD)
               for p in params)
