"""The custom VJPs beyond the per-op gradient properties of tests/test_ops.py:
second order, jit and vmap of grad, large means, what the backward saves."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

import jaxnorm
from jaxnorm.backends import xla
from verify.checks import OPS, check_grad, check_grads_of

def _data(seed: int, mean: float = 0.0, m: int = 6, k: int = 16, n: int = 12) -> dict:
    """Named float32 arguments: x [m, k], gains g/gn, biases beta/b/bn, kernels w, w2."""
    rng = np.random.default_rng(seed)

    def f32(a):
        return jnp.asarray(a, jnp.float32)

    return dict(
        x=f32(mean + rng.standard_normal((m, k))), g=f32(1 + 0.2 * rng.standard_normal(k)),
        beta=f32(rng.standard_normal(k)), w=f32(rng.standard_normal((k, n)) / np.sqrt(k)),
        b=f32(rng.standard_normal(n)), w2=f32(rng.standard_normal((n, n)) / np.sqrt(n)),
        gn=f32(1 + 0.2 * rng.standard_normal(n)), bn=f32(rng.standard_normal(n)),
        res=f32(rng.standard_normal((m, n))),
    )


EPS = 1e-5
# Each op as a function of its differentiable arguments, and the same algebra from the
# plain xla backend functions (JAX's own autodiff) as the second-order oracle.
FUSED = {
    "rms_norm": lambda x, g: jaxnorm.rms_norm(x, g, eps=EPS, impl="xla"),
    "layer_norm": lambda x, g, beta: jaxnorm.layer_norm(x, g, beta, eps=EPS, impl="xla"),
    "rms_norm_dense": lambda x, g, w, b: jaxnorm.rms_norm_dense(
        x, g, [w, w * 2], [b, None], eps=EPS, impl="xla"),
    "layer_norm_dense": lambda x, g, beta, w, b: jaxnorm.layer_norm_dense(
        x, g, beta, w, b, eps=EPS, scale_offset=1.0, impl="xla"),
    "dense_rms_norm": lambda x, w2, gn, res: jaxnorm.dense_rms_norm(
        jnp.tanh(x[:, :12]), w2, None, gn, eps=EPS, residual=res, impl="xla"),
    "dense_layer_norm": lambda x, w2, bn, gn: jaxnorm.dense_layer_norm(
        x[:, :12], w2, bn, gn, bn, eps=EPS, impl="xla"),
}
PLAIN = {
    "rms_norm": lambda x, g: xla.rms_norm(x, g, eps=EPS, scale_offset=0.0),
    "layer_norm": lambda x, g, beta: xla.layer_norm(x, g, beta, eps=EPS, scale_offset=0.0),
    "rms_norm_dense": lambda x, g, w, b: xla.rms_norm_dense(
        x, g, (w, w * 2), (b, None), eps=EPS, scale_offset=0.0),
    "layer_norm_dense": lambda x, g, beta, w, b: xla.layer_norm_dense(
        x, g, beta, (w,), (b,), eps=EPS, scale_offset=1.0),
    "dense_rms_norm": lambda x, w2, gn, res: xla.dense_rms_norm(
        jnp.tanh(x[:, :12]), w2, None, gn, res, eps=EPS),
    "dense_layer_norm": lambda x, w2, bn, gn: xla.dense_layer_norm(
        x[:, :12], w2, bn, gn, bn, None, eps=EPS)[0],
}


_ARGS = {
    "rms_norm": ("x", "g"),
    "layer_norm": ("x", "g", "beta"),
    "rms_norm_dense": ("x", "g", "w", "b"),
    "layer_norm_dense": ("x", "g", "beta", "w", "b"),
    "dense_rms_norm": ("x", "w2", "gn", "res"),
    "dense_layer_norm": ("x", "w2", "bn", "gn"),
}


def _scalar(fn):
    """A loss that is neither linear nor quadratic, so second derivatives are non-trivial."""
    def loss(*args):
        leaves = jax.tree.leaves(fn(*args))
        return sum(jnp.sum(jnp.sin(y) * (1 + jnp.arange(y.size).reshape(y.shape) % 3))
                   for y in leaves)

    return loss


@pytest.mark.parametrize("op", OPS)
def test_forward_over_reverse_matches_plain_autodiff(op):
    """jax.jvp over jax.grad goes through the custom rule's backward (itself pure JAX)."""
    d = _data(seed=3)
    args = tuple(d[name] for name in _ARGS[op])
    rng = np.random.default_rng(4)
    tangents = tuple(jnp.asarray(rng.standard_normal(a.shape), a.dtype) for a in args)
    argnums = tuple(range(len(args)))
    fused = jax.grad(_scalar(FUSED[op]), argnums=argnums)
    plain = jax.grad(_scalar(PLAIN[op]), argnums=argnums)
    got_g, got_hvp = jax.jvp(fused, args, tangents)
    want_g, want_hvp = jax.jvp(plain, args, tangents)
    for got, want in zip(jax.tree.leaves((got_g, got_hvp)), jax.tree.leaves((want_g, want_hvp))):
        scale = float(jnp.max(jnp.abs(want))) + 1e-6
        np.testing.assert_allclose(got, want, atol=2e-4 * scale, rtol=1e-4)


