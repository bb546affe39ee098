#!/usr/bin/env python3
"""Check how vkml's modules import each other; print every offence (exit status 1 if any).

    python scripts/check_layers.py            # the repository this script lives in
    python scripts/check_layers.py ROOT       # another checkout
    python scripts/check_layers.py --rst      # the layer table of docs/architecture.rst

The library is a stack of layers (``LAYERS`` below, lowest first).  Reading
the source with ``ast`` -- nothing is imported -- it checks that:

1. a module imports only from its own layer or the layers below it, and a
   layer that ``skips`` a lower one does not import that one either;
2. no module uses another module's private names: neither
   ``from .x import _y`` nor ``x._y`` on a name bound to a vkml module
   (``PRIVATE_ALLOWED`` lists temporary exceptions, with the reason);
3. the module-level import graph has no cycle (``LATE_EDGES`` are the one
   declared exception, each checked to be used only inside functions);
4. the library never imports the Jupyter stack (``JUPYTER_STACK``): only
   ``vkml_jupyter`` does;
5. inside a package listed in ``STACKS`` the modules form a stack of their own: each imports
   only the modules before it;
6. every import inside a function carries a ``# local: <why>`` comment (on
   its line, or above it among the imports it is grouped with) saying what
   it dodges: an import cycle or an optional dependency.  Anything else
   belongs at the top of the module.

``importlib.import_module("vkml.x")`` counts as an import of ``vkml.x``.
Imports inside functions count for every rule but the third: they run when
the function is called, long after every module has loaded, so they cannot
take part in an import-time cycle -- which is exactly why a ``# local: cycle``
import is the way to reach a module that imports this one.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field as dataclass_field
from pathlib import Path


@dataclass(frozen=True)
class Layer:
    """One layer: the modules it holds and what they are for."""
    name: str
    modules: tuple      # module names; a package name covers everything inside it
    owns: str           # what lives here, in a few words
    skips: tuple = ()   # lower layers this one must not import even so


#: The layers, lowest first.  A module may import from its own layer and the layers before it,
#: except the ones its layer ``skips``: transforms and backends stand side by side (a backend
#: runs any Program, whoever made it), so backends skips transforms; layers and optimizers
#: are written with tensors and ``jit`` alone.  A new module goes into
#: the lowest layer that holds everything it imports; the check names a module in no layer.
LAYERS = (
    Layer("base", ("vkml.errors", "vkml.threadsafe", "vkml.stats", "vkml.pytree", "vkml.progress",
                   "vkml.install"),
          "leaves every layer shares: errors, per-thread settings, counters, pytrees, progress bars, "
          "install hints"),
    Layer("ir", ("vkml.ir", "vkml.printer", "vkml.validate"),
          "Var, Eqn, Program, their text printer, and the argument checks of public calls"),
    Layer("ops", ("vkml.ops",), "the primitives and the operations built on them"),
    Layer("transforms", ("vkml.transforms",), "jvp, linearize, transpose, vjp, vmap, control flow"),
    Layer("backends", ("vkml.backends",), "NumPy, compiled C and CUDA execution of Programs",
          skips=("transforms",)),
    Layer("runtime", ("vkml.runtime",), "submission, realize, modes, the current backend"),
    Layer("tensor", ("vkml.interchange", "vkml.tensor", "vkml.creation", "vkml.array_protocol"),
          "the lazy Tensor, the ways to make one, NumPy's and the array interchange protocols on it"),
    Layer("programs", ("vkml.programs",), "jit, grad, vmap, scan and friends on Python functions"),
    Layer("numpy", ("vkml.numpy", "vkml.scipy"), "NumPy's and SciPy's names on lazy tensors"),
    Layer("graph", ("vkml.graph",), "kernels, Graph, Record, diff, simulation, checkpoint schedules"),
    Layer("distributed", ("vkml.distributed",), "graphs and simulations sharded over samples on Dask"),
    Layer("nn", ("vkml.nn", "vkml.optim"), "layers, losses, optimizers (on tensors and jit)",
          skips=("numpy", "graph")),
    Layer("viz", ("vkml.viz", "vkml.viz_dot", "vkml.viz_groups", "vkml.viz_render", "vkml.viz_residuals",
                  "vkml.viz_programs", "vkml.viz_diff", "vkml.viz_lazy", "vkml.viz_graphs",
                  "vkml.viz_schedule"),
          "graphviz pictures of everything below (no Jupyter import)"),
    Layer("package", ("vkml",), "the package itself: re-exports the public names"),
    Layer("jupyter", ("vkml_jupyter",), "the IPython magics and widgets (extensions/)"),
)

#: The only places the library reaches into the Jupyter layer above it, on first use.
JUPYTER_DOORS = {("vkml", "vkml_jupyter"), ("vkml", "vkml_jupyter.widgets")}

#: What only the Jupyter layer may import: ``import vkml`` works without a notebook.
JUPYTER_STACK = ("IPython", "ipywidgets", "ipykernel", "anywidget", "jupyter", "jupyter_client",
                 "jupyterlab", "nbformat")

#: Temporary exceptions to the private-name rule, ``(user, owner, name)``, each with its reason;
#: empty: every name shared across modules is public where it is owned.
PRIVATE_ALLOWED = set()

#: Module-level imports left out of the cycle check, and why.  Each family of primitives writes
#: its derivative rules with ``ops.api``'s functions, and ``ops.api`` is built on the primitives:
#: ``vkml/ops/__init__.py`` imports ``api`` first, so when a family module runs
#: ``from . import api as F`` it finds ``api`` (still loading) in ``sys.modules``.  That is safe
#: only while the family uses ``F`` inside functions, which the check verifies.
LATE_EDGES = {
    (family, "vkml.ops.api")
    for family in ("vkml.ops.elementwise", "vkml.ops.reductions", "vkml.ops.movement",
                   "vkml.ops.linalg", "vkml.ops.complex_parts")
}

#: Inside these packages the modules form a stack of their own, lowest first: a module imports
#: only the modules before it (the package's ``__init__`` may import them all).  A new module
#: of the package takes its place here; the check names one it does not find.
STACKS = {
    "vkml.programs": ("checks", "arguments", "jitted", "derivatives", "batching", "jacobians",
                      "control_flow", "loops", "custom_rules", "grad_checks"),
    "vkml.graph": ("treesum", "versions", "reversible", "execute", "kernel", "examples", "nodes",
                   "device", "record", "run", "diff", "graph_reverse", "graph", "simulation"),
    "vkml.graph.simulation": ("schedules", "checks", "record", "device_programs", "host_steps",
                              "compiled_loops", "device_loops", "device_steps", "simulation"),
}

LOCAL_MARK = "# local:"


@dataclass
class Import:
    """One imported thing: ``target`` is a module; ``name`` a name taken from it, if any."""
    module: str
    target: str
    name: str | None
    line: int
    local: bool                 # inside a function
    binds: tuple | None = None  # (local name, the module it names), when it binds a module


@dataclass
class Module:
    """A source file of the library or the Jupyter layer, parsed."""
    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    lines: list


def find_modules(root: Path) -> dict:
    """Every module of the library (``kit/vkml``) and the Jupyter layer (``extensions``)."""
    modules = {}
    for top in (root / "kit", root / "extensions"):
        for path in sorted(top.rglob("*.py")):
            parts = list(path.relative_to(top).with_suffix("").parts)
            if parts[0] not in ("vkml", "vkml_jupyter"):
                continue
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            text = path.read_text()
            modules[name] = Module(name, path, is_package, ast.parse(text, str(path)),
                                   text.splitlines())
    return modules


def layer_of(module: str, layers=LAYERS) -> int | None:
    """The index in ``layers`` of the layer holding ``module`` (longest matching name wins)."""
    best, best_len = None, -1
    for i, layer in enumerate(layers):
        for owned in layer.modules:
            covers = module == owned or (owned != "vkml" and module.startswith(owned + "."))
            if covers and len(owned) > best_len:
                best, best_len = i, len(owned)
    return best


def _function_nodes(tree) -> set:
    """The ids of every node inside a function body (what runs only when it is called)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for sub in ast.walk(node):
                if sub is not node:
                    inside.add(id(sub))
    return inside


