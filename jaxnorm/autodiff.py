"""Backward passes: one `jax.custom_vjp` per op family, forward through dispatch.

The forward rule runs whatever implementation dispatch picks (the Mosaic
kernel on Hopper, xla elsewhere) and saves only the inputs plus per-row float32
statistics (r for RMSNorm; the shifted mean and s for LayerNorm), never the
normalized activation. The backward recomputes what it needs from those, in
the lazy form of docs/backward.md: the row scale lands on the [M, N]
cotangent or the [M, K] product, the gain on a K-vector, so each step is a
GEMM plus a row or column reduction that a kernel can fuse later.

The backward is pure JAX and differentiable itself, and the forward rule calls
the implementation directly (not the custom_vjp function), so `jax.jvp` over
`jax.grad` works wherever the forward is differentiable JAX (impl="xla").
LayerNorm statistics are shifted by each row's first element exactly as in
`jaxnorm.statistics`, so rows with |mean| >> std keep their gradient digits.

Inside `jax.shard_map` the public wrappers first cast every input to the
inputs' common varying axes (`jaxnorm.sharding.match_varying`), so the
cotangents the backward returns have their inputs' types and JAX psums the
gradients of replicated inputs. With `axis_name` (x's K, or for the post-norm
ops the output's N, sharded over that mesh axis) the forward is the xla algebra
on this shard's columns with the per-row statistics psum-ed, the pre-norm dense
ops psum their float32 output partials (the caller adds the bias once), and the
backward psums the row sums its row rule needs: never a [M, K] all-gather.

Which implementation runs is resolved before autodiff sees the op. Where
automatic dispatch (impl=None) resolves to xla, the op is the plain xla
function and JAX differentiates it exactly as it differentiates the stock Flax
layers: falling back costs nothing in training. Where it resolves to a kernel,
the kernel serves the primal (inference); under differentiation the forward
and backward are those of the xla formulation (`_stock_fwd`), because the
kernel forward's saving (the normalized activation is never written) is
repaid by forming it again for the weight gradient (docs/backward.md). An
explicit impl, and the row-parallel `axis_name`, keep the lean backward below.

Arrays here are 2-D ([M, K]); `jaxnorm.ops` validates and flattens first, and passes
x's leading dims (`lead`) for impl=None's xla path (its fallback, and the formulation a
training step differentiates where it chose a kernel), which computes on x in the caller's
shape (`jaxnorm.callers_rows`).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxnorm import callers_rows, dispatch, partitioning, row_stats, sharding
from jaxnorm.backends.xla import matmul_f32

Array = jax.Array
F32 = jnp.float32


class _Static(NamedTuple):
    """Everything the rules need that is not an array (a custom_vjp nondiff argument)."""

    kind: str  # "rms" or "layer"
    eps: float
    scale_offset: float
    impl: str | None
    dtypes: Any  # the differentiable inputs' dtypes (None where absent): cotangents match them
    axis_name: tuple | None  # the mesh axes that shard the normalized rows (row-parallel)
    automatic: bool = False  # impl=None resolved to a kernel: differentiate the xla formulation
    residual_after: bool = False  # post-norm: r + Norm(x @ W + b), not Norm(x @ W + b + r)
    output_stats: bool = False  # residual-after post-norm: also the output rows' (mean, M2)
    lead: callers_rows.Lead = None  # the caller's leading dims of x (impl=None's xla formulation)
    return_input: bool = False  # automatic RMSNorm pre-norm: x after the outputs, its cotangent
    # handed to the xla formulation's VJP with the norm's


def _static(kind: str, eps: float, scale_offset: float, impl: str | None, axis_name: tuple | None,
            *inputs, automatic: bool = False, residual_after: bool = False,
            output_stats: bool = False, lead: callers_rows.Lead = None,
            return_input: bool = False) -> _Static:
    dtypes = jax.tree.map(lambda a: jnp.result_type(a), inputs)
    return _Static(kind, eps, scale_offset, impl, dtypes, axis_name, automatic, residual_after,
                   output_stats, lead, return_input)


def _resolve(op: str, impl: str | None, *args: Any, **kwargs: Any) -> tuple[str, bool]:
    """(the implementation to run, whether impl=None chose a kernel) for an unsharded op."""
    chosen = dispatch.resolve(op, impl, *args, **kwargs)
    return chosen, impl is None and chosen != "xla"


def _norm_params(kind: str, scale: Array | None, bias: Array | None) -> tuple:
    """The norm's parameters as the backends take them: (scale,) or (scale, bias)."""
    return (scale,) if kind == "rms" else (scale, bias)


