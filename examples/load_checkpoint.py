"""Bring a transformers model directory to jaxnorm: load, compare layers, flashify, decode, save.

    python examples/load_checkpoint.py PATH [--prompt 1,2,3] [--steps 24] [--save OUT]

PATH holds config.json and model.safetensors (or shards with
model.safetensors.index.json), as `save_pretrained` in transformers writes
them; no torch needed. The script loads it on stock Flax layers and on jaxnorm
layers, flashifies the jaxnorm model, prints each one's largest logit
difference from the stock model and their greedy tokens, and with --save
writes the flashified model back in the same format.
"""

from __future__ import annotations

import argparse
import sys

import jax.numpy as jnp
import numpy as np

from jaxnorm import models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path")
    parser.add_argument("--prompt", default="1,2,3,4", help="comma-separated token ids")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save", help="directory for the flashified model")
    args = parser.parse_args(argv)

    prompt = jnp.asarray([[int(t) for t in args.prompt.split(",")]], jnp.int32)
    stock = models.from_pretrained(args.path, fused=False)
    fused = models.from_pretrained(args.path)
    variants = {"stock": stock, "jaxnorm": fused, "flashified": models.flashify_model(fused)}
    print(f"{args.path}: {stock.cfg}")
    reference, _ = stock(prompt)
    decoded = {}
    for name, model in variants.items():
        logits, _ = model(prompt)
        decoded[name] = np.asarray(models.greedy_decode(model, prompt, args.steps))[0]
        print(f"{name:>10}: max |logits - stock| = "
              f"{float(jnp.max(jnp.abs(logits - reference))):.3g}; "
              f"greedy {decoded[name].tolist()}")
    if args.save:
        models.save_pretrained(variants["flashified"], args.save)
        print(f"saved the flashified model to {args.save}")
    same = all(np.array_equal(decoded["stock"], tokens) for tokens in decoded.values())
    print("greedy tokens identical" if same else "greedy tokens differ")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
