"""A real browser opens notebook 07 in JupyterLab: its stored schedule pictures are drawn before
anything runs, then the notebook runs, the memory-budget slider is dragged with the mouse, and the
picture's caption (the predicted recomputed steps) changes with it; the run button then measures
what the caption predicted.

JupyterLab and Debian's chromium are started as in tests/test_browser_pictures.py (a free
localhost port, a random token, every Jupyter folder in a temporary directory, nothing fetched from
the network).  Screenshots go to tests/screenshots/ (git-ignored) for a person to look at.
"""

import json
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


from jupyterlab_server import jupyter_env, serving

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = "07-seeing-reverse-mode.ipynb"
SCREENSHOTS = ROOT / "tests" / "screenshots"
SECONDS = 1000  # playwright counts milliseconds

KERNEL_IDLE = """() => {
    const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
    return !!k && k.status === 'idle';
}"""

CAPTION = ".widget-html svg.vkml-schedule g.caption text"

#: True once the notebook's three stored schedule pictures are in the page as images.
STORED_SCHEDULES = """() => [...document.querySelectorAll('.jp-RenderedSVG img')]
    .filter(img => decodeURIComponent(img.src).includes('vkml-schedule')).length >= 3"""


@pytest.fixture
def notebook_lab(tmp_path):
    """JupyterLab serving a trusted copy of notebook 07 (as scripts/dev trusts the tutorials)."""
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, tmp_path / NOTEBOOK)
    env = jupyter_env(tmp_path / "jupyter")
    # attach every cell at once: by default JupyterLab attaches cells below the window only when
    # the CPU is idle, and a busy machine would leave the lower pictures undrawn
    tracker = Path(env["JUPYTERLAB_SETTINGS_DIR"]) / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    jupyter = Path(sys.executable).with_name("jupyter")
    subprocess.run([str(jupyter), "trust", str(tmp_path / NOTEBOOK)], env=env, check=True,
                   capture_output=True)
    with serving(tmp_path, env) as server:
        yield server


def recomputed(caption):
    """The recomputed steps a caption states ("recomputes 91 steps, ...")."""
    return int(re.search(r"recomputes ([\d,]+) step", caption).group(1).replace(",", ""))


def test_the_budget_slider_redraws_the_schedule_in_a_real_browser(notebook_lab, chromium):
    SCREENSHOTS.mkdir(exist_ok=True)
    lab = notebook_lab
    token = urllib.parse.quote(lab["token"])
    with chromium() as browser:
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{lab['url']}lab/tree/{NOTEBOOK}?token={token}", timeout=90 * SECONDS)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90 * SECONDS)

            # before anything runs: the stored schedule pictures are drawn, each within 1,000 px
            page.wait_for_function(STORED_SCHEDULES, timeout=90 * SECONDS)
            imgs = page.locator(".jp-RenderedSVG img")
            schedules = []
            for i in range(imgs.count()):
                src = urllib.parse.unquote(imgs.nth(i).get_attribute("src").split(",", 1)[1])
                if "vkml-schedule" in src:
                    schedules.append(imgs.nth(i))
            assert len(schedules) == 4          # three pictures and the explorer's stored one
            for img in schedules:
                img.scroll_into_view_if_needed()
                page.wait_for_function("img => img.complete && img.naturalWidth > 0",
                                       arg=img.element_handle(), timeout=30 * SECONDS)
                assert 0 < img.bounding_box()["width"] <= 1000

            # run it from a clean slate, and wait for the last cell's line
            page.wait_for_function(KERNEL_IDLE, timeout=90 * SECONDS)
            page.evaluate("window.jupyterapp.commands.execute('notebook:clear-all-cell-outputs')")
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_selector(".jp-OutputArea-output:has-text('measured: (91, 4)')",
                                   timeout=120 * SECONDS)
            page.wait_for_function(KERNEL_IDLE, timeout=60 * SECONDS)

            # the live explorer: its picture's caption, after the notebook set the budget to 4
            caption = page.locator(CAPTION)
            assert caption.count() == 1
            first = caption.text_content()
            assert recomputed(first) == 91, first
            readout = page.locator(".vkml-schedule-readout").inner_text()
            assert "91 recomputed steps" in readout and "nothing ran" in readout

            # drag the budget slider to the right: more states, fewer recomputed steps
            handle = page.locator(".widget-slider .noUi-handle").first
            handle.scroll_into_view_if_needed()
            box = handle.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] / 2 + 60, box["y"] + box["height"] / 2,
                            steps=8)
            page.mouse.up()
            page.wait_for_function(
                "([sel, old]) => { const t = document.querySelector(sel);"
                " return t && t.textContent !== old; }", arg=[CAPTION, first],
                timeout=60 * SECONDS)
            moved = page.locator(CAPTION).text_content()
            assert recomputed(moved) < 91, moved
            readout = page.locator(".vkml-schedule-readout").inner_text()
            assert f"{recomputed(moved):,} recomputed steps" in readout
            page.locator(".widget-html svg.vkml-schedule").scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "schedule-explorer-moved.png"))

            # run on request: the measured counts match the ones predicted
            page.locator("button:has-text('run the reverse with this budget')").click()
            page.wait_for_selector(".vkml-schedule-result table", timeout=60 * SECONDS)
            result = page.locator(".vkml-schedule-result").inner_text()
            assert result.count("✓") == 2 and "✗" not in result, result
            assert f"recomputed steps\t{recomputed(moved):,}\t{recomputed(moved):,}" in result
            page.screenshot(path=str(SCREENSHOTS / "schedule-explorer-run.png"))

            stderr = "application/vnd.jupyter.stderr"
            assert page.locator(f".jp-OutputArea-output[data-mime-type='{stderr}']").count() == 0
            assert not errors, errors
        except Exception:
            print(lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()


def test_the_stored_schedule_pictures_stay_readable_in_the_dark_theme(notebook_lab, chromium):
    from test_browser_pictures import CONTRAST, PAGE_BACKGROUND, luminance
    SCREENSHOTS.mkdir(exist_ok=True)
    lab = notebook_lab
    token = urllib.parse.quote(lab["token"])
    with chromium() as browser:
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, color_scheme="dark")
            page.goto(f"{lab['url']}lab/tree/{NOTEBOOK}?token={token}", timeout=90 * SECONDS)
            page.wait_for_function(STORED_SCHEDULES, timeout=90 * SECONDS)
            page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme',"
                          " {theme: 'JupyterLab Dark'})")
            page.wait_for_function(
                "document.body.getAttribute('data-jp-theme-light') === 'false'",
                timeout=60 * SECONDS)
            assert luminance(page.evaluate(PAGE_BACKGROUND)) < 0.1      # the theme is dark
            imgs = page.locator(".jp-RenderedSVG img")
            seen_any = 0
            for i in range(imgs.count()):
                img = imgs.nth(i)
                if "vkml-schedule" not in urllib.parse.unquote(img.get_attribute("src")):
                    continue
                img.scroll_into_view_if_needed()
                page.wait_for_function("img => img.complete && img.naturalWidth > 0",
                                       arg=img.element_handle(), timeout=30 * SECONDS)
                seen = img.evaluate(CONTRAST)
                # its own opaque background, dark in a dark colour scheme, and text that stands out
                assert seen["alpha"] == 255 and seen["background"] < 0.1, seen
                assert seen["contrast"] >= 7, seen
                seen_any += 1
                page.screenshot(path=str(SCREENSHOTS / f"schedule-dark-{seen_any}.png"))
            assert seen_any == 4                # (with the explorer's stored picture)
        except Exception:
            print(lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()
