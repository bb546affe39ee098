"""Pictures that teach: readable programs (decimal constants, the user's names), derivative views
that fit the output width with derived equations matched to the user's, what the gradient keeps,
program diffs, dark-scheme CSS, determinism -- and the small fixes that come with them (jit cache
hits in vkml.stats(), the cuda availability report, three error messages)."""

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import vkml
from vkml import viz
from vkml.backends import base as backends_base

SVG = "{http://www.w3.org/2000/svg}"
#: the budget of a default picture: a notebook cell's width, two screens tall (viz_groups.BUDGET_PT)
MAX_PX, MAX_HEIGHT_PX = 1200, 2400


@pytest.fixture(autouse=True)
def _cold_backend_caches():
    """Leave the backends' executable caches cold for modules that count first compiles."""
    yield
    for backend in backends_base._INSTANCES.values():
        backend.clear_cache()


# -- the programs the tutorials and the issue draw -------------------------------------------------

def tanh_loss(w):
    h = vkml.tanh(w) * w
    return vkml.sum(h)


def running_sum(xs):
    def step(acc, row):
        nxt = acc + row
        return nxt, nxt
    _, sums = vkml.scan(step, np.float64(0.0), xs)
    return vkml.sum(sums * sums)


def euler(x0, k):
    """Ten explicit Euler steps of dx/dt = -k x, by scan (the issue's 7,573 px picture)."""
    def step(x, _):
        v = -k * x
        x = x + 0.1 * v
        energy = x * x
        return x, energy
    x, energies = vkml.scan(step, x0, None, length=10)
    return vkml.sum(energies) + vkml.sum(x)


CASES = [(tanh_loss, (np.array([0.5, -1.0, 2.0]),)),
         (running_sum, (np.array([1.0, 2.0, 3.0]),)),
         (euler, (np.array([1.0, 2.0]), np.array([0.5, 0.3])))]


def px(length):
    """An SVG width/height attribute in CSS px (graphviz writes pt: 1 pt = 4/3 px)."""
    m = re.fullmatch(r"([\d.]+)(pt|px)?", length)
    return float(m.group(1)) * (4 / 3 if m.group(2) == "pt" else 1)


def size_px(svg):
    root = ET.fromstring(svg)
    return px(root.get("width")), px(root.get("height"))


def texts(svg):
    return [t.text for t in ET.fromstring(svg).iter(SVG + "text")]


def derived_of(fn, args):
    f = vkml.jit(fn)
    vkml.grad(f)(*args)
    return f, viz.derived_dot(f)


# -- width ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, args", CASES, ids=[c[0].__name__ for c in CASES])
def test_every_derivative_panel_fits_the_output_width(fn, args):
    f, d = derived_of(fn, args)
    names = [n for n, _ in d.panels]
    assert names == ["primal", "jvp", "known", "linear", "transposed"]
    for name, panel in d.panels:
        w, h = size_px(panel.pipe("svg"))
        assert 0 < w <= MAX_PX and 0 < h <= MAX_HEIGHT_PX, (name, w, h)
    # the stacked picture (the image form; a notebook shows tabs) is as wide as its widest panel
    w, h = size_px(d.pipe("svg"))
    widest = max(size_px(p.pipe("svg"))[0] for _, p in d.panels)
    assert w == pytest.approx(widest, abs=1) and w <= MAX_PX
    assert h > max(size_px(p.pipe("svg"))[1] for _, p in d.panels)
    ET.fromstring(d._repr_mimebundle_()["image/svg+xml"])      # well-formed


