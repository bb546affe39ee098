"""Shared test set-up: a deterministic hypothesis profile, fresh counters, the NumPy backend.

The tests are in folders by subject (see ``README.md`` here); the helper modules at this level
(``oracle``, ``models``, ``cuda_emulation``, ...) and the modules of every folder import by name
from anywhere, whichever file pytest collects first.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import vkml

TESTS = Path(__file__).resolve().parent
for _folder in sorted(TESTS.iterdir()):
    if _folder.is_dir() and not _folder.name.startswith((".", "_")) and \
            not (_folder / "__init__.py").exists() and str(_folder) not in sys.path:
        sys.path.append(str(_folder))

settings.register_profile(
    "vkml", deadline=None, derandomize=True, max_examples=25, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "vkml"))


from backends_under_test import BACKENDS  # noqa: E402

#: Test modules that compute (operators, gradients, programs, graphs): each runs on every backend.
BACKEND_MODULES = {"test_ops_forward", "test_ops_grad", "test_ops_errors", "test_indexing",
                   "test_tensor", "test_programs", "test_nn_optim", "test_graph",
                   "test_graph_conditionals", "test_graph_refusals", "test_simulation",
                   }


def pytest_generate_tests(metafunc):
    if metafunc.module.__name__.rsplit(".", 1)[-1] in BACKEND_MODULES:
        metafunc.parametrize("vk_backend", BACKENDS, indirect=True)


@pytest.fixture(autouse=True)
def vk_backend(request):
    """Every test starts lazy, with counters at zero, on its backend (NumPy unless parametrized)."""
    name = getattr(request, "param", "numpy")
    # On the compiled tier every program is compiled at its first run (no NumPy warm-up), so
    # each test exercises the generated C.
    os.environ["VKML_CPU_HOT"] = "0"
    # A big program is built once, optimised, before its first call: a background build
    # outliving its test would compile (and count) in the next one.  tests/compiled/
    # test_second_build.py turns the quick first build on where it tests it.
    os.environ["VKML_SECOND_BUILD"] = "0"
    vkml.set_backend(name)
    vkml.set_eager(False)
    vkml.reset_stats()
    yield name
    vkml.set_eager(False)
    vkml.set_backend("numpy")


@pytest.fixture
def eager():
    """Run the test in eager mode (the per-operator suite does: errors name the op at once)."""
    vkml.set_eager(True)
    yield
    vkml.set_eager(False)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def emulated_cuda():
    """``(cuda backend, emulated driver state)``: the cuda backend on the host emulation of the
    driver (``cuda_emulation.fake_driver``); the NumPy backend again afterwards."""
    from cuda_emulation import fake_driver
    with fake_driver() as driver:
        backend = vkml.set_backend("cuda")
        try:
            yield backend, driver
        finally:
            vkml.set_backend("numpy")


@pytest.fixture
def on_cpu(monkeypatch, tmp_path):
    """The compiled cpu tier for the test, with a disk cache of its own (so it compiles)."""
    monkeypatch.setenv("VKML_CACHE_DIR", str(tmp_path))
    with vkml.use_backend("cpu"):
        yield


@pytest.fixture
def scalar_sin_left_in(monkeypatch):
    """The check of a built library made to find a scalar ``sin`` next to the vector one (as if
    the compiler had left a loop unvectorised), so the code under test must fall back to
    scalar libm throughout."""
    from vkml.backends import cpu
    real = cpu.math_imports

    def with_a_scalar_sin(data, names):
        found = real(data, names)
        if "sin" in found:
            found["sin"] = found["sin"] | {"sin"}
        return found
    monkeypatch.setattr(cpu, "math_imports", with_a_scalar_sin)
