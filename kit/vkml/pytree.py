"""Pytrees: nested tuples, lists, dicts and None, with arrays or tensors at the leaves.

``flatten`` gives the leaves in a fixed order (dict keys sorted) and a
hashable *treedef*; a traced function's key is the treedef plus each leaf's
type, so two calls with the same structure share one program.
"""

from __future__ import annotations


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
        return ("(" if self.kind == "tuple" else "[") + inner + (")" if self.kind == "tuple" else "]")


LEAF = TreeDef("leaf", None, ())


def flatten(tree):
    leaves = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree, leaves):
    if tree is None:
        return TreeDef("none", None, ())
    if isinstance(tree, tuple) and not hasattr(tree, "_fields"):
        return TreeDef("tuple", None, [_flatten(t, leaves) for t in tree])
    if isinstance(tree, list):
        return TreeDef("list", None, [_flatten(t, leaves) for t in tree])
    if isinstance(tree, dict):
        keys = tuple(sorted(tree))
        return TreeDef("dict", keys, [_flatten(tree[k], leaves) for k in keys])
    leaves.append(tree)
    return LEAF


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
    if td.kind == "tuple":
        return tuple(children)
    if td.kind == "list":
        return children
    return dict(zip(td.meta, children))


def tree_map(fn, tree):
    leaves, td = flatten(tree)
    return unflatten(td, [fn(x) for x in leaves])
