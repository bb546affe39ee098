"""A real browser opens a tutorial WITHOUT running it: its stored diagrams are drawn inline (the set-up
trusts the checked-in notebooks), hovering a box shows its source line, and they stay readable when
JupyterLab switches to its dark theme; an untrusted copy shows the pictures' text instead.

JupyterLab and Debian's chromium are started as in tests/test_browser.py (a free localhost port, a
random token, every Jupyter folder in a temporary directory, nothing fetched from the network).
Screenshots go to tests/screenshots/ (git-ignored) for a person to look at.
"""

import io
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
TUTORIAL = "02-programs-and-scan.ipynb"
SCREENSHOTS = ROOT / "tests" / "screenshots"
SECONDS = 1000  # playwright counts milliseconds


def serve_tutorial(tmp_path, trusted):
    """JupyterLab serving a copy of a checked-in tutorial, trusted as scripts/dev trusts it, or not."""
    shutil.copy(ROOT / "notebooks" / TUTORIAL, tmp_path / TUTORIAL)
    env = jupyter_env(tmp_path / "jupyter")
    if trusted:
        jupyter = Path(sys.executable).with_name("jupyter")
        subprocess.run([str(jupyter), "trust", str(tmp_path / TUTORIAL)], env=env, check=True,
                       capture_output=True)
    return serving(tmp_path, env)


@pytest.fixture
def tutorial_lab(tmp_path):
    with serve_tutorial(tmp_path, trusted=True) as server:
        yield server


@pytest.fixture
def untrusted_lab(tmp_path):
    with serve_tutorial(tmp_path, trusted=False) as server:
        yield server


def seen_contrast(png):
    """A screenshot's background (a corner pixel's luminance) and the largest WCAG contrast ratio
    between it and any pixel of the picture (its text and lines): "readable" is measured on what the
    browser really drew."""
    from PIL import Image
    img = Image.open(io.BytesIO(png)).convert("RGB")
    background = luminance_rgb(img.getpixel((2, 2)))
    lums = {luminance_rgb(rgb) for _, rgb in img.getcolors(img.width * img.height)}
    contrast = max((max(l, background) + 0.05) / (min(l, background) + 0.05) for l in lums)
    return {"background": background, "contrast": contrast, "width": img.width}


#: Draws a rendered <img> into a canvas (test_browser_schedule: schedule pictures are images) and reports its background (a corner pixel) and the
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


def stored_diagrams(page, expect):
    """The tutorial's stored pictures, drawn as SVG inline in their HTML output (which keeps the
    <title> tooltips an <img> would lose)."""
    # (one picture, or the first tab of a derived picture's tabs: the one shown)
    svgs = page.locator(".jp-RenderedHTMLCommon .vkml-diagram > div.vkml-svg:not(.vkml-tabs) > svg, "
                        ".jp-RenderedHTMLCommon .vkml-diagram .vkml-tab-panel:first-of-type > svg")
    expect(svgs).to_have_count(len(stored_picture_texts()), timeout=60 * SECONDS)
    for i in range(svgs.count()):
        svgs.nth(i).scroll_into_view_if_needed()
        assert svgs.nth(i).is_visible()
    return svgs


#: The tooltip a browser shows for the element under the pointer: the nearest element (itself or
#: an ancestor) with a <title> child.  Also whether that element is really hovered.
TOOLTIP_UNDER = """([x, y]) => {
    let el = document.elementFromPoint(x, y);
    const under = el ? el.tagName : null;
    while (el && ![...el.children].some(c => c.tagName === 'title')) el = el.parentElement;
    if (!el) return {under, title: null};
    const title = [...el.children].find(c => c.tagName === 'title');
    return {under, title: title.textContent, hovered: el.matches(':hover')};
}"""


def visible_part(page, element):
    """A screenshot of the element from its top down to the bottom of the window (the notebook
    scrolls inside its own panel, so a picture taller than the window cannot be taken whole)."""
    element.evaluate("e => e.scrollIntoView({block: 'start'})")
    box = element.bounding_box()
    height = min(box["height"], page.viewport_size["height"] - box["y"])
    return page.screenshot(clip={"x": box["x"], "y": box["y"], "width": box["width"],
                                 "height": height})


def stored_picture_texts():
    """The text form of each picture the tutorial stores, in order."""
    cells = json.loads((ROOT / "notebooks" / TUTORIAL).read_text())["cells"]
    return ["".join(o["data"]["text/plain"]) for c in cells for o in c.get("outputs", [])
            if "vkml-diagram" in "".join(o.get("data", {}).get("text/html", ""))]


def code_lines():
    """Every line of the tutorial's code cells, stripped."""
    cells = json.loads((ROOT / "notebooks" / TUTORIAL).read_text())["cells"]
    return {line.strip() for c in cells if c["cell_type"] == "code"
            for line in "".join(c["source"]).splitlines() if line.strip()}



def luminance(css):
    return luminance_rgb(float(x) for x in re.findall(r"[\d.]+", css)[:3])


