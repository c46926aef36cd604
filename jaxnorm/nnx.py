"""Flax NNX layers: RMSNorm/LayerNorm fused into the Linear layers they feed (pre-norm)
or follow (post-norm: `LinearRMSNorm`, `LinearLayerNorm`, with an optional residual).

A fused layer is built from the modules it replaces: `layer.norm` is a norm with
the stock parameters (`scale`, LayerNorm's `bias`) and `layer.linear` (or one
child per name in the multi-projection layers) is a stock `nnx.Linear`. Calling
the layer reads their parameters and runs one fused op (Mosaic kernel on
Hopper, xla elsewhere); calling the children one by one is the unfused pair.
So the parameters have the stock names, shapes, initializers and dtypes, a
layer built from the same `Rngs` in the same order as the stock pair holds the
same values, and stock values load with one update per child:

    nnx.update(layer.norm, nnx.state(stock_norm))
    nnx.update(layer.linear, nnx.state(stock_linear))

Dtypes follow Flax's promotion: `dtype=None` computes and returns the common
type of the input and the parameters (bfloat16 x with float32 parameters gives
float32, as nnx.RMSNorm followed by nnx.Linear does); `dtype` forces the
computation dtype, parameters are cast to it as the stock layers do; statistics
are always float32. `scale_offset=1.0` is Gemma's (1 + scale) gain.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.dtypes import promote_dtype
from flax.typing import Dtype, Initializer

from jaxnorm import conventions, ops
from jaxnorm.residual import residual_dense
from jaxnorm.row_stats import RowStats

Array = jax.Array
_DEFAULT_KERNEL_INIT = nnx.initializers.lecun_normal()


class _Norm(nnx.Module):
    """The parameters and settings of one norm; `kind` picks RMSNorm or LayerNorm."""

    kind: str

    def __init__(self, num_features: int, *, epsilon: float, dtype: Dtype | None,
                 param_dtype: Dtype, use_scale: bool, use_bias: bool, scale_init: Initializer,
                 bias_init: Initializer, scale_offset: float, impl: str | None,
                 rngs: nnx.Rngs):
        # Same parameter order and rng draws as nnx.RMSNorm / nnx.LayerNorm.
        shape = (num_features,)
        self.scale = (nnx.Param(scale_init(rngs.params(), shape, param_dtype)) if use_scale
                      else nnx.data(None))
        self.bias = (nnx.Param(bias_init(rngs.params(), shape, param_dtype)) if use_bias
                     else nnx.data(None))
        self.num_features = num_features
        self.epsilon = epsilon
        self.dtype = dtype
        self.scale_offset = scale_offset
        self.impl = impl

    def params(self) -> tuple[Array | None, Array | None]:
        return (None if self.scale is None else self.scale[...],
                None if self.bias is None else self.bias[...])

    def __call__(self, x: Array) -> Array:
        scale, bias = self.params()
        x, scale, bias = promote_dtype((x, scale, bias), dtype=self.dtype)
        if self.kind == "rms":
            return ops.rms_norm(x, scale, eps=self.epsilon, scale_offset=self.scale_offset,
                                impl=self.impl)
        return ops.layer_norm(x, scale, bias, eps=self.epsilon, scale_offset=self.scale_offset,
                              impl=self.impl)


class RMSNorm(_Norm):
    """Drop-in for `nnx.RMSNorm` (same `scale` parameter) running `jaxnorm.rms_norm`.

    Useful where no matmul follows (QK-norm, a final norm before a tied head),
    and for Gemma's (1 + scale) gain via `scale_offset=1.0` (pass zeros as
    `scale_init` to start at unit gain). `convention` picks where 16-bit inputs
    round: "flax" (nnx.RMSNorm's promotion, the default), "hf_llama" (cast before
    the gain) or "gemma" (cast after it); see `jaxnorm.conventions`.

    >>> norm = RMSNorm(64, rngs=nnx.Rngs(0))
    >>> y = norm(jnp.ones((2, 64)))
    """

    kind = "rms"

    def __init__(self, num_features: int, *, epsilon: float = 1e-6, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, use_scale: bool = True,
                 scale_init: Initializer = nnx.initializers.ones, scale_offset: float = 0.0,
                 convention: str = "flax", impl: str | None = None, rngs: nnx.Rngs):
        super().__init__(num_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                         use_scale=use_scale, use_bias=False, scale_init=scale_init,
                         bias_init=nnx.initializers.zeros_init(), scale_offset=scale_offset,
                         impl=impl, rngs=rngs)
        self.convention = conventions.check_convention(convention)

    def __call__(self, x: Array) -> Array:
        return conventions.rms_norm_as(self.convention, x, self.params()[0], eps=self.epsilon,
                                       scale_offset=self.scale_offset, dtype=self.dtype,
                                       impl=self.impl)


class LayerNorm(_Norm):
    """Drop-in for `nnx.LayerNorm` (`scale`, `bias`) running `jaxnorm.layer_norm`.

    Statistics are shifted two-pass float32, so rows with a large mean keep
    their precision (stock Flax's fast variance does not).

    >>> norm = LayerNorm(64, rngs=nnx.Rngs(0))
    >>> y = norm(jnp.ones((2, 64)))
    """

    kind = "layer"

    def __init__(self, num_features: int, *, epsilon: float = 1e-6, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, use_scale: bool = True, use_bias: bool = True,
                 scale_init: Initializer = nnx.initializers.ones,
                 bias_init: Initializer = nnx.initializers.zeros_init(),
                 scale_offset: float = 0.0, impl: str | None = None, rngs: nnx.Rngs):
        super().__init__(num_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                         use_scale=use_scale, use_bias=use_bias, scale_init=scale_init,
                         bias_init=bias_init, scale_offset=scale_offset, impl=impl, rngs=rngs)


class _NormThenLinears(nnx.Module):
    """One norm (`self.norm`) feeding nnx.Linear children named by `out_features`."""

    def __init__(self, norm: _Norm, in_features: int, out_features: Mapping[str, int], *,
                 use_bias: bool, dtype: Dtype | None, param_dtype: Dtype,
                 kernel_init: Initializer, bias_init: Initializer, rngs: nnx.Rngs):
        if not out_features:
            raise ValueError("out_features must name at least one projection")
        self.dtype = dtype
        self.norm = norm
        self.names = tuple(out_features)
        for name, features in out_features.items():
            if not name.isidentifier() or hasattr(self, name):
                raise ValueError(f"projection name {name!r} is not a free attribute name")
            setattr(self, name, nnx.Linear(
                in_features, features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
                kernel_init=kernel_init, bias_init=bias_init, rngs=rngs))

    def _project(self, x: Array, statistics: RowStats | None = None,
                 return_input: bool = False) -> tuple[Array, ...]:
        linears = [getattr(self, name) for name in self.names]
        given = x
        kernels = [linear.kernel[...] for linear in linears]
        biases = [None if linear.bias is None else linear.bias[...] for linear in linears]
        scale, norm_bias = self.norm.params()
        x, scale, norm_bias, *params = promote_dtype(
            (x, scale, norm_bias, *kernels, *biases), dtype=self.dtype)
        kernels, biases = params[: len(linears)], params[len(linears):]
        bias = None if all(b is None for b in biases) else biases
        norm = self.norm
        common = dict(eps=norm.epsilon, scale_offset=norm.scale_offset, impl=norm.impl,
                      statistics=statistics)
        if norm.kind != "rms":
            return ops.layer_norm_dense(x, scale, norm_bias, kernels, bias, **common)
        if not return_input:
            return ops.rms_norm_dense(x, scale, kernels, bias, **common)
        if x.dtype != given.dtype:  # promoted: the stream keeps the x it was given
            return (*ops.rms_norm_dense(x, scale, kernels, bias, **common), given)
        outs, x_out = ops.rms_norm_dense(x, scale, kernels, bias, **common, return_input=True)
        return (*outs, x_out)


class RMSNormLinear(_NormThenLinears):
    """nnx.RMSNorm followed by nnx.Linear, fused: the norm is applied lazily in the GEMM.

    Parameters: `norm.scale` [in], `linear.kernel` [in, out], `linear.bias` [out].
    `use_scale=False` is the folded form (`jaxnorm.fold`): the gain lives in the kernel.

    >>> layer = RMSNormLinear(64, 128, rngs=nnx.Rngs(0))
    >>> x = jnp.ones((2, 64))
    >>> y = layer(x)  # layer.linear(layer.norm(x)) in one pass
    """

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
                 epsilon: float = 1e-6, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, use_scale: bool = True,
                 scale_init: Initializer = nnx.initializers.ones,
                 kernel_init: Initializer = _DEFAULT_KERNEL_INIT,
                 bias_init: Initializer = nnx.initializers.zeros_init(),
                 scale_offset: float = 0.0, impl: str | None = None, rngs: nnx.Rngs):
        norm = RMSNorm(in_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                       use_scale=use_scale, scale_init=scale_init, scale_offset=scale_offset,
                       impl=impl, rngs=rngs)
        super().__init__(norm, in_features, {"linear": out_features}, use_bias=use_bias,
                         dtype=dtype, param_dtype=param_dtype, kernel_init=kernel_init,
                         bias_init=bias_init, rngs=rngs)

    def __call__(self, x: Array, statistics: RowStats | None = None) -> Array:
        """`statistics`: x's RowStats (from `ResidualLinear`), the norm's row scale given."""
        return self._project(x, statistics)[0]


class RMSNormProjections(_NormThenLinears):
    """One RMSNorm feeding several named projections (q/k/v, gate/up): one statistics pass.

    Parameters: `norm.scale` and, per name, `<name>.kernel` / `<name>.bias`, as
    if an nnx.RMSNorm and one nnx.Linear per name had been built in that order.
    Returns a tuple in the order of `out_features`.

    >>> qkv = RMSNormProjections(64, {"q": 64, "k": 16, "v": 16}, use_bias=False,
    ...                          rngs=nnx.Rngs(0))
    >>> q, k, v = qkv(jnp.ones((2, 64)))
    """

    def __init__(self, in_features: int, out_features: Mapping[str, int], *,
                 use_bias: bool = True, epsilon: float = 1e-6, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, use_scale: bool = True,
                 scale_init: Initializer = nnx.initializers.ones,
                 kernel_init: Initializer = _DEFAULT_KERNEL_INIT,
                 bias_init: Initializer = nnx.initializers.zeros_init(),
                 scale_offset: float = 0.0, impl: str | None = None, rngs: nnx.Rngs):
        norm = RMSNorm(in_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                       use_scale=use_scale, scale_init=scale_init, scale_offset=scale_offset,
                       impl=impl, rngs=rngs)
        super().__init__(norm, in_features, out_features, use_bias=use_bias, dtype=dtype,
                         param_dtype=param_dtype, kernel_init=kernel_init, bias_init=bias_init,
                         rngs=rngs)

    def __call__(self, x: Array, statistics: RowStats | None = None, *,
                 return_input: bool = False) -> tuple[Array, ...]:
        """`statistics`: x's RowStats (from `ResidualLinear`), the norm's row scale given.
        `return_input=True` appends x, to add to the residual stream in its place
        (`jaxnorm.rms_norm_dense`): its cotangent then meets the norm's in one backward."""
        return self._project(x, statistics, return_input)


class LayerNormLinear(_NormThenLinears):
    """nnx.LayerNorm followed by nnx.Linear, fused (docs/design.md identity 2).

    Parameters: `norm.scale`, `norm.bias` [in], `linear.kernel`, `linear.bias`.
    `use_norm_bias`/`norm_bias_init` are the LayerNorm's `use_bias`/`bias_init`.

    >>> layer = LayerNormLinear(64, 128, rngs=nnx.Rngs(0))
    >>> y = layer(jnp.ones((2, 64)))
    """

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
                 epsilon: float = 1e-6, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, use_scale: bool = True,
                 use_norm_bias: bool = True, scale_init: Initializer = nnx.initializers.ones,
                 norm_bias_init: Initializer = nnx.initializers.zeros_init(),
                 kernel_init: Initializer = _DEFAULT_KERNEL_INIT,
                 bias_init: Initializer = nnx.initializers.zeros_init(),
                 scale_offset: float = 0.0, impl: str | None = None, rngs: nnx.Rngs):
        norm = LayerNorm(in_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                         use_scale=use_scale, use_bias=use_norm_bias, scale_init=scale_init,
                         bias_init=norm_bias_init, scale_offset=scale_offset, impl=impl,
                         rngs=rngs)
        super().__init__(norm, in_features, {"linear": out_features}, use_bias=use_bias,
                         dtype=dtype, param_dtype=param_dtype, kernel_init=kernel_init,
                         bias_init=bias_init, rngs=rngs)

    def __call__(self, x: Array, statistics: RowStats | None = None) -> Array:
        """`statistics`: x's RowStats (from `ResidualLinear`), the norm's row scale given."""
        return self._project(x, statistics)[0]


