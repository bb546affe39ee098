"""Sizes far beyond memory are refused with a ``vkml.VkmlError``, never allocated, never a crash.

Each call runs in the worker (see ``huge.py``), on the NumPy backend and on
the cpu tier.  Today's failures are strict xfails, one per (call, backend).
"""

import pytest

from . import huge, tally

LEAKS_AT_CONSTRUCTION = "NumPy's MemoryError/ValueError leaks from making the constant (not a VkmlError)"
CPU_OUTPUT = "cpu tier: NumPy's MemoryError/ValueError from allocating the outputs leaks (not a VkmlError)"

#: (case, backend) -> why it fails today
KNOWN = {
    **{(case, backend): LEAKS_AT_CONSTRUCTION
       for case in ("zeros of 2**40 elements", "full of 10**12 elements",
                    "zeros whose size overflows int64", "arange of 10**12 elements")
       for backend in ("numpy", "cpu")},
    **{(case, "cpu"): CPU_OUTPUT
       for case in ("broadcast then add, 10**10 results", "broadcast to a size that overflows int64",
                    "jit of a huge broadcast", "pad by 10**10",
                    "sum of an empty axis into a huge result")},
    ("a huge temporary, a scalar result", "cpu"):
        "cpu tier dies of SIGSEGV: the generated C does not check malloc of a 10**10-element temporary",
}


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
