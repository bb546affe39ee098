"""%%vkml and %vkml in a headless IPython shell: what each --show displays, bad arguments, and
modes restored after a failing cell."""

import xml.etree.ElementTree as ET
from types import SimpleNamespace

import pytest
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

import vkml
from vkml.backends import base as backends_base
from vkml.backends.numpy_backend import NumpyBackend
from vkml_jupyter.magics import USAGE

SEED = '''
def body(xs):
    def step(acc, row):
        nxt = acc + row
        return nxt, nxt
    _, sums = vkml.scan(step, np.float64(0.0), xs)
    return vkml.sum(sums * sums)
'''


@pytest.fixture(scope="module")
def shell():
    ip = start_ipython()
    ip.run_line_magic("load_ext", "vkml")
    return ip


@pytest.fixture
def ip(shell):
    shell.run_cell("import numpy as np, vkml")
    yield shell
    vkml.set_eager(False)
    vkml.set_backend("numpy")


@pytest.fixture(autouse=True)
def _cold_backend_caches():
    """Leave the backends' executable caches cold: other modules count first compiles (the tutorial's
    running-sum program compiled here would otherwise be a cache hit there)."""
    yield
    for backend in backends_base._INSTANCES.values():
        backend.clear_cache()


class SecondBackend(NumpyBackend):
    """A second backend, so switching and restoring can be seen (only numpy ships on CPU)."""
    name = "second"


@pytest.fixture
def second_backend():
    backends_base.register("second", SecondBackend)
    yield
    backends_base._FACTORIES.pop("second", None)
    backends_base._INSTANCES.pop("second", None)


def run(ip, cell):
    """Run a cell; return its result, captured stdout and the displayed MIME bundles."""
    with capture_output() as out:
        result = ip.run_cell(cell)
    return result, out.stdout, [o.data for o in out.outputs]


def svg_texts(bundle):
    root = ET.fromstring(bundle["image/svg+xml"])  # well-formed, or this raises
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]


def diagrams(bundles):
    return [b for b in bundles if "image/svg+xml" in b]


# -- --show ----------------------------------------------------------------------------------------

def test_show_graph_draws_the_pending_graph_then_realizes(ip):
    r, stdout, shown = run(ip, "%%vkml --show graph\n"
                               "x = vkml.tensor(np.array([3.0, 1.0]), requires_grad=True)\n"
                               "y = vkml.sum(x * x)\n"
                               "y")
    assert r.success, r.error_in_exec
    [graph] = diagrams(shown)
    texts = svg_texts(graph)
    # the lazy graph in the programs' words: x an input (orange: its .grad will receive), a Map
    assert "%0 in 0" in texts and "mul(x0, x1)" in texts
    assert graph["text/plain"].startswith("lazy graph of 1 tensor: 2 ops pending, not realized")
    # the value came back realized (on the cell's backend), and is the cell's result
    y = ip.user_ns["y"]
    assert y.ir_var.value is not None and r.result is y and y.item() == 10.0


def test_show_program_of_the_seed_jitted_function(ip):
    ip.run_cell(SEED)
    r, _, shown = run(ip, "%%vkml --show program\n"
                          "f = vkml.jit(body)\n"
                          "f(np.array([1.0, 2.0, 3.0]))\n"
                          "f")
    assert r.success and r.result is None       # the drawing replaces the function's repr
    [prog] = diagrams(shown)
    texts = svg_texts(prog)
    assert "scan" in texts and "step of scan %2" in texts and "add(x0, x1)" in texts
    # the text names the function's parameter and the user's variables
    assert prog["text/plain"] == vkml.pp_program(ip.user_ns["f"].programs()[0], arg_names=["xs"])
    assert "scan 3 rows, init (%1), xs (xs), captures ()" in prog["text/plain"]
    assert "with x0 = sums, x1 = sums" in prog["text/plain"]


def test_show_program_of_vkml_program_and_of_an_uncalled_function(ip):
    ip.run_cell(SEED)
    r, _, shown = run(ip, "%%vkml --show program\nvkml.program(body, np.ones(4))")
    assert r.success
    [prog] = diagrams(shown)
    assert "4 rows" in svg_texts(prog)
    r, stdout, shown = run(ip, "%%vkml --show program\nvkml.jit(lambda x: x * 2)")
    assert r.success and not diagrams(shown)
    assert "has not been called yet" in stdout


