"""Float64 numpy vector-Jacobian products of every op: the reference for gradient checks.

Written from the textbook backward of a norm, independent of jaxnorm's code:
with xhat the normalized row (no gain) and dxhat = dy * gain,
    RMSNorm:   dx = r * (dxhat - xhat * mean(dxhat * xhat))
    LayerNorm: dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
both exact for eps > 0 because r and s include eps. A finite-difference
property (tests/test_gradients_reference.py) checks these formulas themselves.

With `magnitude=True` every function returns the same expression with each
term replaced by its absolute value and every subtraction by an addition: the
size of what was summed. Gradients can cancel (a one-element RMSNorm has
dx ~ 0), so the gradient tolerance is relative to this, not to the result.
"""

from __future__ import annotations

import numpy as np

from verify import references as ref
from verify.references import f64


def _abs_if(a: np.ndarray, magnitude: bool) -> np.ndarray:
    return np.abs(a) if magnitude else a


def _mm(a: np.ndarray, b: np.ndarray, magnitude: bool) -> np.ndarray:
    return np.abs(a) @ np.abs(b) if magnitude else a @ b


def _norm_vjp(kind: str, x: np.ndarray, g: np.ndarray, dy: np.ndarray, eps: float,
              magnitude: bool = False):
    """(dx, dgain) for y = xhat(x) * g."""
    if kind == "rms":
        xhat, inv = ref.rms_normalized(x, eps), ref.rms_inverse(x, eps)
    else:
        mu, inv = ref.mean_and_inverse_std(x, eps)
        xhat = (x - mu) * inv
    if magnitude:
        dy, g, xhat = np.abs(dy), np.abs(g), np.abs(xhat)
    sign = 1.0 if magnitude else -1.0
    dxhat = dy * g
    proj = xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True)
    mean = np.mean(dxhat, axis=-1, keepdims=True) if kind == "layer" else 0.0
    dx = inv * (dxhat + sign * mean + sign * proj)
    return dx, np.sum((dy * xhat).reshape(-1, x.shape[-1]), axis=0), xhat


def norm_vjp(kind: str, x, scale, bias, dy, *, eps: float, scale_offset: float = 0.0,
             magnitude: bool = False) -> dict:
    """Gradients of rms_norm (kind="rms") or layer_norm (kind="layer") against cotangent dy."""
    x, dy = f64(x), f64(dy)
    g = ref.gain(scale, scale_offset, x.shape[-1])
    dx, dg, _ = _norm_vjp(kind, x, g, dy, eps, magnitude)
    grads = {"x": dx, "scale": None if scale is None else dg}
    if kind == "layer":
        dy_sum = _abs_if(dy, magnitude).reshape(-1, x.shape[-1])
        grads["bias"] = None if bias is None else np.sum(dy_sum, axis=0)
    return grads


def norm_dense_vjp(kind: str, x, scale, norm_bias, kernel, bias, dy, *, eps: float,
                   scale_offset: float = 0.0, magnitude: bool = False) -> dict:
    """Gradients of a pre-norm dense op (one kernel) against cotangent dy [..., N]."""
    x, w, dy = f64(x), f64(kernel), f64(dy)
    normed = (ref.rms_norm(x, scale, eps=eps, scale_offset=scale_offset) if kind == "rms"
              else ref.layer_norm(x, scale, norm_bias, eps=eps, scale_offset=scale_offset))
    dnormed = _mm(dy, w.T, magnitude)
    norm_grads = norm_vjp(kind, x, scale, norm_bias, dnormed, eps=eps, scale_offset=scale_offset,
                          magnitude=magnitude)
    k, n = w.shape
    grads = {
        "x": norm_grads["x"],
        "scale": norm_grads["scale"],
        "kernel": _mm(normed.reshape(-1, k).T, dy.reshape(-1, n), magnitude),
        "bias": None if bias is None else np.sum(_abs_if(dy, magnitude).reshape(-1, n), axis=0),
    }
    if kind == "layer":
        grads["norm_bias"] = norm_grads["bias"]
    return grads


def dense_norm_vjp(kind: str, x, kernel, bias, scale, norm_bias, dy, *, eps: float,
                   scale_offset: float = 0.0, residual=None, residual_after=None,
                   magnitude: bool = False) -> dict:
    """Gradients of a post-norm op Norm(x @ W + b [+ residual]) [+ residual_after] against
    cotangent dy (d residual_after = dy)."""
    x, w, dy = f64(x), f64(kernel), f64(dy)
    h = ref.pre_norm_sum(x, w, bias, residual)
    dh_grads = norm_vjp(kind, h, scale, norm_bias, dy, eps=eps, scale_offset=scale_offset,
                        magnitude=magnitude)
    dh = dh_grads["x"]
    k, n = w.shape
    grads = {
        "x": _mm(dh, w.T, magnitude),
        "kernel": _mm(x.reshape(-1, k).T, dh.reshape(-1, n), magnitude),
        "bias": None if bias is None else np.sum(dh.reshape(-1, n), axis=0),
        "scale": dh_grads["scale"],
        "residual": None if residual is None else dh,
        "residual_after": None if residual_after is None else (np.abs(dy) if magnitude else dy),
    }
    if kind == "layer":
        grads["norm_bias"] = dh_grads["bias"]
    return grads