def _absolute(module: Module, level: int, name: str | None) -> str:
    parts = module.name.split(".")
    if not module.is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def imports_of(module: Module, modules: dict) -> list:
    """The project imports of one module, each resolved to the module it loads."""
    inside = _function_nodes(module.tree)
    found = []
    for node in ast.walk(module.tree):
        local = id(node) in inside
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("vkml", "vkml_jupyter"):
                    local_name = alias.asname or alias.name.split(".")[0]
                    named = alias.name if alias.asname else local_name
                    found.append(Import(module.name, alias.name, None, node.lineno, local,
                                        binds=(local_name, named)))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node.level, node.module) if node.level else node.module
            if base is None or base.split(".")[0] not in ("vkml", "vkml_jupyter"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:      # ``from . import api``: the submodule itself
                    found.append(Import(module.name, sub, None, node.lineno, local,
                                        binds=(alias.asname or alias.name, sub)))
                else:
                    found.append(Import(module.name, base, alias.name, node.lineno, local))
        elif _dynamic_import(node):
            found.append(Import(module.name, node.args[0].value, None, node.lineno, local))
    return found


def _dynamic_import(node) -> bool:
    """``importlib.import_module("vkml...")`` or ``__import__("vkml...")``: an import all the same."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return False
    name = node.args[0].value
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return called in ("import_module", "__import__") and isinstance(name, str) \
        and name.split(".")[0] in ("vkml", "vkml_jupyter")


def all_function_imports(module: Module) -> list:
    """Every import statement inside a function, project or not: ``(line, end_line)``."""
    inside = _function_nodes(module.tree)
    return [(node.lineno, node.end_lineno) for node in ast.walk(module.tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) in inside]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_names(imports: list) -> dict:
    """Local name -> module, for the names a module binds to project modules."""
    return dict(imp.binds for imp in imports if imp.binds)


def _attribute_chain(node):
    """``a.b.c`` -> ``("a", ["b", "c"])``; None when the chain does not start at a name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, attrs[::-1]
    return None


def private_uses(module: Module, imports: list, modules: dict) -> list:
    """``(line, owner, name)`` for each private name of another module this one uses."""
    uses = [(imp.line, imp.target, imp.name) for imp in imports
            if imp.name and _is_private(imp.name) and imp.target != module.name]
    names = _module_names(imports)
    seen = set()
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Attribute) or id(node) in seen:
            continue
        chain = _attribute_chain(node)
        # mark the inner attributes of this chain as seen: each chain is read once, from its top
        inner = node.value
        while isinstance(inner, ast.Attribute):
            seen.add(id(inner))
            inner = inner.value
        if chain is None or chain[0] not in names:
            continue
        owner = names[chain[0]]
        for attr in chain[1]:
            if _is_private(attr) and owner != module.name:
                uses.append((node.lineno, owner, attr))
                break
            if f"{owner}.{attr}" not in modules:
                break
            owner = f"{owner}.{attr}"
    return uses


