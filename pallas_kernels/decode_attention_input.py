"""The attention input at decode (M <= 64) in one launch: RMSNorm(x) @ W_q, W_k, W_v, then
per-head QK-norm of q and k (Qwen3, Gemma 3; none for Llama) and RoPE at each row's
position, in the epilogue.

Stock, this is the input norm, the q/k/v products, then XLA kernels for the two
QK-norms and the two rotations. Here it is one launch of the weight-streaming kernel
(`pallas_kernels.decode_kernel`) with two streams over each weight as stored
(`Plan.head_halves`): for head t, stream 0 reads the columns of its first RoPE half and
stream 1 those of its second, so one MMA warpgroup's unit holds one whole head as two
[64, hd/2] float32 accumulators in the same WGMMA layout, with no re-layout of the weight.
Rotate-half RoPE is then elementwise
between them (lo cos - hi sin, hi cos + lo sin: `jaxnorm.models.layers.rope`'s
convention), and the head's sum of squares for QK-norm is a row reduction of
lo^2 + hi^2 inside the warpgroup (skipped without QK-norm gains). cos and sin ([M, hd/2]
float32, one row per position: `rope_tables`) and the QK-norm gains are staged into SMEM
once per CTA.
Each half is stored back to its columns: q, k, v come out in the standard head layout.

The QK-norm needs a head's whole dot, so K is split only with the splits of a head in
one cluster whose rank 0 sums them before the epilogue (`reduction="cluster"`; the
partials share their shared memory with the cos/sin tables, which only rank 0 reads, so
head_dim 256 fits); unsplit,
the heads are the parallelism: n_heads + 2 n_kv_heads units, one head each (six for
Gemma-3-1B, of 132 SMs). The input norm's row scale comes as the decode gated kernel's
does (`pallas_kernels.decode_gated`): given, taken in the kernel from the x tiles (gain
folded or absent; split, each split's squares summed with the partials), or with the pass
that scales x by a gain.
"""

from __future__ import annotations

import functools

import jax
import jax.experimental.pallas as pl
import jax.experimental.pallas.mosaic_gpu as plgpu
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels import decode_kernel, hardware
from pallas_kernels.decode_config import EPI_N, MAX_ROWS, DecodeConfig, check_shapes, deepest
from pallas_kernels.errors import Unsupported
from pallas_kernels.row_stats import safe_rsqrt

__all__ = ["HEAD_DIMS", "attention_input_config", "constants_bytes", "decode_attention_input", "rope_tables"]

Array = jax.Array
# Two [64, hd/2] float32 accumulators: hd/2 <= 128 columns fit the MMA warpgroup's registers.
HALVES = (64, 128)
HEAD_DIMS = tuple(2 * half for half in HALVES)


def rope_tables(positions: Array, inv_freq: np.ndarray | Array) -> tuple[Array, Array]:
    """(cos, sin) [M, hd/2] float32 of each row's position: the angles as
    `jaxnorm.models.layers.rope` takes them (float32 position times inverse frequency)."""
    angles = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq, jnp.float32)
    return jnp.cos(angles), jnp.sin(angles)


def attention_input_config(m: int, k: int, heads: int, head_dim: int, *,
                           sms: int = hardware.H200_SMS, itemsize: int = 2) -> DecodeConfig:
    """The config for `heads` heads of q, k and v together: tile_n is hd/2 (one head per unit),
    with the deepest pipeline of x and both half tiles that fits (one MMA warpgroup: a
    CTA's two half tiles are then each one contiguous run of the weight's columns)."""
    return _config(m, k, heads, head_dim, sms, itemsize)


