"""Judging a fused layer against the stock norm + dense pair it replaces (the layer tests).

Both are computed in the same dtype from the same values; each errs from the
float64 truth by at most verify's tolerance, so they may differ by twice it.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from verify import gradients
from verify import references as ref
from verify import tolerances as tol
from verify.references import f64


def gain_init(key, shape, dtype):
    """A norm gain near 1 that is not 1, so a dropped or misplaced gain shows."""
    return (1 + 0.3 * jax.random.normal(key, shape)).astype(dtype)


def shift_init(key, shape, dtype):
    """A bias of order 0.5, so a dropped bias shows."""
    return (0.5 * jax.random.normal(key, shape)).astype(dtype)


def _normed(kind: str, x, scale, norm_bias, eps: float, scale_offset: float) -> np.ndarray:
    if kind == "rms":
        return ref.rms_norm(x, scale, eps=eps, scale_offset=scale_offset)
    return ref.layer_norm(x, scale, norm_bias, eps=eps, scale_offset=scale_offset)


def assert_outputs_match(kind: str, x, scale, norm_bias, kernels: Sequence, biases: Sequence,
                         ours: Sequence, stock: Sequence, *, eps: float, dtype,
                         scale_offset: float = 0.0) -> None:
    """Every projection's output equals the stock one within twice the dense tolerance."""
    normed = _normed(kind, x, scale, norm_bias, eps, scale_offset)
    for i, (w, b, y, y_stock) in enumerate(zip(kernels, biases, ours, stock)):
        assert y.dtype == y_stock.dtype, (y.dtype, y_stock.dtype)
        b64 = None if b is None else f64(b)
        y64 = normed @ f64(w) + (0.0 if b64 is None else b64)
        bound = 2 * tol.dense_tolerance(normed, f64(w), y64, dtype, dtype, bias=b64)
        err = np.abs(f64(y) - f64(y_stock))
        assert np.all(err <= bound), f"output {i}: error {err.max():.3e}, worst ratio " \
                                     f"{(err / bound).max():.3f}"


def assert_grads_match(kind: str, x, scale, norm_bias, kernels: Sequence, biases: Sequence,
                       dys: Sequence, ours: dict, stock: dict, *, eps: float, dtype,
                       scale_offset: float = 0.0) -> None:
    """Gradients (keys x, scale, norm_bias, kernel[i], bias[i]) agree normwise.

    The bound is twice verify's gradient tolerance of the float64 magnitude, in
    the computation dtype or the gradient's own dtype if coarser (a bfloat16 x
    gets a bfloat16 dx); norm-side magnitudes add over the projections sharing the norm.
    """
    parts = [gradients.norm_dense_vjp(kind, x, scale, norm_bias, w, b, dy, eps=eps,
                                      scale_offset=scale_offset, magnitude=True)
             for w, b, dy in zip(kernels, biases, dys)]
    magnitude = {name: sum(p[name] for p in parts)
                 for name in ("x", "scale", "norm_bias") if parts[0].get(name) is not None}
    for i, p in enumerate(parts):
        magnitude[f"kernel[{i}]"] = p["kernel"]
        if p["bias"] is not None:
            magnitude[f"bias[{i}]"] = p["bias"]
    x = np.asarray(x)
    longest = max(x.shape[-1], int(np.prod(x.shape[:-1])), *(np.shape(w)[1] for w in kernels))
    assert set(ours) == set(stock) == set(magnitude), (set(ours), set(stock), set(magnitude))
    for name, m in magnitude.items():
        err = float(np.linalg.norm(f64(ours[name]) - f64(stock[name])))
        coarser = max(dtype, np.asarray(ours[name]).dtype, key=tol.unit_roundoff)
        bound = 2 * tol.grad_tolerance(m, coarser, longest)
        assert err <= bound, f"d{name}: normwise error {err:.3e} > {bound:.3e}"
