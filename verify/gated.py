"""Float64 reference, error model and checks of the gated MLP input (rms_norm_gated_dense).

    y = act(g) * u,   g = RMSNorm(x; scale) @ W_gate + b_g,   u = RMSNorm(x; scale) @ W_up + b_u

Error model (verify.tolerances' notation): g and u each carry a dense product's
error t_g, t_u (`tolerances.dense_tolerance`, their rounding to x's dtype
included). The activation's slope is at most L = 1.13 in magnitude for every
activation served (SiLU's is below 1.10, GELU's below 1.13), so

    |y - y64| <= L |u| t_g + |act(g)| t_u + L t_g t_u
                 + C_ACT u_a |g| |u| + u_o |y64| + tiny_o

where u_a is the unit roundoff of the dtype act(g) * u is evaluated in (x's dtype
on the stock path, float32 in the kernel's epilogue): a few roundings of
quantities no larger than |g| (GELU's 1 + tanh(z) cancels where g < 0, so the
bound is in |g|, not |act(g)|).

Gradients: dg = dy u act'(g), du = dy act(g), then the pre-norm dense VJP of
each product (`verify.gradients.norm_dense_vjp`); the magnitudes add
|dy u g act''(g)| for the error of recomputing g.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from verify import gradients
from verify import references as ref
from verify import tolerances as tol
from verify.checks import Judged, _ratio
from verify.references import f64

ACTIVATION_SLOPE = 1.13
C_ACT = 4.0
_SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)


def activation(name: str, g: np.ndarray) -> np.ndarray:
    """act(g) in float64: "silu", "gelu_tanh" (tanh-approximated GELU) or "gelu" (exact)."""
    if name == "silu":
        return g * special.expit(g)
    if name == "gelu_tanh":
        return 0.5 * g * (1.0 + np.tanh(_SQRT_2_OVER_PI * (g + 0.044715 * g**3)))
    if name == "gelu":
        return 0.5 * g * (1.0 + special.erf(g / np.sqrt(2.0)))
    raise ValueError(f"unknown activation {name!r}")


def activation_slope(name: str, g: np.ndarray) -> np.ndarray:
    """act'(g) in float64."""
    if name == "silu":
        s = special.expit(g)
        return s * (1.0 + g * (1.0 - s))
    if name == "gelu_tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (g + 0.044715 * g**3))
        return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * _SQRT_2_OVER_PI * (
            1.0 + 3 * 0.044715 * g * g)
    if name == "gelu":
        return 0.5 * (1.0 + special.erf(g / np.sqrt(2.0))) + g * np.exp(-0.5 * g * g) / np.sqrt(
            2.0 * np.pi)
    raise ValueError(f"unknown activation {name!r}")