class LayerNormProjections(_NormThenLinears):
    """One LayerNorm feeding several named projections; see `RMSNormProjections`.

    >>> qkv = LayerNormProjections(64, {"q": 64, "k": 16, "v": 16}, rngs=nnx.Rngs(0))
    >>> q, k, v = qkv(jnp.ones((2, 64)))
    """

    def __init__(self, in_features: int, out_features: Mapping[str, int], *,
                 use_bias: bool = True, epsilon: float = 1e-6, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, use_scale: bool = True,
                 use_norm_bias: bool = True, scale_init: Initializer = nnx.initializers.ones,
                 norm_bias_init: Initializer = nnx.initializers.zeros_init(),
                 kernel_init: Initializer = _DEFAULT_KERNEL_INIT,
                 bias_init: Initializer = nnx.initializers.zeros_init(),
                 scale_offset: float = 0.0, impl: str | None = None, rngs: nnx.Rngs):
        norm = LayerNorm(in_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                         use_scale=use_scale, use_bias=use_norm_bias, scale_init=scale_init,
                         bias_init=norm_bias_init, scale_offset=scale_offset, impl=impl,
                         rngs=rngs)
        super().__init__(norm, in_features, out_features, use_bias=use_bias, dtype=dtype,
                         param_dtype=param_dtype, kernel_init=kernel_init, bias_init=bias_init,
                         rngs=rngs)

    def __call__(self, x: Array, statistics: RowStats | None = None) -> tuple[Array, ...]:
        """`statistics`: x's RowStats (from `ResidualLinear`), the norm's row scale given."""
        return self._project(x, statistics)