def test_show_derivative_side_by_side(ip):
    ip.run_cell(SEED)
    r, stdout, shown = run(ip, "%%vkml --show derivative,stats\n"
                               "f = vkml.jit(lambda xs: body(xs))\n"
                               "g = vkml.grad(f)(np.array([1.0, 2.0, 3.0]))\n"
                               "f")
    assert r.success, stdout
    [derived] = diagrams(shown)
    texts = svg_texts(derived)
    for name in ("primal", "jvp", "known", "linear", "transposed"):
        assert name in texts
    assert "3 rows reversed" in texts
    assert derived["text/plain"].startswith("primal:\nprogram (xs)")
    assert ip.user_ns["g"].numpy().tolist() == [20, 18, 12]
    # without a derivative there is a note, not an error
    r, stdout, shown = run(ip, "%%vkml --show derivative\n"
                               "h = vkml.jit(lambda x: x * 3)\nh(np.ones(2))\nh")
    assert r.success and not diagrams(shown) and "no derived programs yet" in stdout


def test_show_stats_counts_the_cell_and_a_rerun_hits_the_cache(ip):
    cell = ("%%vkml --show stats\n"
            "a = vkml.tensor(np.arange(4.0))\n"
            "vkml.sum(vkml.exp(a) * 2.0)")
    r, _, shown = run(ip, cell)
    assert r.success
    [stats] = [b for b in shown if "text/html" in b and not diagrams([b])]
    assert stats["text/plain"].startswith(
        "vkml: 1 submission, 1 compile, 0 cache hits, 0 traces, 0 derivations; wall time ")
    assert "<td>submissions</td><td>1</td>" in stats["text/html"]
    r, _, shown = run(ip, cell)
    [stats] = [b for b in shown if "text/html" in b and not diagrams([b])]
    assert stats["text/plain"].startswith("vkml: 1 submission, 0 compiles, 1 cache hit, ")


def test_time_and_grad(ip):
    r, stdout, shown = run(ip, "%%vkml --time --grad w --grad box.v\n"
                               "w = vkml.tensor(np.array([1.0, -2.0]), requires_grad=True)\n"
                               "box = type('Box', (), {})()\n"
                               "box.v = vkml.tensor(np.array([4.0]), requires_grad=True)\n"
                               "vkml.backward(vkml.sum(w * w) + vkml.sum(box.v * 3.0))")
    assert r.success, r.error_in_exec
    assert "vkml: wall time " in stdout and " ms" in stdout
    texts = [b["text/plain"] for b in shown]
    assert "w.grad = tensor([ 2., -4.], dtype=float64)" in texts
    assert "box.v.grad = tensor([3.], dtype=float64)" in texts
    r, stdout, _ = run(ip, "%%vkml --grad nothere --grad w\n"
                           "w = vkml.tensor(np.ones(1), requires_grad=True)")
    assert "--grad nothere: no such variable" in stdout
    assert "--grad w: w.grad is None" in stdout


def test_record_and_graph_of_a_stand_in_graph_build_live(ip):
    node = SimpleNamespace
    ip.user_ns["node"] = node
    ip.user_ns["Graph"] = lambda nodes, record=None: SimpleNamespace(nodes=nodes, record=record)
    ip.user_ns["nodes"] = []
    cell = ("%%vkml --show graph,record\n"
            "nodes.append(node(name=f'n{len(nodes)}', kind='launch', reads=['a'], writes=['b'],"
            " params={}))\n"
            "Graph(list(nodes), record=None if len(nodes) < 2 else node(generation=len(nodes),"
            " copied=['b'], nbytes=64, nodes=[n.name for n in nodes], live=True, kept=False))")
    r, stdout, shown = run(ip, cell)
    assert r.success and r.result is None
    [graph] = diagrams(shown)
    assert "n0" in svg_texts(graph) and "n1" not in svg_texts(graph)
    assert "this Graph has no Record yet" in stdout
    # the same cell again: the diagram has grown, and now there is a Record
    r, stdout, shown = run(ip, cell)
    graph, record = diagrams(shown)
    assert "n0" in svg_texts(graph) and "n1" in svg_texts(graph)
    assert "Record: generation 2, live, 64 bytes" in svg_texts(record)
    assert record["text/plain"].splitlines()[1] == "  launch order: n0, n1"


def test_show_asks_for_what_the_last_expression_is_not(ip):
    r, stdout, shown = run(ip, "%%vkml --show graph,program,record\n41 + 1")
    assert r.success and r.result == 42 and not diagrams(shown)
    assert "--show graph: the last expression is a int, not a Tensor or a Graph" in stdout
    assert "--show program: the last expression is a int" in stdout
    assert "--show record: the last expression is a int" in stdout
    r, stdout, _ = run(ip, "%%vkml --show graph\nz = 1")
    assert r.success and "no last expression" in stdout and ip.user_ns["z"] == 1


