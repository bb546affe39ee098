"""Every public entry point refuses bad arguments with a ``vkml.VkmlError`` -- or takes them.

One test per entry and backend (the cpu tier for the entries that compute; see ``entries.py`` for the battery and how each call is
made); the entries that leak another exception today (a NumPy ``ValueError``,
a bare ``TypeError``...) or hang are strict xfails listed in
``known_leaks.py``, with the first leak as the reason.  The assertion message
lists every leaking call, so the count per entry is in the test output.
"""

import pytest

from . import entries, tally
from .known_leaks import KNOWN_LEAKS


def _params():
    computing = set(entries.computing_entries())
    out = []
    for name in entries.entry_names():
        for backend in ("numpy", "cpu") if name in computing else ("numpy",):
            marks = [pytest.mark.xfail(strict=True, reason=f"known: {KNOWN_LEAKS[name]}")] \
                if name in KNOWN_LEAKS else []
            out.append(pytest.param(name, backend, marks=marks))
    return out


@pytest.mark.parametrize("entry, backend", _params())
def test_bad_arguments_raise_vkml_errors(worker, entry, backend):
    with tally.trying("public entries", count=0):
        outcome = worker.call("entries:run_entry", {"entry": entry, "backend": backend}, timeout=600)
    assert outcome.ok, f"{entry}: {outcome.status}: {outcome.detail}"
    assert outcome.value["baseline"] is None, \
        f"{entry} fails even on good arguments (a bug of this suite): {outcome.value['baseline']}"
    tally.AREAS["public entries"]["inputs"] += outcome.value["tried"]
    leaks = outcome.value["leaks"]
    assert not leaks, f"{entry}: {len(leaks)} of {outcome.value['tried']} bad calls leaked:\n" + \
        "\n".join(leaks)
