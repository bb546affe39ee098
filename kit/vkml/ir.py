"""The one IR: values (:class:`Var`), equations (:class:`Eqn`) and :class:`Program`.

Every kind of work in vkml becomes a Program: a lazy tensor graph at realize,
a jitted function when it is traced, a per-sample kernel of the graph layer.
A backend compiles and runs Programs and nothing else, and every
transformation (jvp, partial evaluation, transpose, vmap, the printer) is an
interpreter that walks a Program's equations.

Building is done by *binding* a primitive to input Vars (see ``vkml.ops``):
that makes an :class:`Eqn` and its output Vars, and each output remembers
the equation that made it (``var.eqn``).  So Vars form a DAG, and a Program
is that DAG cut at its leaves and put in topological order by
:func:`collect`.  A Var that already holds a concrete array (``var.value``)
is a leaf: an input of the program that reads it.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from .errors import TracingError

#: The dtypes a tensor can have: NumPy's bool, signed and unsigned integers of 8 to 64 bits,
#: float32/64 and complex64/128 (the array API standard's set).  Every backend computes with all
#: of them (a compiled tier hands a program with a dtype its C lowering lacks to NumPy).
DTYPES = tuple(np.dtype(d) for d in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                     "uint32", "uint64", "float32", "float64", "complex64",
                                     "complex128"))


def dtype_name(dtype) -> str:
    return np.dtype(dtype).name


#: whether ``sys.getrefcount`` counts every holder, so code may conclude from a count that
#: nothing else reaches an object (a dead graph freed at once, an optimiser's array updated in
#: place): CPython up to 3.13, where every local name holds a reference.  Later versions may
#: borrow references for locals and undercount; other interpreters count differently.  Where
#: this is False that code takes its general path (the cycle collector, new arrays)
EXACT_REFCOUNTS = sys.implementation.name == "cpython" and sys.version_info < (3, 14)

_NEXT_SERIAL = [0]
_new_object = object.__new__


def current_serial() -> int:
    """The serial the next Var will get: Vars with a smaller one existed before this call."""
    return _NEXT_SERIAL[0]


class Var:
    """A value of the IR: its abstract type (shape, dtype, device) and where it comes from.

    ``eqn`` is the equation that computes it (None for a leaf); ``value`` is
    the concrete array once known.  A Var may have both: a realized tensor
    that still needs its history for a later backward keeps its ``eqn``.

    >>> v = vkml.Var((2, 3), np.dtype("float32"))
    >>> v.shape, v.dtype, v.ndim, v.size, v.type_str()
    ((2, 3), dtype('float32'), 2, 6, 'float32 [2, 3] at CPU')
    """

    __slots__ = ("shape", "dtype", "device", "eqn", "value", "serial", "weak", "__weakref__")

    def __init__(self, shape, dtype, device="CPU", eqn=None, value=None, weak=False):
        # A creation counter: a trace knows the Vars made before it started are
        # not its own (they are captures), without a trace id on every Var.
        self.serial = _NEXT_SERIAL[0]
        _NEXT_SERIAL[0] += 1
        self.shape = shape
        self.dtype = dtype
        # A weakly typed scalar (a Python number passed to a jitted function):
        # it takes the dtype of what it meets, as the number itself would.
        self.weak = weak
        self.device = device
        self.eqn = eqn
        self.value = value

    @classmethod
    def holding(cls, shape, dtype, device, value):
        """``Var(shape, dtype, device, value=value)`` made field by field: a jitted call's result
        without the ``__init__`` call (a tiny call makes one per result).

        >>> v = vkml.Var.holding((2,), np.dtype("float64"), "CPU", np.zeros(2))
        >>> v.type_str(), v.eqn is None, v.value.tolist()
        ('float64 [2] at CPU', True, [0.0, 0.0])
        """
        var = _new_object(cls)
        var.serial = serial = _NEXT_SERIAL[0]
        _NEXT_SERIAL[0] = serial + 1
        var.shape = shape
        var.dtype = dtype
        var.device = device
        var.weak = False
        var.eqn = None
        var.value = value
        return var

    @property
    def aval(self):
        """The abstract type: ``(shape, dtype, device)``.

        >>> vkml.Var((2,), np.dtype("float64")).aval
        ((2,), dtype('float64'), 'CPU')
        """
        return (self.shape, self.dtype, self.device)

    @property
    def ndim(self) -> int:
        """The number of axes.

        >>> vkml.Var((2, 3), np.float32).ndim
        2
        """
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements.

        >>> vkml.Var((2, 3), np.float32).size
        6
        """
        n = 1
        for d in self.shape:
            n *= d
        return n

    def type_str(self) -> str:
        """The type as the printed programs write it.

        >>> vkml.Var((2, 3), np.float32).type_str()
        'float32 [2, 3] at CPU'
        """
        return f"{dtype_name(self.dtype)} {format_shape(self.shape)} at {self.device}"

    def __repr__(self):
        return f"Var({self.type_str()})"


def format_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


