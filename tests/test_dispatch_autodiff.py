"""Dispatch resolved before autodiff: what impl=None differentiates, judged against float64.

- Resolved to xla (this CPU): the op is plain JAX, so JAX's autodiff runs (the
  stock layers' backward) and forward mode works.
- Resolved to a kernel (a Hopper GPU, simulated here): the kernel serves only
  the primal; under differentiation the xla formulation runs, so no kernel
  appears in the gradient's jaxpr (docs/backward.md says why).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import jaxnorm
from jaxnorm import dispatch
from verify import gradients
from verify.checks import OPS, check_grad
from verify.strategies import op_inputs

SETTINGS = settings(max_examples=4, deadline=None)


def _rows(m: int, k: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)


@pytest.mark.parametrize("op", OPS)
def test_automatic_fallback_gradients_match_reference(op):
    @SETTINGS
    @given(op_inputs(op, np.float32, max_k=256))
    def prop(inputs):
        assert check_grad(op, None, **inputs) <= 1.0

    prop()


def test_automatic_fallback_is_plain_jax_and_forward_mode_works():
    x, w, t, c = _rows(4, 32, 1), _rows(32, 8, 2), _rows(4, 32, 3), _rows(4, 8, 4)
    f = lambda a: jaxnorm.rms_norm_dense(a, None, w)  # noqa: E731
    assert "custom_vjp" not in str(jax.make_jaxpr(jax.grad(lambda a: f(a).sum()))(x))
    _, y_dot = jax.jvp(f, (jnp.asarray(x),), (jnp.asarray(t),))
    dx64 = gradients.norm_dense_vjp("rms", x, None, None, w, None, c, eps=1e-6)["x"]
    lhs, rhs = float(np.sum(np.asarray(y_dot, np.float64) * c)), float(np.sum(t * dx64))
    assert abs(lhs - rhs) <= 1e-5 * (np.sum(np.abs(t * dx64)) + 1.0), (lhs, rhs)


@pytest.fixture
def simulated_hopper(monkeypatch):
    """impl=None resolves as on a Hopper GPU (nothing is compiled or run for it here)."""
    monkeypatch.setattr(dispatch, "hopper_or_newer", lambda: True)


def _bf16(m: int, k: int, seed: int) -> jax.Array:
    return jnp.asarray(_rows(m, k, seed), jnp.bfloat16)


def test_automatic_kernel_serves_the_primal_only(simulated_hopper):
    x, g, w = _bf16(1024, 128, 5), _bf16(1, 128, 6)[0] + 1, _bf16(128, 256, 7) / 12
    f = lambda a, s: jaxnorm.rms_norm_dense(a, s, w)  # noqa: E731
    assert dispatch.resolve("rms_norm_dense", None, x, g, (w,), (None,), eps=1e-6,
                            scale_offset=0.0) == "mosaic"
    primal = str(jax.make_jaxpr(f)(x, g))
    backward = str(jax.make_jaxpr(jax.grad(lambda a, s: f(a, s).astype(jnp.float32).sum(),
                                           argnums=(0, 1)))(x, g))
    assert "mosaic_gpu" in primal
    assert "mosaic_gpu" not in backward and "dot_general" in backward


def test_automatic_kernel_gradients_are_the_stock_formulations(simulated_hopper):
    inputs = dict(x=_rows(512, 128, 8), scale=1 + 0.1 * _rows(1, 128, 9)[0],
                  kernel=[_rows(128, 128, 10) / 11, _rows(128, 64, 11) / 11],
                  bias=None, eps=1e-6)
    inputs = {k: (jax.tree.map(lambda a: jnp.asarray(a, jnp.bfloat16), v)
                  if k in ("x", "scale", "kernel") else v) for k, v in inputs.items()}
    assert check_grad("rms_norm_dense", None, **inputs) <= 1.0
