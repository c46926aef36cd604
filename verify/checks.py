"""Implementation-versus-reference checks: run a jaxnorm op, judge it by the error model.

`check_op(op, impl, **inputs)` and `check_grad(op, impl, **inputs)` are the one
entry point every test and `python -m verify` use, for every impl, so a new
kernel needs no new test logic. Each returns the worst error / tolerance ratio
(<= 1 passes) and raises AssertionError with the place and size of a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

import jaxnorm
from verify import gradients
from verify import references as ref
from verify import tolerances as tol
from verify.references import f64

OPS = ("rms_norm", "layer_norm", "rms_norm_dense", "layer_norm_dense",
       "dense_rms_norm", "dense_layer_norm")


@dataclass(frozen=True)
class Judged:
    """One output judged against its reference."""

    name: str
    actual: np.ndarray
    expected: np.ndarray
    tolerance: np.ndarray


def _ratio(j: Judged) -> float:
    """Worst |actual - expected| / tolerance; NaN must sit exactly where the reference has NaN."""
    actual, expected = f64(j.actual), j.expected
    if actual.shape != expected.shape:
        raise AssertionError(f"{j.name}: shape {actual.shape}, reference {expected.shape}")
    nan_ref, nan_out = np.isnan(expected), np.isnan(actual)
    if np.any(nan_ref != nan_out):
        where = np.argwhere(nan_ref != nan_out)[0]
        raise AssertionError(
            f"{j.name}: NaN mismatch at {tuple(where)}: got {actual[tuple(where)]}, "
            f"reference {expected[tuple(where)]}"
        )
    ok = ~nan_ref
    if not np.any(ok):
        return 0.0
    with np.errstate(invalid="ignore"):
        ratios = np.where(ok, np.abs(actual - expected) / j.tolerance, 0.0)
    ratios = np.where(np.isnan(ratios), np.inf, ratios)  # inf output vs finite reference
    worst = np.unravel_index(np.argmax(ratios), ratios.shape)
    if ratios[worst] > 1.0:
        raise AssertionError(
            f"{j.name}: error {abs(actual[worst] - expected[worst]):.3e} > tolerance "
            f"{j.tolerance[worst]:.3e} at {tuple(int(i) for i in worst)} "
            f"(got {actual[worst]:.6e}, reference {expected[worst]:.6e})"
        )
    return float(ratios[worst])


def _as_tuple(v) -> tuple:
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


def _dense_judged(name, x, normed, kernel, bias, outputs, statistics_terms=None) -> list[Judged]:
    kernels, biases = _as_tuple(kernel), _as_tuple(bias) if bias is not None else None
    judged = []
    for i, (w, y) in enumerate(zip(kernels, _as_tuple(outputs))):
        b = None if biases is None else f64(biases[i])
        w64 = f64(w)
        y64 = normed @ w64 + (0.0 if b is None else b)
        t = tol.dense_tolerance(normed, w64, y64, x.dtype, x.dtype, bias=b,
                                statistics_terms=statistics_terms)
        judged.append(Judged(f"{name}[{i}]", np.asarray(y), y64, t))
    return judged


def post_norm_reference(kind, x, kernel, bias, scale, norm_bias, residual, eps,
                        scale_offset=0.0, residual_after=None, y_dtype=None, dot_dtype=None):
    """(y64, t_y, h64, t_h): the float64 post-norm output and pre-norm sum with their
    tolerances. With `residual_after` y is residual_after + Norm(h), whose tolerance is the
    norm's plus one rounding of the sum (a kernel that adds in float32 rounds once; one that
    rounds the norm first, twice). `y_dtype` (default x's): the dtype y is rounded to;
    float32 bounds the y a kernel holds before its rounding (where y's statistics are taken).
    `dot_dtype` (default x's): the dtype x @ W is rounded to before the norm, as the xla path
    does; a kernel keeps its float32 accumulator (float32)."""
    x = np.asarray(x)
    y_dtype = x.dtype if y_dtype is None else y_dtype
    dot_dtype = x.dtype if dot_dtype is None else dot_dtype
    x64, w64 = f64(x), f64(kernel)
    h64 = ref.pre_norm_sum(x64, w64, bias, residual)
    extra = (0.0 if bias is None else np.abs(f64(bias))) + (
        0.0 if residual is None else np.abs(f64(residual)))
    h_err = tol.dense_tolerance(x64, w64, h64, dot_dtype, np.float32, bias=extra)
    g = ref.gain(scale, scale_offset, h64.shape[-1])
    if kind == "rms":
        xhat, inv = ref.rms_normalized(h64, eps), ref.rms_inverse(h64, eps)
        y64 = xhat * g
    else:
        mu, inv = ref.mean_and_inverse_std(h64, eps)
        xhat = (h64 - mu) * inv
        y64 = xhat * g + (0.0 if norm_bias is None else f64(norm_bias))
        xhat = tol.centred_terms(xhat)
    nb = None if norm_bias is None else f64(norm_bias)
    t_y = tol.post_norm_tolerance(h_err, inv, g, xhat * g, y64, y_dtype, bias=nb)
    t_h = h_err + tol.unit_roundoff(x.dtype) * np.abs(h64) + tol.tiny(x.dtype)
    if residual_after is not None:
        y64 = y64 + f64(residual_after)
        t_y = t_y + tol.unit_roundoff(y_dtype) * np.abs(y64) + tol.tiny(y_dtype)
    return y64, t_y, h64, t_h


def _post_norm_judged(kind, x, kernel, bias, scale, norm_bias, residual, y, h, eps,
                      scale_offset=0.0, residual_after=None):
    """y (and h, where returned) against float64 (`post_norm_reference`)."""
    y64, t_y, h64, t_h = post_norm_reference(kind, x, kernel, bias, scale, norm_bias, residual,
                                             eps, scale_offset, residual_after)
    judged = [Judged("y", np.asarray(y), y64, t_y)]
    if h is not None:
        judged.append(Judged("h", np.asarray(h), h64, t_h))
    return judged


def check_post_norm_outputs(kind: str, y, h, **inputs) -> float:
    """Worst error/tolerance of post-norm outputs computed elsewhere (a Flax layer) from
    `inputs` as `dense_rms_norm`/`dense_layer_norm` take them; h is None without a residual."""
    x = np.asarray(inputs["x"])
    judged = _post_norm_judged(kind, x, inputs["kernel"], inputs.get("bias"),
                               inputs.get("scale"), inputs.get("norm_bias"),
                               inputs.get("residual"), y, h, inputs.get("eps", 1e-6),
                               inputs.get("scale_offset", 0.0), inputs.get("residual_after"))
    return max(_ratio(j) for j in judged)


def check_outputs(op: str, outputs, **inputs) -> float:
    """Worst error/tolerance of `op`'s outputs computed elsewhere (a kernel called directly)
    from `inputs` as the op takes them: y for the norms, the tuple of outputs for the
    pre-norm dense ops, (y, h) for the post-norm ones."""
    x = np.asarray(inputs["x"])
    eps, offset = inputs.get("eps", 1e-6), inputs.get("scale_offset", 0.0)
    scale, nb = inputs.get("scale"), inputs.get("norm_bias")
    if op in ("dense_rms_norm", "dense_layer_norm"):
        y, h = outputs
        return check_post_norm_outputs(op.removeprefix("dense_").removesuffix("_norm"), y, h,
                                       **inputs)
    if op == "rms_norm":
        y64 = ref.rms_norm(x, scale, eps=eps, scale_offset=offset)
        judged = [Judged("y", np.asarray(outputs), y64, tol.norm_tolerance(y64, y64, x.dtype))]
    elif op == "layer_norm":
        bias = inputs.get("bias")
        y64 = ref.layer_norm(x, scale, bias, eps=eps, scale_offset=offset)
        ntg = tol.centred_terms(ref.layer_normalized(x, eps)) * ref.gain(scale, offset, x.shape[-1])
        t = tol.norm_tolerance(ntg, y64, x.dtype, bias=None if bias is None else f64(bias))
        judged = [Judged("y", np.asarray(outputs), y64, t)]
    elif op == "rms_norm_dense":
        normed = ref.rms_norm(x, scale, eps=eps, scale_offset=offset)
        judged = _dense_judged(op, x, normed, inputs["kernel"], inputs.get("bias"), outputs)
    elif op == "layer_norm_dense":
        normed = ref.layer_norm(x, scale, nb, eps=eps, scale_offset=offset)
        centred = tol.centred_terms(ref.layer_normalized(x, eps)) * np.abs(
            ref.gain(scale, offset, x.shape[-1])) + (0.0 if nb is None else np.abs(f64(nb)))
        judged = _dense_judged(op, x, normed, inputs["kernel"], inputs.get("bias"), outputs,
                               statistics_terms=centred)
    else:
        raise ValueError(f"unknown op {op!r}; known: {OPS}")
    return max(_ratio(j) for j in judged)


def judge(op: str, impl: str | None, inputs: dict) -> list[Judged]:
    """Run `op` on `inputs` with `impl` and pair every output with reference and tolerance."""
    x = np.asarray(inputs["x"])
    eps = inputs.get("eps", 1e-6)
    offset = inputs.get("scale_offset", 0.0)
    scale = inputs.get("scale")
    if op == "rms_norm":
        y = jaxnorm.rms_norm(x, scale, eps=eps, scale_offset=offset, impl=impl)
        y64 = ref.rms_norm(x, scale, eps=eps, scale_offset=offset)
        return [Judged("y", np.asarray(y), y64, tol.norm_tolerance(y64, y64, x.dtype))]
    if op == "layer_norm":
        bias = inputs.get("bias")
        y = jaxnorm.layer_norm(x, scale, bias, eps=eps, scale_offset=offset, impl=impl)
        y64 = ref.layer_norm(x, scale, bias, eps=eps, scale_offset=offset)
        ntg = tol.centred_terms(ref.layer_normalized(x, eps)) * ref.gain(scale, offset, x.shape[-1])
        t = tol.norm_tolerance(ntg, y64, x.dtype, bias=None if bias is None else f64(bias))
        return [Judged("y", np.asarray(y), y64, t)]
    kernel, bias = inputs["kernel"], inputs.get("bias")
    if op == "rms_norm_dense":
        out = jaxnorm.rms_norm_dense(x, scale, kernel, bias, eps=eps, scale_offset=offset,
                                     impl=impl)
        normed = ref.rms_norm(x, scale, eps=eps, scale_offset=offset)
        return _dense_judged(op, x, normed, kernel, bias, out)
    if op == "layer_norm_dense":
        nb = inputs.get("norm_bias")
        out = jaxnorm.layer_norm_dense(x, scale, nb, kernel, bias, eps=eps,
                                       scale_offset=offset, impl=impl)
        normed = ref.layer_norm(x, scale, nb, eps=eps, scale_offset=offset)
        centred = tol.centred_terms(ref.layer_normalized(x, eps)) * np.abs(
            ref.gain(scale, offset, x.shape[-1])) + (0.0 if nb is None else np.abs(f64(nb)))
        return _dense_judged(op, x, normed, kernel, bias, out, statistics_terms=centred)
    residual, after = inputs.get("residual"), inputs.get("residual_after")
    if after is not None:
        return _residual_after_judged(op, impl, inputs)
    if op == "dense_rms_norm":
        y, h = jaxnorm.dense_rms_norm(x, kernel, bias, scale, eps=eps, scale_offset=offset,
                                      residual=_residual(residual, x, kernel), impl=impl)
        return _post_norm_judged("rms", x, kernel, bias, scale, None, residual, y, h, eps,
                                 offset)
    if op == "dense_layer_norm":
        nb = inputs.get("norm_bias")
        y, h = jaxnorm.dense_layer_norm(x, kernel, bias, scale, nb, eps=eps,
                                        scale_offset=offset,
                                        residual=_residual(residual, x, kernel), impl=impl)
        return _post_norm_judged("layer", x, kernel, bias, scale, nb, residual, y, h, eps,
                                 offset)
    raise ValueError(f"unknown op {op!r}; known: {OPS}")


def _residual_after_judged(op: str, impl: str | None, inputs: dict) -> list[Judged]:
    """residual_after + Norm(x @ W + b): one output, judged with `_post_norm_judged`."""
    y = _op_function(op, impl, inputs)(inputs)
    kind = "rms" if op == "dense_rms_norm" else "layer"
    g = inputs.get
    return _post_norm_judged(kind, np.asarray(g("x")), g("kernel"), g("bias"), g("scale"),
                             g("norm_bias"), None, y, None, g("eps", 1e-6),
                             g("scale_offset", 0.0), g("residual_after"))


def _residual(residual, x, kernel):
    """Post-norm ops return (y, h) only with a residual; pass a zero one to see h as well."""
    if residual is not None:
        return residual
    return jnp.zeros((*np.shape(x)[:-1], np.shape(kernel)[1]), jnp.asarray(x).dtype)


def check_op(op: str, impl: str | None = "xla", **inputs) -> float:
    """Worst error/tolerance over every output of `op`; AssertionError if any exceeds 1."""
    return max(_ratio(j) for j in judge(op, impl, inputs))


# ---------------------------------------------------------------- gradients

_DIFFERENTIABLE = {
    "rms_norm": ("x", "scale"),
    "layer_norm": ("x", "scale", "bias"),
    "rms_norm_dense": ("x", "scale", "kernel", "bias"),
    "layer_norm_dense": ("x", "scale", "norm_bias", "kernel", "bias"),
    "dense_rms_norm": ("x", "kernel", "bias", "scale", "residual", "residual_after"),
    "dense_layer_norm": ("x", "kernel", "bias", "scale", "norm_bias", "residual",
                         "residual_after"),
}


def _op_function(op: str, impl: str | None, inputs: dict) -> Callable:
    eps, offset = inputs.get("eps", 1e-6), inputs.get("scale_offset", 0.0)
    fns = {
        "rms_norm": lambda a: jaxnorm.rms_norm(a["x"], a.get("scale"), eps=eps,
                                               scale_offset=offset, impl=impl),
        "layer_norm": lambda a: jaxnorm.layer_norm(a["x"], a.get("scale"), a.get("bias"),
                                                   eps=eps, scale_offset=offset, impl=impl),
        "rms_norm_dense": lambda a: jaxnorm.rms_norm_dense(
            a["x"], a.get("scale"), a["kernel"], a.get("bias"), eps=eps, scale_offset=offset,
            impl=impl),
        "layer_norm_dense": lambda a: jaxnorm.layer_norm_dense(
            a["x"], a.get("scale"), a.get("norm_bias"), a["kernel"], a.get("bias"), eps=eps,
            scale_offset=offset, impl=impl),
        "dense_rms_norm": lambda a: jaxnorm.dense_rms_norm(
            a["x"], a["kernel"], a.get("bias"), a.get("scale"), eps=eps, scale_offset=offset,
            residual=a.get("residual"), residual_after=a.get("residual_after"), impl=impl),
        "dense_layer_norm": lambda a: jaxnorm.dense_layer_norm(
            a["x"], a["kernel"], a.get("bias"), a.get("scale"), a.get("norm_bias"), eps=eps,
            scale_offset=offset, residual=a.get("residual"),
            residual_after=a.get("residual_after"), impl=impl),
    }
    return fns[op]


def _reference_grads(op: str, inputs: dict, dy: np.ndarray, magnitude: bool) -> dict:
    eps, offset = inputs.get("eps", 1e-6), inputs.get("scale_offset", 0.0)
    g = inputs.get
    if op in ("rms_norm", "layer_norm"):
        kind = "rms" if op == "rms_norm" else "layer"
        return gradients.norm_vjp(kind, g("x"), g("scale"), g("bias"), dy, eps=eps,
                                  scale_offset=offset, magnitude=magnitude)
    if op in ("rms_norm_dense", "layer_norm_dense"):
        kind = "rms" if op == "rms_norm_dense" else "layer"
        return gradients.norm_dense_vjp(kind, g("x"), g("scale"), g("norm_bias"), g("kernel"),
                                        g("bias"), dy, eps=eps, scale_offset=offset,
                                        magnitude=magnitude)
    kind = "rms" if op == "dense_rms_norm" else "layer"
    return gradients.dense_norm_vjp(kind, g("x"), g("kernel"), g("bias"), g("scale"),
                                    g("norm_bias"), dy, eps=eps, scale_offset=offset,
                                    residual=g("residual"), residual_after=g("residual_after"),
                                    magnitude=magnitude)


def _combined_reference_grads(op: str, inputs: dict, dys: list, magnitude: bool) -> dict:
    """A sequence of kernels sharing one norm: norm-side gradients add, per-kernel ones apart."""
    if "kernel" not in inputs:
        return _reference_grads(op, inputs, dys[0], magnitude)
    kernels, seq = _as_tuple(inputs["kernel"]), isinstance(inputs["kernel"], (list, tuple))
    biases = inputs.get("bias")
    per_kernel = [
        _reference_grads(
            op, {**inputs, "kernel": w, "bias": None if biases is None else _as_tuple(biases)[i]},
            dy, magnitude)
        for i, (w, dy) in enumerate(zip(kernels, dys))
    ]
    if not seq:
        return per_kernel[0]
    combined = {}
    for name in per_kernel[0]:
        parts = [p[name] for p in per_kernel]
        if name in ("kernel", "bias"):
            combined[name] = None if parts[0] is None else parts
        else:
            combined[name] = None if parts[0] is None else sum(parts)
    return combined


def check_grad(op: str, impl: str | None = "xla", *, seed: int = 0, **inputs) -> float:
    """Gradients of <op(inputs), dy> for every differentiable input, against float64 VJPs."""
    diff = {k: jax.tree.map(jnp.asarray, inputs[k])
            for k in _DIFFERENTIABLE[op] if inputs.get(k) is not None}
    out, vjp = jax.vjp(_op_function(op, impl, inputs), diff)
    post_with_sum = op.startswith("dense_") and inputs.get("residual") is not None
    judged = (out[0],) if post_with_sum else _as_tuple(out)
    rng = np.random.default_rng(seed)
    cotangents = [jnp.asarray(rng.standard_normal(y.shape), y.dtype) for y in judged]
    if post_with_sum:  # judge the normed output; the pre-norm sum gets a zero cotangent
        (grads,) = vjp((cotangents[0], jnp.zeros_like(out[1])))
    else:
        (grads,) = vjp(tuple(cotangents) if isinstance(out, tuple) else cotangents[0])
    return check_grads_of(op, grads, [f64(np.asarray(c)) for c in cotangents], **inputs)


def check_grads_of(op: str, grads: dict, dys: list, *, dy_magnitudes: list | None = None,
                   **inputs) -> float:
    """Gradients computed elsewhere (a Flax layer's) of <op(inputs), dys> for the
    differentiable inputs named in `grads`, against float64 VJPs (normwise).
    `dy_magnitudes` (default |dys|): the magnitudes of the terms summed into each dy."""
    x = np.asarray(inputs["x"])
    expected = _combined_reference_grads(op, inputs, dys, magnitude=False)
    magnitudes = _combined_reference_grads(op, inputs, dy_magnitudes or dys, magnitude=True)
    longest = max(x.shape[-1], int(np.prod(x.shape[:-1])), *(np.shape(dy)[-1] for dy in dys))
    worst = 0.0
    for name, got in grads.items():
        for i, (g, g64, m64) in enumerate(zip(_as_tuple(got), _as_tuple(expected[name]),
                                              _as_tuple(magnitudes[name]))):
            err = float(np.linalg.norm(f64(np.asarray(g)) - g64))
            bound = tol.grad_tolerance(m64, x.dtype, longest)
            if not np.isfinite(err) or err > bound:
                raise AssertionError(f"{op} d{name}[{i}]: normwise error {err:.3e} > {bound:.3e}")
            worst = max(worst, err / bound)
    return worst


def check_rms_norm_backward(dx, d_scale, *, x, g, scale, eps: float, scale_offset: float = 0.0,
                            stream=None) -> float:
    """RMSNorm's backward computed on its own (x and the cotangent g of the normed output in,
    dx and d scale out: `pallas_kernels.rms_norm_backward`) against the float64 VJP,
    normwise: the worst err/tol, AssertionError above 1. `d_scale=None` judges dx alone;
    `stream` is a cotangent added to dx (the residual stream's), added in float64 too."""
    expected = gradients.norm_vjp("rms", x, scale, None, g, eps=eps, scale_offset=scale_offset)
    magnitude = gradients.norm_vjp("rms", x, scale, None, g, eps=eps, scale_offset=scale_offset,
                                   magnitude=True)
    if stream is not None:
        expected["x"] = expected["x"] + f64(stream)
        magnitude["x"] = magnitude["x"] + np.abs(f64(stream))
    worst = 0.0
    for name, got in (("x", dx), ("scale", d_scale)):
        if got is None:
            continue
        err = float(np.linalg.norm(f64(np.asarray(got)) - expected[name]))
        bound = tol.grad_tolerance(magnitude[name], np.asarray(x).dtype, max(np.shape(x)))
        if not err <= bound:
            raise AssertionError(f"rms_norm backward d{name}: normwise error {err:.3e} > "
                                 f"{bound:.3e}")
        worst = max(worst, err / bound)
    return worst
