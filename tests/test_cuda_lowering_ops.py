"""impl="mosaic" through jaxnorm's public ops on a CPU host: Unsupported with the reason when
run here, and a CUDA lowering when compiled for "cuda" (no abstract mesh, no GPU attached)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxnorm

S = jax.ShapeDtypeStruct
BF16 = jnp.bfloat16
M, K, N = 256, 512, 512

# Every op with its avals; the kernel-sized shapes each Mosaic kernel serves.
OPS = {
    "rms_norm": (lambda x, g: jaxnorm.rms_norm(x, g, impl="mosaic"), (S((M, K), BF16),
                                                                      S((K,), jnp.float32))),
    "layer_norm": (lambda x, g: jaxnorm.layer_norm(x, g, g, impl="mosaic"),
                   (S((M, K), BF16), S((K,), jnp.float32))),
    "rms_norm_dense": (lambda x, g, w: jaxnorm.rms_norm_dense(x, g, w, impl="mosaic"),
                       (S((M, K), BF16), S((K,), jnp.float32), S((K, N), BF16))),
    "layer_norm_dense": (lambda x, g, w: jaxnorm.layer_norm_dense(x, g, g, w, impl="mosaic"),
                         (S((M, K), BF16), S((K,), jnp.float32), S((K, N), BF16))),
    "dense_rms_norm": (lambda x, w, g: jaxnorm.dense_rms_norm(x, w, g, g, impl="mosaic"),
                       (S((M, K), BF16), S((K, N), BF16), S((N,), jnp.float32))),
    "dense_layer_norm": (lambda x, w, g: jaxnorm.dense_layer_norm(x, w, g, g, g, impl="mosaic"),
                         (S((M, K), BF16), S((K, N), BF16), S((N,), jnp.float32))),
}


def _concrete(avals, seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), len(avals))
    return [jax.random.normal(key, a.shape, a.dtype) for key, a in zip(keys, avals)]


@pytest.mark.parametrize("op", list(OPS))
def test_mosaic_off_a_gpu_raises_unsupported_with_the_reason(op):
    fn, avals = OPS[op]
    args = _concrete(avals)
    for run in (lambda: fn(*args), lambda: jax.jit(fn)(*args)):
        with pytest.raises(jaxnorm.Unsupported, match=rf"{op}: impl='mosaic' .* compiled for cpu"):
            run()


@pytest.mark.parametrize("op", list(OPS))
def test_mosaic_lowers_for_cuda_from_a_cpu_host(op):
    fn, avals = OPS[op]
    text = jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text
