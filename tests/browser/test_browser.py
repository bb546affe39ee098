"""A real browser: JupyterLab in headless Chromium runs a notebook, shows a diagram, and a gradient
explorer's readout follows a slider the browser moves.

JupyterLab is started on a free localhost port with a random token (token auth stays on), with its
config, data, runtime, settings and workspace folders in a temporary directory and nothing fetched
from the network.  Chromium is Debian's (``apt-get install chromium``; ``scripts/dev test`` does
it), driven by the ``playwright`` package from the test extra -- ``playwright install`` is never
run.
"""

import urllib.parse

import nbformat
import pytest

pytestmark = pytest.mark.timeout(300)


from jupyterlab_server import jupyter_env, serving

CELLS = [
    "%load_ext vkml\nimport numpy as np\nimport vkml",
    "%%vkml --show program\n"
    "def body(xs):\n"
    "    def step(acc, row):\n"
    "        return acc + row, acc + row\n"
    "    _, sums = vkml.scan(step, np.float64(0.0), xs)\n"
    "    return vkml.sum(sums * sums)\n"
    "f = vkml.jit(body)\n"
    "f(np.array([1.0, 2.0, 3.0]))\n"
    "f",
    "ex = vkml.widgets.explore_gradient(lambda x, k: vkml.sum(vkml.sin(k * x) * x),\n"
    "                                   np.array([0.5, -1.0]), {'k': 1.5})\n"
    "ex",
]

SECONDS = 1000  # playwright counts milliseconds


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on a free localhost port with a random token, serving ``tmp_path``."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "explore.ipynb")
    with serving(tmp_path, jupyter_env(tmp_path / "jupyter")) as server:
        yield server


KERNEL_IDLE = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
}"""


def test_notebook_runs_shows_the_diagram_and_the_slider_moves_the_readout(lab, chromium):
    token = urllib.parse.quote(lab["token"])
    with chromium() as browser:
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{lab['url']}lab/tree/explore.ipynb?token={token}", timeout=90 * SECONDS)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90 * SECONDS)
            page.wait_for_function(KERNEL_IDLE, timeout=90 * SECONDS)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")

            # the %%vkml --show program cell draws the tutorial's running-sum scan as an inline SVG
            svg = page.wait_for_selector(".jp-RenderedHTMLCommon .vkml-diagram > div > svg",
                                         state="visible", timeout=90 * SECONDS)
            drawn = svg.evaluate("s => s.outerHTML")
            assert ">scan<" in drawn and ">step of scan %2<" in drawn

            # the gradient explorer: its readout, then a slider moved with the mouse
            readout = page.wait_for_selector(".vkml-readout", timeout=90 * SECONDS)
            first = readout.inner_text()
            assert "f(x) = 1.33831" in first and "program cache: 1 trace, 0 hits" in first
            plot_src = page.locator(".widget-image").first.get_attribute("src")
            handle = page.locator(".widget-slider .noUi-handle").first
            handle.scroll_into_view_if_needed()
            box = handle.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] / 2 + 80, box["y"] + box["height"] / 2, steps=8)
            page.mouse.up()
            page.wait_for_function(
                "old => { const r = document.querySelector('.vkml-readout');"
                " return r && r.innerText !== old; }", arg=first, timeout=60 * SECONDS)
            moved = page.locator(".vkml-readout").inner_text()
            assert "f(x) = " in moved and "f(x) = 1.33831" not in moved
            assert "1 submission for this update; program cache: 1 trace, 1 hit" in moved
            page.wait_for_function(
                "old => { const i = document.querySelector('.widget-image');"
                " return i && i.getAttribute('src') !== old; }", arg=plot_src, timeout=30 * SECONDS)
            stderr = "application/vnd.jupyter.stderr"
            assert page.locator(f".jp-OutputArea-output[data-mime-type='{stderr}']").count() == 0
            assert not errors, errors
        except Exception:
            print(lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()
