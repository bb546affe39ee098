"""Pytrees: nested tuples, lists, dicts, namedtuples, dataclasses and None, with arrays or tensors
at the leaves.

``flatten`` gives the leaves in a fixed order (dict keys sorted, dataclass
fields in declaration order) and a hashable *treedef*; a traced function's
key is the treedef plus each leaf's type, so two calls with the same
structure share one program.  Other classes join with :func:`register`.

A list is a container here, as in JAX: ``vkml.jit(f)([1.0, 2.0])`` calls
``f`` with a list of two scalar tensors.  Operations (``vkml.add([1, 2], x)``,
``vkml.tensor([1, 2])``) read a list as an array; to pass one array to a
transformed function, pass ``np.array(...)`` or ``vkml.tensor(...)``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .errors import ArgumentError


class TreeDef:
    __slots__ = ("kind", "meta", "children", "_hash")

    def __init__(self, kind, meta, children):
        self.kind, self.meta, self.children = kind, meta, tuple(children)
        self._hash = hash((kind, meta, self.children))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, TreeDef) and self.kind == other.kind and \
            self.meta == other.meta and self.children == other.children

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def __repr__(self):
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = ", ".join(repr(c) for c in self.children)
        if self.kind == "dict":
            inner = ", ".join(f"{k!r}: {c!r}" for k, c in zip(self.meta, self.children))
            return "{" + inner + "}"
        if self.kind in ("namedtuple", "dataclass", "custom"):
            return f"{self.meta[0].__name__}({inner})"
        return ("(" if self.kind == "tuple" else "[") + inner + (")" if self.kind == "tuple" else "]")


LEAF = TreeDef("leaf", None, ())

#: class -> (flatten(obj) -> (children, aux), unflatten(aux, children) -> obj), from ``register``.
_REGISTRY = {}


def register(cls, flatten_fn, unflatten_fn):
    """Make instances of ``cls`` pytree nodes, as ``jax.tree_util.register_pytree_node`` does.

    ``flatten_fn(obj)`` returns ``(children, aux)``: the children are
    pytrees (their leaves are traced), ``aux`` is hashable data that is part
    of the program's key (a change retraces).  ``unflatten_fn(aux, children)``
    rebuilds the object.  Returns ``cls``.
    """
    if not isinstance(cls, type):
        raise ArgumentError(f"pytree.register: expected a class, got {type(cls).__name__}")
    if not callable(flatten_fn) or not callable(unflatten_fn):
        raise ArgumentError("pytree.register: flatten and unflatten must be functions: "
                            "flatten(obj) -> (children, aux), unflatten(aux, children) -> obj")
    if cls in (tuple, list, dict, type(None)):
        raise ArgumentError(f"pytree.register: {cls.__name__} is already a pytree node")
    _REGISTRY[cls] = (flatten_fn, unflatten_fn)
    return cls


def _static_fields(cls):
    """A dataclass's fields marked ``field(metadata={"static": True})``: part of the key, not leaves."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("static"))


_LEAF_TYPES = frozenset({np.ndarray, float, int, bool, np.float64, np.float32, np.int64, np.int32,
                         np.bool_})


def _node(tree):
    """One level of ``tree``: ``(kind, meta, children)``, or None for a leaf."""
    cls = type(tree)
    if cls in _LEAF_TYPES:               # the common leaves first: a call's flattening is per call
        return None
    if tree is None:
        return "none", None, ()
    if cls in _REGISTRY:
        children, aux = _REGISTRY[cls][0](tree)
        try:
            hash(aux)
        except TypeError:
            raise ArgumentError(f"pytree: the flatten function registered for {cls.__name__} returned "
                                f"an unhashable aux ({type(aux).__name__}); return a tuple") from None
        return "custom", (cls, aux), tuple(children)
    if isinstance(tree, tuple):
        if hasattr(tree, "_fields"):
            return "namedtuple", (cls,), tuple(tree)
        return "tuple", None, tree
    if isinstance(tree, list):
        return "list", None, tree
    if isinstance(tree, dict):
        keys = tuple(sorted(tree))
        return "dict", keys, [tree[k] for k in keys]
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        static = _static_fields(cls)
        names = tuple(f.name for f in dataclasses.fields(cls) if f.name not in static)
        aux = tuple(getattr(tree, n) for n in static)
        return "dataclass", (cls, names, static, aux), [getattr(tree, n) for n in names]
    return None


