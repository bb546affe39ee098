"""The widgets driven from Python (slider values set in code), and the progress-bar helper."""

from types import SimpleNamespace

import numpy as np
import pytest

import vkml
from vkml.backends import base as backends_base
from vkml import progress as vprogress
from vkml_jupyter import widgets as vw


@pytest.fixture(autouse=True)
def _cold_backend_caches():
    """Leave the backends' executable caches cold: other modules count first compiles (the tutorial's
    running-sum program compiled here would otherwise be a cache hit there)."""
    yield
    for backend in backends_base._INSTANCES.values():
        backend.clear_cache()


def wave(x, k):
    return vkml.sum(vkml.sin(k * x) * x)


def wave_np(x, k):
    return float(np.sum(np.sin(k * x) * x))


def wave_grads(x, k):
    """The exact gradient, written out by hand (an oracle independent of vkml)."""
    return k * np.cos(k * x) * x + np.sin(k * x), float(np.sum(np.cos(k * x) * x * x))


def test_vkml_widgets_is_the_jupyter_layers_module():
    assert vkml.widgets is vw
    assert vkml.widgets.explore_gradient is vw.explore_gradient


def test_gradient_explorer_reads_out_value_gradient_and_finite_difference():
    ex = vw.explore_gradient(wave, np.array([0.5, -1.0]), {"k": 1.5})
    x, k = np.array([0.5, -1.0]), 1.5
    gx, gk = wave_grads(x, k)
    assert ex.value == pytest.approx(wave_np(x, k), rel=1e-12)
    np.testing.assert_allclose(ex.gradient, gx, rtol=1e-12)
    assert ex.param_gradient == {"k": pytest.approx(gk, rel=1e-12)}
    assert ex.slope == pytest.approx(gx[0])                          # plotted along x[0]
    assert ex.finite_difference == pytest.approx(gx[0], rel=1e-7) and ex.fd_ok
    html = ex.readout.value
    assert f"<span class='vkml-value'>{wave_np(x, k):.6g}</span>" in html
    assert "&part;f/&part;k" in html and "&#10003;" in html
    assert "1 submission for this update; program cache: 1 trace, 0 hits" in html
    assert bytes(ex.plot.value).startswith(b"\x89PNG")
    assert set(ex.sliders) == {"x[0]", "x[1]", "k"}
    assert repr(ex) == "GradientExplorer(wave at x[0]=0.5, x[1]=-1, k=1.5)"


def test_moving_a_slider_updates_readout_and_figure_through_the_cached_program():
    ex = vw.explore_gradient(wave, np.array([0.5, -1.0]), {"k": 1.5})
    traces = vkml.stats().traces
    info = ex.program.cache_info()
    assert info["traces"] == 1 and info["hits"] == 0
    html, png = ex.readout.value, ex.plot.value
    before = vkml.stats()
    ex.sliders["x[1]"].value = 0.25
    moved = vkml.stats() - before
    assert ex.updates == 2
    x = np.array([0.5, 0.25])
    assert ex.value == pytest.approx(wave_np(x, 1.5), rel=1e-12)
    np.testing.assert_allclose(ex.gradient, wave_grads(x, 1.5)[0], rtol=1e-12)
    assert ex.readout.value != html and f"{wave_np(x, 1.5):.6g}" in ex.readout.value
    assert ex.plot.value != png
    # one call of the cached program: one submission, no trace, no compile
    assert (moved.submissions, moved.traces, moved.compiles) == (1, 0, 0) and ex.submissions == 1
    assert ex.program.cache_info() == dict(info, hits=1)
    assert "program cache: 1 trace, 1 hit" in ex.readout.value
    # a parameter slider and the direction are the same one program
    ex.sliders["k"].value = 0.5
    ex.direction.value = -1                                # the diagonal
    d = np.ones(2) / np.sqrt(2)
    gx, gk = wave_grads(x, 0.5)
    assert ex.param_gradient["k"] == pytest.approx(gk, rel=1e-12)
    assert ex.slope == pytest.approx(gx @ d) and ex.fd_ok
    assert "along the diagonal" in ex.readout.value
    assert ex.program.cache_info()["traces"] == 1 and ex.program.cache_info()["hits"] == 3
    assert vkml.stats().traces == traces
    assert ex.total_submissions == 4


def test_the_figure_is_deterministic():
    a = vw.explore_gradient(wave, np.array([0.5, -1.0]), {"k": 1.5})
    b = vw.explore_gradient(wave, np.array([0.5, -1.0]), {"k": 1.5})
    assert a.plot.value == b.plot.value
    a.sliders["x[0]"].value = 1.0
    a.sliders["x[0]"].value = 0.5
    assert a.plot.value == b.plot.value
    assert a.readout.value.replace("2 hits", "0 hits") == b.readout.value


def test_scalar_input_without_parameters():
    ex = vw.explore_gradient(lambda x: x * x * x, 2.0, ranges={"x": (-3.0, 3.0)})
    assert list(ex.sliders) == ["x"] and ex.sliders["x"].min == -3.0
    assert (ex.value, float(ex.gradient)) == (8.0, 12.0) and ex.fd_ok
    ex.sliders["x"].value = -1.5
    assert ex.value == pytest.approx(-3.375) and float(ex.gradient) == pytest.approx(6.75)
    assert [label for label, _ in ex.direction.options] == ["along x"]


