"""Sizes far beyond memory are refused with a ``vkml.VkmlError``, never allocated, never a crash.

Each call runs in the worker (see ``huge.py``), on the NumPy backend and on
the cpu tier.  Today's failures are strict xfails, one per (call, backend).
"""

import pytest

from . import huge, tally

#: (case, backend) -> why it fails today
KNOWN = {}


def _params():
    out = []
    for case in huge.CASES:
        for backend in ("numpy", "cpu"):
            why = KNOWN.get((case, backend))
            mark = [pytest.mark.xfail(strict=True, reason=f"known: {why}")] if why else []
            out.append(pytest.param(case, backend, marks=mark))
    return out


@pytest.mark.parametrize("case, backend", _params())
def test_huge_sizes_are_refused_cleanly(worker, case, backend):
    with tally.trying("huge sizes"):
        outcome = worker.call("huge:run", {"case": case, "backend": backend}, timeout=60)
    assert outcome.ok, f"{case} on {backend}: {outcome.status}: {outcome.detail}"
    result = outcome.value
    assert result["error"] is not None, f"{case} on {backend} was not refused"
    assert result["vkml"], f"{case} on {backend}: {result['error']}: {result['message']}"