# -- arguments -------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, why", [
    ("--show nope", "--show: unknown 'nope'"),
    ("--show graph,bogus", "--show: unknown 'bogus'"),
    ("--backend nowhere", "unknown backend 'nowhere'"),
    ("--grad 3x", "--grad: '3x' is not a variable name"),
    ("--eagre", "unrecognized arguments: --eagre"),
    ("--sh graph", "unrecognized arguments"),
    ("--show", "expected one argument"),
    ("positional", "unrecognized arguments: positional"),
    ("--show 'graph", "cannot split the arguments"),
])
def test_bad_arguments_print_usage_and_run_nothing(ip, line, why):
    ip.user_ns.pop("ran", None)
    r, stdout, shown = run(ip, f"%%vkml {line}\nran = True\nvkml.set_eager(True)")
    assert r.success and r.error_in_exec is None          # no traceback
    assert why in stdout and USAGE in stdout
    assert "ran" not in ip.user_ns and not vkml.is_eager()
    assert not shown


def test_help_and_line_magic(ip, second_backend):
    assert USAGE in run(ip, "%%vkml --help\nran = 1")[1]
    assert USAGE in run(ip, "%vkml")[1]
    info = run(ip, "%vkml info")[1]
    assert "backend: numpy (device CPU); available: " in info
    assert "second" in info.split("available: ")[1].splitlines()[0].split(", ")
    assert "eager mode: off" in info and "counters since the last reset:" in info
    assert "diagrams: graphviz dot found" in info
    assert run(ip, "%vkml eager on")[1].strip() == "vkml: eager mode on" and vkml.is_eager()
    assert run(ip, "%vkml eager")[1].strip() == "vkml: eager mode on"
    assert run(ip, "%vkml eager off")[1].strip() == "vkml: eager mode off" and not vkml.is_eager()
    assert run(ip, "%vkml backend second")[1].strip() == "vkml: backend second (device CPU)"
    assert vkml.backend_info()["backend"] == "second"
    out = run(ip, "%vkml backend nowhere")[1]
    assert "unknown backend 'nowhere'" in out and USAGE in out
    assert vkml.backend_info()["backend"] == "second"
    out = run(ip, "%vkml eager maybe")[1]
    assert "unknown command 'eager maybe'" in out and USAGE in out


# -- modes -----------------------------------------------------------------------------------------

def test_modes_apply_inside_the_cell_and_are_restored_after_an_error(ip, second_backend):
    assert not vkml.is_eager() and vkml.backend_info()["backend"] == "numpy"
    r, _, _ = run(ip, "%%vkml --eager --backend second\n"
                      "inside = (vkml.is_eager(), vkml.backend_info()['backend'])\n"
                      "1 / 0")
    assert isinstance(r.error_in_exec, ZeroDivisionError)
    assert ip.user_ns["inside"] == (True, "second")
    assert not vkml.is_eager() and vkml.backend_info()["backend"] == "numpy"
    # eager already on stays on after a failing cell that did not ask for it
    run(ip, "%vkml eager on")
    r, _, _ = run(ip, "%%vkml --backend second\nvkml.set_eager(False)\nraise ValueError('boom')")
    assert isinstance(r.error_in_exec, ValueError)
    assert vkml.is_eager() and vkml.backend_info()["backend"] == "numpy"


def test_a_cells_backend_and_eager_mode_are_not_seen_by_other_threads(ip, second_backend):
    # --backend/--eager are scoped to the cell's own context: a thread running beside it (a
    # training loop in the background) keeps the global modes
    r, _, _ = run(ip, "%%vkml --eager --backend second\n"
                      "import threading\n"
                      "seen = {}\n"
                      "t = threading.Thread(target=lambda: seen.update(\n"
                      "    backend=vkml.backend_info()['backend'], eager=vkml.is_eager()))\n"
                      "t.start(); t.join()\n"
                      "inside = (vkml.is_eager(), vkml.backend_info()['backend'])")
    assert r.error_in_exec is None
    assert ip.user_ns["inside"] == (True, "second")
    assert ip.user_ns["seen"] == {"backend": "numpy", "eager": False}
    assert not vkml.is_eager() and vkml.backend_info()["backend"] == "numpy"


def test_an_error_in_eager_mode_names_the_op_and_the_traceback_shows_the_cell(ip):
    r, _, _ = run(ip, "%%vkml --eager\n"
                      "a = vkml.tensor(np.ones((2, 3)))\n"
                      "b = vkml.tensor(np.ones((4,)))\n"
                      "c = a + b")
    assert isinstance(r.error_in_exec, vkml.VkmlError)
    assert not vkml.is_eager()


def test_the_last_expression_is_realized_on_the_cells_backend(ip, second_backend):
    r, _, _ = run(ip, "%%vkml --backend second\nv = vkml.tensor(np.ones(3)) * 5.0\nv")
    assert r.success and r.result is ip.user_ns["v"]
    second = backends_base._INSTANCES["second"]
    assert second.cache_size == 1                 # it compiled (and ran) there
    assert ip.user_ns["v"].ir_var.value is not None


