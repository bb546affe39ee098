"""The project's documentation: the Sphinx site builds cleanly, and every public name has an
example that runs.

- ``docs/`` builds with ``sphinx-build -W --keep-going -b html``: a broken cross-reference, a
  docstring that is not valid reStructuredText or a tutorial that will not render fails here.
- Every public name -- what ``vkml``, ``vkml.nn``, ``vkml.optim``, ``vkml.numpy`` (and its
  ``linalg``), ``vkml.scipy.special``, ``vkml.viz``, ``vkml.graph`` (and ``vkml.diff``),
  ``vkml.errors``, ``vkml_jupyter`` and ``vkml.widgets`` offer, and the public methods and
  properties of every class among them (``Tensor``, ``Graph``, ``Record``, ``Reverse``, the
  ``nn`` modules, the optimizers, ...) -- has a docstring with a ``>>>`` example.
- Every example runs with Python's ``doctest`` (NumPy backend, lazy mode, NumPy's default print
  options) and prints what its docstring says.  Examples see ``vkml``, ``np`` (NumPy) and ``vnp``
  (``vkml.numpy``) already imported, as the API pages say.
"""

import ast
import doctest
import importlib
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import vkml
from vkml.graph import examples
import vkml.numpy

ROOT = Path(__file__).resolve().parents[1]

#: the modules whose names are public; a module without ``__all__`` offers the names not starting
#: with ``_`` that vkml defines (its imports of other libraries are not its names)
MODULES = ["vkml", "vkml.nn", "vkml.optim", "vkml.numpy", "vkml.numpy.linalg", "vkml.scipy.special",
           "vkml.viz", "vkml.graph", "vkml.errors", "vkml_jupyter", "vkml_jupyter.widgets"]
#: ``vkml.diff`` (``vkml.graph.diff``) has no ``__all__``; these are the names it offers users
LISTED = {"vkml.graph.diff": ["reverse", "Reverse", "Gradients", "Report"]}
#: public names whose docstring cannot hold an example, and where their example is instead
EXEMPT = {
    # ``vkml.__doc__`` is the usage text the magic prints for ``%vkml?``; the class has the example
    "vkml_jupyter.VkmlMagics.vkml": "vkml_jupyter.VkmlMagics",
}


def _module_names(name):
    module = importlib.import_module(name)
    if name in LISTED:
        return module, LISTED[name]
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")
                 and str(getattr(getattr(module, n), "__module__", "")).startswith("vkml")]
    return module, names


def _walk():
    """``(dotted name, object)`` for every public function, class, method and property, under
    every name it is offered by (``vkml.Graph`` and ``vkml.graph.Graph`` are one class)."""
    for module_name in MODULES + list(LISTED):
        module, names = _module_names(module_name)
        for name in names:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType) or not callable(obj):
                continue
            yield f"{module_name}.{name}", obj
            if isinstance(obj, type):
                # its own attributes and those it takes from vkml's base classes (``Tensor``'s
                # from ``Interchange``), each under the name the class offers it by
                own = {}
                for klass in reversed([k for k in obj.__mro__ if k.__module__.startswith("vkml")]):
                    own.update(vars(klass))
                for attr, value in own.items():
                    if attr.startswith("_"):
                        continue
                    if isinstance(value, (staticmethod, classmethod)):
                        value = value.__func__
                    if inspect.isfunction(value) or isinstance(value, property):
                        yield f"{module_name}.{name}.{attr}", value


def public_names() -> dict:
    """``{dotted name: object}``, each object once (under the first name found: ``vkml.dot`` is
    ``vkml.matmul``)."""
    seen = {}
    for name, obj in _walk():
        seen.setdefault(id(obj), (name, obj))
    return dict(seen.values())


def aliases() -> dict:
    """``{id(object): {every name it is offered by}}``."""
    out = {}
    for name, obj in _walk():
        out.setdefault(id(obj), set()).add(name)
    return out


def _is_lambda_property(obj):
    return isinstance(obj, property) and getattr(obj.fget, "__name__", "") == "<lambda>"


def docstring(name, obj) -> str:
    """The docstring a reader sees: a class's own; a method's own or the one it overrides."""
    if isinstance(obj, type):
        return obj.__dict__.get("__doc__") or ""
    if isinstance(obj, property):
        return obj.__doc__ or ""
    return inspect.getdoc(obj) or ""


PUBLIC = public_names()


def _example_home(name, obj):
    """The name whose docstring must hold ``name``'s example."""
    if name in EXEMPT:
        return EXEMPT[name]
    if _is_lambda_property(obj):  # ``shape = property(lambda self: ...)`` has no docstring of its own
        return name.rsplit(".", 1)[0]
    return name


