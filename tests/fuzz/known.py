"""Failures the fuzz suite found in today's code, left out of the random search.

Each entry says which generated cases hit it (a predicate over a case) so the
random tests keep looking for NEW failures; the failure itself stays checked
by a strict-xfail regression case in ``test_fuzz_known.py``.  When a fix
lands, that regression case starts passing (strict xfail then fails the run):
remove its mark there AND its entry here.
"""

import numpy as np

from .chains import decode, take_view

#: name -> predicate(case) -> bool
PREDICATES = {}


def matches(case) -> bool:
    return any(p(case) for p in PREDICATES.values())
