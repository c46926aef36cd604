"""Cross-lowering of the gated gate/up kernel for "cuda" on a machine without a GPU, at the
model presets' MLP shapes (M x K x (d_ff + d_ff)) and a decode shape: the Pallas -> Mosaic GPU
lowering, layout inference and the SMEM budget (not ptxas). SM count: an H200 abstract mesh."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxnorm
from pallas_kernels import gated_matmul as gm
from pallas_kernels import hardware

H200 = hardware.h200_mesh()
S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16
PRESETS = [(8192, 2048, 8192), (8192, 4096, 14336), (4096, 1024, 3072), (8192, 2560, 9728)]


def _lower(fn, args) -> None:
    with jax.sharding.use_abstract_mesh(H200):
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


@pytest.mark.parametrize("shape", PRESETS + [(16, 2048, 8192), (1, 1024, 3072)],
                         ids=lambda s: "x".join(map(str, s)))
def test_kernel_lowers_for_cuda(shape):
    m, k, n = shape
    args = (S((m, k), BF16), S((k, n), BF16), S((k, n), BF16), S((k,), jnp.float32),
            S((n,), jnp.float32))
    _lower(lambda x, wg, wu, g, b: gm.gated_rms_matmul(x, wg, wu, scale=g, scale_offset=1.0,
                                                       gate_bias=b, up_bias=b), args)


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_each_activation_lowers_through_the_op(activation):
    m, k, n = PRESETS[2]
    args = (S((m, k), BF16), S((k,), jnp.float32), S((k, n), BF16), S((k, n), BF16))
    _lower(lambda x, g, wg, wu: jaxnorm.rms_norm_gated_dense(x, g, wg, wu, activation=activation,
                                                             impl="mosaic"), args)
