"""Pure-JAX gated MLP input: what stock Flax computes for norm -> gate, up -> act(gate) * up.

The norm in float32 cast to x's dtype, one dot per weight in that dtype (as
`jaxnorm.backends.xla.rms_norm_dense`), then the activation and the product in
x's dtype, as `jaxnorm.models.layers.activation` and the MLP apply them.
"""

from __future__ import annotations

import functools

import jax

from jaxnorm.backends import xla
from jaxnorm.dispatch import register
from jaxnorm.row_stats import RowStats

Array = jax.Array
OP = "rms_norm_gated_dense"

# The gate's activation as stock Flax applies it (nnx.silu and nnx.gelu are jax.nn's).
ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}


@register(OP, "xla")
def rms_norm_gated_dense(x: Array, scale: Array | None, gate_kernel: Array, up_kernel: Array,
                         gate_bias: Array | None, up_bias: Array | None,
                         stats: RowStats | None = None, *, activation: str, eps: float,
                         scale_offset: float, return_input: bool = False
                         ) -> Array | tuple[Array, Array]:
    """With `stats` (x's rows' RowStats) the row scale comes from them, not from x.
    `return_input`: (the result, x) (`xla.rms_normalized_and_input`)."""
    gate, up, *x_out = xla.rms_norm_dense(x, scale, (gate_kernel, up_kernel),
                                          (gate_bias, up_bias), stats, eps=eps,
                                          scale_offset=scale_offset, return_input=return_input)
    y = ACTIVATIONS[activation](gate) * up
    return (y, *x_out) if return_input else y