class Scope:
    """Where in the user's model an equation was made: a module inside its parent module.

    ``name`` is how the parent reaches it (``layers.0``, ``encoder``; the class name for the
    outermost), ``label`` what it is (``Linear(64 -> 32)``).  One Scope per module per parent,
    reused for every call, so equations of one call of a layer compare equal by identity.
    Pictures draw the equations of one scope as one box (``vkml.viz``).

    A ``quiet`` scope is a library function computed by a fixed recipe (``erfinv``,
    ``gammainc``) whose unused branches may overflow or divide by zero: the NumPy backend
    does not warn about floating-point exceptions inside it, as SciPy does not."""

    __slots__ = ("parent", "name", "label", "quiet", "__weakref__")

    def __init__(self, parent, name: str, label: str, quiet: bool = False):
        self.parent, self.name, self.label, self.quiet = parent, name, label, quiet

    def chain(self) -> list:
        """This scope and its parents, outermost first."""
        out, s = [], self
        while s is not None:
            out.append(s)
            s = s.parent
        return out[::-1]

    def path(self) -> str:
        """``encoder.layers.0``: the names from the outermost module's child down, as
        ``model.named_modules()`` would name it (the outermost module's own name left out)."""
        names = [s.name for s in self.chain()[1:]]
        return ".".join(names) if names else self.name

    def __repr__(self):
        return f"<Scope {self.path()}: {self.label}>"


class Eqn:
    """One primitive applied to input Vars, giving output Vars.

    ``params`` are the primitive's static parameters (axes, shapes, nested
    programs); they must be hashable because they are part of a program's
    structural key.  ``where`` is the user's source line that made it, used
    to name the line in error messages.  ``origin`` is set by the transforms
    (jvp, partial evaluation, transpose) on the equations they make:
    ``(primal equation, role)`` with role "primal", "tangent" or "cotangent",
    so a picture can show which user equation each derived one comes from.
    ``scope`` is the :class:`Scope` (the module of a model) the equation was made in, or None;
    pictures group equations by it.  Neither is ever part of a structural key.
    """

    __slots__ = ("prim", "inputs", "outputs", "params", "where", "origin", "scope")

    def __init__(self, prim, inputs, outputs, params, where=None, scope=None):
        self.prim = prim
        self.inputs = inputs
        self.outputs = outputs
        self.params = params
        self.where = where
        self.origin = None
        self.scope = scope

    def describe(self) -> str:
        """A short text naming the op, its operands and the line that made it."""
        args = ", ".join(v.type_str() for v in self.inputs)
        text = f"{self.prim.name}({args})"
        if self.params:
            text += " with " + ", ".join(f"{k}={_param_str(v)}" for k, v in self.params.items())
        if self.where:
            text += f", made at {site_text(self.where)}"
        return text

    def __repr__(self):
        return f"Eqn({self.describe()})"


def site_text(where) -> str:
    """``file.py:12`` for a source site kept as (code object, line) -- ``cell In[5], line 2``
    for a line of a notebook cell, as IPython's own tracebacks name it -- or a text as it is."""
    if where is None or isinstance(where, str):
        return where
    code, line = where
    cell = notebook_cell(code.co_filename)
    if cell is not None:
        return f"cell {cell}, line {line}"
    return f"{os.path.basename(code.co_filename)}:{line}"