def test_a_wrong_gradient_fails_the_finite_difference_check():
    @vkml.custom_jvp
    def bad_square(x):
        return vkml.sum(x * x)

    @bad_square.defjvp
    def _(primals, tangents):
        (x,), (t,) = primals, tangents
        return vkml.sum(x * x), vkml.sum(3.0 * x * t)        # should be 2 x t
    ex = vw.explore_gradient(bad_square, np.array([1.0, 2.0]))
    assert not ex.fd_ok and "&#10007; (does not match)" in ex.readout.value


@pytest.mark.parametrize("args, match", [
    ((wave, np.zeros((2, 2))), "x0 must be a number or a 1-D array"),
    ((wave, np.zeros(17)), "x0 must be"),
    ((wave, np.ones(2), {"k": np.ones(2)}), "params must map names to numbers"),
    ((wave, np.ones(2), {"not a name": 1.0}), "params must map names to numbers"),
    ((3, np.ones(2)), "f must be a function"),
])
def test_gradient_explorer_refuses_bad_input(args, match):
    with pytest.raises(vkml.ArgumentError, match=match):
        vw.explore_gradient(*args)
    with pytest.raises(vkml.ArgumentError, match="must hold its start"):
        vw.explore_gradient(wave, np.ones(2), {"k": 1.0}, ranges={"k": (2.0, 3.0)})


# -- Record explorer (a stand-in Record: the graph layer supplies the real one) --------------------

def stand_in():
    record = SimpleNamespace(generation=2, copied=["u"], nbytes=512, nodes=["square", "wave"],
                             live=True, kept=True, bitwise={"u": True})
    node = SimpleNamespace
    graph = SimpleNamespace(nodes=[
        node(name="square", kind="launch", reads=["x"], writes=["u"], params={}),
        node(name="wave", kind="launch", reads=["u"], writes=["y"], params={"k": 1.5})])
    return record, graph


def test_record_explorer_steps_through_launch_and_reverse():
    record, graph = stand_in()
    ex = vw.explore_record(record, graph)
    assert (ex.step.min, ex.step.max) == (1, 4) and ex.current == ("forward", 0, "square")
    assert "step 1 of 4" in ex.readout.value and ex.prev.disabled and not ex.next.disabled
    assert "launch square" in ex.readout.value and "reads x; writes u" in ex.readout.value
    assert "generation 2; live, kept; 512 bytes recorded" in ex.readout.value
    assert "copied before an overwrite: u (bitwise)" in ex.readout.value
    # drawn inline (it follows JupyterLab's theme and shows hover titles), as a notebook draws it
    assert ex.picture.value.startswith('<div class="vkml-diagram">') and "<svg" in ex.picture.value
    pictures = [ex.picture.value]
    ex.next.click()
    assert ex.current == ("forward", 1, "wave")
    ex.next.click()
    assert ex.current == ("reverse", 0, "wave") and "reverse of wave" in ex.readout.value
    pictures.append(ex.picture.value)
    ex.next.click()
    ex.next.click()                                   # stops at the last step
    assert ex.current == ("reverse", 1, "square") and ex.step.value == 4
    assert "step 4 of 4" in ex.readout.value and ex.next.disabled and not ex.prev.disabled
    ex.prev.click()
    assert ex.current == ("reverse", 0, "wave") and ex.picture.value == pictures[1]
    ex.step.value = 1
    assert ex.picture.value == pictures[0] and pictures[0] != pictures[1]
    assert repr(ex) == "RecordExplorer(generation 2, forward step 0: square)"


def test_record_explorer_without_dot_shows_text(monkeypatch):
    record, _ = stand_in()
    monkeypatch.setenv("PATH", "")
    ex = vw.explore_record(record)
    assert ex.picture.value.startswith("<pre>Record generation 2, live, kept, 512 bytes")
    assert "reads" not in ex.readout.value              # no graph given: no reads/writes line


def test_record_explorer_refuses_what_is_not_a_record():
    with pytest.raises(vkml.ArgumentError, match="expected a Record"):
        vw.explore_record(SimpleNamespace(nodes=[]))
    record, _ = stand_in()
    record.nodes = []
    with pytest.raises(vkml.ArgumentError, match="holds no nodes"):
        vw.explore_record(record)


# -- progress bars ---------------------------------------------------------------------------------

def test_progress_is_silent_outside_notebooks_and_shows_when_asked(monkeypatch, capsys):
    monkeypatch.delenv("VKML_PROGRESS", raising=False)
    vprogress.set_progress(None)
    assert not vprogress.progress_enabled()
    bar = vprogress.progress(range(3), desc="steps")
    assert list(bar) == [0, 1, 2] and bar.n == 3
    with vprogress.progress(total=5) as bar:
        bar.update(2)
    assert bar.n == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("VKML_PROGRESS", "1")
    assert vprogress.progress_enabled()
    assert list(vprogress.progress(range(4), desc="steps")) == [0, 1, 2, 3]
    err = capsys.readouterr().err
    assert "steps" in err and "4/4" in err
    try:
        vprogress.set_progress(False)
        assert list(vprogress.progress(range(2))) == [0, 1] and capsys.readouterr().err == ""
    finally:
        vprogress.set_progress(None)
