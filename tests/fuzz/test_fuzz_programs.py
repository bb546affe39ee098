"""Random programs on the NumPy backend and the compiled cpu tier: no crash, no hang, same answer.

Each case (see ``chains.py``) runs in the worker process, so a generated C
function that dies of a signal fails that case with its reproducer instead of
killing the test run.  A failing case that shows a failure already recorded
in ``known.py`` is counted and left out, so the search keeps looking for new
ones; each known failure has its own strict-xfail regression case.
"""

import numpy as np
import pytest
from hypothesis import assume, given

from . import chains, known, tally
from .codec import encode
from .conftest import FUZZ, FUZZ_PROGRAMS


def run_and_compare(worker, case, area):
    """Run ``case`` in the worker; return its outcome and what went wrong (empty: nothing)."""
    with tally.trying(area):
        outcome = worker.call("chains:run_case", case, timeout=120)
    if not outcome.ok:
        return outcome, [f"{outcome.status}: {outcome.detail}"]
    if outcome.value.get("ran C"):
        tally.note(area, "ran generated C")
    return outcome, chains.compare(case, outcome.value)


def check_case(worker, case, area):
    _, problems = run_and_compare(worker, case, area)
    assert not problems, "\n".join(problems) + f"\nreproducer:\n{chains.reproducer(case)}"


@FUZZ_PROGRAMS
@given(case=chains.cases())
def test_random_chains_agree_on_numpy_and_cpu(worker, case):
    outcome, problems = run_and_compare(worker, case, "programs")
    if problems and known.classify(case, outcome):
        tally.known("programs")
        assume(False)
    assert not problems, "\n".join(problems) + f"\nreproducer:\n{chains.reproducer(case)}"


@FUZZ
@given(case=chains.grad_cases())
def test_random_chains_have_the_same_gradients_on_numpy_and_cpu(worker, case):
    with tally.trying("gradients"):
        outcome = worker.call("chains:run_grad_case", case, timeout=120)
    assert outcome.ok, f"{outcome.status}: {outcome.detail}\nreproducer:\n{chains.reproducer(case)}"
    problems = chains.compare_grads(outcome.value)
    assert not problems, "\n".join(problems) + f"\nreproducer:\n{chains.reproducer(case)}"


def _product_case(dtype, shape, view, special):
    """``x @ x.T`` then ``sin`` of an array big enough for the cpu tier's GEMM (more than its 2^12
    multiply-adds), read through a view, with NaN/inf/-0.0 in it when ``special``."""
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    if special:
        x[0, 0], x[1, 3], x[2, :] = np.nan, np.inf, -0.0
    inputs = [{"array": encode(x), "view": view}]
    ops = [{"op": "matmul", "args": [{"v": 0}], "params": {}},
           {"op": "sin", "args": [{"v": 1}], "params": {}}]
    return {"inputs": inputs, "ops": ops}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,view,special", [((60, 70), "none", False), ((33, 130), "T", False),
                                                ((48, 50), "none", True)])
def test_big_products_in_the_gemm_agree_on_numpy_and_cpu(worker, dtype, shape, view, special):
    """The GEMM path is driven on every run, not only when a random chain draws a big product."""
    check_case(worker, _product_case(dtype, shape, view, special), "programs")
