"""Every libm call of a cpu-tier program goes through one vector version: the same operand gives
the same bits wherever the lowering put the call.

An elementwise chain becomes a vector block function, at the top of a program or inside a
scan's steps (a step's rows of its operands passed to the block); a call anywhere else (a scan
over single values, a padded read under a condition) goes through a lane function that runs
the blocks' very loop on the operand.  Compared bit for bit, never timed: the block results,
the lane results, a function's first call (traced, run as separate programs) and its later
calls (one program).  That the lanes really are the vector
versions -- not scalar libm that happens to agree -- is shown by the scalar build
(``VKML_VECTOR_MATH=0``) differing from both somewhere on the same operands.
"""

import numpy as np
import pytest

import vkml
import vkml.numpy as vnp
import vkml.scipy.special as special
from vkml.backends import cpu

pytestmark = pytest.mark.skipif(cpu.compiler() is None or not cpu.vector_math(),
                                reason="needs a C compiler and glibc's vector math library")

UNARY = {
    "exp": (vnp.exp, (-20.0, 20.0)),
    "log": (vnp.log, (1e-3, 1e3)),
    "sin": (vnp.sin, (-50.0, 50.0)),
    "cos": (vnp.cos, (-50.0, 50.0)),
    "tanh": (vnp.tanh, (-6.0, 6.0)),
    "log1p": (vnp.log1p, (-0.9, 30.0)),
    "expm1": (vnp.expm1, (-5.0, 5.0)),
    "erf": (special.erf, (-4.0, 4.0)),
    "atan2": (lambda x: vnp.arctan2(x, 0.75 - x), (-3.0, 3.0)),
    "pow": (lambda x: vnp.power(x, 1.0 + x * 0.125), (0.01, 9.0)),
}
SIZE = 4096


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))


def _operands(name, dtype):
    low, high = UNARY[name][1]
    return np.random.default_rng(len(name)).uniform(low, high, SIZE).astype(dtype)


#: where a call may sit, each computing ``f`` of every operand (what C makes of it in brackets)
CONTEXTS = {
    "an elementwise program": lambda f, x: f(x),                                 # [block]
    "a scan over rows": lambda f, x: vkml.scan(                                   # [block, rows]
        lambda c, row: (c, f(row)), 0.0, x.reshape(64, -1))[1].reshape(-1),
    "a scan over single values": lambda f, x: vkml.scan(                         # [lanes]
        lambda c, v: (c, f(v)), 0.0, x[:512])[1],
    "a padded result": lambda f, x: vkml.pad(f(x), (3,), (5,))[3:-5],           # [lanes]
}


def _in_every_context(name, x):
    """``f(x)`` computed in each of ``CONTEXTS`` (jitted on the cpu tier), and the C sources."""
    f = UNARY[name][0]
    sources = []
    real = cpu.c_source

    def spy(program, *rest):
        source, low = real(program, *rest)
        sources.append(source)
        return source, low
    cpu.c_source = spy
    try:
        with vkml.use_backend("cpu"):
            got = {where: np.asarray(vkml.jit(lambda v, c=c: c(f, v))(x))     # fresh plans
                   for where, c in CONTEXTS.items()}
    finally:
        cpu.c_source = real
    return got, sources


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_a_call_has_the_same_bits_wherever_the_lowering_put_it(name, dtype):
    x = _operands(name, dtype)
    got, sources = _in_every_context(name, x)
    block = got["an elementwise program"]
    assert block.dtype == dtype
    for where, value in got.items():
        assert value.dtype == dtype, where
        assert value.tobytes() == block[:value.size].tobytes(), where
    # the contexts are what they claim: vector blocks, and lane functions
    assert any("vk_block" in s for s in sources) and any("vk_lane_" in s for s in sources)
    # and within a few ulps of NumPy's (another implementation)
    np.testing.assert_allclose(block, _numpy_reference(name, x), rtol=8 * np.finfo(dtype).eps,
                               atol=4 * np.finfo(dtype).tiny)


def _numpy_reference(name, x):
    import math
    table = {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
             "log1p": np.log1p, "expm1": np.expm1,
             "erf": np.vectorize(math.erf, otypes=[np.float64]),
             "atan2": lambda v: np.arctan2(v, v.dtype.type(0.75) - v),
             "pow": lambda v: np.power(v, v.dtype.type(1.0) + v * v.dtype.type(0.125))}
    return table[name](x.astype(np.float64) if name == "erf" else x).astype(x.dtype)


def test_the_lanes_are_the_vector_versions_not_scalar_libm(monkeypatch):
    """On these operands the scalar build differs from the vector one somewhere (else the test
    above could pass with every context on scalar libm)."""
    differ = []
    for name in sorted(UNARY):
        for dtype in (np.float32, np.float64):
            x = _operands(name, dtype)
            vector, _ = _in_every_context(name, x)
            monkeypatch.setenv("VKML_VECTOR_MATH", "0")
            scalar, _ = _in_every_context(name, x)
            monkeypatch.delenv("VKML_VECTOR_MATH")
            lanes = vector["a padded result"]
            assert lanes.tobytes() == vector["an elementwise program"].tobytes()
            if lanes.tobytes() != scalar["a padded result"].tobytes():
                differ.append((name, np.dtype(dtype).name))
    assert len(differ) >= 4, differ


