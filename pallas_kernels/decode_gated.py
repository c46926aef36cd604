"""The gated MLP input at decode (M <= 64): act(RMSNorm(x) @ W_g + b_g) * (RMSNorm(x) @ W_u + b_u).

One launch of the weight-streaming kernel (`pallas_kernels.decode_kernel`) with two
streams: each work unit owns one N tile of both gate and up, so per K step the
memory warpgroup streams the x tile and the gate and up weight tiles into one
pipeline slot, and each MMA warpgroup keeps two [64, tile_n] float32 accumulators.
The epilogue writes y = act(r acc_g + b_g) * (r acc_u + b_u) (float32, then
x.dtype): no [M, d_ff] gate and up in HBM and no activation pass, as the prefill
kernel (`pallas_kernels.gated_matmul`) does for large M. act(gate) * up is not linear
in partial sums over K, so the K splits must be summed before the epilogue: split_k is
1 (then d_ff / (warpgroups * tile_n) units is all the parallelism, 48 at d_ff = 3072 and
64-column tiles), or the splits of a tile are one cluster whose rank 0 sums both
streams' partials and runs the epilogue (`reduction="cluster"`, S times the units).

Since every unit streams all of x's K tiles, the row statistic comes free: the
MMA warpgroups sum x's squares from the tiles in shared memory and form
r = rsqrt(mean(x^2) + eps) for the epilogue, so no XLA pass reads x. That holds
when the gain is folded into both weights (`jaxnorm.fold`) or absent; a gain
that is not folded still scales x in one XLA pass (M*K elements, the smaller
operand), which takes r of the unscaled x in the same pass. `row_scale` (from a
previous kernel's statistics) skips both. With the splits in a cluster each split sums
its share of the squares and rank 0 adds them with the partials.
"""

from __future__ import annotations

import functools

import jax
import jax.experimental.pallas as pl
import jax.numpy as jnp

from pallas_kernels import decode_kernel, hardware
from pallas_kernels.decode_config import (MAX_ROWS, DecodeConfig, check_shapes,
                                          gated_decode_config)
from pallas_kernels.errors import Unsupported
from pallas_kernels.gated_matmul import ACTIVATIONS

__all__ = ["MAX_ROWS", "check_decode_gated_shapes", "decode_gated_rms_matmul",
           "gated_decode_config"]

Array = jax.Array
# Two accumulators of [64, tile_n] float32: 2 * tile_n / 2 registers a thread.
MAX_TILE_N = 128


def check_decode_gated_shapes(x, w_gate, w_up, config: DecodeConfig) -> None:
    """Unsupported for what the decode gated kernel does not serve: the decode GEMM's rules
    for [W_gate, W_up] (two weight tiles per slot), one shape for both, the K splits
    summed before the epilogue (split_k = 1 or in the cluster) and tile_n <= MAX_TILE_N."""
    check_shapes(x, [w_gate, w_up], config, streams=2)
    if w_gate.shape != w_up.shape:
        raise Unsupported(f"W_gate {w_gate.shape} and W_up {w_up.shape} must have one shape")
    if config.split_k != 1 and not config.cluster_splits:
        raise Unsupported(f"split_k={config.split_k} must be 1 unless the splits are summed "
                          "in the cluster (reduction='cluster'): act(gate) * up is not linear "
                          "in partial sums over K")
    if config.tile_n > MAX_TILE_N:
        raise Unsupported(f"tile_n={config.tile_n} must be <= {MAX_TILE_N}: two float32 "
                          "accumulators of more columns exceed the MMA warpgroups' registers")


def decode_gated_rms_matmul(
    x: Array,
    w_gate: Array,
    w_up: Array,
    *,
    activation: str = "silu",
    eps: float = 1e-6,
    scale: Array | None = None,
    scale_offset: float = 0.0,
    gate_bias: Array | None = None,
    up_bias: Array | None = None,
    row_scale: Array | None = None,
    config: DecodeConfig | None = None,
    interpret: bool = False,
) -> Array:
    """act(RMSNorm(x; scale) @ W_gate + b_g) * (RMSNorm(x; scale) @ W_up + b_u) in x.dtype.

    x: [M, K] bf16/f16 with M <= 64; weights [K, N] of x's dtype (the folded W*
    when scale is None); `row_scale` ([M] float32 r) replaces the statistic; else
    it is taken in the kernel (scale None) or in the pass that scales x by the gain.
    activation: a key of `gated_matmul.ACTIVATIONS`.
    """
    if activation not in ACTIVATIONS:
        raise Unsupported(f"activation {activation!r} not served; one of {tuple(ACTIVATIONS)}")
    if x.ndim != 2 or w_gate.ndim != 2:
        raise Unsupported(f"x [M, K] and W_gate [K, N] must be 2-D; got {x.shape}, "
                          f"{w_gate.shape}")
    (m, k), n = x.shape, w_gate.shape[1]
    if config is None:
        config = gated_decode_config(m, k, n, sms=hardware.num_sms(),
                                     itemsize=jnp.dtype(x.dtype).itemsize)
    check_decode_gated_shapes(x, w_gate, w_up, config)
    x, rows = decode_kernel.scaled_input(x, scale=scale, scale_offset=scale_offset,
                                         row_scale=row_scale, eps=eps)
    has_bias = gate_bias is not None or up_bias is not None
    biases = [jnp.zeros((n,), jnp.float32) if b is None else b.astype(jnp.float32)
              for b in (gate_bias, up_bias)] if has_bias else []
    plan = decode_kernel.Plan(
        n_tiles=(pl.cdiv(n, config.cta_tile_n),), x_box=decode_kernel.x_box_rows(m),
        has_bias=has_bias, row_scale="given" if rows else "in_kernel",
        streams=2, combine=_gated(activation), eps=eps)
    (y,) = decode_kernel.build(x, (w_gate, w_up), [jax.ShapeDtypeStruct((m, n), x.dtype)],
                               config=config, plan=plan, interpret=interpret)(
        x, w_gate, w_up, *rows, *biases)
    return y


@functools.cache
def _gated(activation: str) -> decode_kernel.Combine:
    """act(gate) * up of one output piece (one function per activation: stable plans)."""
    act = ACTIVATIONS[activation]

    def combine(values: list[Array]) -> Array:
        gate, up = values
        return act(gate) * up

    return combine