def test_the_public_surface_is_found():
    for name in ("vkml.Tensor.backward", "vkml.Graph.launch", "vkml.graph.Record.keep",
                 "vkml.graph.diff.Reverse", "vkml.nn.Linear", "vkml.optim.Adam.step" if
                 "vkml.optim.Adam.step" in PUBLIC else "vkml.optim.Optimizer.step",
                 "vkml.numpy.einsum", "vkml.scipy.special.erf", "vkml_jupyter.widgets.explore_gradient"):
        assert name in PUBLIC, name
    assert len(PUBLIC) > 400


def test_every_public_name_has_a_docstring_with_an_example():
    missing = []
    for name, obj in PUBLIC.items():
        home = _example_home(name, obj)
        text = docstring(home, PUBLIC[home])
        if ">>>" not in text:
            missing.append(name)
        elif home != name and not re.search(rf"\b{name.rsplit('.', 1)[1]}\b", text.split(">>>", 1)[1]):
            missing.append(f"{name} (not used in {home}'s example)")
    assert not missing, f"{len(missing)} public names have no example: {missing}"


def _examples():
    """One doctest per distinct docstring (an override without its own docstring shows, and
    runs, the one it overrides)."""
    out, texts = [], set()
    for name, obj in PUBLIC.items():
        text = docstring(name, obj)
        if ">>>" in text and text not in texts:
            texts.add(text)
            out.append(pytest.param(name, text, id=name))
    return out


@pytest.fixture
def doc_state():
    """The state every example starts from: NumPy backend, lazy, gradients on, default prints."""
    printing = np.get_printoptions()
    np.set_printoptions()
    eager = vkml.is_eager()
    vkml.set_eager(False)
    with vkml.use_backend("numpy"), vkml.enable_grad():
        yield
    vkml.set_eager(eager)
    np.set_printoptions(**printing)


@pytest.mark.usefixtures("doc_state")
@pytest.mark.parametrize("name, text", _examples())
def test_the_docstring_example_runs(name, text):
    # a module's namespace, as in a script or notebook (functions defined there get a __module__),
    # with the graph examples' two kernels made anew (vkml.graph.examples: nothing cached shared)
    globs = {"__name__": "__main__", "vkml": vkml, "np": np, "vnp": vkml.numpy,
             "wave": vkml.kernel(examples.wave.fn), "drift": vkml.kernel(examples.drift.fn)}
    test = doctest.DocTestParser().get_doctest(text, globs, name, None, 0)
    assert test.examples, name
    out = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test, out=out.append)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, "".join(out)


