"""The program explorer driven from Python: which derived equations an equation selects, the
derivation switch, the sizes and counts it shows, its bytes, and its refusals.

The correspondence is checked against the equations' own ``origin`` (set by the transforms) and
against the picture's data attributes parsed from the SVG; the derivations' values against HIPS
autograd, an oracle independent of vkml.
"""

import re
import xml.etree.ElementTree as ET

import autograd
import autograd.numpy as anp
import numpy as np
import pytest

import vkml
from vkml import viz
from vkml.errors import ArgumentError, IndexOutOfRangeError, TracingError, VkmlError
from vkml.ir import Program
from vkml_jupyter import program_explorer as pe
from vkml_jupyter import widgets as vw

pytestmark = pytest.mark.skipif(viz.dot_available() is not None,
                                reason="the picture needs graphviz's dot")

SVG = "{http://www.w3.org/2000/svg}"


def tanh_loss(w):
    h = vkml.tanh(w) * w
    return vkml.sum(h)


def wave(x, y):
    s = vkml.sin(x) * y
    return vkml.sum(s) + vkml.sum(x * x)


def running_sum(xs):
    def step(acc, row):
        acc = acc + vkml.sin(row)
        return acc, acc * acc
    _, sums = vkml.scan(step, np.float64(0.0), xs)
    return vkml.sum(sums)


W = np.array([0.5, -1.0, 2.0])


def walk(prog):
    """Every equation of ``prog``, each followed by those of its nested programs."""
    for e in prog.eqns:
        yield e
        for p in e.params.values():
            if isinstance(p, Program):
                yield from walk(p)


def made_from(prog, eqn):
    """The equations of ``prog`` whose origin (set by jvp/partial eval/transpose) is ``eqn``, and
    ``eqn`` itself where a derived program kept it (a user's scan step inside a jvp)."""
    return [k for k, e in enumerate(walk(prog))
            if (e.origin[0] is eqn if e.origin is not None else e is eqn)]


def boxes(svg):
    """``{(panel, index): (root, role)}`` of the picture's clickable equation boxes."""
    out = {}
    for g in ET.fromstring(svg).iter(SVG + "g"):
        if "vkml-eqn" in (g.get("class") or "").split():
            out[(g.get("data-panel"), int(g.get("data-index")))] = (int(g.get("data-root")),
                                                                     g.get("data-role"))
    return out


def test_vkml_widgets_exports_the_program_explorer():
    assert vkml.widgets is vw
    assert vw.explore_program is pe.explore_program
    assert "explore_program" in vw.__all__


def test_selecting_tanh_marks_exactly_the_equations_made_from_it():
    ex = vw.explore_program(tanh_loss, W)
    assert ex.derivation.value == "grad"                      # a scalar result: grad first
    names = [e.prim.name for e in ex.primal.eqns]
    assert names == ["tanh", "mul", "reduce_sum"]
    tanh = ex.primal.eqns[0]
    ex.select(0)
    assert ex.selected == 0 and ex.picture.selected == 0
    panels = dict(ex.view.panels)
    assert list(panels) == ["primal", "jvp", "known", "linear", "transposed"]
    want = {p: made_from(panels[p], tanh) for p in ("jvp", "known", "linear", "transposed")}
    assert ex.highlighted == want
    # tanh has a tangent, a linear part and a transposed part, and none is the reduce's
    for p in ("jvp", "linear", "transposed"):
        assert want[p], p
        ops = {list(walk(panels[p]))[k].prim.name for k in want[p]}
        assert "reduce_sum" not in ops
    roles = {list(walk(panels["transposed"]))[k].origin[1] for k in want["transposed"]}
    assert roles == {"cotangent"}
    # the picture carries the same correspondence in its data attributes
    drawn = boxes(ex.svg)
    for p, prog in panels.items():
        n = len(list(walk(prog)))
        assert {k for (panel, k) in drawn if panel == p} == set(range(n)), p
    for p in want:
        assert sorted(k for (panel, k), (root, _) in drawn.items()
                      if panel == p and root == 0) == want[p]
    assert drawn[("primal", 0)] == (0, "primal")
    # the readout names the op and the source line the equation came from
    line = next(i for i, t in enumerate(open(__file__), 1) if "h = vkml.tanh(w) * w" in t)
    assert f"test_program_explorer.py:{line}: h = vkml.tanh(w) * w" in ex.readout
    assert "<code>tanh</code>" in ex.readout
    assert f"transposed: {len(want['transposed'])} (" in ex.readout
    # the readouts the browser shows are the same, one per primal equation
    assert [q["readout"] for q in ex.picture.equations][0] == ex.readout
    assert len(ex.picture.equations) == 3