class _LinearThenNorm(nnx.Module):
    """A stock nnx.Linear (`self.linear`) whose outputs feed a norm (`self.norm`): the
    post-norm block Norm(x @ kernel + bias [+ residual]) as one op (`jaxnorm.dense_*_norm`)."""

    def __init__(self, linear: nnx.Linear, norm: _Norm, dtype: Dtype | None):
        self.linear = linear
        self.norm = norm
        self.dtype = dtype

    def __call__(self, x: Array, residual: Array | None = None) -> Array | tuple[Array, Array]:
        """y = Norm(linear(x) [+ residual]); with `residual`, (y, the pre-norm sum) so the
        sum can carry on as the residual stream."""
        kernel = self.linear.kernel[...]
        bias = None if self.linear.bias is None else self.linear.bias[...]
        scale, norm_bias = self.norm.params()
        x, residual, kernel, bias, scale, norm_bias = promote_dtype(
            (x, residual, kernel, bias, scale, norm_bias), dtype=self.dtype)
        common = dict(eps=self.norm.epsilon, scale_offset=self.norm.scale_offset,
                      residual=residual, impl=self.norm.impl)
        if self.norm.kind == "rms":
            return ops.dense_rms_norm(x, kernel, bias, scale, **common)
        return ops.dense_layer_norm(x, kernel, bias, scale, norm_bias, **common)


