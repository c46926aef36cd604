"""The evidence behind automatic dispatch in the model: single ops at the model suite's shapes.

Two questions, each answered by timing one op at the shapes the model suite's
presets run (bench/model_suite.py), CUPTI kernel time, inputs rotated:

- training: is the kernel forward with jaxnorm's lean backward (impl="mosaic")
  faster than JAX's autodiff of the stock formulation (what impl=None
  differentiates), per pre-norm projection group, forward plus backward?
- inference: is the pre-norm kernel faster than the stock norm and dot at the
  prefill shapes, and is a standalone norm kernel faster than XLA's norm when
  an elementwise consumer follows it (QK-norm, then RoPE), which XLA fuses?

    PYTHONPATH=. python -m bench.training_ops --out DIR
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

import jaxnorm
from bench import timing
from bench.model_suite import SHAPES, ModelShape


def _projection_groups(shape: ModelShape) -> list[tuple[str, int, tuple[int, ...]]]:
    """(name, K, Ns) of every norm-fed projection group in one block."""
    c = shape.cfg
    return [("qkv", c.d_model, (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim,
                                c.n_kv_heads * c.head_dim)),
            ("gate/up", c.d_model, (c.d_ff, c.d_ff))]


def _inputs(m: int, k: int, ns: tuple[int, ...], seed: int):
    keys = jax.random.split(jax.random.key(seed), len(ns) + 2)
    x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    g = 1 + 0.1 * jax.random.normal(keys[1], (k,), jnp.bfloat16)
    ws = tuple(jax.random.normal(kk, (k, n), jnp.bfloat16) / k ** 0.5
               for kk, n in zip(keys[2:], ns))
    return x, g, ws


def _fwd_bwd(impl: str | None) -> Callable:
    def loss(x, g, ws):
        outs = jaxnorm.rms_norm_dense(x, g, list(ws), impl=impl)
        return sum(jnp.sum(o.astype(jnp.float32) ** 2) for o in outs)

    return jax.grad(loss, argnums=(0, 1, 2))


def _forward(impl: str | None) -> Callable:
    return lambda x, g, ws: jaxnorm.rms_norm_dense(x, g, list(ws), impl=impl)


def _stock_forward(x, g, ws):
    """nnx.RMSNorm then nnx.Linear per kernel, as the stock model writes them."""
    x32 = x.astype(jnp.float32)
    normed = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)
              * g.astype(jnp.float32)).astype(x.dtype)
    return tuple(normed @ w for w in ws)


def _qk_norm_then_rope(impl: str | None) -> Callable:
    """Per-head RMSNorm of q [T, H, D], then a rotation-like elementwise consumer."""
    def fn(q, g, cos):
        y = jaxnorm.rms_norm(q, g, impl=impl)
        half = y.shape[-1] // 2
        y1, y2 = y[..., :half], y[..., half:]
        return jnp.concatenate([y1 * cos - y2 * cos, y2 * cos + y1 * cos], -1)

    return fn


def _time(fn: Callable, arg_sets: list) -> float | None:
    return timing.measure(fn, arg_sets, repeats=20, warmup=3).kernel_us


def run(names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        shape = SHAPES[name]
        for phase, (b, t) in (("train", shape.train), ("prefill", shape.prefill)):
            m = b * t
            for group, k, ns in _projection_groups(shape):
                arg_sets = [_inputs(m, k, ns, seed) for seed in range(2)]
                if phase == "train":
                    variants = {"stock autodiff (impl=None)": _fwd_bwd(None),
                                "kernel + lean backward (mosaic)": _fwd_bwd("mosaic")}
                else:
                    variants = {"stock norm + dot": _stock_forward,
                                "kernel (mosaic)": _forward("mosaic"),
                                "impl=None": _forward(None)}
                row = {"model": name, "phase": phase, "op": f"rms_norm_dense {group}",
                       "shape": f"{m}x{k}x{'+'.join(map(str, ns))}"}
                for label, fn in variants.items():
                    row[label] = _time(fn, arg_sets)
                rows.append(row)
                print(row, flush=True)
        if shape.cfg.qk_norm:
            b, t = shape.prefill
            c = shape.cfg
            arg_sets = [(jax.random.normal(jax.random.key(s), (b * t, c.n_heads, c.head_dim),
                                           jnp.bfloat16),
                         jnp.ones(c.head_dim, jnp.bfloat16),
                         jnp.full((c.head_dim // 2,), 0.5, jnp.bfloat16)) for s in range(2)]
            row = {"model": name, "phase": "prefill", "op": "qk-norm then rope",
                   "shape": f"{b * t}x{c.n_heads}x{c.head_dim}"}
            for label, impl in (("xla", "xla"), ("kernel (mosaic)", "mosaic")):
                row[label] = _time(_qk_norm_then_rope(impl), arg_sets)
            rows.append(row)
            print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.training_ops", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama3.2-1b,qwen3-0.6b",
                        help=f"comma-separated model shapes from {', '.join(SHAPES)}")
    parser.add_argument("--out", type=Path, required=True, help="directory for ops.json")
    args = parser.parse_args()
    rows = run(args.model.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "training-ops.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