def test_every_derived_equation_with_an_origin_is_some_selections_counterpart():
    ex = vw.explore_program(wave, W, np.array([1.0, 2.0, 3.0]), derivation="vjp")
    panels = dict(ex.view.panels)
    for p in ("jvp", "known", "linear", "transposed"):
        chosen = set()
        for i in range(len(ex.view.eqns["primal"])):
            ex.select(i)
            got = ex.highlighted[p]
            assert got == made_from(panels[p], ex.view.eqns["primal"][i])
            assert not chosen & set(got)                      # each derived equation has one root
            chosen |= set(got)
        primal = set(map(id, walk(ex.primal)))
        with_origin = {k for k, e in enumerate(walk(panels[p]))
                       if e.origin is not None or id(e) in primal}
        assert chosen == with_origin
    ex.select(None)
    assert ex.selected is None and ex.highlighted == {} and ex.readout == ex.picture.hint


def test_an_equation_inside_a_scan_step_is_matched_inside_the_derived_steps():
    ex = vw.explore_program(running_sum, W)
    names = [e.prim.name for e in ex.view.eqns["primal"]]
    assert names[0] == "scan" and "sin" in names             # the step's equations follow it
    i = names.index("sin")
    sin = ex.view.eqns["primal"][i]
    ex.select(i)
    panels = dict(ex.view.panels)
    assert ex.highlighted["jvp"] == made_from(panels["jvp"], sin) != []
    jvp_eqns = list(walk(panels["jvp"]))
    assert any(jvp_eqns[k] is sin for k in ex.highlighted["jvp"])   # the user's step, kept
    drawn = boxes(ex.svg)
    assert drawn[("primal", i)] == (i, "primal")
    assert sorted(k for (p, k), (root, _) in drawn.items() if p == "jvp" and root == i) == \
        ex.highlighted["jvp"]


def test_switching_derivations_changes_the_programs_and_keeps_the_selection():
    ex = vw.explore_program(tanh_loss, W)
    ex.select(0)
    grad_svg = ex.picture.svg
    ex.derivation.value = "jvp"
    assert [p for p, _ in ex.view.panels] == ["primal", "jvp"]
    assert ex.picture.svg != grad_svg and ex.picture.svg == ex.svg
    assert 'data-panel="jvp"' in ex.svg and 'data-panel="transposed"' not in ex.svg
    assert ex.selected == 0 and list(ex.highlighted) == ["jvp"]
    ex.derivation.value = "hessian"
    assert [p for p, _ in ex.view.panels] == ["primal", "gradient", "hessian"]
    assert ex.highlighted["hessian"] == made_from(dict(ex.view.panels)["hessian"],
                                                  ex.primal.eqns[0]) != []
    ex.derivation.value = "vjp"
    assert [p for p, _ in ex.view.panels] == ["primal", "jvp", "known", "linear", "transposed"]
    ex.derivation.value = "grad"
    assert ex.picture.svg == grad_svg                          # a view is derived once
    assert repr(ex) == "ProgramExplorer(tanh_loss at float64 [3]: grad, 3 primal equations, " \
                       "equation 0 selected)"


def test_each_derivation_computes_what_autograd_computes():
    ex = vw.explore_program(tanh_loss, W)

    def loss(w):
        return anp.sum(anp.tanh(w) * w)

    np.testing.assert_allclose(ex.view.result, autograd.grad(loss)(W), rtol=1e-12)
    ex.derivation.value = "hessian"
    np.testing.assert_allclose(ex.view.result, autograd.hessian(loss)(W), rtol=1e-10)
    ex.derivation.value = "jvp"
    value, tangent = ex.view.result
    assert float(value) == pytest.approx(loss(W), rel=1e-12)
    assert float(tangent) == pytest.approx(float(autograd.grad(loss)(W).sum()), rel=1e-12)
    ex.derivation.value = "vjp"
    out, (cotangent,) = ex.view.result
    np.testing.assert_allclose(cotangent, autograd.grad(loss)(W), rtol=1e-12)


def test_sizes_and_counts_are_shown():
    ex = vw.explore_program(tanh_loss, W)
    text = ex.sizes.value
    for panel, prog in ex.view.panels:
        made = [v for e in walk(prog) for v in e.outputs]
        nbytes = sum(np.dtype(v.dtype).itemsize * int(np.prod(v.shape)) for v in made)
        row = (f"<tr><td>{panel}</td><td>{len(prog.inputs)}</td><td>{len(list(walk(prog)))}"
               f"</td><td>{len(made)}</td><td>{nbytes:,}</td></tr>")
        assert row in text, panel
    kept = viz.saved_residuals(tanh_loss, W)      # the same numbers through the jit's caches
    assert f"kept for the backward: {len(kept)} values, {kept.total:,} bytes" in text
    # grad runs the known part and then the transposed part as one fused program: one
    # submission, counted by vkml.stats()
    assert ex.view.stats.submissions == 1
    s = ex.view.stats
    assert (f"running grad once at these arguments: 1 submission, {s.compiles} compile"
            in text)
    assert "result float64 [3]" in text
    ex.derivation.value = "jvp"                   # one program: one submission
    assert ex.view.stats.submissions == 1
    assert "running jvp once at these arguments: 1 submission," in ex.sizes.value


