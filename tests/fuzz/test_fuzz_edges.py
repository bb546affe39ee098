"""Every op on the edge values of every dtype, all pairs at once: NumPy backend vs cpu tier.

Random search rarely draws ``INT_MIN`` and ``-1`` into the same element of a
floor division; these tables try each op on the full cross product of each
dtype's edge values (extremes, zeros of both signs, NaN, infinities, the
smallest normal, a subnormal), one case per (dtype, op), in the worker so a
crash fails its case.  The few cases that fail today are strict xfails,
each with the reason; the lead removes a mark when its fix lands.
"""

import itertools

import numpy as np
import pytest

from .codec import encode
from .test_fuzz_programs import check_case

INT_DTYPES = ["int32", "int64"]
FLOAT_DTYPES = ["float32", "float64"]


def int_edges(dtype):
    info = np.iinfo(dtype)
    return [info.min, info.min + 1, -2, -1, 0, 1, 2, 3, info.max - 1, info.max]


def float_edges(dtype):
    fi = np.finfo(dtype)
    return [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, float("nan"), float("inf"), float("-inf"),
            float(fi.max), -float(fi.max), float(fi.tiny), float(fi.smallest_subnormal), 1e5, -7.0]


def edges(dtype):
    return int_edges(dtype) if dtype in INT_DTYPES else \
        [False, True] if dtype == "bool" else float_edges(dtype)


def binary_case(dtype, op):
    pairs = np.array(list(itertools.product(edges(dtype), repeat=2)), dtype=dtype)
    inputs = [{"array": encode(pairs[:, 0].copy()), "view": "none"},
              {"array": encode(pairs[:, 1].copy()), "view": "none"}]
    return {"inputs": inputs, "ops": [{"op": op, "args": [{"v": 0}, {"v": 1}], "params": {}}]}


def unary_case(dtype, op):
    inputs = [{"array": encode(np.array(edges(dtype), dtype=dtype)), "view": "none"}]
    return {"inputs": inputs, "ops": [{"op": op, "args": [{"v": 0}], "params": {}}]}


def known(reason):
    return pytest.mark.xfail(strict=True, reason=f"known: {reason}")


BINARY = ["add", "sub", "mul", "div", "floor_divide", "pow", "maximum", "minimum", "equal",
          "less", "greater_equal"]
UNARY = ["neg", "abs", "sign", "square", "sqrt", "relu", "exp", "log", "sin", "cos", "tanh",
         "sigmoid", "cast_int32", "cast_int64", "cast_float32", "cast_float64", "cast_bool",
         "sum", "max", "min", "argmax", "argmin", "mean", "logsumexp", "softmax"]

#: (dtype, op) -> why it fails today
KNOWN_BINARY = {}
KNOWN_UNARY = {}


def _params(table, ops, dtypes):
    return [pytest.param(d, op, marks=known(table[(d, op)])) if (d, op) in table else (d, op)
            for d in dtypes for op in ops]


@pytest.mark.parametrize("dtype, op", _params(KNOWN_BINARY, BINARY, INT_DTYPES + FLOAT_DTYPES + ["bool"]))
def test_binary_op_on_all_edge_pairs(worker, dtype, op):
    check_case(worker, binary_case(dtype, op), "edge values")


@pytest.mark.parametrize("dtype, op", _params(KNOWN_UNARY, UNARY, INT_DTYPES + FLOAT_DTYPES + ["bool"]))
def test_unary_op_on_all_edge_values(worker, dtype, op):
    check_case(worker, unary_case(dtype, op), "edge values")


def empty_axis_case(op, dtype, shape=(0, 3)):
    inputs = [{"array": encode(np.zeros(shape, dtype=dtype)), "view": "none"}]
    return {"inputs": inputs, "ops": [{"op": op, "args": [{"v": 0}], "params": {"axis": 0}}]}


@pytest.mark.parametrize("op, dtype, shape", [
    ("argmax", "float32", (0, 3)), ("argmin", "int64", (0, 3)),
    ("argmax", "float32", (0, 0)),
    ("argmax", "int32", (3, 0)),
    ("max", "float32", (0, 3)), ("min", "int64", (0, 3)), ("sum", "float64", (0, 3)),
    ("mean", "float32", (0, 3)), ("logsumexp", "float64", (0, 3)), ("softmax", "float32", (0, 3))])
def test_reductions_over_an_empty_axis(worker, op, dtype, shape):
    """Both backends refuse alike (or both give the same value)."""
    check_case(worker, empty_axis_case(op, dtype, shape), "edge values")


def scalar_case(dtype, op, scalar):
    inputs = [{"array": encode(np.array([1, -2, 3], dtype=dtype)), "view": "none"}]
    return {"inputs": inputs, "ops": [{"op": op, "args": [{"v": 0}, {"s": scalar}], "params": {}}]}


@pytest.mark.parametrize("dtype, op, scalar", [
    ("int32", "sub", 2 ** 31),
    ("int32", "add", 2 ** 31 - 1), ("int64", "mul", 2 ** 62), ("float32", "add", 2 ** 200),
    ("bool", "add", 1), ("int32", "maximum", -(2 ** 31)), ("float64", "pow", -0.5)])
def test_python_scalars_at_the_edge_of_a_dtype(worker, dtype, op, scalar):
    check_case(worker, scalar_case(dtype, op, scalar), "edge values")


def overflow_then_compare_case(dtype, op, compare, scalar):
    inputs = [{"array": encode(np.array(edges(dtype), dtype=dtype)), "view": "none"}]
    return {"inputs": inputs, "ops": [{"op": op, "args": [{"v": 0}], "params": {}},
                                      {"op": compare, "args": [{"v": 1}, {"s": scalar}], "params": {}}]}


@pytest.mark.parametrize("dtype, op, compare, scalar", [
    (d, op, cmp, s) for d in INT_DTYPES
    for op, cmp, s in (("abs", "less", 0), ("neg", "less", 0), ("square", "less", 0))])
def test_integer_overflow_then_a_comparison(worker, dtype, op, compare, scalar):
    """A wrapped integer result must keep NumPy's value when compared, even after the C
    compiler has optimised the comparison."""
    check_case(worker, overflow_then_compare_case(dtype, op, compare, scalar), "edge values")
