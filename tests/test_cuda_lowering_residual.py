"""Cross-lowering of the residual GEMM (and the pre-norm GEMM fed its statistics) for "cuda".

As tests/test_cuda_lowering_dense.py: the Pallas -> Mosaic GPU lowering, layout
inference and the SMEM budget at real sizes, without a GPU or ptxas.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import jaxnorm
from pallas_kernels import hardware
from pallas_kernels import residual_matmul as rm

H200 = hardware.h200_mesh()
S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16

# (M, K, N): the model presets' o- and down-projections, and the bench's shapes.
SHAPES = [(8192, 4096, 4096), (8192, 14336, 4096), (8192, 2048, 2048), (8192, 8192, 2048),
          (8192, 2048, 3072), (130, 4096, 4096), (16, 4096, 4096)]


def _lower(fn, args) -> str:
    with jax.sharding.use_abstract_mesh(H200):
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    assert "mosaic_gpu" in text
    return text


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_residual_gemm_lowers_for_cuda(shape, bias):
    m, k, n = shape
    args = (S((m, k), BF16), S((k, n), BF16), S((m, n), BF16)) + ((S((n,), jnp.float32),)
                                                                  if bias else ())
    _lower(lambda x, w, r, *b: rm.residual_matmul(x, w, r, bias=b[0] if b else None), args)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_residual_then_pre_norm_with_statistics_lowers_for_cuda(kind):
    """o-projection writing h and its statistics, then the gate/up GEMM with a row scale."""
    m, d, f = 8192, 4096, 14336

    def block(a, w_o, r, g, w_up):
        h, stats = jaxnorm.residual_dense(a, w_o, r, impl="mosaic")
        if kind == "rms":
            return jaxnorm.rms_norm_dense(h, g, w_up, statistics=stats, impl="mosaic")
        return jaxnorm.layer_norm_dense(h, g, g, w_up, statistics=stats, impl="mosaic")

    text = _lower(block, (S((m, d), BF16), S((d, d), BF16), S((m, d), BF16),
                          S((d,), jnp.float32), S((d, f), BF16)))
    # Two kernel launches: the residual GEMM and the pre-norm GEMM.
    assert len(re.findall(r"custom_call @mosaic_gpu", text)) == 2