class LinearRMSNorm(_LinearThenNorm):
    """nnx.Linear followed by nnx.RMSNorm over its outputs, fused (docs/design.md identity 3).

    Parameters: `linear.kernel` [in, out], `linear.bias` [out], `norm.scale` [out], built
    in that order as the stock pair would be. `layer(x, residual)` adds a residual
    before the norm and returns (y, pre-norm sum). `scale_offset=1.0` is Gemma's
    (1 + scale) gain (Gemma 2's post-attention norm: `x + layer(attn)`).

    >>> layer = LinearRMSNorm(64, 128, rngs=nnx.Rngs(0))
    >>> x = jnp.ones((2, 64))
    >>> y = layer(x)  # layer.norm(layer.linear(x)) in one pass
    >>> y, h = layer(x, residual=jnp.ones((2, 128)))  # norm(linear(x) + residual), and the sum
    """

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
                 epsilon: float = 1e-6, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, use_scale: bool = True,
                 scale_init: Initializer = nnx.initializers.ones,
                 kernel_init: Initializer = _DEFAULT_KERNEL_INIT,
                 bias_init: Initializer = nnx.initializers.zeros_init(),
                 scale_offset: float = 0.0, impl: str | None = None, rngs: nnx.Rngs):
        linear = nnx.Linear(in_features, out_features, use_bias=use_bias, dtype=dtype,
                            param_dtype=param_dtype, kernel_init=kernel_init,
                            bias_init=bias_init, rngs=rngs)
        norm = RMSNorm(out_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                       use_scale=use_scale, scale_init=scale_init, scale_offset=scale_offset,
                       impl=impl, rngs=rngs)
        super().__init__(linear, norm, dtype)


