"""jaxnorm: RMSNorm and LayerNorm fused into the matrix products around them.

Functional ops (x is [..., K]; output dtype follows x; float32 statistics):
`rms_norm`, `layer_norm`, `rms_norm_dense`, `layer_norm_dense` (pre-norm),
`dense_rms_norm`, `dense_layer_norm` (post-norm); `residual_dense` (h = x @ W + b + r
and h's `RowStats`, which the pre-norm ops take as `statistics=`); `rms_norm_gated_dense`
(a gated MLP's input: act(gate) * up from one norm and two kernels);
`rms_norm_attention_input` (a QK-norm model's q, k, v: norm, three products, per-head
QK-norm, RoPE). `jaxnorm.fold` folds norm
gains into the weights they feed; `jaxnorm.flashify` does it for a whole
parameter tree. `impl` picks the implementation: None
(automatic), "xla", "mosaic" or "interpret".
"""

from jaxnorm import flashify, fold
from jaxnorm.attention_input import rms_norm_attention_input
from jaxnorm.dispatch import Unsupported, fallback_reasons
from jaxnorm.gated import rms_norm_gated_dense
from jaxnorm.ops import (
    dense_layer_norm,
    dense_rms_norm,
    layer_norm,
    layer_norm_dense,
    rms_norm,
    rms_norm_dense,
)
from jaxnorm.residual import residual_dense
from jaxnorm.row_stats import RowStats

__all__ = [
    "RowStats",
    "Unsupported",
    "dense_layer_norm",
    "dense_rms_norm",
    "fallback_reasons",
    "flashify",
    "fold",
    "layer_norm",
    "layer_norm_dense",
    "residual_dense",
    "rms_norm",
    "rms_norm_attention_input",
    "rms_norm_dense",
    "rms_norm_gated_dense",
]
