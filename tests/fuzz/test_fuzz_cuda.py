"""Random chains and edge-value tables on the CUDA backend (host emulation) vs the NumPy backend.

There is no GPU here: the real cuda backend runs on the emulated driver of
``tests/cuda_emulation.py`` (the generated CUDA compiled for the host), in a
worker process of its own, so a generated kernel that crashes fails its
case.  Every source it compiles also goes through ``nvcc --ptx`` when nvcc
is installed.  The answers must be NumPy's as closely as for the cpu tier
(``chains.compare``): the same bits for exact ops, a few ulps for
transcendentals (the emulation's math is the host's libm, as CUDA's
libdevice is within a few ulps of it), a rounding bound for reductions, the
same error class for refused inputs -- decoded by the backend from its
status words.

A host compile costs about as much as a hundred chains, so each case here is a
BATCH of chains run as one program (see ``cuda_cases.py``).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from . import chains, tally
from .codec import encode
from .conftest import EXAMPLES, FUZZ
from .runner import Worker
from .test_fuzz_edges import BINARY, UNARY, binary_case, empty_axis_case, \
    overflow_then_compare_case, scalar_case, unary_case

AREA = "cuda (emulated)"
#: the cuda worker's address-space limit (see ``cuda_worker``)
CUDA_MEMORY_LIMIT_BYTES = 8 << 30
#: chains per program: one host compile (and one nvcc run) for all of them
BATCH = 8


@pytest.fixture(scope="module")
def cuda_worker():
    """A worker of its own: the emulated driver stays installed in it for its whole life.  Its
    address-space limit is larger than the other areas' worker's: the emulation runs a block's
    threads as POSIX threads (up to 256, 8 MiB of stack each), and a thread that cannot start
    would leave the others waiting at a barrier forever."""
    w = Worker({"VKML_FUZZ_MEMORY_LIMIT": str(CUDA_MEMORY_LIMIT_BYTES)})
    yield w
    w.close()


def reproducer(case) -> str:
    return ("# on the cuda backend, emulated: in tests/, with cuda_emulation.fake_driver(): "
            "vkml.set_backend('cuda'); then\n" + chains.reproducer(case))


def _find_the_lost_case(worker, cases, outcome) -> list:
    """The batch crashed or hung: run its cases one by one to name the culprit."""
    problems = []
    for case in cases:
        alone = worker.call("cuda_cases:run_batch", {"cases": [case]}, timeout=300)
        if not alone.ok:
            problems.append(f"{alone.status}: {alone.detail}\nreproducer:\n{reproducer(case)}")
    return problems or [f"the batch {outcome.status}ed ({outcome.detail}) though each case alone "
                        "runs; reproducers:\n" + "\n\n".join(reproducer(c) for c in cases)]


def run_batch(worker, cases) -> list:
    """Run ``cases`` as one batch in the cuda worker; what went wrong (empty: nothing)."""
    with tally.trying(AREA, count=len(cases)):
        outcome = worker.call("cuda_cases:run_batch", {"cases": cases}, timeout=300)
    if not outcome.ok:
        return _find_the_lost_case(worker, cases, outcome)
    value = outcome.value
    for _ in range(value["compiles"]):
        tally.note(AREA, "host compiles of generated CUDA")
    for _ in range(value["fallbacks"]):
        tally.note(AREA, "programs the CUDA lowering left to NumPy")
    problems = []
    if value["nvcc"] is None:
        tally.note(AREA, "batches not checked by nvcc (not installed)")
    else:
        for said in value["nvcc"]:
            tally.note(AREA, "sources compiled by nvcc --ptx")
            if said:
                problems.append(f"nvcc --ptx on a generated source: {said}\nreproducers:\n"
                                + "\n\n".join(reproducer(c) for c in cases))
    for case, result in zip(cases, value["results"]):
        found = chains.compare(case, result, labels=("cuda", "cuda-jit"))
        if found:
            problems.append("\n".join(found) + f"\nreproducer:\n{reproducer(case)}")
    return problems


def check_batch(worker, cases):
    problems = run_batch(worker, cases)
    assert not problems, "\n\n".join(problems)


# -- random chains ----------------------------------------------------------------------------------

@settings(FUZZ, max_examples=max(2, EXAMPLES // 2))
@given(cases=st.lists(chains.cases(), min_size=BATCH, max_size=BATCH))
def test_random_chains_agree_on_numpy_and_cuda(cuda_worker, cases):
    check_batch(cuda_worker, cases)


# -- edge values ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int32", "int64", "float32", "float64", "bool"])
def test_every_op_on_the_edge_values_of_a_dtype(cuda_worker, dtype):
    """The edge tables of ``test_fuzz_edges`` (every op on all pairs of a dtype's edge values),
    one program per dtype."""
    cases = [binary_case(dtype, op) for op in BINARY] + [unary_case(dtype, op) for op in UNARY]
    check_batch(cuda_worker, cases)


def test_integer_overflow_and_python_scalars_at_the_edge(cuda_worker):
    """Wrapped integer results (then compared: no signed-overflow folding in device code) and
    scalars at the edge of a dtype."""
    cases = [overflow_then_compare_case(d, op, cmp, 0) for d in ("int32", "int64")
             for op in ("abs", "neg", "square") for cmp in ("less", "greater_equal")]
    cases += [scalar_case(d, op, s) for d, op, s in [
        ("int32", "sub", 2 ** 31), ("int32", "add", 2 ** 31 - 1), ("int64", "mul", 2 ** 62),
        ("float32", "add", 2 ** 200), ("bool", "add", 1), ("int32", "maximum", -(2 ** 31)),
        ("float64", "pow", -0.5), ("int64", "sub", -(2 ** 63))]]
    cases += [_tiled_matmul_case(d) for d in ("int32", "int64")]
    check_batch(cuda_worker, cases)


def _tiled_matmul_case(dtype):
    """``x @ x.T`` for ``x`` two rows of the dtype's edge values: the tiled kernel's integer sums
    and products overflow, and must wrap as NumPy's do."""
    case = unary_case(dtype, "broadcast")
    case["ops"].append({"op": "matmul", "args": [{"v": 1}], "params": {}})
    return case


def _broadcast_case(shape_a, shape_b, dtype, ops):
    inputs = [{"array": encode(np.arange(np.prod(s), dtype=dtype).reshape(s)), "view": "none"}
              for s in (shape_a, shape_b)]
    steps = [{"op": ops[0], "args": [{"v": 0}, {"v": 1}], "params": {}}]
    steps += [{"op": op, "args": [{"v": 2 + k}], "params": {}} for k, op in enumerate(ops[1:])]
    return {"inputs": inputs, "ops": steps}


def test_empty_and_broadcast_shapes_compile_without_a_warning(cuda_worker):
    """Loop nests with a zero extent (their index decode once divided by zero) and broadcasts
    (an index the body never reads) give NumPy's answers, and nvcc says nothing of them."""
    cases = [_broadcast_case((0, 3), (3,), "float32", ["add", "neg"]),
             _broadcast_case((4, 1), (1, 0), "int64", ["mul", "abs"]),
             _broadcast_case((4, 1), (1, 5), "float64", ["sub", "square"]),
             _broadcast_case((2, 0, 3), (3,), "int32", ["maximum", "sign"])]
    cases += [empty_axis_case(op, dtype, shape) for op, dtype, shape in [
        ("sum", "float64", (0, 3)), ("max", "float32", (0, 3)), ("argmax", "int32", (3, 0)),
        ("mean", "float32", (0, 3)), ("softmax", "float32", (0, 3))]]
    check_batch(cuda_worker, cases)


# -- refused inputs, reported through the status words ---------------------------------------------------

def _gather_case(values, indices):
    inputs = [{"array": encode(np.asarray(values)), "view": "none"},
              {"array": encode(np.asarray(indices)), "view": "none"}]
    return {"inputs": inputs, "ops": [{"op": "gather_by", "args": [{"v": 0}, {"v": 1}], "params": {}}]}


def _pow_case(dtype, exponents):
    inputs = [{"array": encode(np.array([2, -3, 0, 1], dtype)), "view": "none"},
              {"array": encode(np.array(exponents, dtype)), "view": "none"}]
    return {"inputs": inputs, "ops": [{"op": "pow", "args": [{"v": 0}, {"v": 1}], "params": {}}]}


REFUSED = {
    "gather index past the end": _gather_case(np.arange(5.0), [0, 5]),
    "gather index before the start": _gather_case(np.arange(5, dtype=np.int32), [-6, 1]),
    "gather index at int64's minimum": _gather_case(np.arange(3.0), [np.iinfo(np.int64).min]),
    "negative int32 power": _pow_case("int32", [1, 2, -1, 0]),
    "negative int64 power": _pow_case("int64", [3, 0, 1, -(2 ** 40)]),
}


def test_refused_inputs_are_the_same_error_on_cuda(cuda_worker):
    """Out-of-range gather indices and negative integer powers: the cuda backend decodes its
    status words into NumPy's error class (and runs the valid cases of the batch alike)."""
    valid = [_gather_case(np.arange(5.0), [0, -5, 4]), _pow_case("int64", [0, 1, 2, 62])]
    check_batch(cuda_worker, list(REFUSED.values()) + valid)


def _cause(result) -> str:
    """What a failed run's message says went wrong, after the failing operation is named."""
    return result["message"].split(" failed: ", 1)[-1].rstrip(".")


def test_the_status_words_name_the_bad_value_as_numpy_does(cuda_worker):
    """The failing index (or exponent), its axis and size travel from the kernel through the
    status words: the cuda backend's message says what NumPy's says, lazily and jitted."""
    outcome = cuda_worker.call("cuda_cases:run_batch", {"cases": list(REFUSED.values())},
                               timeout=300)
    assert outcome.ok, outcome.detail
    for what, r in zip(REFUSED, outcome.value["results"]):
        for label in ("cuda", "cuda-jit"):
            assert r[label].get("error") == r["numpy"]["error"] == "ExecutionError", (what, r)
            assert _cause(r[label]).startswith(_cause(r["numpy"])), (what, r[label], r["numpy"])