def test_a_long_scan_body_is_folded_with_its_step_count_and_unfolds_on_request():
    def long_step(x0):
        def step(x, _):
            a = vkml.sin(x)
            b = vkml.sum(a) * x
            c = vkml.exp(-b)
            d = vkml.sum(c * a) + x
            e = vkml.tanh(d)
            f = vkml.sum(e) * e
            g = vkml.cos(f)
            return vkml.sum(g) * x, g
        return vkml.scan(step, x0, None, length=25)[1]
    prog = vkml.program(long_step, np.ones(3))
    folded = texts(viz.program_dot(prog).pipe("svg"))
    assert any(t and t.startswith("25 steps of ") and "folded" in t for t in folded)
    unfolded = texts(viz.program_dot(prog, unfold=True).pipe("svg"))
    assert not any(t and "folded" in t for t in unfolded)
    assert len(unfolded) > len(folded)


def test_an_unrolled_python_loop_is_drawn_once_and_folded():
    def unrolled(x, k):
        for _ in range(10):
            v = vkml.sin(x) * k
            x = x + vkml.sum(v * 0.1)
        return vkml.sum(x)
    prog = vkml.program(unrolled, np.ones(3), np.ones(3))
    d = viz.program_dot(prog)
    assert "the 4 boxes above, 9 more times" in texts(d.pipe("svg"))
    assert d.nodes < viz.program_dot(prog, unfold=True).nodes / 3


# -- readable values -------------------------------------------------------------------------------

def test_constants_print_as_short_decimals_and_bits_only_on_request():
    def scaled(x):
        y = x * 0.1
        return vkml.sum(y * np.float32(2.5).item()) + 1e-20
    prog = vkml.program(scaled, np.ones(3))
    text = vkml.pp_program(prog)
    assert "0x" not in text
    assert "0.1" in text and "2.5" in text and "1e-20" in text
    assert "float64:0x3fb999999999999a" in vkml.pp_program(prog, bits=True)     # 0.1, exactly
    assert not any("0x" in (t or "") for t in texts(viz.program_dot(prog).pipe("svg")))
    # other dtypes say which
    f32 = vkml.program(lambda x: x * np.float32(0.1), np.ones(2, np.float32))
    assert "float32:0.1" in vkml.pp_program(f32)
    for fn, args in CASES:                              # no bits in any default picture or text
        f, d = derived_of(fn, args)
        assert "0x" not in d.text
        assert not any("0x" in (t or "") for t in texts(d.pipe("svg")))


def test_values_are_named_after_the_users_variables():
    prog = vkml.program(running_sum, np.ones(3))
    text = vkml.pp_program(prog)
    assert "sums : float64 [3]" in text and "nxt : float64 []" in text
    assert "return nxt, nxt" in text
    assert "%" in text                                   # unnamed values keep their numbers
    assert "sums" not in vkml.pp_program(prog, names=False)
    # a name taken twice gets a suffix; values inside a fused line are not named
    def twice(w):
        h = vkml.tanh(w)
        h = vkml.sum(h) * h
        return vkml.sum(h)
    text = vkml.pp_program(vkml.program(twice, np.ones(2)), arg_names=["w"])
    assert "program (w)" in text and "h : " in text and "h_1 : " in text
    # the picture names them too, and says on hover which line made a box
    svg = viz.program_dot(vkml.program(twice, np.ones(2)), arg_names=["w"]).svg()
    assert "h_1" in " ".join(t or "" for t in texts(svg))
    assert "h = vkml.sum(h) * h" in svg                    # the source line, as a tooltip


def test_derived_equations_are_named_and_coloured_after_the_users():
    f, d = derived_of(tanh_loss, CASES[0][1])
    assert "dh" in d.panel("jvp").text                    # the tangent of h
    assert "ct_h" in d.panel("transposed").text           # the cotangent work of h's line
    # the user's h line has one colour; its jvp and transposed equations have the same border
    prim, jvp, tr = (d.panel(n).source for n in ("primal", "jvp", "transposed"))
    colours = set(re.findall(r'color="(#[0-9a-f]{6})", penwidth="2.5"', prim))
    assert colours and colours <= set(re.findall(r'color="(#[0-9a-f]{6})", penwidth', jvp))
    assert colours & set(re.findall(r'color="(#[0-9a-f]{6})", penwidth', tr))
    # provenance is kept out of the structural key: an equal program still hits the caches
    e = vkml.program(tanh_loss, np.ones(3)).eqns[0]
    assert e.origin is None


