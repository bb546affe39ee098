"""A real browser opens a tutorial WITHOUT running it: its stored diagrams are drawn (the set-up
trusts the checked-in notebooks), and they stay readable when JupyterLab switches to its dark theme.

JupyterLab and Debian's chromium are started as in tests/test_browser.py (a free localhost port, a
random token, every Jupyter folder in a temporary directory, nothing fetched from the network).
Screenshots go to tests/screenshots/ (git-ignored) for a person to look at.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is in the test extra: run scripts/dev test")
CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (scripts/dev test installs it)",
                allow_module_level=True)

from test_browser import free_port, wait_for_server  # noqa: E402  (after the skips above)

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = "02-programs-and-scan.ipynb"
SCREENSHOTS = ROOT / "tests" / "screenshots"
SECONDS = 1000  # playwright counts milliseconds


def jupyter_env(home: Path) -> dict:
    dirs = {name: home / name
            for name in ("config", "data", "runtime", "settings", "workspaces", "ipython")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    (dirs["config"] / "jupyter_lab_config.json").write_text(json.dumps({"LabApp": {
        "news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
        "extension_manager": "readonly"}}))
    news = dirs["settings"] / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True, exist_ok=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    return dict(os.environ, JUPYTER_CONFIG_DIR=str(dirs["config"]),
                JUPYTER_DATA_DIR=str(dirs["data"]), JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
                JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
                JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
                IPYTHONDIR=str(dirs["ipython"]), VKML_BACKEND="numpy", JUPYTER_PLATFORM_DIRS="1")


@pytest.fixture
def tutorial_lab(tmp_path):
    """JupyterLab serving a copy of a checked-in tutorial, trusted as scripts/dev trusts it."""
    shutil.copy(ROOT / "notebooks" / TUTORIAL, tmp_path / TUTORIAL)
    env = jupyter_env(tmp_path / "jupyter")
    jupyter = Path(sys.executable).with_name("jupyter")
    subprocess.run([str(jupyter), "trust", str(tmp_path / TUTORIAL)], env=env, check=True,
                   capture_output=True)
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
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # the session this test started: server, kernels
            proc.wait(timeout=10)


#: Draws a rendered <img> into a canvas and reports its background (a corner pixel) and the
#: largest WCAG contrast ratio between that background and any pixel of the picture (its text and
#: lines), so "readable" is measured on what the browser really drew.
CONTRAST = """img => {
    const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const ctx = c.getContext('2d');
    ctx.drawImage(img, 0, 0);
    const data = ctx.getImageData(0, 0, c.width, c.height).data;
    const lum = (r, g, b) => {
        const f = v => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
        return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
    };
    const i0 = (2 * c.width + 2) * 4;
    const bg = lum(data[i0], data[i0 + 1], data[i0 + 2]);
    let best = 1;
    for (let i = 0; i < data.length; i += 4) {
        if (data[i + 3] < 255) continue;
        const l = lum(data[i], data[i + 1], data[i + 2]);
        const ratio = (Math.max(l, bg) + 0.05) / (Math.min(l, bg) + 0.05);
        if (ratio > best) best = ratio;
    }
    return {background: bg, alpha: data[i0 + 3], contrast: best, width: c.width};
}"""

PAGE_BACKGROUND = """() => {
    const el = document.querySelector('.jp-OutputArea-output') || document.body;
    let node = el, colour = 'rgba(0, 0, 0, 0)';
    while (node && (colour === 'rgba(0, 0, 0, 0)' || colour === 'transparent')) {
        colour = getComputedStyle(node).backgroundColor; node = node.parentElement;
    }
    return colour;
}"""


def open_tutorial(page, lab):
    token = urllib.parse.quote(lab["token"])
    page.goto(f"{lab['url']}lab/tree/{TUTORIAL}?token={token}", timeout=90 * SECONDS)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90 * SECONDS)


def stored_diagrams(page):
    """The tutorial's stored SVG outputs as drawn images (none are drawn in an untrusted one)."""
    page.wait_for_selector(".jp-RenderedSVG img", timeout=60 * SECONDS)
    imgs = page.locator(".jp-RenderedSVG img")
    for i in range(imgs.count()):
        imgs.nth(i).scroll_into_view_if_needed()
        page.wait_for_function("img => img.complete && img.naturalWidth > 0",
                               arg=imgs.nth(i).element_handle(), timeout=30 * SECONDS)
    return imgs


def launch(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, args=[
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--no-proxy-server"])


def luminance(css):
    r, g, b = (float(x) for x in re.findall(r"[\d.]+", css)[:3])
    f = [(v / 255) / 12.92 if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4
         for v in (r, g, b)]
    return 0.2126 * f[0] + 0.7152 * f[1] + 0.0722 * f[2]


def test_a_tutorial_opens_with_its_diagrams_drawn_without_running(tutorial_lab):
    SCREENSHOTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = launch(pw)
        try:
            # an output area about as wide as the (1,220 px)
            page = browser.new_page(viewport={"width": 1650, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            open_tutorial(page, tutorial_lab)
            imgs = stored_diagrams(page)
            # the program picture and the derivative picture, both stored, both drawn
            assert imgs.count() >= 2
            sources = [urllib.parse.unquote(imgs.nth(i).get_attribute("src").split(",", 1)[1])
                       for i in range(imgs.count())]
            assert all(s.lstrip().startswith(("<?xml", "<svg")) for s in sources)
            assert any(">transposed<" in s for s in sources)
            # nothing ran: no cell has an execution count from this session
            assert page.locator(".jp-InputPrompt:has-text('[*]')").count() == 0
            # every picture is at most 1,000 px wide: it fits the output area, no scroll bar
            area = page.locator(".jp-OutputArea-output").first.bounding_box()["width"]
            for i in range(imgs.count()):
                assert imgs.nth(i).bounding_box()["width"] <= min(1000, area) + 1
            imgs.last.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "tutorial-light.png"), full_page=False)
            assert not errors, errors
        except Exception:
            print(tutorial_lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()


def test_diagrams_stay_readable_in_the_dark_theme(tutorial_lab):
    SCREENSHOTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000},
                                    color_scheme="dark")
            open_tutorial(page, tutorial_lab)
            stored_diagrams(page)
            page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme',"
                          " {theme: 'JupyterLab Dark'})")
            page.wait_for_function(
                "document.body.getAttribute('data-jp-theme-light') === 'false'",
                timeout=60 * SECONDS)
            assert luminance(page.evaluate(PAGE_BACKGROUND)) < 0.1      # the theme is dark
            imgs = stored_diagrams(page)
            for i in range(imgs.count()):
                img = imgs.nth(i)
                img.scroll_into_view_if_needed()
                seen = img.evaluate(CONTRAST)
                # the picture brings its own opaque background, dark in a dark colour scheme,
                # and its text and lines stand out from it
                assert seen["alpha"] == 255, seen
                assert seen["background"] < 0.1, seen
                assert seen["contrast"] >= 7, seen
            imgs.last.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "tutorial-dark.png"), full_page=False)
        except Exception:
            print(tutorial_lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()
