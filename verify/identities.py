"""The algebra of docs/design.md section 1, each identity as a float64 check.

Every function takes float64 arrays, evaluates both sides of one identity and
returns the largest relative difference, so properties can assert it is at
the level of float64 rounding. Hand-countable anchors live in tests/test_identities.py.
"""

from __future__ import annotations

import numpy as np

from verify import references as ref


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(a))), float(np.max(np.abs(b))), 1e-300)
    return float(np.max(np.abs(a - b))) / scale


def lazy_rms(x: np.ndarray, g: np.ndarray, w: np.ndarray, eps: float) -> float:
    """1. RMSNorm(X; g) @ W = diag(r(X)) (X @ (diag(g) W))."""
    lhs = ref.rms_norm(x, g, eps=eps) @ w
    rhs = ref.rms_inverse(x, eps) * (x @ (g[:, None] * w))
    return _rel(lhs, rhs)


def lazy_layer_norm(x, g, beta, w, b, eps: float) -> float:
    """2. LayerNorm(X; g, beta) @ W + b = diag(s) (X W* - mu (1^T W*)) + (beta W + b)."""
    lhs = ref.layer_norm(x, g, beta, eps=eps) @ w + b
    w_star = g[:, None] * w
    mu, s = ref.mean_and_inverse_std(x, eps)
    rhs = s * (x @ w_star - mu * np.sum(w_star, axis=0)) + (beta @ w + b)
    return _rel(lhs, rhs)


def centering(a: np.ndarray, b: np.ndarray) -> float:
    """2'. A_c B = A B - mean(A) (1^T B), A_c the row-centred A."""
    mu = np.mean(a, axis=-1, keepdims=True)
    return _rel((a - mu) @ b, a @ b - mu * np.sum(b, axis=0))


def variance_from_moments(x: np.ndarray) -> float:
    """2''. sigma^2 = E[x^2] - E[x]^2 (exact in float64; the float32 code never uses it)."""
    return _rel(np.var(x, axis=-1), np.mean(x * x, axis=-1) - np.mean(x, axis=-1) ** 2)


def chunked_statistics(x: np.ndarray, chunks: int) -> float:
    """3. Row (sum, sum of squares) from per-tile partials = whole-row statistics.

    Each tile reduces its columns; partials are added (what CTAs exchange).
    Mean and variance follow from the combined (count, sum, sum of squares).
    """
    parts = np.array_split(x, chunks, axis=-1)
    s = sum(np.sum(p, axis=-1) for p in parts)
    ss = sum(np.sum(p * p, axis=-1) for p in parts)
    k = x.shape[-1]
    combined = np.stack([s, ss, ss / k - (s / k) ** 2])
    whole = np.stack([np.sum(x, -1), np.sum(x * x, -1), np.var(x, -1)])
    return _rel(combined, whole)


def shifted_partials(part: np.ndarray, shift: str) -> tuple[np.ndarray, ...]:
    """One CTA's LayerNorm partials of its columns: (count, shift s, shifted mean md, M2).

    s is the part's first element (standalone row norm) or its own mean (post-norm
    GEMM); md = mean(x - s), M2 = sum((x - s - md)^2). Computed in part's dtype.
    """
    if shift not in ("first", "mean"):
        raise ValueError(f"shift must be 'first' or 'mean'; got {shift!r}")
    s = part[..., 0] if shift == "first" else np.mean(part, axis=-1)
    d = part - s[..., None]
    md = np.mean(d, axis=-1)
    m2 = np.sum((d - md[..., None]) ** 2, axis=-1)
    return np.full(s.shape, part.shape[-1], part.dtype), s, md, m2


