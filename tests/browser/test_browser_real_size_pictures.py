"""The pictures of real-sized programs, measured where the user sees them: in a browser, as the
notebook shows them (the ``text/html`` output), in light and in JupyterLab's dark theme.

For each of four pictures (two MLP gradients, an RK4 scan's gradient, a model's pending loss):
every tab at most 1,200 x 2,400 px with no text under 10 px, the user's names shown, hover titles
on the boxes, "every equation" opening and closing with a click, and text that stands out from
its box in both themes.  Screenshots go to tests/screenshots/.
"""

import html
from pathlib import Path

import pytest

from real_size_models import PICTURES

pytestmark = pytest.mark.timeout(600)


SCREENSHOTS = Path(__file__).resolve().parents[1] / "screenshots"
MAX_W, MAX_H, MIN_TEXT = 1200, 2400, 10

#: what a notebook's output area looks like around the picture, light or dark (JupyterLab marks
#: its theme on <body>)
PAGE = """<!doctype html><html><head><meta charset="utf-8"></head>
<body data-jp-theme-light="{light}" style="background: {background}; margin: 8px">{picture}</body></html>"""

#: per visible picture: its size, the smallest text's height, how many boxes carry a title
MEASURE = """() => {
  // (a closed <details> keeps its content laid out but hidden: checkVisibility says which)
  const shown = [...document.querySelectorAll('.vkml-diagram svg')].filter(s => {
      const r = s.getBoundingClientRect();
      return r.width > 0 && r.height > 0 && s.checkVisibility({visibilityProperty: true}); });
  return shown.map(s => {
    const r = s.getBoundingClientRect();
    const heights = [...s.querySelectorAll('text')].map(t => t.getBoundingClientRect().height)
        .filter(h => h > 0);
    const titled = [...s.querySelectorAll('g.node')].filter(g => g.querySelector('title')).length;
    return {width: r.width, height: r.height, smallest: Math.min(...heights), titled,
            nodes: s.querySelectorAll('g.node').length};
  });
}"""


@pytest.fixture(scope="module")
def browser(chromium):
    with chromium() as b:
        yield b


def _page(browser, tmp_path, name, light):
    picture = PICTURES[name][0]()._repr_mimebundle_()["text/html"]
    path = tmp_path / f"{name}-{'light' if light else 'dark'}.html"
    path.write_text(PAGE.format(light="true" if light else "false",
                                background="#ffffff" if light else "#111111", picture=picture))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(path.as_uri())
    page.wait_for_selector(".vkml-diagram svg")
    return page, picture


@pytest.mark.parametrize("light", [True, False], ids=["light", "dark"])
@pytest.mark.parametrize("name", sorted(PICTURES))
def test_a_real_sized_picture_fits_a_cell_readable_named_and_hoverable(browser, tmp_path, name,
                                                                       light):
    page, picture = _page(browser, tmp_path, name, light)
    try:
        assert PICTURES[name][1] in html.unescape(picture), f"{name}: the user's names"
        tabs = page.locator("label[for]")
        for i in range(max(1, tabs.count())):
            if tabs.count():
                tabs.nth(i).click()
            shown = page.evaluate(MEASURE)
            assert len(shown) == 1, shown
            seen = shown[0]
            assert seen["width"] <= MAX_W and seen["height"] <= MAX_H, (name, i, seen)
            assert seen["smallest"] >= MIN_TEXT, (name, i, seen)
            assert seen["titled"] >= 1, (name, i, seen)           # hover shows the lines
            page.screenshot(path=str(SCREENSHOTS / f"picture-{name}-{i}-"
                                     f"{'light' if light else 'dark'}.png"), full_page=True)
        # every equation: a click opens it (another picture), another click closes it
        details = page.locator("details.vkml-detail")
        if details.count():
            summary = page.locator("details.vkml-detail > summary").first
            if not summary.is_visible() and tabs.count():
                for i in range(tabs.count()):
                    tabs.nth(i).click()
                    if summary.is_visible():
                        break
            before = len(page.evaluate(MEASURE))
            summary.click()
            assert len(page.evaluate(MEASURE)) == before + 1
            summary.click()
            assert len(page.evaluate(MEASURE)) == before
    finally:
        page.close()


def test_the_dark_theme_keeps_box_text_readable(browser, tmp_path):
    page, _ = _page(browser, tmp_path, "model_loss", light=False)
    try:
        colours = page.evaluate("""() => {
          const t = document.querySelector('.vkml-diagram svg g.node text');
          const g = t.closest('g.node').querySelector('path, polygon, ellipse');
          const bg = getComputedStyle(document.querySelector('.vkml-diagram svg g.graph > polygon')).fill;
          return {text: getComputedStyle(t).fill, box: g.getAttribute('fill'), page: bg};
        }""")
        # boxes keep their light fills and dark text; the picture's background turns dark
        assert colours["text"] in ("rgb(17, 24, 39)", "#111827"), colours
        assert colours["page"] in ("rgb(17, 24, 39)", "#111827"), colours
    finally:
        page.close()
