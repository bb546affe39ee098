"""Shared test set-up: a deterministic hypothesis profile, fresh counters, the NumPy backend."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import vkml

settings.register_profile(
    "vkml", deadline=None, derandomize=True, max_examples=25, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "vkml"))


@pytest.fixture(autouse=True)
def _clean_state():
    """Every test starts lazy, on the NumPy backend, with counters at zero."""
    vkml.set_backend("numpy")
    vkml.set_eager(False)
    vkml.reset_stats()
    yield
    vkml.set_eager(False)


@pytest.fixture
def eager():
    """Run the test in eager mode (the per-operator suite does: errors name the op at once)."""
    vkml.set_eager(True)
    yield
    vkml.set_eager(False)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
