"""The import layering of vkml, checked by ``scripts/check_layers.py`` (which has the table).

The first test checks this repository; the others give the checker small
made-up packages, each with one offence, so a checker that could not fail
would fail here.
"""
import importlib.util
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_layers.py"

_spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
check_layers = importlib.util.module_from_spec(_spec)
sys.modules["check_layers"] = check_layers      # dataclasses look their module up by name
_spec.loader.exec_module(check_layers)
Layer, Rules, check = check_layers.Layer, check_layers.Rules, check_layers.check


def test_vkml_keeps_its_layers():
    offences = check(ROOT)
    assert not offences, "import layering offences:\n" + "\n".join(offences)


def test_the_script_prints_offences_and_fails_on_them(tmp_path):
    ok = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout
    assert "0 offence(s)" in ok.stderr
    _write(tmp_path, {"vkml/__init__.py": "", "vkml/stray.py": ""})
    bad = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1
    assert "vkml.stray is in no layer" in bad.stdout


def test_every_module_of_the_library_has_a_layer():
    modules = check_layers.find_modules(ROOT)
    assert "vkml.ops.api" in modules and "vkml_jupyter.magics" in modules
    assert all(check_layers.layer_of(name) is not None for name in modules)


def test_ops_families_find_api_whichever_module_is_imported_first():
    """``from . import api as F`` inside the api <-> family cycle works from a fresh interpreter,
    whichever ops module a user imports first."""
    for first in ("vkml.ops.elementwise", "vkml.ops.reductions", "vkml.ops.special", "vkml.ops"):
        code = (f"import importlib, sys; m = importlib.import_module({first!r}); "
                "import vkml.ops as ops; "
                "assert all(getattr(ops, f).F is ops.api for f in ('elementwise', 'reductions', "
                "'movement', 'linalg', 'special', 'sorting', 'factorizations', 'checks')); "
                "import vkml; assert float(vkml.sin(vkml.tensor(0.0)).numpy()) == 0.0")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env=_env())
        assert proc.returncode == 0, proc.stderr


# -- the checker on made-up packages -----------------------------------------------------------

#: a small stack of layers for the made-up packages
LAYERS = (
    Layer("base", ("vkml.errors",), "leaves"),
    Layer("ops", ("vkml.ops",), "primitives"),
    Layer("transforms", ("vkml.transforms",), "transformations"),
    Layer("backends", ("vkml.backends",), "execution", skips=("transforms",)),
    Layer("tensor", ("vkml.tensor",), "tensors"),
    Layer("package", ("vkml",), "the package"),
)
RULES = Rules(layers=LAYERS, private_allowed=frozenset(), late_edges=frozenset(),
              doors=frozenset())

BASE = {
    "vkml/__init__.py": "from . import errors, ops, tensor\n",
    "vkml/errors.py": "class Oops(Exception):\n    pass\n",
    "vkml/ops/__init__.py": "",
    "vkml/ops/api.py": "from ..errors import Oops\n\n\ndef add(x, y):\n    return x + y\n\n\n"
                       "def _helper(x):\n    return x\n",
    "vkml/ops/core.py": "",
    "vkml/transforms/__init__.py": "",
    "vkml/backends/__init__.py": "",
    "vkml/tensor.py": "from .ops import api\n",
}


def _write(root, files):
    for name, text in files.items():
        path = root / "kit" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT / 'kit'}{os.pathsep}{ROOT / 'extensions'}"
    return env


def _offences(tmp_path, files, rules=RULES):
    """The checker's offences for the made-up package with ``files`` changed (a fresh copy)."""
    root = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
    _write(root, {**BASE, **files})
    return check(root, rules)


def test_the_made_up_package_is_clean(tmp_path):
    assert _offences(tmp_path, {}) == []


def test_an_import_from_a_layer_above_is_named(tmp_path):
    got = _offences(tmp_path, {"vkml/ops/core.py": "from ..tensor import api\n"})
    assert got == ["kit/vkml/ops/core.py:1: layer 'ops' (vkml.ops.core) imports vkml.tensor from "
                   "layer 'tensor', above it"]


def test_an_import_inside_a_function_counts_for_the_layers_too(tmp_path):
    got = _offences(tmp_path, {"vkml/ops/core.py": (
        "def f():\n    from ..tensor import api  # local: cycle\n    return api\n")})
    assert len(got) == 1 and "imports vkml.tensor from layer 'tensor', above it" in got[0]


def test_a_skipped_lower_layer_is_refused(tmp_path):
    got = _offences(tmp_path, {"vkml/backends/__init__.py": "from .. import transforms\n"})
    assert got == ["kit/vkml/backends/__init__.py:1: layer 'backends' (vkml.backends) imports "
                   "vkml.transforms from layer 'transforms', which it skips"]


@pytest.mark.parametrize("source, line", [
    ("from .ops.api import _helper\n", 1),                      # imported by name
    ("from .ops import api\n\n\ndef f():\n    return api._helper(1)\n", 5),   # an attribute
    ("import vkml.ops.api\n\n\ndef f():\n    return vkml.ops.api._helper(1)\n", 5),
    ("from . import ops as o\n\nX = o.api._helper\n", 3),      # through a package
])
def test_a_private_name_of_another_module_is_named(tmp_path, source, line):
    got = _offences(tmp_path, {"vkml/tensor.py": source})
    assert got == [f"kit/vkml/tensor.py:{line}: vkml.tensor uses vkml.ops.api._helper, a private "
                   "name of another module; make it public where it is owned"]


