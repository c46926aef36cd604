"""Implementations the benchmarks compare, one small registry per op.

A builder takes a `Case` and returns `fn(*case.inputs())`; it imports what it
needs lazily and raises (ImportError, NotImplementedError, ...) when it cannot
serve the case, which the runner records as an unavailable row. A new kernel
plugs in with one `@register(op, name)` builder.

- "xla": the separate norm and the dot(s) in jax.numpy, as users write them.
- "jaxnorm": the jaxnorm public API with impl="mosaic".
- "plain-gemm": our Mosaic GEMM without a norm (the floor the fused kernel is
  held to: docs/design.md section 5).
- "xla-dot": XLA's dot alone (the floor XLA itself would reach).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from bench.cases import Case

EPS = 1e-6
Fn = Callable[..., Any]


@dataclass(frozen=True)
class Impl:
    name: str
    build: Callable[[Case], Fn]
    gemm_only: bool = False
    """Computes the projection without the norm: a floor to compare with, not a competitor."""


REGISTRY: dict[str, dict[str, Impl]] = {"norm_gemm": {}, "gemm_norm": {}, "gemm_norm_add": {},
                                      "norm": {}, "train": {}}


def register(
    op: str, name: str, *, gemm_only: bool = False
) -> Callable[[Callable[[Case], Fn]], Impl]:
    """Decorator: add a builder to `REGISTRY[op]` under `name`."""

    def add(build: Callable[[Case], Fn]) -> Impl:
        impl = Impl(name, build, gemm_only)
        REGISTRY[op][name] = impl
        return impl

    return add


def stock_rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """RMSNorm as a user writes it without jaxnorm (float32 inside, x's dtype out)."""
    xf = x.astype(jnp.float32)
    r = lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + EPS)
    return (xf * r * scale.astype(jnp.float32)).astype(x.dtype)


def stock_layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array) -> jax.Array:
    """LayerNorm as a user writes it without jaxnorm (float32 inside, x's dtype out)."""
    xf = x.astype(jnp.float32)
    centered = xf - jnp.mean(xf, axis=-1, keepdims=True)
    s = lax.rsqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + EPS)
    y = centered * s * scale.astype(jnp.float32) + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def _split_norm_args(
    case: Case, args: tuple[jax.Array, ...]
) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    """(norm vectors, weights) from norm_gemm inputs (x excluded)."""
    n_vectors = 2 if case.norm == "layer" else 1
    return args[:n_vectors], args[n_vectors:]


def _plain_matmul() -> Fn:
    from pallas_kernels.plain_matmul import plain_matmul

    return plain_matmul


# ---------------------------------------------------------------- norm_gemm
# Every norm_gemm fn returns a tuple, one output per weight.


@register("norm_gemm", "xla")
def _xla_norm_gemm(case: Case) -> Fn:
    def fn(x: jax.Array, *args: jax.Array) -> tuple[jax.Array, ...]:
        vectors, weights = _split_norm_args(case, args)
        y = stock_rms_norm(x, *vectors) if case.norm == "rms" else stock_layer_norm(x, *vectors)
        return tuple(y @ w for w in weights)

    return fn


@register("norm_gemm", "jaxnorm")
def _jaxnorm_norm_gemm(case: Case) -> Fn:
    import jaxnorm

    def fn(x: jax.Array, *args: jax.Array) -> tuple[jax.Array, ...]:
        vectors, weights = _split_norm_args(case, args)
        kernel = weights[0] if len(weights) == 1 else list(weights)
        if case.norm == "rms":
            out = jaxnorm.rms_norm_dense(x, *vectors, kernel, impl="mosaic")
        else:
            out = jaxnorm.layer_norm_dense(x, *vectors, kernel, impl="mosaic")
        return out if isinstance(out, tuple) else (out,)

    return fn


@register("norm_gemm", "plain-gemm", gemm_only=True)
def _plain_norm_gemm(case: Case) -> Fn:
    plain_matmul = _plain_matmul()

    def fn(x: jax.Array, *args: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(plain_matmul(x, w) for w in _split_norm_args(case, args)[1])

    return fn


@register("norm_gemm", "xla-dot", gemm_only=True)
def _xla_dot_norm_gemm(case: Case) -> Fn:
    def fn(x: jax.Array, *args: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(x @ w for w in _split_norm_args(case, args)[1])

    return fn


# ---------------------------------------------------------------- gemm_norm (post-norm)


@register("gemm_norm", "xla")
def _xla_gemm_norm(case: Case) -> Fn:
    return lambda x, w, bias, scale: stock_rms_norm(x @ w + bias, scale)


@register("gemm_norm", "jaxnorm")
def _jaxnorm_gemm_norm(case: Case) -> Fn:
    import jaxnorm

    return lambda x, w, bias, scale: jaxnorm.dense_rms_norm(x, w, bias, scale, impl="mosaic")


@register("gemm_norm", "plain-gemm", gemm_only=True)
def _plain_gemm_norm(case: Case) -> Fn:
    plain_matmul = _plain_matmul()
    return lambda x, w, bias, scale: plain_matmul(x, w)


@register("gemm_norm", "xla-dot", gemm_only=True)
def _xla_dot_gemm_norm(case: Case) -> Fn:
    return lambda x, w, bias, scale: x @ w


# ------------------------------------------------ gemm_norm_add (post-norm, residual after)


@register("gemm_norm_add", "xla")
def _xla_gemm_norm_add(case: Case) -> Fn:
    """What a Gemma 2 / OLMo 2 block writes without jaxnorm: XLA's dot, norm, then the add."""
    return lambda x, w, bias, scale, r: r + stock_rms_norm(x @ w + bias, scale)


@register("gemm_norm_add", "jaxnorm")
def _jaxnorm_gemm_norm_add(case: Case) -> Fn:
    import jaxnorm

    return lambda x, w, bias, scale, r: jaxnorm.dense_rms_norm(x, w, bias, scale,
                                                               residual_after=r, impl="mosaic")


@register("gemm_norm_add", "xla-dot", gemm_only=True)
def _xla_dot_gemm_norm_add(case: Case) -> Fn:
    return lambda x, w, bias, scale, r: x @ w


# ---------------------------------------------------------------- standalone norms


@register("norm", "xla")
def _xla_norm(case: Case) -> Fn:
    return stock_rms_norm if case.norm == "rms" else stock_layer_norm


@register("norm", "jaxnorm")
def _jaxnorm_norm(case: Case) -> Fn:
    import jaxnorm

    if case.norm == "rms":
        return lambda x, scale: jaxnorm.rms_norm(x, scale, impl="mosaic")
    return lambda x, scale, bias: jaxnorm.layer_norm(x, scale, bias, impl="mosaic")


# ---------------------------------------------------------------- train (fwd + bwd)


def _train(forward_impl: Impl) -> Callable[[Case], Fn]:
    """Forward and pullback of a random cotangent through a norm_gemm implementation."""

    def build(case: Case) -> Fn:
        forward = forward_impl.build(case)
        n_weights = len(case.ns)

        def fn(x: jax.Array, scale: jax.Array, *rest: jax.Array) -> Any:
            weights, cotangents = rest[:n_weights], rest[n_weights:]
            out, pullback = jax.vjp(forward, x, scale, *weights)
            return out, pullback(tuple(cotangents))

        return fn

    return build


for _name in ("xla", "jaxnorm", "xla-dot"):
    _forward = REGISTRY["norm_gemm"][_name]
    register("train", _name, gemm_only=_forward.gemm_only)(_train(_forward))
