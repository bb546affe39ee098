"""A refused call changes nothing: tensors (values, .grad), jit caches, graphs and Records.

Each scenario (``state.py``) snapshots the state, makes one call that must be
refused, and snapshots again, in the worker and on both the NumPy backend and
the cpu tier.  The call must raise a ``vkml.VkmlError`` and leave every
snapshot as it was; a graph whose Record was live must still reverse.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from . import state, tally
from .codec import encode
from .conftest import FUZZ_PER_CALL

BACKENDS = ["numpy", "cpu"]


def known(reason):
    return pytest.mark.xfail(strict=True, reason=f"known: {reason}")


def check_refusal(worker, function, args, area):
    with tally.trying(area):
        outcome = worker.call(function, args, timeout=120)
    assert outcome.ok, f"{outcome.status}: {outcome.detail}\ncase: {args}"
    result = outcome.value
    assert result["error"] is not None, f"the call was not refused: {args}"
    assert not result["changed"], f"refused with {result['error']} but changed: {result['changed']}; {args}"
    assert result["vkml"], f"refused with {result['error']}, not a vkml.VkmlError: {args}"


arrays = st.builds(
    lambda dtype, shape, seed: encode(np.random.default_rng(seed).normal(size=shape).astype(dtype) * 3),
    st.sampled_from(["float32", "float64", "int32", "int64", "bool"]),
    hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=5), st.integers(0, 2 ** 16))

#: tensor calls that fail today, and why
KNOWN_TENSOR = {}
#: (graph call, samples or None for any) -> why it fails today (on both backends)
KNOWN_GRAPH = {}


def _calls(names, table):
    return [pytest.param(c, marks=known(table[c])) if c in table else c for c in sorted(names)]


@pytest.mark.parametrize("call", _calls(state.CALLS, KNOWN_TENSOR))
@FUZZ_PER_CALL
@given(data=st.data())
def test_refused_tensor_calls_change_nothing(worker, call, data):
    ins = data.draw(st.lists(arrays, min_size=1, max_size=3), label="arrays")
    backend = data.draw(st.sampled_from(BACKENDS), label="backend")
    check_refusal(worker, "state:tensor_refusal",
                  {"call": call, "arrays": ins, "backend": backend}, "refusals: tensors and jit")


def _graph_params():
    out = []
    for call in sorted(state.GRAPH_CALLS):
        for n in (8, 10000):            # 10000 float64 samples: planes the launch writes in place
            for backend in BACKENDS:
                why = KNOWN_GRAPH.get((call, n)) or KNOWN_GRAPH.get((call, None))
                out.append(pytest.param(call, n, backend, marks=known(why)) if why else (call, n, backend))
    return out


@pytest.mark.parametrize("call, n, backend", _graph_params())
def test_refused_graph_calls_change_nothing(worker, call, n, backend):
    check_refusal(worker, "state:graph_refusal", {"call": call, "n": n, "backend": backend},
                  "refusals: graphs and Records")
