"""Flax NNX: a gated MLP's input layer, RMSNorm -> gate, up -> act(gate) * up, as one op.

`RMSNormGatedMLP(d, d_ff)` has the parameter tree of
`jaxnorm.nnx.RMSNormProjections(d, {"gate": d_ff, "up": d_ff}, use_bias=False)`
(`norm/scale`, `gate/kernel`, `up/kernel`; `gate/bias`, `up/bias` with
`use_bias=True`), built in the same order from the same `Rngs`, so a model's
`mlp_in` parameters load unchanged; it returns act(gate) * up instead of (gate, up)
(`jaxnorm.rms_norm_gated_dense`). Dtypes as `jaxnorm.nnx`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.dtypes import promote_dtype
from flax.typing import Dtype, Initializer

from jaxnorm import gated
from jaxnorm.nnx import RMSNormProjections
from jaxnorm.row_stats import RowStats

Array = jax.Array


class RMSNormGatedMLP(RMSNormProjections):
    """act(RMSNorm(x) @ gate.kernel + gate.bias) * (RMSNorm(x) @ up.kernel + up.bias).

    `activation`: "silu" (SwiGLU), "gelu_tanh" (GeGLU, Gemma) or "gelu".

    >>> mlp_in = RMSNormGatedMLP(64, 256, rngs=nnx.Rngs(0))
    >>> h = mlp_in(jnp.ones((2, 64)))  # [2, 256]
    """

    def __init__(self, in_features: int, hidden_features: int, *, activation: str = "silu",
                 use_bias: bool = False, epsilon: float = 1e-6, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, use_scale: bool = True,
                 scale_init: Initializer = nnx.initializers.ones,
                 kernel_init: Initializer = nnx.initializers.lecun_normal(),
                 bias_init: Initializer = nnx.initializers.zeros_init(),
                 scale_offset: float = 0.0, impl: str | None = None, rngs: nnx.Rngs):
        if activation not in gated.ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(gated.ACTIVATIONS)}; "
                             f"got {activation!r}")
        super().__init__(in_features, {"gate": hidden_features, "up": hidden_features},
                         use_bias=use_bias, epsilon=epsilon, dtype=dtype,
                         param_dtype=param_dtype, use_scale=use_scale, scale_init=scale_init,
                         kernel_init=kernel_init, bias_init=bias_init,
                         scale_offset=scale_offset, impl=impl, rngs=rngs)
        self.activation = activation

    def __call__(self, x: Array,  # type: ignore[override]
                 statistics: RowStats | None = None) -> Array:
        """`statistics`: x's RowStats (from `ResidualLinear`), the norm's row scale given."""
        scale, _ = self.norm.params()
        params = [None if p is None else p[...] for p in (
            self.gate.kernel, self.up.kernel, self.gate.bias, self.up.bias)]
        x, scale, *params = promote_dtype((x, scale, *params), dtype=self.dtype)
        return gated.rms_norm_gated_dense(
            x, scale, *params, activation=self.activation, eps=self.norm.epsilon,
            scale_offset=self.norm.scale_offset, impl=self.norm.impl, statistics=statistics)
