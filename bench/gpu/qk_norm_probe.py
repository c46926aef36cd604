"""Where the QK-norm's training cost goes: the model suite's training cell of a QK-norm
preset with two more variants that take the attention input apart.

- "unfused attention input": jaxnorm's model with `jaxnorm.rms_norm_attention_input`
  off, so q/k/v come from the pre-norm projections and the heads are normed by
  `jaxnorm.nnx.RMSNorm` and rotated by the model's rope, in [B, T, H, hd];
- "stock QK-norm": that, with the q/k norm modules stock Flax's nnx.RMSNorm (same gains).

Each variant's kernels by name and optimized HLO are written for round 1, for
`python -m bench.kernel_diff DIR A B --model M`. Usage:
python bench/gpu/qk_norm_probe.py [--model qwen3-0.6b] [--rounds 4] --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

from flax import nnx

from bench import model_suite, timing
from jaxnorm import models
from jaxnorm.models import layers


@contextlib.contextmanager
def attention_input_unfused() -> Iterator[None]:
    """Models traced inside take the unfused attention input (projections, then QK-norm)."""
    original = layers.fuses_attention_input
    layers.fuses_attention_input = lambda cfg: False
    try:
        yield
    finally:
        layers.fuses_attention_input = original


def traced_unfused(fn: Callable) -> Callable:
    def unfused(*args):
        with attention_input_unfused():
            return fn(*args)
    return unfused


def with_stock_qk_norms(stock: nnx.Module) -> nnx.Module:
    """jaxnorm's model of `stock`'s parameters, its blocks' q_norm and k_norm stock's."""
    out = models.load_params(stock, fused=True, impl=None)
    donor = models.load_params(stock, fused=False)
    for block, stock_block in zip(out.layers, donor.layers):
        block.attn.q_norm, block.attn.k_norm = stock_block.attn.q_norm, stock_block.attn.k_norm
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-0.6b", choices=(*model_suite.SHAPES, "tiny"))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = model_suite.QUICK if args.model == "tiny" else model_suite.SHAPES[args.model]
    variants = model_suite.build_variants(shape)
    variants["stock QK-norm"] = with_stock_qk_norms(variants["stock"])
    variants["unfused attention input"] = variants["jaxnorm"]
    fns = {}
    for label, model in variants.items():
        fn = model_suite.train_case(model, shape, 1)[0]
        unfused = label in ("stock QK-norm", "unfused attention input")
        fns[label] = traced_unfused(fn) if unfused else fn
    labels = ["stock", "jaxnorm", "unfused attention input", "stock QK-norm", "flashified",
              "norm-free"]
    rows = []
    for r in range(args.rounds):
        for label in model_suite.measurement_order(labels, r):
            _, arg_sets = model_suite.train_case(variants[label], shape, 1)
            t = timing.measure(fns[label], arg_sets, repeats=args.repeats, warmup=3)
            row = {"round": r + 1, "variant": label, "wall_us": round(t.wall_us),
                   "kernel_us": t.kernel_us and round(t.kernel_us),
                   "kernel_samples_us": [round(k) for k in t.kernel_samples_us],
                   "best_us": round(t.best_us), "kernels": len(t.kernels),
                   "first_call_s": round(t.first_call_s, 1)}
            if r == 0:
                name = f"{shape.name}-train-{label.replace(' ', '_')}"
                model_suite._write_detail(out / name, fns[label], arg_sets,
                                          list(t.kernels), len(t.kernels))
            rows.append(row)
            print(json.dumps(row), flush=True)
            del arg_sets
    best = {(x["round"], x["variant"]): x["best_us"] for x in rows}
    summary = {}
    for label in labels:  # kernel time (CUPTI), wall time where CUPTI is missing
        ratios = [best[r, label] / best[r, "stock"] for r in range(1, args.rounds + 1)]
        summary[label] = {"vs_stock": [round(x, 4) for x in ratios],
                          "median": round(statistics.median(ratios), 4)}
        print(label, summary[label], flush=True)
    (out / "qk-norm-probe.json").write_text(json.dumps(
        {"model": shape.name, "train": shape.train, "rows": rows, "summary": summary},
        indent=1))


if __name__ == "__main__":
    main()