# -- what the gradient keeps ------------------------------------------------------------------------

def test_saved_residuals_of_a_function_list_dtype_shape_bytes_and_lines():
    table = viz.saved_residuals(tanh_loss, np.array([0.5, -1.0, 2.0]))
    assert len(table) >= 1
    assert table.total == sum(r["bytes"] for r in table.rows) > 0
    for r in table.rows:
        assert r["dtype"] == "float64" and r["shape"] == "[3]" and r["bytes"] == 24
    assert any("h = vkml.tanh(w) * w" in r["made by"] for r in table.rows)
    text = repr(table)
    assert text.startswith("what the gradient keeps") and f"{table.total:,} bytes" in text
    html = table._repr_html_()
    assert html.startswith('<table class="vkml-residuals">') and "h = vkml.tanh(w) * w" in html
    ET.fromstring(html)                                   # well-formed
    # a scan saves one row of residuals per step
    rows = viz.saved_residuals(euler, np.array([1.0, 2.0]), np.array([0.5, 0.3])).rows
    assert any(r["shape"] == "[10, 2]" and r["bytes"] == 160 for r in rows)
    # the derivative picture rings the same values and reports the same total
    _, d = derived_of(tanh_loss, CASES[0][1])
    assert d.residuals.total == table.total
    assert "saved: 24 B" in " ".join(t or "" for t in texts(d.panel("known").svg()))


def test_saved_residuals_of_a_pending_backward_and_of_a_record():
    w = vkml.tensor(np.array([0.5, -1.0]), requires_grad=True)
    h = vkml.tanh(w)
    vkml.realize(h)
    loss = vkml.sum(h * h)
    table = viz.saved_residuals(loss)
    assert [r["shape"] for r in table.rows] == ["[2]"] and table.total == 16
    assert "kept for backward, 16 B" in viz.tensor_dot(loss).text     # and on the picture

    @vkml.kernel
    def relax(s, k: vkml.Param):
        return {"s": s + k * vkml.sin(s)}
    s = np.linspace(0.5, 2.0, 4)
    g = (vkml.Graph().add(relax.bind(s=s, k=0.3), name="first")
         .add(relax.bind(s=s, k=0.3), name="second").build(record=True))
    g.launch()
    table = viz.saved_residuals(g.record)
    assert table.total == g.record.nbytes > 0
    drawn = texts(viz.record_dot(g.record).pipe("svg"))
    assert f"{table.total:,} B" in drawn                    # the plane's copies' size, drawn
    assert all(r["value"] == "s" for r in table.rows if r["dtype"] != "-")
    with pytest.raises(vkml.ArgumentError, match="saved_residuals"):
        viz.saved_residuals(42)


# -- diff ------------------------------------------------------------------------------------------

def test_diff_marks_added_removed_and_changed_boxes():
    x = np.ones(3)

    def before(w):
        return vkml.sum(vkml.tanh(w) * w)

    def after(w):
        h = vkml.sin(w) * w
        return vkml.sum(vkml.exp(h)) + vkml.max(h)
    d = viz.diff(vkml.program(before, x), vkml.program(after, x))
    assert d.text.startswith("diff: ")
    assert "\n--- before\n+++ after\n" in d.text
    source = d.source
    marked = {k for k in ("added", "removed", "changed") if viz.FILL[k] in source}
    assert "added" in marked and "changed" in marked
    ET.fromstring(d.pipe("svg"))
    same = viz.diff(vkml.program(before, x), vkml.program(before, x))
    assert same.text.startswith("diff: 0 added, 0 removed, 0 changed")
    # a program and its derivative, and a jitted function
    f = vkml.jit(before)
    vkml.grad(f)(x)
    d = viz.diff(f, f.derived_programs()[0]["jvp"], labels=("primal", "jvp"))
    assert "added" in d.text.splitlines()[0]
    with pytest.raises(vkml.ArgumentError, match="diff"):
        viz.diff(f, "not a program")


