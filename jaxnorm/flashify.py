"""FlashNorm "flashify" of whole parameter trees: fold every norm into the projections it feeds.

A *norm group* is a node of a nested parameter dict holding a `norm` entry
(`scale`, and `bias` for LayerNorm) beside one or more projections (entries
with a `kernel`, optionally a `bias`) and nothing else: the layout of
`jaxnorm.nnx.RMSNormLinear`/`RMSNormProjections` (`norm`, `linear` or q/k/v,
gate/up, lm_head), of `jaxnorm.linen.RMSNormDense` (`norm`, `dense`) and of
`jaxnorm.models`. Each group is folded with `jaxnorm.fold`:

    RMSNorm:   W* = diag(g + offset) W                         norm gone
    LayerNorm: W* = diag(g + offset) W,  b* = beta @ W + b     norm params gone

What is not a group is left as it is, which is exactly what must not fold:
a tied LM head (its "kernel" is the input embedding, also used unnormalized),
post-sublayer norms (Gemma 2/3, OLMo 2: `attn/o_norm`, `down_norm`; the gain
scales a sum that joins the residual stream, which no later weight sees alone)
and QK-norm gains (the norm's statistics are taken on the projection's output,
so its gain cannot move into that weight; and RoPE between the norm and
q k^T stops docs/design.md identity 6 from merging the q and k gains into one diagonal
unless they agree on every rotated pair).

    folded = flashify(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    folded.params           # load into the same model built with use_scale=False norms
    unflashify(folded)      # the original tree again (within float32 rounding)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp

from jaxnorm import fold

Path = tuple[Any, ...]


class Flashified(NamedTuple):
    """A folded tree and what folding removed (the norms, per group path), for unflashify."""

    params: dict
    norms: dict[Path, dict]
    scale_offset: float


def _projections(node: Mapping) -> dict[str, Mapping] | None:
    """The projections of a norm group, or None if `node` is not one."""
    norm = node.get("norm")
    if not isinstance(norm, Mapping) or not (set(norm) <= {"scale", "bias"}) or len(node) < 2:
        return None
    rest = {k: v for k, v in node.items() if k != "norm"}
    if all(isinstance(v, Mapping) and "kernel" in v and set(v) <= {"kernel", "bias"}
           for v in rest.values()):
        return rest
    return None


def _fold_group(norm: Mapping, projections: dict[str, Mapping], offset: float) -> dict:
    scale, norm_bias = norm.get("scale"), norm.get("bias")
    folded = {}
    for name, p in projections.items():
        kernel, bias = p["kernel"], p.get("bias")
        if norm_bias is None:
            w = kernel if scale is None else fold.fold_gain(scale, kernel, offset)
            folded[name] = {"kernel": w} if bias is None else {"kernel": w, "bias": bias}
            continue
        f = fold.fold_layer_norm(scale, norm_bias, kernel, bias, offset)
        bias_dtype = jnp.result_type(kernel if bias is None else bias)
        folded[name] = {"kernel": f.kernel, "bias": f.bias.astype(bias_dtype)}
    return folded


def flashify(params: Mapping, *, scale_offset: float = 0.0) -> Flashified:
    """Fold every norm group of `params` (a nested dict of arrays); see the module docstring.

    `scale_offset=1.0` for Gemma's (1 + g) gains. Folding happens in float32
    and is cast back to each kernel's dtype. A LayerNorm bias folds into the
    projection's bias, so a projection without one gains one.
    """
    norms: dict[Path, dict] = {}

    def walk(node: Any, path: Path) -> Any:
        if not isinstance(node, Mapping):
            return node
        projections = _projections(node)
        if projections is None:
            return {k: walk(v, (*path, k)) for k, v in node.items()}
        norms[path] = {"norm": dict(node["norm"]),
                       "biasless": tuple(k for k, p in projections.items() if "bias" not in p)}
        return _fold_group(node["norm"], projections, scale_offset)

    return Flashified(walk(params, ()), norms, scale_offset)


def _unfold_group(folded: Mapping, record: dict, offset: float) -> dict:
    norm = record["norm"]
    scale, norm_bias = norm.get("scale"), norm.get("bias")
    group: dict = {"norm": dict(norm)}
    for name, p in folded.items():
        w = p["kernel"] if scale is None else fold.unfold_gain(scale, p["kernel"], offset)
        restored = {"kernel": w}
        if norm_bias is not None and name not in record["biasless"]:
            pushed = fold.fold_norm_bias(norm_bias, w)
            restored["bias"] = (p["bias"].astype(jnp.float32) - pushed).astype(p["bias"].dtype)
        elif norm_bias is None and "bias" in p:
            restored["bias"] = p["bias"]
        group[name] = restored
    return group


def unflashify(flashified: Flashified) -> dict:
    """The tree `flashify` started from: gains divided back out, LayerNorm biases pulled out.

    Exact up to float32 rounding (a gain of zero cannot be undone and raises).
    """
    def walk(node: Any, path: Path) -> Any:
        if path in flashified.norms:
            return _unfold_group(node, flashified.norms[path], flashified.scale_offset)
        if not isinstance(node, Mapping):
            return node
        return {k: walk(v, (*path, k)) for k, v in node.items()}

    return walk(flashified.params, ())
