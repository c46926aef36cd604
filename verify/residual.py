"""Judging `residual_dense` and the pre-norm ops given its statistics, against float64.

The statistics have two honest references, by where they were taken:
- "float32": the kernel reduces the float32 h before its rounding to x's dtype,
  so its (mean, M2) are judged against those of the float64 h, with the float32
  error of h (the dot's and the residual add's) carried through;
- "output": the xla path reduces the h it returns, so they are judged against the
  statistics of that h, with only the float32 reduction's error.
The post-norm ops' h = r + Norm(x @ W + b) (`return_statistics=True`) takes its
statistics of the float32 h on every path, judged like the kernel's ("float32").
A consumer (`rms_norm_dense(h, ..., statistics=...)`) is judged against the float64
op on the h it is given; its tolerance adds what statistics that differ from h's by
at most `u_x |h|` per element (a kernel's) do to the row scale.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm
from jaxnorm import dispatch
from pallas_kernels.decode_config import MAX_ROWS as DECODE_ROWS
from verify import gradients
from verify import references as ref
from verify import tolerances as tol
from verify.checks import (Judged, _dense_judged, _post_norm_judged, _ratio, check_grads_of,
                           post_norm_reference)
from verify.references import f64


def row_statistics(h64: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, M2) of the rows of h, float64 two-pass."""
    mean = np.mean(h64, axis=-1)
    return mean, np.sum(np.square(h64 - mean[..., None]), axis=-1)