def _stock_fwd(op: str, x: Array, *args: Any, lead: callers_rows.Lead,
               **kwargs: Any) -> tuple[Any, Any]:
    """The xla formulation's output and its JAX VJP (a pytree the backward calls), on x in
    the caller's shape, `lead`."""
    return jax.vjp(functools.partial(dispatch.call_xla_in_callers_rows, op, lead, **kwargs),
                   x, *args)


def _cast_like(grads: tuple, dtypes: tuple) -> tuple:
    """Cotangents in each input's dtype, None where the input was None."""
    return jax.tree.map(lambda g, d: g.astype(d), grads, dtypes)


def _gain(scale: Array | None, scale_offset: float) -> Array | float:
    return 1.0 if scale is None else scale.astype(F32) + scale_offset


# ------------------------------------------------------------ row statistics


def _row_stats(s: _Static, x32: Array) -> tuple[Array, ...]:
    """What the forward saves per row: (r,) or (shift, mean of the shifted row, s)."""
    return sharding.row_statistics(s.kind, x32, s.eps, s.axis_name)


class _Rows(NamedTuple):
    """A norm's input as the backward sees it: xhat = inv * centred, never stored."""

    centred: Array  # x for RMSNorm, x - mean for LayerNorm, float32 [M, K]
    inv: Array  # r or s, float32 [M]


def _rows(kind: str, x32: Array, stats: tuple[Array, ...]) -> _Rows:
    return _Rows(sharding.centred_rows(kind, x32, stats), stats[-1])


def _norm_input_grad(s: _Static, rows: _Rows, g_star: Array) -> Array:
    """dx of xhat(x) given dxhat = g_star (the cotangent with the gain applied).

    RMSNorm:   dx = r (G* - (r^2/K) rowsum(G* x) x)
    LayerNorm: dx = s (G* - mean(G*) - (s^2/K) rowsum(G* (x - mu)) (x - mu))
    The row sums cover whole rows: one psum of both over `axis_name` when sharded.
    """
    c, inv = rows.centred, rows.inv[:, None]
    if s.kind == "rms":
        (proj,) = sharding.row_means(s.axis_name, g_star * c)
        return inv * (g_star - (proj[:, None] * inv * inv) * c)
    proj, mean_g = sharding.row_means(s.axis_name, g_star * c, g_star)
    return inv * (g_star - mean_g[:, None] - (proj[:, None] * inv * inv) * c)


def _gain_grads(rows: _Rows, g: Array, has_scale: bool, has_bias: bool):
    """(d scale, d norm bias) = (colsum(inv * centred * G), colsum(G)), None where absent."""
    d_scale = jnp.sum(rows.inv[:, None] * rows.centred * g, axis=0) if has_scale else None
    d_bias = jnp.sum(g, axis=0) if has_bias else None
    return d_scale, d_bias


def _forward(s: _Static, op: str, *args: Any, **kwargs: Any) -> Any:
    outs = partitioning.call(op, s.impl, *args, eps=s.eps, **kwargs)
    return sharding.vary_like(outs, *args)


# ------------------------------------------------------------ standalone norms


def _norm_primal(s: _Static, x: Array, scale: Array | None, bias: Array | None,
                 stats: tuple[Array, ...]) -> Array:
    if s.axis_name is not None:
        gain = _gain(scale, s.scale_offset)
        return sharding.normalized(s.kind, x.astype(F32), stats, gain, bias).astype(x.dtype)
    args = (x, *_norm_params(s.kind, scale, bias))
    return _forward(s, f"{s.kind}_norm", *args, scale_offset=s.scale_offset)