def test_private_names_of_objects_and_dunders_are_not_module_privates(tmp_path):
    source = ("from .ops import api\n\n\ndef f(t):\n    return t._value, api.__name__, api.add\n")
    assert _offences(tmp_path, {"vkml/tensor.py": source}) == []


def test_an_allowed_private_name_passes_and_a_stale_allowance_is_named(tmp_path):
    allowed = ("vkml.tensor", "vkml.ops.api", "_helper")
    rules = Rules(layers=LAYERS, private_allowed=frozenset({allowed}), late_edges=frozenset(),
                  doors=frozenset())
    assert _offences(tmp_path, {"vkml/tensor.py": "from .ops.api import _helper\n"}, rules) == []
    got = _offences(tmp_path, {"vkml/tensor.py": "from .ops.api import add\n"}, rules)
    assert got == ["PRIVATE_ALLOWED lists vkml.ops.api._helper for vkml.tensor, which no longer "
                   "uses it; remove it"]


def test_a_module_level_cycle_is_named_and_a_function_level_import_breaks_it(tmp_path):
    cyclic = {"vkml/ops/core.py": "from . import api\n",
              "vkml/ops/api.py": "from . import core\n"}
    assert _offences(tmp_path, cyclic) == [
        "module-level import cycle: vkml.ops.api -> vkml.ops.core -> vkml.ops.api"]
    broken = {"vkml/ops/core.py": "def f():\n    from . import api  # local: cycle\n    return api\n",
              "vkml/ops/api.py": "from . import core\n"}
    assert _offences(tmp_path, broken) == []


def test_a_late_edge_leaves_the_cycle_check_but_must_wait_for_functions(tmp_path):
    rules = Rules(layers=LAYERS, private_allowed=frozenset(),
                  late_edges=frozenset({("vkml.ops.core", "vkml.ops.api")}), doors=frozenset())
    files = {"vkml/ops/api.py": "from . import core\n",
             "vkml/ops/core.py": "from . import api as F\n\n\ndef rule(x):\n    return F.add(x, x)\n"}
    assert _offences(tmp_path, files, rules) == []
    files["vkml/ops/core.py"] = "from . import api as F\n\nTWICE = F.add(1, 1)\n"
    assert _offences(tmp_path, files, rules) == [
        "kit/vkml/ops/core.py:3: F (vkml.ops.api) is used while vkml.ops.core loads; it is "
        "imported over a late edge (see LATE_EDGES), so use it only inside functions"]
    files["vkml/ops/core.py"] = ""
    assert _offences(tmp_path, files, rules) == [
        "LATE_EDGES lists vkml.ops.core -> vkml.ops.api, which is no module-level import; remove it"]


def test_a_local_import_must_say_why(tmp_path):
    bare = "def f():\n    import json\n    return json\n"
    got = _offences(tmp_path, {"vkml/ops/core.py": bare})
    assert got == ["kit/vkml/ops/core.py:2: import inside a function without a '# local: <why>' "
                   "comment; move it to the top of the module unless it dodges an import cycle or "
                   "an optional dependency"]
    for said in ("def f():\n    import json  # local: optional dependency\n    return json\n",
                 "def f():\n    # local: optional dependencies\n    import json\n    import csv\n"
                 "    return json, csv\n"):
        assert _offences(tmp_path, {"vkml/ops/core.py": said}) == []


def test_a_module_outside_every_layer_and_a_stale_layer_are_named(tmp_path):
    got = _offences(tmp_path, {"vkml/stray.py": ""})
    assert got == ["kit/vkml/stray.py: vkml.stray is in no layer; add it to LAYERS"]
    layers = LAYERS + (Layer("gone", ("vkml.gone",), "nothing"),)
    rules = Rules(layers=layers, private_allowed=frozenset(), late_edges=frozenset(),
                  doors=frozenset())
    assert _offences(tmp_path, {}, rules) == [
        "LAYERS names vkml.gone, which is no module here; remove it"]


def test_a_dynamic_import_counts_as_an_import(tmp_path):
    source = "import importlib\n\n\ndef f():\n    return importlib.import_module('vkml.tensor')\n"
    got = _offences(tmp_path, {"vkml/ops/core.py": source})
    assert got == ["kit/vkml/ops/core.py:5: layer 'ops' (vkml.ops.core) imports vkml.tensor from "
                   "layer 'tensor', above it"]


def test_the_library_never_imports_the_jupyter_stack(tmp_path):
    source = "def show():\n    from IPython.display import display  # local: optional dependency\n"
    got = _offences(tmp_path, {"vkml/tensor.py": source})
    assert got == ["kit/vkml/tensor.py:2: vkml.tensor imports IPython.display; only the Jupyter "
                   "layer (extensions/vkml_jupyter) may"]


def test_a_module_of_a_stacked_package_imports_only_the_ones_before_it(tmp_path):
    rules = replace(RULES, stacks={"vkml.ops": ("core", "api")})
    assert _offences(tmp_path, {}, rules) == []
    got = _offences(tmp_path, {"vkml/ops/core.py": "from .api import add\n"}, rules)
    assert got == ["kit/vkml/ops/core.py:1: vkml.ops.core imports vkml.ops.api, which comes after "
                   "it in STACKS['vkml.ops']"]
    got = _offences(tmp_path, {"vkml/ops/more.py": ""}, rules)
    assert got == ["kit/vkml/ops/more.py: vkml.ops.more has no place in STACKS['vkml.ops']; add it"]
    # an import inside a function is no part of the stack (it runs long after every module loaded)
    assert _offences(tmp_path, {"vkml/ops/core.py": "def f():\n    from .api import add  # local: cycle\n"
                                                     "    return add\n"}, rules) == []