def test_the_same_explorer_renders_to_the_same_bytes():
    a = vw.explore_program(tanh_loss, W)
    b = vw.explore_program(tanh_loss, W.copy())
    assert a.svg == b.svg
    assert a.view.diagram.pipe("svg") == a.view.diagram.pipe("svg")
    assert a.view.diagram.source == b.view.diagram.source
    assert a.picture.equations == b.picture.equations
    assert repr(a) == repr(b)
    # ids are prefixed per panel, so two pictures on one page never share one
    ids = re.findall(r'\bid="([^"]*)"', a.svg)
    assert len(ids) == len(set(ids))


def test_the_browser_module_and_its_theme_colours():
    esm, css = pe.ProgramPicture._esm, pe.ProgramPicture._css
    assert "export default" in esm and "dataset.root" in esm
    assert "vkml-selected" in esm and "vkml-counterpart" in esm and "save_changes" in esm
    assert "var(--jp-layout-color0" in css and "var(--jp-ui-font-color1" in css
    synced = {n for n, t in pe.ProgramPicture.class_traits().items() if t.metadata.get("sync")}
    assert {"svg", "equations", "selected", "hint"} <= synced


def test_bad_input_is_refused_with_a_vkml_error():
    with pytest.raises(ArgumentError, match="f must be a function"):
        vw.explore_program(42, W)
    with pytest.raises(ArgumentError, match="give the arguments"):
        vw.explore_program(tanh_loss)

    def broken(w):
        raise KeyError("no such thing")

    with pytest.raises(TracingError, match="tracing broken .* failed with KeyError"):
        vw.explore_program(broken, W)
    with pytest.raises(VkmlError):                # a shape error names the op
        vw.explore_program(lambda a, b: vkml.sum(a * b), W, np.ones(2))
    with pytest.raises(ArgumentError, match="derivation must be one of"):
        vw.explore_program(tanh_loss, W, derivation="taylor")
    with pytest.raises(ArgumentError, match="no floating argument"):
        vw.explore_program(lambda n: vkml.sum(n * 2), np.arange(3))
    ex = vw.explore_program(tanh_loss, W)
    ex.select(1)
    for bad, err in ((3, IndexOutOfRangeError), (-1, IndexOutOfRangeError),
                     ("0", ArgumentError), (True, ArgumentError), (1.0, ArgumentError)):
        with pytest.raises(err, match="ProgramExplorer.select"):
            ex.select(bad)
        assert ex.selected == 1                  # nothing changed
    assert isinstance(IndexOutOfRangeError("x"), VkmlError)


def test_a_derivation_that_does_not_apply_is_refused_by_the_control_and_nothing_changes():
    ex = vw.explore_program(lambda x: vkml.sin(x) * x, W)   # a vector result: no grad
    assert ex.derivation.value == "vjp"
    svg, sizes = ex.svg, ex.sizes.value
    ex.derivation.value = "grad"
    assert ex.derivation.value == "vjp" and ex.svg == svg
    assert "must return a floating scalar" in ex.sizes.value and ex.sizes.value != sizes
    with pytest.raises(VkmlError, match="floating scalar"):
        vw.explore_program(lambda x: vkml.sin(x) * x, W, derivation="grad")


def test_the_stacked_panels_are_sized_in_the_outer_pictures_units():
    """Each panel is a nested <svg> in a picture whose user unit is already 1 pt: a size written in
    pt there would be scaled by 4/3 again and the panel clipped by the next one."""
    ex = vw.explore_program(tanh_loss, W)
    root = ET.fromstring(ex.svg)
    outer_height = float(root.get("viewBox").split()[3])
    panels = [s for s in root if s.tag == SVG + "svg"]
    assert len(panels) == len(ex.view.panels)
    bottom = 0.0
    for s in panels:
        assert re.fullmatch(r"[\d.]+", s.get("width")) and re.fullmatch(r"[\d.]+", s.get("height"))
        assert float(s.get("y")) >= bottom                     # panels never overlap
        bottom = float(s.get("y")) + float(s.get("height"))
    assert bottom == pytest.approx(outer_height)
