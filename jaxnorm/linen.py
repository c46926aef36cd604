"""Flax Linen layers: RMSNorm/LayerNorm fused into the Dense layer they feed (pre-norm),
or follow (post-norm: `DenseRMSNorm`, `DenseLayerNorm`, with an optional residual).

`RMSNormDense(features)` replaces `nn.RMSNorm()` followed by `nn.Dense(features)`;
`RMSNormProjections({"q": ..., "k": ..., "v": ...})` one norm followed by one
`nn.Dense` per name (children `norm` and one scope per name).
Its parameters sit in two child scopes with the stock names, shapes,
initializers and dtypes, `norm` ({scale} or {scale, bias}) and `dense`
({kernel, bias}), as if the stock pair had been created with
`name="norm"` / `name="dense"`, so stock values load with one mapping:

    params = {"norm": stock["RMSNorm_0"], "dense": stock["Dense_0"]}

(the left names are the stock pair's, here Flax's automatic ones). Dtypes
follow Linen: the output and the dot use the common type of x and the
parameters (or `dtype` when given); the gain stays in its parameter dtype and
statistics are float32. `scale_offset=1.0` is Gemma's (1 + scale) gain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen.dtypes import canonicalize_dtype
from flax.typing import Dtype, Initializer

from jaxnorm import conventions, ops
from jaxnorm.residual import residual_dense
from jaxnorm.row_stats import RowStats

Array = jax.Array


class _NormParams(nn.Module):
    """A norm's parameters, created as nn.RMSNorm / nn.LayerNorm create them."""

    use_scale: bool
    use_bias: bool
    bias_init: Initializer
    scale_init: Initializer
    param_dtype: Dtype

    @nn.compact
    def __call__(self, k: int) -> tuple[Array | None, Array | None]:
        scale = self.param("scale", self.scale_init, (k,), self.param_dtype) if self.use_scale \
            else None
        bias = self.param("bias", self.bias_init, (k,), self.param_dtype) if self.use_bias \
            else None
        return scale, bias


