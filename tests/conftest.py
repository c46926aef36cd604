"""Hypothesis profiles (`ci`: few examples, what `.ci/run` uses; `thorough`) and shared fixtures."""

import os
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

use_interpreter_safe_xla_flags()  # before any test runs a computation

settings.register_profile(
    "ci", max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow],
    derandomize=True, print_blob=True,
)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A fresh stream per test, reproducible from the test's id."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
