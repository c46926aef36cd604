"""The attention input as one op: (q, k, v) = (RoPE(QKNorm(h W_q)), RoPE(QKNorm(h W_k)),
h W_v) with h = RMSNorm(x), as Qwen3 and Gemma 3 compute it; without QK-norm gains
(q_scale = k_scale = None) (RoPE(h W_q), RoPE(h W_k), h W_v), as Llama does.

At decode (M <= 64 rows on Hopper) this is one Mosaic launch
(`pallas_kernels.decode_attention_input`: the input norm's row scale, the three products,
per-head QK-norm and RoPE in the epilogue) where the nearest measured shape had it at or
under `DECODE_MAX_RATIO` of stock's time (jaxnorm/backends/decode_attention_measured.py).
Everywhere else (under any `impl`, also at more than 64 rows, where the kernel does not
apply) it is exactly what the unfused layers compute, op by op:
`rms_norm_dense` for q/k/v (which may itself pick the pre-norm GEMM at prefill), then
`rms_norm` of each head (with QK-norm) and rotate-half RoPE, so falling back computes,
bitwise, what the model computed before this op existed (one cos/sin table per layer for q
and k, where the layers computed one each).

Differentiation: the kernel is paired with the backward of that composition (impl="xla";
`dispatch.call_with_xla_backward`, as `jaxnorm.given_statistics` pairs its kernel): decode
is inference, and a training step's M is never a decode shape.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm import _checks, dispatch, ops, row_stats
from jaxnorm.row_stats import RowStats
from pallas_kernels.decode_config import MAX_ROWS

__all__ = ["OP", "rms_norm_attention_input"]

Array = jax.Array
ArrayLike = jax.typing.ArrayLike
OP = "rms_norm_attention_input"


def rotate_half(h: Array, cos: Array, sin: Array) -> Array:
    """Rotate-half RoPE of h [..., H, hd] with tables [..., hd/2] (one per row, shared by
    the heads), in float32, cast back to h's dtype (Llama layout)."""
    h1, h2 = jnp.split(h.astype(jnp.float32), 2, axis=-1)
    c, s = cos[..., None, :], sin[..., None, :]
    return jnp.concatenate([h1 * c - h2 * s, h2 * c + h1 * s], axis=-1).astype(h.dtype)


def _composition(x: Array, scale: Array | None, w_q: Array, w_k: Array, w_v: Array,
                 q_scale: Array | None, k_scale: Array | None, cos: Array, sin: Array,
                 stats: RowStats | None, *, head_dim: int, eps: float, qk_eps: float,
                 scale_offset: float, impl: str | None,
                 return_input: bool = False) -> tuple[Array, ...]:
    """The unfused ops, each dispatching on its own under impl=None (`return_input`: x
    after q, k, v, from `ops.rms_norm_dense`); x [..., K] with tables and statistics of its
    rows' shape ([M, K] rows, or the caller's [B, T, K] as the model's own layers)."""
    outs = ops.rms_norm_dense(x, scale, (w_q, w_k, w_v), eps=eps, scale_offset=scale_offset,
                              impl=impl, statistics=stats, return_input=return_input)
    (q, k, v), x_out = outs if return_input else (outs, x)
    lead = x.shape[:-1]

    def normed_rotated(h: Array, gain: Array | None) -> Array:
        heads = h.reshape(*lead, -1, head_dim)
        if gain is not None:
            heads = ops.rms_norm(heads, gain, eps=qk_eps, scale_offset=scale_offset, impl=impl)
        return rotate_half(heads, cos, sin).reshape(*lead, -1)

    qkv = normed_rotated(q, q_scale), normed_rotated(k, k_scale), v
    return (*qkv, x_out) if return_input else qkv


