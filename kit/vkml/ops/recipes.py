"""Recipes: the equations an operation binds for operands of given types, recorded once, replayed.

A Tensor operation (``h + b``, ``relu(h)``, ``log_softmax(z)``) runs the Python of its ``api``
function on every call: argument checks, NumPy's promotion and broadcasting, the shape rule of
every primitive it binds.  For operands of the same types and the same other arguments all that
work ends in the same equations.  Measured on the 784-256-10 MLP of ``bench/mlp_step.py``:
building its 33-equation forward graph took ~220 us a step, most of it deciding again what the
step before had decided.  So a call whose key comes back records the equations it bound (a
:class:`Recipe`), and every later call with that key only makes the new Eqns and Vars: ~60 us for
that graph.  A key is recorded the second time it is seen, not the first: a call made once (a
constant that changes every call, a function traced once) keeps nothing.

The key holds everything the equations can depend on:

- the function;
- per Var operand: shape, dtype, device, weak flag, and which earlier operand it is, if any
  (``x * x`` and ``x * y`` bind different equations);
- every other argument by type and value (``-0.0`` differs from ``0.0``, ``1`` from ``True``);
- the settings an operation reads while it binds: the device of new constants and the matmul mode.

The caller says which functions may be replayed: only those whose equations depend on nothing
but the key (``take`` looks at the values of a known index, so it is not one).  An argument the
key cannot describe (an array, a list holding tensors) just runs the function, as does a call
whose result reaches Vars it was not given.

Each thread also keeps a tape of the replays it made since its last backward or realize
(:func:`tape_graph`): a backward whose graph is made of them alone finds it from the tape, one
lookup per op, instead of walking every equation.
"""

from __future__ import annotations

import threading
from operator import itemgetter

import numpy as np

from ..ir import Eqn, Var, collect, current_serial
from ..threadsafe import cache_limit
from .api import default_device
from .core import CURRENT_SCOPE, current_site
from .linalg import DETERMINISTIC_MATMUL

__all__ = ["Recipe", "call", "record", "replay", "clear", "info", "tape_graph", "reset_tape"]


class Recipe:
    """The equations one call bound, with its operands and new constants as numbered slots.

    ``consts``: ``(shape, dtype, device, weak, value)`` of each constant the call made (its
    read-only array is shared by every replay); ``steps``: ``(primitive, input slots, params,
    output types)`` in binding order; ``out``: the slot of the result.  Slots number the operands
    first, then the constants, then every equation's outputs in order.  ``plan``: the steps as
    :func:`_replay` runs them, each equation's inputs taken by one call (:func:`_picker`), and
    a single output's type spelled out.
    """

    __slots__ = ("consts", "steps", "out", "plan")

    def __init__(self, consts, steps, out):
        self.consts, self.steps, self.out = consts, steps, out
        self.plan = tuple([_planned(*step) for step in steps])

    def __repr__(self):
        return f"<Recipe of {len(self.steps)} equations>"


#: (function, key of its arguments, settings) -> Recipe, at most cache_limit() of them
_RECIPES: dict = {}
#: hashes of keys whose call ran once (see _seen_before)
_SEEN: set = set()
#: calls answered from a recipe, and recipes recorded (what tests and benches count)
_COUNTS = {"replayed": 0, "recorded": 0}


def call(fn, args, kwargs, at_user_line):
    """``fn(*args, **kwargs)`` on Vars, from its recipe when one matches, else run (inside the
    block ``at_user_line()``, which names the user's line for its binds) and, the second time
    its key is seen, recorded.

    A replayed equation names the user's current line, as a bound one does."""
    key, operands = _key(fn, args, kwargs)
    if key is not None:
        recipe = _RECIPES.get(key)
        if recipe is not None:
            _COUNTS["replayed"] += 1
            vals = _replay(recipe, operands, current_site())
            out = vals[recipe.out]
            tape = _TAPE.records
            n, m = len(operands), len(recipe.consts)
            if len(tape) < TAPE_LIMIT and recipe.out >= n + m:   # (a result made here)
                tape.append((recipe, operands, vals[n:n + m], out))
            return out
    start = current_serial()
    with at_user_line():
        out = fn(*args, **kwargs)
    if key is not None and type(out) is Var and _seen_before(key):
        recipe = record(operands, out, start)
        if recipe is not None:
            _RECIPES[key] = recipe
            _trim()
            _COUNTS["recorded"] += 1
    return out


def _seen_before(key) -> bool:
    """Whether a call with ``key`` was made before (by the key's hash: a collision only records
    a recipe one call early).  A call is recorded the second time, so one made once -- a
    constant that changes every call, a function traced once -- keeps nothing."""
    h = hash(key)
    if h in _SEEN:
        return True
    if len(_SEEN) >= cache_limit():
        _SEEN.clear()
    _SEEN.add(h)
    return False


