"""The lowering's table of rules (``backends/codegen/rules.py``) and its statements.

What each primitive becomes in C is its entry in one table, which the lowering dispatches on
and the CUDA renderer updates; nothing else in the code generator picks a primitive by name.
These tests keep it that way: every primitive has an entry or a stated reason to run on NumPy,
CUDA's table differs exactly where its lowering does, the dispatch really reads the table, and
no if-chain on primitive names comes back.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

import vkml
from vkml.backends.codegen import c_render, cuda_render, lower, rules, statements
from vkml.backends.codegen.cuda_render import CUDA_RULES, CudaLowering, cuda_plan
from vkml.backends.codegen.lower import Lowering, Unsupported
from vkml.backends.codegen.rules import C_RULES, UNSUPPORTED, Elementwise, Statement, View
from vkml.backends.cpu import c_source
from vkml.ops import PRIMITIVES

CODEGEN = Path(lower.__file__).parent


# -- the table covers the instruction set -------------------------------------------------------

def test_every_primitive_has_a_rule_or_a_reason_to_run_on_numpy():
    missing = set(PRIMITIVES) - set(C_RULES) - set(UNSUPPORTED)
    assert not missing, f"primitives with no lowering rule and no stated reason: {sorted(missing)}"
    assert not set(C_RULES) & set(UNSUPPORTED)
    assert set(C_RULES) | set(UNSUPPORTED) <= set(PRIMITIVES), "a rule for no primitive"
    assert all(isinstance(why, str) and len(why) > 20 for why in UNSUPPORTED.values())


def test_elementwise_primitives_have_elementwise_rules():
    """What may fuse is the table's word: it agrees with the primitives' own ``elementwise``."""
    for name, rule in C_RULES.items():
        assert isinstance(rule, (Elementwise, View, Statement)), name
        assert isinstance(rule, Elementwise) == PRIMITIVES[name].elementwise, name


def test_a_primitive_left_to_numpy_is_refused_by_the_lowering():
    @vkml.custom_vjp
    def f(x):
        return vkml.sin(x)
    f.defvjp(lambda x: (vkml.sin(x), (x,)), lambda r, g: (g * vkml.cos(r[0]),))
    prog = vkml.program(lambda x, t: vkml.jvp(f, (x,), (t,))[1], np.ones(3), np.ones(3))
    for lowering in (lambda: c_source(prog), lambda: cuda_plan(prog)):
        with pytest.raises(Unsupported, match="custom_lin"):
            lowering()


# -- the CUDA table: the C one, updated where its lowering differs ----------------------------------

def _lower_methods(cls):
    return {name: fn for name, fn in vars(cls).items() if name.startswith("_lower_")}


def _functions(table):
    """Every function the rules of ``table`` call to lower an equation."""
    out = set()
    for rule in table.values():
        out.add(getattr(rule, "lower", None) if isinstance(rule, Statement) else None)
        out.add(getattr(rule, "checked", None))
        out.add(getattr(rule, "loops", None))       # (a product's plain loops, beside its GEMM)
    return out - {None}


def test_every_lowering_method_is_reached_through_the_table():
    """A ``_lower_*`` method no rule names would be dead (dispatch is by table, not by name)."""
    assert set(_lower_methods(Lowering).values()) <= _functions(C_RULES)
    assert set(_lower_methods(CudaLowering).values()) <= _functions(CUDA_RULES)


def test_the_cuda_table_differs_exactly_where_the_cuda_lowering_overrides():
    assert CUDA_RULES.keys() == C_RULES.keys()
    differing = {name for name in C_RULES if CUDA_RULES[name] is not C_RULES[name]}
    overridden = {fn for name, fn in _lower_methods(CudaLowering).items()
                  if name in vars(Lowering)}
    # the one-thread operations go through CudaLowering._serial (the host above a size)
    serial = {name for name in differing if CUDA_RULES[name].lower is CudaLowering._serial}
    assert serial == {"scatter_add", "argsort", "solve", "slogdet", "cholesky"}
    assert {CUDA_RULES[name].lower for name in differing - serial} == overridden
    assert CudaLowering().rules is CUDA_RULES and Lowering().rules is C_RULES


# -- the dispatch reads the table ---------------------------------------------------------------

class _Renamed(Lowering):
    """A lowering whose table spells ``exp`` differently and has no ``reduce_sum``."""

    def __init__(self):
        super().__init__()
        self.rules = {**C_RULES, "exp": Elementwise("my_exp({0})")}
        del self.rules["reduce_sum"]


def test_a_table_entry_is_all_the_lowering_consults():
    prog = vkml.program(lambda x: vkml.exp(x) * 2.0, np.ones(4))
    stmts = _Renamed().program(prog, ["a0"], ["o0"])
    lines = []
    c_render.emit(stmts, lines, "")
    assert any("my_exp(a0[" in line for line in lines), lines
    assert not any("exp(" in line.replace("my_exp(", "") for line in lines), lines
    with pytest.raises(Unsupported, match="reduce_sum"):
        _Renamed().program(vkml.program(lambda x: vkml.sum(x), np.ones(4)), ["a0"], ["o0"])


def test_a_rule_that_refuses_operands_is_its_own_checked_loop():
    """Integer ``pow`` is lowered by its ``checked`` rule (its exponent tested), never fused;
    float ``pow`` fuses into the loop that reads it."""
    ints = vkml.program(lambda x, y: (x ** y) + 1, np.arange(4), np.arange(4))
    floats = vkml.program(lambda x, y: (x ** y) + 1.0, np.ones(4), np.ones(4))
    int_src, _ = c_source(ints)
    float_src, _ = c_source(floats)
    int_body, float_body = (s.split("static int vk_main_body")[1] for s in (int_src, float_src))
    assert "vk_ipow_int64_t(" in int_body and "< 0) { *err = " in int_body
    assert int_body.count("for (int64_t") == 2                  # pow's own loop, then the add's
    assert "pow(a0[" in float_body and float_body.count("for (int64_t") == 1


# -- no dispatch on primitive names outside the table -------------------------------------------

def _name_branches(source):
    """``(line, text)`` of each comparison of a primitive's name (``e.prim.name``, or a local
    bound to it) with a string or a literal collection of strings, and of each ``getattr`` with
    a formatted ``_lower_`` name: the if-chains the table replaces."""
    tree = ast.parse(source)
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_prim_name(node.value):
            bound.update(t.id for t in node.targets if isinstance(t, ast.Name))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = [s for s in sides if _is_prim_name(s) or isinstance(s, ast.Name) and s.id in bound]
            if names and any(_is_strings(s) for s in sides):
                found.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
            if any(isinstance(a, ast.JoinedStr) and "_lower_" in ast.unparse(a) for a in node.args):
                found.append((node.lineno, ast.unparse(node)))
    return found


def _is_prim_name(node):
    return isinstance(node, ast.Attribute) and node.attr == "name" and \
        isinstance(node.value, ast.Attribute) and node.value.attr == "prim"


def _is_strings(node):
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_strings(e) for e in node.elts)
    return False


def test_the_name_check_finds_the_if_chains_it_forbids():
    """The check below can fail: it flags the dispatch this table replaced."""
    old = '''
def expr(self, e, idx):
    name = e.prim.name
    if name == "transpose":
        return 1
    if name in ("add", "sub"):
        return 2
    if e.prim.name in {"pad"}:
        return 3
    return getattr(self, f"_lower_{name}")(e)
'''
    assert [line for line, _ in _name_branches(old)] == [4, 6, 8, 10]
    assert _name_branches("def f(e):\n    return e.prim.name + 'x' if e.kind == 'a' else 0\n") == []


@pytest.mark.parametrize("module", [lower, rules, cuda_render, c_render, statements],
                         ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_no_dispatch_on_primitive_names_outside_the_table(module):
    assert _name_branches(inspect.getsource(module)) == []


# -- the statements, as the renderers print them ------------------------------------------------

def test_the_statements_print_as_their_docstrings_say():
    from vkml.backends.codegen.statements import Block, If, Loop, While
    stmts = [Loop("i", 3, [Block(["int a = i;"]),
                           If("(i) <= 0", ["x;"], first=True),
                           If("else", ["y;"], first=False),
                           While("go[0]", ["go[0] = 0;"])])]
    lines = []
    c_render.emit(stmts, lines, "")
    assert lines == ["for (int64_t i = 0; i < 3; i++) {",
                     "    {", "        int a = i;", "    }",
                     "    if ((i) <= 0) {", "        x;", "    }",
                     "    else {", "        y;", "    }",
                     "    while (go[0]) {", "        go[0] = 0;", "    }",
                     "}"]


def test_the_statement_classes_are_public_and_documented():
    public = [statements.Loop, statements.Block, statements.If, statements.While,
              statements.Matmul, statements.SampleLoop]
    for cls in public:
        assert cls.__doc__ and len(cls.__doc__) > 40, cls
    # the renderers and the lowering share these very classes (one module, no copies)
    assert lower.Loop is cuda_render.Loop is c_render.Loop is statements.Loop
    assert cuda_render.Block is c_render.Block is statements.Block
