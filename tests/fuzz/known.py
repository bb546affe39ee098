"""Failures the fuzz suite found in today's code, recognised so the random search looks past them.

Each one keeps its own strict-xfail regression case (``test_fuzz_edges.py``,
``test_fuzz_entries.py``, ...), which starts to fail once the fix lands; the
lead then removes that mark AND the entry here, so the random search checks
the fixed behaviour too.
"""

import numpy as np

from .codec import decode


def _ops(case):
    return {op["op"] for op in case["ops"]}


def _holds_int_min(case):
    """Whether an input holds the minimum of int32 or int64 (the value -x overflows at)."""
    for i in case["inputs"]:
        a = decode(i["array"])
        if a.dtype in (np.int32, np.int64) and a.size and a.min() == np.iinfo(a.dtype).min:
            return True
    return False


def _only_zero_signs_differ(outcome):
    """Every cpu result equals NumPy's once each -0.0 is read as 0.0."""
    ref = outcome.value["numpy"]
    if "values" not in ref:
        return False
    want = decode(ref["values"][0])
    for label in ("cpu", "cpu-jit"):
        for blob in outcome.value[label].get("values", []):
            have = decode(blob)
            if have.shape != want.shape or have.dtype != want.dtype or want.dtype.kind != "f":
                return False
            if not np.array_equal(want + 0.0, have + 0.0, equal_nan=True):
                return False
    return True


#: name -> (recogniser(case, outcome) -> bool, the one-line reason)
KNOWN = {
    "argmax-empty-into-empty": (
        lambda case, o: o.ok and {"argmax", "argmin"} & _ops(case) and
        "argmax of an empty sequence" in o.value["numpy"].get("message", "") and
        "error" not in o.value["cpu"],
        "argmax over an empty axis into an empty result: NumPy backend raises, cpu tier does not"),
    "neg-abs-of-int-min": (
        lambda case, o: o.ok and {"neg", "abs"} & _ops(case) and _holds_int_min(case),
        "neg/abs of INT_MIN is undefined behaviour in the generated C; -O2 folds later comparisons"),
    "sign-negative-zero": (
        lambda case, o: o.ok and "sign" in _ops(case) and _only_zero_signs_differ(o),
        "sign(-0.0): NumPy gives 0.0, cpu tier -0.0"),
}


def classify(case, outcome):
    """The name of the known failure this failing case shows, or None for a new one."""
    for name, (recognise, _) in KNOWN.items():
        if recognise(case, outcome):
            return name
    return None
