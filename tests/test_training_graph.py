"""A training step of jaxnorm's model, where automatic dispatch takes no kernel, lowers to
stock's reductions shape for shape: the xla path computes on x in the caller's shape
(jaxnorm/callers_rows.py), so XLA compiles what it compiles for stock Flax."""

import collections
import re

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from bench import decode_plan, model_suite
from jaxnorm import models

_REDUCE = re.compile(r"stablehlo\.reduce\(.*?\) applies stablehlo\.(\w+) across dimensions = "
                     r"\[([\d, ]+)\] : \((tensor<[^>]*>)")


def training_step_reductions(shape: model_suite.ModelShape, *, fused: bool,
                             planned_for_h200: bool) -> collections.Counter:
    """(reducer, dimensions, operand type) of every reduction in the lowered training step
    (loss, gradients, an AdamW update), from abstract parameters, but those over unit
    dimensions only."""
    text = lowered_training_step(shape, fused=fused, planned_for_h200=planned_for_h200)
    return collections.Counter(r for r in _REDUCE.findall(text) if not _over_unit_dims(*r))


def lowered_training_step(shape: model_suite.ModelShape, *, fused: bool,
                          planned_for_h200: bool) -> str:
    """The training step (loss, gradients, an AdamW update) lowered for "cuda", as text."""
    cfg = shape.cfg.replace(fused=fused, impl=None)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: models.Transformer(cfg,
                                                                          rngs=nnx.Rngs(0))))
    optimizer = optax.adamw(1e-4)
    batch, length = shape.train
    step = model_suite.train_step(graphdef, optimizer)
    args = (state, jax.eval_shape(optimizer.init, state),
            jax.ShapeDtypeStruct((batch, length + 1), jnp.int32))
    mesh = (jax.sharding.use_abstract_mesh(decode_plan.H200) if planned_for_h200
            else jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())))
    with mesh:
        return jax.jit(step).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _over_unit_dims(reducer: str, dims: str, operand: str) -> bool:
    """A reduction over dimensions of size 1 only: a reshape to XLA, which compiles none."""
    sizes = [int(d) for d in re.findall(r"(\d+)x", operand)]
    return all(sizes[int(d)] == 1 for d in dims.split(","))


@pytest.mark.parametrize("name", ["gemma3-1b", "qwen3-0.6b", "llama3.2-1b"])
def test_training_step_reduces_what_stock_reduces(name):
    """With every kernel declined (this host): the same reductions as stock, operand for
    operand, so falling back costs nothing. On a 132-SM GPU the presets take RMSNorm's
    backward kernel, which replaces stock's backward reductions by its own."""
    shape = model_suite.SHAPES[name]
    stock = training_step_reductions(shape, fused=False, planned_for_h200=False)
    jaxnorm = training_step_reductions(shape, fused=True, planned_for_h200=False)
    assert sum(stock.values()) > 40
    assert jaxnorm == stock, (jaxnorm - stock, stock - jaxnorm)


def test_gemma_training_step_takes_the_backward_kernel():
    """As a 132-SM GPU dispatches it, Gemma-3-1B's training step runs RMSNorm's backward
    kernel at its 25 d_model norms (2048x1152 rows with the stream's cotangent added in it:
    0.52x stock, 10 us saved a launch with the measured configs) and its 6 query-head norms
    (8192x256), one launch each; the key-head norms (2048x256: 0.55x stock but 4.0 us saved a
    launch, under MIN_SAVED_US) stay XLA's (jaxnorm/backends/norm_backward_measured.py)."""
    text = lowered_training_step(model_suite.SHAPES["gemma3-1b"], fused=True,
                                 planned_for_h200=True)
    assert text.count("custom_call @mosaic_gpu_v2(") == 25 + 6


def _mosaic_operand_counts(text: str) -> collections.Counter:
    return collections.Counter(
        len(line.split("@mosaic_gpu_v2(", 1)[1].split(")", 1)[0].split(","))
        for line in text.splitlines() if "custom_call @mosaic_gpu_v2(" in line)


def test_gemma_training_step_hands_each_consumers_cotangent_to_the_kernel(monkeypatch):
    """With the table as measured, Gemma-3-1B's pre-norm backward launches (the first
    block's attention input among them, which has no statistics from a block before it)
    take x, XLA's sum of the consumers' cotangents, the stream's and the gain (4 operands);
    its post-norms, query heads and head norm x, G and the gain (3). With the per-consumer
    forms measured (entries made up here: no GPU run has timed them yet) the attention
    inputs hand the kernel q's, k's and v's cotangents and the MLP inputs gate's and up's,
    each an operand of its own, in the same 25 + 6 launches."""
    from jaxnorm.backends import norm_backward_measured as measured

    def operands() -> collections.Counter:
        return _mosaic_operand_counts(lowered_training_step(
            model_suite.SHAPES["gemma3-1b"], fused=True, planned_for_h200=True))

    assert operands() == {4: 6 + 6, 3: 19}
    monkeypatch.setattr(measured, "ENTRIES", measured.ENTRIES + tuple(
        ((2048, 1152), "bfloat16", gain, True, count, 0.5, 12.0)
        for gain in (True, False) for count in (2, 3)))
    assert operands() == {3 + 3: 6, 3 + 2: 6, 3: 19}


_TRIG = re.compile(r"stablehlo\.(cosine|sine) %\S+ : (tensor<[^>]*>)")


def test_rope_tables_have_stocks_shape():
    """The fused attention input's RoPE tables are stock's, [T, head_dim / 2] for a prompt's
    positions [T], not one per batch row. With [B, T] tables Gemma-3-1B's training step
    ran 18 more kernels than stock's on an H100, a key rotation, a reduce and an rsqrt of
    their own in each layer (bench/results/2026-12-05-h100, 2026-12-05)."""
    shape = model_suite.SHAPES["gemma3-1b"]
    tables = {fused: set(_TRIG.findall(lowered_training_step(shape, fused=fused,
                                                             planned_for_h200=True)))
              for fused in (False, True)}
    assert tables[False], "no RoPE table found in stock's step"
    assert tables[True] == tables[False]