def constants_bytes(head_dim: int) -> int:
    """SMEM of the epilogue's constants: cos and sin as [64, hd/2] float32 tiles, two gains."""
    return 2 * MAX_ROWS * (head_dim // 2) * 4 + 2 * head_dim * 4


@functools.lru_cache(maxsize=256)
def _config(m: int, k: int, heads: int, head_dim: int, sms: int, itemsize: int) -> DecodeConfig:
    return deepest(DecodeConfig(tile_n=head_dim // 2, warpgroups=1), itemsize, streams=2,
                   constants=constants_bytes(head_dim))


def _check(x: Array, weights: tuple[Array, Array, Array], hd: int, config: DecodeConfig,
           q_gain: Array | None, k_gain: Array | None, cos: Array, sin: Array) -> None:
    """Unsupported (or ValueError for mismatched arguments) naming what is not served."""
    if hd // 2 not in HALVES or hd % 2:
        raise Unsupported(f"head_dim={hd} must be 128 or 256: each RoPE half is whole 64-column "
                          "output pieces, and two halves of more than 128 float32 columns "
                          "exceed the MMA warpgroup's registers")
    for name, w in zip(("w_q", "w_k", "w_v"), weights):
        if w.ndim != 2 or w.shape[1] % hd:
            raise ValueError(f"{name} {w.shape} must be [K, heads * head_dim={hd}]")
    check_shapes(x, list(weights), config, streams=2, constants=constants_bytes(hd))
    if config.tile_n != hd // 2 or config.warpgroups != 1:
        raise Unsupported(f"tile_n={config.tile_n}, warpgroups={config.warpgroups}: must be "
                          f"head_dim/2 = {hd // 2} and 1 (a unit holds one whole head)")
    if config.split_k != 1 and not config.cluster_splits:
        raise Unsupported(f"split_k={config.split_k} must be 1 unless the splits are summed in "
                          "the cluster (reduction='cluster'): the QK-norm is not linear in "
                          "partial sums over K")
    m = x.shape[0]
    if (q_gain is None) != (k_gain is None):
        raise ValueError("q_gain and k_gain: both (QK-norm) or neither (none)")
    for name, gain in (("q_gain", q_gain), ("k_gain", k_gain)):
        if gain is not None and gain.shape != (hd,):
            raise ValueError(f"{name} must be [head_dim={hd}]; got {gain.shape}")
    for name, table in (("cos", cos), ("sin", sin)):
        if table.shape != (m, hd // 2):
            raise ValueError(f"{name} must be [M={m}, head_dim/2={hd // 2}]; got {table.shape}")


def decode_attention_input(
    x: Array,
    weights: tuple[Array, Array, Array],
    *,
    head_dim: int,
    q_gain: Array | None,
    k_gain: Array | None,
    cos: Array,
    sin: Array,
    qk_eps: float = 1e-6,
    qk_offset: float = 0.0,
    eps: float = 1e-6,
    scale: Array | None = None,
    scale_offset: float = 0.0,
    row_scale: Array | None = None,
    config: DecodeConfig | None = None,
    interpret: bool = False,
) -> tuple[Array, Array, Array]:
    """(q, k, v) = (RoPE(QKNorm(h_q)), RoPE(QKNorm(h_k)), h_v), h = RMSNorm(x; scale) @ W, in
    x.dtype and the standard head layout ([M, heads * head_dim]); with q_gain and k_gain
    None, no QK-norm: (RoPE(h_q), RoPE(h_k), h_v), as Llama computes it.

    x: [M, K] bf16/f16 with M <= 64; weights: (W_q, W_k, W_v), each [K, heads * head_dim] as
    stored (the folded W* when scale is None); per head QKNorm(h) =
    h rsqrt(mean_head(h^2) + qk_eps) (qk_offset + gain); cos, sin: `rope_tables` of each
    row's position; row_scale ([M] float32) replaces the input norm's statistic, else it is
    taken in the kernel (scale None) or in the pass that scales x by the gain. No biases
    (Qwen3 and Gemma 3 have none); head_dim 128 or 256 (`_check` says why).
    """
    if x.ndim != 2:
        raise Unsupported(f"x must be [M, K]; got {x.shape}")
    if not (isinstance(weights, tuple | list) and len(weights) == 3):
        raise ValueError("weights must be (w_q, w_k, w_v)")
    weights = tuple(weights)
    (m, k), hd = x.shape, head_dim
    heads = [w.shape[1] // hd for w in weights]
    if config is None:
        config = attention_input_config(m, k, sum(heads), hd, sms=hardware.num_sms(),
                                        itemsize=jnp.dtype(x.dtype).itemsize)
    _check(x, weights, hd, config, q_gain, k_gain, cos, sin)
    x, rows = decode_kernel.scaled_input(x, scale=scale, scale_offset=scale_offset,
                                         row_scale=row_scale, eps=eps)
    qk_norm = q_gain is not None
    gains = [(g.astype(jnp.float32) + qk_offset) for g in (q_gain, k_gain)] if qk_norm else []
    plan = decode_kernel.Plan(
        n_tiles=tuple(pl.cdiv(h, config.warpgroups) for h in heads),
        x_box=decode_kernel.x_box_rows(m), has_bias=False,
        row_scale="given" if rows else "in_kernel", streams=2, eps=eps,
        constants=((m, hd // 2), (m, hd // 2)) + ((hd,), (hd,)) * qk_norm,
        epilogue=_epilogue(hd, tuple(heads), config.warpgroups, float(qk_eps), qk_norm),
        head_halves=True)
    out_types = [jax.ShapeDtypeStruct((m, h * hd), x.dtype) for h in heads]
    halves = [w for w in weights for _ in range(2)]  # each weight once per stream
    q, k_, v = decode_kernel.build(x, halves, out_types, config=config, plan=plan,
                                   interpret=interpret)(
        x, *halves, *rows, cos.astype(jnp.float32), sin.astype(jnp.float32), *gains)
    return q, k_, v


@functools.cache
def _epilogue(head_dim: int, heads: tuple[int, ...], warpgroups: int, qk_eps: float,
              qk_norm: bool):
    """The unit epilogue (one per shape: stable plans): r h, then for q and k (outputs 0, 1)
    QK-norm (where `qk_norm`) and RoPE, stored half by half to the head's columns; a head
    past the output's last (two warpgroups, an odd count) stores nothing."""
    half = head_dim // 2
    epi_n = EPI_N[2]  # x.dtype is 2 bytes (bf16/f16): 64-column pieces
    col = plgpu.Layout.WGMMA.reduce(0)

    def rows_of(v, shape):
        return lax.broadcast_in_dim(v, shape, [0])

    def cols_of(v, shape):
        return lax.broadcast_in_dim(v, shape, [1])

    def epilogue(unit: decode_kernel.Unit) -> None:
        head = unit.local_n * warpgroups + unit.wg
        lo, hi = unit.accs
        if unit.scale is not None:
            lo, hi = lo * rows_of(unit.scale, lo.shape), hi * rows_of(unit.scale, hi.shape)
        rotate = unit.output < 2
        if rotate and qk_norm:
            ssq = jnp.sum(lo * lo, axis=1) + jnp.sum(hi * hi, axis=1)
            s = safe_rsqrt(ssq * (1.0 / head_dim) + qk_eps)
            lo, hi = lo * rows_of(s, lo.shape), hi * rows_of(s, hi.shape)
        cos_smem, sin_smem, *gain_smems = unit.constants
        # Drain any store still reading out_smem from the previous unit.
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

        @pl.when(head < heads[unit.output])
        def _store():
            pieces = 0
            for p in range(half // epi_n):
                cols = slice(p * epi_n, (p + 1) * epi_n)
                a, b = lo[:, cols], hi[:, cols]
                if rotate and qk_norm:
                    gain = gain_smems[unit.output]
                    a = a * cols_of(plgpu.load(gain.at[pl.ds(p * epi_n, epi_n)], layout=col),
                                    a.shape)
                    b = b * cols_of(plgpu.load(gain.at[pl.ds(half + p * epi_n, epi_n)],
                                               layout=col), b.shape)
                if rotate:
                    c = plgpu.load(cos_smem.at[:, cols], layout=plgpu.Layout.WGMMA)
                    sn = plgpu.load(sin_smem.at[:, cols], layout=plgpu.Layout.WGMMA)
                    a, b = a * c - b * sn, b * c + a * sn
                for which, y in enumerate((a, b)):
                    slot = pieces % 2
                    # The store issued two pieces ago read this slot; wait until it has.
                    plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                    unit.out_smem[slot] = y.astype(unit.out_smem.dtype)
                    plgpu.commit_smem()
                    start = head * head_dim + which * half + p * epi_n
                    plgpu.copy_smem_to_gmem(
                        unit.out_smem.at[slot, pl.ds(0, unit.x_box)],
                        unit.out_gmem.at[pl.ds(0, unit.x_box), pl.ds(start, epi_n)])
                    pieces += 1

    return epilogue

