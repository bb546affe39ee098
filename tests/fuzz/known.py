"""Failures the fuzz suite found in today's code, recognised so the random search looks past them.

Each one keeps its own strict-xfail regression case (``test_fuzz_edges.py``,
``test_fuzz_entries.py``, ...), which starts to fail once the fix lands; the
lead then removes that mark AND the entry here, so the random search checks
the fixed behaviour too.
"""

#: name -> (recogniser(case, outcome) -> bool, the one-line reason)
KNOWN = {}


def classify(case, outcome):
    """The name of the known failure this failing case shows, or None for a new one."""
    for name, (recognise, _) in KNOWN.items():
        if recognise(case, outcome):
            return name
    return None
