"""Graphs launched and reversed over random planes -- views included -- agree on NumPy and cpu."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from . import graphs, tally
from .codec import encode
from .conftest import FUZZ


@st.composite
def graph_cases(draw):
    n = draw(st.sampled_from([1, 2, 7, 300, 9000]))      # 9000 float64: planes written in place
    dtype = draw(st.sampled_from(["float32", "float64"]))
    x = draw(hnp.arrays(np.dtype(dtype), draw(st.integers(1, 8)),
                        elements=st.floats(-3, 3, width=32 if dtype == "float32" else 64)))
    views = {p: draw(st.sampled_from(["none", "rev", "step"])) for p in ("x", "u", "y")}
    return {"n": n, "dtype": dtype, "x": encode(x), "views": views,
            "k": draw(st.floats(-2, 2)), "seed": draw(st.sampled_from([1.0, -0.5, 0.0]))}


@FUZZ
@given(case=graph_cases())
def test_random_graphs_agree_on_numpy_and_cpu(worker, case):
    with tally.trying("graphs"):
        outcome = worker.call("graphs:run_graph_case", case, timeout=120)
    assert outcome.ok, f"{outcome.status}: {outcome.detail}\ncase: {case}"
    assert "error" not in outcome.value["numpy"], f"a valid graph was refused: {outcome.value}"
    problems = graphs.compare(outcome.value)
    assert not problems, "\n".join(problems) + f"\ncase: {case}"