def test_ipython_syntax_in_the_cell_and_a_trailing_semicolon(ip):
    r, stdout, _ = run(ip, "%%vkml\nval = !echo hi\nval[0]")
    assert r.success and r.result == "hi"
    r, stdout, shown = run(ip, "%%vkml\nvkml.tensor(np.ones(2)) * 2;")
    assert r.success and not shown and "Out" not in stdout


# -- everything in one cell ------------------------------------------------------------------------

def test_one_cell_shows_graph_program_derivative_record_and_stats(ip):
    ip.run_cell(SEED)
    cell = ("%%vkml --show graph,program,derivative,record,stats\n"
            "@vkml.kernel\n"
            "def double(x):\n"
            "    return {'y': x * 2.0}\n"
            "graph = vkml.Graph().add(double.bind(x=np.ones(3), y=np.zeros(3)), name='d')"
            ".build(record=True)\n"
            "graph.launch()\n"
            "f = vkml.jit(body)\n"
            "f(np.array([1.0, 2.0, 3.0]))\n"
            "f(np.array([4.0, 5.0, 6.0]))\n"
            "g = vkml.grad(f)(np.array([1.0, 2.0, 3.0]))\n"
            "w = vkml.tensor(np.arange(3.0))\n"
            "vkml.sin(w) * g")
    r, stdout, shown = run(ip, cell)
    assert r.success, r.error_in_exec
    assert "vkml:" not in stdout, stdout                 # nothing is missing: no notes
    graph, program, derivative, record = diagrams(shown)
    assert any("sin" in t for t in svg_texts(graph))      # the last expression's lazy graph
    assert "scan" in svg_texts(program) and program["text/plain"].startswith("program (xs)")
    assert derivative["text/plain"].startswith("primal:\nprogram (xs)")
    assert "transposed" in svg_texts(derivative)
    assert any(t and t.startswith("Record: generation") for t in svg_texts(record))
    [stats] = [b for b in shown if "text/html" in b and not diagrams([b])]
    # the second call and the gradient found f's program traced: jit cache hits count
    hits = int(stats["text/plain"].split(" cache hit")[0].rsplit(", ", 1)[1])
    assert hits >= 2
    assert r.result is not None and r.result.numpy().shape == (3,)   # the value is still shown


def test_cuda_without_pycuda_is_a_short_usage_line(ip):
    from vkml.backends import cuda_unavailable
    why = cuda_unavailable()
    if why is None:
        pytest.skip("this machine can run the cuda backend")
    r, stdout, shown = run(ip, "%%vkml --backend cuda\nran = 1")
    assert r.success and r.error_in_exec is None and "Traceback" not in stdout
    assert f"%%vkml: backend 'cuda' cannot run here: {why}" in stdout
    _, stdout, _ = run(ip, "%vkml info")
    assert "not available here: cuda (missing" in stdout
    assert "available: " in stdout
    assert "cuda" not in stdout.split("available: ")[1].splitlines()[0].split(", ")


def test_a_jitted_function_made_by_eval_has_no_module_and_cells_still_run(ip):
    """A function made by ``eval`` without ``__name__`` in its globals has ``__module__`` None;
    once it is jitted and called, every later cell must still run (and may show its program)."""
    ip.run_cell('g = vkml.jit(eval("lambda x: x * x + 1.0", {"vkml": vkml}))\ng(1.0)')
    assert ip.user_ns["g"].fn.__module__ is None
    r, stdout, _ = run(ip, "%%vkml\nplain = 1 + 1")
    assert r.success and r.error_in_exec is None and "Traceback" not in stdout
    r, stdout, shown = run(ip, "%%vkml --show program\n"
                               "g(np.array([1.0, 2.0]))\n"
                               "vkml.grad(lambda x: vkml.sum(g(x)))(np.array([3.0]))")
    assert r.success and r.error_in_exec is None, r.error_in_exec
    assert [b for b in diagrams(shown) if "add" in " ".join(svg_texts(b))]   # g's program
    assert r.result.numpy().tolist() == [6.0]                                # d/dx (x^2 + 1)


@pytest.mark.parametrize("cell", ["%%vkml --help\n", "%%vkml --help", "%%vkml -h\n\n  \n",
                                  "%vkml --help", "%vkml help"])
def test_help_prints_the_usage_with_or_without_a_cell_body(ip, cell, capsys):
    result = ip.run_cell(cell)
    assert result.success, result.error_in_exec or result.error_before_exec
    out = capsys.readouterr().out
    assert "usage: %%vkml [--eager] [--backend NAME]" in out and "%vkml info" in out
