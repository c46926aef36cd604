"""Stale-buffer safety: greedy decoding through the Mosaic kernels must match the xla path.

    python examples/decode_parity.py [--impl mosaic] [--steps 256] [--family llama|qwen3|gemma3]

A small 2-layer Llama-style model (or Qwen3-style: per-head QK-norm, tied embeddings; or Gemma
3-style: (1 + g) gains, GeGLU, a post-norm after each sublayer, head_dim 256), head_dim 128 or
256 as the real models' so that the attention input is one op, in bfloat16, whose norm +
projections (q/k/v, gate/up, the post-norms' o and down, final norm + LM head) run through
jaxnorm with `--impl`, and
the same parameters with impl="xla", after a short float32 training on a
deterministic task so greedy choices are not rounding-level ties. Both decode greedily; the tokens must be
identical. A kernel that reads a stale buffer (a consumer not waiting for its
producer, the FlashNorm stream bug) shows up as garbage logits within a few
steps. The script also feeds the xla tokens to both models (teacher forcing)
and reports the largest logit difference against the logit spread, so a
near-tie that flips an argmax can be told apart from a real error.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxnorm
from jaxnorm import models


VOCAB = 512


def successor_batch(key: jax.Array, batch: int, length: int) -> jax.Array:
    """Sequences where each token determines the next: t -> (5 t + 3) mod V."""
    first = jax.random.randint(key, (batch, 1), 0, VOCAB)
    tokens = [first]
    for _ in range(length - 1):
        tokens.append((5 * tokens[-1] + 3) % VOCAB)
    return jnp.concatenate(tokens, axis=1)


FAMILIES = {"llama": models.llama, "qwen3": models.qwen3, "gemma3": models.gemma3}
# head_dim 128, as Llama-3-8B's and Qwen3's, 256 as Gemma 3's: the attention-input kernel
# serves both.
HEADS = {"llama": dict(n_heads=4, n_kv_heads=2, head_dim=128),
         "qwen3": dict(n_heads=2, n_kv_heads=1, head_dim=128),
         "gemma3": dict(n_heads=2, n_kv_heads=1, head_dim=256)}


def build(impl: str, train_steps: int,
          family: str = "llama") -> tuple[models.Transformer, models.Transformer]:
    """Train in float32 (xla) until predictions are confident, then two bfloat16 copies.

    A random model's logits sit within bf16 rounding of each other, so greedy
    ties would flip on rounding alone; a trained model's margins do not.
    """
    cfg = FAMILIES[family](vocab_size=VOCAB, d_model=256, n_layers=2, d_ff=512, impl="xla",
                           **HEADS[family])
    model = models.Transformer(cfg, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    for step in range(train_steps):
        loss = models.train_step(model, optimizer, successor_batch(jax.random.key(step), 16, 33))
    print(f"trained {train_steps} steps on the successor task, final loss {float(loss):.4f}")
    kernel_model = models.load_params(model, dtype=jnp.bfloat16, impl=impl)
    return kernel_model, models.load_params(model, dtype=jnp.bfloat16, impl="xla")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", default="mosaic", choices=["mosaic", "interpret", "xla"])
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=300)
    parser.add_argument("--family", default="llama", choices=sorted(FAMILIES))
    args = parser.parse_args(argv)
    print(f"device: {jax.devices()[0].device_kind}; {args.family}-style model; "
          f"kernel path impl={args.impl}")

    kernel_model, xla_model = build(args.impl, args.train_steps, args.family)
    prompt = successor_batch(jax.random.key(10_000), args.batch, 8)
    start = time.perf_counter()
    kernel_tokens = np.asarray(models.greedy_decode(kernel_model, prompt, args.steps))
    xla_tokens = np.asarray(models.greedy_decode(xla_model, prompt, args.steps))
    print(f"decoded {args.steps} steps x batch {args.batch} both ways in "
          f"{time.perf_counter() - start:.1f}s")

    mismatch = np.argwhere(kernel_tokens != xla_tokens)
    if mismatch.size == 0:
        print(f"PASS: {args.steps} greedy tokens identical for every sequence")
    else:
        b, step = mismatch[0]
        print(f"FAIL: first differing token at batch {b}, step {step}")
    sequence = jnp.concatenate([prompt, jnp.asarray(xla_tokens)], axis=1)
    logits = nnx.jit(lambda model, tokens: model(tokens)[0].astype(jnp.float32))
    kernel_logits = np.asarray(logits(kernel_model, sequence))
    xla_logits = np.asarray(logits(xla_model, sequence))
    spread = float(np.std(xla_logits))
    worst = float(np.max(np.abs(kernel_logits - xla_logits)))
    print(f"teacher-forced logits: max |kernel - xla| = {worst:.4g} (logit std {spread:.4g}, "
          f"ratio {worst / spread:.3g})")
    print(f"fallbacks: {jaxnorm.fallback_reasons() or 'none'}")
    return 0 if mismatch.size == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