def test_a_softmax_first_call_and_later_calls_give_the_same_bits():
    """The first call runs as separate programs (its trace's pieces), later ones as one fused
    program: the exponentials land in different loops, the bits may not change."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 77)).astype(np.float32) * 4

    def softmax_gelu(v):
        e = vnp.exp(v - vnp.max(v, axis=-1, keepdims=True))
        s = e / vnp.sum(e, axis=-1, keepdims=True)
        return 0.5 * s * (1.0 + vnp.tanh(0.79788456 * (s + 0.044715 * s * s * s)))

    with vkml.use_backend("cpu"):
        f = vkml.jit(softmax_gelu)
        calls = [np.asarray(f(x)).tobytes() for _ in range(4)]
        lazy = np.asarray(softmax_gelu(vkml.tensor(x)).numpy()).tobytes()
    assert len(set(calls)) == 1
    assert lazy == calls[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_strided_pads_condition_keeps_its_nest_out_of_the_vector_blocks(dtype, monkeypatch):
    """The gradient of ``sin(x)[::2]`` stores ``(i % 2 == 0 ? 1 : 0) * cos(x)``: the condition
    names the nest's loop variable outside an index, which a block function does not have --
    the nest calls cos through a lane function instead (found by the fuzzer: the block did not
    compile).  Checked against NumPy's cos at the even places, 0 at the odd ones."""
    monkeypatch.setenv("VKML_CPU_HOT", "0")
    x0 = np.linspace(-2.0, 2.0, 20).astype(dtype)
    with vkml.use_backend("cpu"):
        x = vkml.tensor(x0, requires_grad=True)
        vkml.backward(vkml.sum(vkml.sin(x)[::2]))
        got = x.grad.numpy()
    want = np.where(np.arange(20) % 2 == 0, np.cos(x0), 0).astype(dtype)
    np.testing.assert_allclose(got, want, rtol=8 * np.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("shape", [(70, 130), (5, 16), (9, 12), (3, 1)])
@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_gathered_operand_gives_each_element_the_bits_of_its_sum(shape, threads, monkeypatch):
    """``exp(x + b)`` with ``b`` broadcast along the rows: a block inside one row takes the row's
    indices from its first element, a block crossing a row's end (rows of 12 or 130) each
    element's from its flat index, a nest of many blocks is called in runs (split over two
    threads).  Every element has the bits of ``exp`` of the sum computed first and passed
    whole (no gather), and a reshape's read of the flat index is read in place."""
    monkeypatch.setenv("VKML_THREADS", threads)
    rng = np.random.default_rng(shape[0])
    x = rng.uniform(-5, 5, shape).astype(np.float32)
    b = rng.uniform(-5, 5, shape[1:]).astype(np.float32)

    def gathered(x, b):
        return vnp.exp(x + b)

    def flat(y):
        return vnp.exp(vkml.reshape(vkml.reshape(y, (-1,)), y.shape))
    source, _ = cpu.c_source(vkml.program(gathered, x, b), cpu.vector_math())
    assert "vk_h0" in source
    assert "vk_block" in cpu.c_source(vkml.program(flat, x + b), cpu.vector_math())[0] and \
        "vk_g" not in cpu.c_source(vkml.program(flat, x + b), cpu.vector_math())[0]
    with vkml.use_backend("cpu"):
        got = np.asarray(vkml.jit(gathered)(x, b))
        want = np.asarray(vkml.jit(flat)(x + b))
    assert got.tobytes() == want.tobytes()
    assert np.allclose(got, np.exp(x.astype(np.float64) + b), rtol=1e-6)


def test_index_forms_are_linear_forms_or_none():
    from vkml.backends.codegen.lower import index_form
    names = ["i1", "i2", "i3"]
    assert index_form("(((i1)*128 + i2))*512 + (i3)", names) == \
        index_form("(i1)*65536 + (i2)*512 + i3 + 0", names) == \
        (0, (("i1", 65536), ("i2", 512), ("i3", 1)))
    assert index_form("-i1 + 3 - (i2 - i2)", names) == (3, (("i1", -1),))
    assert index_form("(i1)*4 + i9", names, fixed={"i9"}) == (0, (("i1", 4),))
    for other in ("i1 / 2", "i1 % 3", "i1 * i2", "x + i1", "i1 ? 1 : 0", "a[i1]", "i1 +"):
        assert index_form(other, names) is None, other


@pytest.mark.parametrize("shape, axis", [((2, 2), 0), ((3, 2), 0), ((2, 5), 0), ((40, 3), 0)])
def test_a_buffer_read_at_the_flat_index_and_elsewhere_is_gathered_everywhere(shape, axis):
    """``logsumexp`` over the first axis: its last nest reads the sum's operand at the flat index
    spelled another way (``t[(0)*2 + i]``) and at another element (``t[(1)*2 + i]``).  A nest of
    fewer elements than a block passes what it reads at the flat index as padded copies of its
    own length, so such a buffer is gathered at every read; the values against float64."""
    x = np.random.default_rng(sum(shape)).uniform(-3, 3, shape).astype(np.float32)
    with vkml.use_backend("cpu"):
        got = np.asarray(vkml.jit(lambda v: vkml.logsumexp(v, axis=axis))(x))
    x64 = x.astype(np.float64)
    want = np.log(np.exp(x64).sum(axis=axis))
    np.testing.assert_allclose(got, want, rtol=2e-6)
