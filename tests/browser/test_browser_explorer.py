"""A real browser clicks an equation of the program explorer: JupyterLab in headless Chromium runs a
notebook that makes an explorer, the test clicks the tanh equation of the primal program, and the
equations made from it get the highlight class and the readout shows its source line; the kernel
sees the selection, a selection made in Python reaches the page, the derivation control swaps the
programs, and the picture follows JupyterLab's dark theme.

JupyterLab and Debian's chromium are started as in tests/test_browser.py (a free localhost port, a
random token, every Jupyter folder in a temporary directory, nothing fetched from the network).
Screenshots go to tests/screenshots/ (git-ignored) for a person to look at.
"""

import re
import shutil
import urllib.parse
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.timeout(300)

pytest.importorskip("anywidget", reason="anywidget is in the jupyter extra: run scripts/dev test")
if shutil.which("dot") is None:
    pytest.skip("the explorer's picture needs graphviz's dot", allow_module_level=True)

from jupyterlab_server import jupyter_env, serving

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "tests" / "screenshots"
SECONDS = 1000  # playwright counts milliseconds

CELLS = [
    "import numpy as np\nimport vkml",
    "def loss(w):\n"
    "    h = vkml.tanh(w) * w\n"
    "    return vkml.sum(h)\n"
    "ex = vkml.widgets.explore_program(loss, np.array([0.5, -1.0, 2.0]))\n"
    "ex",
]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on a free localhost port with a random token, serving ``tmp_path``."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "explorer.ipynb")
    with serving(tmp_path, jupyter_env(tmp_path / "jupyter")) as server:
        yield server