def _trim():
    """Drop the oldest recipes past ``cache_limit()`` (a full cache stays full, so its memory is
    flat); another thread trimming at the same time may leave one more for later."""
    while len(_RECIPES) > cache_limit():
        try:
            _RECIPES.pop(next(iter(_RECIPES)), None)
        except (RuntimeError, StopIteration):       # changed by another thread meanwhile
            return


def record(operands, out, start):
    """The recipe that made ``out`` from ``operands`` with Vars numbered ``start`` or later, or
    None when ``out`` depends on another Var made before (a recipe could not remake it)."""
    slots = {}
    for i, v in enumerate(operands):
        slots.setdefault(v, i)
    leaves, eqns = collect([out], is_leaf=lambda v: v in slots or v.serial < start)
    consts, n = [], len(operands)
    for v in leaves:
        if v in slots:
            continue
        value = v.value
        if v.serial < start or v.eqn is not None or type(value) is not np.ndarray or \
                value.flags.writeable:
            return None
        slots[v], n = n, n + 1
        consts.append((v.shape, v.dtype, v.device, v.weak, value))
    steps = []
    for e in eqns:
        for o in e.outputs:
            if o.weak or o.value is not None:
                return None
            slots[o], n = n, n + 1
        steps.append((e.prim, tuple([slots[v] for v in e.inputs]), e.params,
                      tuple([(o.shape, o.dtype, o.device) for o in e.outputs])))
    return Recipe(tuple(consts), tuple(steps), slots[out])


def replay(recipe, operands, site):
    """The result of ``recipe`` for new ``operands``: new Eqns and Vars, made at ``site``."""
    return _replay(recipe, operands, site)[recipe.out]


def _replay(recipe, operands, site):
    """Every Var of ``recipe`` replayed on ``operands``, by slot (operands, constants, outputs)."""
    vals = list(operands)
    for shape, dtype, device, weak, value in recipe.consts:
        vals.append(Var(shape, dtype, device, value=value, weak=weak))
    append = vals.append
    scope = CURRENT_SCOPE.get()
    for prim, pick, params, outs, shape, dtype, device in recipe.plan:
        eqn = Eqn(prim, pick(vals), None, params, site, scope)
        if shape is not None:           # one result (its shape; None for several)
            made = Var(shape, dtype, device, eqn)
            eqn.outputs = (made,)
            append(made)
        else:
            made = tuple([Var(shape, dtype, device, eqn) for shape, dtype, device in outs])
            eqn.outputs = made
            vals += made
    return vals


def _planned(prim, inputs, params, outs):
    """A step as :func:`_replay` runs it: its inputs' picker, and its one output's type spelled
    out (shape None when it has several)."""
    shape, dtype, device = outs[0] if len(outs) == 1 else (None, None, None)
    return prim, _picker(inputs), params, outs, shape, dtype, device


def _picker(slots):
    """A function of the slot list that gives the Vars in ``slots`` as a tuple: a replay takes
    each equation's inputs with one call (a comprehension per equation cost a replay of the
    bench MLP's forward several microseconds)."""
    if len(slots) >= 2:
        return itemgetter(*slots)
    if len(slots) == 1:
        slot = slots[0]
        return lambda vals: (vals[slot],)
    return lambda vals: ()


def clear() -> None:
    """Forget every recipe (``vkml.clear_caches`` calls this)."""
    _RECIPES.clear()
    _SEEN.clear()
    reset_tape()


# -- the tape: which replays a graph is made of -----------------------------------------------------

class _Tape(threading.local):
    """This thread's replays since its last backward or realize: ``(recipe, operands, constants,
    result)`` each, in the order they were made."""

    def __init__(self):
        self.records = []


_TAPE = _Tape()
#: replays a tape keeps at most (a loop that builds graphs and never observes them stops adding)
TAPE_LIMIT = 256


def reset_tape() -> None:
    """Forget this thread's replays (a backward or a realize consumed the graphs they made)."""
    _TAPE.records = []


