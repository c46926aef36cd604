"""Mosaic GPU backend of `residual_dense`: the residual GEMM of pallas_kernels.

Serves bfloat16/float16 x with a kernel and residual of x's dtype, K a multiple
of 64 and N a multiple of the GEMM's CTA tile (256 at prefill shapes), any M >= 1;
anything else raises `Unsupported` with the reason and dispatch falls back to
xla. The kernel's [P, M] partials are combined here, in XLA (M-sized work), by
Chan's formula (`jaxnorm.row_stats.from_partials`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxnorm import row_stats
from jaxnorm.backends.mosaic_device import on_gpu_only
from jaxnorm.dispatch import decline_automatic, register
from pallas_kernels import gemm_config
from pallas_kernels import residual_matmul as rm
from pallas_kernels.errors import Unsupported

Array = jax.Array

# The (M, K, N) the GPU bench measures (`python -m bench --suite residual-gemm`): the only
# shapes impl=None hands the kernel until measurements say where it wins.
BENCH_SHAPES = frozenset((8192, k, n) for k, n in ((4096, 4096), (14336, 4096), (2048, 2048),
                                                      (8192, 2048), (2048, 3072)))


@register("residual_dense", "mosaic")
def residual_dense(x: Array, kernel: Array, bias: Array | None, residual: Array, *,
                   interpret: bool) -> tuple[Array, Array, Array]:
    if x.dtype not in (jnp.bfloat16, jnp.float16):
        raise Unsupported(f"x dtype {x.dtype} not served by the Mosaic GEMM (bfloat16, float16)")
    if x.shape[0] == 0:
        raise Unsupported("M=0 (empty leading dimensions)")
    if kernel.dtype != x.dtype:
        raise Unsupported(f"kernel dtype {kernel.dtype} differs from x dtype {x.dtype}; casting "
                          "the weights per call would copy them")
    x = x if interpret else on_gpu_only(x, "residual_dense")
    m, k = x.shape
    config = rm.residual_config(m, k, kernel.shape[1], itemsize=jnp.dtype(x.dtype).itemsize)
    h, (sums, m2s) = rm.residual_matmul(x, kernel, residual, bias=bias, config=config,
                                        interpret=interpret)
    mean, m2 = row_stats.from_partials(sums, m2s, gemm_config.part_columns(kernel.shape[1],
                                                                           config))
    return h, mean, m2


@decline_automatic("residual_dense")
def _not_measured(x, kernel, bias, residual, **kwargs) -> str | None:
    shape = (x.shape[0], x.shape[1], kernel.shape[1])
    if shape in BENCH_SHAPES:
        return None
    return (f"residual GEMM at M, K, N = {shape} is not measured against XLA's x @ w + r yet "
            "(impl=None uses it only at the shapes `python -m bench --suite residual-gemm` "
            "times); impl='mosaic' forces it")