def combine_shifted(partials: list[tuple[np.ndarray, ...]],
                    reference: str = "first") -> tuple[np.ndarray, np.ndarray]:
    """Chan's combine of shifted partials into the row's (mean, variance).

    Relative to a reference shift s_0 (the first part's, or the mean of the parts'
    shifts where the kernel loads partials as a matrix), part c has mean
    a_c = (s_c - s_0) + md_c;
    the row's shifted mean is mu = sum_c n_c a_c / K and
    M2 = sum_c M2_c + sum_c n_c (a_c - mu)^2. Only differences of nearby values
    are formed, so rows with |mean| >> std keep their digits in float32.
    """
    if reference not in ("first", "mean"):
        raise ValueError(f"reference must be 'first' or 'mean'; got {reference!r}")
    counts, shifts, means_d, m2s = (np.stack(column) for column in zip(*partials))
    s0 = shifts[0] if reference == "first" else np.mean(shifts, axis=0)
    a = (shifts - s0) + means_d
    k = np.sum(counts, axis=0)
    mu = np.sum(counts * a, axis=0) / k
    m2 = np.sum(m2s, axis=0) + np.sum(counts * (a - mu) ** 2, axis=0)
    return s0 + mu, m2 / k


def shifted_statistics(x: np.ndarray, chunks: int, shift: str = "first",
                       reference: str = "first") -> float:
    """3'. Chan-combined per-tile (count, shift, shifted mean, M2) = whole-row mean, variance.

    What the kernels exchange for LayerNorm when a row spans CTAs or warpgroups
    (chunks of unequal width included; the kernels' are equal). Mean and variance
    are compared separately: a large mean must not hide a variance error.
    """
    partials = [shifted_partials(p, shift) for p in np.array_split(x, chunks, axis=-1)]
    mean, var = combine_shifted(partials, reference)
    x64 = x.astype(np.float64)
    return max(_rel(mean.astype(np.float64), np.mean(x64, -1)),
               _rel(var.astype(np.float64), np.var(x64, -1)))


def sum_m2_partials(part: np.ndarray) -> tuple[np.ndarray, ...]:
    """One tile's partials as the GEMM epilogue writes them: (count, sum, M2 about its mean)."""
    total = np.sum(part, axis=-1)
    m2 = np.sum((part - total[..., None] / part.shape[-1]) ** 2, axis=-1)
    return np.full(total.shape, part.shape[-1], part.dtype), total, m2