def tape_graph(root):
    """``(key, leaves)`` of the graph behind Var ``root`` when it is made of this thread's
    recorded replays alone, else None; found without walking its equations.

    The replays ``root`` depends on are found through their operands, from ``root`` back; an
    operand that is neither the result of one of them nor a leaf (an op bound afresh, a replay
    of another thread or of before the tape was reset) means the graph is not all here: None.
    The key lists those replays in the order they were made: each one's recipe (by identity:
    its equations and constants) and where each operand comes from, an earlier replay of the
    list or a leaf, numbered in the order first met.  ``leaves``: those leaves, each replay's
    constants among them after its operands -- every leaf of the graph, and perhaps a few more
    (an operand a recipe's equations do not read); the key fixes which.  Equal keys are equal
    graphs, leaves in the same places."""
    records = _TAPE.records
    if records and records[-1][3] is root:
        found = _whole_tape(records)
        if found is not None:
            return found
    made = {}
    for i, rec in enumerate(records):
        made[rec[3]] = i
    start = made.get(root)
    if start is None:
        return None
    needed, stack = {start}, [start]
    while stack:
        for v in records[stack.pop()][1]:
            i = made.get(v)
            if i is None:
                if v.eqn is not None:
                    return None
            elif i not in needed:
                needed.add(i)
                stack.append(i)
    order = sorted(needed)
    place = {}                       # a result's number in the list, a leaf's as -1 - index
    leaves, key = [], []
    for n, i in enumerate(order):
        recipe, operands, consts, out = records[i]
        refs = []
        for v in operands:
            j = made.get(v)
            if j is not None and j in needed:
                refs.append(place[records[j][3]])
                continue
            ref = place.get(v)
            if ref is None:
                ref = place[v] = -1 - len(leaves)
                leaves.append(v)
            refs.append(ref)
        for c in consts:
            place[c] = -1 - len(leaves)
            leaves.append(c)
        key.append((recipe, tuple(refs)))
        place[out] = n
    return tuple(key), leaves


def _whole_tape(records):
    """:func:`tape_graph` of the last replay when every replay on the tape leads to it (a
    training step's forward: each op reads the one before), found in one pass over the tape
    instead of a walk back from the root and a second pass in order; None otherwise.  The same
    key and leaves as the walk gives: with every replay needed, a replay's number in the list is
    its place on the tape."""
    made, place, leaves, key, unread = {}, {}, [], [], set()
    for n, (recipe, operands, consts, out) in enumerate(records):
        refs = []
        for v in operands:
            j = made.get(v)
            if j is not None:
                unread.discard(j)
            else:
                if v.eqn is not None:           # made by something not on the tape
                    return None
                j = place.get(v)
                if j is None:
                    j = place[v] = -1 - len(leaves)
                    leaves.append(v)
            refs.append(j)
        leaves += consts
        key.append((recipe, tuple(refs)))
        made[out] = n
        unread.add(n)
    return (tuple(key), leaves) if len(unread) == 1 else None


def info() -> dict:
    """How many calls were replayed, how many recipes recorded, and how many are kept now.

    >>> from vkml.ops import recipes
    >>> sorted(recipes.info())
    ['kept', 'recorded', 'replayed']
    """
    return dict(_COUNTS, kept=len(_RECIPES))


# -- the key -------------------------------------------------------------------------------------

class _Unkeyable(Exception):
    """An argument the key cannot describe: the call runs its function as it is."""


def _key(fn, args, kwargs):
    """``(key, Var operands in order)``, or ``(None, None)`` for a call that cannot be keyed."""
    operands, parts = [], []
    add = parts.append
    try:
        for a in args:          # a loop, not a comprehension: this runs for every op on tensors
            add((a.shape, a.dtype, a.device, a.weak, _alias(a, operands)) if type(a) is Var
                else _arg_key(a, operands))
        if kwargs:
            parts.append(tuple([(k, _arg_key(v, operands)) for k, v in kwargs.items()]))
    except _Unkeyable:
        return None, None
    return (fn, tuple(parts), default_device(), DETERMINISTIC_MATMUL.get()), operands


def _alias(x, operands):
    """Which earlier operand ``x`` is (None: a new one); ``x`` joins ``operands``.  (A Var
    compares by identity, so ``in`` and ``index`` find ``x`` itself.)"""
    i = operands.index(x) if x in operands else None
    operands.append(x)
    return i


def _arg_key(x, operands):
    t = type(x)
    if t is Var:
        return (x.shape, x.dtype, x.device, x.weak, _alias(x, operands))
    if t is float:
        return (t, x.hex())              # the sign of a zero counts; NaN matches NaN
    if t is int or t is bool or t is str or x is None:
        return (t, x)
    if t is tuple or t is list:
        return (t, tuple([_static_key(i) for i in x]))
    return _static_key(x)


def _static_key(x):
    """The key of an argument that is not an operand (axes, shapes, dtypes, numbers)."""
    t = type(x)
    if t is float:
        return (t, x.hex())
    if t is int or t is bool or t is str or x is None:
        return (t, x)
    if t is tuple:
        return (t, tuple([_static_key(i) for i in x]))
    if t is slice:                       # an index: x[1:, ::2]
        return (t, _static_key(x.start), _static_key(x.stop), _static_key(x.step))
    if x is Ellipsis:
        return (t,)
    if isinstance(x, np.generic):
        return (t, x.tobytes())
    if t is np.dtype or isinstance(x, type):
        return x
    raise _Unkeyable
