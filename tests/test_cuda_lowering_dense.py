"""Cross-lowering of the dense kernels for "cuda" on a machine without a GPU.

`jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",))` runs the Pallas
-> Mosaic GPU lowering, layout inference and the Mosaic dialect lowering (TMA
descriptors, SMEM budget) at real sizes; it does not run ptxas. The SM count
is set through an abstract mesh (H200: 132).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import gemm_config, hardware
from pallas_kernels import lazy_norm_matmul as lz
from pallas_kernels import plain_matmul as pm

H200 = hardware.h200_mesh()
S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16

# (M, K, N): the shapes, then odd M (padded to 8 rows for TMA) and the GPU script's.
SHAPES = [(8192, 4096, 14336), (16, 4096, 6144), (4096, 8192, 8192), (1, 4096, 4096)]
MORE_SHAPES = [(300, 4096, 4096), (13, 4096, 4096), (8191, 4096, 4096), (2048, 4096, 6144),
               (16, 4096, 14336), (65536, 4096, 4096)]


# Each MMA warpgroup a whole 128 x 128 tile, from one ring of five slots.
PINGPONG = gemm_config.TuningConfig(tile_m=128, tile_n=128, max_concurrent_steps=5,
                                    pingpong=True)


def _variants(m: int, k: int, n: int) -> dict:
    x, w, w2 = S((m, k), BF16), S((k, n), BF16), S((k, n // 2), BF16)
    b, g = S((n,), jnp.float32), S((k,), jnp.float32)
    cfg = lz.default_config(m, k, [n, n // 2])
    return {
        "plain": (lambda x, w: pm.plain_matmul(x, w), (x, w)),
        "plain_wgmma_in_flight": (
            lambda x, w: pm.plain_matmul(
                x, w, config=dataclasses.replace(lz.default_config(m, k, [n]), wgmma_in_flight=1)),
            (x, w)),
        "rms_a_bias": (lambda x, w, b: lz.lazy_rms_matmul(x, [w], biases=[b], config=cfg),
                       (x, w, b)),
        "rms_a_gain_two_weights": (
            lambda x, w, w2, g: lz.lazy_rms_matmul(x, [w, w2], scale=g, scale_offset=1.0,
                                                   config=cfg), (x, w, w2, g)),
        "rms_gain_in_the_mainloop": (
            lambda x, w, w2, g: lz.lazy_rms_matmul(
                x, [w, w2], scale=g, scale_offset=1.0, gain_in_kernel=True,
                config=dataclasses.replace(cfg, cluster_dimension=None, wgmma_in_flight=0)),
            (x, w, w2, g)),
        "pingpong": (
            lambda x, w: pm.plain_matmul(x, w, config=PINGPONG), (x, w)),
        "rms_two_weights_row_stats": (
            lambda x, w, w2: lz.lazy_rms_matmul(x, [w, w2], config=cfg,
                                                return_row_stats=True), (x, w, w2)),
        "ln_a_two_weights": (
            lambda x, w, w2, g, b: lz.lazy_layer_norm_matmul(
                x, [w, w2], scale=g, norm_bias=g, biases=[b, None], prenormalize=False,
                config=cfg), (x, w, w2, g, b)),
        "ln_prenormalized": (
            lambda x, w, g: lz.lazy_layer_norm_matmul(x, [w], scale=g, norm_bias=g,
                                                      prenormalize=True), (x, w, g)),
    }


def _lower(fn, args) -> None:
    with jax.sharding.use_abstract_mesh(H200):
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


@pytest.mark.parametrize("variant", list(_variants(8, 64, 64)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_lowers_for_cuda(shape, variant):
    fn, args = _variants(*shape)[variant]
    _lower(fn, args)


@pytest.mark.parametrize("variant", ["plain", "rms_two_weights_row_stats", "ln_a_two_weights"])
@pytest.mark.parametrize("shape", MORE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_lowers_for_cuda_more_shapes(shape, variant):
    fn, args = _variants(*shape)[variant]
    _lower(fn, args)
