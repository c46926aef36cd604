"""Float64 numpy references for every op, and the norm conventions users meet.

A reference returns the float64 value of what its convention computes,
including the intermediate roundings that convention specifies (HF Llama casts
the normalized activation to the input dtype before the gain) but NOT the final
rounding to the output dtype: `verify.tolerances` accounts for that.

Conventions of a standalone norm on input x (dtype d) with gain g:
- "jaxnorm": float32 statistics, gain applied in float32, output in d.
- "flax":    like jaxnorm, but the output dtype is promote(d, g.dtype)
             (nnx.RMSNorm / nnx.LayerNorm with dtype=None): float32 for bf16 x, f32 g.
- "hf_llama": x -> float32, normalize, cast to d, then multiply by g; output promote(d, g).
- "gemma":   x -> float32, normalize, multiply by (1 + g) in float32, cast to d.
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np

CONVENTIONS = ("jaxnorm", "flax", "hf_llama", "gemma")
F64 = np.float64


def f64(a) -> np.ndarray | None:
    return None if a is None else np.asarray(a).astype(F64)


def round_to(a: np.ndarray, dtype) -> np.ndarray:
    """Round float64 values to `dtype` and back: an intermediate cast a convention performs."""
    return np.asarray(a, F64).astype(np.dtype(dtype)).astype(F64)


def _safe_rsqrt(v: np.ndarray) -> np.ndarray:
    """1/sqrt(v) where v > 0, 0 where v == 0 (zero rows give zeros), NaN stays NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = 1.0 / np.sqrt(np.where(v > 0, v, 1.0))
    return np.where(v > 0, r, np.where(np.isnan(v), v, 0.0))


def rms_inverse(x: np.ndarray, eps: float) -> np.ndarray:
    """r(x) = rsqrt(mean(x^2) + eps) per row, shape [..., 1]."""
    return _safe_rsqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)


def mean_and_inverse_std(x: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(mu(x), s(x)) per row, shape [..., 1]; float64 two-pass, exact enough to judge float32."""
    mu = np.mean(x, axis=-1, keepdims=True)
    return mu, _safe_rsqrt(np.mean(np.square(x - mu), axis=-1, keepdims=True) + eps)


def gain(scale, scale_offset: float, k: int) -> np.ndarray:
    return np.ones(k) if scale is None else f64(scale) + scale_offset


def rms_normalized(x, eps: float) -> np.ndarray:
    x = f64(x)
    return x * rms_inverse(x, eps)


def layer_normalized(x, eps: float) -> np.ndarray:
    x = f64(x)
    mu, s = mean_and_inverse_std(x, eps)
    return (x - mu) * s


def output_dtype(convention: str, x_dtype, scale_dtype=None) -> np.dtype:
    if convention in ("flax", "hf_llama") and scale_dtype is not None:
        return np.promote_types(np.dtype(x_dtype), np.dtype(scale_dtype))
    return np.dtype(x_dtype)


def _apply_gain(
    normalized: np.ndarray,
    x_dtype,
    scale,
    scale_offset: float,
    bias,
    convention: str,
) -> np.ndarray:
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}; got {convention!r}")
    if convention == "hf_llama":
        normalized = round_to(normalized, x_dtype)
    if convention == "gemma":
        scale_offset = 1.0
    y = normalized * gain(scale, scale_offset, normalized.shape[-1])
    return y if bias is None else y + f64(bias)


def rms_norm(x, scale=None, *, eps: float = 1e-6, scale_offset: float = 0.0,
             convention: str = "jaxnorm") -> np.ndarray:
    x_dtype = np.asarray(x).dtype
    return _apply_gain(rms_normalized(x, eps), x_dtype, scale, scale_offset, None, convention)


def layer_norm(x, scale=None, bias=None, *, eps: float = 1e-6, scale_offset: float = 0.0,
               convention: str = "jaxnorm") -> np.ndarray:
    x_dtype = np.asarray(x).dtype
    return _apply_gain(layer_normalized(x, eps), x_dtype, scale, scale_offset, bias, convention)


def _kernels(kernel) -> tuple[list[np.ndarray], bool]:
    is_seq = isinstance(kernel, (list, tuple))
    return [f64(w) for w in (kernel if is_seq else [kernel])], is_seq


def _biases(bias, n: int, is_seq: bool) -> list[np.ndarray | None]:
    if bias is None:
        return [None] * n
    return [f64(b) for b in bias] if is_seq else [f64(bias)]


def dense(normed: np.ndarray, kernel, bias):
    """normed @ W + b for one kernel or a sequence (tuple out), exactly in float64."""
    kernels, is_seq = _kernels(kernel)
    outs = [
        normed @ w + (0.0 if b is None else b)
        for w, b in zip(kernels, _biases(bias, len(kernels), is_seq))
    ]
    return tuple(outs) if is_seq else outs[0]


def rms_norm_dense(x, scale, kernel, bias=None, *, eps: float = 1e-6,
                   scale_offset: float = 0.0):
    return dense(rms_norm(x, scale, eps=eps, scale_offset=scale_offset), kernel, bias)


def layer_norm_dense(x, scale, norm_bias, kernel, bias=None, *, eps: float = 1e-6,
                     scale_offset: float = 0.0):
    normed = layer_norm(x, scale, norm_bias, eps=eps, scale_offset=scale_offset)
    return dense(normed, kernel, bias)


def pre_norm_sum(x, kernel, bias=None, residual=None) -> np.ndarray:
    h = f64(x) @ f64(kernel)
    if bias is not None:
        h = h + f64(bias)
    if residual is not None:
        h = h + f64(residual)
    return h


def _plus(y: np.ndarray, residual_after) -> np.ndarray:
    return y if residual_after is None else y + f64(residual_after)


def dense_rms_norm(x, kernel, bias, scale, *, eps: float = 1e-6, residual=None,
                   residual_after=None):
    """(RMSNorm(x @ W + b [+ residual]; g) [+ residual_after], pre-norm sum)."""
    h = pre_norm_sum(x, kernel, bias, residual)
    return _plus(rms_normalized(h, eps) * gain(scale, 0.0, h.shape[-1]), residual_after), h


def dense_layer_norm(x, kernel, bias, scale, norm_bias, *, eps: float = 1e-6, residual=None,
                     residual_after=None):
    h = pre_norm_sum(x, kernel, bias, residual)
    y = layer_normalized(h, eps) * gain(scale, 0.0, h.shape[-1])
    return _plus(y if norm_bias is None else y + f64(norm_bias), residual_after), h

