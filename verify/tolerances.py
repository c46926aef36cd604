"""The error model: one tolerance for every implementation (xla, interpret, mosaic).

Notation: u_d is the unit roundoff of dtype d (half an ulp at 1: 2^-8 bf16,
2^-11 f16, 2^-24 f32). A result y in output dtype o is compared elementwise
with the float64 reference y64 of the same convention:

    |y - y64| <= C * (u_op + u_f32 * sqrt(K)) * ||a||_2  +  u_o * |y64|  +  tiny_o

- ||a||_2 is the 2-norm of the terms that were summed to make the element:
  for a dot of length K, a_k = xhat_k * w_k (the normalized activation times
  the effective weight). sqrt(K) * rms(a) = ||a||_2, so this is docs/design.md's
  "eps * sqrt(K) * (|x| . |w|)" with the terms combined as a random walk:
  rounding K operands to u_op (bf16 operands, a bf16 normalized activation, a
  folded weight rounded to bf16) errs like a random walk of K steps of size
  u_op * |a_k|; float32 accumulation adds at most u_f32 * sqrt(K) per term
  (pairwise/tiled sums grow slower). This assumes rounding errors that are not
  all of one sign, which holds for random weights; adversarial inputs built to
  round coherently can exceed it.
- For a standalone norm each output element is one product, so ||a||_2 is
  |xhat * g| (+ |bias|) and sqrt(K) covers the float32 row statistics.
  LayerNorm subtracts the mean: a centred value carries the error of the mean
  and of whatever shift the implementation subtracted first. Any shift taken
  from the row lies within the row's largest deviation from the mean, so the
  term is (|xhat| + max_row |xhat|) * |g| (`centred_terms`), for every
  implementation. In a LayerNorm + dense the same terms enter the float32
  part of the dot's budget (`statistics_terms`).
- u_o * |y64| is the final rounding to the output dtype; tiny_o the smallest
  normal number of o, so exact zeros compare equal.
- C = 8: a random walk stays inside ~3.5 of its u * ||a||_2 / sqrt(3) standard
  deviations with overwhelming probability, and the same C covers a second
  rounding of the same size (operand plus intermediate).

Post-norm (Norm(x @ W + b)): the pre-norm sum h carries the dot error above,
which the norm scales by s * |g| (its own row scale) before adding the norm's
own error.

Gradients are compared normwise per argument: ||g - g64|| <= C_GRAD * (u_op +
u_f32 * sqrt(L)) * ||m64|| + tiny, with L the longest reduction in the
backward pass (max of K, N and M) and m64 the gradient's magnitude: the same
float64 expression with every term taken in absolute value
(`verify.gradients`, magnitude=True), because a norm's gradient cancels.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

C = 8.0
C_GRAD = 16.0


def _finfo(dtype):
    return ml_dtypes.finfo(np.dtype(dtype))  # numpy's finfo does not know bfloat16


def unit_roundoff(dtype) -> float:
    return float(_finfo(dtype).eps) / 2.0


U_F32 = unit_roundoff(np.float32)


def tiny(dtype) -> float:
    return float(_finfo(dtype).smallest_normal)


def _budget(operand_dtype, k: int) -> float:
    return C * (unit_roundoff(operand_dtype) + U_F32 * np.sqrt(k))


def centred_terms(xhat: np.ndarray) -> np.ndarray:
    """|xhat| + max |xhat| over the row: the mean (and any in-row shift) errs that widely."""
    magnitude = np.abs(xhat)
    return magnitude + np.max(magnitude, axis=-1, keepdims=True)


def dot_terms_l2(normed: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """||a_ij||_2 with a_ijk = normed_ik * kernel_kj, for every output element."""
    return np.sqrt(np.square(normed) @ np.square(kernel))


def dense_tolerance(normed: np.ndarray, kernel: np.ndarray, y64: np.ndarray,
                    operand_dtype, out_dtype, bias=None,
                    statistics_terms: np.ndarray | None = None) -> np.ndarray:
    """Tolerance for y = normed @ kernel (+ bias) rounded to out_dtype.

    `statistics_terms` (default: |normed|) sizes the float32 part of the
    budget, where a LayerNorm's centring error lives.
    """
    k = normed.shape[-1]
    operand_terms = dot_terms_l2(normed, kernel)
    float32_terms = operand_terms if statistics_terms is None else dot_terms_l2(
        statistics_terms, kernel)
    if bias is not None:
        operand_terms = operand_terms + np.abs(bias)
        float32_terms = float32_terms + np.abs(bias)
    budget = C * (unit_roundoff(operand_dtype) * operand_terms
                  + U_F32 * np.sqrt(k) * float32_terms)
    return budget + unit_roundoff(out_dtype) * np.abs(y64) + tiny(out_dtype)


def norm_tolerance(normed_times_gain: np.ndarray, y64: np.ndarray, out_dtype,
                   intermediate_dtype=np.float32, bias=None) -> np.ndarray:
    """Tolerance for a standalone norm; intermediate_dtype is any cast inside the convention."""
    k = normed_times_gain.shape[-1]
    terms = np.abs(normed_times_gain) + (0.0 if bias is None else np.abs(bias))
    return _budget(intermediate_dtype, k) * terms + unit_roundoff(out_dtype) * np.abs(
        y64
    ) + tiny(out_dtype)


def post_norm_tolerance(h_error: np.ndarray, inverse_scale: np.ndarray, gain: np.ndarray,
                        normed_times_gain: np.ndarray, y64: np.ndarray, out_dtype,
                        bias=None) -> np.ndarray:
    """Norm(h) where h itself carries h_error: the norm scales it by s * |g|.

    The mean/variance see the row's errors averaged; they are bounded by the
    row's largest error, added once.
    """
    propagated = inverse_scale * np.abs(gain) * (
        h_error + np.max(h_error, axis=-1, keepdims=True)
    )
    return propagated + norm_tolerance(normed_times_gain, y64, out_dtype, bias=bias)


def grad_tolerance(magnitude64: np.ndarray, operand_dtype, longest_reduction: int) -> float:
    """Normwise tolerance for one gradient argument, from its float64 magnitude."""
    budget = C_GRAD * (unit_roundoff(operand_dtype) + U_F32 * np.sqrt(longest_reduction))
    return budget * float(np.linalg.norm(magnitude64)) + tiny(np.float32) * np.sqrt(
        magnitude64.size)