def _check_table(name: str, table: ArrayLike, lead: tuple[int, ...], head_dim: int) -> Array:
    """A cos or sin table as float32, checked to broadcast to [*lead, head_dim / 2]."""
    table = jnp.asarray(table, jnp.float32)
    want = (*lead, head_dim // 2)
    if (table.ndim > len(want) or table.shape[-1:] != want[-1:]
            or any(t not in (1, w) for t, w in zip(table.shape[::-1], want[::-1]))):
        raise ValueError(f"{name} must be [{', '.join(map(str, lead))}, head_dim/2="
                         f"{head_dim // 2}] (a row per row of x) or broadcast to it; got "
                         f"{table.shape}")
    return table


@dispatch.register(OP, "xla")
def _xla(x, scale, w_q, w_k, w_v, q_scale, k_scale, cos, sin, stats=None, *, head_dim, eps,
         qk_eps, scale_offset, return_input=False):
    return _composition(x, scale, w_q, w_k, w_v, q_scale, k_scale, cos, sin, stats,
                        head_dim=head_dim, eps=eps, qk_eps=qk_eps, scale_offset=scale_offset,
                        impl="xla", return_input=return_input)


def rms_norm_attention_input(
    x: ArrayLike,
    scale: ArrayLike | None,
    w_q: ArrayLike,
    w_k: ArrayLike,
    w_v: ArrayLike,
    q_scale: ArrayLike | None,
    k_scale: ArrayLike | None,
    cos: ArrayLike,
    sin: ArrayLike,
    *,
    head_dim: int,
    eps: float = 1e-6,
    qk_eps: float = 1e-6,
    scale_offset: float = 0.0,
    impl: str | None = None,
    statistics: RowStats | None = None,
    return_input: bool = False,
) -> tuple[Array, ...]:
    """(q, k, v) of an attention input, each [..., heads * head_dim] in x's dtype.

    x: [..., K]; scale: the input norm's gain [K] (None: folded into the weights or absent);
    w_q, w_k, w_v: [K, heads * head_dim] without biases; q_scale, k_scale: the per-head
    QK-norm gains [head_dim], or both None for no QK-norm; cos, sin: [..., head_dim / 2]
    float32 tables of each row's position (angles = position * inverse frequency), or of
    shape broadcasting to that (a prompt's [T, head_dim / 2], shared by the batch, as stock
    RoPE computes it);
    `scale_offset` applies to all three gains (Gemma's 1 + g). `statistics`: x's RowStats
    from the residual GEMM that wrote it. `impl`: None (automatic), "xla", "mosaic" or
    "interpret". `return_input=True` returns (q, k, v, x), x for the residual stream, as
    `jaxnorm.rms_norm_dense` does.
    """
    eps, scale_offset = _checks.check_scalars(eps, scale_offset)
    qk_eps = _checks.check_scalars(qk_eps, scale_offset)[0]  # validated as an eps is
    k = _checks.check_activation("x", x)
    _checks.check_impl(impl)
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even number; got {head_dim}")
    x = jnp.asarray(x)
    lead = x.shape[:-1]
    _checks.check_vector("scale", scale, k)
    weights = []
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        w = jnp.asarray(w)
        if w.ndim != 2 or w.shape[0] != k or w.shape[1] % head_dim:
            raise ValueError(f"{name} must be [K={k}, heads * head_dim={head_dim}]; got "
                             f"{w.shape}")
        weights.append(w)
    if weights[1].shape != weights[2].shape:
        raise ValueError(f"w_k {weights[1].shape} and w_v {weights[2].shape} must match "
                         "(one key and one value per kv head)")
    if (q_scale is None) != (k_scale is None):
        raise ValueError("q_scale and k_scale: both (QK-norm) or neither (no QK-norm, Llama)")
    _checks.check_vector("q_scale", q_scale, head_dim)
    _checks.check_vector("k_scale", k_scale, head_dim)
    given_tables = [_check_table(name, t, lead, head_dim) for name, t in (("cos", cos),
                                                                          ("sin", sin))]
    tables = [jnp.broadcast_to(t, (*lead, head_dim // 2)).reshape(-1, head_dim // 2)
              for t in given_tables]
    stats = None if statistics is None else row_stats.flat_rows(
        row_stats.check("statistics", statistics, x.shape))
    args = (x.reshape(-1, k), None if scale is None else jnp.asarray(scale), *weights,
            *(None if g is None else jnp.asarray(g) for g in (q_scale, k_scale)), *tables, stats)
    kwargs = dict(head_dim=head_dim, eps=eps, qk_eps=qk_eps, scale_offset=scale_offset)
    chosen = dispatch.resolve(OP, impl, *args, **kwargs)
    if chosen == "xla" or args[0].shape[0] > MAX_ROWS:  # prefill: each op with `impl`, on x
        # in the caller's shape and with the tables as given, as the model's own layers
        # compute it (tables broadcast over the batch in the RoPE's products, not before)
        shaped = (x, *args[1:7], *given_tables,
                  None if stats is None else row_stats.reshaped(stats, lead))
        outs = _composition(*shaped, **kwargs, impl=impl, return_input=return_input)
    else:
        outs = dispatch.call_with_xla_backward(OP, chosen, *args, **kwargs,
                                               return_input=return_input)
    return tuple(o.reshape(*lead, o.shape[-1]) for o in outs)
