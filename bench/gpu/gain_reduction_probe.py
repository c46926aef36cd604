"""Which emitter XLA compiles the norm-gain gradients with, and what that costs a training step.

A norm's gain gradient is a column sum of a float32 [M, K] product into [K]. XLA
autotunes such reduction fusions per compile between its native emitter and its Triton
block-level emitter; jaxnorm's xla path reads [M, K] rows where stock Flax keeps
[B, T, K], which is what decides whether the Triton emitter may take the reduction
(docs/backward.md, "What moves a training step between processes"). This measures,
in one process:

- one RMSNorm's gradient alone (M = 2048, K = 1152), written three ways: stock's [B, T, K],
  jaxnorm's [M, K], and [M, K] with the gain applied on a [M / t, t, K] view of the rows;
  kernels by name (CUPTI) and the Triton fusions XLA compiled;
- a model's training step, stock, jaxnorm and jaxnorm with that view ("gain on 3-D view";
  since jaxnorm's xla path computes on the caller's [B, T, K], jaxnorm is that shape already):
  the [K] gain reductions of the compiled program by emitter, then, in rounds with wall
  samples in turn, CUPTI kernel time and wall time against stock's (as
  bench/gpu/variant_probe.py).

python bench/gpu/gain_reduction_probe.py --model gemma3-1b --rounds 2 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp

from bench import model_suite, timing
from bench.gpu import variant_probe
from jaxnorm import statistics
from jaxnorm.backends import xla

VIEW = "gain on 3-D view"
EPS = 1e-6


def rows_view(m: int) -> tuple[int, int]:
    """[M] rows as [M / t, t] with t = gcd(M, 1024): [2, 1024] for 2048 rows."""
    t = math.gcd(m, 1024)
    return m // t, t


def _normalized(x32: jax.Array) -> jax.Array:
    return x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), -1, keepdims=True) + EPS)


def norm_rows(x: jax.Array, gain: jax.Array) -> jax.Array:
    """RMSNorm with gain (1 + g) of x in whatever shape it comes (stock's [B, T, K], [M, K])."""
    return (_normalized(x.astype(jnp.float32)) * (1.0 + gain)).astype(x.dtype)


def norm_rows_viewed(x: jax.Array, gain: jax.Array) -> jax.Array:
    """`norm_rows` of [M, K] with the gain applied on a [M / t, t, K] view."""
    y = _normalized(x.astype(jnp.float32))
    m, k = y.shape
    return (y.reshape(*rows_view(m), k) * (1.0 + gain)).reshape(m, k).astype(x.dtype)


def view_f32(x: jax.Array, scale: jax.Array | None, eps: float, scale_offset: float) -> jax.Array:
    """`jaxnorm.backends.xla.rms_normalized_f32` with the gain applied on a [M / t, t, K]
    view of x's rows, whatever x's shape."""
    x32 = x.astype(jnp.float32)
    y = x32 * statistics.rms_inverse(x32, eps)[..., None]
    if scale is None:
        return y
    rows = y.reshape(-1, y.shape[-1])
    m, k = rows.shape
    return (rows.reshape(*rows_view(m), k) * xla._gain(scale, scale_offset)).reshape(y.shape)


def gain_view() -> contextlib.AbstractContextManager:
    return variant_probe._patched(xla, "rms_normalized_f32", view_f32)


def _triton_fusions(hlo: str) -> list[str]:
    return [line.strip()[:200] for line in hlo.splitlines()
            if " fusion(" in line and "__triton" in line]


def gain_reductions(hlo: str, k: int) -> dict[str, str]:
    """The fusions of an optimized HLO module writing a [k] bf16 vector (the gain gradients,
    as CUPTI names them), each "triton" or its XLA fusion kind."""
    pattern = re.compile(rf"^\s*%(\S+) = bf16\[{k}\]\{{0\}} fusion\(.*kind=(k\w+)")
    return {m.group(1).replace(".", "_"): "triton" if "__triton" in line else m.group(2)
            for line in hlo.splitlines() if (m := pattern.match(line))}


def single_norm(m: int = 2048, k: int = 1152, repeats: int = 50) -> dict[str, dict]:
    """One norm's gradient (x and gain) in the three writings: kernels and Triton fusions."""
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (2, m // 2, k), jnp.bfloat16)
    dy = jax.random.normal(keys[1], (2, m // 2, k), jnp.bfloat16)
    gain = jax.random.normal(keys[2], (k,), jnp.float32) * 0.1

    def grad(norm):
        loss = lambda x, g, dy: jnp.sum(dy.astype(jnp.float32) * norm(x, g).astype(jnp.float32))
        return jax.jit(jax.grad(loss, argnums=(0, 1)))

    flat = (x.reshape(m, k), gain, dy.reshape(m, k))
    cases = {"stock 3-D": (grad(norm_rows), (x, gain, dy)),
             "ours 2-D": (grad(norm_rows), flat),
             "2-D, gain on a 3-D view": (grad(norm_rows_viewed), flat)}
    out = {}
    for name, (fn, args) in cases.items():
        t = timing.measure(fn, [args], repeats=repeats)
        out[name] = {"kernel_us": t.kernel_us,
                     "kernels": [(n, round(us, 2)) for n, us in t.kernels],
                     "triton_fusions": _triton_fusions(fn.lower(*args).compile().as_text())}
    return out


def training_step(shape: model_suite.ModelShape, rounds: int, repeats: int) -> dict:
    """stock, jaxnorm and VIEW: gain reductions by emitter (a compile of each program), then
    rounds of wall samples in turn and CUPTI per variant."""
    models = model_suite.build_variants(shape)
    case = lambda m: model_suite.train_case(m, shape, 1)
    variants = {"stock": (models["stock"], case(models["stock"])[0]),
                "jaxnorm": (models["jaxnorm"], case(models["jaxnorm"])[0]),
                VIEW: (models["jaxnorm"],
                       variant_probe.traced_with(case(models["jaxnorm"])[0], gain_view))}
    emitters = {}
    for label, (model, fn) in variants.items():
        found = gain_reductions(timing.measured_hlo(fn, case(model)[1]), shape.cfg.d_model)
        emitters[label] = {"gain_reductions": len(found),
                           "triton": sum(e == "triton" for e in found.values())}
    labels = list(variants)
    rows = variant_probe.measure_rounds(variants, case, labels, rounds=rounds, repeats=repeats)
    return {"model": shape.name, "emitters": emitters, "rows": rows,
            "summary": variant_probe.summarize_rows(rows, labels, rounds)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-1b", choices=(*model_suite.SHAPES, "tiny"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = model_suite.QUICK if args.model == "tiny" else model_suite.SHAPES[args.model]
    result = {"single norm": single_norm(repeats=args.repeats),
              "training step": training_step(shape, args.rounds, args.repeats)}
    for label, summary in result["training step"]["summary"].items():
        print(label, result["training step"]["emitters"][label], summary, flush=True)
    (out / f"gain-reduction-{shape.name}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
