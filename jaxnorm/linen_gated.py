"""Flax Linen: a gated MLP's input layer, RMSNorm -> gate, up -> act(gate) * up, as one op.

`RMSNormGatedMLP(d_ff)` creates the parameters of
`jaxnorm.linen.RMSNormProjections({"gate": d_ff, "up": d_ff}, use_bias=False)`
(`norm/scale`, `gate/kernel`, `up/kernel`; biases with `use_bias=True`) and returns
act(gate) * up (`jaxnorm.rms_norm_gated_dense`). Dtypes as `jaxnorm.linen`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen.dtypes import canonicalize_dtype

from jaxnorm import gated
from jaxnorm.linen import _DenseParams, _NormDense, _NormParams
from jaxnorm.row_stats import RowStats

Array = jax.Array


class RMSNormGatedMLP(_NormDense):
    """act(RMSNorm(x) @ gate/kernel + gate/bias) * (RMSNorm(x) @ up/kernel + up/bias).

    Fields as `jaxnorm.linen.RMSNormDense` (`features` is d_ff), biases off by default.

    >>> mlp_in = RMSNormGatedMLP(256)
    >>> params = mlp_in.init(jax.random.key(0), jnp.ones((2, 64)))
    >>> h = mlp_in.apply(params, jnp.ones((2, 64)))  # [2, 256]
    """

    kind = "rms"
    use_bias: bool = False
    activation: str = "silu"

    @nn.compact
    def __call__(self, x: Array, statistics: RowStats | None = None) -> Array:
        """`statistics`: x's RowStats (from `ResidualDense`), the norm's row scale given."""
        k = jnp.shape(x)[-1]
        scale, _ = _NormParams(self.use_scale, False, nn.initializers.zeros_init(),
                               self.scale_init, self.param_dtype, name="norm")(k)
        (w_gate, b_gate), (w_up, b_up) = (
            _DenseParams(self.features, self.use_bias, self.kernel_init, self.bias_init,
                         self.param_dtype, name=name)(k) for name in ("gate", "up"))
        dtype = canonicalize_dtype(x, scale, w_gate, w_up, b_gate, b_up, dtype=self.dtype)
        params = [None if p is None else jnp.asarray(p, dtype)
                  for p in (x, w_gate, w_up, b_gate, b_up)]
        return gated.rms_norm_gated_dense(
            params[0], scale, *params[1:], activation=self.activation, eps=self.epsilon,
            scale_offset=self.scale_offset, impl=self.impl, statistics=statistics)