def test_the_user_guide_code_runs():
    """Every ``code-block:: python`` of the user guide runs as written (after the imports it
    names), top to bottom in one namespace, as a reader would paste it."""
    ns = {"__name__": "__main__", "np": np, "vkml": vkml}
    pages = sorted((ROOT / "docs" / "guide").glob("*.rst"))
    assert pages
    for page in pages:
        blocks = re.findall(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", page.read_text())
        assert blocks, page
        for block in blocks:
            exec(compile("\n".join(line[3:] for line in block.splitlines()), str(page), "exec"), ns)
    np.testing.assert_array_equal(vkml.grad(ns["f"])(np.array([1.0, 2.0, 3.0])).numpy(), [20, 18, 12])
    np.testing.assert_allclose(ns["grads"]["k"], np.sum(np.cos(1.5 * ns["x"]) * ns["x"]))


def test_the_docs_build_without_warnings(tmp_path):
    """``sphinx-build -W --keep-going -b html docs``: any warning fails the build."""
    pytest.importorskip("sphinx", reason="sphinx is in the test extra (scripts/dev test installs it)")
    env = dict(os.environ, VKML_BACKEND="numpy",
               PYTHONPATH=os.pathsep.join([str(ROOT / "kit"), str(ROOT / "extensions"),
                                           os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(tmp_path / "html")],
        capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    html = tmp_path / "html"
    for page in ("index.html", "architecture.html", "guide/three-models.html", "api/vkml.html",
                 "tutorials/02-programs-and-scan.html"):
        assert (html / page).is_file(), page
    # every public name is in the API reference, under one of its names
    ids = set()
    for page in (html / "api").glob("*.html"):
        ids |= set(re.findall(r'id="([^"]+)"', page.read_text()))
    names = aliases()
    absent = [name for name, obj in PUBLIC.items()
              if not _is_lambda_property(obj) and not names[id(obj)] & ids]
    assert not absent, f"public names missing from docs/api: {absent}"
    # the API reference holds the docstrings and their examples, and a tutorial its stored outputs
    def text(page):
        return re.sub(r"<[^>]+>", "", (html / page).read_text())
    assert 'id="vkml.Tensor.backward"' in (html / "api" / "vkml.html").read_text()
    assert ">>> vkml.tensor([1.0, 2.0])" in text("api/vkml.html").replace("&gt;", ">")
    assert "[20. 18. 12.]" in text("tutorials/02-programs-and-scan.html")   # a stored output


# -- the architecture page matches the code ------------------------------------------------------------

def _names_defined_in_the_code() -> set:
    """Every name the library, the Jupyter layer and the scripts define: modules, functions,
    classes, their parameters, assigned names and attributes."""
    names = set()
    for top in (ROOT / "kit" / "vkml", ROOT / "extensions" / "vkml_jupyter", ROOT / "scripts"):
        for path in top.rglob("*.py"):
            names.update(path.relative_to(top.parent).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(node.name)
                    names.update(a.arg for a in node.args.args + node.args.kwonlyargs)
                elif isinstance(node, ast.ClassDef):
                    names.add(node.name)
                elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Store):
                    names.add(node.attr if isinstance(node, ast.Attribute) else node.id)
    return names


def _code_names_on(page: str) -> list:
    """The names a page gives as code: each ``literal`` that reads as a dotted name (plain
    lowercase words aside), each file path, and each function a ``code-block`` calls by name."""
    found = []
    for literal in re.findall(r"``([^`]+)``", page):
        name = literal.strip().removesuffix("()")
        if re.fullmatch(r"[\w./-]+\.(py|rst|md|h)", name):
            found.append(("path", name))
        elif re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name) and (
                "." in name or "_" in name or name[0].isupper()) and not name.isupper():
            found.append(("name", name))
    for block in re.findall(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", page):
        tree = ast.parse("\n".join(line[3:] for line in block.splitlines()))
        defined = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        found += [("name", n.func.id) for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Name) and n.func.id not in defined | set(dir(__builtins__))]
    return found


def test_the_architecture_page_names_only_what_exists():
    """Every function, class, module and file the architecture page names is in the code, and
    none is private (a page for contributors speaks of what a module offers, not its insides)."""
    names = _names_defined_in_the_code()
    page = (ROOT / "docs" / "architecture.rst").read_text()
    files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()
             and ".git" not in p.parts and ".venv" not in p.parts]
    wrong = []
    for kind, name in _code_names_on(page):
        if kind == "path":            # a path as written, or the end of one (``cpu.py``)
            if not any(f == name or f.endswith("/" + name) for f in files):
                wrong.append(f"{name} (no such file)")
        elif any(part.startswith("_") and not part.startswith("__") for part in name.split(".")):
            wrong.append(f"{name} (private)")
        elif any(part not in names for part in name.split(".")):
            wrong.append(f"{name} (not in the code)")
    assert not wrong, f"docs/architecture.rst names what the code does not have: {wrong}"


def test_the_name_check_catches_a_stale_page():
    """The check above fails on the page as it was before it was fixed: a private helper that was
    renamed, a lowering function that is gone, a module that moved."""
    stale = ("For an elementwise one, ``_define`` takes it all:\n\n.. code-block:: python\n\n"
             "   sin_p = _define(\n       \"sin\", _unary_float(\"sin\"), np.sin, \"Sine.\")\n\n"
             "one case in ``_elementwise`` in ``backends/codegen/lower.py``; "
             "``graph/simulation_device.py``; ``vkml.graph.schedules.Window``\n")
    names = _names_defined_in_the_code()
    found = _code_names_on(stale)
    assert ("name", "_unary_float") in found and ("path", "graph/simulation_device.py") in found
    private = [n for kind, n in found if kind == "name" and n.split(".")[-1].startswith("_")]
    assert sorted(set(private)) == ["_define", "_elementwise", "_unary_float"]
    assert not (ROOT / "kit" / "vkml" / "graph" / "simulation_device.py").exists()
    assert "schedules" in names and "elementwise_primitive" in names


def test_the_architecture_pages_layer_table_is_the_checkers():
    """The table of layers on the architecture page is ``scripts/check_layers.py``'s ``LAYERS``,
    printed by ``check_layers.py --rst``: change one, print the other."""
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_layers.py"), "--rst"],
                         capture_output=True, text=True, check=True).stdout
    assert out.count("   * - ") > 10
    assert out in (ROOT / "docs" / "architecture.rst").read_text(), \
        "the architecture page's layer table differs from LAYERS: paste `scripts/check_layers.py --rst`"
