"""``where`` on floats in generated C is a select of bits (never a branch on the condition), and
gives exactly one of its operands' bits -- signed zeros, infinities, subnormals and NaN payloads
included -- checked against NumPy's own ``where``; and the optimisation level a generated
program compiles at follows its longest function, not its whole length."""

import numpy as np
import pytest

import vkml
from vkml.backends import cpu

pytestmark = pytest.mark.skipif(cpu.compiler() is None, reason="needs a C compiler")


def _specials(dtype, size, rng):
    """Random values with every awkward float mixed in: +-0, +-inf, subnormals, NaNs of several
    payloads and signs."""
    info = np.finfo(dtype)
    uint = np.uint32 if dtype == np.float32 else np.uint64
    quiet = uint(0x7FC00000) if dtype == np.float32 else uint(0x7FF8000000000000)
    nans = [(quiet | uint(p)).view(dtype) for p in (1, 5, 77)]
    specials = np.array([0.0, -0.0, np.inf, -np.inf, info.smallest_subnormal,
                         -info.smallest_subnormal * 3, *nans, -nans[1]], dtype)
    x = rng.standard_normal(size).astype(dtype)
    pick = rng.random(size) < 0.3
    x[pick] = rng.choice(specials, int(pick.sum()))
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_where_gives_one_operands_bits_in_a_scalar_loop(dtype):
    """The chosen operand is read through an upsampling index (``g[i // 2]``, a gather the
    compiler leaves scalar: the loop where a branch would have been emitted); the result's bytes
    are NumPy's ``where``'s for every element."""
    rng = np.random.default_rng(3)
    c = rng.standard_normal((6, 48)).astype(dtype)
    a = _specials(dtype, 6 * 24, rng).reshape(6, 24)
    b = _specials(dtype, 6 * 48, rng).reshape(6, 48)

    def f(c, a, b):
        up = vkml.reshape(vkml.broadcast_to(vkml.reshape(a, (6, 24, 1)), (6, 24, 2)), (6, 48))
        return vkml.where(c > 0, up, b)

    want = np.where(c > 0, np.repeat(a, 2, axis=1), b)
    with vkml.use_backend("cpu"):
        got = np.asarray(vkml.jit(f)(c, a, b))
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_the_relu_gradient_through_a_pooling_has_the_numpy_backends_bits():
    """A ReLU then a 2 x 2 max pool (the CNN's layer): its gradient selects through the pooling's
    upsampled read; random signs, the NumPy backend's bits."""
    x = np.random.default_rng(4).standard_normal((3, 4, 12, 12)).astype(np.float32)

    def loss(v):
        return vkml.sum(vkml.max_pool2d(vkml.relu(v - 0.1), 2) ** 2)

    outs = {}
    for backend in ("numpy", "cpu"):
        with vkml.use_backend(backend):
            outs[backend] = np.asarray(vkml.jit(vkml.grad(loss))(x))
    assert (outs["cpu"] != 0).any() and (outs["cpu"] == 0).any()
    assert outs["cpu"].tobytes() == outs["numpy"].tobytes()


def test_longest_function_measures_a_function_not_the_file():
    prelude = "typedef int int32_t;\n" * 10
    small = "".join(f"static int vk_part{k}(void** in) {{\n    x = {k};\n    return 0;\n}}\n"
                    for k in range(50))
    big = "int vk_main(void** in) {\n" + "    x = x + 1;\n" * 500 + "}\n"
    part = max(len(f"static int vk_part{k}(void** in) {{\n    x = {k};\n    return 0;\n}}\n")
               for k in range(50))
    assert cpu.longest_function(small) == part
    assert cpu.longest_function(prelude + small) == len(prelude)      # (what comes before)
    assert cpu.longest_function(prelude + small + big) == len(big)
    assert cpu.longest_function("") == 0


def test_a_long_source_of_small_functions_compiles_at_O2(monkeypatch):
    """Many small functions: -O2 (fast code, time still linear); one long function: -O1."""
    seen = []

    def fake_compile(cc, flags, source, folder):
        seen.append([f for f in flags if f.startswith("-O")])
        raise cpu.BackendError("stop here")
    monkeypatch.setattr(cpu, "_compile_c", fake_compile)
    monkeypatch.setattr(cpu, "LARGE_SOURCE", 2000)
    parts = "".join(f"static int vk_part{k}(int x) {{\n    return x + {k};\n}}\n" for k in range(100))
    whole = "int vk_long(int x) {\n" + "    x = x * 3 + 1;\n" * 200 + "    return x;\n}\n"
    for source in (parts, whole):
        with pytest.raises(cpu.BackendError):
            cpu.library(source + f"/* {np.random.default_rng().integers(1 << 60)} */\n")
    assert len(parts) > 2000 and seen == [["-O2"], ["-O1"]]