def test_jit_and_vmap_of_grad():
    """Per-example gradients under jit(vmap(grad)) against the float64 VJP of each example."""
    d = _data(seed=5)
    xs = jnp.stack([d["x"], 2 * d["x"] + 1, -d["x"]])
    dy = jnp.asarray(np.random.default_rng(6).standard_normal((xs.shape[1], d["w"].shape[1])),
                     jnp.float32)

    def loss(x, g, w):
        return jnp.sum(dy * jaxnorm.layer_norm_dense(x, g, None, w, eps=1e-5, impl="xla"))

    per_example = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, None, None)))
    batched = per_example(xs, d["g"], d["w"])
    for i in range(xs.shape[0]):
        grads = {"x": batched[0][i], "scale": batched[1][i], "kernel": batched[2][i]}
        assert check_grads_of("layer_norm_dense", grads, [np.asarray(dy, np.float64)],
                              x=np.asarray(xs[i]), scale=np.asarray(d["g"]),
                              kernel=np.asarray(d["w"]), eps=1e-5) <= 1.0


def test_large_mean_layer_norm_gradient_keeps_its_digits():
    """Rows with |mean|/std = 1e4 in float32: the shifted statistics keep the gradient exact-ish."""
    d = _data(seed=6, mean=1e4)
    assert check_grad("layer_norm_dense", "xla", x=np.asarray(d["x"]), scale=np.asarray(d["g"]),
                      norm_bias=np.asarray(d["beta"]), kernel=np.asarray(d["w"]),
                      bias=np.asarray(d["b"]), eps=0.0) <= 1.0
    assert check_grad("layer_norm", "xla", x=np.asarray(d["x"]), scale=np.asarray(d["g"]),
                      eps=0.0) <= 1.0


_SAVED = re.compile(r"\w+\[([\d,]*)\]\s+(.*)")

_SAVING = {
    "rms_norm_dense": lambda x, g, w, w2, res: jaxnorm.rms_norm_dense(x, g, [w, w], impl="xla"),
    "layer_norm_dense": lambda x, g, w, w2, res: jaxnorm.layer_norm_dense(x, g, g, w, impl="xla"),
    "dense_rms_norm": lambda x, g, w, w2, res: jaxnorm.dense_rms_norm(
        x, w, None, None, residual=res, impl="xla"),
    "dense_layer_norm": lambda x, g, w, w2, res: jaxnorm.dense_layer_norm(
        x, w, None, None, None, impl="xla"),
    "rms_norm": lambda x, g, w, w2, res: jaxnorm.rms_norm(x, g, impl="xla"),
    "layer_norm": lambda x, g, w, w2, res: jaxnorm.layer_norm(x, g, g, impl="xla"),
}


@pytest.mark.parametrize("op", OPS)
def test_backward_saves_inputs_and_row_statistics_only(op, capsys):
    """No normalized activation is stored: besides the inputs, per-row vectors and the
    post-norm ops' pre-norm sum h (an output the caller holds anyway)."""
    d = _data(seed=7)
    m, n = d["x"].shape[0], d["w"].shape[1]
    loss = lambda *a: sum(jnp.sum(y) for y in jax.tree.leaves(_SAVING[op](*a)))  # noqa: E731
    print_saved_residuals(loss, d["x"], d["g"], d["w"], d["w2"], d["res"])
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip()]
    saved = [_SAVED.match(line).groups() for line in lines]
    computed = [[int(s) for s in shape.split(",") if s]
                for shape, origin in saved if "argument" not in origin]
    wide = [dims for dims in computed if dims != [m]]
    assert wide == ([[m, n]] if op.startswith("dense_") else []), lines