def luminance_rgb(rgb):
    f = [(v / 255) / 12.92 if v / 255 <= 0.03928 else ((v / 255 + 0.055) / 1.055) ** 2.4
         for v in rgb]
    return 0.2126 * f[0] + 0.7152 * f[1] + 0.0722 * f[2]


def test_a_tutorial_opens_with_its_diagrams_drawn_without_running(tutorial_lab, chromium, expect):
    SCREENSHOTS.mkdir(exist_ok=True)
    with chromium() as browser:
        try:
            # an output area about as wide as the (1,220 px)
            page = browser.new_page(viewport={"width": 1650, "height": 1000})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            open_tutorial(page, tutorial_lab)
            svgs = stored_diagrams(page, expect)
            # the program picture and the derivative picture, both stored, both drawn
            assert svgs.count() >= 2
            sources = [svgs.nth(i).evaluate("svg => svg.outerHTML") for i in range(svgs.count())]
            # (the derivative picture is tabs: the primal shown, the transposed program a tab)
            assert page.locator(".vkml-tabs > label", has_text="transposed").count() >= 1
            assert sources
            assert page.locator(".jp-RenderedSVG img").count() == 0     # inline, not an <img>
            # nothing ran: no cell has an execution count from this session
            assert page.locator(".jp-InputPrompt:has-text('[*]')").count() == 0
            # every picture is at most 1,000 px wide: it fits the output area, no scroll bar
            area = page.locator(".jp-OutputArea-output").first.bounding_box()["width"]
            for i in range(svgs.count()):
                assert svgs.nth(i).bounding_box()["width"] <= min(1000, area) + 1
            svgs.last.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "tutorial-light.png"), full_page=False)
            assert not errors, errors
        except Exception:
            print(tutorial_lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()


def test_diagrams_stay_readable_in_the_dark_theme(tutorial_lab, chromium, expect):
    SCREENSHOTS.mkdir(exist_ok=True)
    with chromium() as browser:
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000},
                                    color_scheme="dark")
            open_tutorial(page, tutorial_lab)
            stored_diagrams(page, expect)
            page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme',"
                          " {theme: 'JupyterLab Dark'})")
            page.wait_for_function(
                "document.body.getAttribute('data-jp-theme-light') === 'false'",
                timeout=60 * SECONDS)
            assert luminance(page.evaluate(PAGE_BACKGROUND)) < 0.1      # the theme is dark
            svgs = stored_diagrams(page, expect)
            for i in range(svgs.count()):
                seen = seen_contrast(visible_part(page, svgs.nth(i)))
                # the picture brings its own background, dark in a dark theme, and its text and
                # lines stand out from it
                assert seen["background"] < 0.1, seen
                assert seen["contrast"] >= 7, seen
            svgs.last.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "tutorial-dark.png"), full_page=False)
        except Exception:
            print(tutorial_lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()


def test_hovering_a_program_box_shows_its_source_line(tutorial_lab, chromium, expect):
    """A native tooltip cannot be screenshotted: the proof is the <title> of the hovered element."""
    with chromium() as browser:
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            open_tutorial(page, tutorial_lab)
            program = stored_diagrams(page, expect).first
            box = program.locator("g.node text", has_text=re.compile(r"^scan$")).first
            box.scroll_into_view_if_needed()
            box.hover()
            at = box.bounding_box()
            seen = page.evaluate(TOOLTIP_UNDER, [at["x"] + at["width"] / 2,
                                                 at["y"] + at["height"] / 2])
            assert seen["under"] == "text" and seen["hovered"], seen
            # "cell In[<n>], line <line>: <the line>", the line as the tutorial's cell wrote it
            where = re.fullmatch(r"cell In\[\d+\], line \d+: (.+)", seen["title"])
            assert where, seen
            assert where.group(1).strip() in code_lines(), seen
            assert "vkml.scan(" in where.group(1)
        except Exception:
            print(tutorial_lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()


def test_an_untrusted_tutorial_shows_its_pictures_as_text(untrusted_lab, chromium, expect):
    """JupyterLab sanitizes an untrusted notebook's HTML: the SVG goes, the text stays readable."""
    texts = stored_picture_texts()
    assert len(texts) >= 2
    with chromium() as browser:
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            open_tutorial(page, untrusted_lab)
            page.wait_for_selector(".vkml-diagram pre", timeout=60 * SECONDS)
            shown = page.locator(".vkml-diagram pre")
            expect(shown).to_have_count(len(texts), timeout=30 * SECONDS)
            for i, text in enumerate(texts):
                shown.nth(i).scroll_into_view_if_needed()
                expect(shown.nth(i)).to_be_visible(timeout=30 * SECONDS)
                expect(shown.nth(i)).to_have_text(text, use_inner_text=True,
                                                           timeout=30 * SECONDS)
            # no picture and no jumble of its labels: what is left of the SVG is hidden
            assert page.locator(".vkml-diagram svg").count() == 0
            for i in range(page.locator(".vkml-diagram > div").count()):
                assert not page.locator(".vkml-diagram > div").nth(i).is_visible()
        except Exception:
            print(untrusted_lab["log"].read_text()[-4000:])
            raise
        finally:
            browser.close()
