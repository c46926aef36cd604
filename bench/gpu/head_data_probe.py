"""The tied head's GEMMs timed on the data of two models: does the norm-free limit's head
run faster because it multiplies different numbers?

In the Gemma-3-1B training step the norm-free limit's vocabulary GEMMs (262144 x 1152 at
M = 2048, the same cuBLAS kernels as stock's) took 150-200 us less each than stock's,
a third of the stock-to-limit gap that no implementation of the norm can close if the
cause is the data: without the final norm the head's input, the logits and their
cotangent differ. This times each head GEMM (logits = h @ E^T, dh = g @ E,
dE = g^T @ h) on the operands of both models' training step (the real h and g, one batch,
the same parameters), crossed, interleaved over rounds with the order rotated, CUPTI
kernel time, with each operand's statistics (RMS, exact zeros, share of tiny values).

    PYTHONPATH=. python bench/gpu/head_data_probe.py --out DIR [--model gemma3-1b]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from bench import model_suite, timing
from jaxnorm import models

Array = jax.Array
GEMMS: dict[str, tuple[str, Callable[[Array, Array], Array]]] = {
    # name -> (operands, fn): the head's forward and its two backward products.
    "logits": ("h,E", lambda h, e: jnp.einsum("md,vd->mv", h, e)),
    "dh": ("g,E", lambda g, e: jnp.einsum("mv,vd->md", g, e)),
    "dE": ("g,h", lambda g, h: jnp.einsum("mv,md->vd", g, h)),
}


def head_operands(model: nnx.Module, tokens: Array) -> dict[str, Array]:
    """h (the head's input, [M, D]), g (the loss's cotangent of the logits, [M, V], as the
    backward GEMMs read it) and E (the table) of one training batch."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens):
        m = nnx.merge(graphdef, state)
        x, _ = m.hidden(tokens[:, :-1])
        h = m.head_norm(x)
        logits = m.embed.attend(h)

        def loss(z):
            return optax.softmax_cross_entropy_with_integer_labels(
                z.astype(jnp.float32), tokens[:, 1:]).mean()

        g = jax.grad(loss)(logits)
        return h.reshape(-1, h.shape[-1]), g.reshape(-1, g.shape[-1]), m.embed.embedding[...]

    h, g, e = run(state, tokens)
    return {"h": h, "g": g, "E": e}


def describe(a: Array) -> dict[str, float]:
    """RMS, share of exact zeros, share of |a| below 2^-16 of max|a|."""
    f = jnp.abs(a.astype(jnp.float32))
    peak = jnp.max(f)
    return {"rms": float(jnp.sqrt(jnp.mean(f * f))), "zeros": float(jnp.mean(f == 0)),
            "tiny": float(jnp.mean(f < peak * 2.0**-16)), "dtype": str(a.dtype)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gemma3-1b", choices=(*model_suite.SHAPES, "tiny"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = (dataclasses.replace(model_suite.QUICK,
                                 cfg=model_suite.QUICK.cfg.replace(tied_embeddings=True))
             if args.model == "tiny" else model_suite.SHAPES[args.model])
    if not shape.cfg.tied_embeddings:
        parser.error(f"{args.model} has an untied head; this probe reads the tied table")
    stock = models.Transformer(shape.cfg.replace(fused=False), rngs=nnx.Rngs(0))
    norm_free = model_suite._without_norms(models.load_params(stock, fused=False))
    batch, length = shape.train
    tokens = model_suite._tokens(jax.random.key(0), batch, length + 1, shape.cfg.vocab_size)
    data = {"stock": head_operands(stock, tokens), "norm-free": head_operands(norm_free, tokens)}
    stats = {f"{src} {name}": describe(a) for src, ops in data.items() for name, a in ops.items()}
    print(json.dumps(stats, indent=1), flush=True)

    cases = []  # (label, fn, operands): every GEMM on stock's and the limit's data, crossed
    for gemm, (names, fn) in GEMMS.items():
        a, b = names.split(",")
        for src_a in data:
            for src_b in data:
                if b == "E" and src_b != src_a:
                    continue  # both models hold the same table
                cases.append((f"{gemm} {a}:{src_a} {b}:{src_b}", fn,
                              (data[src_a][a], data[src_b][b])))
    rows = []
    for r in range(args.rounds):
        shift = r % len(cases)
        for label, fn, operands in cases[shift:] + cases[:shift]:
            t = timing.measure(fn, [operands], repeats=args.repeats, warmup=2)
            rows.append({"round": r + 1, "case": label, "us": t.best_us, "cupti": t.kernel_us is not None,
                         "kernels": [k for k, _ in t.kernels]})
            print(json.dumps(rows[-1]), flush=True)
    medians = {label: statistics.median(x["us"] for x in rows if x["case"] == label)
               for label, _, _ in cases}
    result = {"model": args.model, "M": batch * length, "operands": stats, "rows": rows,
              "median_us": medians}
    (out / "head-data-probe.json").write_text(json.dumps(result, indent=1))
    for label, us in medians.items():
        print(f"{label:40s} {us:9.1f} us")


if __name__ == "__main__":
    main()