# -- dark themes and determinism --------------------------------------------------------------------

def test_every_svg_carries_a_dark_scheme_style():
    f, d = derived_of(tanh_loss, CASES[0][1])
    for svg in (d.svg(), viz.program_dot(f.programs()[0]).svg(),
                viz.tensor_dot(vkml.tensor(np.ones(2)) * 2).svg()):
        root = ET.fromstring(svg)
        style = root.find(SVG + "style")
        assert style is not None and "prefers-color-scheme: dark" in style.text
        # light text on the dark background, dark text inside the (light) boxes
        assert "g.node text { fill: #111827; }" in style.text
        assert "g.cluster > text, g.edge > text { fill: #f3f4f6; }" in style.text


def test_the_same_object_renders_the_same_bytes():
    for fn, args in CASES:
        f, d = derived_of(fn, args)
        assert viz.derived_dot(f).pipe("svg") == d.pipe("svg") == d.pipe("svg")
        prog = f.programs()[0]
        assert viz.program_dot(prog).pipe("svg") == viz.program_dot(prog).pipe("svg")
        assert vkml.pp_program(prog) == vkml.pp_program(prog)
    table = viz.saved_residuals(tanh_loss, *CASES[0][1])
    assert repr(table) == repr(viz.saved_residuals(tanh_loss, *CASES[0][1]))


# -- counters, backends, messages -------------------------------------------------------------------

def test_stats_count_jit_cache_hits():
    f = vkml.jit(lambda x: vkml.sum(x * 3.0))
    f(np.ones(3))
    before = vkml.stats()
    f(np.ones(3))
    assert f.cache_info()["hits"] == 1
    assert (vkml.stats() - before).cache_hits >= 1
    assert (vkml.stats() - before).traces == 0


def test_cuda_is_listed_as_available_only_where_it_can_run():
    from vkml.backends import cuda_unavailable
    info = vkml.backend_info()
    why = cuda_unavailable()
    if why is None:
        pytest.skip("this machine can run the cuda backend")
    assert "cuda" not in info["available"] and "numpy" in info["available"]
    assert info["unavailable"]["cuda"] == why and "missing" in why
    from vkml_jupyter.magics import info_text
    assert f"not available here: cuda ({why})" in info_text()


def test_scan_carry_changing_dtype_is_a_dtype_error():
    with pytest.raises(vkml.DTypeError, match=r"int64 \[\].*float64 \[\]"):
        vkml.scan(lambda c, r: (c + r, c), np.int64(0), np.ones(3))
    with pytest.raises(vkml.ShapeError, match=r"float64 \[\].*float64 \[2\]"):
        vkml.scan(lambda c, r: (c + r, c), np.float64(0.0), np.ones((3, 2)))


def test_reversing_without_a_record_says_build_record_true():
    @vkml.kernel
    def double(x):
        return {"y": x * 2.0}
    x, y = np.ones(3), np.zeros(3)
    g = vkml.Graph().add(double.bind(x=x, y=y), name="double").build()
    g.launch()
    with pytest.raises(vkml.ArgumentError, match=r"build\(record=True\)"):
        vkml.diff.reverse(g.record, {"y": np.ones(3)})


def test_refused_messages_end_in_whole_sentences():
    import ast
    import pathlib
    root = pathlib.Path(vkml.__file__).parent / "graph"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "RefusedError":
                last = ast.unparse(node.args[0]).rstrip("'\"").rstrip()
                assert not last.endswith("=") and not re.search(r"\b(with|the|a|of|to)$", last), \
                    (path.name, node.lineno, last[-60:])
