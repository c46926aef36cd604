"""Argument validation shared by every op: one place that names the bad argument."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
IMPLS = ("xla", "mosaic", "interpret")


def _dtype(a: jax.typing.ArrayLike) -> jnp.dtype:
    """The dtype as given (jnp.result_type would silently map float64 to float32)."""
    return a.dtype if hasattr(a, "dtype") else jnp.result_type(a)


def _describe(a: jax.typing.ArrayLike) -> str:
    return f"shape {tuple(jnp.shape(a))} dtype {_dtype(a)}"


def check_array(name: str, a: object) -> None:
    """An array or a number; a list or another container is refused by name, not converted."""
    if not (hasattr(a, "dtype") and hasattr(a, "shape")) and not isinstance(
            a, (int, float, complex)):
        raise TypeError(f"{name} must be an array (jax.Array or numpy.ndarray); got "
                        f"{type(a).__name__}: convert it with jnp.asarray first")


def check_float(name: str, a: jax.typing.ArrayLike) -> None:
    check_array(name, a)
    dtype = _dtype(a)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating-point array; got {_describe(a)}")
    if not any(dtype == d for d in SUPPORTED_DTYPES):
        raise ValueError(
            f"{name} has unsupported dtype {dtype}; supported: float32, bfloat16, float16"
        )


def check_activation(name: str, x: jax.typing.ArrayLike) -> int:
    """x must be float with rank >= 1 and a non-empty last dim; returns K."""
    check_float(name, x)
    if jnp.ndim(x) < 1:
        raise ValueError(f"{name} must have rank >= 1 ([..., K]); got {_describe(x)}")
    k = jnp.shape(x)[-1]
    if k == 0:
        raise ValueError(f"{name} must have a non-empty last dimension; got {_describe(x)}")
    return k


def check_vector(name: str, v: jax.typing.ArrayLike | None, length: int) -> None:
    if v is None:
        return
    check_float(name, v)
    if jnp.shape(v) != (length,):
        raise ValueError(f"{name} must have shape ({length},); got {_describe(v)}")


def _real_scalar(name: str, value: object) -> float:
    """A concrete real scalar (Python, numpy or JAX 0-d) as a Python float."""
    dtype = getattr(value, "dtype", None)
    real_dtype = dtype is not None and (jnp.issubdtype(dtype, jnp.floating)
                                        or jnp.issubdtype(dtype, jnp.integer))
    if isinstance(value, (bool, np.bool_)) or not (
            isinstance(value, (int, float)) or (real_dtype and jnp.ndim(value) == 0)):
        shape = f" of shape {tuple(jnp.shape(value))}" if dtype is not None else ""
        raise TypeError(f"{name} must be a real scalar (Python, numpy or JAX 0-d number); "
                        f"got {type(value).__name__}{shape}")
    try:
        return float(value)
    except jax.errors.ConcretizationTypeError:
        raise TypeError(
            f"{name} must be concrete, not a traced value: it sets compile-time constants and "
            f"the backward pass; pass a Python float, close over it, or mark it static "
            f"(jax.jit(..., static_argnames='{name}'))") from None


def check_scalars(eps: object, scale_offset: object) -> tuple[float, float]:
    """(eps, scale_offset) as Python floats; eps >= 0, scale_offset finite."""
    eps_value = _real_scalar("eps", eps)
    if not eps_value >= 0:  # also rejects NaN
        raise ValueError(f"eps must be >= 0; got {eps_value}")
    offset = _real_scalar("scale_offset", scale_offset)
    if not np.isfinite(offset):
        raise ValueError(f"scale_offset must be finite; got {offset}")
    return eps_value, offset


def check_impl(impl: str | None) -> None:
    if impl is not None and impl not in IMPLS:
        raise ValueError(f"impl must be None or one of {IMPLS}; got {impl!r}")


def as_kernel_tuple(
    kernel: jax.typing.ArrayLike | Sequence[jax.typing.ArrayLike], k: int, x_name: str = "x"
) -> tuple[tuple[jax.Array, ...], bool]:
    """Accept one [K, N] kernel or a sequence sharing one norm; return (tuple, was_sequence)."""
    is_seq = isinstance(kernel, (list, tuple))
    kernels = tuple(kernel) if is_seq else (kernel,)
    if not kernels:
        raise ValueError("kernel must be an array or a non-empty sequence of arrays")
    for i, w in enumerate(kernels):
        name = f"kernel[{i}]" if is_seq else "kernel"
        check_float(name, w)
        if jnp.ndim(w) != 2:
            raise ValueError(f"{name} must have rank 2 ([K, N]); got {_describe(w)}")
        if jnp.shape(w)[0] != k:
            raise ValueError(
                f"{name} has K={jnp.shape(w)[0]} rows but {x_name} has K={k} "
                f"(last dim); {name}: {_describe(w)}"
            )
    return tuple(jnp.asarray(w) for w in kernels), is_seq


def as_bias_tuple(
    bias: jax.typing.ArrayLike | Sequence[jax.typing.ArrayLike | None] | None,
    kernels: tuple[jax.Array, ...],
    is_seq: bool,
) -> tuple[jax.Array | None, ...]:
    """One bias per kernel (or None); a sequence of kernels takes a sequence of biases."""
    if bias is None:
        return (None,) * len(kernels)
    if is_seq:
        if not isinstance(bias, (list, tuple)) or len(bias) != len(kernels):
            raise ValueError(
                f"bias must be None or a sequence of {len(kernels)} entries (one per kernel); "
                f"got {type(bias).__name__}"
            )
        biases = tuple(bias)
    else:
        biases = (bias,)
    for i, (b, w) in enumerate(zip(biases, kernels)):
        check_vector(f"bias[{i}]" if is_seq else "bias", b, w.shape[1])
    return tuple(None if b is None else jnp.asarray(b) for b in biases)