def notebook_cell(filename: str):
    """``In[5]`` when ``filename`` is the name IPython gave the code of a cell it ran (a
    temporary ``.../ipykernel_123/4567.py``), else None.  Asks the running IPython, if any,
    without importing it."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get is not None else None
    name = getattr(getattr(shell, "compile", None), "format_code_name", None)
    try:
        named = name(filename) if name is not None else None
    except Exception:                 # noqa: BLE001 - another IPython's internals: no cell name
        return None
    return named[1] if named else None


def _param_str(value) -> str:
    if isinstance(value, Program):
        return "<program>"
    if isinstance(value, np.dtype):
        return value.name
    return str(value)


def params_key(params: dict) -> tuple:
    """Params as a hashable, order-independent tuple."""
    if not params:
        return ()
    return tuple(sorted(params.items()))


class Program:
    """A closed list of equations: ``outputs = f(inputs)``.

    ``consts`` are leaf Vars with values that the program holds itself (the
    literal ``0.`` of a scan's initial carry, say); inputs are supplied per
    call.  Programs compare and hash by structure, so a training step that
    builds the same graph every time finds its compiled executable in the
    cache.

    >>> prog = vkml.program(lambda x, y: x @ y, np.ones((2, 3)), np.ones(3))
    >>> len(prog.inputs), len(prog.eqns), prog.outputs[0].shape
    (2, 3, (2,))
    """

    __slots__ = ("inputs", "consts", "eqns", "outputs", "_key", "_hash", "__weakref__", "__dict__")

    def __init__(self, inputs, eqns, outputs, consts=()):
        self.inputs = tuple(inputs)
        self.consts = tuple(consts)
        self.eqns = tuple(eqns)
        self.outputs = tuple(outputs)
        self._key = None
        self._hash = None

    @property
    def key(self) -> tuple:
        """The structural key: what the program computes, not which arrays it holds.

        >>> p1 = vkml.program(lambda x: x + 1.0, np.zeros(2))
        >>> p2 = vkml.program(lambda x: x + 1.0, np.ones(2))
        >>> p1.key == p2.key
        True
        """
        if self._key is None:
            self._key = structure_key(self.inputs, self.consts, self.eqns, self.outputs,
                                      with_const_values=True)
        return self._key

    def __hash__(self):
        if self._hash is None:
            self._hash = hash(self.key)
        return self._hash

    def __eq__(self, other):
        return self is other or (isinstance(other, Program) and self.key == other.key)

    def __str__(self):
        from .printer import pp_program  # local: cycle (the printer imports this module)
        return pp_program(self)

    def __repr__(self):
        return f"<Program ({len(self.inputs)} inputs, {len(self.eqns)} equations, {len(self.outputs)} outputs)>"


def _value_key(value):
    a = np.asarray(value)
    return (a.dtype.str, a.shape, a.tobytes())


def structure_key(inputs, consts, eqns, outputs, with_const_values: bool) -> tuple:
    """Number every Var by first appearance and describe the program with those numbers."""
    ids = {}
    parts = []
    for v in inputs:
        ids[v] = len(ids)
        parts.append(v.aval)
    for v, value in consts:
        ids[v] = len(ids)
        parts.append((v.aval, _value_key(value)) if with_const_values else v.aval)
    parts.append(len(inputs))
    for e in eqns:
        parts.append((e.prim.name, params_key(e.params), tuple(ids[v] for v in e.inputs)))
        for v in e.outputs:
            ids[v] = len(ids)
    parts.append(tuple(ids[v] for v in outputs))
    return tuple(parts)


def collect(outputs, is_leaf=None):
    """Put the DAG under ``outputs`` in topological order, cut at leaves.

    A Var is a leaf when it has no equation, or ``is_leaf(var)`` says so
    (default: it already holds a value).  Returns ``(leaves, eqns)``: the
    leaves in first-visit order and the equations in an order where every
    input is computed before it is read.  Iterative, so a chain of 100 000
    ops does not hit Python's recursion limit.
    """
    leaves, order, _ = _walk(outputs, is_leaf, keyed=False)
    return leaves, order


def collect_keyed(outputs, is_leaf=None):
    """:func:`collect` and a structural key of the result, in ONE walk of the DAG.

    The key numbers Vars in the order the walk meets them (leaves when found,
    equation outputs when emitted), so two graphs of the same structure get
    the same key.  This runs on every realize and backward, so it is one pass.
    """
    return _walk(outputs, is_leaf, keyed=True)


def _walk(outputs, is_leaf, keyed):
    """Depth-first, operands in order, so the order (and the key) is deterministic.

    The stack holds Vars to visit and, once a Var's operands are pushed, its Eqn to emit after
    them: no per-visit tuples.  This runs on every realize and backward (~1 us per equation)."""
    if is_leaf is None:
        is_leaf = _has_value
    leaves, order, parts = [], [], []
    ids = {}
    emitted = set()
    stack = list(reversed(outputs))
    pop, push = stack.pop, stack.append
    while stack:
        item = pop()
        if type(item) is Eqn:
            if item in emitted:
                continue
            emitted.add(item)
            order.append(item)
            if keyed:
                params = item.params
                parts.append((item.prim.name, tuple(sorted(params.items())) if params else (),
                              tuple(map(ids.__getitem__, item.inputs))))
            for o in item.outputs:
                ids[o] = len(ids)
            continue
        if item in ids:
            continue
        e = item.eqn
        if e is None or is_leaf(item):
            ids[item] = len(ids)
            leaves.append(item)
            if keyed:
                parts.append((item.shape, item.dtype, item.device))
            continue
        if e in emitted:
            continue
        ids[item] = None                     # on the stack: do not expand twice
        push(e)
        for src in reversed(e.inputs):
            if src not in ids:
                push(src)
    if keyed:
        parts.append(tuple([ids[v] for v in outputs]))
    return leaves, order, tuple(parts)


def _has_value(var) -> bool:
    return var.value is not None


def program_from_dag(inputs, outputs) -> Program:
    """Close the DAG between placeholder ``inputs`` and ``outputs`` into a Program.

    Leaves that hold values become the program's consts; a leaf that is
    neither an input nor a value is a placeholder from another trace that
    escaped into this one, which is refused.
    """
    input_set = set(inputs)
    leaves, eqns = collect(outputs, is_leaf=lambda v: v in input_set or v.value is not None)
    consts = []
    for v in leaves:
        if v in input_set:
            continue
        if v.value is None:
            raise TracingError(
                f"a traced value ({v.type_str()}) from another trace was used here; "
                "pass it as an argument of the function instead of capturing it")
        consts.append((v, v.value))
    return Program(inputs, eqns, outputs, consts)
