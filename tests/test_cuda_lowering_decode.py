"""Cross-lowering of the decode GEMM for "cuda" (no GPU) at the model presets' decode shapes.

Runs the Pallas -> Mosaic GPU lowering (layout inference, TMA descriptors, the SMEM
budget) at real sizes with the H200's SM count; it does not run ptxas.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import decode_config as dc
from pallas_kernels import decode_matmul as dm
from pallas_kernels import hardware

H200 = hardware.h200_mesh()
S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16

# (K, N): the presets' decode projections, vocab heads, Gemma-3-1B's o and down (the
# products of its post-norm ops at decode), Qwen3-4B's o.
SHAPES = [(4096, 6144), (4096, 28672), (14336, 4096), (2048, 3072), (2048, 16384),
          (8192, 2048), (1024, 4096), (2048, 128256), (1024, 1152), (6912, 1152),
          (4096, 2560), (4096, 32768)]


def _lower(m: int, k: int, ns: tuple[int, ...], config: dc.DecodeConfig | None,
           row_scale_given: bool = True) -> None:
    x, r = S((m, k), BF16), S((m,), jnp.float32)
    ws, bs = [S((k, n), BF16) for n in ns], [S((n,), jnp.float32) for n in ns]

    def fn(x, r, ws, bs):
        return dm.lazy_rms_decode_matmul(x, ws, row_scale=r if row_scale_given else None,
                                         biases=bs, config=config)

    with jax.sharding.use_abstract_mesh(H200):
        lowered = jax.jit(fn).trace(x, r, ws, bs).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


@pytest.mark.parametrize("m", [1, 64])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_automatic_pick_lowers(m, shape):
    k, n = shape
    _lower(m, k, (n,), None)


@pytest.mark.parametrize(
    "config",
    [dc.DecodeConfig(tile_n=128, split_k=4, stages=8), dc.DecodeConfig(tile_n=256, stages=5),
     dc.DecodeConfig(tile_n=64, split_k=2, stages=8, warpgroups=2),
     dc.DecodeConfig(tile_n=128, split_k=1, stages=4, warpgroups=2)],
    ids=str,
)
@pytest.mark.parametrize("m", [1, 16])
def test_configs_lower_for_fused_qkv(m, config):
    """q/k/v of an 8B model in one launch, over the knobs the bench sweeps."""
    _lower(m, 4096, (4096, 1024, 1024), config)


@pytest.mark.parametrize("config", [dc.DecodeConfig(tile_n=128, stages=8),
                                    dc.DecodeConfig(tile_n=64, stages=8, warpgroups=2),
                                    dc.DecodeConfig(tile_n=64, split_k=4, stages=8,
                                                    reduction="cluster")], ids=str)
@pytest.mark.parametrize("m", [1, 64])
def test_row_statistic_in_the_kernel_lowers(m, config):
    """No row scale given: the x tiles' squares summed in the MMA warpgroups (split_k = 1), or
    each split's share added by rank 0 through DSMEM (a cluster)."""
    _lower(m, 4096, (4096, 1024, 1024), config, row_scale_given=False)


@pytest.mark.parametrize(
    "config",
    [dc.DecodeConfig(tile_n=64, split_k=8, stages=12, reduction="cluster"),
     dc.DecodeConfig(tile_n=128, split_k=4, stages=7, reduction="cluster"),
     dc.DecodeConfig(tile_n=64, split_k=2, stages=6, warpgroups=2, reduction="cluster")],
    ids=str,
)
@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("launch", [(2048, (1024,)), (3072, (1024,)), (1024, (1152,)),
                                    (8192, (2048,)), (2048, (2048, 512, 512))],
                         ids=lambda s: f"{s[0]}x{'+'.join(map(str, s[1]))}")
def test_cluster_reduction_lowers(m, launch, config):
    """Split-K summed in the cluster (rank 0 reads its peers' partials through DSMEM, which
    the interpreter cannot run) at the 1B-class presets' o, down and q/k/v launches."""
    k, ns = launch
    _lower(m, k, ns, config)


@pytest.mark.parametrize(
    "config",
    [dc.DecodeConfig(tile_n=64, split_k=8, stages=12, reduction="cluster"),
     dc.DecodeConfig(tile_n=128, split_k=4, stages=8, reduction="cluster"),
     dc.DecodeConfig(tile_n=64, split_k=4, stages=8, warpgroups=2, reduction="cluster"),
     dc.DecodeConfig(tile_n=64, split_k=1, stages=12)],
    ids=str,
)
@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("shape", [(2048, 1024), (3072, 1024), (8192, 2048), (1024, 1152),
                                   (4096, 2560)], ids=lambda s: "x".join(map(str, s)))
def test_residual_epilogue_lowers(m, shape, config):
    """h = x @ w + b + r and h's per-tile statistics in one launch, at the presets' o- and
    down-projections (the stages refitted to the residual tiles' shared memory)."""
    k, n = shape
    x, w, r, b = S((m, k), BF16), S((k, n), BF16), S((m, n), BF16), S((n,), jnp.float32)

    def fn(x, w, r, b):
        return dm.decode_residual_matmul(x, w, r, bias=b, config=config)

    with jax.sharding.use_abstract_mesh(H200):
        lowered = jax.jit(fn).trace(x, w, r, b).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()
