"""Hypothesis profiles (`ci`: few examples, what `.ci/run` uses; `thorough`) and shared fixtures."""

import os
import zlib

# The Pallas GPU interpreter runs each warpgroup as a thread whose work is a
# chain of host callbacks; XLA:CPU's concurrency-optimized scheduler may reorder
# a thread's callbacks (a barrier wait before an independent store), which
# deadlocks interpreted kernels that are correct (docs/mosaic-notes.md). Set
# before jax creates its CPU client.
os.environ["XLA_FLAGS"] = " ".join(filter(None, [
    os.environ.get("XLA_FLAGS"), "--xla_cpu_enable_concurrency_optimized_scheduler=false"]))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

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
