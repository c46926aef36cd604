"""Pre-norm dense ops whose row statistics come from the producer of x (`jaxnorm.RowStats`).

With statistics given, the row scale is r = rsqrt(m2/K + mean^2 + eps) (RMSNorm)
or (mean, rsqrt(m2/K + eps)) (LayerNorm), computed from M floats, and x is read
only by the GEMM. Either way `residual_dense` -> `rms_norm_dense(statistics=...)`
has the gradient of the unfused h -> norm -> dense: through h alone (impl=None), or
through h and the statistics' cotangent (an explicit impl).

Where automatic dispatch (impl=None) picks the kernel, it serves the primal
(inference), and under differentiation the op is stock's graph, forward and backward
(the norm reducing x itself, differentiated by JAX; `dispatch.call_with_stock_backward`),
as `jaxnorm.autodiff` differentiates every automatically dispatched op: the statistics
are x's by contract, so the whole gradient flows through x, theirs is zero, the
producer's backward carries no statistics terms (the given-statistics backward wrote
two more [M, K] tensors per op), and nothing reads the statistics in a training step.
Where it falls back to xla, the op runs stock's graph: the statistics are unused, and
under jit XLA drops the reduction that produced them. An explicit impl keeps the given-statistics formulation, forward
and backward (the kernel paired with the xla formulation's VJP), which is exact for
statistics that are not x's.
"""

from __future__ import annotations

import jax

from jaxnorm import callers_rows, dispatch
from jaxnorm.row_stats import RowStats

Array = jax.Array


def norm_dense(kind: str, x: Array, scale: Array | None, norm_bias: Array | None,
               kernels: tuple[Array, ...], biases: tuple[Array | None, ...], stats: RowStats, *,
               eps: float, scale_offset: float, impl: str | None,
               return_input: bool = False, lead: callers_rows.Lead = None) -> tuple[Array, ...]:
    """rms_norm_dense (kind="rms") or layer_norm_dense of 2-D x with x's rows' statistics;
    `return_input` (RMSNorm only): x after the outputs, for the residual stream; `lead`: the
    caller's leading dims of x."""
    op = f"{kind}_norm_dense"
    params = (scale,) if kind == "rms" else (scale, norm_bias)
    args = (x, *params, kernels, biases, stats)
    kwargs = dict(eps=eps, scale_offset=scale_offset)
    extra = {"return_input": True} if return_input else {}
    chosen = dispatch.resolve(op, impl, *args, **kwargs)
    if impl is None and chosen == "xla":
        # Falling back runs stock's graph: the norm reduces x itself, so the statistics go
        # unused and XLA drops their producer's reduction (fewer kernels than applying them).
        return dispatch.call_xla_in_callers_rows(op, lead, *args[:-1], **kwargs, **extra)
    if chosen == "xla":
        return dispatch.call(op, "xla", *args, **kwargs, **extra)  # given-statistics formulation
    if impl is None:  # x's own statistics: the gradient of stock's graph, none for them
        return dispatch.call_with_stock_backward(op, chosen, *args, **kwargs, **extra,
                                                 lead=lead)
    return dispatch.call_with_xla_backward(op, chosen, *args, **kwargs, **extra)