def _late_name_used_at_import_time(module: Module, local_name: str) -> list:
    """Lines where ``local_name`` is read outside any function body."""
    inside = _function_nodes(module.tree)
    return sorted(node.lineno for node in ast.walk(module.tree)
                  if isinstance(node, ast.Name) and node.id == local_name and id(node) not in inside
                  and isinstance(node.ctx, ast.Load))


def _marked_local(lines: list, line: int, end: int) -> bool:
    """Whether the import on ``line..end`` (1-based) says why it is local: a ``# local:`` comment
    on it, or above it in the run of imports and comments it belongs to."""
    if any(LOCAL_MARK in lines[i - 1] for i in range(line, end + 1)):
        return True
    i = line - 1
    while i >= 1 and lines[i - 1].strip().startswith(("import ", "from ", "#")):
        if LOCAL_MARK in lines[i - 1]:
            return True
        i -= 1
    return False


def find_cycle(edges: dict) -> list | None:
    """One cycle of the directed graph ``edges`` (a list of nodes, first == last), or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path)
                if found:
                    return found
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


@dataclass(frozen=True)
class Rules:
    """What :func:`check` enforces; the defaults are this project's, tests pass their own."""
    layers: tuple = LAYERS
    private_allowed: frozenset = frozenset(PRIVATE_ALLOWED)
    late_edges: frozenset = frozenset(LATE_EDGES)
    doors: frozenset = frozenset(JUPYTER_DOORS)
    stacks: dict = dataclass_field(default_factory=lambda: dict(STACKS))


def check(root: Path, rules: Rules = Rules()) -> list:
    """Every offence in the checkout at ``root``, as readable lines."""
    root = Path(root)
    modules = find_modules(root)
    offences, edges, allowed_used = [], {}, set()
    for module in modules.values():
        where = module.path.relative_to(root)
        mine = layer_of(module.name, rules.layers)
        if mine is None:
            offences.append(f"{where}: {module.name} is in no layer; add it to LAYERS")
            continue
        imports = imports_of(module, modules)
        offences += _layer_offences(where, module, mine, imports, rules)
        offences += _late_edge_offences(where, module, imports, rules)
        offences += _stack_offences(where, module, imports, rules)
        if module.name.split(".")[0] == "vkml":
            offences += [f"{where}:{line}: {module.name} imports {name}; only the Jupyter layer "
                         "(extensions/vkml_jupyter) may" for line, name in _jupyter_imports(module)]
        for imp in imports:
            if not imp.local and imp.target != module.name \
                    and (module.name, imp.target) not in rules.late_edges:
                edges.setdefault(module.name, set()).add(imp.target)
        for line, owner, name in sorted(set(private_uses(module, imports, modules))):
            if (module.name, owner, name) in rules.private_allowed:
                allowed_used.add((module.name, owner, name))
            else:
                offences.append(f"{where}:{line}: {module.name} uses {owner}.{name}, a private "
                                "name of another module; make it public where it is owned")
        offences += [f"{where}:{line}: import inside a function without a '{LOCAL_MARK} <why>' "
                     "comment; move it to the top of the module unless it dodges an import cycle "
                     "or an optional dependency"
                     for line, end in all_function_imports(module)
                     if not _marked_local(module.lines, line, end)]
    offences += _stale_rule_offences(modules, rules, allowed_used)
    cycle = find_cycle(edges)
    if cycle:
        offences.append("module-level import cycle: " + " -> ".join(cycle))
    return offences


