"""A real browser: JupyterLab in headless Chromium runs a notebook, shows a diagram, and a gradient
explorer's readout follows a slider the browser moves.

JupyterLab is started on a free localhost port with a random token (token auth stays on), with its
config, data, runtime, settings and workspace folders in a temporary directory and nothing fetched
from the network.  Chromium is Debian's (``apt-get install chromium``; ``scripts/dev test`` does
it), driven by the ``playwright`` package from the test extra -- ``playwright install`` is never
run.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import nbformat
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is in the test extra: run scripts/dev test")
CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (scripts/dev test installs it)",
                allow_module_level=True)

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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_server(url, token, proc, log, deadline):
    # localhost, never through a proxy
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            req = urllib.request.Request(url + "api/status",
                                         headers={"Authorization": f"token {token}"})
            with opener.open(req, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.25)
    pytest.fail(f"jupyter lab did not answer in time:\n{log.read_text()[-3000:]}")


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on a free localhost port with a random token, serving ``tmp_path``."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "explore.ipynb")
    home = tmp_path / "jupyter"
    dirs = {name: home / name
            for name in ("config", "data", "runtime", "settings", "workspaces", "ipython")}
    for d in dirs.values():
        d.mkdir(parents=True)
    # No announcements, update checks or PyPI lookups: the test never touches the network.
    (dirs["config"] / "jupyter_lab_config.json").write_text(json.dumps({"LabApp": {
        "news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
        "extension_manager": "readonly"}}))
    news = dirs["settings"] / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(dirs["config"]),
               JUPYTER_DATA_DIR=str(dirs["data"]), JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
               JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
               JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]), IPYTHONDIR=str(dirs["ipython"]),
               VKML_BACKEND="numpy", JUPYTER_PLATFORM_DIRS="1")
    token = os.urandom(24).hex()
    port = free_port()
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.token={token}",
            f"--ServerApp.root_dir={tmp_path}", "--expose-app-in-browser"]
    if os.geteuid() == 0:  # CI containers run as root; Jupyter refuses root without this
        args.append("--allow-root")
    log = tmp_path / "lab.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_server(url, token, proc, log, time.monotonic() + 90)
        yield {"url": url, "token": token, "log": log}
    finally:
        proc.send_signal(signal.SIGINT)   # jupyter's clean stop: it shuts its kernels down
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the session this test started: server, kernels
            proc.wait(timeout=10)


KERNEL_IDLE = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
}"""


def test_notebook_runs_shows_the_diagram_and_the_slider_moves_the_readout(lab):
    token = urllib.parse.quote(lab["token"])
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--no-proxy-server"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{lab['url']}lab/tree/explore.ipynb?token={token}", timeout=90 * SECONDS)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90 * SECONDS)
            page.wait_for_function(KERNEL_IDLE, timeout=90 * SECONDS)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")

            # the %%vkml --show program cell draws the seed's scan program as an SVG image
            svg = page.wait_for_selector(".jp-RenderedSVG img", timeout=90 * SECONDS)
            src = svg.get_attribute("src")
            assert src.startswith("data:image/svg+xml")
            drawn = urllib.parse.unquote(src.split(",", 1)[1])
            assert "<svg" in drawn and ">scan<" in drawn and ">step of scan %2<" in drawn
            page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=svg,
                                   timeout=30 * SECONDS)

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
