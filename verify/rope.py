"""Float64 reference and judge of the attention input (input norm, q/k/v, per-head QK-norm,
RoPE), and the identities a fused epilogue of it relies on.

    h_i = RMSNorm(x; scale) @ W_i,   q = RoPE(QKNorm(h_q)),  k = RoPE(QKNorm(h_k)),  v = h_v
    QKNorm(h) = h rsqrt(mean_head(h^2) + qk_eps) (qk_offset + g)   per head of head_dim
    RoPE(n) = [n_lo cos - n_hi sin, n_hi cos + n_lo sin]            per head (rotate-half)

with cos, sin the [M, hd/2] tables of each row's position as given to the op. Without
QK-norm gains (None: Llama) q = RoPE(h_q), k = RoPE(h_k).

Error model (verify.tolerances): h carries a dense product's error t_h (its rounding to
x's dtype included: the stock path rounds h before QK-norm); QK-norm scales it by s |g| as
a post-norm does (`tolerances.post_norm_tolerance`, over each head), adding its own
float32 error and a rounding to x's dtype (stock rounds again before RoPE); the rotation
mixes the two halves' errors with weights |cos|, |sin| and adds float32 roundings of
|n_lo| + |n_hi|, then the output's rounding.
"""

from __future__ import annotations

import numpy as np

from verify import references as ref
from verify import tolerances as tol
from verify.checks import Judged, _ratio
from verify.references import f64


def _heads(a: np.ndarray, head_dim: int) -> np.ndarray:
    """[M, H * hd] -> [M, H, hd]."""
    return a.reshape(a.shape[0], -1, head_dim)


