"""The NumPy namespace's primitives in generated code: the cpu tier's C and the CUDA renderer.

``test_numpy_systematic`` runs every ``vkml.numpy`` function on the cpu tier; this file makes
sure the new primitives (log1p, expm1, erf, atan2, fmod, round; cumsum, argsort; solve,
slogdet, cholesky) are really compiled there rather than left to NumPy, with NumPy's results
(float32 and float64, NaN, ties, singular matrices), and that the CUDA renderer's kernels for
them and for their derivative programs compile with ``nvcc --ptx`` and, run in the host
emulation of ``cuda_emulation``, give the NumPy backend's results.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import scipy.special

import vkml
import vkml.numpy as vnp
import vkml.scipy.special as vsp
from cuda_emulation import CXX, emulate, host_library
from vkml.backends.codegen import cuda_render
from vkml.backends.codegen.cuda_render import cuda_plan, module_source
from vkml.backends.cpu import c_source
from vkml.backends.numpy_backend import compile_program

NVCC = shutil.which("nvcc")
RNG = np.random.default_rng(5)


def _elementwise(x):
    return (vnp.log1p(x) + vnp.expm1(x) + vsp.erf(x) + vnp.arctan2(x, 2.0) + vnp.fmod(x, 0.7)
            + vnp.floor(x) + vnp.ceil(x) + vnp.rint(x) + vnp.trunc(x) + vnp.arcsinh(x)
            + vnp.mod(x, 0.3) + vnp.logaddexp(x, -x))


def _square(x):
    return x[:, :3] @ vnp.transpose(x[:, :3]) + 4.0 * vnp.eye(3, dtype=x.dtype)


FUNCTIONS = {
    "elementwise": _elementwise,
    "cumsum": lambda x: vnp.cumsum(x, 1) + vnp.cumsum(x, 0) * 2.0,
    "sort": lambda x: vnp.sort(x, -1) + vnp.sort(x, 0),
    "argsort": lambda x: vnp.argsort(x, 1),
    "solve": lambda x: vnp.linalg.solve(_square(x), x),
    "inv": lambda x: vnp.linalg.inv(_square(x)),
    "slogdet": lambda x: vnp.stack(vnp.linalg.slogdet(_square(x))),
    "cholesky": lambda x: vnp.linalg.cholesky(_square(x)),
}
GRADIENTS = {name: f for name, f in FUNCTIONS.items() if name != "argsort"}


def _input(dtype):
    x = RNG.uniform(-0.9, 0.9, (3, 5)).astype(dtype)
    x[1, 2] = x[1, 4]                       # a tie: argsort must keep the order
    return x


def _programs():
    """(label, program) for every function and for its gradient program, in both dtypes."""
    out = []
    for dtype in (np.float64, np.float32):
        x = _input(dtype)
        for name, f in FUNCTIONS.items():
            out.append((f"{name}-{dtype.__name__}", vkml.program(f, x)))
        for name, f in GRADIENTS.items():
            grad = vkml.grad(lambda t, f=f: vnp.sum(vnp.sin(f(t))))
            out.append((f"grad-{name}-{dtype.__name__}", vkml.program(grad, x)))
    return out


PROGRAMS = _programs()


def _names(prog):
    found = set()
    for e in prog.eqns:
        found.add(e.prim.name)
        for v in e.params.values():
            if hasattr(v, "eqns"):
                found |= _names(v)
    return found


def test_the_programs_hold_every_new_primitive():
    names = set().union(*(_names(p) for _, p in PROGRAMS))
    assert {"log1p", "expm1", "erf", "atan2", "fmod", "round", "cumsum", "argsort", "solve",
            "slogdet", "cholesky"} <= names


@pytest.mark.parametrize("label", [label for label, _ in PROGRAMS])
def test_the_cpu_tier_compiles_them_with_numpys_results(label):
    prog = dict(PROGRAMS)[label]
    c_source(prog)                          # raises Unsupported if anything fell back to NumPy
    args = [_input(v.dtype) for v in prog.inputs]
    want = compile_program(prog)(args)
    vkml.set_backend("cpu")
    got = vkml.backends.current()._compile_c(prog)(args)
    for g, w, v in zip(got, want, prog.outputs):
        _agree(g, w, v.dtype, label)


def _agree(got, want, dtype, label):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, label
    if dtype.kind == "f":
        tol = 2e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, equal_nan=True, err_msg=label)
    else:
        np.testing.assert_array_equal(got, want, err_msg=label)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_special_values_and_ties_on_the_cpu_tier(dtype):
    vkml.set_backend("cpu")
    x = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 2.5, -2.5, 0.5, 1e-30, 3.0, 3.0, -1.0], dtype)
    for name in ("log1p", "expm1", "floor", "ceil", "rint", "trunc"):
        _agree(getattr(vnp, name)(x).numpy(), getattr(np, name)(x), np.dtype(dtype), name)
    _agree(vsp.erf(x).numpy(), scipy.special.erf(x), np.dtype(dtype), "erf")
    _agree(vnp.arctan2(x, x[::-1]).numpy(), np.arctan2(x, x[::-1]), np.dtype(dtype), "arctan2")
    _agree(vnp.fmod(x, x[::-1]).numpy(), np.fmod(x, x[::-1]), np.dtype(dtype), "fmod")
    np.testing.assert_array_equal(vnp.argsort(x).numpy(), np.argsort(x, kind="stable"))
    np.testing.assert_array_equal(vnp.sort(x).numpy(), np.sort(x))
    singular = np.ones((2, 3, 3), dtype)
    singular[1] = np.eye(3) * 2
    x = vnp.linalg.solve(singular, np.ones((2, 3, 1), dtype)).numpy()
    assert np.isnan(x[0]).all() and np.allclose(x[1], 0.5)
    sign, logabs = (t.numpy() for t in vnp.linalg.slogdet(singular))
    assert list(sign) == [0.0, 1.0] and logabs[0] == -np.inf
    assert np.isnan(vnp.linalg.cholesky(-np.eye(2, dtype=dtype)).numpy()).all()


@pytest.fixture(scope="module")
def plans():
    return [(label, prog, cuda_plan(prog, prefix=f"n{i}_")) for i, (label, prog) in
            enumerate(PROGRAMS)]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_cuda_kernels_compile_with_nvcc(plans, tmp_path):
    path = tmp_path / "numpy_namespace.cu"
    path.write_text(module_source([p for *_, p in plans], namespaces=True))
    out = tmp_path / "numpy_namespace.ptx"
    proc = subprocess.run([NVCC, "--ptx", "-arch=sm_90", *cuda_render.NVCC_FLAGS, "-o", str(out),
                           str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not (proc.stdout + proc.stderr).strip(), proc.stderr[-4000:]
    ptx = out.read_text()
    for *_, plan in plans:
        for k in plan.kernels:
            assert f".entry {k.name}(" in ptx, k.name


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_the_emulated_cuda_kernels_give_numpys_results(plans, tmp_path):
    lib = host_library(module_source([p for *_, p in plans], namespaces=True), str(tmp_path), "vnp")
    for label, prog, plan in plans:
        args = [_input(v.dtype) for v in prog.inputs]
        want = compile_program(prog)(args)
        outs, status = emulate(lib, plan, args, [(v.shape, v.dtype) for v in prog.outputs])
        assert status[0] == 0, (label, status)
        for g, w, v in zip(outs, want, prog.outputs):
            _agree(g, w, v.dtype, label)