#: how deeply containers may nest in one pytree: deeper (or a list that contains itself) is refused
#: with an ArgumentError rather than running into Python's recursion limit
MAX_DEPTH = 256


def flatten(tree):
    leaves = []
    return leaves, _flatten(tree, leaves, 0)


def _flatten(tree, leaves, depth):
    node = _node(tree)
    if node is None:
        leaves.append(tree)
        return LEAF
    if depth >= MAX_DEPTH:
        raise ArgumentError(f"pytree: containers nested more than {MAX_DEPTH} deep (or a container "
                            "that holds itself); pass arrays, or flatter tuples, lists and dicts")
    kind, meta, children = node
    return TreeDef(kind, meta, [_flatten(t, leaves, depth + 1) for t in children])


def unflatten(treedef: TreeDef, leaves):
    it = iter(leaves)
    out = _unflatten(treedef, it)
    return out


def _unflatten(td, it):
    if td.kind == "leaf":
        return next(it)
    if td.kind == "none":
        return None
    children = [_unflatten(c, it) for c in td.children]
    return _build(td.kind, td.meta, children)


def _build(kind, meta, children):
    """The node of kind ``kind`` with these children (the inverse of ``_node``)."""
    if kind == "tuple":
        return tuple(children)
    if kind == "list":
        return children
    if kind == "dict":
        return dict(zip(meta, children))
    if kind == "namedtuple":
        return meta[0](*children)
    if kind == "dataclass":
        cls, names, static, aux = meta
        obj = object.__new__(cls)  # not cls(...): fields with init=False and frozen classes too
        for name, value in zip(names + static, list(children) + list(aux)):
            object.__setattr__(obj, name, value)
        return obj
    cls, aux = meta
    return _REGISTRY[cls][1](aux, children)


def broadcast_prefix(prefix, tree, is_leaf, where):
    """One entry of ``prefix`` per leaf of ``tree``: ``prefix`` is ``tree`` cut short, each of its
    leaves (where ``is_leaf`` holds, e.g. an int or None for vmap's ``in_axes``) standing for
    every leaf of the subtree at its place."""
    if is_leaf(prefix):
        return [prefix] * len(flatten(tree)[0])
    p_node, t_node = _node(prefix), _node(tree)
    if p_node is None or t_node is None or p_node[0] != t_node[0] or p_node[1] != t_node[1] \
            or len(p_node[2]) != len(t_node[2]):
        raise ArgumentError(f"{where}: {prefix!r} does not match the structure of the argument, "
                            f"{flatten(tree)[1]}; give one entry per part (or one for all)")
    out = []
    for p, t in zip(p_node[2], t_node[2]):
        out += broadcast_prefix(p, t, is_leaf, where)
    return out


def leaf_paths(treedef: TreeDef, root: str = "") -> list:
    """How a user would reach each leaf from ``root``, in leaf order: ``p['W1']``,
    ``params[1][0]``, ``state.theta`` -- what pictures and printed programs call a traced
    function's inputs (``%3`` says nothing about which weight it is).

    >>> vkml.pytree.leaf_paths(vkml.pytree.flatten(({"W": 1, "b": 2}, [3, (4, 5)]))[1], "args")
    ["args[0]['W']", "args[0]['b']", 'args[1][0]', 'args[1][1][0]', 'args[1][1][1]']
    """
    if not isinstance(treedef, TreeDef) or not isinstance(root, str):
        raise ArgumentError(f"leaf_paths: expected a TreeDef (vkml.pytree.flatten(tree)[1]) and a "
                            f"name for its root, got {type(treedef).__name__} and "
                            f"{type(root).__name__}")
    out = []
    _paths(treedef, root, out)
    return out


def _paths(td, here, out):
    if td.kind == "leaf":
        out.append(here)
        return
    if td.kind == "none":
        return
    if td.kind == "dict":
        steps = [f"[{k!r}]" for k in td.meta]
    elif td.kind == "namedtuple":
        steps = [f".{f}" for f in td.meta[0]._fields]
    elif td.kind == "dataclass":
        steps = [f".{f}" for f in td.meta[1]]
    else:
        steps = [f"[{i}]" for i in range(len(td.children))]
    for step, child in zip(steps, td.children):
        _paths(child, here + step, out)