def _curvature(name: str, g: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """act''(g) by central difference of act' (float64; only sizes a magnitude)."""
    return (activation_slope(name, g + h) - activation_slope(name, g - h)) / (2 * h)


def products(x, scale, gate_kernel, up_kernel, gate_bias=None, up_bias=None, *,
             eps: float = 1e-6, scale_offset: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(g, u) in float64."""
    return ref.rms_norm_dense(x, scale, [gate_kernel, up_kernel], [gate_bias, up_bias],
                              eps=eps, scale_offset=scale_offset)


def rms_norm_gated_dense(x, scale, gate_kernel, up_kernel, gate_bias=None, up_bias=None, *,
                         activation_name: str = "silu", eps: float = 1e-6,
                         scale_offset: float = 0.0) -> np.ndarray:
    """act(g) * u in float64: the reference of `jaxnorm.rms_norm_gated_dense`."""
    g, u = products(x, scale, gate_kernel, up_kernel, gate_bias, up_bias, eps=eps,
                    scale_offset=scale_offset)
    return activation(activation_name, g) * u


def check_gated(y, x, scale, gate_kernel, up_kernel, gate_bias=None, up_bias=None, *,
                activation_name: str = "silu", eps: float = 1e-6, scale_offset: float = 0.0,
                act_dtype=None) -> float:
    """Worst |y - y64| / tolerance of a gated output (AssertionError above 1; NaN must sit
    where the reference has it). act_dtype: where act(g) * u was evaluated (default x's)."""
    x_dtype = np.asarray(x).dtype
    normed = ref.rms_norm(np.asarray(x), scale, eps=eps, scale_offset=scale_offset)
    normed = normed.reshape(-1, normed.shape[-1])
    tolerances, values = [], []
    for w, b in ((gate_kernel, gate_bias), (up_kernel, up_bias)):
        b64 = None if b is None else f64(b)
        v = normed @ f64(w) + (0.0 if b64 is None else b64)
        tolerances.append(tol.dense_tolerance(normed, f64(w), v, x_dtype, x_dtype, bias=b64))
        values.append(v)
    (t_g, t_u), (g, u) = tolerances, values
    y64 = activation(activation_name, g) * u
    u_act = tol.unit_roundoff(act_dtype if act_dtype is not None else x_dtype)
    slope = ACTIVATION_SLOPE
    t_y = (slope * np.abs(u) * t_g + np.abs(activation(activation_name, g)) * t_u
           + slope * t_g * t_u + C_ACT * u_act * np.abs(g) * np.abs(u)
           + tol.unit_roundoff(x_dtype) * np.abs(y64) + tol.tiny(x_dtype))
    actual = np.asarray(y).reshape(y64.shape)
    return _ratio(Judged("y", actual, y64, t_y))


def gated_vjp(x, scale, gate_kernel, up_kernel, gate_bias, up_bias, dy, *,
              activation_name: str = "silu", eps: float = 1e-6, scale_offset: float = 0.0,
              magnitude: bool = False) -> dict:
    """Float64 gradients of <act(g) * u, dy> for x, scale, both kernels and both biases."""
    k = np.shape(x)[-1]
    x2, dy2 = f64(x).reshape(-1, k), f64(dy).reshape(-1, np.shape(gate_kernel)[1])
    g, u = products(x2, scale, gate_kernel, up_kernel, gate_bias, up_bias, eps=eps,
                    scale_offset=scale_offset)
    d_gate = dy2 * u * activation_slope(activation_name, g)
    d_up = dy2 * activation(activation_name, g)
    if magnitude:
        d_gate = np.abs(d_gate) + np.abs(dy2 * u * g * _curvature(activation_name, g))
        d_up = np.abs(d_up)
    parts = [gradients.norm_dense_vjp("rms", x2, scale, None, w, b, d, eps=eps,
                                      scale_offset=scale_offset, magnitude=magnitude)
             for w, b, d in ((gate_kernel, gate_bias, d_gate), (up_kernel, up_bias, d_up))]
    return {
        "x": (parts[0]["x"] + parts[1]["x"]).reshape(np.shape(x)),
        "scale": None if scale is None else parts[0]["scale"] + parts[1]["scale"],
        "gate_kernel": parts[0]["kernel"], "up_kernel": parts[1]["kernel"],
        "gate_bias": parts[0]["bias"], "up_bias": parts[1]["bias"],
    }


def check_gated_grads(grads: dict, dy, x, scale, gate_kernel, up_kernel, gate_bias=None,
                      up_bias=None, **kwargs) -> float:
    """Worst normwise error / tolerance of `grads` (name -> gradient, names as `gated_vjp`)."""
    args = (x, scale, gate_kernel, up_kernel, gate_bias, up_bias, dy)
    expected = gated_vjp(*args, **kwargs)
    magnitudes = gated_vjp(*args, magnitude=True, **kwargs)
    x_dtype = np.asarray(x).dtype
    longest = max(np.shape(x)[-1], int(np.prod(np.shape(x)[:-1])), np.shape(gate_kernel)[1])
    worst = 0.0
    for name, got in grads.items():
        err = float(np.linalg.norm(f64(np.asarray(got)) - expected[name]))
        bound = tol.grad_tolerance(magnitudes[name], x_dtype, longest)
        if not np.isfinite(err) or err > bound:
            raise AssertionError(f"d{name}: normwise error {err:.3e} > {bound:.3e}")
        worst = max(worst, err / bound)
    return worst
