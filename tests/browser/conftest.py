"""The harness of the browser tests: JupyterLab driven in Debian's headless Chromium through
playwright.

Every test here is marked ``browser`` and skipped, with the reason, where playwright (the test
extra) or the ``chromium`` binary is missing.  ``chromium()`` starts the browser (one context
manager call per use: headless, no sandbox -- containers run as root -- no GPU, nothing fetched
from the network); JupyterLab itself is started by ``jupyterlab_server.serving`` on a free
localhost port with a random token and every Jupyter folder in a temporary directory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

#: Chromium's switches for a test run
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--no-proxy-server"]


def _missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if importlib.util.find_spec("playwright") is None:
        return "playwright is in the test extra: run scripts/dev test"
    if shutil.which("chromium") is None:
        return "Debian's chromium is not installed (scripts/dev test installs it)"
    return None


def pytest_collection_modifyitems(config, items):
    missing = _missing()
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.browser)
            if missing:
                item.add_marker(pytest.mark.skip(reason=missing))


@pytest.fixture(scope="session")
def chromium():
    """``with chromium() as browser:`` -- a headless Chromium, closed when the block ends."""
    @contextlib.contextmanager
    def launched(**options):
        from playwright import sync_api      # the test extra: only where the tests run
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=shutil.which("chromium"),
                                         args=CHROMIUM_ARGS, **options)
            try:
                yield browser
            finally:
                browser.close()
    return launched


@pytest.fixture(scope="session")
def expect():
    """playwright's ``expect`` (assertions that wait)."""
    from playwright import sync_api
    return sync_api.expect
