"""Runs the sharding tests on 8 CPU host devices, each module in a fresh process.

XLA fixes the number of host devices when jax creates its CPU client, and the
rest of the suite (pytest-xdist workers share a process across modules) needs
the default single device. So each `tests/test_sharding_*.py` module runs here
under its own `python -m pytest` with `--xla_force_host_platform_device_count=8`;
run directly without that, its tests are skipped (`sharding_devices` below).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HOST_DEVICES = 8
ENV_FLAG = "JAXNORM_SHARDING_TESTS"  # set for the child process: its modules then run
MODULES = ("test_sharding_ops.py", "test_sharding_jit.py", "test_sharding_models.py",
           "test_sharding_bench.py")
ROOT = Path(__file__).resolve().parent.parent


def host_device_env() -> dict[str, str]:
    """The environment of a child process with 8 CPU host devices."""
    flags = os.environ.get("XLA_FLAGS", "")
    return {**os.environ, ENV_FLAG: "1", "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={HOST_DEVICES}".strip(),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("module", MODULES)
def test_module_on_8_host_devices(module):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         str(ROOT / "tests" / module)],
        cwd=ROOT, env=host_device_env(), capture_output=True, text=True, timeout=3000)
    summary = result.stdout.strip().splitlines()[-1:] or [""]
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert "skipped" not in summary[0], summary[0]


def requires_host_devices():
    """The mark of a module that `test_module_on_8_host_devices` runs in its child process."""
    return pytest.mark.skipif(
        os.environ.get(ENV_FLAG) is None,
        reason=f"runs in a child process on {HOST_DEVICES} host devices (tests/test_sharding.py)")