def _layer_offences(where, module, mine, imports, rules) -> list:
    """Imports reaching a layer above ``module``'s, or one its layer skips."""
    layers, found = rules.layers, []
    for imp in imports:
        theirs = layer_of(imp.target, layers)
        if theirs is None or (module.name, imp.target) in rules.doors:
            continue
        if theirs > mine or layers[theirs].name in layers[mine].skips:
            found.append(f"{where}:{imp.line}: layer '{layers[mine].name}' ({module.name}) imports "
                         f"{imp.target} from layer '{layers[theirs].name}'"
                         + (", which it skips" if theirs < mine else ", above it"))
    return found


def _stack_offences(where, module, imports, rules) -> list:
    """Imports inside a stacked package (``STACKS``) that reach a module at or above this one."""
    parts = module.name.rsplit(".", 1)
    if module.is_package or len(parts) < 2 or parts[0] not in rules.stacks:
        return []
    package, name = parts
    order = rules.stacks[package]
    if name not in order:
        return [f"{where}: {module.name} has no place in STACKS[{package!r}]; add it"]
    found = []
    for imp in imports:
        if imp.local or not imp.target.startswith(package + "."):
            continue
        theirs = imp.target[len(package) + 1:].split(".")[0]
        if theirs in order and order.index(theirs) >= order.index(name) and theirs != name:
            found.append(f"{where}:{imp.line}: {module.name} imports {imp.target}, which comes "
                         f"after it in STACKS[{package!r}]")
    return found


def _jupyter_imports(module: Module) -> list:
    """``(line, package)`` for each import of the Jupyter stack in ``module``."""
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in JUPYTER_STACK]
    return found


def _late_edge_offences(where, module, imports, rules) -> list:
    """Names imported over a late edge but used while the module loads (still half made then)."""
    found = []
    for imp in imports:
        if imp.local or (module.name, imp.target) not in rules.late_edges:
            continue
        local_name = imp.binds[0] if imp.binds else imp.name
        found += [f"{where}:{line}: {local_name} ({imp.target}) is used while {module.name} loads; "
                  "it is imported over a late edge (see LATE_EDGES), so use it only inside functions"
                  for line in _late_name_used_at_import_time(module, local_name)]
    return found


def _stale_rule_offences(modules, rules, allowed_used) -> list:
    """Entries of the rules that no longer match the code: they would hide a future offence."""
    found = [f"LAYERS names {name}, which is no module here; remove it"
             for layer in rules.layers for name in layer.modules if name not in modules]
    found += [f"PRIVATE_ALLOWED lists {owner}.{name} for {user}, which no longer uses it; remove it"
              for user, owner, name in sorted(rules.private_allowed - allowed_used)]
    imported = {(m.name, imp.target) for m in modules.values() for imp in imports_of(m, modules)
                if not imp.local}
    found += [f"LATE_EDGES lists {a} -> {b}, which is no module-level import; remove it"
              for a, b in sorted(rules.late_edges - imported)]
    return found


def layer_table(layers=LAYERS) -> str:
    """The layers as the reStructuredText table of ``docs/architecture.rst`` (``--rst`` prints
    it; ``tests/test_repo.py`` checks the page holds exactly this text)."""
    def names(modules):
        return ", ".join(f"``{m}``" for m in modules)
    rows = []
    for i, layer in enumerate(layers):
        may = "nothing else in vkml" if i == 0 else "base" if i == 1 else f"layers 1-{i}"
        if layer.skips:
            may += f" except {', '.join(layer.skips)}"
        rows.append((f"{i + 1}. {layer.name}", names(layer.modules), layer.owns, may))
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 12 26 38 24", "",
             "   * - layer", "     - modules", "     - what it owns", "     - may import"]
    for row in rows:
        lines.append(f"   * - {row[0]}")
        lines += [f"     - {cell}" for cell in row[1:]]
    return "\n".join(lines) + "\n"


def main(argv) -> int:
    if argv[1:] == ["--rst"]:
        print(layer_table(), end="")
        return 0
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    offences = check(root)
    for offence in offences:
        print(offence)
    print(f"{len(offences)} offence(s)", file=sys.stderr)
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
