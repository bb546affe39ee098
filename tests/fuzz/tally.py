"""How many inputs each fuzz area tried, and how long it took: printed at the end of the run
and written to ``tests/fuzz/.out/summary.json`` (git-ignored)."""

import json
import os
import time
from contextlib import contextmanager

#: area -> {"inputs": cases tried, "seconds": time spent in them, "known": cases skipped as known}
AREAS = {}

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".out")


def _area(name):
    return AREAS.setdefault(name, {"inputs": 0, "seconds": 0.0, "known": 0})


@contextmanager
def trying(area, count=1):
    """Count ``count`` inputs tried in ``area``, and the time they took."""
    start = time.perf_counter()
    try:
        yield
    finally:
        a = _area(area)
        a["inputs"] += count
        a["seconds"] += time.perf_counter() - start


def known(area):
    """One generated input left out because it hits a known, recorded failure."""
    _area(area)["known"] += 1


def note(area, what):
    """Count one case of ``area`` that showed ``what`` (e.g. that it ran generated C)."""
    notes = _area(area).setdefault("notes", {})
    notes[what] = notes.get(what, 0) + 1


def lines():
    out = [f"fuzz {name}: {a['inputs']} inputs in {a['seconds']:.1f} s"
           + (f" ({a['known']} left out as known failures)" if a["known"] else "")
           + "".join(f"; {v} {k}" for k, v in sorted(a.get("notes", {}).items()))
           for name, a in sorted(AREAS.items())]
    if out:
        out.append(f"fuzz, all areas: {sum(a['inputs'] for a in AREAS.values())} inputs in "
                   f"{sum(a['seconds'] for a in AREAS.values()):.1f} s")
    return out


def write():
    if not AREAS:
        return
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, "summary.json"), "w") as f:
        json.dump(AREAS, f, indent=1, sort_keys=True)
