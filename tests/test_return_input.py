"""`return_input=True`: the pre-norm ops hand x back for the residual stream, so that in a
training step x's two cotangents (through the norm, through the stream) meet in RMSNorm's
backward kernel (docs/backward.md). The gradients must be exactly those of x used
directly, whichever backward runs, and the kernel must take the stream's cotangent where
the table has that form measured faster."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm import dispatch, row_stats
from jaxnorm.backends import norm_backward_measured
from pallas_kernels import hardware

BF16 = jnp.bfloat16
M, K, N = 16, 128, 128


def _inputs(seed: int):
    keys = jax.random.split(jax.random.PRNGKey(seed), 5)
    x = jax.random.normal(keys[0], (2, M // 2, K), BF16)
    scale = 1 + 0.1 * jax.random.normal(keys[1], (K,), jnp.float32)
    w = [(0.1 * jax.random.normal(key, (K, N))).astype(BF16) for key in keys[2:]]
    return x, scale, w


def _ops(kind: str, x, scale, w, impl, return_input: bool):
    """(the op's outputs, the x the stream continues with)."""
    stats = row_stats.of_rows(x)
    if kind == "rms_norm_dense":
        out = jaxnorm.rms_norm_dense(x, scale, w, statistics=stats, impl=impl,
                                     return_input=return_input)
    elif kind == "rms_norm_dense, no statistics":  # the first block's input: none before it
        out = jaxnorm.rms_norm_dense(x, scale, w, impl=impl, return_input=return_input)
    elif kind == "gated":
        out = jaxnorm.rms_norm_gated_dense(x, scale, w[0], w[1], statistics=stats, impl=impl,
                                           return_input=return_input)
    else:  # the attention input, QK-normed heads of 128 and RoPE at positions 0..
        angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * jnp.linspace(0.01, 1, 64)
        cos, sin = (jnp.broadcast_to(f(angles), (*x.shape[:2], 64)) for f in (jnp.cos, jnp.sin))
        out = jaxnorm.rms_norm_attention_input(x, scale, *w, jnp.ones(128), jnp.ones(128), cos,
                                               sin, head_dim=128, statistics=stats, impl=impl,
                                               return_input=return_input)
    if not return_input:
        return out, x
    return (out[:-1], out[-1]) if kind == "attention_input" else out


def _loss(kind, impl, return_input, x, scale, w):
    """A residual step's loss: the op's outputs and the stream both reach it."""
    outs, stream = _ops(kind, x, scale, w, impl, return_input)
    outs = outs if isinstance(outs, tuple) else (outs,)
    total = sum(jnp.sum(jnp.sin(o.astype(jnp.float32))) for o in outs)
    return total + jnp.sum(jnp.cos(stream.astype(jnp.float32)) * stream.astype(jnp.float32))


@pytest.mark.parametrize("kind", ["rms_norm_dense", "rms_norm_dense, no statistics", "gated",
                                  "attention_input"])
@pytest.mark.parametrize("impl", [None, "xla", "interpret"])
@pytest.mark.parametrize("kernel_backward", [False, True], ids=["stock vjp", "kernel vjp"])
def test_gradients_are_those_of_x_used_directly(monkeypatch, kind, impl, kernel_backward):
    """"kernel vjp": the norm's VJP forced onto the custom rule that hands both cotangents to
    "rms_norm_backward" (its xla implementation here, on CPU)."""
    if kernel_backward:
        monkeypatch.setattr(dispatch, "norm_backward_kernel",
                            lambda *a, **k: dispatch._AUTOMATIC.get())
    x, scale, w = _inputs(seed=hash((kind, impl, kernel_backward)) % 1000)
    expected = jax.grad(functools.partial(_loss, kind, impl, False), argnums=(0, 1, 2))(
        x, scale, w)
    got = jax.grad(functools.partial(_loss, kind, impl, True), argnums=(0, 1, 2))(x, scale, w)
    # Equal up to bf16 rounding: where the kernel's rule takes one cotangent per consumer it
    # sums them in float32, in another order, so each gradient is judged against the
    # float32 one (xla, inputs widened) and must be no further from it than x used directly.
    reference = jax.grad(functools.partial(_loss, kind, "xla", False), argnums=(0, 1, 2))(
        x.astype(jnp.float32), scale, [wi.astype(jnp.float32) for wi in w])
    for e, g, r in zip(*map(jax.tree.leaves, (expected, got, reference))):
        r = np.asarray(r, np.float64)
        if not np.any(r):  # a weight the op does not use (the gated op's third)
            assert not np.any(np.asarray(g)) and not np.any(np.asarray(e))
            continue
        err = lambda a: np.linalg.norm(np.asarray(a, np.float64) - r) / np.linalg.norm(r)
        assert err(g) <= min(1.25 * err(e) + 1e-3, 2e-2), (err(g), err(e))
    # The values themselves: the op's outputs and the stream are x's.
    outs, stream = _ops(kind, x, scale, w, impl, True)
    np.testing.assert_array_equal(np.asarray(stream), np.asarray(x))


def test_kernel_takes_the_streams_cotangent_where_that_form_is_measured(monkeypatch):
    """With only the "stream added in it" form in the table, the training step planned for
    the H200 launches the backward kernel for the norm that returns x and not for one that
    does not."""
    m, k, n = 4096, 2048, 512
    S = jax.ShapeDtypeStruct
    monkeypatch.setattr(norm_backward_measured, "PROVENANCE", {"sms": hardware.H200_SMS})
    monkeypatch.setattr(norm_backward_measured, "ENTRIES",
                        (((m, k), "bfloat16", True, True, 1, 0.6, 20.0),))

    def launches(return_input: bool, statistics: bool) -> int:
        def loss(x, scale, w):
            stats = row_stats.of_rows(x) if statistics else None
            out = jaxnorm.rms_norm_dense(x, scale, w, statistics=stats,
                                         return_input=return_input)
            y, stream = out if return_input else (out, x)
            return jnp.sum(y.astype(jnp.float32)) + jnp.sum(stream.astype(jnp.float32) ** 2)

        with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
            text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
                S((m, k), BF16), S((k,), jnp.float32), S((k, n), BF16)).lower(
                lowering_platforms=("cuda",)).as_text()
        return text.count("custom_call @mosaic_gpu_v2(")

    for statistics in (True, False):  # given (a block's input after the first) or not
        with dispatch.recorded_choices() as made:
            assert launches(True, statistics) == launches(False, statistics) + 1
        assert made["rms_norm_backward"] == [("mosaic", None)]