class _DenseParams(nn.Module):
    """A dense layer's parameters, created as nn.Dense creates them."""

    features: int
    use_bias: bool
    kernel_init: Initializer
    bias_init: Initializer
    param_dtype: Dtype

    @nn.compact
    def __call__(self, k: int) -> tuple[Array, Array | None]:
        kernel = self.param("kernel", self.kernel_init, (k, self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) \
            if self.use_bias else None
        return kernel, bias


class _NormDense(nn.Module):
    """Shared fields and call of the fused norm + dense layers."""

    kind: ClassVar[str]

    features: int
    use_bias: bool = True
    epsilon: float = 1e-6
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    use_scale: bool = True
    scale_offset: float = 0.0
    scale_init: Initializer = nn.initializers.ones
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()
    impl: str | None = None

    def _norm_bias(self) -> tuple[bool, Initializer]:
        """(use_bias, bias_init) of the norm; only LayerNorm has a bias."""
        return False, nn.initializers.zeros_init()

    def _projections(self) -> dict[str, int]:
        """Child scope name -> output features of each projection the norm feeds."""
        return {"dense": self.features}

    def _result(self, outputs: tuple[Array, ...]) -> Array | tuple[Array, ...]:
        return outputs[0]

    @nn.compact
    def __call__(self, x: Array,
                 statistics: RowStats | None = None) -> Array | tuple[Array, ...]:
        """`statistics`: x's RowStats (from `ResidualDense`), the norm's row scale given."""
        k = jnp.shape(x)[-1]
        scale, norm_bias = _NormParams(self.use_scale, *self._norm_bias(), self.scale_init,
                                       self.param_dtype, name="norm")(k)
        params = [_DenseParams(features, self.use_bias, self.kernel_init, self.bias_init,
                               self.param_dtype, name=name)(k)
                  for name, features in self._projections().items()]
        kernels = [kernel for kernel, _ in params]
        biases = [bias for _, bias in params]
        dtype = canonicalize_dtype(x, scale, norm_bias, *kernels, *biases, dtype=self.dtype)
        x = jnp.asarray(x, dtype)
        kernels = [jnp.asarray(kernel, dtype) for kernel in kernels]
        biases = None if not self.use_bias else [jnp.asarray(b, dtype) for b in biases]
        common = dict(eps=self.epsilon, scale_offset=self.scale_offset, impl=self.impl,
                      statistics=statistics)
        if self.kind == "rms":
            outputs = ops.rms_norm_dense(x, scale, kernels, biases, **common)
        else:
            outputs = ops.layer_norm_dense(x, scale, norm_bias, kernels, biases, **common)
        return self._result(outputs)


class RMSNormDense(_NormDense):
    """nn.RMSNorm followed by nn.Dense, fused: the norm is applied lazily in the GEMM.

    Parameters: `norm/scale` [in], `dense/kernel` [in, features], `dense/bias`.
    `use_scale=False` is the folded form (`jaxnorm.fold`).

    >>> layer = RMSNormDense(128)
    >>> params = layer.init(jax.random.key(0), jnp.ones((2, 64)))
    >>> y = layer.apply(params, jnp.ones((2, 64)))
    """

    kind = "rms"


class LayerNormDense(_NormDense):
    """nn.LayerNorm followed by nn.Dense, fused (docs/design.md identity 2).

    Parameters: `norm/scale`, `norm/bias` [in], `dense/kernel`, `dense/bias`;
    `use_norm_bias` / `norm_bias_init` are the LayerNorm's `use_bias` / `bias_init`.

    >>> layer = LayerNormDense(128)
    >>> params = layer.init(jax.random.key(0), jnp.ones((2, 64)))
    >>> y = layer.apply(params, jnp.ones((2, 64)))
    """

    kind = "layer"
    use_norm_bias: bool = True
    norm_bias_init: Initializer = nn.initializers.zeros_init()

    def _norm_bias(self) -> tuple[bool, Initializer]:
        return self.use_norm_bias, self.norm_bias_init


class _NormProjections(_NormDense):
    """One norm feeding several named nn.Dense projections (q/k/v, gate/up)."""

    features: Mapping[str, int]  # type: ignore[assignment]  # name -> output features

    def _projections(self) -> dict[str, int]:
        names = dict(self.features)
        if not names:
            raise ValueError("features must name at least one projection")
        for name in names:
            if name == "norm" or not name.isidentifier():
                raise ValueError(f"projection name {name!r} must be an identifier other than "
                                 "'norm' (the norm's scope)")
        return names

    def _result(self, outputs: tuple[Array, ...]) -> tuple[Array, ...]:
        return outputs


class RMSNormProjections(_NormProjections):
    """One RMSNorm feeding several named projections: one statistics pass for all of them.

    Parameters: `norm/scale` and, per name, `<name>/kernel`, `<name>/bias`, as
    an nn.RMSNorm named "norm" and one nn.Dense per name would create them, so
    stock values load as `{"norm": stock_norm, "q": stock_q, ...}`. Returns a
    tuple in the order of `features`. The NNX twin is `jaxnorm.nnx.RMSNormProjections`.

    >>> qkv = RMSNormProjections({"q": 64, "k": 16, "v": 16}, use_bias=False)
    >>> params = qkv.init(jax.random.key(0), jnp.ones((2, 64)))
    >>> q, k, v = qkv.apply(params, jnp.ones((2, 64)))
    """

    kind = "rms"


class LayerNormProjections(_NormProjections):
    """One LayerNorm feeding several named projections; see `RMSNormProjections`.

    Parameters: `norm/scale`, `norm/bias`, and per name `<name>/kernel`, `<name>/bias`;
    `use_norm_bias` / `norm_bias_init` are the LayerNorm's `use_bias` / `bias_init`.

    >>> qkv = LayerNormProjections({"q": 64, "k": 16, "v": 16})
    >>> params = qkv.init(jax.random.key(0), jnp.ones((2, 64)))
    >>> q, k, v = qkv.apply(params, jnp.ones((2, 64)))
    """

    kind = "layer"
    use_norm_bias: bool = True
    norm_bias_init: Initializer = nn.initializers.zeros_init()

    def _norm_bias(self) -> tuple[bool, Initializer]:
        return self.use_norm_bias, self.norm_bias_init


class _DenseNorm(_NormDense):
    """nn.Dense followed by a norm over its outputs: Norm(x @ kernel + bias [+ residual])."""

    @nn.compact
    def __call__(self, x: Array, residual: Array | None = None) -> Array | tuple[Array, Array]:
        """y; with `residual` (added before the norm), (y, the pre-norm sum) for the stream."""
        kernel, bias = _DenseParams(self.features, self.use_bias, self.kernel_init,
                                    self.bias_init, self.param_dtype, name="dense")(
            jnp.shape(x)[-1])
        scale, norm_bias = _NormParams(self.use_scale, *self._norm_bias(), self.scale_init,
                                       self.param_dtype, name="norm")(self.features)
        dtype = canonicalize_dtype(x, residual, kernel, bias, scale, norm_bias, dtype=self.dtype)
        x, kernel = jnp.asarray(x, dtype), jnp.asarray(kernel, dtype)
        bias = None if bias is None else jnp.asarray(bias, dtype)
        residual = None if residual is None else jnp.asarray(residual, dtype)
        common = dict(eps=self.epsilon, scale_offset=self.scale_offset, residual=residual,
                      impl=self.impl)
        if self.kind == "rms":
            return ops.dense_rms_norm(x, kernel, bias, scale, **common)
        return ops.dense_layer_norm(x, kernel, bias, scale, norm_bias, **common)


class DenseRMSNorm(_DenseNorm):
    """nn.Dense followed by nn.RMSNorm over its outputs, fused (docs/design.md identity 3).

    Parameters: `dense/kernel` [in, features], `dense/bias`, `norm/scale` [features].
    `layer.apply(params, x, residual)` adds the residual before the norm and returns
    (y, pre-norm sum).

    >>> layer = DenseRMSNorm(128)
    >>> params = layer.init(jax.random.key(0), jnp.ones((2, 64)))
    >>> y = layer.apply(params, jnp.ones((2, 64)))
    """

    kind = "rms"


class DenseLayerNorm(_DenseNorm):
    """nn.Dense followed by nn.LayerNorm over its outputs, fused; see `DenseRMSNorm`.

    Parameters: `dense/kernel`, `dense/bias`, `norm/scale`, `norm/bias`;
    `use_norm_bias` / `norm_bias_init` are the LayerNorm's `use_bias` / `bias_init`.
    """

    kind = "layer"
    use_norm_bias: bool = True
    norm_bias_init: Initializer = nn.initializers.zeros_init()

    def _norm_bias(self) -> tuple[bool, Initializer]:
        return self.use_norm_bias, self.norm_bias_init


class ResidualDense(nn.Dense):
    """nn.Dense whose output joins the residual stream: `(h, stats)` with
    h = x @ kernel + bias + residual and stats h's `RowStats` (`jaxnorm.residual_dense`),
    for the next pre-norm layer's `statistics=`. Parameters are nn.Dense's (`kernel`,
    `bias`); `impl` as the ops'. The residual is cast to the computation dtype with x.

    >>> layer = ResidualDense(32)
    >>> x, r = jnp.ones((2, 64)), jnp.ones((2, 32))
    >>> params = layer.init(jax.random.key(0), x, r)
    >>> h, stats = layer.apply(params, x, r)
    """

    impl: str | None = None

    @nn.compact
    def __call__(  # type: ignore[override]
            self, inputs: Array, residual: Array) -> tuple[Array, RowStats]:
        kernel = self.param("kernel", self.kernel_init, (jnp.shape(inputs)[-1], self.features),
                            self.param_dtype)
        bias = (self.param("bias", self.bias_init, (self.features,), self.param_dtype)
                if self.use_bias else None)
        dtype = canonicalize_dtype(inputs, kernel, bias, dtype=self.dtype)
        return residual_dense(jnp.asarray(inputs, dtype), jnp.asarray(kernel, dtype),
                              jnp.asarray(residual, dtype),
                              None if bias is None else jnp.asarray(bias, dtype), impl=self.impl)


class RMSNorm(nn.Module):
    """Drop-in for `nn.RMSNorm` (one `scale` parameter) running `jaxnorm.rms_norm`, with the
    rounding `convention` of the implementation a checkpoint came from: "flax" (nn.RMSNorm's
    promotion, the default), "hf_llama" (cast before the gain) or "gemma" (cast after it);
    see `jaxnorm.conventions`. `scale_offset=1.0` is Gemma's (1 + scale) gain.

    >>> norm = RMSNorm(convention="hf_llama")
    >>> params = norm.init(jax.random.key(0), jnp.ones((2, 64)))
    """

    epsilon: float = 1e-6
    dtype: Dtype | None = None
    param_dtype: Dtype = jnp.float32
    use_scale: bool = True
    scale_init: Initializer = nn.initializers.ones
    scale_offset: float = 0.0
    convention: str = "flax"
    impl: str | None = None

    @nn.compact
    def __call__(self, x: Array) -> Array:
        conventions.check_convention(self.convention)
        shape = (jnp.shape(x)[-1],)
        scale = self.param("scale", self.scale_init, shape, self.param_dtype) if self.use_scale \
            else None
        return conventions.rms_norm_as(self.convention, jnp.asarray(x), scale, eps=self.epsilon,
                                       scale_offset=self.scale_offset, dtype=self.dtype,
                                       impl=self.impl)