def rope_heads(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_dim: int) -> np.ndarray:
    """Rotate-half RoPE of every head of x [M, H * hd] with row tables cos, sin [M, hd/2]."""
    h = _heads(f64(x), head_dim)
    c, s = f64(cos)[:, None, :], f64(sin)[:, None, :]
    lo, hi = h[..., : head_dim // 2], h[..., head_dim // 2:]
    return np.concatenate([lo * c - hi * s, hi * c + lo * s], axis=-1).reshape(x.shape)


def qk_norm(h: np.ndarray, gain, *, head_dim: int, eps: float, offset: float) -> np.ndarray:
    """Per-head RMSNorm of h [M, H * hd] with gain (offset + g) [hd], float64."""
    heads = _heads(f64(h), head_dim)
    return (heads * ref.rms_inverse(heads, eps) * ref.gain(gain, offset, head_dim)).reshape(
        np.shape(h))


def attention_input(x, scale, w_q, w_k, w_v, q_gain, k_gain, cos, sin, *, head_dim: int,
                    eps: float = 1e-6, scale_offset: float = 0.0, qk_eps: float = 1e-6,
                    qk_offset: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q, k, v) in float64."""
    normed = ref.rms_norm(np.asarray(x), scale, eps=eps, scale_offset=scale_offset)
    h_q, h_k, h_v = (normed @ f64(w) for w in (w_q, w_k, w_v))
    kw = dict(head_dim=head_dim, eps=qk_eps, offset=qk_offset)

    def normed(h, gain):
        return h if gain is None else qk_norm(h, gain, **kw)

    return (rope_heads(normed(h_q, q_gain), cos, sin, head_dim),
            rope_heads(normed(h_k, k_gain), cos, sin, head_dim), h_v)


def _rotated_judged(name: str, actual, normed, w, gain, cos, sin, x_dtype, *, head_dim: int,
                    qk_eps: float, qk_offset: float) -> Judged:
    """One of q, k: the product's error through QK-norm (gain None: none) and RoPE (module
    docstring)."""
    h64 = normed @ f64(w)
    t_h = _heads(tol.dense_tolerance(normed, f64(w), h64, x_dtype, x_dtype), head_dim)
    heads = _heads(h64, head_dim)
    if gain is None:
        n64, t_n = heads, t_h
    else:
        s = ref.rms_inverse(heads, qk_eps)
        g = ref.gain(gain, qk_offset, head_dim)
        n64 = heads * s * g
        t_n = tol.post_norm_tolerance(t_h, s, g, n64, n64, x_dtype)
    half = head_dim // 2
    c, sn = np.abs(f64(cos))[:, None, :], np.abs(f64(sin))[:, None, :]
    t_lo, t_hi = t_n[..., :half], t_n[..., half:]
    mixed = np.concatenate([c * t_lo + sn * t_hi, c * t_hi + sn * t_lo], axis=-1)
    both = np.abs(n64[..., :half]) + np.abs(n64[..., half:])
    out64 = rope_heads(n64.reshape(h64.shape), cos, sin, head_dim)
    t_out = (mixed + tol.C * tol.U_F32 * np.concatenate([both, both], axis=-1)).reshape(
        h64.shape) + tol.unit_roundoff(x_dtype) * np.abs(out64) + tol.tiny(x_dtype)
    return Judged(name, np.asarray(actual), out64, t_out)


def check_attention_input(q, k, v, x, scale, w_q, w_k, w_v, q_gain, k_gain, cos, sin, *,
                          head_dim: int, eps: float = 1e-6, scale_offset: float = 0.0,
                          qk_eps: float = 1e-6, qk_offset: float = 0.0) -> float:
    """Worst |out - out64| / tolerance over q, k and v (AssertionError above 1; NaN must sit
    where the reference has it)."""
    x_dtype = np.asarray(x).dtype
    normed = ref.rms_norm(np.asarray(x), scale, eps=eps, scale_offset=scale_offset)
    kw = dict(head_dim=head_dim, qk_eps=qk_eps, qk_offset=qk_offset)
    judged = [_rotated_judged("q", q, normed, w_q, q_gain, cos, sin, x_dtype, **kw),
              _rotated_judged("k", k, normed, w_k, k_gain, cos, sin, x_dtype, **kw)]
    v64 = normed @ f64(w_v)
    judged.append(Judged("v", np.asarray(v), v64,
                         tol.dense_tolerance(normed, f64(w_v), v64, x_dtype, x_dtype)))
    return max(_ratio(j) for j in judged)


# ------------------------------------------------ identities (float64, relative error)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(a))), float(np.max(np.abs(b))), 1e-300)
    return float(np.max(np.abs(a - b))) / scale


def tables(positions: np.ndarray, head_dim: int, theta: float = 10_000.0):
    """(cos, sin) [M, hd/2] float64 of each row's position."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.asarray(positions, np.float64)[:, None] * inv
    return np.cos(angles), np.sin(angles)


def rope_keeps_head_norms(q: np.ndarray, positions: np.ndarray, head_dim: int) -> float:
    """||RoPE(q)_head|| = ||q_head|| for every row and head (each pair is a rotation)."""
    rotated = rope_heads(q, *tables(positions, head_dim), head_dim)
    return _rel(np.linalg.norm(_heads(rotated, head_dim), axis=-1),
                np.linalg.norm(_heads(q, head_dim), axis=-1))


def rope_commutes_with_row_scale(q: np.ndarray, s: np.ndarray, positions: np.ndarray,
                                 head_dim: int) -> float:
    """RoPE(diag(s) q) = diag(s) RoPE(q): the input norm's row scale may be applied to the
    accumulators before or after the rotation."""
    cos, sin = tables(positions, head_dim)
    return _rel(rope_heads(s[:, None] * q, cos, sin, head_dim),
                s[:, None] * rope_heads(q, cos, sin, head_dim))


def qk_norm_ignores_row_scale(q: np.ndarray, s: np.ndarray, gain: np.ndarray,
                              head_dim: int) -> float:
    """QKNorm(diag(s) q) = QKNorm(q) for s > 0 at qk_eps = 0 (with eps > 0 it holds to a
    relative eps / mean(q^2)): so the input norm's scale only matters through qk_eps, and the
    kernel may apply it in either order."""
    kw = dict(head_dim=head_dim, eps=0.0, offset=0.0)
    return _rel(qk_norm(s[:, None] * q, gain, **kw), qk_norm(q, gain, **kw))