# Llama-3.2-1B's MLP input; Gemma-3-1B's attention input, whose q/k/v GEMM dispatch declines
# at prefill shapes (the norm is then the xla formulation's, differentiated by the kernel).
@pytest.mark.parametrize("kind, m, k, ns", [("gated", 4096, 2048, (512, 512)),
                                            ("q/k/v", 2048, 1152, (1024, 256, 256))])
def test_each_consumers_cotangent_reaches_the_kernel_where_that_count_is_measured(
        monkeypatch, kind, m, k, ns):
    """A norm feeding several GEMMs (gate and up; q, k and v) hands the kernel one cotangent
    per GEMM to sum as it reads them, so XLA adds none of them in a pass of its own, where
    the table has the kernel measured with that many; where it has only the one-cotangent
    form, the kernel takes XLA's sum; with neither, no kernel."""
    S = jax.ShapeDtypeStruct
    monkeypatch.setattr(norm_backward_measured, "PROVENANCE", {"sms": hardware.H200_SMS})

    def lowered() -> str:
        def loss(x, scale, ws):
            if kind == "gated":
                out, stream = jaxnorm.rms_norm_gated_dense(x, scale, *ws, return_input=True)
                outs = (out,)
            else:
                outs, stream = jaxnorm.rms_norm_dense(x, scale, ws, return_input=True,
                                                      statistics=row_stats.of_rows(x))
            total = sum(jnp.sum(o.astype(jnp.float32)) for o in outs)
            return total + jnp.sum(stream.astype(jnp.float32) ** 2)

        with jax.sharding.use_abstract_mesh(hardware.h200_mesh()):
            return jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
                S((m, k), BF16), S((k,), jnp.float32), [S((k, n), BF16) for n in ns]).lower(
                lowering_platforms=("cuda",)).as_text()

    def backward_operands(entries) -> list[int]:
        """The operand counts of the Mosaic launches over x's [M, K] rows."""
        monkeypatch.setattr(norm_backward_measured, "ENTRIES", entries)
        return [len(line.split("@mosaic_gpu_v2(", 1)[1].split(")", 1)[0].split(","))
                for line in lowered().splitlines()
                if "@mosaic_gpu_v2(" in line and f"tensor<{m}x{k}xbf16>" in line]

    one = (((m, k), "bfloat16", True, True, 1, 0.6, 20.0),)
    several = (((m, k), "bfloat16", True, True, len(ns), 0.5, 30.0),)
    assert backward_operands(()) == []
    assert backward_operands(one) == [4]  # x, the consumers' sum, the stream's, the gain
    assert backward_operands(one + several) == [3 + len(ns)]  # x, each consumer's, ...