def combine_sum_m2(partials: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """Chan's combine of (count, sum, M2) partials into the row's (mean, M2):
    mean = sum_c sum_c / K, M2 = sum_c M2_c + sum_c n_c (sum_c / n_c - mean)^2."""
    counts, sums, m2s = (np.stack(column) for column in zip(*partials))
    mean = np.sum(sums, axis=0) / np.sum(counts, axis=0)
    return mean, np.sum(m2s, axis=0) + np.sum(counts * (sums / counts - mean) ** 2, axis=0)


def chan_statistics(x: np.ndarray, chunks: int) -> float:
    """3''. A row's (mean, M2) from per-tile (sum, M2) partials by Chan's combine equals the
    two-pass (mean, sum of squared deviations) of the whole row: what `residual_dense`'s
    kernel writes per warpgroup tile and XLA combines (tiles of unequal width included)."""
    partials = [sum_m2_partials(p) for p in np.array_split(x, chunks, axis=-1)]
    mean, m2 = combine_sum_m2(partials)
    x64 = x.astype(np.float64)
    mean64 = np.mean(x64, -1)
    m2_64 = np.sum((x64 - mean64[..., None]) ** 2, -1)
    return max(_rel(mean.astype(np.float64), mean64), _rel(m2.astype(np.float64), m2_64))


def residual_after_statistics(x: np.ndarray, w: np.ndarray, r: np.ndarray, g: np.ndarray,
                              eps: float, chunks: int) -> float:
    """8, post-norm. The same for h = r + RMSNorm(x W; g) (Gemma 2/3's post-sublayer
    norms): h's (mean, M2) from per-tile (sum, M2) partials of h, which the post-norm
    GEMM's epilogue holds after the norm, equal h's direct two-pass ones; the norm's own
    statistics, exchanged across the row's CTAs, do not enter."""
    return chan_statistics(r + ref.rms_normalized(x @ w, eps) * g, chunks)


def norms_from_mean_m2(x: np.ndarray, eps: float) -> float:
    """3'''. The norms' row scales from (mean, M2) alone: r = rsqrt(M2/K + mean^2 + eps)
    (mean(x^2) = var + mean^2) and s = rsqrt(M2/K + eps)."""
    k = x.shape[-1]
    mean = np.mean(x, -1, keepdims=True)
    m2 = np.sum((x - mean) ** 2, -1, keepdims=True)
    r = 1.0 / np.sqrt(m2 / k + mean**2 + eps)
    s = 1.0 / np.sqrt(m2 / k + eps)
    return max(_rel(r, ref.rms_inverse(x, eps)), _rel(s, ref.mean_and_inverse_std(x, eps)[1]))


def deferred_scale(x: np.ndarray, w: np.ndarray, eps: float, k_tile: int) -> float:
    """4. The K-loop accumulates X W and the statistic independently; the scale waits for both.

    Tiles of K are accumulated in any order; applying diag(r) after the loop
    equals normalizing first.
    """
    k = x.shape[-1]
    acc = np.zeros((x.shape[0], w.shape[1]))
    ssq = np.zeros((x.shape[0], 1))
    for start in range(0, k, k_tile):
        xs = x[:, start:start + k_tile]
        acc += xs @ w[start:start + k_tile]
        ssq += np.sum(xs * xs, axis=-1, keepdims=True)
    epilogue = acc / np.sqrt(ssq / k + eps)
    return _rel(epilogue, ref.rms_norm(x, eps=eps) @ w)


def norm_cancellation(x: np.ndarray, c: float, w: np.ndarray) -> float:
    """5. RMSNorm(c x) = RMSNorm(x) for c > 0 (eps = 0), so RMSNorm(RMSNorm(x) W) = RMSNorm(x W)."""
    scale_invariance = _rel(ref.rms_norm(c * x, eps=0.0), ref.rms_norm(x, eps=0.0))
    chained = _rel(ref.rms_norm(ref.rms_norm(x, eps=0.0) @ w, eps=0.0),
                   ref.rms_norm(x @ w, eps=0.0))
    return max(scale_invariance, chained)


def qk_norm_scores(q, k, gq, gk, eps: float) -> float:
    """6. (diag(r_q) Q Gq)(diag(r_k) K Gk)^T = diag(r_q) (Q Gq Gk K^T) diag(r_k)."""
    lhs = ref.rms_norm(q, gq, eps=eps) @ ref.rms_norm(k, gk, eps=eps).T
    rq, rk = ref.rms_inverse(q, eps), ref.rms_inverse(k, eps)
    rhs = rq * ((q * (gq * gk)) @ k.T) * rk.T
    return _rel(lhs, rhs)


def rope(x: np.ndarray, positions: np.ndarray, theta: float = 10_000.0) -> np.ndarray:
    """Rotary embedding of rows x [T, D] at positions [T], rotating halves (Llama layout)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angles = positions[:, None] * inv
    x1, x2 = x[:, : d // 2], x[:, d // 2:]
    cos, sin = np.cos(angles), np.sin(angles)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def rope_norm(q: np.ndarray, positions: np.ndarray, g: np.ndarray, eps: float) -> float:
    """7. ||RoPE(q)|| = ||q|| per row, so r(RoPE(q)) = r(q) and the row scale commutes with
    RoPE: RoPE(RMSNorm(q; g)) = diag(r(q)) RoPE(q * g). A decode epilogue may apply QK-norm's
    row scale after RoPE, with the statistic taken before or after the rotation."""
    rotated = rope(q, positions)
    norms = _rel(np.linalg.norm(rotated, axis=-1), np.linalg.norm(q, axis=-1))
    scale_after = _rel(rope(ref.rms_norm(q, g, eps=eps), positions),
                       ref.rms_inverse(rotated, eps) * rope(q * g, positions))
    return max(norms, scale_after)


def gated_epilogue(x: np.ndarray, g: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray,
                   b_gate: np.ndarray, b_up: np.ndarray, eps: float, activation: str) -> float:
    """8. act(RMSNorm(X; g) Wg + bg) * (RMSNorm(X; g) Wu + bu)
         = act(diag(r) (X Wg*) + bg) * (diag(r) (X Wu*) + bu),   W* = diag(g) W,
    and the same with the gain on X instead (X* = X diag(g)): the gated kernel's epilogue
    applies r to both accumulators before the activation, from either operand scaled."""
    from verify import gated

    normed = ref.rms_norm(x, g, eps=eps)
    lhs = gated.activation(activation, normed @ w_gate + b_gate) * (normed @ w_up + b_up)
    r = ref.rms_inverse(x, eps)
    weights_scaled = gated.activation(activation, r * (x @ (g[:, None] * w_gate)) + b_gate) * (
        r * (x @ (g[:, None] * w_up)) + b_up)
    x_scaled = gated.activation(activation, r * ((x * g) @ w_gate) + b_gate) * (
        r * ((x * g) @ w_up) + b_up)
    return max(_rel(lhs, weights_scaled), _rel(lhs, x_scaled))


def rms_backward_one_pass(x: np.ndarray, g: np.ndarray, dy: np.ndarray, eps: float,
                          block_m: int) -> float:
    """9. RMSNorm's backward as its kernel computes it from one read of X and dY:
         dX = diag(r) (dY* - diag(r^2 rowsum(dY* . X) / K) X),   dY* = dY diag(g),
         dg = sum over row blocks b of colsum(dY_b . X_b . r_b),
    against the float64 VJP in its textbook form (docs/backward.md, the row rule): the row
    sum of dY* . X stands for mean(dxhat . xhat), and the gain's column sum is the sum of
    per-block partials."""
    from verify import gradients

    k = x.shape[-1]
    r = ref.rms_inverse(x, eps)
    d_star = dy * g
    dx = r * (d_star - (r * r * np.sum(d_star * x, axis=-1, keepdims=True) / k) * x)
    rows = x.shape[0]
    dg = sum(np.sum(dy[b:b + block_m] * x[b:b + block_m] * r[b:b + block_m], axis=0)
             for b in range(0, rows, block_m))
    expected = gradients.norm_vjp("rms", x, g, None, dy, eps=eps)
    # Both are sums of terms that can cancel (dX almost exactly where a row's x^2 dwarfs
    # eps, K = 1: dX ~ r dY* eps / x^2; dg across rows): errors relative to the terms.
    def err(got: np.ndarray, want: np.ndarray, terms: np.ndarray) -> float:
        scale = max(float(np.max(terms)), float(np.max(np.abs(want))), 1e-300)
        return float(np.max(np.abs(got - want))) / scale

    return max(err(dx, expected["x"], np.abs(r * d_star)),
               err(dg, expected["scale"], np.sum(np.abs(dy * x * r), axis=0)))


def rms_backward_of_copies(x: np.ndarray, g: np.ndarray, dys: list[np.ndarray], eps: float,
                           block_m: int) -> float:
    """10. The backward of RMSNorm(X; g) handed to n consumers (q, k and v; gate and up)
    given each one's cotangent dY_i: the one-pass kernel form (9) with dY = sum_i dY_i,
    summed elementwise as it loads its tiles, against the float64 VJPs of the consumers one
    by one, summed: dX = sum_i VJP_X(dY_i), dg = sum_i VJP_g(dY_i) (the VJP is linear in
    dY, so the kernel may take the consumers' cotangents rather than their sum)."""
    from verify import gradients

    each = [gradients.norm_vjp("rms", x, g, None, dy, eps=eps) for dy in dys]
    summed = sum(dys)
    k = x.shape[-1]
    r = ref.rms_inverse(x, eps)
    d_star = summed * g
    dx = r * (d_star - (r * r * np.sum(d_star * x, axis=-1, keepdims=True) / k) * x)
    dg = sum(np.sum(summed[b:b + block_m] * x[b:b + block_m] * r[b:b + block_m], axis=0)
             for b in range(0, x.shape[0], block_m))

    def err(got: np.ndarray, want: np.ndarray, terms: np.ndarray) -> float:
        scale = max(float(np.max(terms)), float(np.max(np.abs(want))), 1e-300)
        return float(np.max(np.abs(got - want))) / scale

    terms = sum(np.abs(r * dy * g) for dy in dys)
    return max(err(dx, sum(e["x"] for e in each), terms),
               err(dg, sum(e["scale"] for e in each),
                   sum(np.sum(np.abs(dy * x * r), axis=0) for dy in dys)))
