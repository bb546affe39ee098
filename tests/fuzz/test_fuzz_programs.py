"""Random programs on the NumPy backend and the compiled cpu tier: no crash, no hang, same answer.

Each case (see ``chains.py``) runs in the worker process, so a generated C
function that dies of a signal fails that case with its reproducer instead of
killing the test run.  The cases that hit a failure already recorded in
``known.py`` are left out of the random search (and counted); each such
failure has its own strict-xfail regression case in ``test_fuzz_known.py``.
"""

from hypothesis import assume, given

from . import chains, known, tally
from .conftest import FUZZ


def check_case(worker, case, area):
    with tally.trying(area):
        outcome = worker.call("chains:run_case", case, timeout=120)
    assert outcome.ok, f"{outcome.status}: {outcome.detail}\nreproducer:\n{chains.reproducer(case)}"
    problems = chains.compare(case, outcome.value)
    assert not problems, "\n".join(problems) + f"\nreproducer:\n{chains.reproducer(case)}"


@FUZZ
@given(case=chains.cases())
def test_random_chains_agree_on_numpy_and_cpu(worker, case):
    if known.matches(case):
        tally.known("programs")
        assume(False)
    check_case(worker, case, "programs")