class LinearLayerNorm(_LinearThenNorm):
    """nnx.Linear followed by nnx.LayerNorm over its outputs, fused; see `LinearRMSNorm`.

    Parameters: `linear.kernel`, `linear.bias`, `norm.scale`, `norm.bias`;
    `use_norm_bias`/`norm_bias_init` are the LayerNorm's `use_bias`/`bias_init`.

    >>> layer = LinearLayerNorm(64, 128, rngs=nnx.Rngs(0))
    >>> y = layer(jnp.ones((2, 64)))
    """

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool = True,
                 epsilon: float = 1e-6, dtype: Dtype | None = None,
                 param_dtype: Dtype = jnp.float32, use_scale: bool = True,
                 use_norm_bias: bool = True, scale_init: Initializer = nnx.initializers.ones,
                 norm_bias_init: Initializer = nnx.initializers.zeros_init(),
                 kernel_init: Initializer = _DEFAULT_KERNEL_INIT,
                 bias_init: Initializer = nnx.initializers.zeros_init(),
                 scale_offset: float = 0.0, impl: str | None = None, rngs: nnx.Rngs):
        linear = nnx.Linear(in_features, out_features, use_bias=use_bias, dtype=dtype,
                            param_dtype=param_dtype, kernel_init=kernel_init,
                            bias_init=bias_init, rngs=rngs)
        norm = LayerNorm(out_features, epsilon=epsilon, dtype=dtype, param_dtype=param_dtype,
                         use_scale=use_scale, use_bias=use_norm_bias, scale_init=scale_init,
                         bias_init=norm_bias_init, scale_offset=scale_offset, impl=impl,
                         rngs=rngs)
        super().__init__(linear, norm, dtype)


class ResidualLinear(nnx.Linear):
    """nnx.Linear whose output joins the residual stream: (h, stats) with
    h = x @ kernel + bias + residual and stats h's `RowStats` (`jaxnorm.residual_dense`),
    for the next pre-norm layer's `statistics=` (its norm then never reads h).

    Parameters and constructor are nnx.Linear's (`kernel`, `bias`); `impl` as the ops'.
    The residual is cast to the computation dtype with x.

    >>> o_proj = ResidualLinear(64, 32, rngs=nnx.Rngs(0))
    >>> h, stats = o_proj(jnp.ones((2, 64)), jnp.ones((2, 32)))
    >>> y = RMSNormLinear(32, 16, rngs=nnx.Rngs(1))(h, statistics=stats)
    """

    def __init__(self, in_features: int, out_features: int, *, impl: str | None = None,
                 **linear_kwargs):
        super().__init__(in_features, out_features, **linear_kwargs)
        self.impl = impl

    def __call__(  # type: ignore[override]
            self, x: Array, residual: Array) -> tuple[Array, RowStats]:
        kernel = self.kernel[...]
        bias = None if self.bias is None else self.bias[...]
        x, kernel, bias = promote_dtype((x, kernel, bias), dtype=self.dtype)
        return residual_dense(x, kernel, jnp.asarray(residual, x.dtype), bias, impl=self.impl)
