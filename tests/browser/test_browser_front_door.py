"""A fresh lab session as the README's command makes it, in a real browser: nothing covers the
outputs, a tutorial opened before it runs shows pictures (no broken widgets), one that runs shows
its explorers, and nbconvert's HTML export of the explorer tutorial shows a picture for each.

The screenshots go to tests/screenshots/; with ``VKML_README_PICTURES=1`` the two the README
shows (a derivative picture, a gradient explorer) are written to docs/images/ too.
"""

import os
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)


from jupyterlab_server import jupyter_env, serving

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "tests" / "screenshots"
README_PICTURES = ROOT / "docs" / "images"
README_NAMES = ("derivative.png", "explorer.png")
SECONDS = 1000  # playwright counts milliseconds
NEWS = "official Jupyter news"

KERNEL_IDLE = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
}"""
ALL_RAN = """() => {
    const cells = document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt');
    return cells.length > 0 && [...cells].every(p => /\\[\\d+\\]/.test(p.textContent));
}"""


def _save(png: bytes, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    (SCREENSHOTS / name).write_bytes(png)
    if os.environ.get("VKML_README_PICTURES") == "1" and name in README_NAMES:
        (README_PICTURES / name).write_bytes(png)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on a copy of the tutorials, with the project's own lab configuration (no test
    settings of ours), the tutorials trusted as ``scripts/dev`` trusts them."""
    settings = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    assert settings.is_file(), f"{settings} is missing: scripts/dev sets the lab up (run it)"
    root = tmp_path_factory.mktemp("lab")
    for nb in (ROOT / "notebooks").glob("0*.ipynb"):
        shutil.copy(nb, root / nb.name)
    env = jupyter_env(root / "jupyter", quiet=False)
    subprocess.run([sys.executable, "-m", "jupyter", "trust", *map(str, root.glob("0*.ipynb"))],
                   env=env, check=True, capture_output=True)
    with serving(root, env) as server:
        yield server


@pytest.fixture(scope="module")
def browser(chromium):
    with chromium() as b:
        yield b


def _open(browser, lab, name, run=False):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{lab['url']}lab/tree/{name}?token={urllib.parse.quote(lab['token'])}",
              timeout=90 * SECONDS)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90 * SECONDS)
    if run:
        page.wait_for_function(KERNEL_IDLE, timeout=90 * SECONDS)
        page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        page.wait_for_function(ALL_RAN, timeout=300 * SECONDS)
        page.wait_for_function(KERNEL_IDLE, timeout=300 * SECONDS)
    return page


def test_a_fresh_session_shows_no_pop_up_and_a_stored_tutorial_no_broken_widget(browser, lab):
    page = _open(browser, lab, "05-gradient-explorer.ipynb")
    try:
        time.sleep(4)                  # (the news question comes a moment after the page loads)
        body = page.inner_text("body")
        assert NEWS not in body, "JupyterLab asks about news over the outputs"
        assert page.locator(".jp-toast-container .Toastify__toast").count() == 0
        assert "Error displaying widget" not in body and "Loading widget" not in body
        pictures = page.locator(".jp-OutputArea-output img, .jp-OutputArea-output svg").count()
        assert pictures >= 4, pictures            # the magic's picture and three explorers
        _save(page.screenshot(full_page=False), "fresh-tutorial-05.png")
    finally:
        page.close()


def test_the_readme_pictures_come_from_the_tutorials(browser, lab, tmp_path):
    """The README's two pictures: tutorial 7's derivative picture (from the tutorial as its HTML
    export shows it, stored outputs and all), and tutorial 5's gradient explorer, live in the
    lab after the tutorial ran."""
    page = _exported(browser, tmp_path, "07-seeing-reverse-mode.ipynb")
    try:
        picture = page.locator(".vkml-diagram").filter(has_text="transposed").first
        picture.scroll_into_view_if_needed()
        picture.locator("label", has_text="transposed").click()     # the gradient's own tab
        _save(picture.screenshot(), "derivative.png")
    finally:
        page.close()
    page = _open(browser, lab, "05-gradient-explorer.ipynb", run=True)
    try:
        readout = page.locator(".vkml-readout").first
        readout.wait_for(timeout=60 * SECONDS)
        readout.scroll_into_view_if_needed()
        explorer = readout.locator("xpath=ancestor::div[contains(@class, 'jp-OutputArea-output')][1]")
        explorer.scroll_into_view_if_needed()
        assert "f(x)" in explorer.inner_text()
        _save(explorer.screenshot(), "explorer.png")
        assert NEWS not in page.inner_text("body")
    finally:
        page.close()
    for name in README_NAMES:
        assert (README_PICTURES / name).is_file() and name in (ROOT / "README.md").read_text()


def _exported(browser, folder, name):
    """A page showing nbconvert's HTML export of tutorial ``name`` (as a static site would)."""
    shutil.copy(ROOT / "notebooks" / name, folder / name)
    subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", name], cwd=folder,
                   check=True, capture_output=True, timeout=300)
    page = browser.new_page(viewport={"width": 1200, "height": 2400})
    page.goto((folder / name.replace(".ipynb", ".html")).as_uri())
    page.wait_for_selector(".jp-Notebook", timeout=60 * SECONDS)
    return page


def test_the_nbconvert_html_of_tutorial_5_shows_its_pictures_and_explorers(browser, tmp_path):
    page = _exported(browser, tmp_path, "05-gradient-explorer.ipynb")
    try:
        outputs = page.locator(".jp-OutputArea-output")
        drawn = [i for i in range(outputs.count())
                 if outputs.nth(i).locator("img, svg").count() > 0]
        assert len(drawn) >= 4, len(drawn)
        for i in drawn:
            box = outputs.nth(i).bounding_box()
            assert box and box["width"] > 100 and box["height"] > 50, (i, box)
        _save(page.screenshot(full_page=True), "nbconvert-tutorial-05.png")
    finally:
        page.close()
