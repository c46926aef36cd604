"""Standalone RMSNorm / LayerNorm kernels under the Mosaic GPU interpreter, with race detection.

The kernels run on the CPU simulated warpgroup by warpgroup (bulk copies,
mbarriers, cluster barriers) with a vector-clock race detector. A row split
across a cluster exchanges its partial statistics through global scratch
here (the interpreter cannot run DSMEM); the GPU uses DSMEM, compile-checked
in test_cuda_lowering_norms.py and run by bench/gpu/check_kernels.py.
Inputs are fresh random draws, never zeros (a zero row appears only where it
is the point of the test).
"""

from __future__ import annotations


import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxnorm
from jaxnorm.dispatch import Unsupported
from pallas_kernels import hardware
from pallas_kernels import row_norm as rn
from verify.checks import check_op, check_outputs
from kernel_checks import assert_race_free

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)


def _rows(rng, m, k, dtype, mean_ratio=0.0):
    x = rng.standard_normal((m, k))
    if mean_ratio:
        x = x + mean_ratio * np.where(rng.random((m, 1)) < 0.5, -1.0, 1.0)
    return x.astype(dtype)


# (M, K, dtype): which path the heuristics take under the interpreter is noted.
RMS_CASES = [
    (8, 2048, BF16),  # 1 row per CTA
    (16, 512, BF16),  # 2 rows per CTA, no cluster
    (5, 1024, F16),  # odd M: 1 row per CTA
    (2, 3, 1024, F32),  # leading dims, flattened to M=6
    (3, 320, BF16),  # narrow row: 4-byte vectors, M padded to blocks of 4 rows
]


@pytest.mark.parametrize("case", RMS_CASES, ids=lambda c: "x".join(map(str, c[:-1])))
@pytest.mark.parametrize("with_scale", [True, False])
def test_rms_norm_matches_reference(rng, case, with_scale):
    *shape, dtype = case
    x = _rows(rng, int(np.prod(shape[:-1])), shape[-1], dtype).reshape(shape)
    scale = rng.standard_normal(shape[-1]).astype(F32) if with_scale else None
    check_op("rms_norm", "interpret", x=x, scale=scale, eps=1e-6, scale_offset=0.5)
    assert_race_free()


@pytest.mark.parametrize(
    "m, k, dtype, mean_ratio",
    [(8, 2048, BF16, 0.0), (16, 512, F16, 0.0), (4, 2048, F32, 1e4), (6, 1024, F32, 1e4)],
    ids=["bf16", "f16-rows", "f32-mean1e4", "f32-mean1e4-6rows"],
)
def test_layer_norm_matches_reference(rng, m, k, dtype, mean_ratio):
    """|mean| >> std rows keep their digits: shifted two-pass statistics."""
    x = _rows(rng, m, k, dtype, mean_ratio)
    scale = rng.standard_normal(k).astype(F32)
    bias = rng.standard_normal(k).astype(dtype)
    check_op("layer_norm", "interpret", x=x, scale=scale, bias=bias, eps=1e-5, scale_offset=0.0)
    assert_race_free()


@pytest.mark.parametrize(
    "config",
    [
        rn.RowNormConfig(block_m=4, cluster_k=2, chunk_k=256, transport="global"),
        rn.RowNormConfig(block_m=2, warps_per_row=2, cluster_k=2, chunk_k=512, transport="global"),
        rn.RowNormConfig(block_m=8, chunk_k=256),
    ],
    ids=["4rows-warp-per-row-cluster2", "2rows-2warps-cluster2", "8rows-4chunks"],
)
@pytest.mark.parametrize("kind", ["rms", "layer"])
@pytest.mark.parametrize("mean_ratio", [30.0, 1e4])
def test_explicit_configs(rng, config, kind, mean_ratio):
    """Layouts and splits the heuristics do not pick at interpreter sizes; rows split
    over a cluster Chan-combine their shifted partials (|mean| / std up to 1e4)."""
    m, k = 8, 1024
    x = _rows(rng, m, k, BF16, mean_ratio=mean_ratio)
    scale = rng.standard_normal(k).astype(BF16)
    bias = rng.standard_normal(k).astype(F32) if kind == "layer" else None
    y = rn.row_norm(jnp.asarray(x), jnp.asarray(scale), None if bias is None else jnp.asarray(bias),
                    kind=kind, eps=1e-6, scale_offset=1.0, config=config, interpret=True)
    assert_race_free()
    op = "rms_norm" if kind == "rms" else "layer_norm"
    assert check_outputs(op, y, x=x, scale=scale, bias=bias, eps=1e-6, scale_offset=1.0) <= 1.0


def test_zero_row_with_zero_eps_gives_zeros(rng):
    """rsqrt(0) is never formed: a zero row normalizes to zeros, not NaN (as the references)."""
    x = _rows(rng, 8, 2048, BF16)
    x[3] = 0
    check_op("rms_norm", "interpret", x=x, eps=0.0)
    check_op("layer_norm", "interpret", x=x, eps=0.0)
    assert_race_free()


# ------------------------------------------------------------------- heuristics

H200_SMS = hardware.H200_SMS


@pytest.mark.parametrize(
    "m, k, dtype",
    [(8192, 4096, BF16), (4096, 16384, BF16), (16, 8192, BF16), (64, 65536, F32),
     (1, 4096, F16), (3, 12288, F32), (32768, 1024, BF16), (16, 512, BF16), (4096, 4096, F32)],
)
def test_select_config_gives_valid_configs(m, k, dtype):
    config = rn.select_config(m, k, dtype, num_sms=H200_SMS)
    rn.check_shape(m, k, dtype, config)
    tile_bytes = config.block_m * k // config.cluster_k * np.dtype(dtype).itemsize
    assert tile_bytes <= 192 * 1024


def test_rows_split_across_a_cluster_only_when_too_wide_for_one_cta():
    """Measured on the H200: splitting for occupancy never helped, so few rows stay whole."""
    few = rn.select_config(16, 8192, BF16, num_sms=H200_SMS)
    assert few.cluster_k == 1
    many_rows = rn.select_config(8192, 4096, BF16, num_sms=H200_SMS)
    assert many_rows.cluster_k == 1 and many_rows.block_m == 2
    wide = rn.select_config(16, 65536, BF16, num_sms=H200_SMS)  # 128 KiB rows
    assert wide.cluster_k == 4
    capped = rn.select_config(16, 65536, BF16, num_sms=H200_SMS, max_cluster=2)
    assert capped.cluster_k == 2


def test_shape_errors_name_the_dimension():
    with pytest.raises(Unsupported, match="M=6 must be divisible by block_m=4"):
        rn.check_shape(6, 1024, BF16, rn.RowNormConfig(block_m=4, chunk_k=256))
    with pytest.raises(Unsupported, match="K / cluster_k = 512 must be divisible by chunk_k=1024"):
        rn.check_shape(8, 1024, BF16, rn.RowNormConfig(block_m=4, cluster_k=2, chunk_k=1024))
    with pytest.raises(ValueError, match="block_m=2 must be a multiple of 4"):
        rn.RowNormConfig(block_m=2)


def test_unserved_width_raises_unsupported(rng):
    x = _rows(rng, 4, 100, BF16)
    with pytest.raises(Unsupported, match="no split of 4 x 100 rows"):
        jaxnorm.rms_norm(x, impl="interpret")
    # Dispatch with impl=None serves it (xla), judged against the float64 reference.
    assert check_op("rms_norm", None, x=x) <= 1.0
