"""The gated MLP input kernel against XLA on the GPU: CUPTI kernel time, inputs rotated.

    PYTHONPATH=. python -m bench.gated_bench --out $OUT          # H200, < 3 min
    PYTHONPATH=. python -m bench.gated_bench --smoke --out DIR   # CPU: the interpreter, tiny
    PYTHONPATH=. python -m bench.gated_bench --activation gelu_tanh --shapes 8192x1152x6912

Per shape (M x K x (d_ff + d_ff), bf16, SwiGLU unless `--activation` says otherwise), four
variants measured interleaved (`--rounds` rounds, each variant once per round):

- "gated kernel": `jaxnorm.rms_norm_gated_dense(impl="mosaic")`, gain unfolded;
- "stock": what impl="xla" runs (stock Flax): the norm in float32 cast to bf16,
  two bf16 dots, act(gate) * up;
- "gated kernel, folded": the kernel with the gain folded (`scale=None`);
- "two dots + <act>*up": XLA's two dots and its act-multiply fusion with no norm at
  all, the floor a fused norm is held against (issue 17: <= 0.92x of it).

Writes gated-bench.json under --out (default $OUT, else a temporary folder), after
every shape, with per-round CUPTI and wall medians and the ratios; each shape's
kernel output is compared once with the stock output (max |diff| / max |stock|).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

from bench.shapes import parse_mkn

# M in rows, (K, d_ff) of Llama 3.2 1B, Llama 3 8B / Mistral 7B, Qwen3 0.6B, Qwen3 4B.
MS = (4096, 8192)
KN = ((2048, 8192), (4096, 14336), (1024, 3072), (2560, 9728))
SMOKE_SHAPES = ((130, 128, 192),)


def dots_label(activation: str) -> str:
    """The no-norm floor's label: "two dots + silu*up" for SwiGLU."""
    return f"two dots + {activation}*up"


def _variants(impl: str, activation: str) -> dict[str, tuple[Callable, bool]]:
    """label -> (fn, takes the gain): the gain-free variants take (x, w_gate, w_up)."""
    import jaxnorm
    from jaxnorm.backends import xla_gated

    act = xla_gated.ACTIVATIONS[activation]

    def kernel(x, g, wg, wu):
        return jaxnorm.rms_norm_gated_dense(x, g, wg, wu, activation=activation, impl=impl)

    def stock(x, g, wg, wu):
        return jaxnorm.rms_norm_gated_dense(x, g, wg, wu, activation=activation, impl="xla")

    def kernel_folded(x, wg, wu):
        return jaxnorm.rms_norm_gated_dense(x, None, wg, wu, activation=activation, impl=impl)

    def dots_only(x, wg, wu):
        return act(x @ wg) * (x @ wu)

    return {"gated kernel": (kernel, True), "stock": (stock, True),
            "gated kernel, folded": (kernel_folded, False),
            dots_label(activation): (dots_only, False)}


def _inputs(m: int, k: int, n: int, seed: int) -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.key(seed), 4)
    x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    g = 1 + 0.1 * jax.random.normal(keys[1], (k,), jnp.float32)
    wg, wu = (jax.random.normal(kk, (k, n), jnp.bfloat16) / k ** 0.5 for kk in keys[2:])
    return x, g, wg, wu


def _agreement(fns: dict, args: tuple) -> float:
    """max |kernel - stock| / max |stock| on one input set (the timed call is the right one)."""
    y = fns["gated kernel"][0](*args).astype(jnp.float32)
    ref = fns["stock"][0](*args).astype(jnp.float32)
    return float(jnp.max(jnp.abs(y - ref)) / jnp.max(jnp.abs(ref)))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else a / b


def run(shapes, *, impl: str, rounds: int, repeats: int, warmup: int, out: Path,
        activation: str = "silu") -> list[dict]:
    from bench import timing

    fns = _variants(impl, activation)
    floor = dots_label(activation)
    rows = []
    for m, k, n in shapes:
        copies = timing.rotation_copies(2 * (m * k + 2 * k * n))
        arg_sets = [_inputs(m, k, n, seed) for seed in range(copies)]
        row: dict = {"shape": f"{m}x{k}x({n}+{n})", "activation": activation,
                     "max_rel_diff_vs_stock": _agreement(fns, arg_sets[0]), "rounds": []}
        for _ in range(rounds):
            results = {}
            for label, (fn, with_gain) in fns.items():
                sets = arg_sets if with_gain else [(a[0], a[2], a[3]) for a in arg_sets]
                t = timing.measure(fn, sets, repeats=repeats, warmup=warmup)
                results[label] = {"kernel_us": t.kernel_us, "wall_us": t.wall_us,
                                  "cupti_error": t.cupti_error}
            row["rounds"].append(results)
        for metric in ("kernel_us", "wall_us"):
            def median(label, metric=metric):
                values = [r[label][metric] for r in row["rounds"] if r[label][metric] is not None]
                return statistics.median(values) if values else None

            row[metric] = {label: median(label) for label in fns}
            row[f"ratios_{metric}"] = {
                "kernel / stock": _ratio(median("gated kernel"), median("stock")),
                "kernel / two dots": _ratio(median("gated kernel"), median(floor)),
                "folded kernel / two dots": _ratio(median("gated kernel, folded"),
                                                   median(floor)),
            }
        rows.append(row)
        print(json.dumps({key: row[key] for key in ("shape", "max_rel_diff_vs_stock",
                                                    "kernel_us", "ratios_kernel_us")}),
              flush=True)
        (out / "gated-bench.json").write_text(json.dumps(
            {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "impl": impl,
             "rows": rows}, indent=1))
        del arg_sets
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gated_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="directory for gated-bench.json")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    from jaxnorm.backends.xla_gated import ACTIVATIONS

    parser.add_argument("--activation", default="silu", choices=tuple(ACTIVATIONS),
                        help="the gate's activation (gelu_tanh: Gemma's GeGLU)")
    parser.add_argument("--shapes", type=parse_mkn, default=None,
                        help="MxKxN,... (N = d_ff) instead of the presets' shapes")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU: the kernel under the interpreter at a tiny shape")
    args = parser.parse_args(argv)
    if args.smoke:
        from pallas_kernels.interpreter_flags import use_interpreter_safe_xla_flags

        use_interpreter_safe_xla_flags()
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gated_bench_"))
    out.mkdir(parents=True, exist_ok=True)
    shapes = (SMOKE_SHAPES if args.smoke else args.shapes
              or [(m, k, n) for m in MS for k, n in KN])
    run(shapes, impl="interpret" if args.smoke else "mosaic", rounds=args.rounds,
        repeats=args.repeats, warmup=args.warmup, out=out, activation=args.activation)
    print(out / "gated-bench.json")


if __name__ == "__main__":
    main()
