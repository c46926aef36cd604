"""The GEMM with a 2-CTA cluster (`TuningConfig.cluster_dimension`): the interpreter with race
detection against float64, and CUDA lowering at a preset shape.

The interpreter runs both CTAs of each cluster, their pairing of tiles and the cluster
barrier that lets a slot be refilled once both CTAs' consumers are done; it loads the shared
operand whole into each CTA instead of multicasting halves, so the TMA multicast itself is
checked on the GPU (bench/gemm_sweep.py checks every config's output before timing it).
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernel_checks import assert_race_free
from jaxnorm import row_stats
from pallas_kernels import gemm_config
from pallas_kernels import hardware
from pallas_kernels import lazy_norm_matmul as lz
from pallas_kernels import plain_matmul as pm
from pallas_kernels.errors import Unsupported
from pallas_kernels.gemm_config import MatmulDimension, TuningConfig
from verify import references as ref
from verify import tolerances as tol
from verify.checks import check_outputs

BF16 = jnp.bfloat16
M, N = MatmulDimension.M, MatmulDimension.N
H200 = hardware.h200_mesh()


def _rng(request) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _config(cluster: MatmulDimension, **kw) -> TuningConfig:
    # Two stages over four K steps: slots are refilled within and across tiles.
    return TuningConfig(cluster_dimension=cluster, max_concurrent_steps=2, grid_tile_width=2,
                        grid_minor_dim=M, **kw)


def _weights(rng, k, ns):
    return [jnp.asarray(rng.standard_normal((k, n)) / np.sqrt(k), BF16) for n in ns]


PLAIN_CASES = {
    # x tile shared; M = 520 leaves a ragged last row tile; 5 pairs over 2 clusters.
    "along_N_ragged_M": (N, 520, 512, {}),
    # w tile shared, 256x128 CTA tiles, M = 1000 (4 row tiles, the last ragged).
    "along_M_wg_split_M": (M, 1000, 384, dict(wg_dimension=M)),
    "along_M_64x256": (M, 512, 256, dict(tile_m=64, tile_n=256, wg_dimension=M)),
    # Slots released a step late into the cluster barrier both CTAs' consumers arrive on.
    "along_N_wgmma_in_flight": (N, 520, 512, dict(wgmma_in_flight=1)),
}


@pytest.mark.parametrize("case", list(PLAIN_CASES))
def test_plain_matmul_with_a_cluster(case, request):
    cluster, m, n, kw = PLAIN_CASES[case]
    rng = _rng(request)
    k = 256
    x = jnp.asarray(rng.standard_normal((m, k)), BF16)
    (w,) = _weights(rng, k, (n,))
    y = pm.plain_matmul(x, w, config=_config(cluster, **kw), interpret=True)
    assert_race_free()
    y64 = ref.f64(x) @ ref.f64(w)
    t = tol.dense_tolerance(ref.f64(x), ref.f64(w), y64, BF16, BF16)
    assert y.dtype == BF16 and np.all(np.abs(ref.f64(y) - y64) <= t)


LAZY_CASES = {
    # Pairs straddle weights (N tiles 1 + 2 + 1): each CTA loads its own weight's tile.
    "along_N_three_weights": (N, 256, (256, 512, 256)),
    "along_M_two_weights": (M, 500, (256, 128)),  # 4 row tiles, the last ragged
}


@pytest.mark.parametrize("case", list(LAZY_CASES))
def test_lazy_rms_matmul_with_a_cluster(case, request):
    """The epilogue vectors (row scale, biases) and row statistics out, per CTA of a cluster."""
    cluster, m, ns = LAZY_CASES[case]
    rng = _rng(request)
    k = 256
    inputs = dict(x=jnp.asarray(rng.standard_normal((m, k)), BF16), kernel=_weights(rng, k, ns),
                  eps=1e-6, bias=[jnp.asarray(rng.standard_normal(n), jnp.float32) for n in ns])
    outs, stats = lz.lazy_rms_matmul(inputs["x"], inputs["kernel"], biases=inputs["bias"],
                                     config=_config(cluster), return_row_stats=True,
                                     interpret=True)
    assert_race_free()
    assert check_outputs("rms_norm_dense", outs, **inputs) <= 1.0
    config = _config(cluster)
    for y, n, (row_sum, row_m2) in zip(outs, ns, stats):
        y64 = ref.f64(y)
        np.testing.assert_allclose(np.sum(row_sum, axis=0)[:m], y64.sum(1),
                                   atol=2**-7 * np.abs(y64).sum(1).max())
        # The partials are (sum, M2 about the part's mean): Chan-combined, M2 of the row.
        _, m2 = row_stats.from_partials(row_sum, row_m2, gemm_config.part_columns(n, config))
        centred = y64 - y64.mean(1, keepdims=True)
        np.testing.assert_allclose(np.asarray(m2)[:m], (centred * centred).sum(1), rtol=2**-6)


@pytest.mark.parametrize("cluster, m, ns, reason", [
    (M, 384, (256,), "even number of 128-row CTA tiles"),
    (N, 256, (256, 512), "even number of 256-column CTA tiles"),
])
def test_tiles_that_do_not_pair_up_are_unsupported(cluster, m, ns, reason):
    x = jnp.ones((m, 128), BF16)
    with pytest.raises(Unsupported, match=reason):
        lz.lazy_rms_matmul(x, [jnp.ones((128, n), BF16) for n in ns], config=_config(cluster),
                           interpret=True)


@pytest.mark.parametrize("cluster, kw", [(N, {}), (M, {}), (N, dict(wg_dimension=M)),
                                         (M, dict(tile_m=64, tile_n=256, wg_dimension=M))])
def test_cluster_lowers_for_cuda(cluster, kw):
    """8192x4096x4096, and the lazy GEMM with every epilogue vector and row statistics."""
    m, k, n = 8192, 4096, 4096
    config = TuningConfig(cluster_dimension=cluster, max_concurrent_steps=3, grid_minor_dim=M,
                          grid_tile_width=8, **kw)
    x, w = jax.ShapeDtypeStruct((m, k), BF16), jax.ShapeDtypeStruct((k, n), BF16)
    b = jax.ShapeDtypeStruct((n,), jnp.float32)
    calls = [
        (lambda x, w: pm.plain_matmul(x, w, config=config), (x, w)),
        (lambda x, w, b: lz.lazy_layer_norm_matmul(x, [w], biases=[b], prenormalize=False,
                                                   config=config, return_row_stats=True),
         (x, w, b)),
    ]
    for fn, args in calls:
        with jax.sharding.use_abstract_mesh(H200):
            lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        assert "mosaic_gpu" in lowered.as_text()