def reference(x, kernel, residual, bias=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(h, mean, M2) in float64: h = x @ W + b + r and its rows' statistics."""
    h = ref.pre_norm_sum(x, kernel, bias, residual)
    return (h, *row_statistics(h))


def statistics_tolerance(h64: np.ndarray, h_error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bounds on (mean, M2) of rows known within `h_error`, reduced in float32.

    mean: the average error plus the float32 sum's; M2 = sum c^2 (c = h - mean) moves by at
    most 2 ||c|| ||e|| + ||e||^2 (Cauchy-Schwarz), and its float32 sum by C u sqrt(K) M2.
    """
    n = h64.shape[-1]
    f32 = tol.C * tol.U_F32 * np.sqrt(n)
    centred = h64 - np.mean(h64, axis=-1, keepdims=True)
    err_l2 = np.sqrt(np.sum(np.square(h_error), axis=-1))
    c_l2 = np.sqrt(np.sum(np.square(centred), axis=-1))
    t_mean = np.mean(h_error, axis=-1) + f32 * np.mean(np.abs(h64), axis=-1)
    t_m2 = 2 * c_l2 * err_l2 + err_l2**2 + f32 * c_l2**2 + tol.tiny(np.float32)
    return t_mean + tol.tiny(np.float32), t_m2


def _float32_h_error(x, kernel, bias, residual, h64) -> np.ndarray:
    """Error of the float32 h = acc + b + r: the dot's float32 accumulation of exact
    products (x and W are the operands, not roundings of them), then the adds of b and r."""
    dot = tol.dense_tolerance(f64(x), f64(kernel), h64, np.float32, np.float32)
    extra = np.abs(h64) + (0.0 if bias is None else np.abs(f64(bias))) + np.abs(f64(residual))
    return dot + tol.C * tol.U_F32 * extra


def judge_residual(h, stats, source: str, **inputs) -> list[Judged]:
    """h and its statistics against float64; `source` is "float32" (kernel) or "output"."""
    x, kernel, residual, bias = (inputs["x"], inputs["kernel"], inputs["residual"],
                                 inputs.get("bias"))
    x = np.asarray(x)
    h64, mean64, m2_64 = reference(x, kernel, residual, bias)
    h32_error = _float32_h_error(x, kernel, bias, residual, h64)
    # The xla path rounds x @ W, then the sum with b, to x's dtype before adding r.
    dot64 = h64 - f64(residual)
    partial = np.abs(dot64) + np.abs(dot64 - (0.0 if bias is None else f64(bias)))
    t_h = h32_error + 2 * tol.unit_roundoff(x.dtype) * (partial + np.abs(h64)) + tol.tiny(
        x.dtype)
    judged = [Judged("h", np.asarray(h), h64, t_h)]
    if source == "float32":
        t_mean, t_m2 = statistics_tolerance(h64, h32_error)
    elif source == "output":
        mean64, m2_64 = row_statistics(f64(np.asarray(h)))
        t_mean, t_m2 = statistics_tolerance(f64(np.asarray(h)), np.zeros_like(h64))
    else:
        raise ValueError(f"source must be 'float32' or 'output'; got {source!r}")
    assert stats.length == h64.shape[-1], (stats.length, h64.shape)
    judged += [Judged("mean", np.asarray(stats.mean), mean64, t_mean),
               Judged("m2", np.asarray(stats.m2), m2_64, t_m2)]
    return judged


def check_statistics_of_rounded(y, mean, m2) -> float:
    """Worst error/tolerance of float32 row statistics of a GEMM's float32 y, given only y
    rounded to its dtype: the two differ by at most u_y |y| per element."""
    y64 = f64(np.asarray(y))
    mean64, m2_64 = row_statistics(y64)
    t_mean, t_m2 = statistics_tolerance(y64, tol.unit_roundoff(np.asarray(y).dtype) * np.abs(y64))
    return max(_ratio(Judged("mean", np.asarray(mean), mean64, t_mean)),
               _ratio(Judged("m2", np.asarray(m2), m2_64, t_m2)))


def source_of(impl: str | None, rows: int) -> str:
    """Where the statistics of a residual_dense call with `impl` over `rows` rows were taken:
    the residual GEMM's float32 h, or the rounded output h (the xla path, and the kernel
    path at decode, where the decode GEMM writes h before XLA reduces it)."""
    if impl is None:
        impl = (dispatch.last_automatic_choice("residual_dense") or ("xla",))[0]
    return "output" if impl == "xla" or rows <= DECODE_ROWS else "float32"


def check_residual(impl: str | None = "xla", **inputs) -> float:
    """Worst error/tolerance of residual_dense(**inputs) over h, mean and M2."""
    h, stats = jaxnorm.residual_dense(inputs["x"], inputs["kernel"], inputs["residual"],
                                      inputs.get("bias"), impl=impl)
    rows = int(np.prod(np.shape(inputs["x"])[:-1]))
    return max(_ratio(j) for j in judge_residual(h, stats, source_of(impl, rows), **inputs))


def _consumer_terms(kind: str, h64, scale, kernel, eps: float, scale_offset: float,
                    y64_unbiased: np.ndarray, rounding: float) -> np.ndarray:
    """What statistics off by at most `rounding` |h| (+ float32) per element do to the output:
    the row scale's relative error times |y|, and for LayerNorm the mean's error times
    s |g @ W|."""
    n = h64.shape[-1]
    t_mean, t_m2 = statistics_tolerance(h64, rounding * np.abs(h64))
    mean = np.mean(h64, axis=-1)
    m2 = np.sum(np.square(h64 - mean[..., None]), axis=-1)
    if kind == "rms":
        ms = m2 / n + mean**2 + eps
        rel = (t_m2 / n + 2 * np.abs(mean) * t_mean + t_mean**2) / (2 * ms)
        return rel[..., None] * np.abs(y64_unbiased)
    rel = t_m2 / (2 * (m2 + n * eps))
    g = ref.gain(scale, scale_offset, n)
    s = 1.0 / np.sqrt(m2 / n + eps)
    shift = (s * t_mean)[..., None] * np.abs(g @ f64(kernel))
    return rel[..., None] * np.abs(y64_unbiased) + shift


def check_consumer(op: str, outputs, stats_impl: str | None, *, source: str | None = None,
                   **inputs) -> float:
    """Worst error/tolerance of `op`'s outputs computed from x and statistics of x.

    `stats_impl` names the implementation of `residual_dense` that produced the
    statistics: a kernel's differ from the x it wrote by x's rounding, the xla path's
    only by float32. `source` ("float32" or "output") says so directly instead (the
    post-norm ops' are "float32" from a kernel, "output" on the xla path)."""
    x = np.asarray(inputs["x"])
    eps, offset = inputs.get("eps", 1e-6), inputs.get("scale_offset", 0.0)
    scale, nb, kernel, bias = (inputs.get("scale"), inputs.get("norm_bias"), inputs["kernel"],
                               inputs.get("bias"))
    kind = "rms" if op == "rms_norm_dense" else "layer"
    h64 = f64(x)
    source = (source_of(stats_impl, int(np.prod(x.shape[:-1]))) if source is None
              else source)
    rounding = tol.unit_roundoff(x.dtype) if source == "float32" else 0.0
    if kind == "rms":
        normed = ref.rms_norm(x, scale, eps=eps, scale_offset=offset)
        centred = None
    else:
        normed = ref.layer_norm(x, scale, nb, eps=eps, scale_offset=offset)
        centred = tol.centred_terms(ref.layer_normalized(x, eps)) * np.abs(
            ref.gain(scale, offset, x.shape[-1])) + (0.0 if nb is None else np.abs(f64(nb)))
    judged = _dense_judged(op, x, normed, kernel, bias, outputs, statistics_terms=centred)
    unbiased = normed - (0.0 if nb is None else f64(nb))
    kernels = kernel if isinstance(kernel, (list, tuple)) else (kernel,)
    return max(
        _ratio(Judged(j.name, j.actual, j.expected, j.tolerance + _consumer_terms(
            kind, h64, scale, w, eps, offset, unbiased @ f64(w), rounding)))
        for j, w in zip(judged, kernels))


def residual_vjp(x, kernel, residual, bias, dh, d_mean, d_m2, *, magnitude: bool = False,
                 dh_total=None) -> dict:
    """float64 gradients of residual_dense against cotangents (dh, d mean, d M2):
    dH = dh + d_mean / N + 2 d_m2 (h - mean); dx = dH W^T, dW = x^T dH, db, dr = dH.
    `dh_total` replaces dH (a consumer's gradient with respect to h, chained through)."""
    x64, w64 = f64(x), f64(kernel)
    if dh_total is None:
        h64, mean64, _ = reference(x, kernel, residual, bias)
        centred = h64 - mean64[..., None]
        n = h64.shape[-1]
        parts = (f64(dh), f64(d_mean)[..., None] / n, 2 * f64(d_m2)[..., None] * centred)
        dh_total = sum(np.abs(p) for p in parts) if magnitude else sum(parts)
    mm = (lambda a, b: np.abs(a) @ np.abs(b)) if magnitude else (lambda a, b: a @ b)
    k, n = w64.shape
    flat = dh_total.reshape(-1, n)
    return {"x": mm(dh_total, w64.T), "kernel": mm(x64.reshape(-1, k).T, flat),
            "bias": None if bias is None else np.sum(np.abs(flat) if magnitude else flat, 0),
            "residual": dh_total}


def composed_vjp(kind: str, inputs: dict, norm_inputs: dict, dy, *, magnitude: bool) -> dict:
    """float64 gradients of h = x W + b + r -> Norm(h) @ W2 + b2, the unfused pair."""
    h64, _, _ = reference(inputs["x"], inputs["kernel"], inputs["residual"], inputs.get("bias"))
    g = norm_inputs.get
    norm_grads = gradients.norm_dense_vjp(kind, h64, g("scale"), g("norm_bias"), g("kernel"),
                                          g("bias"), dy, eps=g("eps", 1e-6),
                                          scale_offset=g("scale_offset", 0.0),
                                          magnitude=magnitude)
    grads = residual_vjp(inputs["x"], inputs["kernel"], inputs["residual"], inputs.get("bias"),
                         None, None, None, magnitude=magnitude, dh_total=norm_grads.pop("x"))
    grads.update({f"norm_{name}": v for name, v in norm_grads.items()})
    return grads


def check_grads(got: dict, expected: dict, magnitudes: dict, dtype, longest: int) -> float:
    """Normwise gradient judge (verify.tolerances.grad_tolerance) over the names in `got`."""
    worst = 0.0
    for name, g in got.items():
        if g is None:
            assert expected[name] is None, name
            continue
        err = float(np.linalg.norm(f64(np.asarray(g)) - expected[name]))
        bound = tol.grad_tolerance(magnitudes[name], dtype, longest)
        if not np.isfinite(err) or err > bound:
            raise AssertionError(f"d{name}: normwise error {err:.3e} > {bound:.3e}")
        worst = max(worst, err / bound)
    return worst


# ------------------------------------------------ post-norm h = r + Norm(x @ W + b)


def _post_norm_with_statistics(op: str, impl: str | None, inputs: dict):
    """a -> (h, mean, M2) of `op` with residual_after and return_statistics=True."""
    fn = jaxnorm.dense_rms_norm if op == "dense_rms_norm" else jaxnorm.dense_layer_norm
    vectors = ("bias", "scale") if op == "dense_rms_norm" else ("bias", "scale", "norm_bias")
    eps, offset = inputs.get("eps", 1e-6), inputs.get("scale_offset", 0.0)

    def run(a: dict):
        h, stats = fn(a["x"], a["kernel"], *(a.get(v) for v in vectors), eps=eps,
                      scale_offset=offset, residual_after=a["residual_after"],
                      return_statistics=True, impl=impl)
        assert stats.length == np.shape(a["kernel"])[1], stats.length
        return h, stats.mean, stats.m2

    return run


def _post_norm_reference(op: str, impl: str | None,
                         inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(h64, the error bound of the float32 h before its rounding): the post-norm kernel's
    dot keeps its float32 accumulator; the xla path's rounds to x's dtype (as the stock
    layers), and so does the decode GEMM's, which serves a kernel path at M <= 64."""
    g = inputs.get
    rows = int(np.prod(np.shape(g("x"))[:-1]))
    keeps_f32 = _kernel_path(op, impl) and rows > DECODE_ROWS
    h64, t_h32, _, _ = post_norm_reference(
        "rms" if op == "dense_rms_norm" else "layer", g("x"), g("kernel"), g("bias"),
        g("scale"), g("norm_bias"), None, g("eps", 1e-6), g("scale_offset", 0.0),
        g("residual_after"), y_dtype=np.float32, dot_dtype=np.float32 if keeps_f32 else None)
    return h64, t_h32


def _kernel_path(op: str, impl: str | None) -> bool:
    """Whether `op` ran (or impl=None last chose) a kernel, not the xla path."""
    return impl in ("mosaic", "interpret") or (
        impl is None and (dispatch.last_automatic_choice(op) or ("xla",))[0] != "xla")


def check_post_norm_statistics(op: str, impl: str | None = "xla", **inputs) -> float:
    """Worst error/tolerance of `op(..., residual_after=r, return_statistics=True)`: h as
    `check_op` judges it, and its (mean, M2) against the float64 h's, within what the
    float32 h's error does to them (`statistics_tolerance`)."""
    g = inputs.get
    h, mean, m2 = _post_norm_with_statistics(op, impl, inputs)(inputs)
    kind = "rms" if op == "dense_rms_norm" else "layer"
    judged = _post_norm_judged(kind, np.asarray(g("x")), g("kernel"), g("bias"), g("scale"),
                               g("norm_bias"), None, h, None, g("eps", 1e-6),
                               g("scale_offset", 0.0), g("residual_after"))
    h64, t_h32 = _post_norm_reference(op, impl, inputs)
    if not _kernel_path(op, impl):  # the xla path takes them of the stored h
        h64, t_h32 = f64(np.asarray(h)), np.zeros(np.shape(h))
    mean64, m2_64 = row_statistics(h64)
    t_mean, t_m2 = statistics_tolerance(h64, t_h32)
    judged += [Judged("mean", np.asarray(mean), mean64, t_mean),
               Judged("m2", np.asarray(m2), m2_64, t_m2)]
    return max(_ratio(j) for j in judged)


def check_post_norm_statistics_grad(op: str, impl: str | None = "xla", *, seed: int = 0,
                                    **inputs) -> float:
    """Gradients of <(h, mean, M2), (dh, d mean, d M2)> for every differentiable input of
    `op(..., residual_after=r, return_statistics=True)` against float64: the op's VJP with
    the cotangent dH = dh + d_mean / N + 2 d_m2 (h - mean) of the float64 h."""
    names = ("x", "kernel", "bias", "scale", "norm_bias", "residual_after")
    diff = {k: jnp.asarray(inputs[k]) for k in names if inputs.get(k) is not None}
    (h, mean, _), vjp = jax.vjp(_post_norm_with_statistics(op, impl, inputs), diff)
    rng = np.random.default_rng(seed)
    n = h.shape[-1]
    dh = rng.standard_normal(h.shape).astype(np.asarray(h).dtype)
    d_mean = (n * rng.standard_normal(mean.shape)).astype(np.float32)
    d_m2 = rng.standard_normal(mean.shape).astype(np.float32)
    (grads,) = vjp((jnp.asarray(dh), jnp.asarray(d_mean), jnp.asarray(d_m2)))
    h64, _ = _post_norm_reference(op, impl, inputs)
    # The statistics are of the float32 h from a kernel, of the stored h on the xla path.
    stats_of = h64 if _kernel_path(op, impl) else f64(np.asarray(h))
    mean64, _ = row_statistics(stats_of)
    parts = (f64(dh), f64(d_mean)[..., None] / n, 2 * f64(d_m2)[..., None])
    dh_total = parts[0] + parts[1] + parts[2] * (stats_of - mean64[..., None])
    # h - mean is taken of a float32 h, which errs by u_f32 |h|: next to the budget's u_op
    # (verify.tolerances) that is a term (u_f32 / u_op) |h|, which matters at |mean| >> std
    # in float32 only.
    centred = np.abs(stats_of - mean64[..., None])
    rounding = tol.U_F32 / tol.unit_roundoff(np.asarray(inputs["x"]).dtype) * np.abs(h64)
    magnitude = np.abs(parts[0]) + np.abs(parts[1]) + np.abs(parts[2]) * (centred + rounding)
    return check_grads_of(op, grads, [dh_total], dy_magnitudes=[magnitude], **inputs)
