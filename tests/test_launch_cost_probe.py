"""bench/gpu/launch_cost_probe.py: each kind's chain computes what it says (the interpreter
for the Mosaic kinds; timings on CPU mean nothing), and the per-launch slope."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench.gpu import launch_cost_probe as probe


def _inputs(rows: int = 8, dim: int = 64):
    keys = jax.random.split(jax.random.key(1), 3)
    x = jax.random.normal(keys[0], (rows, dim), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (dim, dim), jnp.float32) / dim ** 0.5).astype(jnp.bfloat16)
    r = jax.random.uniform(keys[2], (rows,), jnp.float32, 0.5, 1.5)
    return x, w, r


@pytest.mark.parametrize("kind", probe.KINDS)
def test_each_chain_is_n_dependent_launches_of_its_op(kind):
    x, w, r = _inputs()
    got = np.asarray(jax.jit(probe.chain(kind, 2, w, r, interpret=True))(x), np.float64)
    want = np.asarray(x, np.float64)
    for _ in range(2):  # float64 reference, bf16 rounding between launches as the chain has
        if kind == "fusion":
            want = want * 0.5 + 1.0
        elif kind == "mosaic_lazy":
            scale = np.asarray(r, np.float64)[:, None]
            want = scale * (want @ np.asarray(w, np.float64))
        else:
            want = want @ np.asarray(w, np.float64)
        want = np.asarray(jnp.asarray(want, jnp.bfloat16), np.float64)
    np.testing.assert_allclose(got, want, atol=3e-2 * np.abs(want).max())


def test_slope_is_the_least_squares_cost_per_launch():
    assert probe.slope([(1, 10.0), (8, 45.0), (32, 165.0)]) == pytest.approx(5.0)
    assert probe.slope([(4, 10.0)]) == 0.0


def test_run_reports_every_program_and_a_slope_per_kind():
    result = probe.run(("fusion",), (1, 3), rows=8, dim=64, repeats=2)
    assert [(c["kind"], c["launches"]) for c in result["cells"]] == [("fusion", 1), ("fusion", 3)]
    assert all(c["wall_us"] > 0 for c in result["cells"])
    assert set(result["per_kind"]) == {"fusion"}
    with pytest.raises(ValueError, match="unknown kind"):
        probe.chain("nccl", 1, *_inputs()[1:])