def _sharded_stats(s: _Static, x: Array) -> tuple[Array, ...]:
    """The row statistics a row-parallel forward needs itself (none when unsharded)."""
    return () if s.axis_name is None else _row_stats(s, x.astype(F32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _norm(s: _Static, x: Array, scale: Array | None, bias: Array | None) -> Array:
    return _norm_primal(s, x, scale, bias, _sharded_stats(s, x))


def _norm_fwd(s: _Static, x, scale, bias):
    if s.automatic:
        args = (x, *_norm_params(s.kind, scale, bias))
        return _stock_fwd(f"{s.kind}_norm", *args, eps=s.eps, scale_offset=s.scale_offset,
                          lead=s.lead)
    stats = _row_stats(s, x.astype(F32))
    return _norm_primal(s, x, scale, bias, stats), (x, scale, stats)


def _norm_bwd(s: _Static, res, dy: Array):
    if s.automatic:
        grads = res(dy)
        return grads if s.kind == "layer" else (*grads, None)
    x, scale, stats = res
    if s.kind == "rms" and s.axis_name is None and s.impl != "xla":
        grads = _rms_backward_kernel(s, x, scale, dy)
        if grads is not None:
            return (*grads, None)
    bias_dtype = s.dtypes[2]
    g = dy.astype(F32)
    rows = _rows(s.kind, x.astype(F32), stats)
    dx = _norm_input_grad(s, rows, g * _gain(scale, s.scale_offset))
    d_scale, d_bias = _gain_grads(rows, g, scale is not None, bias_dtype is not None)
    return _cast_like((dx, d_scale, d_bias), s.dtypes)


_norm.defvjp(_norm_fwd, _norm_bwd)


def _rms_backward_kernel(s: _Static, x: Array, scale: Array | None,
                         dy: Array) -> tuple[Array, Array | None] | None:
    """(dx, d scale) from RMSNorm's backward kernel under the forward's explicit impl (x and
    dy read once, `pallas_kernels.rms_norm_backward`); None where it serves no such rows,
    and the row rule below runs in XLA."""
    try:
        dx, d_scale = dispatch.call("rms_norm_backward", s.impl, x, dy.astype(x.dtype), scale,
                                    eps=s.eps, scale_offset=s.scale_offset)
    except dispatch.Unsupported:
        return None
    d_scale = None if d_scale is None else d_scale.astype(s.dtypes[1])
    return sharding.vary_like((dx, d_scale), x, scale)  # a Pallas call's types, in shard_map


def norm(kind: str, x: Array, scale: Array | None, bias: Array | None, *, eps: float,
         scale_offset: float, impl: str | None, axis_name: tuple | None = None,
         lead: callers_rows.Lead = None) -> Array:
    """rms_norm (kind="rms", bias=None) or layer_norm with a custom VJP; x is [M, K]
    (this shard's K columns with `axis_name`), `lead` the caller's leading dims of x."""
    if axis_name is None:
        explicit = partitioning.over_explicit_mesh(
            f"{kind}_norm", (x, scale, bias), lambda a, axis: norm(
                kind, *a, eps=eps, scale_offset=scale_offset, impl=impl, axis_name=axis))
        if explicit is not None:
            return explicit
        op, args = f"{kind}_norm", (x, *_norm_params(kind, scale, bias))
        chosen, automatic = _resolve(op, impl, *args, eps=eps, scale_offset=scale_offset)
        if impl is None and chosen == "xla":
            return dispatch.call_xla_in_callers_rows(op, lead, *args, eps=eps,
                                                     scale_offset=scale_offset)
        impl = chosen
    else:
        automatic = False
    s = _static(kind, eps, scale_offset, impl, axis_name, x, scale, bias, automatic=automatic,
                lead=lead)
    return _norm(s, *sharding.match_varying(x, scale, bias))


# ------------------------------------------------------------ pre-norm dense


def _norm_dense_primal(s: _Static, x, scale, norm_bias, kernels, biases,
                       stats: tuple[Array, ...]) -> tuple[Array, ...]:
    if s.axis_name is not None:
        # Row-parallel: this shard's columns normalized with whole-row statistics, its
        # K-slice of each product, and one psum of the float32 partials (biases: the caller).
        gain = _gain(scale, s.scale_offset)
        normed = sharding.normalized(s.kind, x.astype(F32), stats, gain, norm_bias)
        return sharding.row_parallel_products(normed.astype(x.dtype), kernels, s.axis_name)
    norm_args = _norm_params(s.kind, scale, norm_bias)
    return _forward(s, f"{s.kind}_norm_dense", x, *norm_args, kernels, biases,
                    scale_offset=s.scale_offset)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _norm_dense(s: _Static, x, scale, norm_bias, kernels, biases) -> tuple[Array, ...]:
    outs = _norm_dense_primal(s, x, scale, norm_bias, kernels, biases, _sharded_stats(s, x))
    return (*outs, x) if s.return_input else outs


def _norm_dense_fwd(s: _Static, x, scale, norm_bias, kernels, biases):
    if s.automatic:
        norm_args = _norm_params(s.kind, scale, norm_bias)
        return _stock_fwd(f"{s.kind}_norm_dense", x, *norm_args, kernels, biases, eps=s.eps,
                          scale_offset=s.scale_offset, lead=s.lead,
                          **({"return_input": True} if s.return_input else {}))
    stats = _row_stats(s, x.astype(F32))
    outs = _norm_dense_primal(s, x, scale, norm_bias, kernels, biases, stats)
    return outs, (x, scale, norm_bias, kernels, stats)


def _norm_dense_bwd(s: _Static, res, dys: tuple[Array, ...]):
    """Y_i = N W_i + b_i with N = diag(inv) C diag(gain) + 1 beta^T never formed:

    G = sum_i dY_i W_i^T; dX from G * gain (see `_norm_input_grad`);
    dW_i = diag(gain) C^T (inv * dY_i) + beta colsum(dY_i); db_i = colsum(dY_i).
    """
    if s.automatic:
        grads = res(dys)
        return grads if s.kind == "layer" else (grads[0], grads[1], None, *grads[2:])
    x, scale, norm_bias, kernels, stats = res
    bias_dtypes = s.dtypes[4]
    gain = _gain(scale, s.scale_offset)
    rows = _rows(s.kind, x.astype(F32), stats)
    g = sum(matmul_f32(dy, w.T) for dy, w in zip(dys, kernels))
    dx = _norm_input_grad(s, rows, g * gain)
    d_scale, d_norm_bias = _gain_grads(rows, g, scale is not None, norm_bias is not None)
    centred_t = rows.centred.T.astype(x.dtype)  # the GEMM operand, in x's precision
    d_kernels, d_biases = [], []
    for dy, b_dtype in zip(dys, bias_dtypes):
        dw = matmul_f32(centred_t, rows.inv[:, None] * dy.astype(F32))
        if scale is not None:
            dw = gain[:, None] * dw
        col = jnp.sum(dy.astype(F32), axis=0)
        if norm_bias is not None:
            dw = dw + norm_bias.astype(F32)[:, None] * col[None, :]
        d_kernels.append(dw)
        d_biases.append(None if b_dtype is None else col)
    grads = (dx, d_scale, d_norm_bias, tuple(d_kernels), tuple(d_biases))
    return _cast_like(grads, s.dtypes)


_norm_dense.defvjp(_norm_dense_fwd, _norm_dense_bwd)


def norm_dense(kind: str, x: Array, scale: Array | None, norm_bias: Array | None,
               kernels: tuple[Array, ...], biases: tuple[Array | None, ...], *, eps: float,
               scale_offset: float, impl: str | None, axis_name: tuple | None = None,
               lead: callers_rows.Lead = None, return_input: bool = False) -> tuple[Array, ...]:
    """rms_norm_dense (kind="rms", norm_bias=None) or layer_norm_dense with a custom VJP.

    With `axis_name` x, the gains and the kernels' rows are this shard's K-slice;
    the outputs are whole (psum-ed) and each bias is added once, after the sum. `lead`:
    the caller's leading dims of x. `return_input` (RMSNorm): x after the outputs. Under
    impl=None the xla formulation returns it (`xla.rms_normalized_and_input`), so that in a
    training step x's cotangent through it, the residual stream's, meets the norm's in
    RMSNorm's backward kernel where that runs; elsewhere it is x itself.
    """
    if return_input and kind != "rms":
        raise ValueError("return_input is RMSNorm's (kind='rms')")
    with_input = (lambda outs: (*outs, x)) if return_input else (lambda outs: outs)
    if axis_name is None:
        explicit = partitioning.over_explicit_mesh(
            f"{kind}_norm_dense", (x, scale, norm_bias, kernels, biases),
            lambda a, axis: norm_dense(kind, *a, eps=eps, scale_offset=scale_offset, impl=impl,
                                       axis_name=axis))
        if explicit is not None:
            return with_input(explicit)
        op = f"{kind}_norm_dense"
        args = (x, *_norm_params(kind, scale, norm_bias), kernels, biases)
        chosen, automatic = _resolve(op, impl, *args, eps=eps, scale_offset=scale_offset)
        if impl is None and chosen == "xla":
            return dispatch.call_xla_in_callers_rows(
                op, lead, *args, eps=eps, scale_offset=scale_offset,
                **({"return_input": True} if return_input else {}))
        s = _static(kind, eps, scale_offset, chosen, None, x, scale, norm_bias, kernels, biases,
                    automatic=automatic, lead=lead, return_input=return_input and automatic)
        outs = _norm_dense(s, *sharding.match_varying(x, scale, norm_bias, kernels, biases))
        return outs if s.return_input else with_input(outs)
    none = (None,) * len(kernels)
    s = _static(kind, eps, scale_offset, impl, axis_name, x, scale, norm_bias, kernels, none)
    sums = _norm_dense(s, *sharding.match_varying(x, scale, norm_bias, kernels), none)
    return with_input(tuple((y if b is None else y + b.astype(F32)).astype(x.dtype)
                            for y, b in zip(sums, biases)))


# ------------------------------------------------------------ post-norm dense


def _stats_kwargs(output_stats: bool) -> dict[str, bool]:
    """The backends' `output_stats` keyword, only when set (other calls stay as they were)."""
    return {"output_stats": True} if output_stats else {}


def _dense_norm_primal(s: _Static, x, kernel, bias, scale, norm_bias, residual, *,
                       pre_norm_sum: bool, after: bool,
                       output_stats: bool = False) -> tuple[Array, ...]:
    """(y, h or None); with `after` the residual is added to y after the norm, not to h;
    with `output_stats` (after, no h), (y, mean, M2) of y's float32 rows."""
    if s.axis_name is not None:
        # Column-parallel: this shard's N columns of h, normalized with whole-row statistics.
        h = sharding.split_pre_norm_sum(x, kernel, bias, None if after else residual, None)
        y = sharding.normalized(s.kind, h, _row_stats(s, h), _gain(scale, 0.0), norm_bias)
        y = y + residual.astype(F32) if after else y
        return y.astype(x.dtype), h.astype(x.dtype) if pre_norm_sum else None
    norm_args = _norm_params(s.kind, scale, norm_bias)
    return _forward(s, f"dense_{s.kind}_norm", x, kernel, bias, *norm_args, residual,
                    pre_norm_sum=pre_norm_sum, residual_after=after,
                    **_stats_kwargs(output_stats))


def _statistics_rows(s: _Static, y32: Array) -> Array:
    """The rows a residual-after op's statistics are of: the float32 sum from a kernel, the
    stored y (rounded to x's dtype) on the xla path, as its forward takes them."""
    return y32.astype(s.dtypes[0]) if s.impl == "xla" else y32


def _returns_sum(s: _Static) -> bool:
    """Whether the op returns (y, pre-norm sum): with a residual added before the norm."""
    return s.dtypes[5] is not None and not s.residual_after


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _dense_norm(s: _Static, x, kernel, bias, scale, norm_bias, residual) -> Any:
    """y, or (y, pre-norm sum) with a residual before the norm; else the sum is never written.
    With `output_stats`, (y, mean, M2)."""
    outs = _dense_norm_primal(s, x, kernel, bias, scale, norm_bias, residual,
                              pre_norm_sum=_returns_sum(s), after=s.residual_after,
                              output_stats=s.output_stats)
    return outs if s.output_stats or _returns_sum(s) else outs[0]


def _dense_norm_stock(s: _Static, x, kernel, bias, scale, norm_bias, residual) -> Any:
    """The xla formulation with _dense_norm's output structure."""
    norm_args = _norm_params(s.kind, scale, norm_bias)
    outs = dispatch.call(f"dense_{s.kind}_norm", "xla", x, kernel, bias, *norm_args, residual,
                         eps=s.eps, pre_norm_sum=_returns_sum(s),
                         residual_after=s.residual_after, **_stats_kwargs(s.output_stats))
    return outs if s.output_stats or _returns_sum(s) else outs[0]


def _dense_norm_in_callers_rows(s: _Static, x, kernel, bias, scale, norm_bias,
                                residual) -> Any:
    """`_dense_norm_stock` on x and the residual in the caller's shape (`s.lead`), its
    outputs as rows."""
    out = _dense_norm_stock(s, callers_rows.shaped(x, s.lead), kernel, bias, scale, norm_bias,
                            callers_rows.shaped(residual, s.lead))
    return callers_rows.flat_outputs(out, s.lead)


def _dense_norm_fwd(s: _Static, x, kernel, bias, scale, norm_bias, residual):
    if s.automatic:
        return jax.vjp(functools.partial(_dense_norm_in_callers_rows, s), x, kernel, bias,
                       scale, norm_bias, residual)
    out_stats = None
    if s.residual_after:
        # The backward needs h, which the residual-after kernel does not write: run the
        # op without the residual (y and h), then add it (one more rounding of y); the
        # output's statistics are then those of that float32 sum (the stored y's on the
        # xla path, as its forward).
        normed, h = _dense_norm_primal(s, x, kernel, bias, scale, norm_bias, None,
                                       pre_norm_sum=True, after=False)
        y32 = normed.astype(F32) + residual.astype(F32)
        y = y32.astype(x.dtype)
        if s.output_stats:
            out_stats = row_stats.of_rows(_statistics_rows(s, y32))
    else:
        y, h = _dense_norm_primal(s, x, kernel, bias, scale, norm_bias, residual,
                                  pre_norm_sum=True, after=False)
    # Statistics of the h the caller sees: the backward differentiates at that point.
    saved = (x, kernel, scale, h, _row_stats(s, h.astype(F32)),
             None if out_stats is None else (residual, norm_bias, out_stats.mean))
    outs = (y, h) if _returns_sum(s) else y
    return (outs if out_stats is None else (y, *out_stats[:2])), saved


def _dense_norm_bwd(s: _Static, res, cotangents: Any):
    """H = X W + b (+ R); Y = Norm(H) (+ R after): dH from the row rule (plus H's own
    cotangent), then dX = dH W^T, dW = X^T dH, db = colsum(dH); dR = dH, or dY after.
    Y's statistics' cotangents join dY first (`row_stats.output_cotangent`)."""
    if s.automatic:
        return res(cotangents)
    x, kernel, scale, h, stats, out = res
    _, _, bias_dtype, _, norm_bias_dtype, residual_dtype = s.dtypes
    dy, dh_out = cotangents if _returns_sum(s) else (cotangents, None)
    if out is not None:  # the output re-formed (float32 from a kernel: rounding would swamp
        residual, norm_bias, mean = out  # h - mean), as the statistics were taken of it
        y32 = sharding.normalized(s.kind, h.astype(F32), stats, _gain(scale, 0.0), norm_bias)
        y32 = y32 + residual.astype(F32)
        dy = row_stats.output_cotangent(_statistics_rows(s, y32), mean, *cotangents)
    g = dy.astype(F32)
    rows = _rows(s.kind, h.astype(F32), stats)
    dh = _norm_input_grad(s, rows, g * _gain(scale, 0.0))
    if dh_out is not None:
        dh = dh + dh_out.astype(F32)
    d_scale, d_norm_bias = _gain_grads(rows, g, scale is not None, norm_bias_dtype is not None)
    dh_op = dh.astype(x.dtype)  # GEMM operand in x's precision, like the forward's
    dx = matmul_f32(dh_op, kernel.T)
    dw = matmul_f32(x.T, dh_op)
    db = None if bias_dtype is None else jnp.sum(dh, axis=0)
    d_res = None if residual_dtype is None else (dy if s.residual_after else dh)
    return _cast_like((dx, dw, db, d_scale, d_norm_bias, d_res), s.dtypes)


_dense_norm.defvjp(_dense_norm_fwd, _dense_norm_bwd)


def dense_norm(kind: str, x: Array, kernel: Array, bias: Array | None, scale: Array | None,
               norm_bias: Array | None, residual: Array | None, *, eps: float,
               impl: str | None, axis_name: tuple | None = None,
               residual_after: bool = False, output_stats: bool = False,
               lead: callers_rows.Lead = None) -> tuple[Any, Any]:
    """dense_rms_norm (kind="rms") or dense_layer_norm with a custom VJP: (normed, pre-norm
    sum), the sum only with a residual added before the norm (else None); with
    `residual_after`, (residual + normed, None), or with `output_stats` too, (residual +
    normed, its RowStats: of its float32 rows from a kernel, of its stored rows on the xla
    path, as `residual_dense`'s). With `axis_name` the kernel's columns (and the
    N-vectors, the residual's columns) are this shard's N-slice (no `output_stats`).
    `lead`: the caller's leading dims of x."""
    returns_sum = residual is not None and not residual_after
    if axis_name is None:
        explicit = partitioning.over_explicit_mesh(
            f"dense_{kind}_norm", (x, kernel, bias, scale, norm_bias, residual),
            lambda a, axis: dense_norm(kind, *a, eps=eps, impl=impl, axis_name=axis,
                                       residual_after=residual_after,
                                       output_stats=output_stats),
            has_sum=returns_sum, stats=output_stats)
        if explicit is not None:
            return explicit
        norm_args = _norm_params(kind, scale, norm_bias)
        chosen, automatic = _resolve(f"dense_{kind}_norm", impl, x, kernel, bias, *norm_args,
                                     residual, eps=eps, pre_norm_sum=returns_sum,
                                     residual_after=residual_after,
                                     **_stats_kwargs(output_stats))
    else:
        chosen, automatic = impl, False
    s = _static(kind, eps, 0.0, chosen, axis_name, x, kernel, bias, scale, norm_bias, residual,
                automatic=automatic, residual_after=residual_after, output_stats=output_stats,
                lead=lead)
    if impl is None and chosen == "xla":
        if output_stats:  # those of the stored y, as residual_dense's: no float32 y is kept
            y = _dense_norm_stock(s._replace(output_stats=False), callers_rows.shaped(x, lead),
                                  kernel, bias, scale, norm_bias,
                                  callers_rows.shaped(residual, lead))
            return callers_rows.flat(y, lead), row_stats.flat_rows(row_stats.of_rows(y))
        out = _dense_norm_in_callers_rows(s, x, kernel, bias, scale, norm_bias, residual)
    else:
        out = _dense_norm(s, *sharding.match_varying(x, kernel, bias, scale, norm_bias,
                                                     residual))
    if output_stats:
        return out[0], row_stats.RowStats(out[1], out[2], out[0].shape[-1])
    return out if returns_sum else (out, None)
