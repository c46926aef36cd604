"""Cross-lowering of the decode gated kernel for "cuda" (no GPU) at the presets' decode MLP
shapes: the Pallas -> Mosaic GPU lowering (layout inference of the x tile's register read,
TMA descriptors, the SMEM budget) with the H200's SM count; it does not run ptxas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxnorm
from pallas_kernels import decode_config as dc
from pallas_kernels import decode_gated as dg
from pallas_kernels import hardware

H200 = hardware.h200_mesh()
S = jax.ShapeDtypeStruct
BF16, F32 = jnp.bfloat16, jnp.float32
# (K, d_ff, activation): Llama-3.2-1B, Qwen3-0.6B, Qwen3-4B, Llama-3-8B, Gemma-3-1B.
PRESETS = [(2048, 8192, "silu"), (1024, 3072, "silu"), (2560, 9728, "silu"),
           (4096, 14336, "silu"), (1152, 6912, "gelu_tanh")]


def _lower(fn, args) -> None:
    with jax.sharding.use_abstract_mesh(H200):
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_op_lowers_at_decode_with_the_statistic_in_the_kernel(m, preset):
    """The gain folded (scale=None): the op's mosaic path is one decode gated launch."""
    k, n, activation = preset
    args = (S((m, k), BF16), S((k, n), BF16), S((k, n), BF16))
    _lower(lambda x, wg, wu: jaxnorm.rms_norm_gated_dense(x, None, wg, wu, activation=activation,
                                                          impl="mosaic"), args)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_gain_and_biases_lower(activation):
    """A gain scaling x in XLA (Gemma's 1 + g) and both biases, given row scale."""
    m, k, n = 8, 1152, 6912
    args = (S((m, k), BF16), S((k,), F32), S((k, n), BF16), S((k, n), BF16), S((n,), F32))
    _lower(lambda x, g, wg, wu, b: jaxnorm.rms_norm_gated_dense(
        x, g, wg, wu, b, b, activation=activation, scale_offset=1.0, impl="mosaic"), args)


@pytest.mark.parametrize("tile_n, warpgroups", dc.GATED_TILES)
def test_every_candidate_tile_lowers(tile_n, warpgroups):
    m, k, n = 64, 4096, 14336
    config = dc.deepest(dc.DecodeConfig(tile_n=tile_n, warpgroups=warpgroups), 2, streams=2)
    args = (S((m, k), BF16), S((k, n), BF16), S((k, n), BF16), S((n,), F32))
    _lower(lambda x, wg, wu, b: dg.decode_gated_rms_matmul(x, wg, wu, gate_bias=b, up_bias=b,
                                                           config=config), args)


@pytest.mark.parametrize("split, tile_n, warpgroups", [(4, 64, 1), (2, 128, 1), (8, 64, 1),
                                                       (2, 64, 2)])
@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_cluster_splits_lower(m, preset, split, tile_n, warpgroups):
    """The K splits in a cluster, rank 0 summing gate's and up's partials through DSMEM (the
    interpreter cannot run that part), at the presets' MLP shapes."""
    k, n, activation = preset
    config = dc.deepest(dc.DecodeConfig(tile_n=tile_n, warpgroups=warpgroups, split_k=split,
                                        reduction="cluster"), 2, streams=2)
    args = (S((m, k), BF16), S((k, n), BF16), S((k, n), BF16))
    _lower(lambda x, wg, wu: dg.decode_gated_rms_matmul(x, wg, wu, activation=activation,
                                                        config=config), args)