KERNEL_IDLE = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
}"""

#: Evaluates a Python expression in the notebook's kernel (user_expressions) and returns its repr.
KERNEL_EVAL = """async ([code, expr]) => {
    const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
    const future = k.requestExecute({code: code, silent: true, store_history: false,
                                     user_expressions: {out: expr}});
    const reply = await future.done;
    const out = reply.content.user_expressions.out;
    return out.status === 'ok' ? out.data['text/plain'] : 'error: ' + out.evalue;
}"""

#: ``{panel: [data-index]}`` of the boxes carrying ``cls``.
MARKED = """cls => {
    const out = {};
    for (const g of document.querySelectorAll('.vkml-explorer g.vkml-eqn.' + cls)) {
        (out[g.dataset.panel] = out[g.dataset.panel] || []).push(Number(g.dataset.index));
    }
    return out;
}"""

#: ``{panel: [data-index]}`` of the boxes whose primal equation is ``root``.
OF_ROOT = """root => {
    const out = {};
    for (const g of document.querySelectorAll(`.vkml-explorer g.vkml-eqn[data-root="${root}"]`)) {
        (out[g.dataset.panel] = out[g.dataset.panel] || []).push(Number(g.dataset.index));
    }
    return out;
}"""

#: The computed colours a reader sees: the picture's background (the graph's first polygon), the
#: readout's text and background.
COLOURS = """() => {
    const poly = document.querySelector('.vkml-explorer g.graph > polygon');
    const readout = document.querySelector('.vkml-explorer-readout');
    let node = readout, bg = 'rgba(0, 0, 0, 0)';
    while (node && (bg === 'rgba(0, 0, 0, 0)' || bg === 'transparent')) {
        bg = getComputedStyle(node).backgroundColor; node = node.parentElement;
    }
    return {picture: getComputedStyle(poly).fill, text: getComputedStyle(readout).color,
            readout: bg};
}"""


def luminance(css):
    r, g, b = (float(x) for x in re.findall(r"[\d.]+", css)[:3])
    f = [(v / 255) / 12.92 if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4
         for v in (r, g, b)]
    return 0.2126 * f[0] + 0.7152 * f[1] + 0.0722 * f[2]


def contrast(a, b):
    la, lb = luminance(a), luminance(b)
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def others(marked):
    return {p: sorted(ks) for p, ks in marked.items() if p != "primal"}


def test_clicking_an_equation_highlights_what_each_derivation_made_from_it(lab, chromium):
    SCREENSHOTS.mkdir(exist_ok=True)
    token = urllib.parse.quote(lab["token"])
    with chromium() as browser:
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{lab['url']}lab/tree/explorer.ipynb?token={token}", timeout=90 * SECONDS)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90 * SECONDS)
            page.wait_for_function(KERNEL_IDLE, timeout=90 * SECONDS)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")

            tanh = page.wait_for_selector(
                ".vkml-explorer g.vkml-eqn[data-panel='primal'][data-index='0']",
                timeout=90 * SECONDS)
            assert "tanh" in tanh.inner_html()
            readout = page.locator(".vkml-explorer-readout")
            assert "Click an equation" in readout.inner_text()
            assert page.locator(".vkml-explorer g.vkml-selected").count() == 0

            # the click: the tanh box is selected, every box made from it is a counterpart
            tanh.scroll_into_view_if_needed()
            tanh.click()
            page.wait_for_selector(".vkml-explorer g.vkml-selected", timeout=30 * SECONDS)
            selected = page.evaluate(MARKED, "vkml-selected")
            assert selected == {"primal": [0]}
            counterparts = others(page.evaluate(MARKED, "vkml-counterpart"))
            assert counterparts == others(page.evaluate(OF_ROOT, 0))
            assert set(counterparts) == {"jvp", "known", "linear", "transposed"}
            assert all(counterparts.values())
            text = readout.inner_text()
            assert "h = vkml.tanh(w) * w" in text and "tanh" in text
            assert "transposed: " + str(len(counterparts["transposed"])) in text
            # the chosen box and its counterparts are drawn in the highlight colour, the
            # others are dimmed
            stroke = page.evaluate("() => getComputedStyle(document.querySelector("
                                   "'.vkml-explorer g.vkml-selected path')).stroke")
            assert stroke == "rgb(245, 158, 11)"
            stroke = page.evaluate("() => getComputedStyle(document.querySelector("
                                   "'.vkml-explorer g.vkml-counterpart path')).stroke")
            assert stroke == "rgb(245, 158, 11)"
            dim = page.evaluate("() => getComputedStyle(document.querySelector("
                                "'.vkml-explorer g.vkml-eqn[data-root=\"2\"]')).opacity")
            assert float(dim) < 1
            # the click reached the kernel: the explorer knows its selection
            assert page.evaluate(KERNEL_EVAL, ["", "ex.selected"]) == "0"
            assert page.evaluate(KERNEL_EVAL, ["", "sorted(ex.highlighted['jvp'])"]) == \
                str(counterparts["jvp"])
            page.screenshot(path=str(SCREENSHOTS / "explorer-light.png"), full_page=False)

            # a selection made in Python reaches the page
            page.evaluate(KERNEL_EVAL, ["ex.select(1)", "ex.selected"])
            page.wait_for_selector(".vkml-explorer g.vkml-selected[data-root='1']",
                                   timeout=30 * SECONDS)
            assert others(page.evaluate(MARKED, "vkml-counterpart")) == \
                others(page.evaluate(OF_ROOT, 1))

            # the derivation control: jvp has one derived program, and the selection stays
            page.locator(".widget-toggle-button", has_text=re.compile(r"^jvp$")).click()
            page.wait_for_function(
                "() => document.querySelectorAll(\".vkml-explorer g[data-panel='transposed']\")"
                ".length === 0 && document.querySelectorAll(\".vkml-explorer "
                "g[data-panel='jvp']\").length > 0", timeout=60 * SECONDS)
            assert others(page.evaluate(MARKED, "vkml-counterpart")) == \
                others(page.evaluate(OF_ROOT, 1))
            assert set(others(page.evaluate(MARKED, "vkml-counterpart"))) == {"jvp"}
            assert page.evaluate(KERNEL_EVAL, ["", "ex.derivation.value"]) == "'jvp'"

            stderr = "application/vnd.jupyter.stderr"
            assert page.locator(f".jp-OutputArea-output[data-mime-type='{stderr}']").count() == 0
            assert not errors, errors

            # JupyterLab's dark theme: the picture's background turns dark, the readout stays
            # readable (WCAG contrast of its text on its background)
            light = page.evaluate(COLOURS)
            assert luminance(light["picture"]) > 0.8
            page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme',"
                          " {theme: 'JupyterLab Dark'})")
            page.wait_for_function(
                "document.body.getAttribute('data-jp-theme-light') === 'false'",
                timeout=60 * SECONDS)
            page.wait_for_function(
                "() => { const p = document.querySelector('.vkml-explorer g.graph > polygon');"
                " return getComputedStyle(p).fill !== %r; }" % light["picture"],
                timeout=30 * SECONDS)
            page.wait_for_function("() => !document.querySelector('#jupyterlab-splash')",
                                   timeout=60 * SECONDS)
            dark = page.evaluate(COLOURS)
            assert luminance(dark["picture"]) < 0.1, dark
            assert contrast(dark["text"], dark["readout"]) >= 4.5, dark
            page.locator(".vkml-explorer").scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "explorer-dark.png"), full_page=False)
        except Exception:
            print(lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()
